//! One page of a registry's tag list (`{"name": …, "tags": [...]}`), read without holding what
//! holdfast never uses: a tag list serves only `tagSelection.semver`, which ignores tags that do
//! not parse as versions, so those are dropped as they are parsed and only version tags are
//! kept, up to a bound. A registry answering millions of one-letter tags costs the page's bytes
//! (bounded by the caller) and nothing per tag.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::semver_select::version::Version;

/// Why a page was not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagListError {
    #[error("invalid tag list response: {0}")]
    Invalid(String),
    #[error("the tag list has more than {0} tags that parse as versions")]
    TooManyVersions(usize),
}

/// Appends the tags of `page` that parse as versions to `kept`, in registry order; fails past
/// `max_kept` of them in all.
pub fn read_version_tags(page: &[u8], kept: &mut Vec<String>, max_kept: usize) -> Result<(), TagListError> {
    let mut deserializer = serde_json::Deserializer::from_slice(page);
    let outcome = Page { kept, max_kept }
        .deserialize(&mut deserializer)
        .and_then(|()| deserializer.end());
    match outcome {
        Ok(()) => Ok(()),
        Err(e) if e.to_string().starts_with(TOO_MANY) => Err(TagListError::TooManyVersions(max_kept)),
        Err(e) => Err(TagListError::Invalid(e.to_string())),
    }
}

/// How the visitor says the bound was passed (serde errors carry a message only).
const TOO_MANY: &str = "too many version tags";

/// The page object: `tags` read by [`Tags`], every other field skipped unparsed.
struct Page<'k> {
    kept: &'k mut Vec<String>,
    max_kept: usize,
}

impl<'de> DeserializeSeed<'de> for Page<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Page<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a tag list object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen_tags = false;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if key == "tags" && !seen_tags {
                seen_tags = true;
                map.next_value_seed(Tags {
                    kept: &mut *self.kept,
                    max_kept: self.max_kept,
                })?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

/// `tags`: an array of strings, or null.
struct Tags<'k> {
    kept: &'k mut Vec<String>,
    max_kept: usize,
}

impl<'de> DeserializeSeed<'de> for Tags<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for Tags<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of tags or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(tag) = seq.next_element::<std::borrow::Cow<'de, str>>()? {
            if Version::parse_relaxed(&tag).is_err() {
                continue;
            }
            if self.kept.len() >= self.max_kept {
                return Err(de::Error::custom(TOO_MANY));
            }
            self.kept.push(tag.into_owned());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(page: &str, max_kept: usize) -> Result<Vec<String>, TagListError> {
        let mut kept = Vec::new();
        read_version_tags(page.as_bytes(), &mut kept, max_kept).map(|()| kept)
    }

    #[test]
    fn keeps_only_version_tags_in_registry_order() {
        let page = r#"{"name":"team/app","tags":["latest","v2.0.0","main","1.0.0","v2.0.0-rc.1","x"]}"#;
        assert_eq!(read(page, 10).unwrap(), ["v2.0.0", "1.0.0", "v2.0.0-rc.1"]);
    }

    #[test]
    fn null_missing_and_empty_tags_are_no_tags() {
        for page in [r#"{"name":"a","tags":null}"#, r#"{"name":"a"}"#, r#"{"tags":[]}"#] {
            assert_eq!(read(page, 10).unwrap(), Vec::<String>::new(), "{page}");
        }
    }

    #[test]
    fn escaped_tags_and_unknown_fields_are_read() {
        let page = r#"{"extra":{"nested":[1,2,{"x":null}]},"tags":["1.0.\u0030"],"name":"a"}"#;
        assert_eq!(read(page, 10).unwrap(), ["1.0.0"]);
    }

    #[test]
    fn the_bound_counts_version_tags_only() {
        let junk: Vec<String> = (0..10_000).map(|i| format!("\"t{i}\"")).collect();
        let page = format!(r#"{{"tags":[{},"1.0.0","1.0.1"]}}"#, junk.join(","));
        assert_eq!(read(&page, 2).unwrap(), ["1.0.0", "1.0.1"]);
        assert_eq!(read(&page, 1), Err(TagListError::TooManyVersions(1)));
    }

    #[test]
    fn malformed_pages_are_invalid() {
        for page in [
            "",
            "[]",
            r#"{"tags":"1.0.0"}"#,
            r#"{"tags":[1]}"#,
            r#"{"tags":["1.0.0"]} x"#,
            "{",
        ] {
            assert!(
                matches!(read(page, 10), Err(TagListError::Invalid(_))),
                "{page:?}"
            );
        }
    }

    #[test]
    fn a_repeated_tags_field_is_read_once() {
        let page = r#"{"tags":["1.0.0"],"tags":["2.0.0"]}"#;
        assert_eq!(read(page, 10).unwrap(), ["1.0.0"]);
    }
}

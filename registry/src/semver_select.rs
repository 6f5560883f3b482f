//! vendir's `tagSelection.semver`: pick the highest tag that parses as a version and passes the
//! prerelease filter and the constraints — the same tag vendir would pull, so the webhook can
//! pin its digest and drop `tagSelection`.
//!
//! Order of operations is vendir's `HighestConstrainedVersion` (`pkg/vendir/versions`):
//! 1. parse every tag as a relaxed version (one leading `v` stripped, then strict semver); tags
//!    that do not parse are ignored;
//! 2. prerelease filter: `prereleases` absent drops every prerelease; `prereleases: {}` (or an
//!    empty `identifiers` list) keeps them all; `identifiers: [rc, beta]` keeps a prerelease if
//!    **any** of its dot-separated prerelease identifiers equals one of the listed strings
//!    exactly (`1.0.0-rc.1` has `rc` and `1`; `1.0.0-rc1` has only `rc1` and is dropped);
//! 3. constraints (if non-empty), see [`range`];
//! 4. the highest remaining version wins; on equal versions (`1.0.0` and `v1.0.0`) the one later
//!    in the tag list wins (Go's stable sort, then "last"). The tag is returned verbatim.

pub mod range;
pub mod version;

use serde::{Deserialize, Serialize};

use self::{
    range::{Range, RangeError},
    version::Version,
};

/// `tagSelection` as it appears in a fetch spec (vendir `VersionSelection`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSelection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semver: Option<SemverSelection>,
}

/// `tagSelection.semver`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemverSelection {
    /// carvel semver range syntax; empty means "no constraint".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub constraints: String,
    /// `None` excludes prereleases; `Some` with no identifiers keeps them all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prereleases: Option<Prereleases>,
}

/// `tagSelection.semver.prereleases`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prereleases {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub identifiers: Vec<String>,
}

/// Why no tag was selected; messages are vendir's, so users see the text they know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    #[error("Unsupported version selection type (currently supported: semver)")]
    Unsupported,
    #[error("Selecting versions: Parsing version constraint '{constraints}': {source}")]
    Constraints {
        constraints: String,
        #[source]
        source: RangeError,
    },
    #[error("Expected to find at least one version, but did not (details: {})", no_match_details(*.all, *.after_prereleases, *.after_constraints))]
    NoMatch {
        all: usize,
        after_prereleases: usize,
        /// `None` when there were no constraints (vendir omits that step from the details).
        after_constraints: Option<usize>,
    },
}

fn no_match_details(all: usize, after_prereleases: usize, after_constraints: Option<usize>) -> String {
    let mut details = format!("all={all} -> after-prereleases-filter={after_prereleases}");
    if let Some(n) = after_constraints {
        details.push_str(&format!(" -> after-constraints-filter={n}"));
    }
    details
}

/// Selects the tag vendir would pick from `tags` (returned verbatim, e.g. with its `v`).
pub fn select_tag<'a, S: AsRef<str>>(
    tags: &'a [S],
    selection: &VersionSelection,
) -> Result<&'a str, SelectError> {
    let semver = selection.semver.as_ref().ok_or(SelectError::Unsupported)?;
    let constraints = if semver.constraints.is_empty() {
        None
    } else {
        Some(
            Range::parse(&semver.constraints).map_err(|source| SelectError::Constraints {
                constraints: semver.constraints.clone(),
                source,
            })?,
        )
    };

    let parsed: Vec<(&str, Version)> = tags
        .iter()
        .map(AsRef::as_ref)
        .filter_map(|tag| Version::parse_relaxed(tag).ok().map(|v| (tag, v)))
        .collect();
    let all = parsed.len();

    let kept: Vec<&(&str, Version)> = parsed
        .iter()
        .filter(|(_, v)| keep_prerelease(v, semver.prereleases.as_ref()))
        .collect();
    let after_prereleases = kept.len();

    let matching: Vec<&(&str, Version)> = match &constraints {
        Some(range) => kept.into_iter().filter(|(_, v)| range.matches(v)).collect(),
        None => kept,
    };
    let after_constraints = constraints.as_ref().map(|_| matching.len());

    // `>=`: among equal versions the later tag wins, like Go's stable sort + last element.
    let highest = matching
        .iter()
        .fold(None::<&(&str, Version)>, |best, candidate| match best {
            Some(best) if candidate.1 < best.1 => Some(best),
            _ => Some(candidate),
        });
    highest.map(|(tag, _)| *tag).ok_or(SelectError::NoMatch {
        all,
        after_prereleases,
        after_constraints,
    })
}

fn keep_prerelease(version: &Version, filter: Option<&Prereleases>) -> bool {
    if !version.is_prerelease() {
        return true;
    }
    match filter {
        None => false,
        Some(p) if p.identifiers.is_empty() => true,
        Some(p) => version
            .pre
            .iter()
            .any(|id| p.identifiers.iter().any(|wanted| wanted == id.as_str())),
    }
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    const VENDIR_TAGS: &[&str] = &[
        "2.0.0-10+meta.10",
        "0.0.1-pre.10",
        "0.0.1-pre.1",
        "0.1.0",
        "2.0.0-10",
        "2.0.0",
        "0.0.1-rc.0",
    ];

    fn selection(constraints: &str, prereleases: Option<&[&str]>) -> VersionSelection {
        VersionSelection {
            semver: Some(SemverSelection {
                constraints: constraints.to_owned(),
                prereleases: prereleases.map(|ids| Prereleases {
                    identifiers: ids.iter().map(|s| (*s).to_owned()).collect(),
                }),
            }),
        }
    }

    #[rstest]
    #[case::highest_release(VENDIR_TAGS, "", None, "2.0.0")]
    #[case::prereleases_kept_but_release_higher(VENDIR_TAGS, "", Some(&[][..]), "2.0.0")]
    #[case::constraint_below_release(VENDIR_TAGS, "<2.0.0", Some(&[][..]), "2.0.0-10+meta.10")]
    #[case::constraint_excludes_prerelease_without_filter(VENDIR_TAGS, "<2.0.0", None, "0.1.0")]
    #[case::identifier_filter(VENDIR_TAGS, "<0.1.0", Some(&["rc"][..]), "0.0.1-rc.0")]
    #[case::identifier_filter_any_of(VENDIR_TAGS, "<0.1.0", Some(&["alpha", "pre"][..]), "0.0.1-pre.10")]
    #[case::numeric_identifier_matches_text(&["1.0.0-1", "1.0.0-2"], "", Some(&["1"][..]), "1.0.0-1")]
    #[case::identifier_must_be_exact(&["1.0.0-rc1", "0.9.0"], "", Some(&["rc"][..]), "0.9.0")]
    #[case::v_prefix_kept(&["v1.0.0", "v1.2.0", "v1.10.0", "latest"], "", None, "v1.10.0")]
    #[case::numeric_not_lexical(&["1.9.0", "1.10.0", "1.2.0"], "", None, "1.10.0")]
    #[case::ties_go_to_the_later_tag(&["1.0.0", "v1.0.0"], "", None, "v1.0.0")]
    #[case::ties_go_to_the_later_tag_reversed(&["v1.0.0", "1.0.0"], "", None, "1.0.0")]
    #[case::build_metadata_orders(&["1.0.0+z1", "1.0.0", "1.0.0+ab1.foo"], "", None, "1.0.0+z1")]
    #[case::unparseable_ignored(&["1.0", "v1", "1.0.0.0", "01.0.0", "1.0.0", "main"], "", None, "1.0.0")]
    #[case::range(&["0.9.0", "1.0.0", "1.5.0", "2.0.0", "3.0.0"], ">=1.0.0 <2.0.0", None, "1.5.0")]
    #[case::or_range(&["1.0.0", "2.0.0", "3.0.0"], "<2.0.0 || >=3.0.0", None, "3.0.0")]
    #[case::wildcard(&["1.1.0", "1.9.3", "2.0.0"], "1.x", None, "1.9.3")]
    #[case::not_equal(&["1.0.0", "2.0.0"], "!=2.0.0", None, "1.0.0")]
    fn selects_like_vendir(
        #[case] tags: &[&str],
        #[case] constraints: &str,
        #[case] prereleases: Option<&[&str]>,
        #[case] expected: &str,
    ) {
        assert_eq!(
            select_tag(tags, &selection(constraints, prereleases)).unwrap(),
            expected
        );
    }

    #[test]
    fn no_match_reports_vendir_details() {
        let err = select_tag(VENDIR_TAGS, &selection(">5.0.0", None)).unwrap_err();
        assert_eq!(
            err,
            SelectError::NoMatch {
                all: 7,
                after_prereleases: 2,
                after_constraints: Some(0)
            }
        );
        assert_eq!(
            err.to_string(),
            "Expected to find at least one version, but did not \
             (details: all=7 -> after-prereleases-filter=2 -> after-constraints-filter=0)"
        );

        let err = select_tag(&["main", "1.0.0-rc.1"], &selection("", None)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Expected to find at least one version, but did not (details: all=1 -> after-prereleases-filter=0)"
        );

        let empty: &[&str] = &[];
        assert!(matches!(
            select_tag(empty, &selection("", None)),
            Err(SelectError::NoMatch { all: 0, .. })
        ));
    }

    #[test]
    fn bad_constraints_error_even_without_tags() {
        let empty: &[&str] = &[];
        let err = select_tag(empty, &selection("~1.0", None)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Selecting versions: Parsing version constraint '~1.0': \
             Could not parse Range \"~1.0\": Could not parse comparator \"~\" in \"~1.0\""
        );
    }

    #[test]
    fn only_semver_is_supported() {
        assert_eq!(
            select_tag(&["1.0.0"], &VersionSelection::default()),
            Err(SelectError::Unsupported)
        );
    }

    #[test]
    fn deserializes_fetch_spec_shapes() {
        let s: VersionSelection = serde_json::from_str(
            r#"{"semver":{"constraints":">=1.0.0 <2.0.0","prereleases":{"identifiers":["rc"]}}}"#,
        )
        .unwrap();
        assert_eq!(s, selection(">=1.0.0 <2.0.0", Some(&["rc"])));
        let keep_all: VersionSelection = serde_json::from_str(r#"{"semver":{"prereleases":{}}}"#).unwrap();
        assert_eq!(keep_all, selection("", Some(&[])));
        let exclude: VersionSelection = serde_json::from_str(r#"{"semver":{}}"#).unwrap();
        assert_eq!(exclude, selection("", None));
    }
}

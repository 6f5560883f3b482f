//! The `holdfast.dev/original-refs` annotation: what the user wrote, for every pin in place.

use std::collections::BTreeMap;

use holdfast_registry::{Digest, Reference};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use json_patch::jsonptr::Pointer;

use super::{FetchSite, Resolution, sites::secret_name_pointer};

/// Annotation recording the originals of the pins holdfast put in place (format in the crate's
/// docs).
pub const ORIGINAL_REFS_ANNOTATION: &str = "holdfast.dev/original-refs";

/// The references (a regular expression, unanchored, in the syntax both RE2 and Rust's regex
/// crate read) whose pin holdfast writes as the reference up to its tag (the text after the last
/// `:` when it has no `/`) followed by `@` and the digest: a part of what
/// [`Reference::parse`] accepts, wide enough for the references people write. The webhook's
/// `matchConditions` (`manifests/components/match-conditions`) check with it, in CEL, that each
/// `holdfast.dev/original-refs` entry of an object is in place, so that an object the pinning
/// policy pinned, with nothing left to do, is not sent to the webhook.
pub const PLAIN_REFERENCE_PATTERN: &str = "(([a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)+(:([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?|[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?:([0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))/([a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)+|([a-z0-9]{2,}|[a-z0-9]+([._]|__|-+)[a-z0-9]+)(([._]|__|-+)[a-z0-9]+)*)|([a-z0-9]+((_|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)+|([a-z0-9]{2,}|[a-z0-9]+(_|__|-+)[a-z0-9]+)((_|__|-+)[a-z0-9]+)*))(:[a-zA-Z0-9_][a-zA-Z0-9._-]{0,126})?";

/// One entry of the annotation: the original of the reference at one JSON pointer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OriginalRef {
    /// The reference as the user wrote it.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The user's `tagSelection`, verbatim (removed from the spec when pinned).
    #[serde(rename = "tagSelection", default, skip_serializing_if = "Option::is_none")]
    pub tag_selection: Option<Value>,
    /// The digest holdfast pinned to.
    pub digest: Digest,
    /// The tag the `tagSelection` chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The mirror repository the field was pinned to instead of `ref`'s, when the digest's
    /// content was mirrored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    /// The user's `secretRef.name`, when holdfast replaced it with `pullSecret` (a pin to the
    /// mirror copy of private content: the user's Secret is for the upstream registry).
    #[serde(rename = "secretRef", default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<String>,
    /// The mirror pull Secret the source's `secretRef` names instead of `secretRef`.
    #[serde(rename = "pullSecret", default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
}

impl OriginalRef {
    /// What holdfast wrote into the field: `ref`'s repository, as spelt (or `mirror`, when
    /// set), pinned to `digest`. `None` if `ref` does not parse or is itself a digest reference
    /// (not an entry holdfast writes), or `mirror` is not a bare repository.
    pub fn pinned(&self) -> Option<String> {
        let original = Reference::parse(&self.reference)
            .ok()
            .filter(|r| !r.is_pinned())?;
        match &self.mirror {
            None => Some(original.pinned(&self.digest)),
            Some(mirror) => Reference::parse(mirror)
                .ok()
                .filter(|m| !m.is_pinned() && m.tag().is_none())
                .map(|m| m.pinned(&self.digest)),
        }
    }

    /// Whether `object` still holds this pin at `pointer` (and the pull Secret, if one was written).
    pub fn is_in_place(&self, object: &Value, pointer: &str) -> bool {
        let holds = |at: &str, value: &str| object.pointer(at).and_then(Value::as_str) == Some(value);
        let secret_in_place = || match (&self.pull_secret, Pointer::parse(pointer)) {
            (None, _) => true,
            (Some(pull), Ok(reference)) => holds(secret_name_pointer(reference).as_str(), pull),
            (Some(_), Err(_)) => false,
        };
        self.pinned()
            .is_some_and(|pinned| holds(pointer, &pinned) && secret_in_place())
    }

    /// Whether this records a pin of exactly what `site` holds now (same pointer assumed):
    /// same reference spelling, same `tagSelection`.
    pub fn is_original_of(&self, site: &FetchSite) -> bool {
        self.pinned().is_some()
            && self.reference == site.reference
            && self.tag_selection.as_ref().map(canonical) == site.tag_selection_json.as_ref().map(canonical)
    }
}

/// Why the annotation could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "metadata.annotations[\"{ORIGINAL_REFS_ANNOTATION}\"] is not the JSON object holdfast writes \
     ({reason})"
)]
pub struct OriginalRefsError {
    pub reason: String,
}

/// The well-formed entries of an object's annotation, by JSON pointer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OriginalRefs {
    entries: BTreeMap<String, OriginalRef>,
}

impl OriginalRefs {
    /// Reads the annotation of `object`: empty when absent; entries that are not well-formed
    /// are skipped; an error if it is not a JSON object at all.
    pub fn from_object(object: &Value) -> Result<Self, OriginalRefsError> {
        let entries = raw_entries(object)?
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(pointer, entry)| {
                serde_json::from_value::<OriginalRef>(entry)
                    .ok()
                    .map(|entry| (pointer, entry))
            })
            .collect();
        Ok(Self { entries })
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry for a JSON pointer such as `/spec/fetch/0/image/url`.
    pub fn get(&self, pointer: &str) -> Option<&OriginalRef> {
        self.entries.get(pointer)
    }

    /// All entries, by pointer.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &OriginalRef)> {
        self.entries
            .iter()
            .map(|(pointer, entry)| (pointer.as_str(), entry))
    }

    /// The entries whose pin `object` still holds (what the controller tracks and re-pins).
    pub fn in_place<'a>(&'a self, object: &'a Value) -> impl Iterator<Item = (&'a str, &'a OriginalRef)> {
        self.iter()
            .filter(move |(pointer, entry)| entry.is_in_place(object, pointer))
    }

    /// The user's Secret recorded for `site`'s field when its `secretRef` names the pull Secret
    /// holdfast wrote there (a pin to a private mirror copy): what the source fetched upstream
    /// with before holdfast pointed it at the mirror.
    pub fn users_secret(&self, site: &FetchSite) -> Option<String> {
        let entry = self.get(site.pointer.as_str())?;
        (entry.pull_secret.is_some() && entry.pull_secret == site.secret_ref)
            .then(|| entry.secret_ref.clone())
            .flatten()
    }

    /// The pin recorded for exactly what `site` holds now, if any.
    pub fn recorded_pin(&self, site: &FetchSite) -> Option<Resolution> {
        let entry = self.get(site.pointer.as_str())?;
        entry.is_original_of(site).then(|| Resolution {
            digest: entry.digest.clone(),
            selected_tag: entry.tag.clone(),
            mirror: entry.mirror.clone(),
            pull_secret: entry.pull_secret.clone(),
        })
    }
}

/// The annotation's string value, if the object has one.
pub(super) fn annotation(object: &Value) -> Option<&Value> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(ORIGINAL_REFS_ANNOTATION)
}

/// The annotation's entries as JSON; `None` when there is no annotation.
pub(super) fn raw_entries(object: &Value) -> Result<Option<BTreeMap<String, Value>>, OriginalRefsError> {
    let Some(value) = annotation(object) else {
        return Ok(None);
    };
    let text = value.as_str().ok_or_else(|| OriginalRefsError {
        reason: "not a string".into(),
    })?;
    serde_json::from_str::<BTreeMap<String, Value>>(text)
        .map(Some)
        .map_err(|e| OriginalRefsError {
            reason: e.to_string(),
        })
}

/// `value` with the keys of every object in sorted order, so serialising it gives the same bytes
/// whatever order the keys came in (and whether or not serde_json preserves insertion order).
pub(super) fn canonical(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            Value::Object(
                keys.into_iter()
                    .map(|key| (key.clone(), canonical(&map[key])))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

//! The `DigestCacheEntry` custom resource, typed: the objects [`super`] writes and reads, and
//! the CRD in `manifests/crds/` ([`manifest`], checked by `cache/tests/crd.rs`).
//!
//! Its doc comments are the schema's descriptions (one line per paragraph, see
//! `as_written_by_hand`). Optional fields are left out when unset, never `null`: that is how
//! the objects on existing clusters look, and two field managers write parts of one object (the
//! entry's [`DigestCacheEntrySpec`] without [`MirrorRecord`], [`MirrorApply`] with only it).

use std::{borrow::Cow, time::SystemTime};

use kube::{
    CustomResource, CustomResourceExt,
    core::{ObjectMeta, TypeMeta},
};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema, transform::transform_subschemas};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _, ser::Error as _};
use serde_json::Value;
use time::{OffsetDateTime, format_description::well_known::Rfc3339};

use holdfast_registry::Digest;

use crate::{CacheEntry, CacheKey, MirrorDeletion, MirrorFields, Mirrored, Scope, Superseded};

/// The command that prints [`manifest`] into the file it belongs in (run from the workspace).
pub const REGENERATE: &str = "cargo run -q -p holdfast-cache --example digest_cache_crd > manifests/crds/digestcacheentries.holdfast.dev.yaml";

/// The comment block the manifest opens with, before the command that generates it.
const HEADER: &str = "\
# holdfast's digest cache, shared by every webhook replica and the controller and kept across
# restarts: one object per (reference or tag selection, credential scope), in holdfast's namespace.
# Written by holdfast only; `kubectl get digestcacheentries -n holdfast-system` shows the cache,
# and (Mirror, Mirrored) where the controller copied an entry's content when a mirror is configured.
# The status (subresource) is the controller's view of each entry: conditions Resolved, Stale and
# Mirrored, the digest and check time observed, how many objects name it (`kubectl holdfast`).
#
# Generated from cache/src/cluster_store/crd.rs; do not edit, regenerate with
";

/// The CRD as `manifests/crds/digestcacheentries.holdfast.dev.yaml` holds it.
pub fn manifest() -> Result<String, serde_yaml::Error> {
    let crd = serde_yaml::to_string(&DigestCacheEntry::crd())?;
    Ok(format!("{HEADER}#   {REGENERATE}\n{crd}"))
}

// One cached answer of holdfast's digest cache. (Comments, not docs, on the types the schema
// is made of: a type's doc would be a description the hand-written schema did not have.)
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "holdfast.dev",
    version = "v1alpha1",
    kind = "DigestCacheEntry",
    plural = "digestcacheentries",
    namespaced,
    shortname = "hfdigest",
    category = "holdfast",
    derive = "PartialEq",
    // What the controller observed, apart from what was asked (`kubectl get -o yaml` shows it).
    status = "DigestCacheEntryStatus",
    // No description of the object, as before (an empty doc is none).
    doc = "",
    // As JSON: clippy's duplicated_attributes takes `type_ = "string"` in two printcolumn(…) for a
    // repeated attribute.
    printcolumn = r#"{"name": "Reference", "type": "string", "jsonPath": ".spec.reference"}"#,
    printcolumn = r#"{"name": "Selection", "type": "string", "jsonPath": ".spec.selection", "priority": 1}"#,
    printcolumn = r#"{"name": "Tag", "type": "string", "jsonPath": ".spec.tag"}"#,
    printcolumn = r#"{"name": "Scope", "type": "string", "jsonPath": ".spec.scope"}"#,
    printcolumn = r#"{"name": "Digest", "type": "string", "jsonPath": ".spec.digest"}"#,
    printcolumn = r#"{"name": "State", "type": "string", "jsonPath": ".spec.state"}"#,
    printcolumn = r#"{"name": "Last-Check", "type": "date", "jsonPath": ".spec.checkedAt"}"#,
    printcolumn = r#"{"name": "Mirror", "type": "string", "jsonPath": ".spec.mirror"}"#,
    printcolumn = r#"{"name": "Mirrored", "type": "date", "jsonPath": ".spec.mirroredAt"}"#,
    printcolumn = r#"{"name": "Superseded", "type": "string", "jsonPath": ".spec.mirrorSuperseded[*].location", "priority": 1}"#,
    printcolumn = r#"{"name": "Mirror-Deleted", "type": "date", "jsonPath": ".spec.mirrorDeletedAt", "priority": 1}"#,
    printcolumn = r#"{"name": "Error", "type": "string", "jsonPath": ".spec.error", "priority": 1}"#,
    printcolumn = r#"{"name": "Used-By", "type": "integer", "jsonPath": ".status.usedBy", "priority": 1}"#,
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = as_written_by_hand)]
pub struct DigestCacheEntrySpec {
    /// The normalised reference (registry/repository:tag), or the repository of a tag selection.
    pub reference: String,
    /// The tagSelection, as canonical JSON, when the tag is selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<String>,
    /// Whose credentials resolved it: anonymous, or secret:<namespace>/<name>. Served only to
    /// that scope (anonymous serves all).
    #[serde(with = "scope_text")]
    #[schemars(with = "String")]
    pub scope: Scope,
    /// For a secret: scope, the uid of the Secret that resolved it. A Secret deleted and
    /// recreated under the same name is another Secret: the controller drops this entry when it
    /// reads the new one, and it is never served stale.
    #[serde(rename = "secretUID", default, skip_serializing_if = "Option::is_none")]
    pub secret_uid: Option<String>,
    // No description, as before: `sha256:<64 lowercase hex>`, checked again when read.
    #[schemars(with = "String", regex(pattern = r"^sha256:[0-9a-f]{64}$"))]
    pub digest: Digest,
    /// The tag a selection picked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Last successful answer from the registry.
    pub resolved_at: Timestamp,
    /// Last time the registry was asked.
    pub checked_at: Timestamp,
    /// Fresh after a successful check, Stale when the last check failed.
    pub state: EntryState,
    /// The last check's failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    // The fields of `MIRROR_FIELD_MANAGER`.
    #[serde(flatten)]
    pub mirror: MirrorRecord,
}

// `DigestCacheEntrySpec::state`: derived from the entry's error when written, not read back.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum EntryState {
    Fresh,
    Stale,
}

// The fields of an entry's object that `MIRROR_FIELD_MANAGER` owns, all of them in every apply
// (the ones it leaves out are removed).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorRecord {
    /// Where the controller copied this entry's content in the mirror
    /// (<mirror>/<prefix>/<source host>/<source repository>@sha256:…). Names the digest it
    /// holds: when the tag moves, the record no longer applies until the new digest is copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<String>,
    /// When that copy completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirrored_at: Option<Timestamp>,
    /// Copies this entry recorded before its tag moved and the new digest's copy was recorded in
    /// mirror: still in the mirror (objects may be pinned to them) until retention deletes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirror_superseded: Vec<SupersededCopy>,
    /// The last copy the controller deleted from the mirror because no object referenced it for
    /// the retention period (--mirror-retention-seconds): the current copy (then it replaces
    /// mirror until the content is copied again) or a superseded one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_deleted: Option<String>,
    /// When that deletion was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_deleted_at: Option<Timestamp>,
}

// `DigestCacheEntry`'s status: written by the controller (the leader) through the status
// subresource, never by the entry's own applies (which own the spec).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = as_written_by_hand)]
pub struct DigestCacheEntryStatus {
    /// Resolved (the last registry check succeeded), Stale (the last check failed: the digest
    /// resolved before is served until the staleness limit) and Mirrored (the current digest's
    /// content is copied into the mirror), in the shape of metav1.Condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The digest the entry held when the controller last wrote this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>")]
    pub observed_digest: Option<Digest>,
    /// When the registry was last asked (spec.checkedAt, as observed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check_time: Option<Timestamp>,
    /// How many Apps, PackageRepositories and Packages name this entry's reference (follow pins
    /// and references not pinned yet; the controller deletes an entry no object names after
    /// --cache-gc-grace-seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i32>")]
    pub used_by: Option<u32>,
    /// While Stale: until when the digest is served (resolvedAt plus the controller's
    /// --cache-max-staleness-seconds); past it, objects naming the tag are left unpinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve_stale_until: Option<Timestamp>,
    /// The last refresh asked for with the holdfast.dev/refresh annotation
    /// (`kubectl holdfast refresh`), once the controller acted on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_refresh: Option<RefreshOutcome>,
}

// A condition of `DigestCacheEntryStatus::conditions`, as metav1.Condition.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Resolved, Stale or Mirrored.
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: ConditionStatus,
    /// Why, in CamelCase.
    pub reason: String,
    /// Why, for people.
    pub message: String,
    /// When status last changed.
    pub last_transition_time: Timestamp,
}

// `Condition::status`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

// `DigestCacheEntryStatus::last_refresh`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefreshOutcome {
    /// The value of the holdfast.dev/refresh annotation acted on.
    pub request: String,
    /// Checked (the digest is unchanged), Moved (the tag holds another digest now: the objects
    /// naming it are re-pinned), Failed (the registry failed: see the Stale condition) or
    /// NotNamed (no object names the reference: the controller resolves only what objects name).
    pub result: RefreshResult,
    /// When the controller acted on it.
    pub at: Timestamp,
}

// `RefreshOutcome::result`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RefreshResult {
    Checked,
    Moved,
    Failed,
    NotNamed,
}

/// The annotation on a `DigestCacheEntry` that asks the controller to re-resolve it now (any
/// new value: `kubectl holdfast refresh` writes a unique one); the controller echoes the value
/// in `status.lastRefresh.request` once done.
pub const REFRESH_ANNOTATION: &str = "holdfast.dev/refresh";

/// What the controller applies to an entry's status subresource: the object with only its status.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct StatusApply {
    #[serde(flatten)]
    pub types: TypeMeta,
    pub metadata: ObjectMeta,
    pub status: DigestCacheEntryStatus,
}

impl StatusApply {
    pub fn new(name: String, status: DigestCacheEntryStatus) -> Self {
        Self {
            types: TypeMeta::resource::<DigestCacheEntry>(),
            metadata: ObjectMeta {
                name: Some(name),
                ..ObjectMeta::default()
            },
            status,
        }
    }
}

// An item of `MirrorRecord::mirror_superseded`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct SupersededCopy {
    pub location: String,
    /// When it stopped being this entry's copy.
    pub since: Timestamp,
}

/// What [`super::MIRROR_FIELD_MANAGER`] applies: the object of an entry with only the
/// [`MirrorRecord`] in its spec.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct MirrorApply {
    #[serde(flatten)]
    pub types: TypeMeta,
    pub metadata: ObjectMeta,
    pub spec: MirrorRecord,
}

impl MirrorApply {
    pub fn new(name: String, spec: MirrorRecord) -> Self {
        Self {
            types: TypeMeta::resource::<DigestCacheEntry>(),
            metadata: ObjectMeta {
                name: Some(name),
                ..ObjectMeta::default()
            },
            spec,
        }
    }
}

/// An RFC 3339 time (`format: date-time`), with the sub-second digits it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timestamp(pub SystemTime);

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = OffsetDateTime::from(self.0)
            .format(&Rfc3339)
            .map_err(S::Error::custom)?;
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        let at = OffsetDateTime::parse(&text, &Rfc3339).map_err(D::Error::custom)?;
        Ok(Self(at.into()))
    }
}

impl JsonSchema for Timestamp {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Timestamp".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "format": "date-time"})
    }
}

/// A [`Scope`] as its text: `anonymous`, or `secret:<namespace>/<name>`.
mod scope_text {
    use super::*;

    pub fn serialize<S: Serializer>(scope: &Scope, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(scope)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Scope, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        parse(&text).ok_or_else(|| {
            D::Error::custom(format!(
                "scope {text:?} is neither anonymous nor secret:<namespace>/<name>"
            ))
        })
    }

    fn parse(text: &str) -> Option<Scope> {
        if text == "anonymous" {
            return Some(Scope::Anonymous);
        }
        let (namespace, name) = text.strip_prefix("secret:")?.split_once('/')?;
        Some(Scope::Secret {
            namespace: namespace.into(),
            name: name.into(),
        })
    }
}

/// The schema as it was written by hand before it was derived: a description is one line per
/// paragraph (as rustdoc renders the doc comment), and an optional field is absent when unset,
/// not `nullable` (nothing writes `null`; the API server drops a `null` it is sent).
fn as_written_by_hand(schema: &mut Schema) {
    transform_subschemas(&mut as_written_by_hand, schema);
    if let Some(Value::String(description)) = schema.get_mut("description") {
        *description = description
            .split("\n\n")
            .map(|paragraph| paragraph.replace('\n', " "))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    if let Some(Value::Array(types)) = schema.get_mut("type") {
        types.retain(|t| t != "null");
        if let [only] = types.as_slice() {
            let only = only.clone();
            schema.insert("type".into(), only);
        }
    }
}

impl From<&CacheEntry> for DigestCacheEntrySpec {
    /// The entry's own fields: no [`MirrorRecord`] (another manager's).
    fn from(entry: &CacheEntry) -> Self {
        Self {
            reference: entry.key.reference.clone(),
            selection: entry.key.selection.clone(),
            scope: entry.key.scope.clone(),
            secret_uid: entry.secret_uid.clone(),
            digest: entry.digest.clone(),
            tag: entry.tag.clone(),
            resolved_at: Timestamp(entry.resolved_at),
            checked_at: Timestamp(entry.checked_at),
            state: if entry.error.is_some() {
                EntryState::Stale
            } else {
                EntryState::Fresh
            },
            error: entry.error.clone(),
            mirror: MirrorRecord::default(),
        }
    }
}

impl From<&DigestCacheEntrySpec> for CacheEntry {
    fn from(spec: &DigestCacheEntrySpec) -> Self {
        CacheEntry {
            key: CacheKey {
                reference: spec.reference.clone(),
                selection: spec.selection.clone(),
                scope: spec.scope.clone(),
            },
            digest: spec.digest.clone(),
            tag: spec.tag.clone(),
            resolved_at: spec.resolved_at.0,
            checked_at: spec.checked_at.0,
            error: spec.error.clone(),
            secret_uid: spec.secret_uid.clone(),
        }
    }
}

impl From<&MirrorFields> for MirrorRecord {
    fn from(fields: &MirrorFields) -> Self {
        Self {
            mirror: fields.current.as_ref().map(|current| current.location.clone()),
            mirrored_at: fields.current.as_ref().map(|current| Timestamp(current.at)),
            mirror_superseded: fields
                .superseded
                .iter()
                .map(|copy| SupersededCopy {
                    location: copy.location.clone(),
                    since: Timestamp(copy.since),
                })
                .collect(),
            mirror_deleted: fields.deleted.as_ref().map(|deleted| deleted.location.clone()),
            mirror_deleted_at: fields.deleted.as_ref().map(|deleted| Timestamp(deleted.at)),
        }
    }
}

impl From<&MirrorRecord> for MirrorFields {
    /// A location without its time (or a time without its location) is no record.
    fn from(record: &MirrorRecord) -> Self {
        MirrorFields {
            current: record
                .mirror
                .clone()
                .zip(record.mirrored_at)
                .map(|(location, at)| Mirrored { location, at: at.0 }),
            superseded: record
                .mirror_superseded
                .iter()
                .map(|copy| Superseded {
                    location: copy.location.clone(),
                    since: copy.since.0,
                })
                .collect(),
            deleted: record
                .mirror_deleted
                .clone()
                .zip(record.mirror_deleted_at)
                .map(|(location, at)| MirrorDeletion { location, at: at.0 }),
        }
    }
}

//! Building the JSON patch from resolved digests.

use std::collections::{BTreeMap, BTreeSet};

use holdfast_registry::Digest;
use json_patch::{AddOperation, PatchOperation, RemoveOperation, ReplaceOperation, jsonptr::PointerBuf};
use serde_json::{Map, Value, json};

use super::{
    FetchSite, Need, PinPolicy, is_terminating,
    original_refs::{ORIGINAL_REFS_ANNOTATION, OriginalRef, annotation, canonical, raw_entries},
    plan,
};

/// What the caller found for one site.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The digest to pin to.
    pub digest: Digest,
    /// The tag a `tagSelection` chose (recorded in the annotation); `None` for a plain tag.
    pub selected_tag: Option<String>,
    /// The mirror repository (`<mirror>/<prefix>/<source host>/<source repository>`) holding
    /// the digest's content: the field is pinned there instead of the user's repository.
    pub mirror: Option<String>,
    /// The mirror pull Secret the source's `secretRef` names when pinned to `mirror` (the
    /// user's Secret is for the upstream registry); only for a source with a `secretRef`.
    pub pull_secret: Option<String>,
}

/// The patch for one object and the warnings for the client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PinOutcome {
    /// Empty when nothing changes.
    pub ops: Vec<PatchOperation>,
    pub warnings: Vec<String>,
    /// References pinned from a cache entry the registry could not confirm (it failed).
    pub stale: usize,
    /// References that needed the registry and stay unpinned (it failed, and nothing cached).
    pub unresolved: usize,
}

/// The operations that pin `sites[index]` to each resolution's digest, remove the resolved
/// `tagSelection`s and bring the `holdfast.dev/original-refs` annotation up to date (new
/// entries for these pins, entries no longer in place dropped), and give each source that
/// still names a mirror pull Secret but is no longer pinned to the mirror its user's Secret
/// back ([`FetchSite::upstream_secret`](super::FetchSite)). `sites` must come from
/// [`fetch_sites`](super::fetch_sites) on this same `object`.
///
/// Never touches a reference that already has a digest, or a site [`plan`] rejects (a
/// resolution for one is a caller bug and is reported as a warning). With
/// [`PinPolicy::Disabled`], or on an object being deleted, there are no operations at all.
/// Deterministic: the same object, sites and resolutions always give the same operations, and
/// an object this patch was applied to gets none for the same sites with no resolutions.
pub fn pin_patch(
    object: &Value,
    sites: &[FetchSite],
    resolutions: &[(usize, Resolution)],
    policy: PinPolicy,
) -> PinOutcome {
    let mut outcome = PinOutcome::default();
    if policy == PinPolicy::Disabled || is_terminating(object) {
        return outcome;
    }
    let mut replacements = Vec::new();
    let mut removals = Vec::new();
    let mut fresh: BTreeMap<String, Value> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut written_secrets = BTreeSet::new();
    for (index, resolution) in resolutions {
        let Some(site) = sites.get(*index) else {
            outcome.warnings.push(format!(
                "holdfast internal error: a digest for fetch site {index} of {}; ignored",
                sites.len()
            ));
            continue;
        };
        if !seen.insert(*index) {
            outcome.warnings.push(format!(
                "holdfast internal error: two digests for {}; the first is used",
                site.field
            ));
            continue;
        }
        match plan(site) {
            Ok(Need::Tag(_) | Need::Select(..)) => {}
            Ok(Need::AlreadyPinned) => continue,
            Err(error) => {
                outcome.warnings.push(error.to_string());
                continue;
            }
        }
        if object.pointer(site.pointer.as_str()).and_then(Value::as_str) != Some(site.reference.as_str()) {
            outcome.warnings.push(format!(
                "holdfast internal error: {} does not hold {:?}; left unpinned",
                site.field, site.reference
            ));
            continue;
        }
        let mut entry = OriginalRef {
            reference: site.reference.clone(),
            tag_selection: site.tag_selection_json.clone(),
            digest: resolution.digest.clone(),
            tag: site
                .tag_selection_json
                .as_ref()
                .and(resolution.selected_tag.clone()),
            mirror: resolution.mirror.clone(),
            secret_ref: None,
            pull_secret: None,
        };
        let Some(pinned) = entry.pinned() else {
            outcome.warnings.push(format!(
                "holdfast internal error: {} cannot be pinned to the mirror repository {:?}; left unpinned",
                site.field, resolution.mirror
            ));
            continue;
        };
        replacements.push(PatchOperation::Replace(ReplaceOperation {
            path: site.pointer.clone(),
            value: Value::String(pinned),
        }));
        // A pin to a mirror copy pulls with the mirror's Secret; the user's name is recorded.
        // Any other pin fetches upstream, with the user's Secret (back, if the source still
        // names the pull Secret of an earlier mirror pin).
        let secret = match (&resolution.pull_secret, &site.upstream_secret, &entry.mirror) {
            (Some(pull), Some(user), Some(_)) if pull != user => {
                entry.secret_ref = Some(user.clone());
                entry.pull_secret = Some(pull.clone());
                Some(pull)
            }
            (_, user, _) => user.as_ref(),
        };
        written_secrets.insert(*index);
        if let Some(op) = secret_op(site, secret) {
            replacements.push(op);
        }
        if let Some(path) = &site.tag_selection_pointer {
            removals.push(PatchOperation::Remove(RemoveOperation { path: path.clone() }));
        }
        match serde_json::to_value(&entry) {
            Ok(value) => {
                fresh.insert(site.pointer.to_string(), canonical(&value));
            }
            // Unreachable (strings, a digest and JSON), but never worth a panic.
            Err(error) => outcome.warnings.push(format!(
                "holdfast internal error: {} not recorded in {ORIGINAL_REFS_ANNOTATION}: {error}",
                site.field
            )),
        }
    }
    // Sites left as they are (unresolved, invalid) still get the user's Secret back: the
    // annotation entry that recorded it is dropped with this patch.
    for (index, site) in sites.iter().enumerate() {
        if !written_secrets.contains(&index)
            && !matches!(plan(site), Ok(Need::AlreadyPinned))
            && let Some(op) = secret_op(site, site.upstream_secret.as_ref())
        {
            replacements.push(op);
        }
    }
    outcome.ops = replacements;
    outcome.ops.append(&mut removals);
    if let Some(op) = annotation_op(object, fresh, &mut outcome.warnings) {
        outcome.ops.push(op);
    }
    outcome
}

/// The operation that makes `site`'s `secretRef.name` `secret`, when it names another Secret
/// (never one that removes or adds a `secretRef`).
fn secret_op(site: &FetchSite, secret: Option<&String>) -> Option<PatchOperation> {
    let secret = secret?;
    (site.secret_ref.as_ref().is_some_and(|written| written != secret)).then(|| {
        PatchOperation::Replace(ReplaceOperation {
            path: site.secret_name_pointer(),
            value: Value::String(secret.clone()),
        })
    })
}

/// The operation that makes the annotation hold the entries still in place plus `fresh`, if
/// that differs from what it holds now.
fn annotation_op(
    object: &Value,
    fresh: BTreeMap<String, Value>,
    warnings: &mut Vec<String>,
) -> Option<PatchOperation> {
    let existing = raw_entries(object);
    if let Err(error) = &existing {
        warnings.push(format!("{error}; holdfast rewrites it"));
    }
    let mut desired: BTreeMap<String, Value> = existing
        .iter()
        .flatten()
        .flatten()
        .filter(|(pointer, _)| !fresh.contains_key(*pointer))
        .filter(|(pointer, entry)| {
            serde_json::from_value::<OriginalRef>((*entry).clone())
                .is_ok_and(|entry| entry.is_in_place(object, pointer))
        })
        .map(|(pointer, entry)| (pointer.clone(), canonical(entry)))
        .collect();
    desired.extend(fresh);

    let unchanged = match &existing {
        // Content, not bytes: an equivalent but reformatted annotation is left alone.
        Ok(Some(existing)) => *existing == desired,
        Ok(None) => desired.is_empty(),
        Err(_) => false,
    };
    if unchanged {
        return None;
    }
    let path = PointerBuf::from_tokens(["metadata", "annotations", ORIGINAL_REFS_ANNOTATION]);
    if desired.is_empty() {
        // The annotation exists here (else `unchanged`).
        return Some(PatchOperation::Remove(RemoveOperation { path }));
    }
    let value = Value::String(Value::Object(desired.into_iter().collect::<Map<String, Value>>()).to_string());
    if annotation(object).is_some() {
        return Some(PatchOperation::Replace(ReplaceOperation { path, value }));
    }
    let metadata = object.get("metadata").filter(|m| m.is_object());
    let has_annotations = metadata
        .and_then(|m| m.get("annotations"))
        .is_some_and(Value::is_object);
    let op = match (metadata, has_annotations) {
        (Some(_), true) => AddOperation { path, value },
        // `add` creates a missing member and replaces a `null` one alike.
        (Some(_), false) => AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: json!({ ORIGINAL_REFS_ANNOTATION: value }),
        },
        (None, _) => AddOperation {
            path: PointerBuf::from_tokens(["metadata"]),
            value: json!({ "annotations": { ORIGINAL_REFS_ANNOTATION: value } }),
        },
    };
    Some(PatchOperation::Add(op))
}

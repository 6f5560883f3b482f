//! Re-pinning stored objects (the controller's side): what an object would hold had holdfast
//! never pinned it, the update that takes it from what it holds to what it should hold, and
//! when a `follow` pin to a mirror copy waits there for its moved tag's new copy.

use std::{collections::HashSet, sync::RwLock};

use holdfast_registry::{Reference, mirror::MirrorLocation};
use json_patch::{
    PatchOperation, TestOperation,
    jsonptr::{Pointer, PointerBuf},
};
use serde_json::Value;

use crate::{OriginalRefs, PinPolicy, Resolution, sites::secret_name_pointer};

/// Whether content from `source`'s registry is mirrored under `registries`
/// (`--mirror-source-registry`; empty: every registry). Docker Hub may be listed as
/// `docker.io`, `index.docker.io` or `registry-1.docker.io`.
pub fn selects(registries: &[String], source: &Reference) -> bool {
    const HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
    registries.is_empty()
        || registries.iter().any(|listed| {
            let listed = listed.trim().to_ascii_lowercase();
            listed == source.registry().to_ascii_lowercase()
                || (source.is_docker_hub() && HUB.contains(&listed.as_str()))
        })
}

/// The mirror copier (the controller's leader) as re-pinning sees it: which registries it
/// copies from, and the copies it gave up on (a permanent failure: not tried again while the
/// copy stays wanted). Kept in memory, shared by the copier and the pinner: a new leader tries
/// every copy once more.
#[derive(Debug, Default)]
pub struct Copying {
    registries: Vec<String>,
    given_up: RwLock<HashSet<String>>,
}

impl Copying {
    /// The copier of `registries` (`--mirror-source-registry`; empty: every registry).
    pub fn new(registries: Vec<String>) -> Self {
        Self {
            registries,
            given_up: RwLock::default(),
        }
    }

    /// Whether content from `source`'s registry is copied.
    pub fn copies_from(&self, source: &Reference) -> bool {
        selects(&self.registries, source)
    }

    /// Records that the copy to `location` failed permanently.
    pub fn give_up(&self, location: &str) {
        self.given_up
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(location.to_owned());
    }

    pub fn given_up(&self, location: &str) -> bool {
        self.given_up
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(location)
    }

    /// Forgets the given-up copies `wanted` rejects: one wanted again is tried once more.
    pub fn retain_given_up(&self, wanted: impl Fn(&str) -> bool) {
        self.given_up
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|location| wanted(location));
    }

    /// Whether the copy of `source`'s content to `location` is coming: its registry is copied
    /// from and the copier has not given up on it.
    pub fn coming(&self, source: &Reference, location: &str) -> bool {
        self.copies_from(source) && !self.given_up(location)
    }
}

/// Whether a `follow` site pinned to a mirror copy (`recorded`) stays there although its tag
/// now holds another digest (`fresh`) that is not mirrored yet: so that the object is updated
/// once, straight to the new copy when it is recorded, instead of twice (upstream now, to the
/// mirror after the copy) and pinned upstream meanwhile. Only while `coming(old copy, new copy)`
/// (the new one in the same mirror repository) says the copier is making the new copy (see
/// [`Copying::coming`]); a copy given up on lets the site go upstream. A pin to another mirror
/// (the configuration changed) does not stay.
pub fn stays_on_mirror(
    recorded: &Resolution,
    fresh: &Resolution,
    mirror: &MirrorLocation,
    coming: impl FnOnce(&str, &str) -> bool,
) -> bool {
    let Some(repository) = &recorded.mirror else {
        return false;
    };
    if fresh.mirror.is_some() || fresh.digest == recorded.digest {
        return false;
    }
    let ours = Reference::parse(repository).is_ok_and(|r| !r.is_pinned() && mirror.contains(&r));
    let (old, new) = (
        format!("{repository}@{}", recorded.digest),
        format!("{repository}@{}", fresh.digest),
    );
    ours && coming(&old, &new)
}

/// `object` with every pin holdfast has in place put back to what the user wrote (reference,
/// `tagSelection` and a `secretRef` replaced by the mirror pull Secret), when its policy is `follow`; pinning that again follows moved tags. Other
/// policies, and pins the user replaced, are left as they are.
pub fn unpinned(object: &Value) -> Value {
    let (policy, _) = PinPolicy::from_object(object);
    if policy != PinPolicy::Follow {
        return object.clone();
    }
    let Ok(recorded) = OriginalRefs::from_object(object) else {
        return object.clone();
    };
    let mut out = object.clone();
    for (pointer, original) in recorded.in_place(object) {
        if let Some(field) = out.pointer_mut(pointer) {
            *field = Value::String(original.reference.clone());
        }
        if let (Some(user), Ok(reference)) = (&original.secret_ref, Pointer::parse(pointer))
            && let Some(field) = out.pointer_mut(secret_name_pointer(reference).as_str())
        {
            *field = Value::String(user.clone());
        }
        if let (Some(selection), Some((parent, _))) = (&original.tag_selection, pointer.rsplit_once('/'))
            && let Some(Value::Object(source)) = out.pointer_mut(parent)
        {
            source.insert("tagSelection".into(), selection.clone());
        }
    }
    out
}

/// The JSON patch from `stored` to `desired`, guarded by `stored`'s resourceVersion so it fails
/// (and is retried) if the object changed in between. Empty when there is nothing to change.
pub fn update(stored: &Value, desired: &Value) -> Vec<PatchOperation> {
    let changes = json_patch::diff(stored, desired).0;
    if changes.is_empty() {
        return changes;
    }
    let mut ops = Vec::with_capacity(changes.len() + 1);
    if let Some(version) = stored.pointer("/metadata/resourceVersion") {
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
            value: version.clone(),
        }));
    }
    ops.extend(changes);
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pinned_app(policy: Option<&str>) -> Value {
        let digest = format!("sha256:{}", "a".repeat(64));
        let original = json!({
            "/spec/fetch/0/imgpkgBundle/image": {"ref": "reg.io/team/bundle", "digest": digest, "tag": "1.1.0",
                "tagSelection": {"semver": {"constraints": ">=1.0.0"}}},
        });
        let mut labels = json!({});
        if let Some(policy) = policy {
            labels["holdfast.dev/pin"] = json!(policy);
        }
        json!({
            "metadata": {"name": "a", "resourceVersion": "7", "labels": labels,
                "annotations": {"holdfast.dev/original-refs": original.to_string()}},
            "spec": {"fetch": [{"imgpkgBundle": {"image": format!("reg.io/team/bundle@{digest}")}}]},
        })
    }

    #[test]
    fn a_follow_pin_goes_back_to_the_tag_selection() {
        let out = unpinned(&pinned_app(None));
        assert_eq!(
            out["spec"]["fetch"][0]["imgpkgBundle"]["image"],
            "reg.io/team/bundle"
        );
        assert_eq!(
            out["spec"]["fetch"][0]["imgpkgBundle"]["tagSelection"]["semver"]["constraints"],
            ">=1.0.0"
        );
    }

    #[test]
    fn freeze_and_replaced_pins_stay() {
        let frozen = pinned_app(Some("freeze"));
        assert_eq!(unpinned(&frozen), frozen);
        let mut replaced = pinned_app(None);
        replaced["spec"]["fetch"][0]["imgpkgBundle"]["image"] =
            json!(format!("reg.io/team/bundle@sha256:{}", "b".repeat(64)));
        assert_eq!(unpinned(&replaced), replaced);
    }

    #[test]
    fn the_update_is_guarded_and_empty_without_changes() {
        let stored = pinned_app(None);
        assert!(update(&stored, &stored).is_empty());
        let mut desired = stored.clone();
        desired["spec"]["fetch"][0]["imgpkgBundle"]["image"] = json!("reg.io/team/bundle@sha256:0");
        let ops = update(&stored, &desired);
        assert!(matches!(&ops[0], PatchOperation::Test(t) if t.value == json!("7")));
        assert_eq!(ops.len(), 2);
    }

    fn resolution(seed: &str, mirror: Option<&str>) -> Resolution {
        Resolution {
            digest: holdfast_registry::Digest::sha256_of(seed.as_bytes()),
            selected_tag: None,
            mirror: mirror.map(str::to_owned),
            pull_secret: None,
        }
    }

    const REPO: &str = "cache.corp.com:5000/m/reg.io/team/app";

    fn mirror() -> MirrorLocation {
        MirrorLocation::new("cache.corp.com:5000", "m").unwrap()
    }

    #[test]
    fn a_mirror_pin_waits_for_its_moved_tags_copy_and_only_for_it() {
        let on_old_copy = resolution("v1", Some(REPO));
        let moved = resolution("v2", None);
        let old_copy = format!("{REPO}@{}", on_old_copy.digest);
        let new_copy = format!("{REPO}@{}", moved.digest);
        let asked = std::cell::RefCell::new(Vec::new());
        let coming = |old: &str, new: &str| {
            asked.borrow_mut().push((old.to_owned(), new.to_owned()));
            true
        };
        assert!(stays_on_mirror(&on_old_copy, &moved, &mirror(), coming));
        assert_eq!(
            *asked.borrow(),
            [(old_copy, new_copy)],
            "the old and the new digest's copies, same repository"
        );
        // Given up on (a permanent failure), or not being made: upstream it goes.
        assert!(!stays_on_mirror(&on_old_copy, &moved, &mirror(), |_, _| false));
        // The new copy is recorded: straight to it.
        let copied = resolution("v2", Some(REPO));
        assert!(!stays_on_mirror(&on_old_copy, &copied, &mirror(), |_, _| true));
        // Same digest, no copy (deleted, or the namespace left the mirror): upstream.
        let same = resolution("v1", None);
        assert!(!stays_on_mirror(&on_old_copy, &same, &mirror(), |_, _| true));
        // Pinned upstream, or to another mirror: nothing to wait on.
        let upstream = resolution("v1", None);
        assert!(!stays_on_mirror(&upstream, &moved, &mirror(), |_, _| true));
        let elsewhere = resolution("v1", Some("old-cache.corp.com/m/reg.io/team/app"));
        assert!(!stays_on_mirror(&elsewhere, &moved, &mirror(), |_, _| true));
    }

    #[test]
    fn the_copier_is_waited_on_for_its_registries_until_it_gives_up() {
        let source = holdfast_registry::Reference::parse("reg.io/team/app:1").unwrap();
        let hub = holdfast_registry::Reference::parse("nginx:1.25").unwrap();
        let copying = Copying::new(vec!["Reg.io".into()]);
        assert!(copying.coming(&source, "l1"));
        assert!(!copying.coming(&hub, "l2"), "a registry not copied from");
        assert!(Copying::new(vec!["docker.io".into()]).copies_from(&hub));
        assert!(Copying::default().copies_from(&hub), "none listed: all");
        copying.give_up("l1");
        assert!(!copying.coming(&source, "l1"));
        copying.retain_given_up(|location| location != "l1");
        assert!(copying.coming(&source, "l1"), "wanted again: tried once more");
    }
}

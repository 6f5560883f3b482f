//! Re-pinning stored objects (the controller's side): what an object would hold had holdfast
//! never pinned it, and the update that takes it from what it holds to what it should hold
//! (when a `follow` pin to a mirror copy waits there: `crate::mirror_scope::stays_on_mirror`).

use json_patch::{
    PatchOperation, TestOperation,
    jsonptr::{Pointer, PointerBuf},
};
use serde_json::Value;

use crate::{ORIGINAL_REFS_ANNOTATION, OriginalRefs, PIN_KEY, PinPolicy, sites::secret_name_pointer};

/// `object` with every pin holdfast has in place put back to what the user wrote (reference,
/// `tagSelection` and a `secretRef` replaced by the mirror pull Secret), when its policy is `follow`; pinning that again follows moved tags. Other
/// policies, and pins the user replaced, are left as they are.
pub fn unpinned(object: &Value) -> Value {
    let (policy, _) = PinPolicy::from_object(object);
    if policy != PinPolicy::Follow {
        return object.clone();
    }
    originals(object)
}

/// `object` with every pin holdfast has in place put back to what the user wrote, whatever its
/// policy (`kubectl holdfast unpin`, and what `explain` compares with); pins the user replaced
/// are left as they are. The annotation stays: [`unpin`] removes it.
pub fn originals(object: &Value) -> Value {
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

/// The guarded update that undoes holdfast's pins on `stored` for good: the references recorded
/// in `holdfast.dev/original-refs` put back ([`originals`]), the annotation removed, and the
/// object opted out with the label `holdfast.dev/pin: disabled`, so that neither the webhook
/// (its objectSelector, and the rule itself) nor the controller pins it again. Empty when there
/// is nothing to undo and the object is already opted out.
pub fn unpin(stored: &Value) -> Vec<PatchOperation> {
    let mut desired = originals(stored);
    if let Some(Value::Object(metadata)) = desired.get_mut("metadata") {
        if let Some(Value::Object(annotations)) = metadata.get_mut("annotations") {
            annotations.remove(ORIGINAL_REFS_ANNOTATION);
            // The annotation form of the policy would contradict the label (a warning each write).
            annotations.remove(PIN_KEY);
        }
        let labels = metadata
            .entry("labels")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(labels) = labels {
            labels.insert(PIN_KEY.into(), PinPolicy::Disabled.as_str().into());
        }
    }
    update(stored, &desired)
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
    fn unpin_restores_every_policys_pins_removes_the_record_and_opts_out() {
        for policy in [None, Some("freeze"), Some("follow")] {
            let stored = pinned_app(policy);
            let ops = unpin(&stored);
            assert!(matches!(&ops[0], PatchOperation::Test(t) if t.value == json!("7")));
            let mut out = stored.clone();
            json_patch::patch(&mut out, &ops).unwrap();
            let bundle = &out["spec"]["fetch"][0]["imgpkgBundle"];
            assert_eq!(bundle["image"], "reg.io/team/bundle", "{policy:?}");
            assert_eq!(bundle["tagSelection"]["semver"]["constraints"], ">=1.0.0");
            assert!(
                out["metadata"]["annotations"]
                    .get(ORIGINAL_REFS_ANNOTATION)
                    .is_none()
            );
            assert_eq!(out["metadata"]["labels"][PIN_KEY], "disabled");
            // Opted out: pinning it again plans nothing, and a second unpin changes nothing.
            let (again, _) = PinPolicy::from_object(&out);
            assert_eq!(again, PinPolicy::Disabled);
            assert!(unpin(&out).is_empty());
        }
    }

    #[test]
    fn unpin_leaves_a_digest_the_user_wrote() {
        let mut replaced = pinned_app(None);
        let theirs = json!(format!("reg.io/team/bundle@sha256:{}", "b".repeat(64)));
        replaced["spec"]["fetch"][0]["imgpkgBundle"]["image"] = theirs.clone();
        let mut out = replaced.clone();
        json_patch::patch(&mut out, &unpin(&replaced)).unwrap();
        assert_eq!(out["spec"]["fetch"][0]["imgpkgBundle"]["image"], theirs);
        assert_eq!(out["metadata"]["labels"][PIN_KEY], "disabled");
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
}

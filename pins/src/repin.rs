//! Re-pinning stored objects (the controller's side): what an object would hold had holdfast
//! never pinned it, and the update that takes it from what it holds to what it should hold
//! (when a `follow` pin to a mirror copy waits there: `crate::mirror_scope::stays_on_mirror`).

use json_patch::{
    PatchOperation, TestOperation,
    jsonptr::{Pointer, PointerBuf},
};
use serde_json::Value;

use crate::{OriginalRefs, PinPolicy, sites::secret_name_pointer};

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
}

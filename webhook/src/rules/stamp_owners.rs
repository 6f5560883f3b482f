//! Stamp owners: a kpack `Image` gets an ownerReference to the app it builds for, so the garbage
//! collector deletes the Image (and with it its Builds and build pods) when the app goes.
//!
//! Korifi names the Image after the app GUID, in the app's namespace, and gives it only plain
//! ownerReferences to BuildWorkloads (Korifi's build workload reconciler); the CFApp owns none of it directly.
//!
//! `blockOwnerDeletion` is left unset on purpose: Korifi deletes CFApps in the foreground, and a
//! blocking reference would make the app wait for its Image's whole build history to go. Unset,
//! the app goes at once and the collector removes the Image in the background. It also spares
//! holdfast the `update` permission on `cfapps/finalizers` that setting it requires where
//! OwnerReferencesPermissionEnforcement is on.

use json_patch::{AddOperation, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::admission::Operation;

use crate::{
    cluster::ClusterView,
    decision::{Decision, Verdict},
    review::{Object, Request},
};

pub const NAME: &str = "stamp-owners";

pub async fn evaluate(request: &Request<'_>, cluster: &dyn ClusterView) -> Verdict {
    let (Operation::Create | Operation::Update) = request.operation else {
        return Verdict::allow();
    };
    // The metadata is all this rule reads of the Image.
    let image: Object = match super::object(request, NAME) {
        Ok(image) => image,
        Err(answer) => return answer,
    };
    // The object of a CREATE may have no namespace yet: the request's is authoritative.
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let name = image.metadata.name.as_deref().unwrap_or(&request.name);
    let owner = cluster.image_owner(namespace, name).await;
    stamp(&image.metadata, owner.as_ref()).into()
}

/// Adds `owner` to the Image's ownerReferences unless a reference to the same uid is there.
pub fn stamp(image: &ObjectMeta, owner: Option<&OwnerReference>) -> Decision {
    let Some(owner) = owner else {
        return Decision::Allow;
    };
    let existing = image.owner_references.as_deref().unwrap_or_default();
    if existing.iter().any(|r| r.uid == owner.uid) {
        return Decision::Allow;
    }
    let value = serde_json::to_value(owner).unwrap_or_default();
    let op = if image.owner_references.is_none() {
        AddOperation {
            path: PointerBuf::from_tokens(["metadata", "ownerReferences"]),
            value: vec![value].into(),
        }
    } else {
        AddOperation {
            path: PointerBuf::from_tokens(["metadata", "ownerReferences", "-"]),
            value,
        }
    };
    Decision::Patch(vec![PatchOperation::Add(op)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app_ref(uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "korifi.cloudfoundry.org/v1alpha1".into(),
            kind: "CFApp".into(),
            name: "app-guid".into(),
            uid: uid.into(),
            ..Default::default()
        }
    }

    fn image(owners: serde_json::Value) -> ObjectMeta {
        let mut v = json!({"name": "app-guid"});
        if !owners.is_null() {
            v["ownerReferences"] = owners;
        }
        serde_json::from_value(v).unwrap()
    }

    fn apply(image: &ObjectMeta, decision: &Decision) -> serde_json::Value {
        let mut doc = json!({"apiVersion": "kpack.io/v1alpha2", "kind": "Image", "metadata": image});
        if let Decision::Patch(ops) = decision {
            json_patch::patch(&mut doc, ops).unwrap();
        }
        doc
    }

    #[test]
    fn no_owner_found_leaves_the_image_alone() {
        assert_eq!(stamp(&image(json!(null)), None), Decision::Allow);
    }

    #[test]
    fn adds_the_list_when_there_is_none() {
        let img = image(json!(null));
        let out = apply(&img, &stamp(&img, Some(&app_ref("u1"))));
        assert_eq!(out["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(out["metadata"]["ownerReferences"][0]["kind"], "CFApp");
        assert!(
            out["metadata"]["ownerReferences"][0]
                .get("blockOwnerDeletion")
                .is_none()
        );
    }

    #[test]
    fn appends_next_to_korifi_buildworkload_references() {
        let bw = json!([{"apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "BuildWorkload", "name": "bw", "uid": "b1"}]);
        let img = image(bw);
        let out = apply(&img, &stamp(&img, Some(&app_ref("u1"))));
        let refs = out["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0]["uid"], "b1");
        assert_eq!(refs[1]["uid"], "u1");
    }

    #[tokio::test]
    async fn an_unreadable_image_is_admitted_unchanged_with_a_warning() {
        let body = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u", "kind": {"group": "kpack.io", "version": "v1alpha2", "kind": "Image"},
                "resource": {"group": "kpack.io", "version": "v1alpha2", "resource": "images"},
                "name": "app", "namespace": "space", "operation": "CREATE",
                "object": {"metadata": {"ownerReferences": "not a list"}},
            }
        });
        let body = body.to_string().into();
        let request = crate::review::decode(&body).unwrap();
        let cluster = crate::cluster::StaticCluster::default();
        let verdict = evaluate(&request, &cluster).await;
        assert_eq!(verdict.decision, Decision::Allow);
        assert!(
            verdict.warnings[0]
                .starts_with("holdfast stamp-owners: AdmissionReview request.object cannot be read"),
            "{verdict:?}"
        );
    }

    #[test]
    fn is_idempotent() {
        let img = image(json!(null));
        let once = apply(&img, &stamp(&img, Some(&app_ref("u1"))));
        let img: ObjectMeta = serde_json::from_value(once["metadata"].clone()).unwrap();
        assert_eq!(stamp(&img, Some(&app_ref("u1"))), Decision::Allow);
    }
}

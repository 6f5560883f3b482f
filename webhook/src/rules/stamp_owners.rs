//! Stamp owners: a kpack `Image` gets an ownerReference to the app it builds for, so the garbage
//! collector deletes the Image (and with it its Builds and build pods) when the app goes.
//!
//! Korifi names the Image after the app GUID, in the app's namespace, and gives it only plain
//! ownerReferences to BuildWorkloads (Korifi's build workload reconciler); the CFApp owns none of it directly.
//!
//! The app is found by a chain a tenant cannot hand out by naming (Korifi v0.18,
//! `kpack-image-builder/controllers/buildworkload_controller.go` `reconcileKpackImage`, and
//! `controllers/workloads/build/buildpack/controller.go` `createBuildWorkload`): the Image's
//! ownerReference to a BuildWorkload names its uid, and the BuildWorkload of that name must have
//! that uid; Korifi's build reconciler labels it `korifi.cloudfoundry.org/app-guid` with the
//! CFApp's name, which must be the Image's name; the CFApp of that name is the owner, by its uid.
//! BuildWorkloads are written by Korifi's controllers only (Korifi's CF roles grant no one else
//! `create` on them). An Image merely named like a CFApp, or pointing at a BuildWorkload of
//! another uid or another app, gets no owner.
//!
//! `blockOwnerDeletion` is left unset on purpose: Korifi deletes CFApps in the foreground, and a
//! blocking reference would make the app wait for its Image's whole build history to go. Unset,
//! the app goes at once and the collector removes the Image in the background. It also spares
//! holdfast the `update` permission on `cfapps/finalizers` that setting it requires where
//! OwnerReferencesPermissionEnforcement is on.

use json_patch::{AddOperation, PatchOperation, jsonptr::PointerBuf};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::core::admission::Operation;

use holdfast_peers::korifi;

use crate::{
    cluster::{ClusterView, Peer},
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
    let owner = app_of(&image.metadata, namespace, name, cluster).await;
    stamp(&image.metadata, owner.as_ref()).into()
}

/// The CFApp the Image `name` was built for, through its BuildWorkloads (module docs); `None`
/// when no link of the chain holds.
pub async fn app_of(
    image: &ObjectMeta,
    namespace: &str,
    name: &str,
    cluster: &dyn ClusterView,
) -> Option<OwnerReference> {
    let workloads = image
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.kind == korifi::BUILD_WORKLOAD && group_of(&r.api_version) == korifi::GROUP);
    for reference in workloads {
        let Some(workload) = cluster
            .metadata_now(Peer::BuildWorkload, namespace, &reference.name)
            .await
        else {
            continue;
        };
        let same = workload.uid.as_deref() == Some(reference.uid.as_str());
        let app = workload
            .labels
            .as_ref()
            .and_then(|l| l.get(korifi::APP_GUID_LABEL));
        if !same || app.map(String::as_str) != Some(name) {
            continue;
        }
        let app = cluster.metadata_now(Peer::CfApp, namespace, name).await?;
        return Some(OwnerReference {
            api_version: format!("{}/{}", korifi::GROUP, korifi::VERSION),
            kind: korifi::CF_APP.into(),
            name: app.name?,
            uid: app.uid?,
            ..Default::default()
        });
    }
    None
}

/// The group of an `apiVersion` (`''` for the core group).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
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

    /// The cluster of one Korifi app: the CFApp `app-guid` (uid `app-uid`) and its BuildWorkload
    /// `bw` (uid `bw-uid`), labelled with the app's GUID as Korifi's build reconciler does.
    fn korifi(app_label: &str) -> crate::cluster::StaticCluster {
        let meta = |name: &str, uid: &str, labels: serde_json::Value| -> ObjectMeta {
            serde_json::from_value(json!({"name": name, "uid": uid, "labels": labels})).unwrap()
        };
        crate::cluster::StaticCluster {
            objects: vec![
                (
                    Peer::CfApp,
                    "space".into(),
                    meta("app-guid", "app-uid", json!({})),
                ),
                (
                    Peer::BuildWorkload,
                    "space".into(),
                    meta(
                        "bw",
                        "bw-uid",
                        json!({"korifi.cloudfoundry.org/app-guid": app_label}),
                    ),
                ),
            ],
            ..Default::default()
        }
    }

    fn workload_ref(uid: &str) -> serde_json::Value {
        json!([{"apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "BuildWorkload", "name": "bw", "uid": uid}])
    }

    #[tokio::test]
    async fn the_app_is_found_through_the_image_s_build_workload_by_uid() {
        let owner = app_of(
            &image(workload_ref("bw-uid")),
            "space",
            "app-guid",
            &korifi("app-guid"),
        )
        .await;
        assert_eq!(owner, Some(app_ref("app-uid")));
    }

    /// Issue 35: ownership was handed out by name. A same-named object of another uid, or a
    /// chain that does not lead to the app, is not trusted.
    #[tokio::test]
    async fn an_image_only_named_like_an_app_or_linked_to_another_uid_gets_no_owner() {
        let cluster = korifi("app-guid");
        // Named like the CFApp, no BuildWorkload reference (what stamping by name trusted).
        assert_eq!(
            app_of(&image(json!(null)), "space", "app-guid", &cluster).await,
            None
        );
        // A BuildWorkload of that name, but not the uid the Image names (re-created, or forged).
        assert_eq!(
            app_of(&image(workload_ref("other-uid")), "space", "app-guid", &cluster).await,
            None
        );
        // The BuildWorkload is another app's.
        let cluster = korifi("another-app");
        assert_eq!(
            app_of(&image(workload_ref("bw-uid")), "space", "app-guid", &cluster).await,
            None
        );
        // The right chain in another namespace.
        assert_eq!(
            app_of(
                &image(workload_ref("bw-uid")),
                "elsewhere",
                "app-guid",
                &korifi("app-guid")
            )
            .await,
            None
        );
        // A reference of the right name and uid but another group.
        let foreign =
            json!([{"apiVersion": "example.com/v1", "kind": "BuildWorkload", "name": "bw", "uid": "bw-uid"}]);
        assert_eq!(
            app_of(&image(foreign), "space", "app-guid", &korifi("app-guid")).await,
            None
        );
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

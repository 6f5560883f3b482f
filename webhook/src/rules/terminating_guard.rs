//! Terminating guard (validating): no new kpack Build, and no new build pod, for an owner that is
//! being deleted — the loop that makes Korifi org deletion slow (Korifi's finalizers delete Builds while kpack builds again for a live Image): the
//! BuildWorkload finalizer deletes Builds, kpack sees no last Build and builds again.
//!
//! Denied:
//! - CREATE of a kpack `Build` whose Image (its controller, or label `image.kpack.io/image`), the
//!   app that Image belongs to, or the BuildWorkload it serves (label
//!   `korifi.cloudfoundry.org/build-workload-name`) is terminating. Owners are matched by uid,
//!   never by name alone: the Image by the Build's controller reference; the app and the
//!   BuildWorkload by the ownerReferences of that Image (the CFApp stamp-owners added, the
//!   BuildWorkload Korifi added, of the labelled name). A terminating object that only shares a
//!   name with one of them (another uid, or an Image that names no such owner) denies nothing;
//! - CREATE of a Pod labelled `kpack.io/build` whose Build is terminating;
//! - CREATE of a Build whose controlling Image, or of a build pod whose controlling Build, no
//!   longer exists (kpack acted on its stale cache; the object would be an orphan the garbage
//!   collector deletes);
//! - an UPDATE that changes the spec of an Image being deleted.
//!
//! Never denied: DELETE, and updates of a terminating Image that leave its spec alone (finalizer
//! removal, status, metadata), so nothing here can hold a deletion up. An owner the cache shows
//! terminating is denied at once; one it shows live (or does not know) is confirmed with the API
//! server: a deletion that started a moment ago may not have reached holdfast's watch yet while
//! kpack already acts on it. That is a few metadata reads per Build or build pod created — rare
//! objects (one of each per app build), never on the Carvel path.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::admission::Operation;

use holdfast_peers::{
    korifi::{self, BUILD_WORKLOAD_LABEL},
    kpack::{self, BUILD_POD_LABEL, IMAGE_LABEL},
};

use crate::{
    cluster::{ClusterView, Peer, Presence, is_uid},
    decision::{Decision, Verdict},
    review::{Object, Request},
};

pub const NAME: &str = "terminating-guard";

pub async fn evaluate(request: &Request<'_>, cluster: &dyn ClusterView) -> Verdict {
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let resource = (&*request.resource.group, &*request.resource.resource);
    match (resource, &request.operation) {
        ((kpack::GROUP, "builds"), Operation::Create) => {
            let build = match super::object::<Object>(request, NAME) {
                Ok(build) => build.metadata,
                Err(answer) => return answer,
            };
            // The Image that controls the Build must still exist (kpack made the Build for it)
            // and not be going.
            if let Some((image, uid)) = controller_named(&build, "Image") {
                match cluster
                    .presence_now(Peer::KpackImage, namespace, image, Some(uid))
                    .await
                {
                    Presence::Gone => return gone("kpack Build", &build, Peer::KpackImage, namespace, image),
                    Presence::Terminating => {
                        return deny("kpack Build", &build, Peer::KpackImage, namespace, image);
                    }
                    Presence::Live | Presence::Unknown => {}
                }
            }
            terminating_owner(cluster, namespace, build_owners(cluster, namespace, &build))
                .map_or_else(Verdict::allow, |(peer, owner)| {
                    deny("kpack Build", &build, peer, namespace, &owner)
                })
        }
        (("", "pods"), Operation::Create) => {
            let pod = match super::object::<Object>(request, NAME) {
                Ok(pod) => pod.metadata,
                Err(answer) => return answer,
            };
            let Some(build) = label(&pod, BUILD_POD_LABEL) else {
                return Verdict::allow();
            };
            // The Build's uid when the pod's controller reference names it.
            let uid = controller_named(&pod, "Build")
                .filter(|(name, _)| *name == build)
                .map(|(_, uid)| uid);
            match cluster
                .presence_now(Peer::KpackBuild, namespace, build, uid)
                .await
            {
                Presence::Terminating => return deny("build pod", &pod, Peer::KpackBuild, namespace, build),
                // kpack acted on a Build its cache still had; the pod would be an orphan.
                Presence::Gone if uid.is_some() => {
                    return gone("build pod", &pod, Peer::KpackBuild, namespace, build);
                }
                _ => {}
            }
            // A pod for a live Build whose Image, app or BuildWorkload is going: the Build was
            // created just before the deletion started, its pod just after.
            let owners = cluster
                .metadata(Peer::KpackBuild, namespace, build)
                .filter(|meta| is_uid(meta, uid))
                .map(|meta| build_owners(cluster, namespace, &meta))
                .unwrap_or_default();
            terminating_owner(cluster, namespace, owners).map_or_else(Verdict::allow, |(peer, owner)| {
                deny("build pod", &pod, peer, namespace, &owner)
            })
        }
        ((kpack::GROUP, "images"), Operation::Update) => {
            let image: Object<serde_json::Value> = match super::object(request, NAME) {
                Ok(image) => image,
                Err(answer) => return answer,
            };
            image_update(request, &image, namespace)
        }
        _ => Verdict::allow(),
    }
}

/// An update of a terminating Image may not change its spec; anything else about it may change.
fn image_update(request: &Request<'_>, image: &Object<serde_json::Value>, namespace: &str) -> Verdict {
    // An old object that does not read is no evidence of a deletion.
    match request.old_object::<Object<serde_json::Value>>().ok().flatten() {
            Some(old) if old.metadata.deletion_timestamp.is_some() && old.spec != image.spec => {
                Decision::Deny(format!(
                    "kpack Image {namespace}/{} is being deleted: its spec cannot change (holdfast terminating guard)",
                    request.name
                ))
                .into()
            }
            _ => Verdict::allow(),
    }
}

/// The first of `owners` that holdfast's watches show being deleted: the object of that name
/// and, when a reference gave one, that uid. These are owners kpack does not act on (an app, a
/// BuildWorkload, a Build's Image seen from its pod): their deletion runs alongside, so a read
/// from the API server would only narrow a window of holdfast's watch lag, at a round trip per
/// admission.
fn terminating_owner(
    cluster: &dyn ClusterView,
    namespace: &str,
    owners: Vec<Owner>,
) -> Option<(Peer, String)> {
    owners
        .into_iter()
        .find(|o| {
            cluster
                .metadata(o.peer, namespace, &o.name)
                .filter(|meta| is_uid(meta, o.uid.as_deref()))
                .map_or_else(
                    // Not in memory (only the static view knows deletions without metadata):
                    // by name, only when no uid was given.
                    || o.uid.is_none() && cluster.terminating(o.peer, namespace, &o.name) == Some(true),
                    |meta| meta.deletion_timestamp.is_some(),
                )
        })
        .map(|o| (o.peer, o.name))
}

/// An owner to check: its kind, name and, from a reference, uid.
struct Owner {
    peer: Peer,
    name: String,
    uid: Option<String>,
}

/// The name and uid of the object's controller of `kind`.
fn controller_named<'a>(meta: &'a ObjectMeta, kind: &str) -> Option<(&'a str, &'a str)> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == kind)
        .map(|r| (r.name.as_str(), r.uid.as_str()))
}

/// The objects a Build is made for, in the order they are checked: its Image (by the controller
/// reference's uid, else the label's name), then what that Image's ownerReferences name by uid —
/// its CFApps, and the BuildWorkload the Build's label names.
fn build_owners(cluster: &dyn ClusterView, namespace: &str, build: &ObjectMeta) -> Vec<Owner> {
    let labels = build.labels.as_ref();
    let image = controller_named(build, "Image")
        .map(|(name, uid)| (name.to_owned(), Some(uid.to_owned())))
        .or_else(|| {
            labels
                .and_then(|l| l.get(IMAGE_LABEL))
                .map(|name| (name.clone(), None))
        });
    let Some((image, image_uid)) = image else {
        return Vec::new();
    };
    let mut owners = vec![Owner {
        peer: Peer::KpackImage,
        name: image.clone(),
        uid: image_uid.clone(),
    }];
    let Some(image) = cluster
        .metadata(Peer::KpackImage, namespace, &image)
        .filter(|meta| is_uid(meta, image_uid.as_deref()))
    else {
        return owners;
    };
    let workload = labels.and_then(|l| l.get(BUILD_WORKLOAD_LABEL));
    for reference in image.owner_references.iter().flatten() {
        if !reference.api_version.starts_with(&format!("{}/", korifi::GROUP)) {
            continue;
        }
        let peer = match reference.kind.as_str() {
            korifi::CF_APP => Peer::CfApp,
            korifi::BUILD_WORKLOAD if workload == Some(&reference.name) => Peer::BuildWorkload,
            _ => continue,
        };
        owners.push(Owner {
            peer,
            name: reference.name.clone(),
            uid: Some(reference.uid.clone()),
        });
    }
    owners
}

fn label<'a>(object: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    object.labels.as_ref()?.get(key).map(String::as_str)
}

fn gone(what: &str, object: &ObjectMeta, peer: Peer, namespace: &str, owner: &str) -> Verdict {
    Decision::Deny(format!(
        "{what} {namespace}/{} not created: its {} {namespace}/{owner} no longer exists (holdfast terminating guard)",
        name_of(object),
        kind_name(peer)
    ))
    .into()
}

fn name_of(object: &ObjectMeta) -> &str {
    object
        .name
        .as_deref()
        .or(object.generate_name.as_deref())
        .unwrap_or("")
}

fn kind_name(peer: Peer) -> &'static str {
    match peer {
        Peer::CfApp => "CFApp",
        Peer::BuildWorkload => "BuildWorkload",
        Peer::KpackImage => "kpack Image",
        Peer::KpackBuild => "kpack Build",
    }
}

fn deny(what: &str, object: &ObjectMeta, peer: Peer, namespace: &str, owner: &str) -> Verdict {
    Decision::Deny(format!(
        "{what} {namespace}/{} not created: its {} {namespace}/{owner} is being deleted (holdfast terminating guard)",
        name_of(object),
        kind_name(peer)
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::StaticCluster;
    use serde_json::json;

    fn request(
        group: &str,
        resource: &str,
        operation: &str,
        object: serde_json::Value,
        old: serde_json::Value,
    ) -> Request<'static> {
        let body = json!({
            "uid": "u", "kind": {"group": group, "version": "v1", "kind": "X"},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "name": "n", "namespace": "space", "operation": operation,
            "userInfo": {}, "object": object, "oldObject": old, "dryRun": false,
        })
        .to_string();
        // Leaked: the request borrows its body, and a test's requests live as long as the test.
        serde_json::from_str(Box::leak(body.into_boxed_str())).unwrap()
    }

    fn build() -> serde_json::Value {
        json!({"apiVersion": "kpack.io/v1alpha2", "kind": "Build", "metadata": {
            "name": "app-build-2", "namespace": "space",
            "labels": {"image.kpack.io/image": "app", "korifi.cloudfoundry.org/build-workload-name": "bw-2"},
            "ownerReferences": [{"apiVersion": "kpack.io/v1alpha2", "kind": "Image", "name": "app", "uid": "i", "controller": true}]}})
    }

    fn cluster(terminating: &[(Peer, &str)]) -> StaticCluster {
        StaticCluster {
            terminating: terminating
                .iter()
                .map(|(p, n)| (*p, "space".into(), n.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn meta(value: serde_json::Value) -> ObjectMeta {
        serde_json::from_value(value).unwrap()
    }

    /// The Korifi chain of [`build`]: its Image `app` (uid `i`), which names the CFApp `app`
    /// (uid `a`, stamp-owners' reference) and the BuildWorkload `bw-2` (uid `w`, Korifi's), each
    /// with the uid given here; `terminating` of them is being deleted.
    fn chain(app_uid: &str, workload_uid: &str, terminating: Option<Peer>) -> StaticCluster {
        let deleting = |peer| {
            if terminating == Some(peer) {
                json!("2026-12-03T00:00:00Z")
            } else {
                json!(null)
            }
        };
        let image = meta(
            json!({"name": "app", "uid": "i", "deletionTimestamp": deleting(Peer::KpackImage), "ownerReferences": [
            {"apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "BuildWorkload", "name": "bw-2", "uid": "w"},
            {"apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "CFApp", "name": "app", "uid": "a"}]}),
        );
        StaticCluster {
            objects: vec![
                (Peer::KpackImage, "space".into(), image),
                (
                    Peer::CfApp,
                    "space".into(),
                    meta(json!({"name": "app", "uid": app_uid, "deletionTimestamp": deleting(Peer::CfApp)})),
                ),
                (
                    Peer::BuildWorkload,
                    "space".into(),
                    meta(
                        json!({"name": "bw-2", "uid": workload_uid, "deletionTimestamp": deleting(Peer::BuildWorkload)}),
                    ),
                ),
            ],
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_build_for_a_terminating_image_app_or_workload_is_denied() {
        for (peer, name, kind) in [
            (Peer::KpackImage, "app", "kpack Image"),
            (Peer::CfApp, "app", "CFApp"),
            (Peer::BuildWorkload, "bw-2", "BuildWorkload"),
        ] {
            let verdict = evaluate(
                &request("kpack.io", "builds", "CREATE", build(), json!(null)),
                &chain("a", "w", Some(peer)),
            )
            .await;
            let Decision::Deny(message) = verdict.decision else {
                panic!("{kind}: not denied")
            };
            assert!(
                message.contains(&format!("its {kind} space/{name} is being deleted")),
                "{message}"
            );
        }
    }

    /// Issue 35: the guard matched the app by the Image's name and the BuildWorkload by the
    /// Build's label. A terminating object that only shares a name with an owner (another uid,
    /// or one the Image does not name) denies nothing.
    #[tokio::test]
    async fn a_terminating_object_that_only_shares_an_owner_s_name_denies_nothing() {
        let create = || request("kpack.io", "builds", "CREATE", build(), json!(null));
        // A CFApp `app` and a BuildWorkload `bw-2` being deleted, of other uids than the Image's
        // references name.
        for peer in [Peer::CfApp, Peer::BuildWorkload] {
            let cluster = chain("another-app", "another-workload", Some(peer));
            assert_eq!(evaluate(&create(), &cluster).await, Verdict::allow(), "{peer:?}");
        }
        // A CFApp named like an Image that names no CFApp (stamping by name trusted it).
        let mut cluster = chain("a", "w", Some(Peer::CfApp));
        cluster.objects[0].2.owner_references = None;
        assert_eq!(evaluate(&create(), &cluster).await, Verdict::allow());
        // An Image `app` being deleted that is not the Build's (another uid): the Build's own
        // Image is not in memory; the API server says it is gone, or memory cannot tell.
        let mut cluster = chain("a", "w", Some(Peer::KpackImage));
        cluster.objects[0].2.uid = Some("another-image".into());
        assert_eq!(evaluate(&create(), &cluster).await, Verdict::allow());
        cluster
            .gone
            .push((Peer::KpackImage, "space".into(), "app".into()));
        let verdict = evaluate(&create(), &cluster).await;
        assert!(
            matches!(verdict.decision, Decision::Deny(ref m) if m.contains("kpack Image space/app no longer exists")),
            "{verdict:?}"
        );
    }

    #[tokio::test]
    async fn a_build_for_live_owners_is_allowed() {
        assert_eq!(
            evaluate(
                &request("kpack.io", "builds", "CREATE", build(), json!(null)),
                &chain("a", "w", None)
            )
            .await,
            Verdict::allow()
        );
        let verdict = evaluate(
            &request("kpack.io", "builds", "CREATE", build(), json!(null)),
            &cluster(&[(Peer::CfApp, "other")]),
        )
        .await;
        assert_eq!(verdict, Verdict::allow());
    }

    #[tokio::test]
    async fn a_build_pod_of_a_terminating_build_is_denied() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app-build-2-build-pod", "labels": {"kpack.io/build": "app-build-2"}}});
        let verdict = evaluate(
            &request("", "pods", "CREATE", pod.clone(), json!(null)),
            &cluster(&[(Peer::KpackBuild, "app-build-2")]),
        )
        .await;
        assert!(
            matches!(verdict.decision, Decision::Deny(ref m) if m.contains("build pod")),
            "{verdict:?}"
        );
        assert_eq!(
            evaluate(&request("", "pods", "CREATE", pod, json!(null)), &cluster(&[])).await,
            Verdict::allow()
        );
    }

    #[tokio::test]
    async fn the_api_server_is_asked_when_the_cache_has_not_seen_the_deletion_yet() {
        let lagging = |peer, name: &str| StaticCluster {
            terminating_live: vec![(peer, "space".into(), name.to_string())],
            ..Default::default()
        };
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app-build-2-build-pod", "labels": {"kpack.io/build": "app-build-2"}}});
        let verdict = evaluate(
            &request("", "pods", "CREATE", pod, json!(null)),
            &lagging(Peer::KpackBuild, "app-build-2"),
        )
        .await;
        assert!(
            matches!(verdict.decision, Decision::Deny(ref m) if m.contains("kpack Build space/app-build-2")),
            "{verdict:?}"
        );
        let verdict = evaluate(
            &request("kpack.io", "builds", "CREATE", build(), json!(null)),
            &lagging(Peer::KpackImage, "app"),
        )
        .await;
        assert!(
            matches!(verdict.decision, Decision::Deny(ref m) if m.contains("kpack Image space/app")),
            "{verdict:?}"
        );
    }

    /// The trade-off of `ClusterView::presence_now`: an owner the watch shows live is not read
    /// again from the API server, so a deletion only the API server has (the watch a few
    /// milliseconds behind) lets this one Build through; the next is refused from memory.
    #[tokio::test]
    async fn an_owner_the_watch_shows_live_is_answered_from_memory() {
        let meta = ObjectMeta {
            name: Some("app".into()),
            uid: Some("i".into()),
            ..Default::default()
        };
        let mut cluster = StaticCluster {
            objects: vec![(Peer::KpackImage, "space".into(), meta)],
            terminating_live: vec![(Peer::KpackImage, "space".into(), "app".into())],
            ..Default::default()
        };
        let create = || request("kpack.io", "builds", "CREATE", build(), json!(null));
        assert_eq!(evaluate(&create(), &cluster).await, Verdict::allow());
        cluster
            .terminating
            .push((Peer::KpackImage, "space".into(), "app".into()));
        let verdict = evaluate(&create(), &cluster).await;
        assert!(
            matches!(verdict.decision, Decision::Deny(ref m) if m.contains("kpack Image space/app")),
            "{verdict:?}"
        );
    }

    #[tokio::test]
    async fn a_pod_or_build_for_an_owner_that_is_gone_is_denied_only_when_it_is_their_controller() {
        let gone = |peer, name: &str| StaticCluster {
            gone: vec![(peer, "space".into(), name.to_string())],
            ..Default::default()
        };
        let owned = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app-build-2-build-pod",
            "labels": {"kpack.io/build": "app-build-2"},
            "ownerReferences": [{"apiVersion": "kpack.io/v1alpha2", "kind": "Build", "name": "app-build-2", "uid": "b", "controller": true}]}});
        let verdict = evaluate(
            &request("", "pods", "CREATE", owned, json!(null)),
            &gone(Peer::KpackBuild, "app-build-2"),
        )
        .await;
        assert!(
            matches!(verdict.decision, Decision::Deny(ref m) if m.contains("kpack Build space/app-build-2 no longer exists")),
            "{verdict:?}"
        );
        // Only labelled, not owned: not holdfast's to judge.
        let labelled = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"kpack.io/build": "app-build-2"}}});
        let verdict = evaluate(
            &request("", "pods", "CREATE", labelled, json!(null)),
            &gone(Peer::KpackBuild, "app-build-2"),
        )
        .await;
        assert_eq!(verdict, Verdict::allow());
        let verdict = evaluate(
            &request("kpack.io", "builds", "CREATE", build(), json!(null)),
            &gone(Peer::KpackImage, "app"),
        )
        .await;
        assert!(
            matches!(verdict.decision, Decision::Deny(ref m) if m.contains("kpack Image space/app no longer exists")),
            "{verdict:?}"
        );
        // A CFApp that does not exist (an Image that is not Korifi's) denies nothing.
        let verdict = evaluate(
            &request("kpack.io", "builds", "CREATE", build(), json!(null)),
            &gone(Peer::CfApp, "app"),
        )
        .await;
        assert_eq!(verdict, Verdict::allow());
    }

    #[tokio::test]
    async fn a_terminating_image_may_lose_finalizers_but_not_change_spec() {
        let old = json!({"apiVersion": "kpack.io/v1alpha2", "kind": "Image", "metadata": {"name": "app", "deletionTimestamp": "2026-11-30T00:00:00Z", "finalizers": ["x"]}, "spec": {"tag": "a"}});
        let mut finalizer_removed = old.clone();
        finalizer_removed["metadata"]["finalizers"] = json!([]);
        assert_eq!(
            evaluate(
                &request("kpack.io", "images", "UPDATE", finalizer_removed, old.clone()),
                &cluster(&[])
            )
            .await,
            Verdict::allow()
        );
        let mut spec_changed = old.clone();
        spec_changed["spec"]["tag"] = json!("b");
        let verdict = evaluate(
            &request("kpack.io", "images", "UPDATE", spec_changed, old),
            &cluster(&[]),
        )
        .await;
        assert!(matches!(verdict.decision, Decision::Deny(_)));
    }

    #[tokio::test]
    async fn deletes_are_never_denied() {
        let verdict = evaluate(
            &request("kpack.io", "builds", "DELETE", json!(null), build()),
            &cluster(&[(Peer::KpackImage, "app")]),
        )
        .await;
        assert_eq!(verdict, Verdict::allow());
    }
}

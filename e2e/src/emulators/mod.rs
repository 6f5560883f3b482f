//! EMULATORS of peer behaviour — test fixtures, NOT the peers and not part of holdfast.
//!
//! (kapp-controller's emulator is gone: `make bench-pinning` and every suite run the real one.)
//!
//! kpack and Korifi cannot run on the local control plane (no container runtime, no kubelet:
//! Pods are stored, never run), so the e2e suites run in-process emulations of exactly the parts
//! of them that decide how an org/app deletion unfolds: which objects they create, with which
//! names, labels, owner references and finalizers, on which events they reconcile, and which
//! requeue intervals and retry backoffs they use. The kind suite runs the real peers.
//!
//! Every behaviour is traced to the research notes in `/work/shared/reference/korifi-kpack.md`,
//! cited as "ref §N" in comments. Where these emulations simplify (no registry, no
//! SourceResolver, builds never finish because pods never run), the module docs of
//! [`kpack`] and [`korifi`] say so.
//!
//! Emulators are started by a test as tasks of its runtime and stopped with a
//! [`CancellationToken`](tokio_util::sync::CancellationToken). Several tests of one binary share
//! one API server and may run in parallel, so an emulator only acts in the namespaces of its
//! [`Scope`]; the Korifi emulator stamps its scope label on the org and space namespaces it
//! creates, the way a real cluster would have exactly one Korifi and one kpack.

pub mod korifi;
pub mod kpack;
pub mod runtime;
pub mod scenario;

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, Patch, PatchParams},
};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Which namespaces an emulator instance acts in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace, like the real controllers (only when nothing else runs on the cluster).
    Cluster,
    /// Namespaces carrying this label; the Korifi emulator copies it onto the namespaces it creates.
    Labelled { key: String, value: String },
}

impl Scope {
    /// The scope of a test's namespaces: [`crate::webhook::SCOPE_LABEL`]`=<value>`, the label a
    /// [`crate::webhook::LocalWebhook`]'s namespaceSelector matches, so a webhook and emulators of
    /// one test serve the same namespaces (including the org/space namespaces Korifi creates).
    pub fn e2e(value: &str) -> Self {
        Self::Labelled {
            key: crate::webhook::SCOPE_LABEL.to_string(),
            value: value.to_string(),
        }
    }

    /// A fresh [`Scope::e2e`] with a unique value.
    pub fn unique() -> Self {
        Self::e2e(&crate::control_plane::unique_name("emu"))
    }

    /// The label to put on a namespace so that it is in this scope.
    pub fn label(&self) -> Option<(&str, &str)> {
        match self {
            Self::Cluster => None,
            Self::Labelled { key, value } => Some((key, value)),
        }
    }
}

/// The API resources the emulators touch.
pub mod resources {
    use kube::api::{ApiResource, GroupVersionKind};

    fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    pub fn image() -> ApiResource {
        resource("kpack.io", "v1alpha2", "Image", "images")
    }
    pub fn build() -> ApiResource {
        resource("kpack.io", "v1alpha2", "Build", "builds")
    }
    pub fn pod() -> ApiResource {
        resource("", "v1", "Pod", "pods")
    }
    pub fn namespace() -> ApiResource {
        resource("", "v1", "Namespace", "namespaces")
    }
    pub fn cf_org() -> ApiResource {
        resource("korifi.cloudfoundry.org", "v1alpha1", "CFOrg", "cforgs")
    }
    pub fn cf_space() -> ApiResource {
        resource("korifi.cloudfoundry.org", "v1alpha1", "CFSpace", "cfspaces")
    }
    pub fn cf_app() -> ApiResource {
        resource("korifi.cloudfoundry.org", "v1alpha1", "CFApp", "cfapps")
    }
    pub fn cf_build() -> ApiResource {
        resource("korifi.cloudfoundry.org", "v1alpha1", "CFBuild", "cfbuilds")
    }
    pub fn build_workload() -> ApiResource {
        resource(
            "korifi.cloudfoundry.org",
            "v1alpha1",
            "BuildWorkload",
            "buildworkloads",
        )
    }
    /// What a Korifi app is made of, top down: CFApp, CFBuild, BuildWorkload, kpack Image,
    /// Build, build pod.
    pub fn app_chain() -> [ApiResource; 6] {
        [cf_app(), cf_build(), build_workload(), image(), build(), pod()]
    }
}

/// The tasks of a started emulator; dropping it cancels them.
pub(crate) struct Tasks {
    cancel: CancellationToken,
    set: JoinSet<()>,
}

impl Tasks {
    fn new(parent: &CancellationToken) -> Self {
        Self {
            cancel: parent.child_token(),
            set: JoinSet::new(),
        }
    }

    async fn stop(&mut self) {
        self.cancel.cancel();
        while self.set.join_next().await.is_some() {}
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A CF-style GUID (random, version-4 layout), as Korifi's API names orgs, spaces, apps, builds.
pub fn guid() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let hex = hex::encode(Sha256::digest(format!("{nanos}-{}-{n}", std::process::id())));
    format!(
        "{}-{}-4{}-a{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// knative `kmeta.ChildName`, which kpack uses for Build and build-pod names (ref §2.2): the
/// parent name plus the suffix, the parent shortened with a hash when the result would exceed
/// 63 characters (kpack hashes with md5; sha256 cut to 32 hex digits here).
pub fn child_name(parent: &str, suffix: &str) -> String {
    const LONGEST: usize = 63;
    const HASH_LEN: usize = 32;
    if parent.len() + suffix.len() <= LONGEST {
        return format!("{parent}{suffix}");
    }
    let hash = &hex::encode(Sha256::digest(parent.as_bytes()))[..HASH_LEN];
    let head = LONGEST.saturating_sub(suffix.len() + HASH_LEN).min(parent.len());
    format!("{}{hash}{suffix}", &parent[..head])
}

pub(crate) fn labels(object: &DynamicObject) -> BTreeMap<String, String> {
    object.metadata.labels.clone().unwrap_or_default()
}

pub(crate) fn label<'a>(object: &'a DynamicObject, key: &str) -> Option<&'a str> {
    object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

/// Equality-based label selector semantics: every key present with exactly that value.
pub(crate) fn has_labels(object: &DynamicObject, wanted: &[(&str, &str)]) -> bool {
    wanted.iter().all(|(k, v)| label(object, k) == Some(v))
}

pub(crate) fn selector(wanted: &[(&str, &str)]) -> String {
    wanted
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn is_terminating(object: &DynamicObject) -> bool {
    object.metadata.deletion_timestamp.is_some()
}

pub(crate) fn has_finalizer(object: &DynamicObject, finalizer: &str) -> bool {
    object
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|x| x == finalizer))
}

pub(crate) fn controller_of(object: &DynamicObject) -> Option<&OwnerReference> {
    object
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
}

/// An ownerReference to `owner`: `controller` gives `controller: true, blockOwnerDeletion: true`
/// (`SetControllerReference`, `kmeta.NewControllerRef`), otherwise a plain, non-blocking
/// reference (`SetOwnerReference`).
pub(crate) fn owner_reference(
    owner: &DynamicObject,
    resource: &ApiResource,
    controller: bool,
) -> OwnerReference {
    OwnerReference {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
        name: owner.metadata.name.clone().unwrap_or_default(),
        uid: owner.metadata.uid.clone().unwrap_or_default(),
        controller: controller.then_some(true),
        block_owner_deletion: controller.then_some(true),
    }
}

/// The `status` of a condition of `type_` in `status.conditions`.
pub(crate) fn condition_status<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a str> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?["status"]
        .as_str()
}

/// RFC 7386 merge patch turning `old` into `new` (what controller-runtime's `MergeFrom` sends):
/// changed and added keys, `null` for removed keys; arrays are replaced whole.
pub(crate) fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let mut patch = serde_json::Map::new();
            for (key, old_value) in old {
                match new.get(key) {
                    None => {
                        patch.insert(key.clone(), Value::Null);
                    }
                    Some(new_value) if new_value != old_value => {
                        patch.insert(key.clone(), merge_patch(old_value, new_value));
                    }
                    Some(_) => {}
                }
            }
            for (key, new_value) in new {
                if !old.contains_key(key) {
                    patch.insert(key.clone(), new_value.clone());
                }
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// Writes `finalizers` with an optimistic lock on the cached resourceVersion (a conflict is an
/// error the caller's work queue retries, as a controller's would).
pub(crate) async fn set_finalizers(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    finalizers: Vec<String>,
) -> kube::Result<DynamicObject> {
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": object.metadata.resource_version,
    }});
    api.patch(
        object.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
}

pub(crate) async fn add_finalizer(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    finalizer: &str,
) -> kube::Result<()> {
    if has_finalizer(object, finalizer) {
        return Ok(());
    }
    let mut finalizers = object.metadata.finalizers.clone().unwrap_or_default();
    finalizers.push(finalizer.to_string());
    set_finalizers(api, object, finalizers).await.map(drop)
}

/// Removes only `finalizer`, never another party's.
pub(crate) async fn remove_finalizer(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
    finalizer: &str,
) -> kube::Result<()> {
    if !has_finalizer(object, finalizer) {
        return Ok(());
    }
    let finalizers = object
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    match set_finalizers(api, object, finalizers).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(drop),
    }
}

/// The HTTP status of an API error response, if the API server answered.
pub(crate) fn api_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

pub(crate) fn namespaced(client: &Client, resource: &ApiResource, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, resource)
}

/// `metav1.Now()` as JSON.
pub(crate) fn now() -> Value {
    serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now())).unwrap_or(Value::Null)
}

/// Milliseconds since `metadata.deletionTimestamp` (0 when not terminating).
pub(crate) fn millis_since_deletion(object: &DynamicObject) -> i64 {
    object.metadata.deletion_timestamp.as_ref().map_or(0, |t| {
        k8s_openapi::jiff::Timestamp::now().as_millisecond() - t.0.as_millisecond()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_names_stay_within_63_characters() {
        assert_eq!(child_name("app", "-build-1"), "app-build-1");
        let long = "a".repeat(70);
        let name = child_name(&long, "-build-pod");
        assert_eq!(name.len(), 63);
        assert!(name.ends_with("-build-pod"));
    }

    #[test]
    fn merge_patch_nulls_removed_keys_and_replaces_arrays() {
        let old = json!({"labels": {"a": "1", "b": "2"}, "refs": [1, 2], "same": {"x": 1}});
        let new = json!({"labels": {"c": "3"}, "refs": [1], "same": {"x": 1}});
        assert_eq!(
            merge_patch(&old, &new),
            json!({"labels": {"a": null, "b": null, "c": "3"}, "refs": [1]})
        );
    }

    #[test]
    fn guids_look_like_guids() {
        let (a, b) = (guid(), guid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(a.split('-').map(str::len).collect::<Vec<_>>(), [8, 4, 4, 4, 12]);
    }
}

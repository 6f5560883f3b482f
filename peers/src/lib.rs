//! The vocabulary of the peers holdfast works beside — kapp-controller, kpack and Korifi: their
//! API groups, versions, kinds and labels, spelled once for the webhook, the controller and the
//! manifest checks, and the discovery that tells which of them a cluster serves ([`served`]).

mod served;

pub use served::{LOOK_AGAIN_EVERY, Served, installed, served};

use futures::Stream;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ObjectMeta, PartialObjectMeta},
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, store::Writer},
        watcher,
    },
};

/// kapp-controller's kinds holdfast pins (`holdfast_pins::PinnedKind` names them).
pub mod kapp_controller {
    /// `App`.
    pub const APP_GROUP: &str = "kappctrl.k14s.io";
    /// `PackageRepository`, `PackageInstall`.
    pub const PACKAGING_GROUP: &str = "packaging.carvel.dev";
    /// `Package`, served by kapp-controller's aggregated API server.
    pub const DATA_PACKAGING_GROUP: &str = "data.packaging.carvel.dev";
    pub const VERSION: &str = "v1alpha1";
}

/// kpack: the Images Korifi creates per app, their Builds and build pods.
pub mod kpack {
    use kube::api::GroupVersionKind;

    pub const GROUP: &str = "kpack.io";
    pub const VERSION: &str = "v1alpha2";
    pub const IMAGE: &str = "Image";
    pub const BUILD: &str = "Build";
    /// The label kpack puts on a Build's pods, naming the Build.
    pub const BUILD_POD_LABEL: &str = "kpack.io/build";
    /// The label kpack puts on an Image's Builds, naming the Image.
    pub const IMAGE_LABEL: &str = "image.kpack.io/image";

    pub fn image() -> GroupVersionKind {
        GroupVersionKind::gvk(GROUP, VERSION, IMAGE)
    }

    pub fn build() -> GroupVersionKind {
        GroupVersionKind::gvk(GROUP, VERSION, BUILD)
    }
}

/// Korifi: apps, their build workloads, spaces.
pub mod korifi {
    use kube::api::GroupVersionKind;

    pub const GROUP: &str = "korifi.cloudfoundry.org";
    pub const VERSION: &str = "v1alpha1";
    pub const CF_APP: &str = "CFApp";
    pub const BUILD_WORKLOAD: &str = "BuildWorkload";
    pub const CF_SPACE: &str = "CFSpace";
    pub const CF_BUILD: &str = "CFBuild";
    pub const CF_PROCESS: &str = "CFProcess";
    pub const CF_PACKAGE: &str = "CFPackage";
    pub const APP_WORKLOAD: &str = "AppWorkload";
    /// The label Korifi puts on an app's objects (BuildWorkloads among them), naming its GUID.
    pub const APP_GUID_LABEL: &str = "korifi.cloudfoundry.org/app-guid";
    /// The label Korifi puts on a BuildWorkload's kpack Build, naming the BuildWorkload.
    pub const BUILD_WORKLOAD_LABEL: &str = "korifi.cloudfoundry.org/build-workload-name";

    pub fn cf_app() -> GroupVersionKind {
        GroupVersionKind::gvk(GROUP, VERSION, CF_APP)
    }

    pub fn build_workload() -> GroupVersionKind {
        GroupVersionKind::gvk(GROUP, VERSION, BUILD_WORKLOAD)
    }

    pub fn cf_space() -> GroupVersionKind {
        GroupVersionKind::gvk(GROUP, VERSION, CF_SPACE)
    }

    /// A Korifi kind of this group and version.
    pub fn kind(kind: &str) -> GroupVersionKind {
        GroupVersionKind::gvk(GROUP, VERSION, kind)
    }
}

/// kubectl's copy of an object as last applied client-side (`kubectl apply`, Argo CD's default
/// sync): about as big as the object itself.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from an object's metadata what no part of holdfast reads and what grows with the way
/// the object is written, before a watch keeps it: `managedFields` (every field manager's field
/// set) and kubectl's last-applied copy. An annotations map left empty stays: a pin patch then
/// adds its annotation into it, where a missing map would be added whole.
pub fn slim_metadata(metadata: &mut ObjectMeta) {
    metadata.managed_fields = None;
    if let Some(annotations) = &mut metadata.annotations {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// An object's metadata as a metadata watch keeps it.
pub type Meta = PartialObjectMeta<DynamicObject>;

/// The metadata of every object of `resource`, kept by a watch that makes metadata-only
/// list/watch requests: its store, and the watch's events (kube's default backoff after an
/// error), which must be polled for the store to fill. Each object as [`slim_metadata`] leaves it.
pub fn metadata_reflector(
    client: Client,
    resource: &ApiResource,
) -> (
    Store<Meta>,
    impl Stream<Item = Result<watcher::Event<Meta>, watcher::Error>> + Send + 'static,
) {
    let api: Api<Meta> = Api::all_with(client, resource);
    let writer = Writer::new(resource.clone());
    let store = writer.as_reader();
    let events = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(|meta| slim_metadata(&mut meta.metadata)),
    )
    .default_backoff();
    (store, events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slim_metadata_drops_managed_fields_and_the_last_applied_copy_only() {
        let mut metadata: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "app",
            "labels": {"team": "a"},
            "annotations": {LAST_APPLIED_ANNOTATION: "{\"spec\":{}}", "holdfast.dev/original-refs": "{}"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}],
        }))
        .expect("metadata");
        slim_metadata(&mut metadata);
        assert_eq!(metadata.managed_fields, None);
        let annotations = metadata.annotations.expect("the map stays");
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["holdfast.dev/original-refs"]
        );
        assert_eq!(metadata.labels.map(|l| l.len()), Some(1));

        let mut only_kubectl: ObjectMeta = serde_json::from_value(serde_json::json!({
            "name": "app", "annotations": {LAST_APPLIED_ANNOTATION: "{}"},
        }))
        .expect("metadata");
        slim_metadata(&mut only_kubectl);
        assert_eq!(only_kubectl.annotations.map(|a| a.len()), Some(0));
    }
}

//! Which mirror copies the pinned objects reference: what the mirror copies and what its
//! retention keeps (`crate::mirror`, `crate::retention`).
//!
//! An object references a copy when one of its fetch references (App and Package
//! `spec.fetch[]`, PackageRepository `spec.fetch`: `image.url`, `imgpkgBundle.image`) names it
//! (`<mirror>/<prefix>/…@sha256:…`, a pin to the mirror), or names the same digest in the
//! upstream repository the copy is made from (a pin admitted before the copy completed, or a
//! `freeze` pin, which stays upstream). The fields are what kapp-controller fetches;
//! `holdfast.dev/original-refs` only repeats them while its pins are in place. Tags are not
//! references: a tag admitted unpinned references its content once it is pinned. Objects
//! being deleted still count (kapp-controller may still fetch for them), as do objects in
//! namespaces holdfast otherwise leaves alone.
//!
//! The mirror's scope (`holdfast_pins::mirror_scope`): in a namespace the mirror does not
//! select (`--mirror-namespace-selector`) only pins to the mirror count, since nothing there is
//! pinned to a copy; a site with a `secretRef` pinned upstream references its namespace's
//! private copy (with `--mirror-pull-secret`) as well as the public one.

use std::{
    collections::{HashMap, HashSet},
    fmt::Debug,
    hash::{DefaultHasher, Hash, Hasher},
};

use futures::StreamExt;
use holdfast_pins::{MirrorPins, PinnedKind, fetch_sites};
use holdfast_registry::{Reference, cache::Scope};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams, PartialObjectMeta},
    runtime::{WatchStreamExt, reflector, reflector::ObjectRef, watcher},
};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Adds the mirror copies `object`'s fetch references name to `into` (see the module docs);
/// `selected`: whether the mirror selects the object's namespace.
pub fn referenced_by(
    kind: PinnedKind,
    object: &Value,
    mirror: &MirrorPins,
    selected: bool,
    into: &mut HashSet<String>,
) {
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    for site in fetch_sites(kind, object) {
        let Ok(reference) = Reference::parse(&site.reference) else {
            continue;
        };
        let Some(digest) = reference.digest() else {
            continue;
        };
        if mirror.location.contains(&reference) {
            into.insert(format!("{}@{digest}", reference.name()));
            continue;
        }
        if !selected {
            continue;
        }
        let private = site.secret_ref.map(|name| Scope::Secret {
            namespace: namespace.to_owned(),
            name,
        });
        for scope in [Some(Scope::Anonymous), private].into_iter().flatten() {
            if let Some(Ok(location)) = mirror
                .location_for(&scope)
                .map(|location| location.pinned_for(&reference, digest))
            {
                into.insert(location);
            }
        }
    }
}

type NamespaceStore = reflector::Store<PartialObjectMeta<DynamicObject>>;

/// The pinned objects, followed through a reflector per installed kind, and the namespaces'
/// labels (metadata only) when the mirror selects namespaces.
pub struct References {
    client: Client,
    mirror: MirrorPins,
    stores: Vec<(PinnedKind, ApiResource, reflector::Store<DynamicObject>)>,
    namespaces: Option<(ApiResource, NamespaceStore)>,
    changes: watch::Receiver<u64>,
}

impl References {
    /// Follows every kind of `kinds` (and the namespaces, when `mirror` selects some) until
    /// `cancel`.
    pub fn follow(
        client: Client,
        mirror: MirrorPins,
        kinds: Vec<(PinnedKind, ApiResource)>,
        cancel: CancellationToken,
    ) -> Self {
        let (changed, changes) = watch::channel(0u64);
        let namespaces = (!mirror.namespaces.selects_all()).then(|| {
            let resource = ApiResource::erase::<Namespace>(&());
            // An Api of PartialObjectMeta makes metadata-only list/watch requests.
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &resource);
            let store = reflect(api, &resource, labels_fingerprint, &changed, &cancel);
            (resource, store)
        });
        let stores = kinds
            .into_iter()
            .map(|(kind, resource)| {
                let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
                let store = reflect(api, &resource, spec_fingerprint, &changed, &cancel);
                (kind, resource, store)
            })
            .collect();
        Self {
            client,
            mirror,
            stores,
            namespaces,
            changes,
        }
    }

    /// Whether the mirror selects the namespace of `object` (by its labels as last seen).
    fn selected(&self, object: &DynamicObject) -> bool {
        let Some((resource, store)) = &self.namespaces else {
            return true;
        };
        let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
        let labels = store
            .get(&ObjectRef::new_with(namespace, resource.clone()))
            .and_then(|found| found.metadata.labels.clone())
            .unwrap_or_default();
        self.mirror.selects(&labels)
    }

    /// Resolves once every kind has been listed in full (before that, nothing is known to be
    /// unreferenced).
    pub async fn ready(&self) {
        for (_, _, store) in &self.stores {
            // The writer lives as long as its watch; a dropped one (shutdown) is no wait either.
            let _ = store.wait_until_ready().await;
        }
        if let Some((_, store)) = &self.namespaces {
            let _ = store.wait_until_ready().await;
        }
    }

    /// Changes whenever what the objects reference may have changed (see [`significant`]).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The mirror copies the followed objects reference.
    pub fn in_stores(&self) -> HashSet<String> {
        let mut referenced = HashSet::new();
        for (kind, _, store) in &self.stores {
            for object in store.state() {
                let selected = self.selected(&object);
                referenced_by(*kind, &as_value(&object), &self.mirror, selected, &mut referenced);
            }
        }
        referenced
    }

    /// The mirror copies the objects reference, from a fresh list of every kind (the check
    /// just before a deletion: the reflectors may lag behind the API server; a pin to the mirror
    /// counts whatever the namespace's labels).
    pub async fn listed(&self) -> Result<HashSet<String>, kube::Error> {
        let mut referenced = HashSet::new();
        for (kind, resource, _) in &self.stores {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            for object in api.list(&ListParams::default()).await? {
                let selected = self.selected(&object);
                referenced_by(*kind, &as_value(&object), &self.mirror, selected, &mut referenced);
            }
        }
        Ok(referenced)
    }
}

/// A store of `api`'s objects, kept by a watch until `cancel`; a [`significant`] event (by
/// `fingerprint`) bumps `changed`.
fn reflect<K>(
    api: Api<K>,
    resource: &ApiResource,
    fingerprint: fn(&K) -> u64,
    changed: &watch::Sender<u64>,
    cancel: &CancellationToken,
) -> reflector::Store<K>
where
    K: kube::Resource<DynamicType = ApiResource> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let writer = reflector::store::Writer::new(resource.clone());
    let store = writer.as_reader();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .take_until(cancel.clone().cancelled_owned());
    let (changed, kind) = (changed.clone(), resource.kind.clone());
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut seen = HashMap::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    if significant(&mut seen, &event, fingerprint) {
                        changed.send_modify(|n| *n = n.wrapping_add(1));
                    }
                }
                Err(error) => {
                    tracing::warn!(%kind, %error, "watching for the mirror; retrying with backoff")
                }
            }
        }
    });
    store
}

/// Whether `event` can change what the objects reference: an object added, deleted or with a
/// new `fingerprint`, or a re-list complete. Not the status updates kapp-controller writes on
/// every sync: each wake-up recomputes every object's references. `seen`: fingerprints by uid.
fn significant<K: kube::Resource>(
    seen: &mut HashMap<String, u64>,
    event: &watcher::Event<K>,
    fingerprint: fn(&K) -> u64,
) -> bool {
    let uid = |object: &K| object.meta().uid.clone().unwrap_or_default();
    match event {
        watcher::Event::Apply(object) => {
            let print = fingerprint(object);
            seen.insert(uid(object), print) != Some(print)
        }
        // A re-list replaces the store: remember afresh, and wake once when it is complete.
        watcher::Event::Init => {
            seen.clear();
            false
        }
        watcher::Event::InitApply(object) => {
            seen.insert(uid(object), fingerprint(object));
            false
        }
        watcher::Event::InitDone => true,
        watcher::Event::Delete(object) => {
            seen.remove(&uid(object));
            true
        }
    }
}

/// A pinned object's fetch references are in its spec. Hashed as text, not read off
/// `metadata.generation`: Packages are served by kapp-controller's aggregated API, whose objects
/// need not keep one.
fn spec_fingerprint(object: &DynamicObject) -> u64 {
    let mut hasher = DefaultHasher::new();
    object
        .data
        .get("spec")
        .map(Value::to_string)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// What of a namespace decides the mirror's selection: its labels.
fn labels_fingerprint(namespace: &PartialObjectMeta<DynamicObject>) -> u64 {
    let mut hasher = DefaultHasher::new();
    namespace.metadata.labels.hash(&mut hasher);
    hasher.finish()
}

/// An object as the pins crate reads it: metadata and spec in one document.
fn as_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use holdfast_registry::mirror::MirrorLocation;
    use serde_json::json;

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn mirror() -> MirrorPins {
        MirrorPins::new(MirrorLocation::new("cache.corp.com:5000", "m").unwrap())
    }

    fn app(urls: &[&str]) -> Value {
        let fetch: Vec<Value> = urls.iter().map(|u| json!({"image": {"url": u}})).collect();
        json!({"metadata": {"name": "a", "namespace": "n"}, "spec": {"fetch": fetch}})
    }

    fn object(uid: &str, tag: &str, status: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
            "metadata": {"name": uid, "namespace": "n", "uid": uid},
            "spec": {"fetch": [{"image": {"url": format!("registry.corp.com/app:{tag}")}}]},
            "status": {"friendlyDescription": status},
        }))
        .unwrap()
    }

    #[test]
    fn only_spec_changes_additions_deletions_and_relists_wake_the_mirror() {
        let mut seen = HashMap::new();
        let mut wakes =
            |event: watcher::Event<DynamicObject>| significant(&mut seen, &event, spec_fingerprint);
        assert!(!wakes(watcher::Event::Init));
        assert!(!wakes(watcher::Event::InitApply(object("a", "1", "x"))));
        assert!(wakes(watcher::Event::InitDone));
        assert!(
            !wakes(watcher::Event::Apply(object("a", "1", "syncing"))),
            "status only"
        );
        assert!(
            wakes(watcher::Event::Apply(object("a", "2", "syncing"))),
            "spec changed"
        );
        assert!(wakes(watcher::Event::Apply(object("b", "1", ""))), "added");
        assert!(wakes(watcher::Event::Delete(object("b", "1", ""))), "deleted");
        assert!(wakes(watcher::Event::Apply(object("b", "1", ""))), "added again");
    }

    #[test]
    fn a_namespaces_labels_are_its_fingerprint() {
        let namespace = |labels: Value| -> PartialObjectMeta<DynamicObject> {
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "n", "uid": "u", "labels": labels}}))
            .unwrap()
        };
        let a = namespace(json!({"holdfast.dev/mirror": "true"}));
        assert_eq!(labels_fingerprint(&a), labels_fingerprint(&a.clone()));
        assert_ne!(labels_fingerprint(&a), labels_fingerprint(&namespace(json!({}))));
    }

    #[test]
    fn pins_to_the_mirror_and_upstream_digests_reference_their_copy_and_tags_do_not() {
        let mut referenced = HashSet::new();
        let object = app(&[
            &format!("cache.corp.com:5000/m/registry.corp.com/team/app@{D1}"),
            &format!("registry.corp.com/team/other@{D2}"),
            "registry.corp.com/team/tagged:1.0",
            "not a reference",
        ]);
        referenced_by(PinnedKind::App, &object, &mirror(), true, &mut referenced);
        let expected: HashSet<String> = [
            format!("cache.corp.com:5000/m/registry.corp.com/team/app@{D1}"),
            format!("cache.corp.com:5000/m/registry.corp.com/team/other@{D2}"),
        ]
        .into();
        assert_eq!(referenced, expected);
    }

    #[test]
    fn bundles_and_every_kind_count() {
        let mut referenced = HashSet::new();
        let repository = json!({"spec": {"fetch": {"imgpkgBundle": {"image": format!("nginx@{D1}")}}}});
        referenced_by(
            PinnedKind::PackageRepository,
            &repository,
            &mirror(),
            true,
            &mut referenced,
        );
        let package = json!({"spec": {"template": {"spec": {"fetch": [{"imgpkgBundle": {"image": format!("cache.corp.com:5000/m/x/y@{D2}")}}]}}}});
        referenced_by(PinnedKind::Package, &package, &mirror(), true, &mut referenced);
        let expected: HashSet<String> = [
            format!("cache.corp.com:5000/m/index.docker.io/library/nginx@{D1}"),
            format!("cache.corp.com:5000/m/x/y@{D2}"),
        ]
        .into();
        assert_eq!(referenced, expected);
    }

    #[test]
    fn private_sites_reference_their_namespaces_copy_and_unselected_namespaces_only_mirror_pins() {
        let private = json!({"metadata": {"name": "a", "namespace": "team-a"}, "spec": {"fetch": [
            {"image": {"url": format!("registry.corp.com/team/private@{D1}"), "secretRef": {"name": "creds"}}},
            {"image": {"url": format!("cache.corp.com:5000/m/registry.corp.com/team/app@{D2}")}},
        ]}});
        let with_pull = MirrorPins {
            pull_secret: Some("mirror-pull".into()),
            ..mirror()
        };
        let mut referenced = HashSet::new();
        referenced_by(PinnedKind::App, &private, &with_pull, true, &mut referenced);
        let expected: HashSet<String> = [
            format!("cache.corp.com:5000/m/registry.corp.com/team/private@{D1}"),
            format!("cache.corp.com:5000/m/namespaces/team-a/registry.corp.com/team/private@{D1}"),
            format!("cache.corp.com:5000/m/registry.corp.com/team/app@{D2}"),
        ]
        .into();
        assert_eq!(referenced, expected);
        // Without a pull Secret no private copy; in an unselected namespace only the mirror pin.
        let mut referenced = HashSet::new();
        referenced_by(PinnedKind::App, &private, &mirror(), true, &mut referenced);
        assert_eq!(referenced.len(), 2);
        let mut referenced = HashSet::new();
        referenced_by(PinnedKind::App, &private, &with_pull, false, &mut referenced);
        let expected: HashSet<String> =
            [format!("cache.corp.com:5000/m/registry.corp.com/team/app@{D2}")].into();
        assert_eq!(referenced, expected);
    }
}

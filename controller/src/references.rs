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

use std::collections::HashSet;

use futures::StreamExt;
use holdfast_pins::{PinnedKind, fetch_sites};
use holdfast_registry::{Reference, mirror::MirrorLocation};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::Value;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Adds the mirror copies `object`'s fetch references name to `into` (see the module docs).
pub fn referenced_by(kind: PinnedKind, object: &Value, mirror: &MirrorLocation, into: &mut HashSet<String>) {
    for site in fetch_sites(kind, object) {
        let Ok(reference) = Reference::parse(&site.reference) else {
            continue;
        };
        let Some(digest) = reference.digest() else {
            continue;
        };
        if mirror.contains(&reference) {
            into.insert(format!("{}@{digest}", reference.name()));
        } else if let Ok(location) = mirror.pinned_for(&reference, digest) {
            into.insert(location);
        }
    }
}

/// The pinned objects, followed through a reflector per installed kind.
pub struct References {
    client: Client,
    stores: Vec<(PinnedKind, ApiResource, reflector::Store<DynamicObject>)>,
    changes: watch::Receiver<u64>,
}

impl References {
    /// Follows every kind of `kinds` until `cancel`.
    pub fn follow(client: Client, kinds: Vec<(PinnedKind, ApiResource)>, cancel: CancellationToken) -> Self {
        let (changed, changes) = watch::channel(0u64);
        let mut stores = Vec::new();
        for (kind, resource) in kinds {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let writer = reflector::store::Writer::new(resource.clone());
            stores.push((kind, resource, writer.as_reader()));
            let events = watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .take_until(cancel.clone().cancelled_owned());
            let changed = changed.clone();
            tokio::spawn(async move {
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    match event {
                        Ok(_) => changed.send_modify(|n| *n = n.wrapping_add(1)),
                        Err(error) => {
                            tracing::warn!(kind = kind.kind(), %error, "watching pinned objects for the mirror; retrying with backoff")
                        }
                    }
                }
            });
        }
        Self {
            client,
            stores,
            changes,
        }
    }

    /// Resolves once every kind has been listed in full (before that, nothing is known to be
    /// unreferenced).
    pub async fn ready(&self) {
        for (_, _, store) in &self.stores {
            // The writer lives as long as its watch; a dropped one (shutdown) is no wait either.
            let _ = store.wait_until_ready().await;
        }
    }

    /// Changes whenever an object changes.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The copies in `mirror` the followed objects reference.
    pub fn in_stores(&self, mirror: &MirrorLocation) -> HashSet<String> {
        let mut referenced = HashSet::new();
        for (kind, _, store) in &self.stores {
            for object in store.state() {
                referenced_by(*kind, &as_value(&object), mirror, &mut referenced);
            }
        }
        referenced
    }

    /// The copies in `mirror` the objects reference, from a fresh list of every kind (the check
    /// just before a deletion: the reflectors may lag behind the API server).
    pub async fn listed(&self, mirror: &MirrorLocation) -> Result<HashSet<String>, kube::Error> {
        let mut referenced = HashSet::new();
        for (kind, resource, _) in &self.stores {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            for object in api.list(&ListParams::default()).await? {
                referenced_by(*kind, &as_value(&object), mirror, &mut referenced);
            }
        }
        Ok(referenced)
    }
}

/// An object as the pins crate reads it: metadata and spec in one document.
fn as_value(object: &DynamicObject) -> Value {
    serde_json::to_value(object).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn mirror() -> MirrorLocation {
        MirrorLocation::new("cache.corp.com:5000", "m").unwrap()
    }

    fn app(urls: &[&str]) -> Value {
        let fetch: Vec<Value> = urls.iter().map(|u| json!({"image": {"url": u}})).collect();
        json!({"metadata": {"name": "a", "namespace": "n"}, "spec": {"fetch": fetch}})
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
        referenced_by(PinnedKind::App, &object, &mirror(), &mut referenced);
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
            &mut referenced,
        );
        let package = json!({"spec": {"template": {"spec": {"fetch": [{"imgpkgBundle": {"image": format!("cache.corp.com:5000/m/x/y@{D2}")}}]}}}});
        referenced_by(PinnedKind::Package, &package, &mirror(), &mut referenced);
        let expected: HashSet<String> = [
            format!("cache.corp.com:5000/m/index.docker.io/library/nginx@{D1}"),
            format!("cache.corp.com:5000/m/x/y@{D2}"),
        ]
        .into();
        assert_eq!(referenced, expected);
    }
}

//! Which mirror copies the pinned objects reference: what the mirror copies and what its
//! retention keeps (`super`, `super::retention`).
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
    collections::HashSet,
    sync::{Arc, Mutex},
};

use holdfast_cache::Scope;
use holdfast_pins::{MirrorPins, PinnedKind, fetch_sites};
use holdfast_registry::Reference;
use kube::{Api, Client, api::ListParams};
use serde_json::Value;
use tokio::sync::watch;

use crate::{
    stored::Stored,
    watched::{Index, Watched},
};

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

/// The mirror copies `object`'s fetch references name, each once ([`referenced_by`]).
fn references_of(kind: PinnedKind, object: &Value, mirror: &MirrorPins, selected: bool) -> Vec<String> {
    let mut references = HashSet::new();
    referenced_by(kind, object, mirror, selected, &mut references);
    references.into_iter().collect()
}

/// The pinned objects and the namespaces' labels, read from the term's one watch of each
/// ([`Watched`]).
pub struct References {
    client: Client,
    mirror: MirrorPins,
    watched: Arc<Watched>,
    /// Each object's references, by the kind and the mirror's selection of its namespace.
    index: Mutex<Index<String, (PinnedKind, bool)>>,
}

impl References {
    pub fn new(client: Client, mirror: MirrorPins, watched: Arc<Watched>) -> Self {
        Self {
            client,
            mirror,
            watched,
            index: Mutex::default(),
        }
    }

    /// Whether the mirror selects the namespace of `object` (by its labels as last seen).
    fn selected(&self, object: &Stored) -> bool {
        if self.mirror.namespaces.selects_all() {
            return true;
        }
        let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
        let labels = self.watched.namespaces().labels(namespace).unwrap_or_default();
        self.mirror.selects(&labels)
    }

    /// Adds the copies `object` references to `into`.
    fn add(&self, kind: PinnedKind, object: &Stored, into: &mut HashSet<String>) {
        referenced_by(
            kind,
            &object.document(),
            &self.mirror,
            self.selected(object),
            into,
        );
    }

    /// Resolves once every kind has been listed in full (before that, nothing is known to be
    /// unreferenced).
    pub async fn ready(&self) {
        self.watched.ready().await;
    }

    /// Changes whenever what the objects reference may have changed.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.watched.changes()
    }

    /// The mirror copies the followed objects reference (each object read again only when it
    /// changed, or its namespace's selection did: [`Index`]).
    pub fn in_stores(&self) -> HashSet<String> {
        let objects: Vec<(PinnedKind, Arc<Stored>, bool)> = self
            .watched
            .objects()
            .map(|(kind, object)| {
                let selected = self.selected(&object);
                (kind, object, selected)
            })
            .collect();
        self.index.lock().unwrap_or_else(|p| p.into_inner()).union(
            objects.iter().map(|(k, o, s)| (o.as_ref(), (*k, *s))),
            |object, (kind, selected)| references_of(kind, object, &self.mirror, selected),
        )
    }

    /// The mirror copies the objects reference, from a fresh list of every kind (the check
    /// just before a deletion: the reflectors may lag behind the API server; a pin to the mirror
    /// counts whatever the namespace's labels).
    pub async fn listed(&self) -> Result<HashSet<String>, kube::Error> {
        let mut referenced = HashSet::new();
        for watched in self.watched.kinds() {
            let api: Api<Stored> = Api::all_with(self.client.clone(), &watched.resource);
            for object in api.list(&ListParams::default()).await? {
                self.add(watched.kind, &object, &mut referenced);
            }
        }
        Ok(referenced)
    }
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

    /// A stored App (uid, resourceVersion) pinned to `url`.
    fn stored(uid: &str, version: &str, url: &str) -> Stored {
        let mut object = app(&[url]);
        object["apiVersion"] = json!("kappctrl.k14s.io/v1alpha1");
        object["kind"] = json!("App");
        object["metadata"]["uid"] = json!(uid);
        object["metadata"]["resourceVersion"] = json!(version);
        serde_json::from_value(object).unwrap()
    }

    /// The index reads an object again only when its version or its namespace's selection
    /// changed, and forgets objects that are gone; the union is the same as reading them all.
    #[test]
    fn the_index_reads_only_changed_objects_and_forgets_deleted_ones() {
        let copy = |d: &str| format!("cache.corp.com:5000/m/registry.corp.com/team/app@{d}");
        let (a, b) = (stored("a", "1", &copy(D1)), stored("b", "1", &copy(D2)));
        let mut index = Index::default();
        fn references(
            index: &mut Index<String, (PinnedKind, bool)>,
            objects: &[(&Stored, bool)],
        ) -> HashSet<String> {
            index.union(
                objects.iter().map(|(o, s)| (*o, (PinnedKind::App, *s))),
                |object, (kind, selected)| references_of(kind, object, &mirror(), selected),
            )
        }
        let first = references(&mut index, &[(&a, true), (&b, true)]);
        assert_eq!(first, HashSet::from([copy(D1), copy(D2)]));
        assert_eq!(index.reads(), 2);

        // Nothing changed: nothing read, same answer.
        assert_eq!(references(&mut index, &[(&a, true), (&b, true)]), first);
        assert_eq!(index.reads(), 2);

        // `a` moved to D2 (a new version): only `a` is read.
        let a2 = stored("a", "2", &copy(D2));
        assert_eq!(
            references(&mut index, &[(&a2, true), (&b, true)]),
            HashSet::from([copy(D2)])
        );
        assert_eq!(index.reads(), 3);

        // `b` is gone: its references go with it, and so does its entry.
        assert_eq!(references(&mut index, &[(&a2, true)]), HashSet::from([copy(D2)]));
        assert_eq!(index.len(), 1);

        // The selection of `a`'s namespace changed: read again.
        let _ = references(&mut index, &[(&a2, false)]);
        assert_eq!(index.reads(), 4);
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

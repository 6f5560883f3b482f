//! A pinned object (App, PackageRepository, Package) as the controller's stores keep it: its
//! metadata and, of its spec, the fetch field with its entries' OCI sources only — the one part
//! the pinning controllers, the refresher and the mirror read.
//!
//! Read straight off the API server's JSON: the status (kapp-controller's carries deploy output,
//! several KiB) is skipped while parsing, never built; the rest of the spec (a Package's
//! `valuesSchema` and `releaseNotes` can be tens of KiB, an App's templates, inline fetch files)
//! is dropped as soon as it is read. What is kept of the spec is held as compact JSON text, not
//! a `serde_json::Value`: each JSON object there is a B-tree node of about 600 bytes, four of
//! them for one fetch entry, which made the spec most of what a stored object weighed
//! (BENCHMARKS.md, bench-scale).

use std::{
    borrow::Cow,
    hash::{DefaultHasher, Hash, Hasher},
};

use holdfast_pins::{PinnedKind, SiteKind};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Resource,
    api::{ApiResource, TypeMeta},
    core::DynamicResourceScope,
};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

/// A pinned object as stored: see the module docs.
#[derive(Clone, Debug)]
pub struct Stored {
    pub types: Option<TypeMeta>,
    pub metadata: ObjectMeta,
    /// The kept part of the spec ([`kept_spec`]) as compact JSON; `None` when nothing is kept.
    spec: Option<Box<str>>,
    /// A hash of kapp-controller's `status.fetch.startedAt` (Apps and PackageRepositories; it
    /// moves once per sync), the one field of the status read: [`crate::watched`] counts syncs
    /// by it.
    fetch_started: Option<u64>,
}

impl Stored {
    /// The object as the pins crate reads it: `apiVersion`, `kind`, `metadata` and the kept
    /// spec, one document (the shape of the object as the API server has it, less what is not
    /// kept), so that a pin computed from it patches the same paths.
    pub fn document(&self) -> Value {
        let mut document = Map::new();
        if let Some(types) = &self.types {
            document.insert("apiVersion".into(), types.api_version.clone().into());
            document.insert("kind".into(), types.kind.clone().into());
        }
        document.insert(
            "metadata".into(),
            serde_json::to_value(&self.metadata).unwrap_or_default(),
        );
        if let Some(spec) = self.spec.as_deref().and_then(|s| serde_json::from_str(s).ok()) {
            document.insert("spec".into(), spec);
        }
        Value::Object(document)
    }

    /// The kept spec as compact JSON text (empty when nothing is kept): what a change of the
    /// fetch references changes.
    pub fn spec_text(&self) -> &str {
        self.spec.as_deref().unwrap_or_default()
    }

    /// When kapp-controller last started fetching the object (hashed; `None`: never, or a kind
    /// without a fetch status, a Package).
    pub fn fetch_started(&self) -> Option<u64> {
        self.fetch_started
    }
}

impl<'de> Deserialize<'de> for Stored {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// The fields read; any other (the status) is skipped unparsed.
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire {
            api_version: Option<String>,
            kind: Option<String>,
            #[serde(default)]
            metadata: ObjectMeta,
            spec: Option<Value>,
            status: Option<WireStatus>,
        }
        /// Of the status, `fetch.startedAt` alone; the rest (deploy output) is skipped.
        #[derive(Deserialize)]
        struct WireStatus {
            fetch: Option<WireFetch>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct WireFetch {
            started_at: Option<String>,
        }
        let wire = Wire::deserialize(deserializer)?;
        let fetch_started = wire
            .status
            .and_then(|s| s.fetch)
            .and_then(|f| f.started_at)
            .map(|started| {
                let mut hasher = DefaultHasher::new();
                started.hash(&mut hasher);
                hasher.finish()
            });
        let types = match (wire.api_version, wire.kind) {
            (Some(api_version), Some(kind)) => Some(TypeMeta { api_version, kind }),
            _ => None,
        };
        Ok(Self {
            types,
            metadata: wire.metadata,
            spec: wire
                .spec
                .and_then(kept_spec)
                .map(|kept| kept.to_string().into_boxed_str()),
            fetch_started,
        })
    }
}

impl Resource for Stored {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(resource: &ApiResource) -> Cow<'_, str> {
        resource.kind.as_str().into()
    }

    fn group(resource: &ApiResource) -> Cow<'_, str> {
        resource.group.as_str().into()
    }

    fn version(resource: &ApiResource) -> Cow<'_, str> {
        resource.version.as_str().into()
    }

    fn api_version(resource: &ApiResource) -> Cow<'_, str> {
        resource.api_version.as_str().into()
    }

    fn plural(resource: &ApiResource) -> Cow<'_, str> {
        resource.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Of a spec, the fetch field of every pinned kind's path (`spec.fetch`; a Package's
/// `spec.template.spec.fetch`) that it has, each entry with only its OCI sources (an emptied
/// entry keeps its place: pins address entries by index); `None` when it has none. The paths
/// of the kinds never overlap (an App's `spec.template` is a list), so the spec need not be
/// told its kind.
fn kept_spec(mut spec: Value) -> Option<Value> {
    let mut kept = Value::Null;
    for kind in PinnedKind::ALL {
        let Some((_, path)) = kind.fetch_path().split_first() else {
            continue;
        };
        if let Some(mut fetch) = take_at(&mut spec, path) {
            match &mut fetch {
                Value::Array(entries) => entries.iter_mut().for_each(sources_only),
                entry => sources_only(entry),
            }
            put_at(&mut kept, path, fetch);
        }
    }
    (!kept.is_null()).then_some(kept)
}

/// Takes the value at `path` out of `value`; `None` when there is none (or it is null).
fn take_at(value: &mut Value, path: &[&str]) -> Option<Value> {
    let mut at = value;
    for key in path {
        at = at.get_mut(*key)?;
    }
    let taken = at.take();
    (!taken.is_null()).then_some(taken)
}

/// Puts `put` at `path` in `into`, making the objects along the way.
fn put_at(into: &mut Value, path: &[&str], put: Value) {
    let mut at = into;
    for key in path {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        let Value::Object(map) = at else {
            return;
        };
        at = map.entry(*key).or_insert(Value::Null);
    }
    *at = put;
}

/// A fetch entry with only its OCI sources; its inline files, git, http or helmChart source are
/// not read.
fn sources_only(entry: &mut Value) {
    if let Some(entry) = entry.as_object_mut() {
        let sources = [SiteKind::Image, SiteKind::ImgpkgBundle].map(SiteKind::source_key);
        entry.retain(|key, _| sources.contains(&key.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stored(object: Value) -> Stored {
        serde_json::from_value(object).unwrap()
    }

    #[test]
    fn keeps_metadata_and_the_fetch_fields_oci_sources_only() {
        let image = json!({"image": {"url": "registry.corp.com/app:1", "secretRef": {"name": "s"}}});
        let app = stored(json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
            "metadata": {"name": "a", "namespace": "n", "uid": "u", "managedFields": []},
            "spec": {"serviceAccountName": "default", "template": [{"ytt": {}}], "fetch": [
                {"inline": {"paths": {"values.yml": "x: 1"}}, "path": "values"},
                image,
                {"git": {"url": "https://github.com/corp/config"}, "imgpkgBundle": {"image": "r.corp.com/b:1"}},
            ]},
            "status": {"deploy": {"stdout": "x".repeat(4096)}},
        }));
        assert_eq!(
            app.document(),
            json!({
                "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
                "metadata": {"name": "a", "namespace": "n", "uid": "u", "managedFields": []},
                "spec": {"fetch": [{}, image, {"imgpkgBundle": {"image": "r.corp.com/b:1"}}]},
            })
        );

        let repository = stored(json!({
            "apiVersion": "packaging.carvel.dev/v1alpha1", "kind": "PackageRepository",
            "metadata": {"name": "r"},
            "spec": {"fetch": {"imgpkgBundle": {"image": "r.corp.com/repo:1"}}, "paused": false},
        }));
        assert_eq!(
            repository.document()["spec"],
            json!({"fetch": {"imgpkgBundle": {"image": "r.corp.com/repo:1"}}})
        );

        let package = stored(json!({
            "apiVersion": "data.packaging.carvel.dev/v1alpha1", "kind": "Package",
            "metadata": {"name": "p.corp.com.1.0.0", "namespace": "n"},
            "spec": {"refName": "p.corp.com", "valuesSchema": {"openAPIv3": {"type": "object"}},
                     "template": {"spec": {"fetch": [{"imgpkgBundle": {"image": "r.corp.com/p:1.0.0"}}],
                                           "template": [{"ytt": {}}]}}},
        }));
        assert_eq!(
            package.document()["spec"],
            json!({"template": {"spec": {"fetch": [{"imgpkgBundle": {"image": "r.corp.com/p:1.0.0"}}]}}})
        );
        assert_eq!(
            package.spec_text(),
            r#"{"template":{"spec":{"fetch":[{"imgpkgBundle":{"image":"r.corp.com/p:1.0.0"}}]}}}"#
        );
    }

    #[test]
    fn nothing_to_fetch_keeps_no_spec() {
        for spec in [
            json!({"deploy": []}),
            json!({"fetch": null}),
            json!({"template": [{"ytt": {}}]}),
        ] {
            let bare = stored(json!({
                "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
                "metadata": {"name": "b"}, "spec": spec,
            }));
            assert_eq!(bare.spec_text(), "");
            assert_eq!(bare.document().get("spec"), None);
        }
        let unspecified = stored(json!({"metadata": {"name": "c"}}));
        assert_eq!(unspecified.document(), json!({"metadata": {"name": "c"}}));
    }

    /// A list item or watch event that is not an object of the expected shape is an error the
    /// watch reports, not a panic.
    #[test]
    fn malformed_objects_are_errors() {
        assert!(serde_json::from_value::<Stored>(json!({"metadata": "x"})).is_err());
        assert!(serde_json::from_value::<Stored>(json!([1, 2])).is_err());
    }
}

//! Where the pinnable references are in each kind (kapp-controller's App, PackageRepository and Package fetch specs, which are vendir's fetch sources).

use std::fmt;

use holdfast_peers::kapp_controller;
use holdfast_registry::VersionSelection;
use json_patch::jsonptr::PointerBuf;
use kube::api::GroupVersionKind;
use serde_json::Value;

/// The kinds whose fetch specs holdfast pins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PinnedKind {
    /// `kappctrl.k14s.io` `apps`: `spec.fetch[]`.
    App,
    /// `packaging.carvel.dev` `packagerepositories`: `spec.fetch` is a single object.
    PackageRepository,
    /// `data.packaging.carvel.dev` `packages` (aggregated API): `spec.template.spec.fetch[]`.
    Package,
}

impl PinnedKind {
    pub const ALL: [PinnedKind; 3] = [Self::App, Self::PackageRepository, Self::Package];

    /// The kind for an admission request's resource; `None` for anything else (subresources are
    /// the router's business).
    pub fn from_group_resource(group: &str, resource: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.group() == group && kind.resource() == resource)
    }

    pub fn group(self) -> &'static str {
        match self {
            Self::App => kapp_controller::APP_GROUP,
            Self::PackageRepository => kapp_controller::PACKAGING_GROUP,
            Self::Package => kapp_controller::DATA_PACKAGING_GROUP,
        }
    }

    /// The plural resource name, as in `AdmissionRequest.resource.resource`.
    pub fn resource(self) -> &'static str {
        match self {
            Self::App => "apps",
            Self::PackageRepository => "packagerepositories",
            Self::Package => "packages",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Self::App => "App",
            Self::PackageRepository => "PackageRepository",
            Self::Package => "Package",
        }
    }

    pub fn gvk(self) -> GroupVersionKind {
        GroupVersionKind::gvk(self.group(), kapp_controller::VERSION, self.kind())
    }

    /// The path of the `fetch` field.
    pub fn fetch_path(self) -> &'static [&'static str] {
        match self {
            Self::App | Self::PackageRepository => &["spec", "fetch"],
            Self::Package => &["spec", "template", "spec", "fetch"],
        }
    }

    /// Whether `fetch` is a list (App, Package) or a single entry (PackageRepository).
    pub fn fetch_is_list(self) -> bool {
        !matches!(self, Self::PackageRepository)
    }
}

impl fmt::Display for PinnedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// The two fetch sources that hold OCI references.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SiteKind {
    /// `image: {url, tagSelection, secretRef, subPath}`.
    Image,
    /// `imgpkgBundle: {image, tagSelection, secretRef}`.
    ImgpkgBundle,
}

impl SiteKind {
    /// The key of the source in a fetch entry.
    pub fn source_key(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::ImgpkgBundle => "imgpkgBundle",
        }
    }

    /// The key of the reference inside the source (`url` vs `image`: vendir's asymmetry).
    pub fn ref_key(self) -> &'static str {
        match self {
            Self::Image => "url",
            Self::ImgpkgBundle => "image",
        }
    }
}

/// One pinnable reference in an object.
#[derive(Debug, Clone, PartialEq)]
pub struct FetchSite {
    pub kind: SiteKind,
    /// JSON pointer of the reference field, e.g. `/spec/fetch/0/image/url`; also the key of
    /// the site's entry in the `holdfast.dev/original-refs` annotation.
    pub pointer: PointerBuf,
    /// The same field for people, e.g. `spec.fetch[0].image.url` (used in messages).
    pub field: String,
    /// JSON pointer of the source's `tagSelection`, when it has one.
    pub tag_selection_pointer: Option<PointerBuf>,
    /// The reference as written.
    pub reference: String,
    /// The `tagSelection`, when present and well-formed (see `tag_selection_json`).
    pub tag_selection: Option<VersionSelection>,
    /// The `tagSelection` exactly as written (recorded in the annotation); present even when it
    /// does not parse, which [`plan`](super::plan) reports.
    pub tag_selection_json: Option<Value>,
    /// `secretRef.name`, as written: the Secret, in the object's namespace, with the registry
    /// credentials.
    pub secret_ref: Option<String>,
    /// The Secret to resolve the reference with (upstream): `secret_ref`, except in an
    /// [`ObjectPlan`](super::ObjectPlan) for a source whose `secretRef` still names the mirror
    /// pull Secret holdfast wrote over the user's while its reference is no longer pinned:
    /// then the user's Secret recorded in `holdfast.dev/original-refs`, since the pull
    /// Secret's credentials are the mirror's and must not go to the upstream registry.
    pub upstream_secret: Option<String>,
}

impl FetchSite {
    /// JSON pointer of the source's `secretRef.name`.
    pub fn secret_name_pointer(&self) -> PointerBuf {
        secret_name_pointer(&self.pointer)
    }
}

/// The `secretRef.name` beside the reference field at `reference` (`…/image/url` →
/// `…/image/secretRef/name`).
pub(crate) fn secret_name_pointer(reference: &json_patch::jsonptr::Pointer) -> PointerBuf {
    let mut pointer = reference.parent().map(|p| p.to_buf()).unwrap_or_default();
    pointer.push_back("secretRef");
    pointer.push_back("name");
    pointer
}

/// The pinnable references of `object`, in document order (per entry: `image` then
/// `imgpkgBundle`). Entries of other sources (git, http, helmChart, inline) yield nothing; so
/// does a source without a string reference (nothing to pin; the schema is the API server's
/// business). `null` counts as absent, as it does for the API server's pruning.
pub fn fetch_sites(kind: PinnedKind, object: &Value) -> Vec<FetchSite> {
    let mut sites = Vec::new();
    for (pointer, field, entry) in fetch_entries(kind, object) {
        entry_sites(entry, &pointer, &field, &mut sites);
    }
    sites
}

/// The entries of `object`'s fetch field with their pointers and fields for people
/// (`spec.fetch[0]`), in document order; a PackageRepository's single entry is `spec.fetch`.
pub fn fetch_entries(kind: PinnedKind, object: &Value) -> Vec<(PointerBuf, String, &Value)> {
    let mut fetch = object;
    for key in kind.fetch_path() {
        match fetch.get(key) {
            Some(next) => fetch = next,
            None => return Vec::new(),
        }
    }
    let pointer = PointerBuf::from_tokens(kind.fetch_path().iter().copied());
    let field = kind.fetch_path().join(".");
    if !kind.fetch_is_list() {
        return vec![(pointer, field, fetch)];
    }
    fetch
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(index, entry)| {
            let mut pointer = pointer.clone();
            pointer.push_back(index);
            (pointer, format!("{field}[{index}]"), entry)
        })
        .collect()
}

fn entry_sites(entry: &Value, pointer: &PointerBuf, field: &str, sites: &mut Vec<FetchSite>) {
    for kind in [SiteKind::Image, SiteKind::ImgpkgBundle] {
        let Some(source) = entry.get(kind.source_key()).filter(|v| v.is_object()) else {
            continue;
        };
        let Some(reference) = source.get(kind.ref_key()).and_then(Value::as_str) else {
            continue;
        };
        let mut source_pointer = pointer.clone();
        source_pointer.push_back(kind.source_key());
        let mut ref_pointer = source_pointer.clone();
        ref_pointer.push_back(kind.ref_key());
        let tag_selection_json = source.get("tagSelection").filter(|v| !v.is_null()).cloned();
        let tag_selection_pointer = tag_selection_json.as_ref().map(|_| {
            let mut p = source_pointer.clone();
            p.push_back("tagSelection");
            p
        });
        let tag_selection = tag_selection_json
            .as_ref()
            .and_then(|raw| serde_json::from_value::<VersionSelection>(raw.clone()).ok());
        let secret_ref = source
            .get("secretRef")
            .and_then(|s| s.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        sites.push(FetchSite {
            kind,
            pointer: ref_pointer,
            field: format!("{field}.{}.{}", kind.source_key(), kind.ref_key()),
            tag_selection_pointer,
            reference: reference.to_owned(),
            tag_selection,
            tag_selection_json,
            upstream_secret: secret_ref.clone(),
            secret_ref,
        });
    }
}

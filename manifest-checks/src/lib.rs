//! The manifests as a security reviewer reads them, checked as data: what SECURITY.md promises
//! about `manifests/` is asserted on the YAML itself, and SECURITY.md's RBAC and webhook tables
//! are compared with the manifests row for row, so the document, the YAML and the code cannot
//! drift apart.
//!
//! - [`load`]: the base as written, by following its kustomizations' `resources:` (no tool
//!   needed); with `kubectl` on the PATH, the base, the overlays and the components rendered by
//!   `kubectl kustomize`.
//! - [`yaml`]: values at dotted paths of the parsed objects, objects by kind and name.
//! - [`checks`]: everything SECURITY.md promises of any rendering ([`check_all`]).
//! - [`tables`]: SECURITY.md's RBAC, webhook and webhook settings tables, parsed and compared
//!   with the manifests.
//! - [`finalizer`] and [`fence`]: the controller's delete RBAC and its fence (a
//!   ValidatingAdmissionPolicy) held to the fast finalizer's table (`DELETABLE`) for the
//!   controller's flags; [`relocation`]: a rendering for another namespace (a kustomize
//!   `namespace:` override) still fenced and self-excluded there; [`upstream`]: the fetch fields of kapp-controller's upstream CRDs
//!   (collected by `make deps`) that the fence must hold.
//!
//! - [`chart`]: the Helm chart (charts/holdfast) rendered for a set of values against the
//!   kustomize overlay of manifests/ that makes the same changes; [`chart_docs`]: the chart's
//!   README generated from its values.yaml.
//!
//! A library, not an e2e suite: it needs no control plane. Its tests (`tests/`) run every check
//! on the manifests as written, as rendered, and on mutated copies (a wildcard verb, a missing
//! namespaceSelector, …) to show that each catches what it is meant to catch.

pub mod chart;
pub mod chart_docs;
pub mod checks;
pub mod fence;
pub mod finalizer;
pub mod load;
pub mod policies;
pub mod relocation;
pub mod report;
pub mod tables;
pub mod upstream;
pub mod yaml;

pub use checks::check_all;

/// holdfast's namespace: every webhook must exclude it (and `kube-system`).
pub const HOLDFAST_NAMESPACE: &str = "holdfast-system";

/// holdfast's CRDs (`manifests/crds/`): the digest cache's, the pinning policies' parameters and
/// the controller's leader election.
pub const HOLDFAST_CRDS: [&str; 4] = [
    "clusterdigestpins.holdfast.dev",
    "controllerleases.holdfast.dev",
    "digestcacheentries.holdfast.dev",
    "digestpins.holdfast.dev",
];

/// The opt-out label every webhook's namespaceSelector honours.
pub const IGNORE_LABEL: &str = "holdfast.dev/ignore";

//! The two parameter kinds of holdfast's MutatingAdmissionPolicies, typed: `ClusterDigestPins`
//! (cluster-scoped: pins every namespace may use, from anonymous entries) and `DigestPins` (in a
//! tenant's namespace: pins of the references its objects name with a `secretRef`). The CRDs in
//! `manifests/crds/` are generated from these types ([`manifest`], checked by
//! `pins/tests/crd.rs`).
//!
//! The anonymous kind is cluster-scoped so that no binding names holdfast's namespace (a
//! kustomize `namespace:` override rewrites no `paramRef.namespace`); the private kind is
//! namespaced so that a binding without `paramRef.namespace` reads the admitted object's own
//! namespace's object, and no other.

use std::collections::BTreeMap;

use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label on every parameter object the controller writes: what it lists, compares and
/// deletes (never an object without it).
pub const MANAGED_LABEL: &str = "app.kubernetes.io/managed-by";
/// [`MANAGED_LABEL`]'s value.
pub const MANAGED_BY: &str = "holdfast-controller";

/// Which of the two CRDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamsCrd {
    Cluster,
    Namespaced,
}

impl ParamsCrd {
    pub const ALL: [Self; 2] = [Self::Cluster, Self::Namespaced];

    /// The file under `manifests/crds/` holding the CRD.
    pub fn file(self) -> &'static str {
        match self {
            Self::Cluster => "clusterdigestpins.holdfast.dev.yaml",
            Self::Namespaced => "digestpins.holdfast.dev.yaml",
        }
    }

    /// The example's argument that prints it.
    pub fn arg(self) -> &'static str {
        match self {
            Self::Cluster => "cluster",
            Self::Namespaced => "namespaced",
        }
    }

    /// The command that prints [`manifest`] into the file it belongs in (run from the workspace).
    pub fn regenerate(self) -> String {
        format!(
            "cargo run -q -p holdfast-pins --example policy_params_crd -- {} > manifests/crds/{}",
            self.arg(),
            self.file()
        )
    }
}

/// The comment block each manifest opens with, before the command that generates it.
const HEADER: &str = "\
# The parameters of holdfast's MutatingAdmissionPolicies (manifests/base/policy/): the digest
# cache, published by holdfast-controller's leader for the API server to pin cached tags itself,
# without calling the webhook. ClusterDigestPins: the pins of references without a secretRef
# (anonymous entries), for every namespace. DigestPins: in a namespace, the pins of its objects'
# references that name a secretRef, so that no namespace's policy ever reads another's private
# digests. Written by holdfast-controller only (SECURITY.md, \"The pinning policy\").
#
# Generated from pins/src/policy_params/crd.rs; do not edit, regenerate with
";

/// The CRD as its file under `manifests/crds/` holds it.
pub fn manifest(crd: ParamsCrd) -> Result<String, serde_yaml::Error> {
    let body = match crd {
        ParamsCrd::Cluster => serde_yaml::to_string(&ClusterDigestPins::crd())?,
        ParamsCrd::Namespaced => serde_yaml::to_string(&DigestPins::crd())?,
    };
    Ok(format!("{HEADER}#   {}\n{body}", crd.regenerate()))
}

// The map each kind holds, `pins`: for each fetch reference as written (prefixed with the
// `secretRef` name and a space for a source that names one), the value the webhook writes into
// that field. Atomic, so that the API server's `managedFields` record the map, not each of its
// keys (which would double an object's size).

// Pins from anonymous digest cache entries, for every namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "holdfast.dev",
    version = "v1alpha1",
    kind = "ClusterDigestPins",
    plural = "clusterdigestpins",
    singular = "clusterdigestpins",
    category = "holdfast",
    derive = "PartialEq",
    derive = "Default",
    doc = "",
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
pub struct ClusterDigestPinsSpec {
    /// Reference as written (after "<secretRef name> " for a source with one) to what holdfast
    /// writes for it.
    #[serde(default)]
    #[schemars(
        description = "Fetch reference as written (after \"<secretRef name> \" for a source with one) to the pinned reference holdfast writes for it (repository as written, @sha256:…).",
        extend("x-kubernetes-map-type" = "atomic")
    )]
    pub pins: BTreeMap<String, String>,
}

// Pins of one namespace's references that name a secretRef.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "holdfast.dev",
    version = "v1alpha1",
    kind = "DigestPins",
    plural = "digestpins",
    singular = "digestpins",
    namespaced,
    category = "holdfast",
    derive = "PartialEq",
    derive = "Default",
    doc = "",
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
pub struct DigestPinsSpec {
    /// Reference as written (after "<secretRef name> " for a source with one) to what holdfast
    /// writes for it.
    #[serde(default)]
    #[schemars(
        description = "Fetch reference as written (after \"<secretRef name> \" for a source with one) to the pinned reference holdfast writes for it (repository as written, @sha256:…).",
        extend("x-kubernetes-map-type" = "atomic")
    )]
    pub pins: BTreeMap<String, String>,
}

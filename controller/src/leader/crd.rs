//! The `ControllerLease` custom resource the replicas elect their leader with: the fields of a
//! `coordination.k8s.io/v1` Lease, in a kind of holdfast's own. Its own kind because the term
//! fence (`manifests/base/controller/term-fence.yaml`) takes it as its parameter, and
//! kube-apiserver's informer behind a *built-in* parameter kind freezes for good once no binding
//! names that kind (kubernetes/kubernetes#130887): after an uninstall and a reinstall it judged
//! against the old install's Lease. A custom resource's parameters are read through an informer
//! of their own. The CRD in `manifests/crds/` is generated from this type ([`manifest`], checked
//! by `controller/tests/crd.rs`).

use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use holdfast_cache::cluster_store::crd::Timestamp;

/// The file under `manifests/crds/` holding the CRD.
pub const FILE: &str = "controllerleases.holdfast.dev.yaml";

/// The command that prints [`manifest`] into [`FILE`] (run from the workspace).
pub const REGENERATE: &str = "cargo run -q -p holdfast-controller --example controller_lease_crd > manifests/crds/controllerleases.holdfast.dev.yaml";

/// The comment block the manifest opens with, before the command that generates it.
const HEADER: &str = "\
# holdfast-controller's leader election: one object, in holdfast's namespace, that the replicas
# take and renew as they would a coordination.k8s.io/v1 Lease (the same fields). Its own kind so
# that the term fence (a ValidatingAdmissionPolicy) can take it as its parameter and admit a
# controller pod's writes only while that pod holds it (SECURITY.md, \"The term fence\").
# `kubectl get controllerleases -n holdfast-system` shows who leads.
#
# Generated from controller/src/leader/crd.rs; do not edit, regenerate with
";

/// The CRD as `manifests/crds/controllerleases.holdfast.dev.yaml` holds it.
pub fn manifest() -> Result<String, serde_yaml::Error> {
    let crd = serde_yaml::to_string(&ControllerLease::crd())?;
    Ok(format!("{HEADER}#   {REGENERATE}\n{crd}"))
}

// Who leads holdfast-controller's replicas, as a coordination.k8s.io/v1 Lease says it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "holdfast.dev",
    version = "v1alpha1",
    kind = "ControllerLease",
    plural = "controllerleases",
    namespaced,
    category = "holdfast",
    derive = "PartialEq",
    derive = "Default",
    doc = "",
    printcolumn = r#"{"name": "Holder", "type": "string", "jsonPath": ".spec.holderIdentity"}"#,
    printcolumn = r#"{"name": "Renewed", "type": "date", "jsonPath": ".spec.renewTime"}"#,
    printcolumn = r#"{"name": "Transitions", "type": "integer", "jsonPath": ".spec.leaseTransitions"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ControllerLeaseSpec {
    /// The replica (its pod's name) that holds the lease; absent when it was handed back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_identity: Option<String>,
    /// How long the lease lasts without renewal, as candidates count it on their own clocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,
    /// When the holder took the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<Timestamp>,
    /// The holder's last renewal (informative: no replica compares it with its clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<Timestamp>,
    /// How many times the lease changed hands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_transitions: Option<i32>,
}

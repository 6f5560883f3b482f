//! What an upgrade to holdfast's next release must keep and bring, for the suites that upgrade it
//! (Helm's in `tests/chart.rs`, the Carvel package's in `tests/package.rs`): a digest cache entry
//! with spec and status written before it is kept as it was, and the next release's CRD, which
//! has a field this one's has not, is applied (an entry holding that field stores it: not pruned).

use std::path::Path;

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::{Env, accounts::kubectl_ok};

/// The digest cache's CRD.
pub const CRD: &str = "digestcacheentries.holdfast.dev";
/// The field the next release's CRD adds to an entry's spec.
pub const NEW_FIELD: &str = "addedByTheNextVersion";

/// Makes the chart in `chart` (a copy of this release's: Helm's pulled chart, or the Carvel
/// package bundle's) the next release's: Chart.yaml's `version` becomes `next`, and its CRD gets
/// [`NEW_FIELD`].
pub fn make_next_chart(chart: &Path, version: &str, next: &str) -> Result<()> {
    let chart_yaml = chart.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml)?;
    let (from, to) = (format!("\nversion: {version}\n"), format!("\nversion: {next}\n"));
    ensure!(
        text.contains(&from),
        "{} has no version {version}",
        chart_yaml.display()
    );
    std::fs::write(&chart_yaml, text.replace(&from, &to))?;
    add_field_to_crd(&chart.join("files/crds").join(format!("{CRD}.yaml")))
}

/// Adds [`NEW_FIELD`] (a string) to the spec schema of the CRD in `file` (YAML), as the next
/// release's CRD would.
fn add_field_to_crd(file: &Path) -> Result<()> {
    let mut crd: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(file)?)?;
    let properties =
        &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    ensure!(
        properties.is_mapping(),
        "the CRD's spec has no properties: {file:?}"
    );
    properties[NEW_FIELD] = serde_yaml::from_str("{type: string}")?;
    std::fs::write(file, serde_yaml::to_string(&crd)?)?;
    Ok(())
}

/// A digest cache entry as holdfast writes it, spec and status, before an upgrade.
#[derive(Debug)]
pub struct KeptEntry {
    namespace: String,
    before: Value,
}

impl KeptEntry {
    /// Writes the entry `kept` into `namespace`: its spec as the controller or the webhook
    /// writes it, then its status through the subresource, as the controller does.
    pub fn write(env: &Env, namespace: &str) -> Result<Self> {
        env.kubectl_apply(
            namespace,
            &format!("apiVersion: holdfast.dev/v1alpha1\nkind: DigestCacheEntry\nmetadata: {{name: kept}}\nspec: {{reference: registry.example/app:1.0.0, scope: anonymous, digest: 'sha256:{}', state: Fresh, checkedAt: '2026-01-01T00:00:00Z', resolvedAt: '2026-01-01T00:00:00Z'}}\n", "0".repeat(64)),
        )?;
        let status = json!({"status": {
            "observedDigest": format!("sha256:{}", "0".repeat(64)),
            "lastCheckTime": "2026-01-01T00:00:00Z",
            "usedBy": 2,
            "conditions": [{"type": "Resolved", "status": "True", "reason": "Resolved", "message": "resolved", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
            "lastRefresh": {"at": "2026-01-01T00:00:00Z", "request": "r1", "result": "Checked"},
        }});
        kubectl_ok(
            env,
            &[
                "patch",
                CRD,
                "kept",
                "-n",
                namespace,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ],
        )?;
        let before = env.kubectl_get(CRD, "kept", namespace)?;
        ensure!(
            before["status"]["usedBy"] == 2,
            "the entry's status was not written: {before}"
        );
        Ok(Self {
            namespace: namespace.into(),
            before,
        })
    }

    /// Fails unless the entry is the same object with the same spec and status as written.
    pub fn check(&self, env: &Env, when: &str) -> Result<()> {
        let entry = env.kubectl_get(CRD, "kept", &self.namespace)?;
        ensure!(
            entry["metadata"]["uid"] == self.before["metadata"]["uid"]
                && entry["spec"] == self.before["spec"]
                && entry["status"] == self.before["status"],
            "{when} replaced or changed the digest cache entry: {} -> {entry}",
            self.before
        );
        Ok(())
    }
}

/// Fails unless an entry written with [`NEW_FIELD`] stores it: the next release's CRD is the
/// cluster's (an old CRD's structural schema would prune the field).
pub fn new_field_is_stored(env: &Env, namespace: &str) -> Result<()> {
    env.kubectl_apply(
        namespace,
        &format!("apiVersion: holdfast.dev/v1alpha1\nkind: DigestCacheEntry\nmetadata: {{name: newer}}\nspec: {{reference: registry.example/app:2.0.0, scope: anonymous, digest: 'sha256:{}', state: Fresh, checkedAt: '2026-01-01T00:00:00Z', resolvedAt: '2026-01-01T00:00:00Z', {NEW_FIELD}: written}}\n", "1".repeat(64)),
    )?;
    let newer = env.kubectl_get(CRD, "newer", namespace)?;
    ensure!(
        newer["spec"][NEW_FIELD] == "written",
        "the next version's field was pruned: the CRD was not upgraded ({})",
        newer["spec"]
    );
    Ok(())
}

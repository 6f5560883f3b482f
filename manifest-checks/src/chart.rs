//! The Helm chart (`charts/holdfast`, which the Carvel package templates too) held to
//! `manifests/`: for the same [`Settings`], `helm template` renders exactly what `kubectl
//! kustomize` renders of an overlay of manifests/ that makes the same changes, so the chart and
//! the kustomize base cannot drift apart. [`Settings::values`] are the chart's values,
//! [`Settings::kustomize`] the overlay; [`differences`] compares two renderings object by object,
//! [`installed_differences`] what an installer created with what was rendered, allowing only the
//! labels and annotations the installer is listed to add.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::load::{manifests, read, repo};

/// The chart's directory.
pub fn chart() -> PathBuf {
    repo().join("charts/holdfast")
}

/// What a user sets, as chart values and as a kustomize overlay. `Default` is the base as
/// shipped (`kubectl kustomize manifests/`); [`Settings::recommended`] is the chart's defaults.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `(repository, digest)` of the image.
    pub image: Option<(String, String)>,
    pub image_pull_secrets: Vec<String>,
    pub match_conditions: bool,
    pub cert_manager: bool,
    pub insecure_registries: Vec<String>,
    pub policy: Option<Policy>,
    /// More matchExpressions for every webhook's namespaceSelector.
    pub namespace_selector: Vec<Value>,
    pub mirror: Option<Mirror>,
    pub webhook_replicas: Option<u32>,
    pub controller_replicas: Option<u32>,
    pub webhook_resources: Option<Value>,
    pub controller_resources: Option<Value>,
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub allowed_registries: Vec<String>,
    pub require_digests_label: String,
    pub mode: String,
}

#[derive(Debug, Clone)]
pub struct Mirror {
    pub registry: String,
    pub prefix: String,
    pub namespace_selector: String,
    pub pull_secret: String,
    pub secret: String,
}

impl Settings {
    /// `manifests/overlays/recommended`: the chart's default values.
    pub fn recommended() -> Self {
        Self {
            match_conditions: true,
            ..Self::default()
        }
    }

    /// Every setting changed from the shipped value (the webhook's namespaceSelector, the
    /// mirror, the policy, replicas, resources, a private image): the overlay and the chart must
    /// agree on all of them at once.
    pub fn everything_changed() -> Self {
        Self {
            image: Some((
                "registry.example/platform/holdfast".into(),
                format!("sha256:{}", "ab".repeat(32)),
            )),
            image_pull_secrets: vec!["registry-pull".into()],
            match_conditions: true,
            cert_manager: false,
            insecure_registries: vec!["registry.internal:5000".into(), "10.0.0.5".into()],
            policy: Some(Policy {
                allowed_registries: vec!["registry.example".into(), "ghcr.io/corp".into()],
                require_digests_label: "corp.example/digests".into(),
                mode: "audit".into(),
            }),
            namespace_selector: vec![json!({"key": "tenant", "operator": "Exists"})],
            mirror: Some(Mirror {
                registry: "mirror.example".into(),
                prefix: "cache".into(),
                namespace_selector: "holdfast.dev/mirror=true".into(),
                pull_secret: "mirror-pull".into(),
                secret: "holdfast-mirror".into(),
            }),
            webhook_replicas: Some(3),
            controller_replicas: Some(3),
            webhook_resources: Some(
                json!({"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}),
            ),
            controller_resources: Some(json!({"requests": {"cpu": "20m", "memory": "32Mi"}})),
        }
    }

    /// The chart's values for these settings (only what differs from the chart's defaults).
    pub fn values(&self) -> Value {
        let mut values = json!({
            "matchConditions": self.match_conditions,
            "certMode": if self.cert_manager { "cert-manager" } else { "self-managed" },
        });
        if let Some((repository, digest)) = &self.image {
            values["image"] = json!({"repository": repository, "digest": digest});
        }
        if !self.image_pull_secrets.is_empty() {
            values["imagePullSecrets"] = json!(self.image_pull_secrets);
        }
        if !self.insecure_registries.is_empty() {
            values["insecureRegistries"] = json!(self.insecure_registries);
        }
        if let Some(p) = &self.policy {
            values["policy"] = json!({"allowedRegistries": p.allowed_registries, "requireDigestsLabel": p.require_digests_label, "mode": p.mode});
        }
        if !self.namespace_selector.is_empty() {
            values["namespaceSelector"] = json!({"matchExpressions": self.namespace_selector});
        }
        if let Some(m) = &self.mirror {
            values["mirror"] = json!({"registry": m.registry, "prefix": m.prefix, "namespaceSelector": m.namespace_selector, "pullSecret": m.pull_secret, "secret": m.secret});
        }
        for (key, replicas, resources) in [
            ("webhook", self.webhook_replicas, &self.webhook_resources),
            ("controller", self.controller_replicas, &self.controller_resources),
        ] {
            if let Some(r) = replicas {
                values[key]["replicas"] = json!(r);
            }
            if let Some(r) = resources {
                values[key]["resources"] = r.clone();
            }
        }
        values
    }

    /// The registry and mirror flags both binaries get, in the order the chart appends them.
    fn registry_args(&self) -> Vec<String> {
        let mut args: Vec<String> = self
            .insecure_registries
            .iter()
            .map(|r| format!("--insecure-registry={r}"))
            .collect();
        if let Some(m) = &self.mirror {
            args.push(format!("--mirror-registry={}", m.registry));
            args.push(format!("--mirror-prefix={}", m.prefix));
            if !m.namespace_selector.is_empty() {
                args.push(format!("--mirror-namespace-selector={}", m.namespace_selector));
            }
            if !m.pull_secret.is_empty() {
                args.push(format!("--mirror-pull-secret={}", m.pull_secret));
            }
        }
        args
    }

    /// `kubectl kustomize` of the overlay of manifests/ that makes the same changes (written
    /// beside a copy of manifests/ in a scratch directory: kustomize takes no absolute paths).
    pub fn kustomize(&self, kubectl: &Path) -> Result<Vec<Value>> {
        let scratch = tempfile::tempdir()?;
        let dir = scratch.path();
        crate::load::copy_dir(&manifests(), &dir.join("manifests"))?;
        let mut k = json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": ["manifests/base"],
            "components": [],
            "patches": [],
        });
        let components = k["components"].as_array_mut().context("components")?;
        if self.match_conditions {
            components.push(json!("manifests/components/match-conditions"));
        }
        if self.cert_manager {
            components.push(json!("manifests/components/cert-manager"));
        }
        if let Some((repository, digest)) = &self.image {
            k["images"] = json!([{"name": "holdfast", "newName": repository, "digest": digest}]);
        }
        let mut replicas = Vec::new();
        for (name, count) in [
            ("holdfast-webhook", self.webhook_replicas),
            ("holdfast-controller", self.controller_replicas),
        ] {
            if let Some(count) = count {
                replicas.push(json!({"name": name, "count": count}));
            }
        }
        if !replicas.is_empty() {
            k["replicas"] = json!(replicas);
        }
        if let Some(p) = &self.policy {
            // The chart widens the policy webhook to every namespace once registries are
            // restricted; kustomize users add the component.
            if !p.allowed_registries.is_empty() {
                k["components"]
                    .as_array_mut()
                    .context("components")?
                    .push(json!("manifests/components/policy-all-namespaces"));
            }
            std::fs::write(dir.join("policy.yaml"), policy_file(p)?)?;
            k["configMapGenerator"] = json!([{"name": "holdfast-policy", "namespace": crate::HOLDFAST_NAMESPACE, "behavior": "replace", "files": ["policy.yaml=policy.yaml"]}]);
        }
        let mut patches = Vec::new();
        for (name, resources, extra) in [
            ("holdfast-webhook", &self.webhook_resources, Vec::new()),
            (
                "holdfast-controller",
                &self.controller_resources,
                self.mirror
                    .iter()
                    .filter(|m| !m.secret.is_empty())
                    .map(|m| format!("--mirror-secret={}", m.secret))
                    .collect(),
            ),
        ] {
            let mut ops: Vec<Value> = self
                .registry_args()
                .into_iter()
                .chain(extra)
                .map(|a| json!({"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": a}))
                .collect();
            if let Some(r) = resources {
                // Merged into the shipped resources, key by key, as Helm merges values into the
                // defaults (a strategic merge patch of the container).
                let container = name.trim_start_matches("holdfast-");
                let merge = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": crate::HOLDFAST_NAMESPACE}, "spec": {"template": {"spec": {"containers": [{"name": container, "resources": r}]}}}});
                patches.push(json!({"patch": serde_json::to_string(&merge)?}));
            }
            if !self.image_pull_secrets.is_empty() {
                let secrets: Vec<Value> = self
                    .image_pull_secrets
                    .iter()
                    .map(|s| json!({"name": s}))
                    .collect();
                ops.push(
                    json!({"op": "add", "path": "/spec/template/spec/imagePullSecrets", "value": secrets}),
                );
            }
            if !ops.is_empty() {
                patches.push(json!({"target": {"kind": "Deployment", "name": name}, "patch": serde_json::to_string(&ops)?}));
            }
        }
        if !self.namespace_selector.is_empty() {
            let base = crate::load::render(kubectl, &manifests())?;
            for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
                let configuration = base
                    .iter()
                    .find(|o| crate::yaml::kind(o) == kind)
                    .with_context(|| format!("the base has no {kind}"))?;
                let count = crate::yaml::items(configuration, "webhooks").len();
                let ops: Vec<Value> = (0..count)
                    .flat_map(|i| {
                        self.namespace_selector.iter().map(move |e| {
                            json!({"op": "add", "path": format!("/webhooks/{i}/namespaceSelector/matchExpressions/-"), "value": e})
                        })
                    })
                    .collect();
                patches.push(json!({"target": {"kind": kind, "name": "holdfast"}, "patch": serde_json::to_string(&ops)?}));
            }
        }
        k["patches"] = json!(patches);
        std::fs::write(dir.join("kustomization.yaml"), serde_json::to_string_pretty(&k)?)?;
        to_json(crate::load::render(kubectl, dir)?)
    }
}

/// The policy file for these settings, as manifests/base/webhook/policy.yaml writes the
/// shipped one (its comment, then the three keys; the chart writes the same text).
pub fn policy_file(p: &Policy) -> Result<String> {
    let shipped = read(&manifests().join("base/webhook/policy.yaml"))?;
    let comment: String = shipped
        .lines()
        .take_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    Ok(format!(
        "{comment}allowedRegistries: {}\nrequireDigestsLabel: {}\nmode: {}\n",
        serde_json::to_string(&p.allowed_registries)?,
        p.require_digests_label,
        p.mode
    ))
}

/// `helm` as `make deps` builds it (`$HOLDFAST_CACHE/peers/helm/bin/helm`).
pub fn helm() -> Result<PathBuf> {
    let helm = crate::load::peer_dir("helm")
        .map(|d| d.join("bin/helm"))
        .filter(|p| p.is_file());
    helm.context("helm is missing: run `make deps` (scripts/install-deps.sh) first")
}

/// `helm template holdfast charts/holdfast --include-crds` with these values, parsed.
pub fn helm_template(helm: &Path, values: &Value) -> Result<Vec<Value>> {
    let scratch = tempfile::tempdir()?;
    let file = scratch.path().join("values.json");
    std::fs::write(&file, serde_json::to_vec(values)?)?;
    let out = Command::new(helm)
        .args(["template", "holdfast"])
        .arg(chart())
        .arg("--include-crds")
        .arg("--values")
        .arg(&file)
        .output()
        .context("running helm template")?;
    if !out.status.success() {
        bail!("helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    parse(&String::from_utf8(out.stdout)?)
}

/// Every non-empty document of a YAML stream, as JSON.
pub fn parse(text: &str) -> Result<Vec<Value>> {
    to_json(crate::load::parse_documents(text)?)
}

fn to_json(objects: Vec<serde_yaml::Value>) -> Result<Vec<Value>> {
    objects
        .into_iter()
        .map(|o| Ok(serde_json::to_value(o)?))
        .collect()
}

/// `Kind namespace/name` of an object.
pub fn object_id(object: &Value) -> String {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    match object["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

fn by_id(objects: &[Value]) -> BTreeMap<String, &Value> {
    objects.iter().map(|o| (object_id(o), o)).collect()
}

/// How two renderings differ: objects only one has, and the paths where an object's values
/// differ. Empty when they are the same objects.
pub fn differences(expected: &[Value], actual: &[Value]) -> Vec<String> {
    let (expected, actual) = (by_id(expected), by_id(actual));
    let mut out = Vec::new();
    for (id, e) in &expected {
        match actual.get(id) {
            None => out.push(format!("{id}: missing")),
            Some(a) => diff_values(id, "", e, a, &mut out),
        }
    }
    for id in actual.keys().filter(|id| !expected.contains_key(*id)) {
        out.push(format!("{id}: not expected"));
    }
    out
}

fn diff_values(id: &str, path: &str, expected: &Value, actual: &Value, out: &mut Vec<String>) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            let keys: BTreeSet<&String> = e.keys().chain(a.keys()).collect();
            for key in keys {
                let sub = format!("{path}/{key}");
                match (e.get(key), a.get(key)) {
                    (Some(ev), Some(av)) => diff_values(id, &sub, ev, av, out),
                    (Some(ev), None) => out.push(format!("{id}: {sub} missing (expected {ev})")),
                    (None, Some(av)) => out.push(format!("{id}: {sub} not expected ({av})")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(e), Value::Array(a)) if e.len() == a.len() => {
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                diff_values(id, &format!("{path}/{i}"), ev, av, out);
            }
        }
        _ if expected != actual => out.push(format!("{id}: {path} is {actual}, expected {expected}")),
        _ => {}
    }
}

/// The labels and annotations an installer may add to the objects it creates (everything else
/// an installed object has beyond the rendering must be a field the API server fills in).
#[derive(Debug, Clone, Copy)]
pub struct Added {
    pub installer: &'static str,
    /// Keys it adds to `labels` maps (metadata and pod templates) and label selectors.
    pub labels: &'static [&'static str],
    pub annotations: &'static [&'static str],
}

/// What the API server and its controllers add whoever installs: the namespace's name label,
/// the Deployment's revision.
pub const SERVER_ADDS: &[&str] = &["kubernetes.io/metadata.name", "deployment.kubernetes.io/revision"];

/// What Helm adds to every object it installs (`helm install`/`helm upgrade`).
pub const HELM_ADDS: Added = Added {
    installer: "helm",
    labels: &["app.kubernetes.io/managed-by"],
    annotations: &["meta.helm.sh/release-name", "meta.helm.sh/release-namespace"],
};

/// What kapp-controller's steps add to a package's objects: kbld the images it resolved (an
/// annotation on the objects naming an image), kapp its app and association labels (on objects,
/// pod templates and — label scoping — Service and workload selectors) and its bookkeeping
/// annotations.
pub const PACKAGE_ADDS: Added = Added {
    installer: "kapp-controller (kbld, kapp)",
    labels: &["kapp.k14s.io/app", "kapp.k14s.io/association"],
    annotations: &[
        "kbld.k14s.io/images",
        "kapp.k14s.io/identity",
        "kapp.k14s.io/original",
        "kapp.k14s.io/original-diff-md5",
        "kapp.k14s.io/disable-original",
        "kapp.k14s.io/nonce",
    ],
};

/// How an installed object differs from its rendering, beyond what `added` lists and the
/// fields the API server fills in: a value the rendering sets that the object does not have (or
/// has otherwise), a list of another length, and a label, selector or annotation key that
/// neither the rendering nor `added` has. (Fields the rendering leaves out — defaults, status,
/// metadata the server writes — are not differences.)
pub fn installed_differences(rendered: &Value, installed: &Value, added: Added) -> Vec<String> {
    let mut out = Vec::new();
    contained(&object_id(rendered), "", rendered, installed, added, &mut out);
    out
}

fn contained(id: &str, path: &str, rendered: &Value, installed: &Value, added: Added, out: &mut Vec<String>) {
    match (rendered, installed) {
        (Value::Object(r), Value::Object(i)) => {
            let last = path.rsplit('/').next().unwrap_or_default();
            let string_map = i.values().all(Value::is_string);
            let allowed: Option<&[&str]> = match last {
                "labels" | "matchLabels" => Some(added.labels),
                "selector" if string_map => Some(added.labels),
                "annotations" => Some(added.annotations),
                _ => None,
            };
            for (key, value) in r {
                let sub = format!("{path}/{key}");
                match i.get(key) {
                    Some(iv) => contained(id, &sub, value, iv, added, out),
                    None => out.push(format!("{id}: {sub} missing (rendered {value})")),
                }
            }
            let not_listed = |key: &str, allowed: &[&str], out: &mut Vec<String>, at: &str| {
                if !allowed.contains(&key) && !SERVER_ADDS.contains(&key) {
                    out.push(format!(
                        "{id}: {at}/{key} was added, and {} is not listed to add it",
                        added.installer
                    ));
                }
            };
            for key in i.keys().filter(|k| !r.contains_key(*k)) {
                if let Some(allowed) = allowed {
                    not_listed(key, allowed, out, path);
                }
                // A labels or annotations map the rendering does not have at all.
                let inner = match key.as_str() {
                    "labels" => Some(added.labels),
                    "annotations" => Some(added.annotations),
                    _ => None,
                };
                if let (Some(inner), Some(Value::Object(map))) = (inner, i.get(key)) {
                    for k in map.keys() {
                        not_listed(k, inner, out, &format!("{path}/{key}"));
                    }
                }
            }
        }
        (Value::Array(r), Value::Array(i)) if r.len() == i.len() => {
            for (n, (rv, iv)) in r.iter().zip(i).enumerate() {
                contained(id, &format!("{path}/{n}"), rv, iv, added, out);
            }
        }
        // Compared as written: the API server writes resource quantities back in canonical
        // form ("0.5" as "500m"), and the manifests already use that form, so a value that comes
        // back otherwise is a difference.
        _ if rendered != installed => out.push(format!("{id}: {path} is {installed}, rendered {rendered}")),
        _ => {}
    }
}

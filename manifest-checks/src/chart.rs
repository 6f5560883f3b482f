//! The Helm chart (`charts/holdfast`, which the Carvel package templates too) held to
//! `manifests/`: for the same [`Settings`], `helm template -n NAMESPACE` renders exactly what
//! `kubectl kustomize` renders of an overlay of manifests/ that makes the same changes (every
//! component is a value), so the chart and the kustomize base cannot drift apart.
//! [`Settings::values`] are the chart's values, [`Settings::kustomize`] the overlay (for another
//! namespace than the base's, its rendering with `holdfast-system` replaced in every string:
//! names, subjects, selectors, the fence's CEL); [`differences`] compares two renderings object by object,
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
/// shipped (`kubectl kustomize manifests/`) in `holdfast-system`, its Namespace left to the
/// installer; [`Settings::recommended`] is the chart's defaults.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// The release's namespace (`helm -n`); `None`: the base's, `holdfast-system`.
    pub namespace: Option<String>,
    /// `namespace.create`: the Namespace object is rendered (the base's, with its Pod Security
    /// labels).
    pub create_namespace: bool,
    /// `crds.install: false`: the CRD is managed elsewhere (kustomize: the CRD deleted).
    pub without_crds: bool,
    /// `crds.keep: false`: the CRD goes with the release (kustomize: its keep annotations removed).
    pub crds_not_kept: bool,
    /// `(repository, digest)` of the image.
    pub image: Option<(String, String)>,
    pub image_pull_secrets: Vec<String>,
    pub match_conditions: bool,
    pub cert_manager: bool,
    pub insecure_registries: Vec<String>,
    /// `proxy.https`, `proxy.http`, `proxy.noProxy` (kustomize: the same environment patched in).
    pub proxy: Option<Proxy>,
    /// `registryCA.configMap` (components/registry-ca, whose ConfigMap is `holdfast-registry-ca`).
    pub registry_ca: Option<String>,
    /// `registryCA.secret` instead: `registry_ca` names a Secret (kustomize: the component's
    /// volume patched to it).
    pub registry_ca_secret: bool,
    pub policy: Option<Policy>,
    /// More matchExpressions for every webhook's namespaceSelector.
    pub namespace_selector: Vec<Value>,
    pub mirror: Option<Mirror>,
    pub webhook_replicas: Option<u32>,
    pub controller_replicas: Option<u32>,
    pub webhook_resources: Option<Value>,
    pub controller_resources: Option<Value>,
    /// `carvel.enabled: false`: only the Korifi half.
    pub without_carvel: bool,
    /// `korifi.enabled: false`: only the Carvel half.
    pub without_korifi: bool,
    /// `korifi.deleteOrgSpaces` (components/fast-org-deletion).
    pub delete_org_spaces: bool,
    /// `secrets.read: false` (components/no-secret-reads).
    pub no_secret_reads: bool,
    /// `pinningPolicy.enabled: false` (components/no-pinning-policy).
    pub no_pinning_policy: bool,
    /// `policy.failClosed` (components/policy-fail-closed).
    pub policy_fail_closed: bool,
    /// `networkPolicy.egress` (components/restrict-egress).
    pub egress: Option<Egress>,
    /// `networkPolicy.webhookPort` (components/restrict-webhook-port).
    pub webhook_port: Option<WebhookPort>,
    /// `webhook.timeoutSeconds` of every webhook.
    pub timeout_seconds: Option<u32>,
    /// `controller.refreshSeconds`.
    pub refresh_seconds: Option<u32>,
    /// `monitoring.podMonitors`, `prometheusRule` and `dashboard` (components/monitoring).
    pub monitoring: bool,
    /// The webhook's pod values.
    pub webhook: Pods,
    /// The controller's pod values.
    pub controller: Pods,
}

/// `proxy.*`: `None` leaves a field at its default (`https` and `http` empty, `noProxy` the
/// chart's).
#[derive(Debug, Clone, Default)]
pub struct Proxy {
    pub https: Option<String>,
    pub http: Option<String>,
    pub no_proxy: Option<String>,
}

/// The chart's default `proxy.noProxy`.
pub const DEFAULT_NO_PROXY: &str = ".svc,.cluster.local,localhost,127.0.0.1";

impl Proxy {
    /// The environment both containers get: none without a proxy.
    fn env(&self) -> Vec<Value> {
        if self.https.is_none() && self.http.is_none() {
            return Vec::new();
        }
        let no_proxy = self.no_proxy.as_deref().unwrap_or(DEFAULT_NO_PROXY);
        [
            ("HTTPS_PROXY", self.https.as_deref()),
            ("HTTP_PROXY", self.http.as_deref()),
            ("NO_PROXY", Some(no_proxy)),
        ]
        .into_iter()
        .filter_map(|(name, value)| {
            value
                .filter(|v| !v.is_empty())
                .map(|v| json!({"name": name, "value": v}))
        })
        .collect()
    }
}

/// `networkPolicy.egress.enabled` with these addresses.
#[derive(Debug, Clone)]
pub struct Egress {
    pub api_server_cidrs: Vec<String>,
    pub api_server_ports: Vec<u16>,
    pub registry_cidrs: Vec<String>,
    pub registry_ports: Vec<u16>,
}

/// `networkPolicy.webhookPort.restrict` with these values.
#[derive(Debug, Clone)]
pub struct WebhookPort {
    pub pod_cidr: String,
    pub kapp_controller_namespace: String,
}

/// A component's PodDisruptionBudget values.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub enabled: bool,
    pub min_available: u32,
    /// 0: unset.
    pub max_unavailable: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            enabled: true,
            min_available: 1,
            max_unavailable: 0,
        }
    }
}

/// A component's scheduling and extension values (unset: the chart's defaults).
#[derive(Debug, Clone, Default)]
pub struct Pods {
    pub log_level: Option<String>,
    pub budget: Option<Budget>,
    pub node_selector: Option<Value>,
    pub tolerations: Option<Value>,
    /// Merged into the default affinity (the replicas' podAntiAffinity).
    pub affinity: Option<Value>,
    pub topology_spread_constraints: Option<Value>,
    pub priority_class_name: Option<String>,
    pub pod_annotations: Option<Value>,
    pub pod_labels: Option<Value>,
    pub extra_args: Vec<String>,
    pub extra_env: Option<Value>,
    pub extra_volumes: Option<Value>,
    pub extra_volume_mounts: Option<Value>,
}

impl Pods {
    /// Every value set (for the component named `component`).
    pub fn everything(component: &str) -> Self {
        Self {
            log_level: Some(format!("holdfast_{component}=debug,info")),
            // Another minAvailable that three replicas satisfy (maxUnavailable: tests/chart.rs).
            budget: Some(Budget {
                enabled: true,
                min_available: 2,
                max_unavailable: 0,
            }),
            node_selector: Some(json!({"node-role.example/platform": "true"})),
            tolerations: Some(
                json!([{"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}]),
            ),
            affinity: Some(
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}}),
            ),
            topology_spread_constraints: Some(
                json!([{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app.kubernetes.io/component": component, "app.kubernetes.io/name": "holdfast"}}}]),
            ),
            priority_class_name: Some("system-cluster-critical".into()),
            pod_annotations: Some(json!({"example.com/scrape": "true", "team": "platform"})),
            pod_labels: Some(json!({"example.com/cost-center": "platform"})),
            extra_args: vec!["--registry-timeout-ms=1500".into()],
            extra_env: Some(json!([{"name": "HOLDFAST_EXTRA", "value": component}])),
            extra_volumes: Some(json!([{"name": "ca-certs", "configMap": {"name": "corp-ca"}}])),
            extra_volume_mounts: Some(
                json!([{"name": "ca-certs", "mountPath": "/etc/ssl/corp", "readOnly": true}]),
            ),
        }
    }

    fn values(&self) -> Value {
        let mut v = json!({});
        let mut set = |key: &str, value: &Option<Value>| {
            if let Some(value) = value {
                v[key] = value.clone();
            }
        };
        set("nodeSelector", &self.node_selector);
        set("tolerations", &self.tolerations);
        set("affinity", &self.affinity);
        set("topologySpreadConstraints", &self.topology_spread_constraints);
        set("podAnnotations", &self.pod_annotations);
        set("podLabels", &self.pod_labels);
        set("extraEnv", &self.extra_env);
        set("extraVolumes", &self.extra_volumes);
        set("extraVolumeMounts", &self.extra_volume_mounts);
        if let Some(l) = &self.log_level {
            v["logLevel"] = json!(l);
        }
        if let Some(p) = &self.priority_class_name {
            v["priorityClassName"] = json!(p);
        }
        if !self.extra_args.is_empty() {
            v["extraArgs"] = json!(self.extra_args);
        }
        if let Some(b) = self.budget {
            v["podDisruptionBudget"] = json!({"enabled": b.enabled, "minAvailable": b.min_available, "maxUnavailable": b.max_unavailable});
        }
        v
    }
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
            proxy: Some(Proxy {
                https: Some("http://proxy.corp.example:3128".into()),
                http: Some("http://proxy.corp.example:3128".into()),
                no_proxy: Some(".svc,.cluster.local,registry.corp.example,10.0.0.0/8".into()),
            }),
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
            ..Self::default()
        }
    }

    /// Every component and value at once with the other half off: `--set carvel.enabled=false`
    /// or `korifi.enabled=false` with everything that half still has changed.
    pub fn one_half(carvel: bool) -> Self {
        Self {
            without_carvel: !carvel,
            without_korifi: carvel,
            ..Self::all_components()
        }
    }

    /// Every component of manifests/components/ at once (the chart's value of each), with every
    /// other value changed too, in another namespace that the chart creates.
    pub fn all_components() -> Self {
        Self {
            namespace: Some("platform-holdfast".into()),
            create_namespace: true,
            cert_manager: true,
            delete_org_spaces: true,
            no_secret_reads: true,
            no_pinning_policy: true,
            policy_fail_closed: true,
            egress: Some(Egress {
                api_server_cidrs: vec!["10.96.0.1/32".into(), "192.168.10.0/24".into()],
                api_server_ports: vec![16443],
                registry_cidrs: vec!["0.0.0.0/0".into()],
                registry_ports: vec![443, 8443],
            }),
            webhook_port: Some(WebhookPort {
                pod_cidr: "10.42.0.0/16".into(),
                kapp_controller_namespace: "carvel-system".into(),
            }),
            timeout_seconds: Some(8),
            refresh_seconds: Some(300),
            monitoring: true,
            // Not the name the component ships: the chart names the ConfigMap.
            registry_ca: Some("corp-registry-ca".into()),
            // Not the name no-secret-reads' Role ships: the chart names the mirror's Secret.
            mirror: Some(Mirror {
                registry: "mirror.example".into(),
                prefix: "cache".into(),
                namespace_selector: "holdfast.dev/mirror=true".into(),
                pull_secret: "mirror-pull".into(),
                secret: "mirror-credentials".into(),
            }),
            webhook: Pods::everything("webhook"),
            controller: Pods::everything("controller"),
            ..Self::everything_changed()
        }
    }

    /// The namespace holdfast goes to.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(crate::HOLDFAST_NAMESPACE)
    }

    /// `helm template -n` [`Settings::namespace`] with [`Settings::values`].
    pub fn helm_template(&self, helm: &Path) -> Result<Vec<Value>> {
        helm_template_in(helm, self.namespace(), &self.values())
    }

    /// The chart's values for these settings (only what differs from the chart's defaults).
    pub fn values(&self) -> Value {
        let mut values = json!({
            "matchConditions": self.match_conditions,
            "certMode": if self.cert_manager { "cert-manager" } else { "self-managed" },
        });
        if self.create_namespace {
            values["namespace"] = json!({"create": true});
        }
        if self.without_crds {
            values["crds"]["install"] = json!(false);
        }
        if self.crds_not_kept {
            values["crds"]["keep"] = json!(false);
        }
        if self.without_carvel {
            values["carvel"] = json!({"enabled": false});
        }
        if self.without_korifi {
            values["korifi"] = json!({"enabled": false});
        }
        if self.delete_org_spaces {
            values["korifi"]["deleteOrgSpaces"] = json!(true);
        }
        if self.no_secret_reads {
            values["secrets"] = json!({"read": false});
        }
        if self.no_pinning_policy {
            values["pinningPolicy"] = json!({"enabled": false});
        }
        if let Some(e) = &self.egress {
            values["networkPolicy"]["egress"] = json!({"enabled": true, "apiServerCIDRs": e.api_server_cidrs, "apiServerPorts": e.api_server_ports, "registryCIDRs": e.registry_cidrs, "registryPorts": e.registry_ports});
        }
        if self.monitoring {
            values["monitoring"] = json!({"podMonitors": true, "prometheusRule": true, "dashboard": true});
        }
        if let Some(w) = &self.webhook_port {
            values["networkPolicy"]["webhookPort"] = json!({"restrict": true, "podCIDR": w.pod_cidr, "kappControllerNamespace": w.kapp_controller_namespace});
        }
        if let Some((repository, digest)) = &self.image {
            values["image"] = json!({"repository": repository, "digest": digest});
        }
        if !self.image_pull_secrets.is_empty() {
            values["imagePullSecrets"] = json!(self.image_pull_secrets);
        }
        if let Some(p) = &self.proxy {
            for (key, value) in [("https", &p.https), ("http", &p.http), ("noProxy", &p.no_proxy)] {
                if let Some(value) = value {
                    values["proxy"][key] = json!(value);
                }
            }
        }
        if let Some(name) = &self.registry_ca {
            let key = if self.registry_ca_secret {
                "secret"
            } else {
                "configMap"
            };
            values["registryCA"] = json!({key: name});
        }
        if !self.insecure_registries.is_empty() {
            values["insecureRegistries"] = json!(self.insecure_registries);
        }
        if let Some(p) = &self.policy {
            values["policy"] = json!({"allowedRegistries": p.allowed_registries, "requireDigestsLabel": p.require_digests_label, "mode": p.mode});
        }
        if self.policy_fail_closed {
            values["policy"]["failClosed"] = json!(true);
        }
        if !self.namespace_selector.is_empty() {
            values["namespaceSelector"] = json!({"matchExpressions": self.namespace_selector});
        }
        if let Some(m) = &self.mirror {
            values["mirror"] = json!({"registry": m.registry, "prefix": m.prefix, "namespaceSelector": m.namespace_selector, "pullSecret": m.pull_secret, "secret": m.secret});
        }
        for (key, replicas, resources, pods) in [
            (
                "webhook",
                self.webhook_replicas,
                &self.webhook_resources,
                &self.webhook,
            ),
            (
                "controller",
                self.controller_replicas,
                &self.controller_resources,
                &self.controller,
            ),
        ] {
            let pods = pods.values();
            if pods.as_object().is_some_and(|o| !o.is_empty()) {
                values[key] = pods;
            }
            if let Some(r) = replicas {
                values[key]["replicas"] = json!(r);
            }
            if let Some(r) = resources {
                values[key]["resources"] = r.clone();
            }
        }
        if let Some(t) = self.timeout_seconds {
            values["webhook"]["timeoutSeconds"] = json!(t);
        }
        if let Some(r) = self.refresh_seconds {
            values["controller"]["refreshSeconds"] = json!(r);
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
    /// beside a copy of manifests/ in a scratch directory: kustomize takes no absolute paths):
    /// the components the values stand for, then patches in the order the chart renders. In
    /// another namespace, the rendering with `holdfast-system` replaced in every string.
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
        let (carvel, korifi) = (!self.without_carvel, !self.without_korifi);
        let mut components = Vec::new();
        for (on, component) in [
            (self.match_conditions, "match-conditions"),
            (self.cert_manager, "cert-manager"),
            // The chart widens the policy webhook to every namespace once registries are
            // restricted; kustomize users add the component.
            (
                self.policy
                    .as_ref()
                    .is_some_and(|p| !p.allowed_registries.is_empty()),
                "policy-all-namespaces",
            ),
            (self.policy_fail_closed && carvel, "policy-fail-closed"),
            (self.delete_org_spaces && korifi, "fast-org-deletion"),
            (self.no_secret_reads && carvel, "no-secret-reads"),
            // The pinning policy is the Carvel half's.
            (self.no_pinning_policy || !carvel, "no-pinning-policy"),
            (self.egress.is_some(), "restrict-egress"),
            (self.webhook_port.is_some(), "restrict-webhook-port"),
            (self.monitoring, "monitoring"),
            (self.registry_ca.is_some(), "registry-ca"),
        ] {
            if on {
                components.push(json!(format!("manifests/components/{component}")));
            }
        }
        k["components"] = json!(components);
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
            std::fs::write(dir.join("policy.yaml"), policy_file(p)?)?;
            k["configMapGenerator"] = json!([{"name": "holdfast-policy", "namespace": crate::HOLDFAST_NAMESPACE, "behavior": "replace", "files": ["policy.yaml=policy.yaml"]}]);
        }
        let mut patches = Vec::new();
        let json_patch = |kind: &str, name: &str, ops: &[Value]| -> Result<Value> {
            Ok(json!({"target": {"kind": kind, "name": name}, "patch": serde_json::to_string(ops)?}))
        };
        let delete = |kind: &str, api: &str, name: &str, namespaced: bool| -> Result<Value> {
            let mut metadata = json!({"name": name});
            if namespaced {
                metadata["namespace"] = json!(crate::HOLDFAST_NAMESPACE);
            }
            let patch = json!({"$patch": "delete", "apiVersion": api, "kind": kind, "metadata": metadata});
            Ok(json!({"patch": serde_json::to_string(&patch)?}))
        };
        if !self.create_namespace {
            patches.push(delete("Namespace", "v1", crate::HOLDFAST_NAMESPACE, false)?);
        }
        for crd in crate::HOLDFAST_CRDS {
            if self.without_crds {
                patches.push(delete(
                    "CustomResourceDefinition",
                    "apiextensions.k8s.io/v1",
                    crd,
                    false,
                )?);
            } else if self.crds_not_kept {
                patches.push(json_patch(
                    "CustomResourceDefinition",
                    crd,
                    &[json!({"op": "remove", "path": "/metadata/annotations"})],
                )?);
            }
        }
        let container = "/spec/template/spec/containers/0";
        for (name, resources, pods, count, extra) in [
            (
                "holdfast-webhook",
                &self.webhook_resources,
                &self.webhook,
                self.webhook_replicas,
                Vec::new(),
            ),
            (
                "holdfast-controller",
                &self.controller_resources,
                &self.controller,
                self.controller_replicas,
                self.mirror
                    .iter()
                    .filter(|m| !m.secret.is_empty())
                    .map(|m| format!("--mirror-secret={}", m.secret))
                    .collect(),
            ),
        ] {
            let controller = name == "holdfast-controller";
            let mut ops: Vec<Value> = Vec::new();
            // The component's ConfigMap, renamed: its volume comes after the policy's and
            // cert-manager's in the webhook, first in the controller.
            // Or a Secret in its place.
            if let Some(source) = self
                .registry_ca
                .as_deref()
                .filter(|n| *n != "holdfast-registry-ca" || self.registry_ca_secret)
            {
                let index = if controller {
                    0
                } else {
                    1 + usize::from(self.cert_manager)
                };
                let volume = format!("/spec/template/spec/volumes/{index}");
                ops.push(json!({"op": "test", "path": format!("{volume}/name"), "value": "registry-ca"}));
                if self.registry_ca_secret {
                    ops.push(json!({"op": "remove", "path": format!("{volume}/configMap")}));
                    ops.push(
                        json!({"op": "add", "path": format!("{volume}/secret"), "value": {"secretName": source}}),
                    );
                } else {
                    ops.push(
                        json!({"op": "replace", "path": format!("{volume}/configMap/name"), "value": source}),
                    );
                }
            }
            if controller {
                if let Some(r) = self.refresh_seconds {
                    ops.push(json!({"op": "test", "path": format!("{container}/args/0"), "value": "--refresh-seconds=600"}));
                    ops.push(json!({"op": "replace", "path": format!("{container}/args/0"), "value": format!("--refresh-seconds={r}")}));
                }
                // Only the Carvel half reads Secrets (and publishes pins: no-pinning-policy).
                if !carvel {
                    ops.push(json!({"op": "add", "path": format!("{container}/args/-"), "value": "--read-secrets=false"}));
                }
            }
            let args = self
                .registry_args()
                .into_iter()
                .chain(extra)
                .chain(pods.extra_args.iter().cloned());
            ops.extend(args.map(|a| json!({"op": "add", "path": format!("{container}/args/-"), "value": a})));
            if let Some(level) = &pods.log_level {
                let i = if controller { 2 } else { 1 };
                ops.push(
                    json!({"op": "test", "path": format!("{container}/env/{i}/name"), "value": "RUST_LOG"}),
                );
                ops.push(
                    json!({"op": "replace", "path": format!("{container}/env/{i}/value"), "value": level}),
                );
            }
            for e in self.proxy.iter().flat_map(Proxy::env) {
                ops.push(json!({"op": "add", "path": format!("{container}/env/-"), "value": e}));
            }
            if let Some(Value::Array(env)) = &pods.extra_env {
                ops.extend(
                    env.iter()
                        .map(|e| json!({"op": "add", "path": format!("{container}/env/-"), "value": e})),
                );
            }
            // The webhook mounts its policy (and cert-manager's certificate); the controller
            // nothing but the registry CA.
            for (field, path, values) in [
                ("volumeMounts", container.to_string(), &pods.extra_volume_mounts),
                ("volumes", "/spec/template/spec".to_string(), &pods.extra_volumes),
            ] {
                if let Some(Value::Array(list)) = values {
                    if controller && self.registry_ca.is_none() {
                        ops.push(json!({"op": "add", "path": format!("{path}/{field}"), "value": list}));
                    } else {
                        ops.extend(
                            list.iter().map(
                                |v| json!({"op": "add", "path": format!("{path}/{field}/-"), "value": v}),
                            ),
                        );
                    }
                }
            }
            let spec = "/spec/template/spec";
            for (field, value) in [
                ("nodeSelector", &pods.node_selector),
                ("tolerations", &pods.tolerations),
                ("topologySpreadConstraints", &pods.topology_spread_constraints),
            ] {
                if let Some(value) = value {
                    ops.push(json!({"op": "add", "path": format!("{spec}/{field}"), "value": value}));
                }
            }
            if let Some(p) = &pods.priority_class_name {
                ops.push(json!({"op": "add", "path": format!("{spec}/priorityClassName"), "value": p}));
            }
            if let Some(a) = &pods.pod_annotations {
                ops.push(json!({"op": "add", "path": "/spec/template/metadata/annotations", "value": a}));
            }
            if let Some(Value::Object(labels)) = &pods.pod_labels {
                for (key, value) in labels {
                    let key = key.replace('~', "~0").replace('/', "~1");
                    ops.push(json!({"op": "add", "path": format!("/spec/template/metadata/labels/{key}"), "value": value}));
                }
            }
            if !self.image_pull_secrets.is_empty() {
                let secrets: Vec<Value> = self
                    .image_pull_secrets
                    .iter()
                    .map(|s| json!({"name": s}))
                    .collect();
                ops.push(json!({"op": "add", "path": format!("{spec}/imagePullSecrets"), "value": secrets}));
            }
            if !ops.is_empty() {
                patches.push(json_patch("Deployment", name, &ops)?);
            }
            // Merged into the shipped values, key by key, as Helm merges values into the
            // defaults (a strategic merge patch of the pod template).
            let component = name.trim_start_matches("holdfast-");
            if let Some(r) = resources {
                let merge = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": crate::HOLDFAST_NAMESPACE}, "spec": {"template": {"spec": {"containers": [{"name": component, "resources": r}]}}}});
                patches.push(json!({"patch": serde_json::to_string(&merge)?}));
            }
            if let Some(a) = &pods.affinity {
                let merge = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": crate::HOLDFAST_NAMESPACE}, "spec": {"template": {"spec": {"affinity": a}}}});
                patches.push(json!({"patch": serde_json::to_string(&merge)?}));
            }
            // The budget only where a drain can satisfy it.
            let budget = pods.budget.unwrap_or_default();
            let replicas = count.unwrap_or(2);
            if !budget.enabled || (budget.max_unavailable == 0 && replicas <= budget.min_available) {
                patches.push(delete("PodDisruptionBudget", "policy/v1", name, true)?);
            } else if budget.max_unavailable > 0 {
                patches.push(json_patch(
                    "PodDisruptionBudget",
                    name,
                    &[
                        json!({"op": "remove", "path": "/spec/minAvailable"}),
                        json!({"op": "add", "path": "/spec/maxUnavailable", "value": budget.max_unavailable}),
                    ],
                )?);
            } else if budget.min_available != 1 {
                patches.push(json_patch(
                    "PodDisruptionBudget",
                    name,
                    &[json!({"op": "replace", "path": "/spec/minAvailable", "value": budget.min_available})],
                )?);
            }
        }
        // The base's webhooks, in order; each configuration's patch names them by index.
        let webhooks: [(&str, &[(&str, bool)]); 2] = [
            (
                "MutatingWebhookConfiguration",
                &[
                    ("pin-fetch-refs.holdfast.dev", carvel),
                    ("stamp-owners.holdfast.dev", korifi),
                ],
            ),
            (
                "ValidatingWebhookConfiguration",
                &[
                    ("policy.holdfast.dev", carvel),
                    ("terminating-guard.holdfast.dev", korifi),
                    ("terminating-guard-pods.holdfast.dev", korifi),
                ],
            ),
        ];
        for (kind, hooks) in webhooks {
            let mut ops = Vec::new();
            for (i, (name, _)) in hooks.iter().enumerate() {
                ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": name}));
                ops.extend(self.namespace_selector.iter().map(|e| {
                    json!({"op": "add", "path": format!("/webhooks/{i}/namespaceSelector/matchExpressions/-"), "value": e})
                }));
                if let Some(t) = self.timeout_seconds {
                    ops.push(
                        json!({"op": "replace", "path": format!("/webhooks/{i}/timeoutSeconds"), "value": t}),
                    );
                }
            }
            // The half that is off: its webhooks, last first.
            for (i, _) in hooks.iter().enumerate().rev().filter(|(_, (_, on))| !on) {
                ops.push(json!({"op": "remove", "path": format!("/webhooks/{i}")}));
            }
            if ops.len() > hooks.len() {
                patches.push(json_patch(kind, "holdfast", &ops)?);
            }
        }
        // The pinning policy's bindings serve the namespaces pin-fetch-refs serves.
        if carvel && !self.no_pinning_policy && !self.namespace_selector.is_empty() {
            let ops: Vec<Value> = self
                .namespace_selector
                .iter()
                .map(|e| json!({"op": "add", "path": "/spec/matchResources/namespaceSelector/matchExpressions/-", "value": e}))
                .collect();
            for binding in crate::policies::PINNING_POLICIES {
                patches.push(json_patch("MutatingAdmissionPolicyBinding", binding, &ops)?);
            }
        }
        // The half that is off: its RBAC rows (by index in manifests/base/rbac/, last first,
        // each tested), and the fence's rows of what the fast finalizer may delete.
        let mut controller_rules = Vec::new();
        let rule = |ops: &mut Vec<Value>, i: usize, resource: &str| {
            ops.push(json!({"op": "test", "path": format!("/rules/{i}/resources/0"), "value": resource}));
            ops.push(json!({"op": "remove", "path": format!("/rules/{i}")}));
        };
        if !carvel {
            rule(&mut controller_rules, 10, "events");
            rule(&mut controller_rules, 9, "clusterdigestpins");
        }
        if !korifi {
            rule(&mut controller_rules, 8, "pods");
            controller_rules
                .push(json!({"op": "test", "path": "/rules/7/resources/0", "value": "namespaces"}));
            controller_rules
                .push(json!({"op": "replace", "path": "/rules/7/verbs", "value": ["get", "list", "watch"]}));
            for (i, resource) in [(6, "cfpackages"), (5, "cfapps"), (4, "builds"), (3, "images")] {
                rule(&mut controller_rules, i, resource);
            }
            let mut webhook_rules = Vec::new();
            for (i, resource) in [(3, "images"), (2, "buildworkloads"), (1, "cfapps")] {
                rule(&mut webhook_rules, i, resource);
            }
            patches.push(json_patch("ClusterRole", "holdfast-webhook", &webhook_rules)?);
            patches.push(json_patch(
                "ValidatingAdmissionPolicy",
                "holdfast-controller-fence",
                &[
                    json!({"op": "test", "path": "/spec/variables/1/name", "value": "deletable"}),
                    json!({"op": "replace", "path": "/spec/variables/1/expression", "value": "[]"}),
                ],
            )?);
        }
        if !carvel {
            for (i, resource) in [(2, "packages"), (1, "packagerepositories"), (0, "apps")] {
                rule(&mut controller_rules, i, resource);
            }
            // (no-secret-reads, which deletes them too, is for the Carvel half only.)
            patches.push(delete(
                "ClusterRoleBinding",
                "rbac.authorization.k8s.io/v1",
                "holdfast-read-secrets",
                false,
            )?);
            patches.push(delete(
                "ClusterRole",
                "rbac.authorization.k8s.io/v1",
                "holdfast-read-secrets",
                false,
            )?);
        }
        if !controller_rules.is_empty() {
            patches.push(json_patch(
                "ClusterRole",
                "holdfast-controller",
                &controller_rules,
            )?);
        }
        // The one Secret no-secret-reads leaves readable: the mirror's, by its name.
        if let Some(m) = self.mirror.as_ref().filter(|m| {
            self.no_secret_reads && carvel && !m.secret.is_empty() && m.secret != "holdfast-mirror"
        }) {
            patches.push(json_patch(
                "Role",
                "holdfast-mirror-secret",
                &[json!({"op": "replace", "path": "/rules/0/resourceNames/0", "value": m.secret})],
            )?);
        }
        if let Some(e) = &self.egress {
            let to = |cidrs: &[String]| -> Value {
                cidrs.iter().map(|c| json!({"ipBlock": {"cidr": c}})).collect()
            };
            let ports = |ports: &[u16]| -> Value {
                ports
                    .iter()
                    .map(|p| json!({"port": p, "protocol": "TCP"}))
                    .collect()
            };
            patches.push(json_patch(
                "NetworkPolicy",
                "holdfast-egress",
                &[
                    json!({"op": "replace", "path": "/spec/egress/1/to", "value": to(&e.api_server_cidrs)}),
                    json!({"op": "replace", "path": "/spec/egress/1/ports", "value": ports(&e.api_server_ports)}),
                    json!({"op": "replace", "path": "/spec/egress/2/to", "value": to(&e.registry_cidrs)}),
                    json!({"op": "replace", "path": "/spec/egress/2/ports", "value": ports(&e.registry_ports)}),
                ],
            )?);
        }
        if let Some(w) = &self.webhook_port {
            patches.push(json_patch(
                "NetworkPolicy",
                "holdfast-webhook",
                &[
                    json!({"op": "replace", "path": "/spec/ingress/0/from/0/ipBlock/except/0", "value": w.pod_cidr}),
                    json!({"op": "replace", "path": "/spec/ingress/0/from/1/namespaceSelector/matchLabels/kubernetes.io~1metadata.name", "value": w.kapp_controller_namespace}),
                ],
            )?);
        }
        k["patches"] = json!(patches);
        std::fs::write(dir.join("kustomization.yaml"), serde_json::to_string_pretty(&k)?)?;
        let rendered = to_json(crate::load::render(kubectl, dir)?)?;
        Ok(match self.namespace.as_deref() {
            Some(ns) if ns != crate::HOLDFAST_NAMESPACE => {
                rendered.into_iter().map(|o| in_namespace(o, ns)).collect()
            }
            _ => rendered,
        })
    }
}

/// `object` with `holdfast-system` replaced by `namespace` in every string (keys included):
/// what the chart templates as `.Release.Namespace`.
pub fn in_namespace(object: Value, namespace: &str) -> Value {
    renamed(object, crate::HOLDFAST_NAMESPACE, namespace)
}

/// `object` with `from` replaced by `to` in every string (keys included).
pub fn renamed(object: Value, from: &str, to: &str) -> Value {
    match object {
        Value::String(s) => Value::String(s.replace(from, to)),
        Value::Array(a) => Value::Array(a.into_iter().map(|v| renamed(v, from, to)).collect()),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| (k.replace(from, to), renamed(v, from, to)))
                .collect(),
        ),
        other => other,
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

/// `helm template holdfast charts/holdfast -n holdfast-system --include-crds` with these values,
/// parsed.
pub fn helm_template(helm: &Path, values: &Value) -> Result<Vec<Value>> {
    helm_template_in(helm, crate::HOLDFAST_NAMESPACE, values)
}

/// `helm template holdfast charts/holdfast -n NAMESPACE --include-crds` with these values,
/// parsed: the release's objects, without its hooks ([`helm_hooks`]), which `helm install`
/// creates only when their event comes and which kustomize has no counterpart of.
pub fn helm_template_in(helm: &Path, namespace: &str, values: &Value) -> Result<Vec<Value>> {
    let all = render(helm, namespace, values, TESTED)?;
    Ok(all.into_iter().filter(|o| !is_hook(o)).collect())
}

/// The API server a rendering is for: what the chart asks `.Capabilities` about
/// (`pinningPolicy.enabled: auto`).
#[derive(Debug, Clone, Copy)]
pub struct ApiServer {
    /// `--kube-version`.
    pub version: &'static str,
    /// `--api-versions`, of those the chart asks about.
    pub serves: &'static [&'static str],
}

/// The tested API server (Kubernetes 1.37): every rendering but [`helm_template_for`]'s is for it.
pub const TESTED: ApiServer = ApiServer {
    version: "1.37.2",
    serves: &["admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"],
};

/// [`helm_template`] for another API server than [`TESTED`].
pub fn helm_template_for(helm: &Path, values: &Value, server: ApiServer) -> Result<Vec<Value>> {
    let all = render(helm, crate::HOLDFAST_NAMESPACE, values, server)?;
    Ok(all.into_iter().filter(|o| !is_hook(o)).collect())
}

/// The chart's hooks (objects annotated `helm.sh/hook`) for these values, in holdfast-system.
pub fn helm_hooks(helm: &Path, values: &Value) -> Result<Vec<Value>> {
    let all = render(helm, crate::HOLDFAST_NAMESPACE, values, TESTED)?;
    Ok(all.into_iter().filter(is_hook).collect())
}

fn is_hook(object: &Value) -> bool {
    !object["metadata"]["annotations"]["helm.sh/hook"].is_null()
}

fn render(helm: &Path, namespace: &str, values: &Value, server: ApiServer) -> Result<Vec<Value>> {
    let scratch = tempfile::tempdir()?;
    let file = scratch.path().join("values.json");
    std::fs::write(&file, serde_json::to_vec(values)?)?;
    let mut command = Command::new(helm);
    command
        .args(["template", "holdfast"])
        .arg(chart())
        .args(["--namespace", namespace])
        .arg("--include-crds")
        .args(["--kube-version", server.version]);
    for version in server.serves {
        command.args(["--api-versions", version]);
    }
    let out = command
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

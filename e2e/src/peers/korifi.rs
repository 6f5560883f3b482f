//! The real Korifi controllers (`e2e/peers/korifi`, v0.18.0: the `controllers` binary, which also
//! runs the kpack-image-builder, statefulset-runner and job-task-runner controllers and every
//! webhook) as one process against the local control plane, as the admin user, on top of the real
//! kpack ([`crate::peers::Kpack`]) at the release Korifi v0.18.0 is built against, v0.17.1
//! ([`Korifi::KPACK`]; v0.17.2 denies the Images it writes). [`cf`] writes what the Korifi API would (orgs, spaces, apps,
//! packages, builds); everything after that is Korifi's, kpack's and Kubernetes' own doing.
//!
//! Routes, configuration and deviations (what differs from a helm install, and why):
//! - **Configuration.** `CONTROLLERSCONFIG` names a directory holding `config.yaml`, rendered from
//!   the chart's `controllers/configmap.yaml` with its default values (root namespace `cf`,
//!   registry secret `image-registry-credentials`, reconcilers `kpack-image-builder` and
//!   `statefulset-runner`, cache 2048 MB), except: `clusterBuilderName` names kpack's ClusterBuilder
//!   (the chart's `kpackImageBuilder.clusterBuilderName`: an existing builder instead of the
//!   paketo one it would create), `containerRepositoryPrefix` is the local registry's
//!   `korifi/`, and **`disableRouteController: true`**: the route controller needs the Gateway API
//!   (HTTPRoute CRDs, a Gateway), which is not installed; no scenario here has routes. Its
//!   `namespaceLabels` carry [`SCOPE`], so that a test webhook can serve the org and space
//!   namespaces Korifi makes.
//! - **Fixed ports in a network namespace of its own** ([`Netns`]): v0.18.0's `main` never calls
//!   `flag.Parse`, so the Deployment's flags are ignored and it always serves metrics on `:8080`
//!   (as kpack's webhook serves probes), probes on `:8081` and webhooks on `:9443`. Inside the
//!   namespace kube-apiserver's and the registry's ports are relayed in; 9443 is published on a
//!   free host port.
//! - **Webhooks.** The chart's three webhook manifests (`controllers/`, `kpack-image-builder/`,
//!   `statefulset-runner/` `manifests.yaml`) are applied with their helm placeholders filled in,
//!   `service.port` set to the published port; the Service `korifi-controllers-webhook-service`
//!   is an ExternalName naming 127.0.0.1. cert-manager does not run: the harness issues the
//!   serving certificate for `korifi-controllers-webhook-service.korifi.svc` ([`ServingCert`]),
//!   writes it where controller-runtime reads it (`$TMPDIR/k8s-webhook-server/serving-certs`,
//!   `TMPDIR` pointing into the environment's directory) and puts its CA in the `caBundle`s.
//! - **Objects the chart or its hooks create**: namespaces `korifi` and `cf`, the roles of
//!   `controllers/cf_roles/`, the runners' ServiceAccounts `korifi-app` and `korifi-task`
//!   (`*/runner-rbac.yaml`), `kpack-service-account` in `cf` (as
//!   `kpack-image-builder/service-account.yaml` renders it),
//!   the registry Secret (a dockerconfigjson for the local, anonymous registry), and the
//!   post-install hooks' BuilderInfo `kpack-image-builder` and RunnerInfo `statefulset-runner`.
//!   The Deployment and the controllers' own RBAC are not applied: it runs as the admin user.
//! - Leader election off (the chart turns it on, but the flag is never parsed either).
//!
//! Measured here (2 shared cores): start (on a running kpack) ~3.5–4.5 s; an org, a space and a
//! pushed app staged and running ~5–10 s. An org with 3 apps is deleted in ~60 s
//! ([`org_deletion`]).

pub mod cf;
pub mod org_deletion;

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use base64::Engine as _;
use kube::{
    Api,
    api::{DynamicObject, GroupVersionKind},
    core::ApiResource,
};
use serde_json::{Value, json};

use crate::{
    access::Access,
    netns::{Netns, Spawn},
    peers::{Kpack, condition, manifests, once_admitted, serving_cert::ServingCert, until_while_running},
    process::ServerProcess,
    tools::peer_bin,
};

/// The value of [`crate::webhook::SCOPE_LABEL`] on every org and space namespace Korifi makes
/// (its `namespaceLabels`): a test webhook registered with this scope serves them.
pub const SCOPE: &str = "korifi";

/// The release namespace, as the chart's install instructions name it.
pub const NAMESPACE: &str = "korifi";
/// The chart's `rootNamespace`: CFOrgs live here.
pub const ROOT_NAMESPACE: &str = "cf";
pub const REGISTRY_SECRET: &str = "image-registry-credentials";
/// The ServiceAccount kpack builds Korifi's Images with (the chart's `builderServiceAccount`).
pub const BUILDER_SERVICE_ACCOUNT: &str = "kpack-service-account";
const WEBHOOK_SERVICE: &str = "korifi-controllers-webhook-service";
const WEBHOOK_CERT_SECRET: &str = "korifi-controllers-webhook-cert";
/// Hard-coded in `controllers/main.go`.
const WEBHOOK_PORT: u16 = 9443;
const WEBHOOK_MANIFESTS: [&str; 3] = [
    "helm/korifi/controllers/manifests.yaml",
    "helm/korifi/kpack-image-builder/manifests.yaml",
    "helm/korifi/statefulset-runner/manifests.yaml",
];
const RUNNER_SERVICE_ACCOUNTS: [&str; 2] = [
    "helm/korifi/statefulset-runner/runner-rbac.yaml",
    "helm/korifi/job-task-runner/runner-rbac.yaml",
];
const ROLES: [&str; 7] = [
    "cf_admin",
    "cf_org_manager",
    "cf_org_user",
    "cf_root_namespace_user",
    "cf_space_auditor",
    "cf_space_developer",
    "cf_space_manager",
];
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running Korifi; stopped when dropped.
#[derive(Debug)]
pub struct Korifi {
    process: Option<ServerProcess>,
    /// Closed after the process stops.
    netns: Option<Netns>,
    repository_prefix: String,
}

impl Korifi {
    /// The kpack release Korifi v0.18.0 runs on (see [`crate::peers::kpack::V0_17_1`]).
    pub const KPACK: crate::peers::kpack::Release = crate::peers::kpack::V0_17_1;

    pub(crate) async fn start(env: &Access, kpack: &Kpack, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let registry_port: u16 = env
            .registry()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("registry address without a port")?;
        let mut netns = Netns::new("korifi", &[env.apiserver_port(), registry_port]).await?;
        let webhook_port = netns.publish(WEBHOOK_PORT).await?;
        let cert = ServingCert::for_service(WEBHOOK_SERVICE, NAMESPACE)?;
        let tmp = dir.join("tmp");
        let cert_dir = tmp.join("k8s-webhook-server/serving-certs");
        std::fs::create_dir_all(&cert_dir)?;
        std::fs::write(cert_dir.join("tls.crt"), &cert.cert_pem)?;
        std::fs::write(cert_dir.join("tls.key"), &cert.key_pem)?;
        install(env, webhook_port, &cert)?;

        let repository_prefix = format!("{}/korifi/", env.cluster_registry());
        let config_dir = dir.join("config");
        std::fs::create_dir_all(&config_dir)?;
        std::fs::write(
            config_dir.join("config.yaml"),
            controllers_config(kpack.cluster_builder(), &repository_prefix),
        )?;
        let process = netns
            .spawn(Spawn {
                name: "korifi-controllers",
                program: peer_bin("korifi", "korifi-controllers")?,
                args: Vec::new(),
                envs: vec![
                    ("CONTROLLERSCONFIG", config_dir.display().to_string()),
                    ("KUBECONFIG", env.kubeconfig().display().to_string()),
                    ("TMPDIR", tmp.display().to_string()),
                ],
                log: dir.join("controllers.log"),
            })
            .await?;
        let mut this = Self {
            process: Some(process),
            netns: Some(netns),
            repository_prefix,
        };
        let processes = this
            .process
            .as_mut()
            .map(std::slice::from_mut)
            .unwrap_or_default();
        let access = env.clone();
        once_admitted(
            processes,
            "Korifi's post-install objects",
            START_TIMEOUT,
            move || manifests::apply(&access, &post_install()),
        )
        .await
        .with_context(|| this.log_tail(20))?;
        this.wait_for_builder_info(env).await?;
        Ok(this)
    }

    /// The BuilderInfo is Ready once the kpack-image-builder has read kpack's ClusterBuilder.
    async fn wait_for_builder_info(&mut self, env: &Access) -> Result<()> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(env.client().await?, ROOT_NAMESPACE, &resource("BuilderInfo"));
        let wait =
            kube::runtime::wait::await_condition(api, "kpack-image-builder", |b: Option<&DynamicObject>| {
                b.is_some_and(|b| condition(b, "Ready") == Some(true))
            });
        let processes = self
            .process
            .as_mut()
            .map(std::slice::from_mut)
            .unwrap_or_default();
        until_while_running(
            processes,
            "Korifi's BuilderInfo to become Ready",
            START_TIMEOUT,
            wait,
        )
        .await?;
        Ok(())
    }

    /// Where Korifi's kpack Images push droplets (`containerRepositoryPrefix`), as the cluster
    /// names the registry; the Korifi API uploads packages there too.
    pub fn repository_prefix(&self) -> &str {
        &self.repository_prefix
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process
            .as_ref()
            .map(|p| format!("== korifi-controllers\n{}", p.log_tail(lines)))
            .unwrap_or_default()
    }

    pub fn stop(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.stop(Duration::from_secs(5));
        }
        self.netns.take();
    }
}

/// The namespaces, roles, root-namespace objects, webhook configurations and loopback Service.
fn install(env: &Access, webhook_port: u16, cert: &ServingCert) -> Result<()> {
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ROOT_NAMESPACE}}),
        registry_secret(env.cluster_registry()),
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": BUILDER_SERVICE_ACCOUNT,
                "namespace": ROOT_NAMESPACE,
                "annotations": {
                    "cloudfoundry.org/propagate-service-account": "true",
                    "cloudfoundry.org/propagate-deletion": "false",
                },
            },
            "secrets": [{"name": REGISTRY_SECRET}],
            "imagePullSecrets": [{"name": REGISTRY_SECRET}],
        }),
        manifests::loopback_service(NAMESPACE, WEBHOOK_SERVICE),
    ];
    // The apps' and tasks' ServiceAccounts, which the CFSpace controller propagates.
    for runner in RUNNER_SERVICE_ACCOUNTS {
        docs.extend(manifests::documents(
            "korifi",
            runner,
            &[("{{ .Values.rootNamespace }}", ROOT_NAMESPACE)],
        )?);
    }
    for role in ROLES {
        docs.extend(manifests::documents(
            "korifi",
            &format!("helm/korifi/controllers/cf_roles/{role}.yaml"),
            &[],
        )?);
    }
    let ca_bundle = cert.ca_bundle();
    let placeholders = [
        ("{{ .Release.Namespace }}", NAMESPACE),
        ("{{ .Values.controllers.webhookCertSecret }}", WEBHOOK_CERT_SECRET),
        ("{{ include \"korifi.webhookCaBundle\" . }}", ca_bundle.as_str()),
    ];
    for file in WEBHOOK_MANIFESTS {
        for mut doc in manifests::documents("korifi", file, &placeholders)? {
            manifests::route_webhooks(&mut doc, webhook_port);
            docs.push(doc);
        }
    }
    manifests::apply(env, &docs)
}

/// What the chart's post-install hooks create (`kubectl apply` in a Job).
fn post_install() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "korifi.cloudfoundry.org/v1alpha1",
            "kind": "BuilderInfo",
            "metadata": {"name": "kpack-image-builder", "namespace": ROOT_NAMESPACE},
        }),
        json!({
            "apiVersion": "korifi.cloudfoundry.org/v1alpha1",
            "kind": "RunnerInfo",
            "metadata": {"name": "statefulset-runner", "namespace": ROOT_NAMESPACE},
            "spec": {"runnerName": "statefulset-runner"},
        }),
    ]
}

/// A dockerconfigjson for the local registry (anonymous: the credentials are never checked, but
/// Korifi propagates and kpack mounts the Secret as in a cluster).
fn registry_secret(registry: &str) -> Value {
    let auth = base64::engine::general_purpose::STANDARD.encode("e2e:e2e");
    let config = json!({"auths": {registry: {"username": "e2e", "password": "e2e", "auth": auth}}});
    json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": REGISTRY_SECRET, "namespace": ROOT_NAMESPACE},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": config.to_string()},
    })
}

/// The chart's `controllers/configmap.yaml` rendered with its default values (see the module
/// docs for the three that differ, and `namespaceLabels`, which carries [`SCOPE`]).
fn controllers_config(cluster_builder: &str, repository_prefix: &str) -> String {
    format!(
        "includeKpackImageBuilder: true
includeJobTaskRunner: true
includeStatefulsetRunner: true
builderName: kpack-image-builder
runnerName: statefulset-runner
cfProcessDefaults:
  memoryMB: 1024
  diskQuotaMB: 1024
cfRootNamespace: {ROOT_NAMESPACE}
containerRegistrySecretNames:
- {REGISTRY_SECRET:?}
taskTTL: 720h
namespaceLabels:
  {scope_label}: {SCOPE}
extraVCAPApplicationValues:
  cf_api: https://api.korifi.invalid
maxRetainedPackagesPerApp: 5
maxRetainedBuildsPerApp: 5
logLevel: info
clusterBuilderName: {cluster_builder}
builderReadinessTimeout: 30s
containerRepositoryPrefix: {repository_prefix:?}
builderServiceAccount: {BUILDER_SERVICE_ACCOUNT}
cfStagingResources:
  buildCacheMB: 2048
  diskMB: 0
  memoryMB: 0
jobTTL: 24h
networking:
  gatewayNamespace: korifi-gateway
  gatewayName: korifi
experimentalManagedServicesEnabled: false
trustInsecureServiceBrokers: false
disableRouteController: true
",
        scope_label = crate::webhook::SCOPE_LABEL,
    )
}

/// The `korifi.cloudfoundry.org/v1alpha1` resource of `kind` (plural: the lowercase kind plus
/// `s`, or `es` after an `s`, as its CRDs name them).
pub fn resource(kind: &str) -> ApiResource {
    let kind_lower = kind.to_lowercase();
    let plural = if kind_lower.ends_with('s') {
        format!("{kind_lower}es")
    } else {
        format!("{kind_lower}s")
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("korifi.cloudfoundry.org", "v1alpha1", kind),
        &plural,
    )
}

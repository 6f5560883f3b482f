//! The real kpack (`e2e/peers/kpack`, v0.17.2; or `e2e/peers/kpack-0.17.1` for Korifi, see
//! [`Release`]) as two processes against the local control plane,
//! the way its release runs it: `kpack-webhook` (knative's defaulting, validation and conversion
//! webhooks and the certificate controller that feeds them) and `kpack-controller` (every
//! reconciler: Image, Build, builders, stacks, stores, lifecycles, SourceResolver), each with the
//! environment of its Deployment in `config/controller.yaml` / `config/webhook.yaml`, in the
//! system namespace `kpack`, as the admin user. With them run the real local-path-provisioner
//! ([`LocalPathProvisioner`]: build caches are PVCs), the stack images and cluster objects of
//! [`stack`], and the stand-in for build pods' containers ([`BuildSteps`]).
//!
//! Routes and deviations (what differs from a cluster, and why):
//! - **Webhooks.** kpack's own `config/webhook.yaml` is applied (the two webhook configurations
//!   and the empty `webhook-certs` Secret, not the Deployment) with `service.port` set to the
//!   webhook's published port (below); the Service `kpack-webhook` is an ExternalName naming
//!   127.0.0.1 ([`manifests::loopback_service`]). knative's certificate controller fills the
//!   Secret with a CA and a serving certificate for `kpack-webhook.kpack.svc`, and its
//!   reconcilers write the rules, `caBundle` and paths into the webhook configurations and the
//!   CRDs' conversion webhooks: all as in a cluster (the start waits for it).
//! - **Conversion.** kpack's CRDs (installed at boot) name port 443 of that Service for
//!   conversion; the start points them at the webhook's port instead.
//! - **The webhook runs in a network namespace of its own** ([`Netns`]): knative serves its health
//!   probes on `:8080`, hard-coded (`injection.HealthCheckDefaultPort`), as Korifi's controllers
//!   serve their metrics. Inside it listens on its release ports (webhook 8443, profiling 8008,
//!   probes 8080); kube-apiserver's port is relayed in, the webhook port published on a free
//!   host port, which the webhook configurations name.
//! - **No metrics ports in use:** `DEFAULT_METRICS_BACKEND=none` (the release exports Prometheus
//!   metrics on :9090); the controller's profiling port (`PROFILING_PORT`, default :8008) is free.
//! - **Build pods' images** (`BUILD_INIT_IMAGE` and the like, from ConfigMaps in the release)
//!   name `e2e.invalid/kpack/…`: nothing pulls them. Their containers' work is [`BuildSteps`].
//! - **Buildpacks, stack and lifecycle** are the minimal images of [`stack`], in the local
//!   registry; kpack builds its builder image from them and pushes it there, as in a cluster.
//! - **kwok nodes** carry `kubernetes.io/os`/`arch` and report `ephemeral-storage`, as a
//!   kubelet registers its node (build pods select the OS; Korifi's app pods request storage).
//! - Priority classes, SLSA attestations, injected-sidecar mode: off, as the release defaults.
//!
//! Measured here (2 shared cores): start to a Ready ClusterBuilder ~1.5–3 s; an Image from
//! create to a succeeded Build and a Ready Image ~6–9 s, of which ~3 s is the provisioner's
//! helper pod (kwok completes it after 2 s) and 2 s the build pod's run.

pub mod build_steps;
pub mod stack;

use std::{
    path::Path,
    sync::{
        PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};
use k8s_openapi::{
    api::admissionregistration::v1::MutatingWebhookConfiguration,
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams},
    core::ApiResource,
};
use serde_json::json;

pub use build_steps::BuildSteps;

use crate::{
    access::Access,
    netns::{Netns, Spawn},
    peers::{LocalPathProvisioner, condition, manifests, once_admitted, until_while_running},
    process::{ServerProcess, free_port},
    tools::peer_bin,
};

/// A kpack release the harness runs: its build under `$HOLDFAST_CACHE/peers/<peer>/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub version: &'static str,
    peer: &'static str,
}

/// The current release (with kpack#1945: Images and Builds may not take build env from Secrets).
pub const V0_17_2: Release = Release {
    version: "0.17.2",
    peer: "kpack",
};
/// The release Korifi v0.18.0 is built against (its go.mod) and was released with. v0.17.2
/// denies the Images Korifi v0.18.0 writes for every app whose VCAP Secrets exist
/// (`spec.build.env[].valueFrom.secretKeyRef`: "secretKeyRef is not supported for build
/// environment variables"), so Korifi runs on this one. Same CRDs as v0.17.2.
pub const V0_17_1: Release = Release {
    version: "0.17.1",
    peer: "kpack-0.17.1",
};

/// The last release before kpack#1820 (its primary handlers still reconcile Images and Builds
/// being deleted): the org-deletion benchmark's "v0.16" pair, with Korifi v0.18.0 (Korifi
/// v0.14.0, the release of the seed bug, is refused by the Go module proxy). Served with the
/// v0.17 CRDs the control plane installs (the same `v1alpha2` schema for what Korifi writes).
pub const V0_16_1: Release = Release {
    version: "0.16.1",
    peer: "kpack-0.16.1",
};

/// kpack's system namespace, as its release names it.
pub const NAMESPACE: &str = "kpack";
const WEBHOOK_SERVICE: &str = "kpack-webhook";
const DEFAULTING_WEBHOOK: &str = "defaults.webhook.kpack.io";
/// The webhook's port in its release (`defaultWebhookPort`), inside its network namespace.
const WEBHOOK_PORT: u16 = 8443;
/// The CRDs kpack's webhook converts (v1alpha1 ⇄ v1alpha2).
const CONVERTED: [&str; 4] = [
    "images.kpack.io",
    "builds.kpack.io",
    "builders.kpack.io",
    "sourceresolvers.kpack.io",
];
/// The ServiceAccount the controller runs as in the release (`SYSTEM_SERVICE_ACCOUNT`); the
/// ClusterBuilder pushes its image with its (here: no) secrets.
const CONTROLLER_SA: &str = "controller";
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running kpack; stopped when dropped.
#[derive(Debug)]
pub struct Kpack {
    release: Release,
    /// The webhook (and, while starting, the controller).
    processes: Vec<ServerProcess>,
    /// The controller, once started; `None` while [`Kpack::stop_controller`] holds it stopped.
    controller: std::sync::Mutex<Option<ServerProcess>>,
    /// How to start the controller again, and how many times it was.
    controller_spawn: ControllerSpawn,
    restarts: AtomicUsize,
    storage: LocalPathProvisioner,
    build_steps: BuildSteps,
    /// Where the webhook runs; closed after the processes stop.
    webhook_netns: Option<Netns>,
}

impl Kpack {
    pub(crate) async fn start(env: &Access, dir: &Path, release: Release) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let storage = LocalPathProvisioner::start(env, &dir.join("storage"))?;
        let mut netns = Netns::new("kpack-webhook", &[env.apiserver_port()]).await?;
        let webhook_port = netns.publish(WEBHOOK_PORT).await?;
        install(env, webhook_port).await?;

        let kubeconfig = format!("--kubeconfig={}", env.kubeconfig().display());
        let common = [
            ("SYSTEM_NAMESPACE", NAMESPACE.to_string()),
            ("CONFIG_LOGGING_NAME", "config-logging".into()),
            ("CONFIG_OBSERVABILITY_NAME", "config-observability".into()),
            ("METRICS_DOMAIN", "kpack.io".into()),
            ("DEFAULT_METRICS_BACKEND", "none".into()),
        ];
        let mut controller_env = common.to_vec();
        controller_env.extend([
            ("PROFILING_PORT", free_port()?.to_string()),
            ("SYSTEM_SERVICE_ACCOUNT", CONTROLLER_SA.into()),
            ("ENABLE_PRIORITY_CLASSES", "false".into()),
            ("INJECTED_SIDECAR_SUPPORT", "false".into()),
            ("EXPERIMENTAL_GENERATE_SLSA_ATTESTATION", "false".into()),
            ("INSECURE_SSH_TRUST_UNKNOWN_HOSTS", "true".into()),
            ("SCALING_FACTOR", "1".into()),
        ]);
        for (var, step) in [
            ("BUILD_INIT_IMAGE", "build-init"),
            ("BUILD_WAITER_IMAGE", "build-waiter"),
            ("REBASE_IMAGE", "rebase"),
            ("COMPLETION_IMAGE", "completion"),
        ] {
            controller_env.push((var, format!("e2e.invalid/kpack/{step}:v{}", release.version)));
        }
        let mut processes = vec![
            netns
                .spawn(Spawn {
                    name: "kpack-webhook",
                    program: peer_bin(release.peer, "kpack-webhook")?,
                    args: vec![kubeconfig.clone()],
                    envs: common.to_vec(),
                    log: dir.join("webhook.log"),
                })
                .await?,
        ];
        let controller_spawn = ControllerSpawn {
            program: peer_bin(release.peer, "kpack-controller")?,
            args: vec![kubeconfig],
            envs: controller_env,
            dir: dir.to_path_buf(),
        };
        processes.push(controller_spawn.spawn(0)?);
        let mut this = Self {
            release,
            processes,
            controller: std::sync::Mutex::new(None),
            controller_spawn,
            restarts: AtomicUsize::new(0),
            storage,
            build_steps: BuildSteps::start(env.client().await?),
            webhook_netns: Some(netns),
        };
        this.wait_for_webhook(env).await?;
        let objects = stack::push(
            env.registry(),
            env.cluster_registry(),
            (NAMESPACE, CONTROLLER_SA),
            release == V0_16_1,
        )
        .await?;
        let access = env.clone();
        once_admitted(
            &mut this.processes,
            "kpack's stack, store, lifecycle and builder",
            START_TIMEOUT,
            move || access.kubectl_apply(NAMESPACE, &objects),
        )
        .await?;
        this.wait_for_builder(env).await?;
        let controller = this.processes.pop();
        *this.controller.get_mut().unwrap_or_else(PoisonError::into_inner) = controller;
        Ok(this)
    }

    /// Stops the controller (SIGTERM): nothing reconciles Images or Builds until
    /// [`Kpack::start_controller`]; the webhook keeps serving. The org-deletion benchmark's
    /// no-churn floor deletes an org so, with nothing left to rebuild.
    pub fn stop_controller(&self) {
        let stopped = self
            .controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut controller) = stopped {
            controller.stop(Duration::from_secs(5));
        }
    }

    /// Starts the controller again after [`Kpack::stop_controller`] (a no-op while it runs); it
    /// lists and reconciles everything anew, as after a restart in a cluster.
    pub fn start_controller(&self) -> Result<()> {
        let mut controller = self.controller.lock().unwrap_or_else(PoisonError::into_inner);
        if controller.is_none() {
            let restarts = self.restarts.fetch_add(1, Ordering::Relaxed) + 1;
            *controller = Some(self.controller_spawn.spawn(restarts)?);
        }
        Ok(())
    }

    /// knative has reconciled the webhook configuration once its rules and `caBundle` are in.
    async fn wait_for_webhook(&mut self, env: &Access) -> Result<()> {
        let api: Api<MutatingWebhookConfiguration> = Api::all(env.client().await?);
        let reconciled = |c: Option<&MutatingWebhookConfiguration>| {
            c.and_then(|c| c.webhooks.as_ref())
                .and_then(|w| w.first())
                .is_some_and(|w| {
                    w.client_config.ca_bundle.is_some() && w.rules.as_ref().is_some_and(|r| !r.is_empty())
                })
        };
        let wait = kube::runtime::wait::await_condition(api, DEFAULTING_WEBHOOK, reconciled);
        until_while_running(
            &mut self.processes,
            "kpack's webhook configurations",
            START_TIMEOUT,
            wait,
        )
        .await?;
        Ok(())
    }

    /// The ClusterBuilder is Ready once kpack has read the lifecycle, stack and store images and
    /// pushed the builder image: the controller works end to end.
    async fn wait_for_builder(&mut self, env: &Access) -> Result<()> {
        let api: Api<DynamicObject> = Api::all_with(env.client().await?, &resource("ClusterBuilder"));
        let wait = kube::runtime::wait::await_condition(
            api.clone(),
            stack::CLUSTER_BUILDER,
            |b: Option<&DynamicObject>| b.is_some_and(|b| condition(b, "Ready") == Some(true)),
        );
        if let Err(e) = until_while_running(
            &mut self.processes,
            "the ClusterBuilder to become Ready",
            START_TIMEOUT,
            wait,
        )
        .await
        {
            let status = api
                .get(stack::CLUSTER_BUILDER)
                .await
                .map(|b| b.data["status"].clone())
                .unwrap_or_default();
            bail!("{e:#}; ClusterBuilder status: {status}\n{}", self.log_tail(20));
        }
        Ok(())
    }

    pub fn release(&self) -> Release {
        self.release
    }

    /// The ClusterBuilder every test Image (and Korifi, `clusterBuilderName`) builds with.
    pub fn cluster_builder(&self) -> &str {
        stack::CLUSTER_BUILDER
    }

    /// The ends of kpack's and the provisioner's logs, and why build pods were left running (see
    /// [`BuildSteps`]), for a failing test's message.
    pub fn log_tail(&self, lines: usize) -> String {
        let controller = self.controller.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<String> = self
            .processes
            .iter()
            .chain(controller.as_ref())
            .map(|p| format!("== {}\n{}", p.name(), p.log_tail(lines)))
            .collect();
        out.push(format!(
            "== local-path-provisioner\n{}",
            self.storage.log_tail(lines)
        ));
        out.push(format!(
            "== build steps (errors)\n{}",
            self.build_steps.errors().join("\n")
        ));
        out.join("\n")
    }

    pub fn stop(&mut self) {
        self.build_steps.stop();
        self.stop_controller();
        while let Some(mut p) = self.processes.pop() {
            p.stop(Duration::from_secs(5));
        }
        self.webhook_netns.take();
        self.storage.stop();
    }
}

/// The namespace and ServiceAccount of the release, its `config-logging`, its webhook
/// configurations routed to `port`, the loopback Service, and the CRDs' conversion webhooks.
async fn install(env: &Access, port: u16) -> Result<()> {
    let mut docs = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": CONTROLLER_SA, "namespace": NAMESPACE}}),
    ];
    docs.extend(manifests::of_kinds(
        manifests::documents("kpack", "config/config-logging.yaml", &[])?,
        &["ConfigMap"],
    ));
    let mut webhook = manifests::of_kinds(
        manifests::documents("kpack", "config/webhook.yaml", &[])?,
        &[
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "Secret",
        ],
    );
    webhook
        .iter_mut()
        .for_each(|d| manifests::route_webhooks(d, port));
    docs.extend(webhook);
    docs.push(manifests::loopback_service(NAMESPACE, WEBHOOK_SERVICE));
    manifests::apply(env, &docs)?;

    let crds: Api<CustomResourceDefinition> = Api::all(env.client().await?);
    let patch = json!({"spec": {"conversion": {"webhook": {"clientConfig": {"service": {"port": port}}}}}});
    for crd in CONVERTED {
        crds.patch(crd, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("routing {crd}'s conversion webhook"))?;
    }
    Ok(())
}

/// For a cluster where kpack's webhook does not run (`make bench-apiserver` writes Images and
/// Builds at `v1alpha2` only): the CRDs' conversion set to `None`. Their webhook conversion
/// would fail every read at another version, and the API server's watch cache would relist
/// them all run long, taking CPU from whatever is measured.
pub async fn without_conversion(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let patch = json!({"spec": {"conversion": {"strategy": "None", "webhook": null}}});
    for crd in CONVERTED {
        crds.patch(crd, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("turning {crd}'s conversion webhook off"))?;
    }
    Ok(())
}

/// The `kpack.io/v1alpha2` resource of `kind` (its plural is the lowercase kind plus `s`).
pub fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kpack.io", "v1alpha2", kind),
        &format!("{}s", kind.to_lowercase()),
    )
}

/// The controller's program, arguments and environment, to start it again.
#[derive(Debug)]
struct ControllerSpawn {
    program: std::path::PathBuf,
    args: Vec<String>,
    envs: Vec<(&'static str, String)>,
    dir: std::path::PathBuf,
}

impl ControllerSpawn {
    /// The `n`th start (0: the first), logging to a file of its own.
    fn spawn(&self, n: usize) -> Result<ServerProcess> {
        let log = match n {
            0 => self.dir.join("controller.log"),
            n => self.dir.join(format!("controller.{n}.log")),
        };
        ServerProcess::spawn(
            "kpack-controller",
            &self.program,
            &self.args,
            &as_paths(&self.envs),
            log,
        )
    }
}

/// `(name, value)` pairs as [`ServerProcess::spawn`] takes them.
fn as_paths<'a>(vars: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a Path)> {
    vars.iter().map(|(k, v)| (*k, Path::new(v.as_str()))).collect()
}

//! holdfast's own binaries (`holdfast-webhook`, `holdfast-controller`) run as processes of the
//! environment, as `make up` runs them: the webhook configurations `manifests/overlays/recommended`
//! ships (named `holdfast`, called by URL instead of through the Service), the self-managed
//! certificate with its caBundle injected, and the digest cache in holdfast's namespace. The
//! binaries are taken from beside the running executable (the same cargo profile's `target/`).

use std::path::PathBuf;

use anyhow::{Context, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

use crate::{
    Env,
    process::{free_port, until_http_ok},
    webhook::{create_configurations, shipped_configurations},
};

/// holdfast's namespace, as the manifests install it.
pub const NAMESPACE: &str = "holdfast-system";

/// What to run.
pub struct Options {
    /// Also required of every namespace the webhooks serve (none: every namespace the shipped
    /// selectors take).
    pub scope: Option<LabelSelectorRequirement>,
    /// `holdfast-controller`'s extra arguments; none: no controller.
    pub controller: Option<Vec<String>>,
    /// `holdfast-webhook`'s extra arguments.
    pub webhook: Vec<String>,
}

/// Where the running processes answer.
pub struct Installed {
    /// The webhook's TLS address.
    pub addr: String,
    /// The webhook's admin address (`/metrics`, `/readyz`).
    pub admin: String,
    /// The controller's admin address, when it runs.
    pub controller_admin: Option<String>,
    webhook_args: Vec<String>,
    controller_args: Option<Vec<String>>,
}

/// The process names in the environment ([`Env::pid_of`]).
pub const WEBHOOK: &str = "holdfast-webhook";
pub const CONTROLLER: &str = "holdfast-controller";

/// The `kubectl holdfast` plugin's binary.
pub const KUBECTL_PLUGIN: &str = "kubectl-holdfast";

/// One of holdfast's binaries ([`WEBHOOK`], [`CONTROLLER`], [`KUBECTL_PLUGIN`]), built with the
/// running test's profile.
pub fn binary(name: &str) -> Result<PathBuf> {
    let path = std::env::current_exe()?.with_file_name(name);
    // A test binary runs from the profile's `deps/`; the binaries are one level up.
    let beside_deps = path.parent().and_then(|deps| deps.parent()).map(|p| p.join(name));
    if let Some(up) = beside_deps.filter(|up| !path.exists() && up.exists()) {
        return Ok(up);
    }
    anyhow::ensure!(
        path.exists(),
        "{} is missing: build it with the same profile (cargo build --workspace --bins)",
        path.display()
    );
    Ok(path)
}

/// Creates holdfast's namespace and webhook configurations and starts the processes; returns
/// once the webhook is ready (its caches synced, its certificate served).
pub async fn start(env: &mut Env, options: Options) -> Result<Installed> {
    let (port, admin_port) = (free_port()?, free_port()?);
    create_namespace_and_configurations(env, &format!("https://127.0.0.1:{port}"), options.scope).await?;
    let mut webhook_args = webhook_args(env, port, admin_port);
    webhook_args.extend(options.webhook);
    let (controller_admin, controller_args) = match options.controller {
        Some(extra) => {
            let admin = format!("127.0.0.1:{}", free_port()?);
            let mut args = controller_args(env, &admin);
            args.extend(extra);
            (Some(admin), Some(args))
        }
        None => (None, None),
    };
    let installed = Installed {
        addr: format!("127.0.0.1:{port}"),
        admin: format!("127.0.0.1:{admin_port}"),
        controller_admin,
        webhook_args,
        controller_args,
    };
    installed.spawn(env, WEBHOOK)?;
    if installed.controller_args.is_some() {
        installed.spawn(env, CONTROLLER)?;
    }
    installed.webhook_ready().await?;
    Ok(installed)
}

/// holdfast's namespace and the webhook configurations the manifests ship, calling `url` (a
/// webhook's address, or a front before several).
pub async fn create_namespace_and_configurations(
    env: &Env,
    url: &str,
    scope: Option<LabelSelectorRequirement>,
) -> Result<()> {
    let client = env.client().await?;
    crate::objects::create_namespace(&client, NAMESPACE).await?;
    let (mutating, validating) = shipped_configurations("holdfast", url, scope)?;
    create_configurations(&client, &mutating, &validating).await
}

/// `holdfast-webhook`'s arguments as `make up` runs it, serving on loopback `port` (its
/// certificate for 127.0.0.1, self-managed in [`NAMESPACE`]) with its admin port on
/// `admin_port`.
pub fn webhook_args(env: &Env, port: u16, admin_port: u16) -> Vec<String> {
    vec![
        format!("--addr=127.0.0.1:{port}"),
        format!("--admin-addr=127.0.0.1:{admin_port}"),
        format!("--namespace={NAMESPACE}"),
        "--tls-ip=127.0.0.1".into(),
        "--mutating-webhook-configurations=holdfast".into(),
        "--validating-webhook-configurations=holdfast".into(),
        // The local registry speaks plain HTTP.
        format!("--insecure-registry={}", env.registry()),
    ]
}

/// `holdfast-controller`'s arguments as `make up` runs it, its admin port on `admin`.
pub fn controller_args(env: &Env, admin: &str) -> Vec<String> {
    vec![
        format!("--namespace={NAMESPACE}"),
        format!("--admin-addr={admin}"),
        format!("--insecure-registry={}", env.registry()),
    ]
}

/// Both processes, each also speaking plain HTTP to `registry` (a test's own), once both are
/// ready.
pub async fn start_with_registry(env: &mut Env, registry: &str) -> Result<Installed> {
    let insecure = format!("--insecure-registry={registry}");
    let installed = start(
        env,
        Options {
            scope: None,
            controller: Some(vec![insecure.clone()]),
            webhook: vec![insecure],
        },
    )
    .await?;
    installed.controller_ready().await?;
    Ok(installed)
}

impl Installed {
    /// Starts the process `name` ([`WEBHOOK`] or [`CONTROLLER`]) with its arguments.
    fn spawn(&self, env: &mut Env, name: &'static str) -> Result<()> {
        let args = match name {
            WEBHOOK => &self.webhook_args,
            _ => self
                .controller_args
                .as_ref()
                .context("no controller in this installation")?,
        };
        let kubeconfig = env.kubeconfig().to_path_buf();
        env.spawn_with_env(
            name,
            &binary(name)?,
            args,
            &[("KUBECONFIG", kubeconfig.as_path())],
        )
    }

    /// Stops the process `name` (SIGTERM, as a pod's deletion does; the webhook drains for its
    /// `--shutdown-delay-seconds` first) and starts it again; returns when the new one started,
    /// which is where its time to ready counts from.
    pub fn restart(&self, env: &mut Env, name: &'static str) -> Result<std::time::Instant> {
        env.stop_process(name, std::time::Duration::from_secs(30))?;
        let started = std::time::Instant::now();
        self.spawn(env, name)?;
        Ok(started)
    }

    /// Returns once the webhook's `/readyz` answers 2xx (caches synced, certificate served).
    pub async fn webhook_ready(&self) -> Result<()> {
        until_ready(&self.admin, WEBHOOK).await
    }

    /// Returns once the controller's `/readyz` answers 2xx (its digest cache synced, and it
    /// leads with its Lease renewals on time or follows).
    pub async fn controller_ready(&self) -> Result<()> {
        let admin = self
            .controller_admin
            .as_ref()
            .context("no controller in this installation")?;
        until_ready(admin, CONTROLLER).await
    }
}

/// Returns once the holdfast process `name` whose admin port is `admin` answers `/readyz` 2xx.
pub async fn until_ready(admin: &str, name: &str) -> Result<()> {
    until_http_ok(
        &format!("http://{admin}/readyz"),
        std::time::Duration::from_secs(120),
        || Ok(()),
    )
    .await
    .with_context(|| format!("{name} not ready; see its log in the environment directory"))
}

//! holdfast as the soak runs it: two `holdfast-webhook` processes behind a [`Balancer`] that the
//! shipped webhook configurations call (a Service before a two-replica Deployment), and two
//! `holdfast-controller` processes electing a leader, each reaching the API server through a
//! [`Relay`] of its own so that one replica's link can be cut while the other's stays up. The
//! controllers run as their ServiceAccount, RBAC and fence as `manifests/base` installs them,
//! each with a token bound to a pod of its name, as a replica's projected token is.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result};
use tempfile::TempDir;

use super::load::MIRROR_LABEL;
use crate::{
    Env, accounts,
    installed::{self, CONTROLLER, WEBHOOK},
    process::free_port,
    slow_link::{Balancer, Relay},
};

/// The webhook replicas' process names in the environment.
pub const WEBHOOKS: [&str; 2] = ["holdfast-webhook-a", "holdfast-webhook-b"];
/// The controller replicas' process names, also their identities in the Lease.
pub const CONTROLLERS: [&str; 2] = ["holdfast-controller-a", "holdfast-controller-b"];
/// The ControllerLease the controller replicas compete for (the binary's default).
pub const LEASE: &str = holdfast_controller::leader::LEASE;
/// The controller binary's lease duration: a follower takes over this long after the leader's
/// last renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// One process of holdfast's.
pub struct Replica {
    /// Its process name in the environment ([`WEBHOOKS`], [`CONTROLLERS`]).
    pub name: &'static str,
    /// The webhook's TLS address (none for a controller).
    pub addr: Option<String>,
    /// Its admin address (`/readyz`, `/metrics`).
    pub admin: String,
    /// The controller's link to the API server (none for a webhook).
    pub link: Option<Relay>,
}

impl Replica {
    /// Returns once it answers `/readyz` (a webhook: caches synced, certificate served; a
    /// controller: its cache synced, and leading with renewals on time or following).
    pub async fn ready(&self) -> Result<()> {
        installed::until_ready(&self.admin, self.name).await
    }
}

pub struct Holdfast {
    pub webhooks: Vec<Replica>,
    pub controllers: Vec<Replica>,
    /// What the webhook configurations call.
    pub front: Balancer,
    /// The controllers' kubeconfigs (through their relays).
    _dir: TempDir,
}

impl Holdfast {
    /// Creates holdfast's namespace and webhook configurations (calling the front) and starts
    /// the four processes, each speaking plain HTTP to `registries` (the soak's registry front,
    /// its private registry) and to `mirror` (`--mirror-registry`, for the namespaces labelled
    /// [`MIRROR_LABEL`]), the controllers refreshing every `refresh`, their tokens valid for
    /// `lifetime`; returns once all four are ready.
    pub async fn start(
        env: &mut Env,
        registries: &[&str],
        mirror: &str,
        refresh: Duration,
        lifetime: Duration,
    ) -> Result<Self> {
        let mut insecure: Vec<String> = registries
            .iter()
            .chain([&mirror])
            .map(|registry| format!("--insecure-registry={registry}"))
            .collect();
        // Both processes take the same mirror flags: the controller copies, the webhook pins to
        // the copies it recorded.
        insecure.extend([
            format!("--mirror-registry={mirror}"),
            format!("--mirror-namespace-selector={MIRROR_LABEL}=true"),
        ]);
        let ports = [(free_port()?, free_port()?), (free_port()?, free_port()?)];
        let front = Balancer::start(
            ports
                .iter()
                .map(|(port, _)| format!("127.0.0.1:{port}"))
                .collect(),
        )
        .await?;
        installed::create_namespace_and_configurations(env, &format!("https://{}", front.addr), None).await?;
        accounts::install_rbac(env).await?;
        let kubeconfig = env.kubeconfig().to_path_buf();
        let mut webhooks = Vec::new();
        for (name, (port, admin_port)) in WEBHOOKS.into_iter().zip(ports) {
            let mut args = installed::webhook_args(env, port, admin_port);
            args.extend(insecure.iter().cloned());
            spawn(env, name, WEBHOOK, &args, &kubeconfig)?;
            let replica = Replica {
                name,
                addr: Some(format!("127.0.0.1:{port}")),
                admin: format!("127.0.0.1:{admin_port}"),
                link: None,
            };
            // One after the other: the first creates the certificate Secret the second reads.
            replica.ready().await?;
            webhooks.push(replica);
        }

        let dir = tempfile::Builder::new().prefix("holdfast-soak-").tempdir()?;
        let apiserver = format!("127.0.0.1:{}", env.apiserver_port());
        let mut controllers = Vec::new();
        for name in CONTROLLERS {
            let link = Relay::start(&apiserver).await?;
            let token = accounts::pod_token(env, accounts::CONTROLLER, name, lifetime).await?;
            let through_link = dir.path().join(format!("{name}.kubeconfig"));
            let kubeconfig = kubeconfig_via(
                &accounts::kubeconfig_with_token(env, &token)?,
                &apiserver,
                &link.addr,
            )?;
            std::fs::write(&through_link, kubeconfig)
                .with_context(|| format!("writing {}", through_link.display()))?;
            let admin = format!("127.0.0.1:{}", free_port()?);
            let mut args = installed::controller_args(env, &admin);
            args.extend(insecure.iter().cloned());
            args.extend([
                format!("--identity={name}"),
                format!("--lease-name={LEASE}"),
                format!("--refresh-seconds={}", refresh.as_secs()),
            ]);
            spawn(env, name, CONTROLLER, &args, &through_link)?;
            controllers.push(Replica {
                name,
                addr: None,
                admin,
                link: Some(link),
            });
        }
        for controller in &controllers {
            controller.ready().await?;
        }
        Ok(Self {
            webhooks,
            controllers,
            front,
            _dir: dir,
        })
    }

    /// Every replica, webhooks first.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> {
        self.webhooks.iter().chain(&self.controllers)
    }

    /// The replica whose process is `name`.
    pub fn replica(&self, name: &str) -> Result<&Replica> {
        self.replicas()
            .find(|r| r.name == name)
            .with_context(|| format!("no replica {name}"))
    }
}

/// Starts holdfast's `binary` ([`WEBHOOK`], [`CONTROLLER`]) as the environment's process `name`,
/// reaching the API server as `kubeconfig` says.
fn spawn(env: &mut Env, name: &'static str, binary: &str, args: &[String], kubeconfig: &Path) -> Result<()> {
    env.spawn_with_env(
        name,
        &installed::binary(binary)?,
        args,
        &[("KUBECONFIG", kubeconfig)],
    )
}

/// The kubeconfig `text`, reaching the API server at `via` instead of `apiserver` (the API
/// server's certificate names 127.0.0.1, so the relay's address verifies).
fn kubeconfig_via(text: &str, apiserver: &str, via: &str) -> Result<String> {
    let server = format!("https://{apiserver}");
    anyhow::ensure!(text.contains(&server), "the kubeconfig does not name {server}");
    Ok(text.replace(&server, &format!("https://{via}")))
}

//! What both of holdfast's binaries, `holdfast-webhook` and `holdfast-controller`, run on (the
//! shape of kubert's `Runtime`, at this size): each `main` starts with [`start`], serves its
//! [`admin`] port beside its work and stops on [`terminated`].
//!
//! - [`logs`]: the log lines (`--log-format`: plain text or JSON), holdfast's own formatter.
//! - [`args`]: the registry, digest-cache and mirror flags both binaries take.
//! - [`registry_ca`]: `--registry-ca-file`, loaded and re-read when it changes.
//! - [`admin`]: the plain-HTTP admin port's scaffolding (`/healthz`, `/readyz`, `/metrics` over a
//!   binary's [`admin::Probes`]); each binary keeps its own readiness and metrics.
//! - [`kube_client`]: the API client, with a user agent that names the binary and the replica.

use std::future::Future;

pub mod admin;
pub mod args;
pub mod logs;
pub mod registry_ca;

/// A rustls crypto provider was installed before [`start`].
#[derive(Debug, thiserror::Error)]
#[error("a rustls crypto provider was already installed")]
pub struct ProviderInstalled;

/// The start of both binaries: ring as the process's rustls crypto provider (reqwest and the
/// TLS port are built without one), then the flags `A` (exiting on bad ones, as clap does),
/// then the log lines in the format they name.
pub fn start<A: clap::Parser>(
    log_format: impl FnOnce(&A) -> logs::LogFormat,
) -> Result<A, ProviderInstalled> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| ProviderInstalled)?;
    let args = A::parse();
    logs::init(log_format(&args));
    Ok(args)
}

/// The API client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no Kubernetes configuration (in-cluster or kubeconfig): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("the user agent {0:?} is not a valid header value")]
    UserAgent(String),
    #[error("building the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
}

/// The user agent of `binary`'s requests: `binary/VERSION`, and ` (instance)` when given (the
/// controller's Lease identity, its pod's name).
pub fn user_agent(binary: &str, instance: Option<&str>) -> String {
    let version = env!("CARGO_PKG_VERSION");
    match instance {
        Some(instance) => format!("{binary}/{version} ({instance})"),
        None => format!("{binary}/{version}"),
    }
}

/// The API client of `binary`: the in-cluster configuration (or the kubeconfig), its requests
/// carrying [`user_agent`]. kube-rs sends no user agent of its own, so without it the API
/// server's audit log cannot tell holdfast's requests, or one replica's from another's.
pub async fn kube_client(binary: &str, instance: Option<&str>) -> Result<kube::Client, ClientError> {
    let mut config = kube::Config::infer().await?;
    let agent = user_agent(binary, instance);
    let value = http::HeaderValue::from_str(&agent).map_err(|_| ClientError::UserAgent(agent))?;
    config.headers.push((http::header::USER_AGENT, value));
    Ok(kube::Client::try_from(config)?)
}

/// SIGTERM or SIGINT, whichever comes first, listened for from this call on: the future gives
/// the signal's name (`SIGTERM`, `SIGINT`).
pub fn terminated() -> std::io::Result<impl Future<Output = &'static str> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_the_binary_its_version_and_the_replica() {
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            user_agent("holdfast-controller", Some("holdfast-controller-7d9f-x2k4q")),
            format!("holdfast-controller/{version} (holdfast-controller-7d9f-x2k4q)")
        );
        assert_eq!(
            user_agent("holdfast-webhook", None),
            format!("holdfast-webhook/{version}")
        );
        assert!(http::HeaderValue::from_str(&user_agent("holdfast-webhook", None)).is_ok());
    }
}

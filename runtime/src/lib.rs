//! What both of holdfast's binaries, `holdfast-webhook` and `holdfast-controller`, run on (the
//! shape of kubert's `Runtime`, at this size): each `main` starts with [`start`], serves its
//! [`admin`] port beside its work and stops on [`terminated`].
//!
//! - [`logs`]: the log lines (`--log-format`: plain text or JSON), holdfast's own formatter.
//! - [`args`]: the registry, digest-cache and mirror flags both binaries take.
//! - [`registry_ca`]: `--registry-ca-file`, loaded and re-read when it changes.
//! - [`admin`]: the plain-HTTP admin port's scaffolding (`/healthz`, `/readyz`, `/metrics` over a
//!   binary's [`admin::Probes`]); each binary keeps its own readiness and metrics.

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

//! The real peers, built from their Go modules (`e2e/peers/`), run as processes against the local
//! control plane on demand: a test asks its [`crate::Env`] for the peers it needs.

pub mod kapp_controller;
pub mod kpack;
pub mod local_path_provisioner;
pub mod manifests;

use std::time::Duration;

use anyhow::{Context, Result, bail};

pub use kapp_controller::KappController;
pub use kpack::Kpack;
pub use local_path_provisioner::LocalPathProvisioner;

use crate::process::ServerProcess;

/// Waits for `wait` up to `timeout`, failing at once, with its log, if one of `processes` exits
/// (checked every 250 ms: an exit cannot be watched through the API server).
pub(crate) async fn until_while_running<T, E>(
    processes: &mut [ServerProcess],
    what: &str,
    timeout: Duration,
    wait: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut wait = std::pin::pin!(wait);
    loop {
        tokio::select! {
            done = &mut wait => return done.with_context(|| format!("watching for {what}")),
            () = tokio::time::sleep(Duration::from_millis(250)) => {
                for p in processes.iter_mut() {
                    p.check_running()?;
                }
                if tokio::time::Instant::now() > deadline {
                    let logs: Vec<String> = processes.iter().map(|p| format!("== {}\n{}", p.name(), p.log_tail(20))).collect();
                    bail!("timed out after {timeout:?} waiting for {what}\n{}", logs.join("\n"));
                }
            }
        }
    }
}

//! The real peers, built from their Go modules (`e2e/peers/`), run as processes against the local
//! control plane on demand: a test asks its [`crate::Env`] for the peers it needs —
//! [`Env::kapp_controller`](crate::Env::kapp_controller), [`Env::kpack`](crate::Env::kpack)
//! (with the real local-path-provisioner), [`Env::korifi`](crate::Env::korifi) (on kpack
//! v0.17.1: an environment runs one kpack, so Korifi's tests boot environments of their own).
//! The environment owns them and starts each with only its [`Access`](crate::access::Access)
//! (how its cluster and registry are reached), so no peer module depends on the control plane's.
//!
//! Routes shared by all of them (facts in each module's docs):
//! - a `service:` reference (webhook, APIService, CRD conversion) reaches a peer through a Service
//!   of type ExternalName naming 127.0.0.1 ([`manifests::loopback_service`]), the reference's
//!   `port` naming the peer's port on the host;
//! - peers that listen on ports no flag moves run in a network namespace of their own
//!   ([`crate::netns`]), relayed to the host on loopback;
//! - peers run as the admin user (the `system:masters` kubeconfig), so their RBAC objects are not
//!   applied; their other upstream manifests are ([`manifests`]).

pub mod kapp_controller;
pub mod korifi;
pub mod kpack;
pub mod local_path_provisioner;
pub mod manifests;
pub mod serving_cert;

use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::{Api, api::DynamicObject};

pub use kapp_controller::KappController;
pub use korifi::Korifi;
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

/// Runs `apply` (creating objects a peer's own webhook admits) until it stops failing for want of
/// that webhook ("failed calling webhook": not serving yet, polled — whether a webhook serves
/// cannot be watched), at most `timeout`, failing at once if one of `processes` exits.
///
/// `apply` blocks (kubectl) while the API server calls the peer's webhook, whose bytes may cross
/// a network namespace's relay, a task of this very runtime: run on a worker, a relay task
/// queued there would wait for the worker it blocks (TLS handshakes cut every 10 s under load).
/// So it runs on the blocking pool. Not `block_in_place`: that turns the worker into a
/// blocking-pool thread, which exits when idle, and the control plane's processes forked from
/// it die with it (`PR_SET_PDEATHSIG`, [`crate::process`]).
pub(crate) async fn once_admitted(
    processes: &mut [ServerProcess],
    what: &str,
    timeout: Duration,
    apply: impl Fn() -> Result<()> + Send + Sync + 'static,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let apply = std::sync::Arc::new(apply);
    loop {
        let attempt = apply.clone();
        let applied = tokio::task::spawn_blocking(move || attempt())
            .await
            .context("the apply's thread panicked")?;
        match applied {
            Ok(()) => return Ok(()),
            Err(e)
                if format!("{e:#}").contains("failed calling webhook")
                    && tokio::time::Instant::now() < deadline =>
            {
                for p in processes.iter_mut() {
                    p.check_running()?;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("creating {what}")),
        }
    }
}

/// A condition of a peer's object (kpack's and Korifi's alike): `Some(true)` for `"True"`,
/// `Some(false)` for `"False"`, `None` when missing or `"Unknown"`.
pub fn condition(object: &DynamicObject, kind: &str) -> Option<bool> {
    let c = object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?;
    match c["status"].as_str()? {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    }
}

/// Waits, on a watch, until the condition `kind` of `name` is True. With `false_is_final`, a
/// False fails at once (with the condition's message), as for a Build's `Succeeded`; otherwise
/// False is waited out, as for a `Ready` that a reconcile may still turn True.
pub async fn until_condition(
    api: &Api<DynamicObject>,
    name: &str,
    kind: &str,
    false_is_final: bool,
    timeout: Duration,
) -> Result<DynamicObject> {
    let decided = |o: Option<&DynamicObject>| {
        o.and_then(|o| condition(o, kind))
            .is_some_and(|c| c || false_is_final)
    };
    let waited = tokio::time::timeout(
        timeout,
        kube::runtime::wait::await_condition(api.clone(), name, decided),
    )
    .await;
    let object = match waited {
        Ok(seen) => seen.with_context(|| format!("watching {name}"))?,
        Err(_) => {
            let status = api
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .map(|o| o.data["status"].clone());
            bail!(
                "{name} not {kind} after {timeout:?}; status: {}",
                status.unwrap_or_default()
            );
        }
    }
    .with_context(|| format!("{name} was deleted"))?;
    if condition(&object, kind) != Some(true) {
        bail!("{name} is not {kind}: {}", object.data["status"]["conditions"]);
    }
    Ok(object)
}

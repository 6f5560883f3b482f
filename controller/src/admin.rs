//! The controller's admin port, plain HTTP as the webhook's: `/healthz` (the process answers),
//! `/readyz` (the digest cache synced, and this replica either leads with its Lease renewals
//! current or stands by reading the Lease) and `/metrics` ([`crate::metrics`]).

use std::{
    borrow::Cow,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use holdfast_runtime::admin::{BindError, Probes};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{leader, metrics::Metrics};

/// What readiness reads: kept current by [`crate::run::run_observed`].
#[derive(Debug, Default)]
pub struct Health {
    /// The digest cache has its first full list.
    pub cache_synced: AtomicBool,
    /// This replica's place in the leader election.
    pub election: leader::Status,
}

impl Health {
    /// Ready, and how; or why not.
    pub fn readiness(&self, now: Instant) -> Result<&'static str, &'static str> {
        if !self.cache_synced.load(Ordering::Acquire) {
            return Err("digest cache not synced");
        }
        leader::healthy(self.election.role(), now)
    }
}

struct AdminState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

impl Probes for AdminState {
    fn readiness(&self) -> Result<Cow<'static, str>, Cow<'static, str>> {
        self.health
            .readiness(Instant::now())
            .map(Cow::Borrowed)
            .map_err(Cow::Borrowed)
    }

    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics.set_leader(self.health.election.leading());
        self.metrics.encode()
    }
}

/// Binds `addr` and serves the admin port (`holdfast_runtime::admin`) until `cancel`; returns
/// the bound address.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), BindError> {
    let served =
        holdfast_runtime::admin::serve(addr, Arc::new(AdminState { health, metrics }), cancel).await?;
    tracing::info!(admin_addr = %served.0, "serving /healthz, /readyz and /metrics");
    Ok(served)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_waits_for_the_cache_then_follows_the_election() {
        let health = Health::default();
        let now = Instant::now();
        assert_eq!(health.readiness(now), Err("digest cache not synced"));
        health.cache_synced.store(true, Ordering::Release);
        assert!(health.readiness(now).is_err(), "not in the election yet");
    }
}

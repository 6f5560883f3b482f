//! The controller's admin port, plain HTTP as the webhook's: `/healthz` (the process answers),
//! `/readyz` (the digest cache synced, and this replica either leads with its Lease renewals
//! current or stands by reading the Lease) and `/metrics` ([`crate::metrics`]).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the admin port {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

struct AdminState {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

pub fn router(health: Arc<Health>, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(scrape))
        .with_state(Arc::new(AdminState { health, metrics }))
}

/// Binds `addr` and serves the admin port until `cancel`; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), Error> {
    let bind_error = |source| Error::Bind { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    let app = router(health, metrics);
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(cancel.cancelled_owned());
        if let Err(error) = served.await {
            tracing::error!(%error, "admin server failed");
        }
    });
    tracing::info!(admin_addr = %bound, "serving /healthz, /readyz and /metrics");
    Ok((bound, task))
}

async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    match state.health.readiness(Instant::now()) {
        Ok(how) => (StatusCode::OK, how).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn scrape(State(state): State<Arc<AdminState>>) -> Response {
    state.metrics.set_leader(state.health.election.leading());
    match state.metrics.encode() {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "metrics encoding failed").into_response(),
    }
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

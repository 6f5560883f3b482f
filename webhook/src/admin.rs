//! The admin port: plain HTTP, separate from the TLS admission port, for probes and scrapes.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use holdfast_certs::SwappableCert;

use crate::metrics::Metrics;

/// What readiness waits for. The server starts unready and turns unready first on shutdown.
#[derive(Debug, Default)]
pub struct Readiness {
    pub caches_synced: AtomicBool,
    pub serving: AtomicBool,
    pub shutting_down: AtomicBool,
}

impl Readiness {
    /// Why the server is not ready, if it is not.
    pub fn blockers(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.caches_synced.load(Ordering::Acquire) {
            out.push("caches not synced");
        }
        if !self.serving.load(Ordering::Acquire) {
            out.push("TLS listener not bound");
        }
        if self.shutting_down.load(Ordering::Acquire) {
            out.push("shutting down");
        }
        out
    }
}

pub struct AdminState {
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    pub certificate: Arc<SwappableCert>,
}

pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AdminState>>) -> Response {
    match state.readiness.blockers() {
        blockers if blockers.is_empty() => (StatusCode::OK, "ok").into_response(),
        blockers => (StatusCode::SERVICE_UNAVAILABLE, blockers.join(", ")).into_response(),
    }
}

async fn metrics(State(state): State<Arc<AdminState>>) -> Response {
    let expiry = state.certificate.not_after() - time::OffsetDateTime::now_utc();
    state.metrics.set_certificate_expiry(expiry.as_seconds_f64());
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

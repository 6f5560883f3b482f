//! The admin port of both binaries: plain HTTP, apart from the work (the webhook's TLS port, the
//! controller's reconcilers), for probes and scrapes. `/healthz` answers while the process does;
//! `/readyz` and `/metrics` ask the binary's [`Probes`]: its readiness, and its metrics as
//! OpenMetrics text.

use std::{borrow::Cow, net::SocketAddr, sync::Arc};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a binary's admin port reports.
pub trait Probes: Send + Sync + 'static {
    /// Ready, and how (`/readyz`'s 200 body); or why not (its 503 body).
    fn readiness(&self) -> Result<Cow<'static, str>, Cow<'static, str>>;
    /// Every metric as OpenMetrics text, as of now (figures read at scrape time are set here).
    fn metrics(&self) -> Result<String, std::fmt::Error>;
}

/// The admin port could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("binding the admin port {addr}: {source}")]
pub struct BindError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// `/healthz`, `/readyz` and `/metrics` over `probes`.
pub fn router(probes: Arc<dyn Probes>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(scrape))
        .with_state(probes)
}

/// Binds `addr` and serves [`router`] over `probes` until `cancel`: the bound address, and the
/// task serving it.
pub async fn serve(
    addr: SocketAddr,
    probes: Arc<dyn Probes>,
    cancel: CancellationToken,
) -> Result<(SocketAddr, JoinHandle<()>), BindError> {
    let bind_error = |source| BindError { addr, source };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(bind_error)?;
    let bound = listener.local_addr().map_err(bind_error)?;
    let app = router(probes);
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(cancel.cancelled_owned());
        if let Err(error) = served.await {
            tracing::error!(%error, "admin server failed");
        }
    });
    Ok((bound, task))
}

/// The OpenMetrics text of every metric in `registry`.
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

async fn readyz(State(probes): State<Arc<dyn Probes>>) -> Response {
    match probes.readiness() {
        Ok(how) => (StatusCode::OK, how).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn scrape(State(probes): State<Arc<dyn Probes>>) -> Response {
    match probes.metrics() {
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

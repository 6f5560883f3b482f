//! Serving: the TLS admission port and the plain-HTTP admin port, started together and drained
//! in order (readiness off, in-flight requests finished, then exit).

use std::{future::Future, net::SocketAddr, sync::Arc, sync::atomic::Ordering, time::Duration};

use axum_server::{Handle, tls_rustls::RustlsConfig};
use holdfast_certs::SwappableCert;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{
    admin::{AdminState, Readiness},
    handler::{self, AdmissionState},
    metrics::Metrics,
    rules::RuleContext,
};

#[derive(Debug, Clone)]
pub struct Settings {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub deadline: Duration,
    pub limits: handler::Limits,
    /// A client that opens a connection must finish its TLS handshake within this.
    pub handshake_timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    BindAdmin(#[from] holdfast_runtime::admin::BindError),
    #[error("binding the admission port {0}")]
    BindTls(SocketAddr),
    #[error("TLS configuration: {0}")]
    Tls(#[from] holdfast_certs::CertError),
}

/// A running server; [`Running::shutdown`] drains it.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    handle: Handle<SocketAddr>,
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// Waits for the caches; may never finish (an API that never lists), so it is aborted, not awaited.
    sync_waiter: JoinHandle<()>,
}

/// Binds both ports and serves. Readiness waits for `synced` (the cluster view's first lists).
pub async fn start(
    settings: Settings,
    context: RuleContext,
    synced: impl Future<Output = ()> + Send + 'static,
    certificate: Arc<SwappableCert>,
) -> Result<Running, ServeError> {
    let metrics = Arc::new(Metrics::new(Some(context.cache().clone())).with_peers(context.cluster().clone()));
    let readiness = Arc::new(Readiness::default());
    let cancel = CancellationToken::new();
    let mut tasks = Vec::new();

    let probes = Arc::new(AdminState {
        readiness: readiness.clone(),
        metrics: metrics.clone(),
        certificate: certificate.clone(),
    });
    let (admin_addr, admin) =
        holdfast_runtime::admin::serve(settings.admin_addr, probes, cancel.clone()).await?;
    tasks.push(admin);

    let app = handler::router(
        Arc::new(AdmissionState {
            context,
            metrics: metrics.clone(),
            deadline: settings.deadline,
        }),
        settings.limits,
    );
    let tls = RustlsConfig::from_config(Arc::new(holdfast_certs::server_config(certificate)?));
    let handle = Handle::<SocketAddr>::new();
    let server = axum_server::bind_rustls(settings.addr, tls)
        .map(|acceptor| acceptor.handshake_timeout(settings.handshake_timeout))
        .handle(handle.clone());
    tasks.push(tokio::spawn(async move {
        if let Err(error) = server.serve(app.into_make_service()).await {
            tracing::error!(%error, "admission server failed");
        }
    }));
    let addr = handle
        .listening()
        .await
        .ok_or(ServeError::BindTls(settings.addr))?;
    readiness.serving.store(true, Ordering::Release);

    let synced_flag = readiness.clone();
    let sync_waiter = tokio::spawn(async move {
        synced.await;
        synced_flag.caches_synced.store(true, Ordering::Release);
        tracing::info!("cluster caches synced");
    });
    tracing::info!(%addr, %admin_addr, "serving admission over TLS");
    Ok(Running {
        addr,
        admin_addr,
        readiness,
        metrics,
        handle,
        cancel,
        tasks,
        sync_waiter,
    })
}

impl Running {
    /// Turns unready and keeps serving for `delay` (while the endpoint leaves the Service's
    /// routing), then stops accepting, lets in-flight requests finish within `drain`, and stops.
    pub async fn shutdown(self, delay: Duration, drain: Duration) {
        self.readiness.shutting_down.store(true, Ordering::Release);
        if !delay.is_zero() {
            tracing::info!(
                delay_seconds = delay.as_secs_f64(),
                "unready; serving until the endpoint is gone"
            );
            tokio::time::sleep(delay).await;
        }
        self.handle.graceful_shutdown(Some(drain));
        self.cancel.cancel();
        self.sync_waiter.abort();
        for task in self.tasks {
            let _ = task.await;
        }
        tracing::info!("admission server stopped");
    }
}

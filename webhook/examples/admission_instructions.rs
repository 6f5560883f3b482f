//! Drives `handler::router` in-process (no TLS, no sockets) with the allow-with-no-patch review of
//! `make bench-admission`, under the same `info` log subscriber writing into a sink, so that an
//! instruction counter sees holdfast's own per-admission work exactly and repeatably:
//!
//! ```text
//! cargo build --release -p holdfast-webhook --example admission_instructions
//! valgrind --tool=callgrind target/release/examples/admission_instructions 1000
//! valgrind --tool=callgrind target/release/examples/admission_instructions 3000
//! ```
//!
//! Per admission = (Ir of the 3000 run − Ir of the 1000 run) / 2000. `bare` as a second argument
//! drives the bare handler the benchmark compares against instead.

use std::{sync::Arc, time::Duration};

use axum::{Router, body::Body, http::Request, routing::post};
use bytes::Bytes;
use holdfast_cache::{CacheConfig, DigestCache};
use holdfast_registry::{Resolver, ResolverConfig};
use holdfast_runtime::logs::{self, LogFormat};
use holdfast_webhook::{
    cluster::StaticCluster,
    handler::{self, AdmissionState},
    metrics::Metrics,
    rules::RuleContext,
};
use tower::ServiceExt;
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let format = match std::env::var("BENCH_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Plain,
    };
    let filter = EnvFilter::new(std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into()));
    tracing::subscriber::set_global_default(logs::subscriber(format, filter, false, std::io::sink))?;
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().as_deref().unwrap_or("1000").parse()?;
    let bare = args.next().as_deref() == Some("bare");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let router = if bare { bare_router() } else { holdfast_router()? };
        let body = Bytes::from(REVIEW);
        for _ in 0..count {
            let request = Request::post("/mutate")
                .header("content-type", "application/json")
                .body(Body::from(body.clone()))?;
            let response = router.clone().oneshot(request).await?;
            let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await?;
            std::hint::black_box(bytes);
        }
        Ok(())
    })
}

fn holdfast_router() -> anyhow::Result<Router> {
    let cache = Arc::new(DigestCache::new(
        Arc::new(Resolver::new(ResolverConfig::default())?),
        CacheConfig::default(),
        None,
    ));
    let state = Arc::new(AdmissionState {
        context: RuleContext::new(
            Arc::new(StaticCluster::default()),
            cache,
            Default::default(),
            None,
        ),
        metrics: Arc::new(Metrics::new(None)),
        deadline: Duration::from_secs(3),
    });
    Ok(handler::router(state, handler::Limits::default()))
}

/// The benchmark's bare handler: reads the body, answers a fixed review.
fn bare_router() -> Router {
    Router::new().route(
        "/mutate",
        post(|body: Bytes| async move {
            std::hint::black_box(body);
            ([("content-type", "application/json")], FIXED)
        }),
    )
}

const FIXED: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"0c9a8d74-9cb7-44dd-b98e-09fd62def2f4","allowed":true}}"#;

/// `bench_admission`'s allow-with-no-patch review: a kpack Image whose app does not exist.
const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"0c9a8d74-9cb7-44dd-b98e-09fd62def2f4","kind":{"group":"kpack.io","version":"v1alpha2","kind":"Image"},"resource":{"group":"kpack.io","version":"v1alpha2","resource":"images"},"name":"app","namespace":"space","operation":"CREATE","userInfo":{"username":"system:serviceaccount:cf:korifi"},"object":{"apiVersion":"kpack.io/v1alpha2","kind":"Image","metadata":{"name":"app","namespace":"space","labels":{"korifi.cloudfoundry.org/build-workload-name":"bw"}},"spec":{"tag":"registry.example/app-droplets","builder":{"kind":"ClusterBuilder","name":"b"}}},"oldObject":null,"dryRun":false}}"#;

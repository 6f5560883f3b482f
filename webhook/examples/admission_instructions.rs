//! Drives `handler::router` in-process (no TLS, no sockets) with the reviews of
//! `make bench-admission` (`reviews/`), under the same `info` log subscriber writing into a sink
//! and holdfast-webhook's allocator, so that an instruction counter sees holdfast's own
//! per-admission work exactly and repeatably. `scripts/instructions.sh` runs it under callgrind
//! (`make test` holds the counts to `admission_instructions.baseline`):
//!
//! ```text
//! admission_instructions COUNT [pin|image|bare]
//! ```
//!
//! - `pin` (the default): an App whose tag the digest cache holds, answered with the patch to its
//!   digest (the pinning rule's hot path);
//! - `image`: a kpack Image whose app does not exist, allowed with no patch;
//! - `bare`: that review through the bare handler the benchmark compares against.
//!
//! Per admission = (Ir of a run of N₂ − Ir of a run of N₁) / (N₂ − N₁): the start-up cancels out.

use std::{sync::Arc, time::Duration};

use anyhow::Context as _;
use axum::{Router, body::Body, http::Request, routing::post};
use bytes::Bytes;
use holdfast_cache::{CacheConfig, CacheEntry, CacheKey, DigestCache, Scope};
use holdfast_registry::{Digest, Reference, Resolver, ResolverConfig};
use holdfast_runtime::logs::{self, LogFormat};
use holdfast_webhook::{
    cluster::StaticCluster,
    handler::{self, AdmissionState},
    metrics::Metrics,
    rules::RuleContext,
};
use tower::ServiceExt;
use tracing_subscriber::EnvFilter;

// As holdfast-webhook's main: the allocator is part of the per-admission cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// An App fetching a tag the cache holds (the pinning rule patches it).
const PIN_REVIEW: &str = include_str!("reviews/app-pin.json");
/// A kpack Image whose app does not exist (allowed, no patch).
const IMAGE_REVIEW: &str = include_str!("reviews/image.json");

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
    let mode = args.next().unwrap_or_else(|| "pin".into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (router, review) = match mode.as_str() {
            "pin" => (holdfast_router(Some(pin_tag()?))?, PIN_REVIEW),
            "image" => (holdfast_router(None)?, IMAGE_REVIEW),
            "bare" => (bare_router(), IMAGE_REVIEW),
            other => anyhow::bail!("{other:?}: give pin, image or bare"),
        };
        let body = Bytes::from(review);
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

/// The tag the pin review fetches.
fn pin_tag() -> anyhow::Result<Reference> {
    let review: serde_json::Value = serde_json::from_str(PIN_REVIEW)?;
    let url = review["request"]["object"]["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .context("the pin review names no image")?;
    Ok(Reference::parse(url)?)
}

/// holdfast's router; the cache holds `cached` (as the refresher keeps it).
fn holdfast_router(cached: Option<Reference>) -> anyhow::Result<Router> {
    let cache = Arc::new(DigestCache::new(
        Arc::new(Resolver::new(ResolverConfig::default())?),
        CacheConfig::default(),
        None,
    ));
    if let Some(tag) = cached {
        let key = CacheKey::tag(&tag, Scope::Anonymous);
        cache.insert(CacheEntry::resolved(
            key,
            Digest::sha256_of(b"app config"),
            std::time::SystemTime::now(),
        ));
    }
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

//! `make bench-admission`: admissions/s and p50/p99 latency over TLS with keep-alive on loopback
//! at concurrency 1, 16 and 64, for (a) holdfast answering an allow-with-no-patch review through
//! its real router, rule and logging, and (b) a bare axum + rustls handler returning a fixed
//! body, measured in the same run with the same client. The last line is
//! `ratio=<a/b at 64> p99_ms=<holdfast p99 at 64> rss_mib=<peak RSS of this process>
//! cpu_us_ratio=<holdfast's CPU per admission over the bare server's, at 64>`.
//!
//! Then the pinning rule's hot path: an App whose tag the digest cache holds, patched to its
//! digest, at concurrency 64; the line before the last gives its p99 as the server's own
//! `holdfast_webhook_admission_duration_seconds` histogram records it (a bucket bound).
//!
//! Client, both servers and the TLS stack share this process and its 2 cores, so the ratio is
//! fair and the RSS is an upper bound for the server alone. The two servers take turns in short
//! rounds (holdfast, bare, bare, holdfast, ...) rather than one after the other, so that whatever
//! else the machine runs weighs on both alike. `cpu_us` is the whole process's CPU time (client,
//! TLS, server) per admission: it moves much less than admissions/s when other processes take a
//! core away, so it is the steadier figure to compare the two servers by. The table's rows go to
//! `docs/benchmarks/data/admission.csv` (`holdfast_e2e::bench_data`).

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use axum::{Router, routing::post};
use axum_server::tls_rustls::RustlsConfig;
use holdfast_cache::{CacheConfig, CacheEntry, CacheKey, DigestCache, Scope};
use holdfast_certs::{CaOptions, CertificateAuthority, ServingOptions, SwappableCert, server_config};
use holdfast_e2e::{
    bench_data,
    process::{TICKS_PER_SECOND, Usage},
};
use holdfast_registry::{Digest, Reference, Resolver, ResolverConfig};
use holdfast_runtime::logs::{self, LogFormat};
use holdfast_webhook::{
    cluster::StaticCluster,
    rules::RuleContext,
    server::{self, Settings},
};
use serde::Serialize;
use serde_json::json;

/// The allocator holdfast-webhook ships with (webhook/src/main.rs), so that the handler is
/// measured as it runs in a pod; the bare server shares it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Per server and concurrency.
const WARMUP: Duration = Duration::from_millis(500);
/// Per server and concurrency, in [`ROUNDS`] turns.
const MEASURE: Duration = Duration::from_secs(3);
const ROUNDS: u32 = 6;

struct Figures {
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us: f64,
}

/// One row of the table, as `admission.csv` holds it.
#[derive(Serialize)]
struct Row {
    server: &'static str,
    concurrency: usize,
    admissions_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    cpu_us: f64,
}

/// What one server's turns add up to.
#[derive(Default)]
struct Tally {
    latencies: Vec<Duration>,
    cpu_ticks: u64,
}

fn main() -> Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("crypto provider already installed"))?;
    // Production logs one line per admission: pay for formatting it (holdfast-webhook's own
    // formatter), into a sink. Plain text as holdfast-webhook's default; `BENCH_LOG_FORMAT=json`
    // as its `--log-format=json`. Not a terminal, so no ANSI styling, as in a pod.
    let format = match std::env::var("BENCH_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Plain,
    };
    let filter =
        tracing_subscriber::EnvFilter::new(std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into()));
    tracing::subscriber::set_global_default(logs::subscriber(format, filter, false, std::io::sink))?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run())
}

async fn run() -> Result<()> {
    let ca = CertificateAuthority::generate(&CaOptions::default())?;
    let leaf =
        ca.issue_serving(&ServingOptions::for_service("bench", "bench").with_ip([127, 0, 0, 1].into()))?;
    let resolver = Arc::new(SwappableCert::new(&leaf)?);
    // No registry: the pin phase's tag is in the cache, as the refresher keeps it.
    let cache = Arc::new(DigestCache::new(
        Arc::new(Resolver::new(ResolverConfig::default())?),
        CacheConfig::default(),
        None,
    ));

    let holdfast = server::start(
        Settings {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            deadline: Duration::from_secs(3),
            limits: holdfast_webhook::handler::Limits::default(),
            handshake_timeout: Duration::from_secs(5),
        },
        RuleContext::new(
            Arc::new(StaticCluster::default()),
            cache.clone(),
            Default::default(),
            None,
        ),
        async {},
        resolver.clone(),
    )
    .await?;
    let bare = bare_server(resolver).await?;

    let body = REVIEW.as_bytes().to_vec();
    let ca_pem = reqwest::Certificate::from_pem(ca.cert_pem().as_bytes())?;
    println!(
        "{:<10} {:>5} {:>12} {:>9} {:>9} {:>8}",
        "server", "conc", "admissions/s", "p50_ms", "p99_ms", "cpu_us"
    );
    let mut last = None;
    let mut rows = Vec::new();
    for concurrency in CONCURRENCY {
        let mut servers = Vec::new();
        for (name, addr) in [("holdfast", holdfast.addr), ("bare", bare)] {
            let client = reqwest::Client::builder()
                .tls_certs_only([ca_pem.clone()])
                .http1_only()
                .pool_max_idle_per_host(concurrency)
                .build()?;
            let url = format!("https://127.0.0.1:{}/mutate", addr.port());
            // Opens the connections and warms both sides up.
            drive(&client, &url, &body, concurrency, WARMUP).await?;
            servers.push((name, client, url, Tally::default()));
        }
        for round in 0..ROUNDS {
            // ABBA order: a drift in the machine's load during the run favours neither server.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for i in order {
                let (_, client, url, tally) = &mut servers[i];
                let ticks = Usage::of(None)?.cpu_ticks;
                let latencies = drive(client, url, &body, concurrency, MEASURE / ROUNDS).await?;
                tally.cpu_ticks += Usage::of(None)?.cpu_ticks - ticks;
                tally.latencies.extend(latencies);
            }
        }
        let mut pair = Vec::new();
        for (name, _, _, tally) in servers {
            let figures = figures(tally);
            println!(
                "{name:<10} {concurrency:>5} {:>12.0} {:>9.3} {:>9.3} {:>8.1}",
                figures.per_second, figures.p50_ms, figures.p99_ms, figures.cpu_us
            );
            rows.push(Row {
                server: name,
                concurrency,
                admissions_per_s: figures.per_second,
                p50_ms: figures.p50_ms,
                p99_ms: figures.p99_ms,
                cpu_us: figures.cpu_us,
            });
            pair.push(figures);
        }
        last = Some(pair);
    }
    let pin = pin_phase(&holdfast, &cache, &ca_pem).await?;
    holdfast.shutdown(Duration::ZERO, Duration::from_secs(1)).await;
    println!(
        "{:<10} {:>5} {:>12.0} {:>9.3} {:>9.3} {:>8.1}",
        "pin",
        PIN_CONCURRENCY,
        pin.client.per_second,
        pin.client.p50_ms,
        pin.client.p99_ms,
        pin.client.cpu_us
    );
    println!(
        "pin_p99_ms_server<={} (holdfast_webhook_admission_duration_seconds, rule=pin-fetch-refs, {} admissions)",
        pin.server_p99_bound_ms, pin.server_count
    );
    rows.push(Row {
        server: "pin",
        concurrency: PIN_CONCURRENCY,
        admissions_per_s: pin.client.per_second,
        p50_ms: pin.client.p50_ms,
        p99_ms: pin.client.p99_ms,
        cpu_us: pin.client.cpu_us,
    });
    bench_data::write("admission", &rows)?;
    let pair = last.context("no measurement")?;
    let ratio = pair[0].per_second / pair[1].per_second;
    println!(
        "ratio={ratio:.2} p99_ms={:.3} rss_mib={:.1} cpu_us_ratio={:.2}",
        pair[0].p99_ms,
        Usage::of(None)?.peak_rss_mib(),
        pair[0].cpu_us / pair[1].cpu_us
    );
    Ok(())
}

const PIN_CONCURRENCY: usize = 64;

struct PinFigures {
    client: Figures,
    server_p99_bound_ms: String,
    server_count: u64,
}

/// The hot path of the pinning rule: an App whose tag is in the cache, patched to its digest,
/// at concurrency 64; p99 as the server's own histogram records it (a bucket bound).
async fn pin_phase(
    holdfast: &server::Running,
    cache: &DigestCache,
    ca_pem: &reqwest::Certificate,
) -> Result<PinFigures> {
    let now = std::time::SystemTime::now();
    cache.insert(CacheEntry {
        key: CacheKey::tag(&pin_tag()?, Scope::Anonymous),
        digest: Digest::sha256_of(b"app config"),
        tag: None,
        resolved_at: now,
        checked_at: now,
        error: None,
        secret_uid: None,
    });
    let body = PIN_REVIEW.as_bytes().to_vec();
    let client = reqwest::Client::builder()
        .tls_certs_only([ca_pem.clone()])
        .http1_only()
        .pool_max_idle_per_host(PIN_CONCURRENCY)
        .build()?;
    let url = format!("https://127.0.0.1:{}/mutate", holdfast.addr.port());
    drive(&client, &url, &body, PIN_CONCURRENCY, WARMUP).await?;
    let ticks = Usage::of(None)?.cpu_ticks;
    let latencies = drive(&client, &url, &body, PIN_CONCURRENCY, MEASURE).await?;
    let client = figures(Tally {
        latencies,
        cpu_ticks: Usage::of(None)?.cpu_ticks - ticks,
    });
    let metrics = holdfast_e2e::metrics::scrape(&holdfast.admin_addr.to_string()).await?;
    let (server_p99_bound_ms, server_count) = histogram_p99(&metrics, "rule=\"pin-fetch-refs\"")?;
    Ok(PinFigures {
        client,
        server_p99_bound_ms,
        server_count,
    })
}

/// The smallest bucket bound holding 99% of the observations of the histogram series whose
/// labels contain `labels` (summed over the rest of their labels), in ms, and their count.
fn histogram_p99(metrics: &str, labels: &str) -> Result<(String, u64)> {
    let mut buckets: std::collections::BTreeMap<String, (f64, u64)> = Default::default();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("holdfast_webhook_admission_duration_seconds_bucket{") else {
            continue;
        };
        if !rest.contains(labels) {
            continue;
        }
        let (labels, value) = rest.rsplit_once("} ").context("malformed bucket line")?;
        let le = labels
            .split(',')
            .find_map(|l| l.strip_prefix("le=\""))
            .and_then(|l| l.strip_suffix('"'))
            .context("bucket without le")?;
        let bound = if le == "+Inf" { f64::INFINITY } else { le.parse()? };
        let count: u64 = value.trim().parse()?;
        let slot = buckets.entry(le.to_string()).or_insert((bound, 0));
        slot.1 += count;
    }
    let mut sorted: Vec<(f64, u64)> = buckets.into_values().collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = sorted
        .last()
        .map(|b| b.1)
        .context("no histogram for the pin rule")?;
    let bound = sorted
        .iter()
        .find(|(_, count)| *count as f64 >= total as f64 * 0.99)
        .map(|(bound, _)| *bound)
        .context("empty histogram")?;
    let shown = if bound.is_finite() {
        format!("{}", bound * 1e3)
    } else {
        "inf".into()
    };
    Ok((shown, total))
}

/// The reviews `webhook/examples/admission_instructions.rs` counts the instructions of (one
/// home): an App fetching a tag the cache holds, and a kpack Image whose app does not exist.
const PIN_REVIEW: &str = include_str!("../../../webhook/examples/reviews/app-pin.json");
const REVIEW: &str = include_str!("../../../webhook/examples/reviews/image.json");

/// The tag the pin review fetches.
fn pin_tag() -> Result<Reference> {
    let review: serde_json::Value = serde_json::from_str(PIN_REVIEW)?;
    let url = review["request"]["object"]["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .context("the pin review names no image")?;
    Ok(Reference::parse(url)?)
}

async fn bare_server(resolver: Arc<SwappableCert>) -> Result<SocketAddr> {
    let fixed = serde_json::to_string(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4", "allowed": true, "status": {}}
    }))?;
    let app = Router::new().route(
        "/mutate",
        post(move |_body: bytes::Bytes| {
            let fixed = fixed.clone();
            async move { ([("content-type", "application/json")], fixed) }
        }),
    );
    let tls = RustlsConfig::from_config(Arc::new(server_config(resolver)?));
    let handle = axum_server::Handle::<SocketAddr>::new();
    let server = axum_server::bind_rustls(SocketAddr::from(([127, 0, 0, 1], 0)), tls).handle(handle.clone());
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    handle.listening().await.context("bare server did not bind")
}

/// Keeps `concurrency` requests in flight for `period`; the latencies of those sent within it.
async fn drive(
    client: &reqwest::Client,
    url: &str,
    body: &[u8],
    concurrency: usize,
    period: Duration,
) -> Result<Vec<Duration>> {
    let end = Instant::now() + period;
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body) = (client.clone(), url.to_string(), body.to_vec());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let rsp = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?;
                anyhow::ensure!(rsp.status().is_success(), "status {}", rsp.status());
                let bytes = rsp.bytes().await?;
                anyhow::ensure!(!bytes.is_empty(), "empty response");
                latencies.push(sent.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await??);
    }
    Ok(all)
}

fn figures(tally: Tally) -> Figures {
    let count = tally.latencies.len();
    let (p50_ms, p99_ms) = holdfast_e2e::latency::p50_p99_ms(tally.latencies);
    Figures {
        per_second: count as f64 / MEASURE.as_secs_f64(),
        p50_ms,
        p99_ms,
        cpu_us: tally.cpu_ticks as f64 / TICKS_PER_SECOND * 1e6 / count.max(1) as f64,
    }
}

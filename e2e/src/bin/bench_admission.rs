//! `make bench-admission`: admissions/s and p50/p99 latency over TLS with keep-alive on loopback
//! at concurrency 1, 16 and 64, for (a) holdfast answering an allow-with-no-patch review through
//! its real router, rule and logging, and (b) a bare axum + rustls handler returning a fixed
//! body, measured in the same run with the same client. The last line is
//! `ratio=<a/b at 64> p99_ms=<holdfast p99 at 64> rss_mib=<peak RSS of this process>`.
//!
//! Client, both servers and the TLS stack share this process and its 2 cores, so the ratio is
//! fair and the RSS is an upper bound for the server alone. The two servers take turns in short
//! rounds (holdfast, bare, bare, holdfast, ...) rather than one after the other, so that whatever
//! else the machine runs weighs on both alike. `cpu_us` is the whole process's CPU time (client,
//! TLS, server) per admission: it moves much less than admissions/s when other processes take a
//! core away, so it is the steadier figure to compare the two servers by.

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use axum::{Router, routing::post};
use axum_server::tls_rustls::RustlsConfig;
use holdfast_certs::{CaOptions, CertificateAuthority, ServingOptions, SwappableCert, server_config};
use holdfast_pins::Pinner;
use holdfast_registry::{
    Resolver, ResolverConfig,
    cache::{CacheConfig, DigestCache},
};
use holdfast_webhook::{
    cluster::StaticCluster,
    rules::RuleContext,
    server::{self, Settings},
};
use serde_json::json;

const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Per server and concurrency.
const WARMUP: Duration = Duration::from_millis(500);
/// Per server and concurrency, in [`ROUNDS`] turns.
const MEASURE: Duration = Duration::from_secs(3);
const ROUNDS: u32 = 6;
/// `/proc/<pid>/stat` counts CPU time in clock ticks of 1/USER_HZ s; USER_HZ is 100 on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

struct Figures {
    per_second: f64,
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
    // Production logs one line per admission: pay for formatting it, into a sink. Plain text as
    // holdfast-webhook's default; `BENCH_LOG_FORMAT=json` as its `--log-format=json`.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::sink);
    match std::env::var("BENCH_LOG_FORMAT").as_deref() {
        Ok("json") => logs.json().init(),
        _ => logs.init(),
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run())
}

async fn run() -> Result<()> {
    let ca = CertificateAuthority::generate(&CaOptions::default())?;
    let leaf =
        ca.issue_serving(&ServingOptions::for_service("bench", "bench").with_ip([127, 0, 0, 1].into()))?;
    let resolver = Arc::new(SwappableCert::new(&leaf)?);

    let holdfast = server::start(
        Settings {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            deadline: Duration::from_secs(3),
            body_limit: holdfast_webhook::handler::DEFAULT_BODY_LIMIT,
            handshake_timeout: Duration::from_secs(5),
        },
        RuleContext {
            policy: Default::default(),
            cluster: Arc::new(StaticCluster::default()),
            pinner: Arc::new(Pinner::new(
                Arc::new(DigestCache::new(
                    Arc::new(Resolver::new(ResolverConfig::default())?),
                    CacheConfig::default(),
                    None,
                )),
                None,
            )),
        },
        async {},
        resolver.clone(),
    )
    .await?;
    let bare = bare_server(resolver).await?;

    let body = serde_json::to_vec(&review())?;
    let ca_pem = reqwest::Certificate::from_pem(ca.cert_pem().as_bytes())?;
    println!(
        "{:<10} {:>5} {:>12} {:>9} {:>9} {:>8}",
        "server", "conc", "admissions/s", "p50_ms", "p99_ms", "cpu_us"
    );
    let mut last = None;
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
                let ticks = cpu_ticks()?;
                let latencies = drive(client, url, &body, concurrency, MEASURE / ROUNDS).await?;
                tally.cpu_ticks += cpu_ticks()? - ticks;
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
            pair.push(figures);
        }
        last = Some(pair);
    }
    holdfast.shutdown(Duration::from_secs(1)).await;
    let pair = last.context("no measurement")?;
    let ratio = pair[0].per_second / pair[1].per_second;
    println!(
        "ratio={ratio:.2} p99_ms={:.3} rss_mib={:.1}",
        pair[0].p99_ms,
        peak_rss_mib()?
    );
    Ok(())
}

/// An allow-with-no-patch review: a kpack Image whose app does not exist.
fn review() -> serde_json::Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            "kind": {"group": "kpack.io", "version": "v1alpha2", "kind": "Image"},
            "resource": {"group": "kpack.io", "version": "v1alpha2", "resource": "images"},
            "name": "app", "namespace": "space", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:cf:korifi"},
            "object": {"apiVersion": "kpack.io/v1alpha2", "kind": "Image",
                       "metadata": {"name": "app", "namespace": "space", "labels": {"korifi.cloudfoundry.org/build-workload-name": "bw"}},
                       "spec": {"tag": "registry.example/app-droplets", "builder": {"kind": "ClusterBuilder", "name": "b"}}},
            "oldObject": null, "dryRun": false
        }
    })
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
    let mut all = tally.latencies;
    all.sort();
    let at = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
    };
    Figures {
        per_second: all.len() as f64 / MEASURE.as_secs_f64(),
        p50_ms: at(0.50) * 1e3,
        p99_ms: at(0.99) * 1e3,
        cpu_us: tally.cpu_ticks as f64 / TICKS_PER_SECOND * 1e6 / all.len().max(1) as f64,
    }
}

/// User plus system CPU time of this whole process so far, in clock ticks.
fn cpu_ticks() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Field 2, the command name, may hold spaces: count the fields after its closing ')', from
    // field 3 on. utime and stime are fields 14 and 15.
    let (_, after) = stat.rsplit_once(')').context("malformed /proc/self/stat")?;
    let mut fields = after.split_whitespace().skip(14 - 3);
    let mut next = || -> Result<u64> { Ok(fields.next().context("short /proc/self/stat")?.parse()?) };
    Ok(next()? + next()?)
}

fn peak_rss_mib() -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .context("no VmHWM in /proc/self/status")?
        .parse()?;
    Ok(kib / 1024.0)
}

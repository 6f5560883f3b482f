//! `make bench-pinning`: registry traffic and outage failures of kapp-controller Apps without and
//! with holdfast, on the local control plane and a real registry, through the kapp-controller
//! EMULATOR (`holdfast_e2e::emulators::kapp_controller`, a test fixture — not kapp-controller).
//!
//! 1,000 Apps (`BENCH_PINNING_APPS`) fetch images over 50 tags (`BENCH_PINNING_TAGS`) with the
//! default `syncPeriod` of 30 s. Each phase runs one emulated hour of syncs, then ten emulated
//! minutes with the registry stopped:
//!
//! - without: the Apps are stored as written (their namespace is opted out of holdfast), so
//!   every sync fetches every tag from the registry;
//! - with: the Apps are admitted through holdfast's webhook, which pins them to digests, and
//!   holdfast's refresher checks every tag once per round (10 min, the documented default);
//!   the emulated vendir cache then serves each App's digest after its first fetch.
//!
//! Registry requests are counted from the registry's own access log (so they include holdfast's
//! HEADs at admission and refresh); the emulated hour runs as fast as those requests do. The last
//! line is `registry_request_ratio=<without/with> failed_syncs_without=<n> failed_syncs_with=<n>`.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use holdfast_controller::pinning::IGNORE_LABEL;
use holdfast_e2e::{
    Env,
    control_plane::SpareRegistry,
    controller::LocalController,
    emulators::kapp_controller::{DEFAULT_SYNC_PERIOD, KappController},
    images,
    objects::{api_for, parse_documents},
    webhook::{LocalWebhook, Registration, rule},
};
use kube::{Client, api::PostParams};

const HOUR: Duration = Duration::from_secs(3600);
const OUTAGE: Duration = Duration::from_secs(600);
/// holdfast's refresh interval, as documented (one registry check per unique tag per round).
const REFRESH: Duration = Duration::from_secs(600);
/// Apps created at once.
const CREATE_CONCURRENCY: usize = 50;

struct Phase {
    name: &'static str,
    requests: usize,
    failed_syncs_in_outage: u64,
    syncs: u64,
    failed_syncs: u64,
    cache_hits: u64,
    wall: Duration,
}

fn knob(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .with_context(|| format!("{name}: {value:?} is not a positive number")),
        Err(_) => Ok(default),
    }
}

/// Requests the registry answered or refused, from its access log.
fn registry_requests(registry: &SpareRegistry) -> usize {
    ["\"GET /v2/", "\"HEAD /v2/"]
        .iter()
        .map(|p| registry.requests_matching(p))
        .sum()
}

fn app(name: &str, url: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: default\n  fetch:\n  - image: {{url: {url}}}\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

async fn create_apps(client: &Client, namespace: &str, urls: &[String], apps: usize) -> Result<()> {
    let template = parse_documents(&app("template", &urls[0]))?.remove(0);
    let api = api_for(client, &template, Some(namespace)).await?;
    futures::stream::iter(0..apps)
        .map(|i| {
            let api = api.clone();
            let yaml = app(&format!("app-{i:04}"), &urls[i % urls.len()]);
            async move {
                let object = parse_documents(&yaml)?.remove(0);
                api.create(&PostParams::default(), &object).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// One phase: create the Apps, an emulated hour of syncs (with refresh rounds when holdfast
/// runs), then an emulated outage.
async fn phase(
    name: &'static str,
    client: &Client,
    namespace: &str,
    registry: &mut SpareRegistry,
    urls: &[String],
    apps: usize,
    controller: Option<&LocalController>,
) -> Result<Phase> {
    let started = std::time::Instant::now();
    let before = registry_requests(registry);
    let mut kapp = KappController::start(client.clone(), namespace, DEFAULT_SYNC_PERIOD).await?;
    create_apps(client, namespace, urls, apps).await?;
    kapp.wait_for_apps(apps).await?;
    let mut mark = REFRESH;
    while mark <= HOUR {
        kapp.run_until(mark).await?;
        if let Some(controller) = controller {
            let report = controller.refresh().await?;
            eprintln!(
                "  {name}: refresh round at {} min: {} checked, {} failed",
                mark.as_secs() / 60,
                report.checked,
                report.failed
            );
        }
        mark += REFRESH;
    }
    let requests = registry_requests(registry) - before;
    let [syncs, failed_syncs, _, cache_hits] = kapp.stats.snapshot();

    registry.stop();
    kapp.run_until(HOUR + OUTAGE).await?;
    if let Some(controller) = controller {
        let report = controller.refresh().await?;
        eprintln!(
            "  {name}: refresh round during the outage: {} checked, {} answered from the cache",
            report.checked, report.failed
        );
    }
    registry.start().await?;
    let [_, failed_total, _, _] = kapp.stats.snapshot();
    Ok(Phase {
        name,
        requests,
        failed_syncs_in_outage: failed_total - failed_syncs,
        syncs,
        failed_syncs,
        cache_hits,
        wall: started.elapsed(),
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    holdfast_e2e::init();
    let apps = knob("BENCH_PINNING_APPS", 1000)?;
    let tags = knob("BENCH_PINNING_TAGS", 50)?;
    let env = Arc::new(Env::start().await?);
    let mut registry = env.spare_registry().await?;
    let mut urls = Vec::with_capacity(tags);
    for i in 0..tags {
        let image = images::Image::with_files(&[("config.yml", format!("tag: {i}\n").as_bytes())])?;
        let repository = format!("configs/app-{i:02}");
        images::push(&registry.addr, &repository, "1.0.0", &image).await?;
        urls.push(format!("{}/{repository}:1.0.0", registry.addr));
    }
    let client = env.client().await?;
    println!(
        "bench-pinning: {apps} Apps over {tags} tags, syncPeriod {} s, {} emulated min + {} min registry outage per phase",
        DEFAULT_SYNC_PERIOD.as_secs(),
        HOUR.as_secs() / 60,
        OUTAGE.as_secs() / 60
    );

    let without_ns = env
        .namespace_with_labels("without", &[(IGNORE_LABEL, "true")])
        .await?;
    let without = phase("without", &client, &without_ns, &mut registry, &urls, apps, None).await?;

    let mut registration = Registration::rules(vec![rule(
        "kappctrl.k14s.io",
        "v1alpha1",
        &["apps"],
        &["CREATE", "UPDATE"],
    )]);
    registration.insecure_registries.push(registry.addr.clone());
    let webhook = LocalWebhook::start(env.clone(), registration).await?;
    let controller = LocalController::start_in(
        &env,
        client.clone(),
        webhook.system_namespace.clone(),
        std::slice::from_ref(&registry.addr),
    )
    .await?;
    let with_ns = webhook.namespace("with").await?;
    let with = phase(
        "with",
        &client,
        &with_ns,
        &mut registry,
        &urls,
        apps,
        Some(&controller),
    )
    .await?;
    controller.stop().await;
    webhook.stop().await?;
    registry.stop();
    // Everything stopped before the figures, so that no late log line follows the last line.
    drop(client);
    drop(env);

    println!(
        "{:<8} {:>18} {:>8} {:>14} {:>11} {:>22} {:>8}",
        "phase",
        "registry_req/hour",
        "syncs",
        "failed_syncs",
        "cache_hits",
        "failed_in_10min_outage",
        "wall_s"
    );
    for p in [&without, &with] {
        println!(
            "{:<8} {:>18} {:>8} {:>14} {:>11} {:>22} {:>8.1}",
            p.name,
            p.requests,
            p.syncs,
            p.failed_syncs,
            p.cache_hits,
            p.failed_syncs_in_outage,
            p.wall.as_secs_f64()
        );
    }
    let ratio = without.requests as f64 / with.requests.max(1) as f64;
    println!(
        "registry_request_ratio={ratio:.1} failed_syncs_without={} failed_syncs_with={}",
        without.failed_syncs_in_outage, with.failed_syncs_in_outage
    );
    Ok(())
}

//! `make bench-pinning`: registry traffic and outage failures of Apps reconciled by the real
//! kapp-controller (built from its Go module, `e2e/peers/kapp-controller`), without holdfast,
//! with it, and with it and its mirror, on the local control plane and real registries.
//!
//! 200 Apps (`BENCH_PINNING_APPS`) fetch images over N/20 tags (`BENCH_PINNING_TAGS`) with
//! `syncPeriod: 30s`, each deploying a ConfigMap of its own (a ytt overlay prefixes its name with
//! the App's). Each arm runs `BENCH_PINNING_MINUTES` (20) of real time from the first create, then
//! `BENCH_PINNING_OUTAGE_MINUTES` (5) with its (upstream) registry stopped:
//!
//! - without: the Apps stay on their tags (their namespace is opted out of holdfast), so every
//!   sync fetches from the registry (vendir caches only digest references);
//! - with: holdfast's webhook pins the Apps as they are created, and the whole controller runs
//!   with its shipped refresh interval (600 s, one registry check per unique tag per round);
//!   vendir's per-App cache then serves each App's digest after its first fetch;
//! - with-mirror: the same with the shipped mirror configuration (`--mirror-registry` on a second
//!   registry, prefix `mirror`, every namespace, the copier's shipped 2 copies at a time and 24 h
//!   retention): the webhook pins an App upstream until the controller has copied the tag's
//!   content and recorded the copy, then to the mirror, and the controller re-pins the Apps
//!   admitted before the copy. The Apps are created at once, as a user would, not after the
//!   copy: the Apps admitted before it are first fetched upstream (vendir's cache is per App and
//!   keyed by digest reference), then from the mirror once re-pinned. The outage stops the
//!   upstream registry only; the mirror stays up.
//!
//! Each arm has a registry of its own (the mirror arm two: upstream and mirror); requests are
//! counted from its access log (holdfast's HEADs included), and split by sender (holdfast's
//! `User-Agent` or kapp-controller's) and by what was asked (HEAD or GET of manifests, GET of
//! blobs). Syncs and failed syncs come from a watch on the Apps' status
//! (`consecutiveReconcileSuccesses`/`Failures`, which kapp-controller bumps once per reconcile);
//! a failure by kapp-controller's own reaper race is counted apart (`reaper_races`).
//! Steady state starts when the watch has seen every App's first successful sync. An arm's Apps
//! are paused (`spec.paused`) and their namespace opted out of holdfast before the next arm
//! starts, so they neither load kapp-controller nor ask their registry, and the next arm's
//! holdfast leaves them alone. The last line is
//! `registry_request_ratio=… failed_syncs_without=… failed_syncs_with=… steady_state_ratio=…`,
//! then the sync rates that say whether kapp-controller kept its schedule (2 per App per
//! minute), holdfast's own requests (its HEADs) and the with arm's total over its floor:
//! kapp-controller's first fetch of every App, which its per-App cache makes unavoidable, the
//! reaper races of both arms, and what holdfast sent the stopped registry during the with arm's
//! outage (`holdfast_failed_lookups_in_outage`: its lookups that failed there, webhook and
//! controller together; `holdfast_backoffs_in_outage`: those answered stale without asking), then
//! the mirror arm's: `upstream_request_ratio_mirror` (the without arm's requests over the mirror
//! arm's upstream requests, create to outage, first fetches and copies included),
//! `failed_syncs_with_mirror` (in the upstream outage), its upstream requests split
//! (`holdfast_heads_…`: tag lookups; `copier_gets_…`: the copies' GETs of manifests and blobs;
//! `kapp_fetches_…`: kapp-controller's requests, the first fetches of Apps pinned upstream
//! before the copy), its mirror's requests (every method, the copier's pushes included), the
//! Apps admitted pinned upstream and those pinned to the mirror when the outage began. Each arm's
//! registry requests (upstream), mirror requests (the mirror arm's; empty for the others) and
//! syncs every 10 s go to `docs/benchmarks/data/pinning.csv` (`holdfast_e2e::bench_data`).
//!
//! **A fleet** (`BENCH_PINNING_CLUSTERS`, default 1): that many control planes on this machine,
//! each with its own kapp-controller, its own holdfast (webhook and controller) and, in the mirror
//! arm, its own mirror (`--mirror-registry` is a cache registry beside a cluster, which keeps that
//! cluster's fetches going when the upstream or the link to it is down; one shared mirror would
//! copy each digest once for the fleet instead of once per cluster, and fail every cluster at
//! once), all fetching `BENCH_PINNING_APPS` Apps each from one upstream registry per arm. The
//! arms run in every cluster at once; the figures are the fleet's, and the last line ends with
//! `clusters=…` and each arm's steady-state upstream requests per unique tag per refresh interval
//! (`upstream_per_tag_per_refresh_…`): what the upstream registry sees of the fleet once every
//! App has fetched.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use futures::{FutureExt, StreamExt, TryStreamExt};
use holdfast_controller::{metrics::Metrics, mirror::MirrorSettings, pinning::IGNORE_LABEL};
use holdfast_e2e::{
    Env, bench_data,
    control_plane::{AccessLog, SpareRegistry},
    images,
    mirror::PREFIX,
    objects::{api_for, parse_documents},
    peers::kapp_controller,
    webhook::{LocalWebhook, Registration},
};
use holdfast_pins::MirrorPins;
use holdfast_registry::mirror::MirrorLocation;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The Apps' `syncPeriod` (kapp-controller's default for an App).
const SYNC_PERIOD: Duration = Duration::from_secs(30);
/// holdfast-controller's shipped `--refresh-seconds`.
const REFRESH: Duration = Duration::from_secs(600);
/// holdfast-controller's shipped `--mirror-retention-seconds`.
const RETENTION: Duration = Duration::from_secs(86_400);
/// Apps created at once.
const CREATE_CONCURRENCY: usize = 20;
/// How often an arm's time series is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);

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

/// `[GET, HEAD]` requests in a registry's access log.
fn registry_requests(log: &AccessLog) -> [usize; 2] {
    log.matching_each(["\"GET /v2/", "\"HEAD /v2/"])
}

fn total(requests: [usize; 2]) -> usize {
    requests[0] + requests[1]
}

/// Every request to a registry's API in its access log, whatever its method.
const ANY_REQUEST: &str = " /v2/";

/// A registry's requests (every method) by sender — holdfast (its `User-Agent`, `holdfast/…`:
/// the webhook's and the controller's tag lookups and the mirror copier) or anyone else
/// (kapp-controller's vendir: nothing else asks the arm's registries while it runs) — and by
/// what was asked: HEAD or GET of a manifest, GET of a blob, anything else (`/v2/` pings, HEADs
/// of blobs, a copy's pushes).
#[derive(Debug, Default, Clone, Copy)]
struct Traffic {
    holdfast: Asked,
    kapp: Asked,
}

#[derive(Debug, Default, Clone, Copy)]
struct Asked {
    manifest_heads: usize,
    manifest_gets: usize,
    blob_gets: usize,
    other: usize,
}

impl Asked {
    fn total(&self) -> usize {
        self.manifest_heads + self.manifest_gets + self.blob_gets + self.other
    }

    fn plus(self, other: Self) -> Self {
        Self {
            manifest_heads: self.manifest_heads + other.manifest_heads,
            manifest_gets: self.manifest_gets + other.manifest_gets,
            blob_gets: self.blob_gets + other.blob_gets,
            other: self.other + other.other,
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            manifest_heads: self.manifest_heads - before.manifest_heads,
            manifest_gets: self.manifest_gets - before.manifest_gets,
            blob_gets: self.blob_gets - before.blob_gets,
            other: self.other - before.other,
        }
    }
}

impl Traffic {
    /// What `log` holds so far.
    fn of(log: &AccessLog) -> Self {
        let mut traffic = Self::default();
        for line in log.read().lines() {
            // `"METHOD /v2/… HTTP/1.1"`, and the `User-Agent` last, quoted.
            let Some((_, request)) = line.split_once('"') else {
                continue;
            };
            let Some((method, path)) = request.split_once(' ') else {
                continue;
            };
            if !path.starts_with("/v2/") {
                continue;
            }
            let path = path.split(' ').next().unwrap_or_default();
            let sender = if line.contains("\"holdfast/") {
                &mut traffic.holdfast
            } else {
                &mut traffic.kapp
            };
            let count = match (method, path.contains("/manifests/"), path.contains("/blobs/")) {
                ("HEAD", true, _) => &mut sender.manifest_heads,
                ("GET", true, _) => &mut sender.manifest_gets,
                ("GET", _, true) => &mut sender.blob_gets,
                _ => &mut sender.other,
            };
            *count += 1;
        }
        traffic
    }

    /// What `logs` (the fleet's mirrors) hold so far, together.
    fn of_all(logs: &[AccessLog]) -> Self {
        logs.iter().map(Self::of).fold(Self::default(), |sum, one| Self {
            holdfast: sum.holdfast.plus(one.holdfast),
            kapp: sum.kapp.plus(one.kapp),
        })
    }

    fn total(&self) -> usize {
        self.holdfast.total() + self.kapp.total()
    }

    fn since(self, before: Self) -> Self {
        Self {
            holdfast: self.holdfast.since(before.holdfast),
            kapp: self.kapp.since(before.kapp),
        }
    }
}

/// The registry (`host:port`) of the reference `url`.
fn registry_of(url: &str) -> String {
    url.split('/').next().unwrap_or_default().to_owned()
}

/// An App fetching `url`, its ConfigMap named after it.
fn app(name: &str, url: &str) -> String {
    kapp_controller::own_names_app(name, url, SYNC_PERIOD).to_string()
}

/// What the watch saw of one App, from kapp-controller's reconcile counters.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    last_successes: u64,
    last_failures: u64,
    succeeded: u64,
    failed: u64,
    /// Failures by kapp-controller's reaper race (`kapp_controller::failed_by_reaper_race`), not
    /// by the registry: counted apart from `failed`.
    raced: u64,
}

impl Counters {
    /// Adds what moved since the last version seen: a counter that grew adds its growth, one that
    /// restarted (the other outcome reset it) adds its new value; failures go to `raced` when the
    /// version reports the reaper race.
    fn observe(&mut self, successes: u64, failures: u64, raced: bool) {
        let grown = |last: u64, now: u64| if now >= last { now - last } else { now };
        self.succeeded += grown(self.last_successes, successes);
        let failed = grown(self.last_failures, failures);
        if raced {
            self.raced += failed;
        } else {
            self.failed += failed;
        }
        self.last_successes = successes;
        self.last_failures = failures;
    }
}

#[derive(Debug, Default, Clone)]
struct Seen {
    apps: BTreeMap<String, Counters>,
    /// The registry each App's fetch names, as last seen.
    registries: BTreeMap<String, String>,
}

impl Seen {
    /// `[successful, failed]` syncs of every App so far.
    fn totals(&self) -> [u64; 2] {
        self.apps
            .values()
            .fold([0, 0], |[s, f], c| [s + c.succeeded, f + c.failed])
    }

    /// Failed syncs of every App so far that were kapp-controller's reaper race.
    fn raced(&self) -> u64 {
        self.apps.values().map(|c| c.raced).sum()
    }

    fn every_app_synced(&self, apps: usize) -> bool {
        self.apps.len() == apps && self.apps.values().all(|c| c.succeeded > 0)
    }

    /// How many Apps fetch from each registry, as last seen.
    fn apps_by_registry(&self) -> BTreeMap<String, usize> {
        count(self.registries.values().cloned())
    }
}

fn count(items: impl IntoIterator<Item = String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for item in items {
        *counts.entry(item).or_default() += 1;
    }
    counts
}

/// Follows the Apps of each of `apis`' namespaces (one per cluster) until `stop`, into one
/// record (an App's key is its cluster's index and its name).
fn watch_apps(
    apis: Vec<Api<DynamicObject>>,
    stop: CancellationToken,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let watches = apis
        .into_iter()
        .enumerate()
        .map(|(cluster, api)| watch_cluster(cluster, api, seen.clone(), stop.clone()));
    let task = tokio::spawn(futures::future::join_all(watches).map(drop));
    (seen, task)
}

async fn watch_cluster(
    cluster: usize,
    api: Api<DynamicObject>,
    out: Arc<Mutex<Seen>>,
    stop: CancellationToken,
) {
    {
        let stream = watcher(api, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        loop {
            let app = tokio::select! {
                () = stop.cancelled() => return,
                next = stream.next() => match next {
                    Some(Ok(app)) => app,
                    // The watcher re-lists on its own; the counters carry over.
                    Some(Err(error)) => {
                        tracing::warn!(%error, "App watch");
                        continue;
                    }
                    None => return,
                },
            };
            let status = &app.data["status"];
            let counter = |field: &str| status[field].as_u64().unwrap_or_default();
            let (successes, failures) = (
                counter("consecutiveReconcileSuccesses"),
                counter("consecutiveReconcileFailures"),
            );
            let raced = kapp_controller::failed_by_reaper_race(&app);
            let registry = app.data["spec"]["fetch"][0]["image"]["url"]
                .as_str()
                .map(registry_of)
                .unwrap_or_default();
            let Ok(mut seen) = out.lock() else { return };
            let key = format!("{cluster}/{}", app.name_any());
            seen.apps
                .entry(key.clone())
                .or_default()
                .observe(successes, failures, raced);
            seen.registries.insert(key, registry);
        }
    }
}

/// One point of an arm's time series.
#[derive(Debug, Serialize)]
struct Sample {
    arm: &'static str,
    /// Seconds since the arm's first create.
    t_s: f64,
    registry_up: bool,
    /// Registry requests (GET and HEAD) since the arm started; the upstream's with a mirror.
    requests: usize,
    syncs: u64,
    failed_syncs: u64,
    /// Requests to the mirror (every method) since the arm started; none without one.
    mirror_requests: Option<usize>,
}

/// Samples the arm every `SAMPLE_EVERY` until `stop`, and once more then.
fn sample(
    arm: &'static str,
    log: AccessLog,
    mirrors: Vec<AccessLog>,
    seen: Arc<Mutex<Seen>>,
    up: Arc<AtomicBool>,
    stop: CancellationToken,
) -> JoinHandle<Vec<Sample>> {
    let (started, before) = (Instant::now(), total(registry_requests(&log)));
    let mirror_requests = |logs: &[AccessLog]| logs.iter().map(|m| m.matching(ANY_REQUEST)).sum::<usize>();
    let mirror_before = (!mirrors.is_empty()).then(|| mirror_requests(&mirrors));
    tokio::spawn(async move {
        let mut samples = Vec::new();
        let mut every = tokio::time::interval(SAMPLE_EVERY);
        loop {
            let last = tokio::select! {
                () = stop.cancelled() => true,
                _ = every.tick() => false,
            };
            let [syncs, failed_syncs] = seen.lock().map(|s| s.totals()).unwrap_or_default();
            samples.push(Sample {
                arm,
                t_s: started.elapsed().as_secs_f64(),
                registry_up: up.load(Ordering::Relaxed),
                requests: total(registry_requests(&log)).saturating_sub(before),
                syncs,
                failed_syncs,
                mirror_requests: mirror_before.map(|before| mirror_requests(&mirrors).saturating_sub(before)),
            });
            if last {
                return samples;
            }
        }
    })
}

fn snapshot(seen: &Mutex<Seen>) -> Result<Seen> {
    Ok(seen
        .lock()
        .map_err(|_| anyhow::anyhow!("watch poisoned"))?
        .clone())
}

struct Arm {
    name: &'static str,
    /// `[GET, HEAD]` over the run (create to the outage); to the upstream with a mirror.
    requests: [usize; 2],
    /// The same requests by sender and what was asked.
    upstream: Traffic,
    /// The mirror's requests over the run, when the arm has one.
    mirror: Option<Traffic>,
    /// How many Apps the webhook admitted pinned to each registry (as written without holdfast).
    admitted: BTreeMap<String, usize>,
    /// How many Apps fetched from each registry when the outage began.
    pinned_at_outage: BTreeMap<String, usize>,
    /// Requests from every App's first successful sync to the outage, and that span.
    steady_requests: usize,
    steady: Duration,
    /// From the first create until every App had synced once.
    first_syncs: Duration,
    syncs: u64,
    failed_syncs: u64,
    outage_syncs: u64,
    failed_in_outage: u64,
    /// Failed syncs over the whole arm that were kapp-controller's reaper race.
    reaper_races: u64,
    /// holdfast's lookups during the outage.
    outage_attempts: Attempts,
    run: Duration,
    samples: Vec<Sample>,
}

impl Arm {
    /// Successful syncs per App per minute over the run, against the schedule's 2.
    fn sync_rate(&self, apps: usize) -> f64 {
        self.syncs as f64 / apps as f64 / (self.run.as_secs_f64() / 60.0)
    }

    /// Steady-state requests (the upstream's, the whole fleet's) per unique tag per refresh
    /// interval: what the registry sees of the fleet once every App has fetched.
    fn per_tag_per_refresh(&self, tags: usize) -> f64 {
        let intervals = (self.steady.as_secs_f64() / REFRESH.as_secs_f64()).max(f64::EPSILON);
        self.steady_requests as f64 / tags as f64 / intervals
    }

    fn steady_per_minute(&self) -> f64 {
        self.steady_requests as f64 / (self.steady.as_secs_f64() / 60.0).max(f64::EPSILON)
    }
}

struct Plan {
    apps: usize,
    run: Duration,
    outage: Duration,
}

/// Creates the Apps; their Api, and the registry each was admitted with (pinned or not).
async fn create_apps(
    client: &Client,
    namespace: &str,
    urls: &[String],
    apps: usize,
) -> Result<(Api<DynamicObject>, Vec<String>)> {
    let template = parse_documents(&app("template", &urls[0]))?.remove(0);
    let api = api_for(client, &template, Some(namespace)).await?;
    let admitted = futures::stream::iter(0..apps)
        .map(|i| {
            let api = api.clone();
            let yaml = app(&format!("app-{i:04}"), &urls[i % urls.len()]);
            async move {
                let object = parse_documents(&yaml)?.remove(0);
                let created = api.create(&PostParams::default(), &object).await?;
                let url = created.data["spec"]["fetch"][0]["image"]["url"].as_str();
                anyhow::Ok(url.map(registry_of).unwrap_or_default())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<String>>()
        .await?;
    Ok((api, admitted))
}

/// Stops kapp-controller reconciling the arm's Apps (`spec.paused`), so the next arm runs alone.
async fn pause_all(api: &Api<DynamicObject>, apps: usize) -> Result<()> {
    let patch = Patch::Merge(serde_json::json!({"spec": {"paused": true}}));
    futures::stream::iter(0..apps)
        .map(|i| {
            let (api, patch) = (api.clone(), patch.clone());
            async move {
                api.patch(&format!("app-{i:04}"), &PatchParams::default(), &patch)
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Pushes one configuration per tag to `registry`; the references to them by tag.
async fn push_configs(registry: &SpareRegistry, tags: usize) -> Result<Vec<String>> {
    let mut urls = Vec::with_capacity(tags);
    for i in 0..tags {
        let config =
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: config}}\ndata: {{tag: \"{i}\"}}\n");
        let image = images::Image::with_files(&[("config.yml", config.as_bytes())])?;
        let repository = format!("configs/app-{i:03}");
        images::push(&registry.addr, &repository, "1.0.0", &image).await?;
        urls.push(format!("{}/{repository}:1.0.0", registry.addr));
    }
    Ok(urls)
}

/// What an arm's Apps name: in each cluster their namespace and the mirror's access log when
/// there is one (the mirror stays up); the references they are written with and the registry
/// those name, one for the whole fleet (stopped for the outage).
struct Target<'a> {
    clusters: Vec<ClusterTarget<'a>>,
    urls: &'a [String],
    registry: &'a mut SpareRegistry,
}

struct ClusterTarget<'a> {
    env: &'a Env,
    namespace: String,
    mirror: Option<AccessLog>,
}

/// One arm, in every cluster of the fleet at once: create the Apps, run until `plan.run` from
/// the first create, then the outage. `holdfast` reads holdfast's [`Attempts`] (none without
/// it; the fleet's together), so that the outage's are counted.
async fn arm(
    name: &'static str,
    target: Target<'_>,
    plan: &Plan,
    holdfast: &dyn Fn() -> Result<Attempts>,
) -> Result<Arm> {
    let Target {
        clusters,
        urls,
        registry,
    } = target;
    let mirrors: Vec<AccessLog> = clusters.iter().filter_map(|c| c.mirror.clone()).collect();
    let apps = plan.apps * clusters.len();
    let mut clients = Vec::with_capacity(clusters.len());
    for cluster in &clusters {
        kapp_controller::add_deployer(cluster.env, &cluster.namespace)?;
        clients.push(cluster.env.client().await?);
    }
    let log = registry.access_log();
    let before = registry_requests(&log);
    let (upstream_before, mirror_before) = (
        Traffic::of(&log),
        (!mirrors.is_empty()).then(|| Traffic::of_all(&mirrors)),
    );
    let started = Instant::now();
    let stop = CancellationToken::new();
    let resource = kube::discovery::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("kappctrl.k14s.io", "v1alpha1", "App"),
        "apps",
    );
    let watched = clusters
        .iter()
        .zip(&clients)
        .map(|(cluster, client)| Api::namespaced_with(client.clone(), &cluster.namespace, &resource))
        .collect();
    let (seen, watch) = watch_apps(watched, stop.clone());
    let up = Arc::new(AtomicBool::new(true));
    let sampler = sample(
        name,
        log.clone(),
        mirrors.clone(),
        seen.clone(),
        up.clone(),
        stop.clone(),
    );
    let mut created = Vec::with_capacity(clusters.len());
    let mut admitted = Vec::new();
    for (cluster, client) in clusters.iter().zip(&clients) {
        let (api, registries) = create_apps(client, &cluster.namespace, urls, plan.apps).await?;
        created.push(api);
        admitted.extend(registries);
    }
    eprintln!(
        "  {name}: {apps} Apps created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Every App's first successful sync (read from the watch's record every second).
    let first_syncs = loop {
        if snapshot(&seen)?.every_app_synced(apps) {
            break started.elapsed();
        }
        if started.elapsed() > plan.run {
            let seen = snapshot(&seen)?;
            let synced = seen.apps.values().filter(|c| c.succeeded > 0).count();
            bail!(
                "{name}: only {synced} of {apps} Apps synced once within {:?}; kapp-controller (the first cluster's):\n{}",
                plan.run,
                clusters[0].env.kapp_controller_log(20)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let steady_before = total(registry_requests(&log));
    let steady_from = Instant::now();
    eprintln!(
        "  {name}: every App synced once after {:.1} s",
        first_syncs.as_secs_f64()
    );
    // The benchmark's duration is the measurement, not a wait for a condition.
    tokio::time::sleep(plan.run.saturating_sub(started.elapsed())).await;
    let requests = registry_requests(&log);
    let upstream = Traffic::of(&log).since(upstream_before);
    let mirror = mirror_before.map(|before| Traffic::of_all(&mirrors).since(before));
    let steady_requests = total(requests) - steady_before;
    let steady = steady_from.elapsed();
    let run = started.elapsed();
    let at_outage = snapshot(&seen)?;
    let [syncs, failed_syncs] = at_outage.totals();
    let requests = [requests[0] - before[0], requests[1] - before[1]];

    let attempts_before = holdfast()?;
    registry.stop();
    up.store(false, Ordering::Relaxed);
    eprintln!("  {name}: registry stopped for {} s", plan.outage.as_secs());
    tokio::time::sleep(plan.outage).await;
    let after = snapshot(&seen)?;
    let attempts_after = holdfast()?;
    let [after_syncs, after_failed] = after.totals();
    // The last sample while the registry is still down: a restarted registry starts a new
    // access log, which would read as no requests at all.
    stop.cancel();
    let samples = sampler.await?;
    watch.await?;
    registry.start().await?;
    up.store(true, Ordering::Relaxed);
    for api in &created {
        pause_all(api, plan.apps).await?;
    }
    Ok(Arm {
        name,
        requests,
        upstream,
        mirror,
        admitted: count(admitted),
        pinned_at_outage: at_outage.apps_by_registry(),
        steady_requests,
        steady,
        first_syncs,
        syncs,
        failed_syncs,
        outage_syncs: after_syncs - syncs,
        failed_in_outage: after_failed - failed_syncs,
        reaper_races: after.raced(),
        outage_attempts: Attempts {
            failed: attempts_after.failed - attempts_before.failed,
            backed_off: attempts_after.backed_off - attempts_before.backed_off,
        },
        run,
        samples,
    })
}

/// [`arm`] with holdfast in every cluster (`fleet`), stopped afterwards whatever the arm's
/// outcome; the arm and the controllers' metrics as they stopped.
async fn arm_with_holdfast(
    name: &'static str,
    fleet: Vec<Holdfast>,
    target: Target<'_>,
    plan: &Plan,
) -> Result<(Arm, Vec<String>)> {
    let ran = arm(name, target, plan, &|| Attempts::of_fleet(&fleet)).await;
    let metrics = Holdfast::stop_fleet(fleet).await;
    Ok((ran?, metrics?))
}

/// holdfast's registry lookups, the webhook's and the controller's together: those that failed
/// (what a stopped registry was sent), and the stale answers given without asking because the
/// entry's last check had failed within `--cache-negative-ttl-seconds` (its backoff).
#[derive(Debug, Default, Clone, Copy)]
struct Attempts {
    failed: u64,
    backed_off: u64,
}

impl Attempts {
    /// The fleet's, every cluster's holdfast together.
    fn of_fleet(fleet: &[Holdfast]) -> Result<Self> {
        fleet.iter().try_fold(Self::default(), |sum, holdfast| {
            let one = holdfast.attempts()?;
            Ok(Self {
                failed: sum.failed + one.failed,
                backed_off: sum.backed_off + one.backed_off,
            })
        })
    }

    fn of(webhook: &LocalWebhook, controller: &Metrics) -> Result<Self> {
        let text = encode(controller)?;
        let stats = &webhook.cache.stats;
        Ok(Self {
            failed: metric(&text, "holdfast_controller_registry_errors_total")?
                + stats.registry_errors.load(Ordering::Relaxed),
            backed_off: metric(&text, "holdfast_controller_registry_backoffs_total")?
                + stats.registry_backoffs.load(Ordering::Relaxed),
        })
    }
}

fn encode(metrics: &Metrics) -> Result<String> {
    metrics
        .encode()
        .map_err(|e| anyhow::anyhow!("encoding metrics: {e}"))
}

/// The sum of the series `series` over the fleet's controllers' metrics `texts`.
fn metrics_sum(texts: &[String], series: &str) -> Result<u64> {
    texts.iter().map(|text| metric(text, series)).sum()
}

/// The value of the series `series` (its name and labels as exported) in the metrics `text`.
fn metric(text: &str, series: &str) -> Result<u64> {
    let value = holdfast_e2e::metrics::value(text, series)
        .with_context(|| format!("the controller exports no {series} (or not as a number)"))?;
    anyhow::ensure!(
        value >= 0.0 && value.fract() == 0.0,
        "{series} is {value}, not a count"
    );
    Ok(value as u64)
}

/// holdfast as an arm runs it: the webhook registered as `registration` says, and the whole
/// controller (`run_observed`: the election, the refresher, every loop) with the shipped refresh
/// interval, plain HTTP to the registration's registries, and the mirror copier when `mirror`
/// is set.
struct Holdfast {
    webhook: LocalWebhook,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
    controller: JoinHandle<Result<(), holdfast_controller::run::Error>>,
}

impl Holdfast {
    async fn start(
        env: &Arc<Env>,
        registration: Registration,
        mirror: Option<MirrorSettings>,
    ) -> Result<Self> {
        let insecure = registration.insecure_registries.clone();
        let webhook = LocalWebhook::start(env.clone(), registration).await?;
        let mut settings = holdfast_e2e::controller::settings(env, &webhook.system_namespace, "bench");
        settings.refresh = REFRESH;
        settings.resolver.insecure_registries.extend(insecure);
        let cancel = CancellationToken::new();
        let metrics = Arc::new(Metrics::new());
        let controller = tokio::spawn(holdfast_controller::run::run_observed(
            env.client().await?,
            settings,
            mirror,
            metrics.clone(),
            Default::default(),
            cancel.clone(),
        ));
        Ok(Self {
            webhook,
            metrics,
            cancel,
            controller,
        })
    }

    fn attempts(&self) -> Result<Attempts> {
        Attempts::of(&self.webhook, &self.metrics)
    }

    /// Stops every cluster's holdfast; their controllers' metrics as they stopped.
    async fn stop_fleet(fleet: Vec<Self>) -> Result<Vec<String>> {
        let mut metrics = Vec::with_capacity(fleet.len());
        for holdfast in fleet {
            metrics.push(holdfast.stop().await?);
        }
        Ok(metrics)
    }

    /// Stops the controller, then the webhook; the controller's metrics as it stopped.
    async fn stop(self) -> Result<String> {
        self.cancel.cancel();
        self.controller.await??;
        let metrics = encode(&self.metrics)?;
        self.webhook.stop().await?;
        Ok(metrics)
    }
}

/// Opts the namespace out of holdfast (`holdfast.dev/ignore=true`), so that the next arm's
/// controller leaves the Apps of an arm that ended alone.
async fn opt_out(env: &Env, namespace: &str) -> Result<()> {
    let patch = serde_json::json!({"metadata": {"labels": {IGNORE_LABEL: "true"}}});
    Api::<Namespace>::all(env.client().await?)
        .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    holdfast_e2e::init();
    let apps = knob("BENCH_PINNING_APPS", 200)?;
    let tags = knob("BENCH_PINNING_TAGS", apps.div_ceil(20))?;
    let plan = Plan {
        apps,
        run: Duration::from_secs(60 * knob("BENCH_PINNING_MINUTES", 20)? as u64),
        outage: Duration::from_secs(60 * knob("BENCH_PINNING_OUTAGE_MINUTES", 5)? as u64),
    };
    let clusters = knob("BENCH_PINNING_CLUSTERS", 1)?;
    let mut envs = Vec::with_capacity(clusters);
    for _ in 0..clusters {
        let env = Arc::new(Env::start().await?);
        env.kapp_controller().await?;
        envs.push(env);
    }
    let env = &envs[0];
    println!(
        "bench-pinning: {apps} Apps over {tags} tags in each of {clusters} cluster(s), reconciled by the real kapp-controller, syncPeriod {} s, {} min + {} min registry outage per arm (without, with, with-mirror), holdfast refresh every {} s",
        SYNC_PERIOD.as_secs(),
        plan.run.as_secs() / 60,
        plan.outage.as_secs() / 60,
        REFRESH.as_secs()
    );

    // One upstream registry per arm for the whole fleet (on the first cluster's machine: every
    // cluster's kapp-controller and holdfast reach it).
    let mut without_registry = env.spare_registry().await?;
    let without_urls = push_configs(&without_registry, tags).await?;
    let mut targets = Vec::with_capacity(clusters);
    for env in &envs {
        targets.push(ClusterTarget {
            env,
            namespace: env
                .namespace_with_labels("without", &[(IGNORE_LABEL, "true")])
                .await?,
            mirror: None,
        });
    }
    let without = arm(
        "without",
        Target {
            clusters: targets,
            urls: &without_urls,
            registry: &mut without_registry,
        },
        &plan,
        &|| Ok(Attempts::default()),
    )
    .await?;
    without_registry.stop();

    let mut with_registry = env.spare_registry().await?;
    let with_urls = push_configs(&with_registry, tags).await?;
    let mut fleet = Vec::with_capacity(clusters);
    let mut targets = Vec::with_capacity(clusters);
    for env in &envs {
        let mut registration = Registration::shipped();
        registration.insecure_registries.push(with_registry.addr.clone());
        let holdfast = Holdfast::start(env, registration, None).await?;
        targets.push(ClusterTarget {
            env,
            namespace: holdfast.webhook.namespace("with").await?,
            mirror: None,
        });
        fleet.push(holdfast);
    }
    let with_namespaces: Vec<String> = targets.iter().map(|t| t.namespace.clone()).collect();
    let (with, with_metrics) = arm_with_holdfast(
        "with",
        fleet,
        Target {
            clusters: targets,
            urls: &with_urls,
            registry: &mut with_registry,
        },
        &plan,
    )
    .await?;
    with_registry.stop();
    for (env, namespace) in envs.iter().zip(&with_namespaces) {
        opt_out(env, namespace).await?;
    }

    // Each cluster its own mirror, as `--mirror-registry` is deployed: a cache registry beside
    // the cluster, which keeps its fetches working when the upstream (or the link to it) is down.
    let mut upstream = env.spare_registry().await?;
    let mirror_urls = push_configs(&upstream, tags).await?;
    let mut mirrors = Vec::with_capacity(clusters);
    let mut fleet = Vec::with_capacity(clusters);
    let mut targets = Vec::with_capacity(clusters);
    for env in &envs {
        let mirror = env.spare_registry().await?;
        let pins = MirrorPins::new(MirrorLocation::new(&mirror.addr, PREFIX)?);
        let (registration, settings) = holdfast_e2e::mirror::wiring(&upstream.addr, pins, None, RETENTION);
        let holdfast = Holdfast::start(env, registration, Some(settings)).await?;
        targets.push(ClusterTarget {
            env,
            namespace: holdfast.webhook.namespace("with-mirror").await?,
            mirror: Some(mirror.access_log()),
        });
        fleet.push(holdfast);
        mirrors.push(mirror);
    }
    let (with_mirror, mirror_metrics) = arm_with_holdfast(
        "with-mirror",
        fleet,
        Target {
            clusters: targets,
            urls: &mirror_urls,
            registry: &mut upstream,
        },
        &plan,
    )
    .await?;
    let rounds = metrics_sum(
        &with_metrics,
        "holdfast_controller_refresh_rounds_total{result=\"ok\"}",
    )?;
    let copies = metrics_sum(
        &mirror_metrics,
        "holdfast_controller_mirror_copies_total{result=\"copied\"}",
    )?;
    let upstream_addr = upstream.addr.clone();
    let mirror_addrs: Vec<String> = mirrors.iter().map(|m| m.addr.clone()).collect();
    upstream.stop();
    for mut mirror in mirrors {
        mirror.stop();
    }
    // Everything stopped before the figures, so that no late log line follows the last line.
    drop(envs);
    let fleet_apps = apps * clusters;

    println!(
        "{:<11} {:>9} {:>9} {:>11} {:>12} {:>7} {:>13} {:>7} {:>12} {:>16} {:>13} {:>12} {:>10}",
        "arm",
        "GET",
        "HEAD",
        "steady_req",
        "first_sync_s",
        "syncs",
        "syncs/app/min",
        "failed",
        "outage_syncs",
        "failed_in_outage",
        "steady_req/min",
        "reaper_races",
        "mirror_req"
    );
    let arms = [&without, &with, &with_mirror];
    for a in arms {
        println!(
            "{:<11} {:>9} {:>9} {:>11} {:>12.1} {:>7} {:>13.2} {:>7} {:>12} {:>16} {:>13.2} {:>12} {:>10}",
            a.name,
            a.requests[0],
            a.requests[1],
            a.steady_requests,
            a.first_syncs.as_secs_f64(),
            a.syncs,
            a.sync_rate(fleet_apps),
            a.failed_syncs,
            a.outage_syncs,
            a.failed_in_outage,
            a.steady_per_minute(),
            a.reaper_races,
            a.mirror.map_or("-".to_owned(), |m| m.total().to_string())
        );
    }
    // Who asked what, create to outage: holdfast (tag lookups, the copier) and kapp-controller.
    println!(
        "{:<20} {:>15} {:>6} {:>6} {:>6} {:>11} {:>6} {:>6} {:>6}",
        "requests by sender",
        "holdfast:HEAD_m",
        "GET_m",
        "GET_b",
        "other",
        "kapp:HEAD_m",
        "GET_m",
        "GET_b",
        "other"
    );
    let mut traffic: Vec<(String, Traffic)> = arms.iter().map(|a| (a.name.to_owned(), a.upstream)).collect();
    traffic.extend(
        with_mirror
            .mirror
            .map(|m| (format!("{} (mirror)", with_mirror.name), m)),
    );
    for (name, Traffic { holdfast: h, kapp: k }) in &traffic {
        println!(
            "{name:<20} {:>15} {:>6} {:>6} {:>6} {:>11} {:>6} {:>6} {:>6}",
            h.manifest_heads,
            h.manifest_gets,
            h.blob_gets,
            h.other,
            k.manifest_heads,
            k.manifest_gets,
            k.blob_gets,
            k.other
        );
    }
    bench_data::write(
        "pinning",
        &arms.iter().flat_map(|a| &a.samples).collect::<Vec<_>>(),
    )?;
    let ratio = total(without.requests) as f64 / total(with.requests).max(1) as f64;
    // No request at all in holdfast's steady state: the ratio is against one request.
    let with_steady = if with.steady_requests == 0 {
        println!(
            "with: no registry request in steady state; steady_state_ratio is against one request over that span"
        );
        1.0 / (with.steady.as_secs_f64() / 60.0)
    } else {
        with.steady_per_minute()
    };
    let steady_ratio = without.steady_per_minute() / with_steady;
    println!(
        "holdfast refresh rounds: {rounds}; schedule: {:.2} syncs per App per minute",
        60.0 / SYNC_PERIOD.as_secs_f64()
    );
    // vendir fetches with GETs only (the without arm has no HEAD), holdfast resolves with HEADs:
    // with holdfast, the GETs are kapp-controller's first fetch of each App (its cache is per
    // App, so no webhook can save them), the floor the run's ratio is bounded by.
    println!(
        "with: {} of {} requests are kapp-controller's first fetches (floor), {} are holdfast's HEADs",
        with.requests[0],
        total(with.requests),
        with.requests[1]
    );
    // What holdfast sent the stopped registry: at most one attempt per tag per negative TTL per
    // process, the other lookups answered stale without asking.
    println!(
        "with: during the outage holdfast's lookups failed {} times at the stopped registry and were answered stale without asking {} times ({} tags)",
        with.outage_attempts.failed, with.outage_attempts.backed_off, tags
    );
    // The mirror arm's upstream requests: holdfast's tag lookups, the copies (one GET per
    // manifest and blob of each digest) and kapp-controller's first fetches of the Apps admitted
    // pinned upstream, before the copy was recorded.
    let up = with_mirror.upstream;
    let on = |counts: &BTreeMap<String, usize>, registry: &str| counts.get(registry).copied().unwrap_or(0);
    let admitted_upstream = on(&with_mirror.admitted, &upstream_addr);
    let on_mirrors =
        |counts: &BTreeMap<String, usize>| mirror_addrs.iter().map(|m| on(counts, m)).sum::<usize>();
    let on_mirror = on_mirrors(&with_mirror.pinned_at_outage);
    println!(
        "with-mirror: {admitted_upstream} Apps admitted pinned upstream, {} to the mirror; {on_mirror} fetched from the mirror when the outage began; {copies} copies",
        on_mirrors(&with_mirror.admitted)
    );
    println!(
        "with-mirror: of {} upstream requests, {} are holdfast's HEADs, {} the copies' GETs ({} of manifests, {} of blobs), {} other of holdfast's, {} kapp-controller's (first fetches of Apps pinned upstream before the copy)",
        up.total(),
        up.holdfast.manifest_heads,
        up.holdfast.manifest_gets + up.holdfast.blob_gets,
        up.holdfast.manifest_gets,
        up.holdfast.blob_gets,
        up.holdfast.other,
        up.kapp.total()
    );
    println!(
        "with-mirror: during the upstream outage holdfast's lookups failed {} times and were answered stale without asking {} times",
        with_mirror.outage_attempts.failed, with_mirror.outage_attempts.backed_off
    );
    println!(
        "registry_request_ratio={ratio:.1} failed_syncs_without={} failed_syncs_with={} steady_state_ratio={steady_ratio:.0} apps={apps} sync_rate_without={:.2} sync_rate_with={:.2} holdfast_requests_with={} with_over_first_fetch_floor={:.3} reaper_races={} holdfast_failed_lookups_in_outage={} holdfast_backoffs_in_outage={} upstream_request_ratio_mirror={:.1} failed_syncs_with_mirror={} upstream_requests_with_mirror={} mirror_requests_with_mirror={} holdfast_heads_upstream_with_mirror={} copier_gets_upstream_with_mirror={} holdfast_other_upstream_with_mirror={} kapp_fetches_upstream_with_mirror={} apps_admitted_upstream_with_mirror={admitted_upstream} apps_on_mirror_with_mirror={on_mirror} mirror_copies_with_mirror={copies} sync_rate_with_mirror={:.2} reaper_races_with_mirror={} holdfast_failed_lookups_in_outage_with_mirror={} holdfast_backoffs_in_outage_with_mirror={} clusters={clusters} upstream_per_tag_per_refresh_without={:.2} upstream_per_tag_per_refresh_with={:.2} upstream_per_tag_per_refresh_with_mirror={:.2}",
        without.failed_in_outage,
        with.failed_in_outage,
        without.sync_rate(fleet_apps),
        with.sync_rate(fleet_apps),
        with.requests[1],
        total(with.requests) as f64 / with.requests[0].max(1) as f64,
        without.reaper_races + with.reaper_races,
        with.outage_attempts.failed,
        with.outage_attempts.backed_off,
        total(without.requests) as f64 / total(with_mirror.requests).max(1) as f64,
        with_mirror.failed_in_outage,
        total(with_mirror.requests),
        with_mirror.mirror.map_or(0, |m| m.total()),
        up.holdfast.manifest_heads,
        up.holdfast.manifest_gets + up.holdfast.blob_gets,
        up.holdfast.other,
        up.kapp.total(),
        with_mirror.sync_rate(fleet_apps),
        with_mirror.reaper_races,
        with_mirror.outage_attempts.failed,
        with_mirror.outage_attempts.backed_off,
        without.per_tag_per_refresh(tags),
        with.per_tag_per_refresh(tags),
        with_mirror.per_tag_per_refresh(tags)
    );
    Ok(())
}

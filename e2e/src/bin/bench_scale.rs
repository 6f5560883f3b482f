//! `make bench-scale`: holdfast's memory, CPU, restart time and admission latency as the cluster
//! grows, on the local control plane (Kubernetes 1.37), with the release `holdfast-webhook` and
//! `holdfast-controller` running as processes with their shipped defaults (`installed`, as
//! `make up` runs them) and measured from outside through `/proc`.
//!
//! The cluster grows in levels (`BENCH_SCALE_LEVELS`, default 1,000, 10,000 and 100,000
//! objects), created through the API server 100 at a time, each hundred in one of up to 500
//! namespaces: 18 kapp-controller Apps and 2 PackageRepositories naming one of up to 2,000 tags
//! (10 fetch references per tag at 100,000), each App then given a status of the size kapp's
//! deploy output gives it (`BENCH_SCALE_STATUS_BYTES`, 4,096); 15 kpack Images, each with one
//! Build it controls; 50 pods, 5 of them build pods (label `kpack.io/build`, controlled by a
//! Build). The pods name a scheduler nobody runs: holdfast does not watch pods, so they are
//! stored, admitted (build pods through the guard) and never run, which spares the two cores
//! 50,000 kwok pod lifecycles that would change nothing holdfast does.
//!
//! At each level, and once before the first (the "empty" cluster, which has only the churn
//! set):
//! - steady RSS once both processes are idle again, and peak RSS (VmHWM) so far;
//! - churn: `BENCH_SCALE_CHURN_PER_SECOND` (50) writes a second for `BENCH_SCALE_CHURN_SECONDS`
//!   (30) against a fixed churn set (App status and label updates, Image label updates, pod
//!   creates and deletes), while a probe creates Apps (a cached tag) one at a time: the probe's
//!   p50/p99, and each process's CPU per write of the window; the probe's Apps (thousands) are
//!   deleted after it, so that each level holds the objects it states;
//! - restart: the webhook is stopped (SIGTERM; it drains for its shutdown delay) and started
//!   again; seconds from the new process's start until its `/readyz` answers (reflectors
//!   synced, digest cache loaded, certificate served), against a bare kube
//!   reflector of the same kinds (metadata of namespaces, CFApps, BuildWorkloads, kpack Images
//!   and Builds; DigestCacheEntries whole) started in this process just before;
//! - the controller's next refresh round (`--refresh-seconds=60` here, the shipped per-registry
//!   budget of 8 concurrent requests) from its log line.
//!
//! The last line is `webhook_rss_mib=… controller_rss_mib=… ready_s=… admission_p99_ratio=…`
//! (peak RSS and ready seconds at the largest level; its probe p99 over the empty cluster's),
//! then more fields.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use futures::{FutureExt, StreamExt, TryStreamExt, stream};
use holdfast_e2e::{
    Env, bench_data,
    images::{self, Image},
    installed::{self, CONTROLLER, Installed, WEBHOOK},
    latency,
    process::{TICKS_PER_SECOND, Usage},
};
use holdfast_peers::{korifi, kpack};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client,
    api::PartialObjectMeta,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
        PatchParams, PostParams,
    },
    runtime::{
        reflector::{self, store::Writer},
        watcher,
    },
};
use serde::Serialize;
use serde_json::{Value, json};

/// Objects per block: one namespace's share of each kind, created by one worker in order.
const BLOCK: usize = 100;
const APPS_PER_BLOCK: usize = 18;
const REPOSITORIES_PER_BLOCK: usize = 2;
const IMAGES_PER_BLOCK: usize = 15;
const PODS_PER_BLOCK: usize = 45;
const BUILD_PODS_PER_BLOCK: usize = 5;
const MAX_NAMESPACES: usize = 500;
const MAX_TAGS: usize = 2_000;
/// Blocks created at once.
const WRITERS: usize = 32;
/// The churn set, fixed across levels.
const CHURN_APPS: usize = 100;
const CHURN_IMAGES: usize = 50;
const NO_SCHEDULER: &str = "holdfast-bench-unscheduled";
/// A process is idle when it used less than this share of a core over [`IDLE_WINDOW`].
const IDLE_SHARE: f64 = 0.05;
const IDLE_WINDOW: Duration = Duration::from_secs(3);
const SETTLE_TIMEOUT: Duration = Duration::from_secs(300);
/// The controller's refresh interval here (shipped: 600 s), so that each level sees a round.
const REFRESH_INTERVAL: Duration = Duration::from_secs(60);

fn setting<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Settings {
    levels: Vec<usize>,
    status_bytes: usize,
    churn_per_second: u32,
    churn: Duration,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let levels = std::env::var("BENCH_SCALE_LEVELS").unwrap_or_else(|_| "1000,10000,100000".into());
        let levels: Vec<usize> = levels
            .split(',')
            .map(|l| {
                l.trim()
                    .parse::<usize>()
                    .with_context(|| format!("BENCH_SCALE_LEVELS: {l:?}"))
            })
            .collect::<Result<_>>()?;
        ensure!(
            levels.windows(2).all(|w| w[0] < w[1]) && levels.iter().all(|l| *l >= BLOCK),
            "BENCH_SCALE_LEVELS must grow, each at least {BLOCK}"
        );
        Ok(Self {
            levels,
            status_bytes: setting("BENCH_SCALE_STATUS_BYTES", 4096),
            churn_per_second: setting("BENCH_SCALE_CHURN_PER_SECOND", 50),
            churn: Duration::from_secs(setting("BENCH_SCALE_CHURN_SECONDS", 30)),
        })
    }
}

fn resource(gvk: GroupVersionKind) -> ApiResource {
    ApiResource::from_gvk(&gvk)
}

fn app_resource() -> ApiResource {
    resource(GroupVersionKind::gvk("kappctrl.k14s.io", "v1alpha1", "App"))
}

fn repository_resource() -> ApiResource {
    resource(GroupVersionKind::gvk(
        "packaging.carvel.dev",
        "v1alpha1",
        "PackageRepository",
    ))
}

#[tokio::main]
async fn main() -> Result<()> {
    holdfast_e2e::init();
    let settings = Settings::from_env()?;
    let mut env = Env::start().await?;
    let largest = *settings.levels.last().context("no level")?;
    let tags = (largest / BLOCK * (APPS_PER_BLOCK + REPOSITORIES_PER_BLOCK)).clamp(1, MAX_TAGS);
    push_tags(env.registry(), tags).await?;
    let holdfast = installed::start(
        &mut env,
        installed::Options {
            scope: None,
            // Rounds often enough to see one per level; the registry budget is the shipped one.
            controller: Some(vec![format!("--refresh-seconds={}", REFRESH_INTERVAL.as_secs())]),
            webhook: Vec::new(),
        },
    )
    .await?;
    holdfast.controller_ready().await?;
    let client = env.client().await?;
    let bench = Bench {
        client: client.clone(),
        registry: env.registry().to_string(),
        tags,
        status: status(settings.status_bytes),
    };
    let churn = bench.churn_set().await?;

    println!(
        "{:>8} {:>10} {:>22} {:>22} {:>16} {:>24} {:>16} {:>10}",
        "objects",
        "create_s",
        "webhook MiB now/peak",
        "controller MiB now/peak",
        "cpu_ms/write w/c",
        "probe p50/p99/floor p99",
        "ready_s w/bare/c",
        "refresh_s"
    );
    let mut rows = Vec::new();
    let empty = bench
        .level(&mut env, &holdfast, &churn, &settings, 0, 0.0)
        .await?;
    empty.print();
    rows.push(empty);
    let mut created = 0;
    for level in settings.levels.iter().copied() {
        let started = Instant::now();
        bench.populate(created / BLOCK, level / BLOCK).await?;
        let create_s = started.elapsed().as_secs_f64();
        created = level / BLOCK * BLOCK;
        let row = bench
            .level(&mut env, &holdfast, &churn, &settings, created, create_s)
            .await?;
        row.print();
        rows.push(row);
    }
    bench_data::write("scale", &rows.iter().map(DataRow::from).collect::<Vec<_>>())?;
    let (first, last) = (&rows[0], rows.last().context("no level measured")?);
    println!(
        "webhook_rss_mib={:.1} controller_rss_mib={:.1} ready_s={:.2} admission_p99_ratio={:.2} objects={} \
         webhook_steady_mib={:.1} controller_steady_mib={:.1} bare_reflector_s={:.2} ready_ratio={:.2} \
         controller_ready_s={:.2} refresh_round_s={} tags={tags} floor_p99_ratio={:.2}",
        last.webhook.peak_rss_mib(),
        last.controller.peak_rss_mib(),
        last.ready_s,
        last.probe_p99_ms / first.probe_p99_ms,
        last.objects,
        last.webhook.rss_mib(),
        last.controller.rss_mib(),
        last.bare_s,
        last.ready_s / last.bare_s,
        last.controller_ready_s,
        last.refresh_s.map_or("n/a".into(), |s| format!("{s:.1}")),
        last.floor_p99_ms / first.floor_p99_ms,
    );
    Ok(())
}

struct Row {
    objects: usize,
    create_s: f64,
    webhook: Usage,
    controller: Usage,
    webhook_cpu_ms_per_write: f64,
    controller_cpu_ms_per_write: f64,
    probe_p50_ms: f64,
    probe_p99_ms: f64,
    /// The probe's p99 in a namespace holdfast ignores (the same API server's floor).
    floor_p99_ms: f64,
    ready_s: f64,
    bare_s: f64,
    controller_ready_s: f64,
    refresh_s: Option<f64>,
}

/// One level, as `scale.csv` holds it.
#[derive(Serialize)]
struct DataRow {
    objects: usize,
    create_s: f64,
    webhook_rss_mib: f64,
    webhook_peak_rss_mib: f64,
    controller_rss_mib: f64,
    controller_peak_rss_mib: f64,
    webhook_cpu_ms_per_write: f64,
    controller_cpu_ms_per_write: f64,
    probe_p50_ms: f64,
    probe_p99_ms: f64,
    floor_p99_ms: f64,
    webhook_ready_s: f64,
    bare_reflector_ready_s: f64,
    controller_ready_s: f64,
    refresh_round_s: Option<f64>,
}

impl From<&Row> for DataRow {
    fn from(row: &Row) -> Self {
        DataRow {
            objects: row.objects,
            create_s: row.create_s,
            webhook_rss_mib: row.webhook.rss_mib(),
            webhook_peak_rss_mib: row.webhook.peak_rss_mib(),
            controller_rss_mib: row.controller.rss_mib(),
            controller_peak_rss_mib: row.controller.peak_rss_mib(),
            webhook_cpu_ms_per_write: row.webhook_cpu_ms_per_write,
            controller_cpu_ms_per_write: row.controller_cpu_ms_per_write,
            probe_p50_ms: row.probe_p50_ms,
            probe_p99_ms: row.probe_p99_ms,
            floor_p99_ms: row.floor_p99_ms,
            webhook_ready_s: row.ready_s,
            bare_reflector_ready_s: row.bare_s,
            controller_ready_s: row.controller_ready_s,
            refresh_round_s: row.refresh_s,
        }
    }
}

impl Row {
    fn print(&self) {
        println!(
            "{:>8} {:>10.1} {:>22} {:>22} {:>16} {:>24} {:>16} {:>10}",
            self.objects,
            self.create_s,
            format!("{:.1}/{:.1}", self.webhook.rss_mib(), self.webhook.peak_rss_mib()),
            format!(
                "{:.1}/{:.1}",
                self.controller.rss_mib(),
                self.controller.peak_rss_mib()
            ),
            format!(
                "{:.3}/{:.3}",
                self.webhook_cpu_ms_per_write, self.controller_cpu_ms_per_write
            ),
            format!(
                "{:.1}/{:.1}/{:.1}",
                self.probe_p50_ms, self.probe_p99_ms, self.floor_p99_ms
            ),
            format!(
                "{:.2}/{:.2}/{:.2}",
                self.ready_s, self.bare_s, self.controller_ready_s
            ),
            self.refresh_s.map_or("n/a".into(), |s| format!("{s:.1}")),
        );
    }
}

/// The tags `scale/config:t<i>` for `i < count`, one small image.
async fn push_tags(registry: &str, count: usize) -> Result<()> {
    let image = Arc::new(Image::with_files(&[("config.yml", b"scale: true\n")])?);
    // The blobs once; then only the manifest under each tag.
    images::push(registry, "scale/config", "t0", &image).await?;
    stream::iter(1..count)
        .map(|i| {
            let image = image.clone();
            async move { images::retag(registry, "scale/config", &format!("t{i}"), &image).await }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// A kapp-controller App status with `bytes` of deploy output, as kapp writes it.
fn status(bytes: usize) -> Value {
    let line = "8:01:02AM: ---- applying 1 changes [0/1 done] ----\n";
    let stdout: String = line.repeat(bytes / line.len() + 1).chars().take(bytes).collect();
    json!({"status": {
        "friendlyDescription": "Reconcile succeeded",
        "observedGeneration": 1,
        "conditions": [{"type": "ReconcileSucceeded", "status": "True"}],
        "deploy": {"exitCode": 0, "finished": true, "stdout": stdout, "startedAt": "2026-12-01T08:01:02Z", "updatedAt": "2026-12-01T08:01:03Z"},
        "fetch": {"exitCode": 0, "startedAt": "2026-12-01T08:01:00Z", "updatedAt": "2026-12-01T08:01:01Z"},
        "template": {"exitCode": 0, "updatedAt": "2026-12-01T08:01:02Z"},
        "consecutiveReconcileSuccesses": 1
    }})
}

struct Bench {
    client: Client,
    registry: String,
    tags: usize,
    status: Value,
}

/// What the churn writes to, the same at every level.
struct ChurnSet {
    namespace: String,
    probe_namespace: String,
    /// Labelled `holdfast.dev/ignore=true`: no webhook of holdfast's serves it.
    floor_namespace: String,
}

fn owner(object: &Value) -> Value {
    json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
           "name": object["metadata"]["name"], "uid": object["metadata"]["uid"], "controller": true})
}

impl Bench {
    fn tag(&self, n: usize) -> String {
        format!("{}/scale/config:t{}", self.registry, n % self.tags)
    }

    async fn namespace(&self, name: &str) -> Result<()> {
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        // Pods are refused until the namespace's default ServiceAccount exists.
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(self.client.clone(), name);
        let deadline = Instant::now() + Duration::from_secs(60);
        while accounts.get_opt("default").await?.is_none() {
            ensure!(Instant::now() < deadline, "no default ServiceAccount in {name}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn create(&self, namespace: &str, resource: &ApiResource, object: Value) -> Result<Value> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, resource);
        let created = api
            .create(&PostParams::default(), &serde_json::from_value(object)?)
            .await
            .with_context(|| format!("creating a {} in {namespace}", resource.kind))?;
        Ok(serde_json::to_value(created)?)
    }

    fn app(&self, name: &str, n: usize) -> Value {
        json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App", "metadata": {"name": name},
            "spec": {"serviceAccountName": "default", "fetch": [{"image": {"url": self.tag(n)}}],
                     "template": [{"ytt": {}}], "deploy": [{"kapp": {}}]}
        })
    }

    fn image(&self, name: &str) -> Value {
        json!({
            "apiVersion": "kpack.io/v1alpha2", "kind": "Image",
            "metadata": {"name": name, "labels": {korifi::BUILD_WORKLOAD_LABEL: name}},
            "spec": {"tag": format!("{}/scale/droplets/{name}", self.registry), "serviceAccountName": "default",
                     "builder": {"kind": "ClusterBuilder", "name": "scale"},
                     "source": {"registry": {"image": format!("{}/scale/source", self.registry)}}}
        })
    }

    fn build(&self, image: &Value) -> Value {
        let name = format!(
            "{}-build-1",
            image["metadata"]["name"].as_str().unwrap_or_default()
        );
        json!({
            "apiVersion": "kpack.io/v1alpha2", "kind": "Build",
            "metadata": {"name": name, "labels": {kpack::IMAGE_LABEL: image["metadata"]["name"]},
                         "ownerReferences": [owner(image)]},
            "spec": {"tags": [image["spec"]["tag"]], "builder": {"image": format!("{}/scale/builder", self.registry)},
                     "serviceAccountName": "default", "source": {"registry": {"image": format!("{}/scale/source", self.registry)}}}
        })
    }

    fn pod(name: &str, build: Option<&Value>) -> Value {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": NO_SCHEDULER, "automountServiceAccountToken": false, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "example.invalid/app:1"}]}
        });
        if let Some(build) = build {
            pod["metadata"]["labels"] = json!({kpack::BUILD_POD_LABEL: build["metadata"]["name"]});
            pod["metadata"]["ownerReferences"] = json!([owner(build)]);
        }
        pod
    }

    /// Creates block `b`'s hundred objects in its namespace.
    async fn block(&self, b: usize) -> Result<()> {
        let namespace = format!("scale-{}", b % MAX_NAMESPACES);
        let apps = app_resource();
        let mut n = b * (APPS_PER_BLOCK + REPOSITORIES_PER_BLOCK);
        for i in 0..APPS_PER_BLOCK {
            let name = format!("app-{b}-{i}");
            self.create(&namespace, &apps, self.app(&name, n)).await?;
            n += 1;
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &namespace, &apps)
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&self.status))
                .await
                .with_context(|| format!("writing the status of App {name}"))?;
        }
        for i in 0..REPOSITORIES_PER_BLOCK {
            let repository = json!({
                "apiVersion": "packaging.carvel.dev/v1alpha1", "kind": "PackageRepository",
                "metadata": {"name": format!("repo-{b}-{i}")},
                "spec": {"fetch": {"imgpkgBundle": {"image": self.tag(n)}}}
            });
            self.create(&namespace, &repository_resource(), repository)
                .await?;
            n += 1;
        }
        let mut builds = Vec::new();
        for i in 0..IMAGES_PER_BLOCK {
            let image = self
                .create(
                    &namespace,
                    &resource(kpack::image()),
                    self.image(&format!("img-{b}-{i}")),
                )
                .await?;
            builds.push(
                self.create(&namespace, &resource(kpack::build()), self.build(&image))
                    .await?,
            );
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
        for i in 0..PODS_PER_BLOCK + BUILD_PODS_PER_BLOCK {
            let build = (i >= PODS_PER_BLOCK).then(|| &builds[i - PODS_PER_BLOCK]);
            pods.create(
                &PostParams::default(),
                &serde_json::from_value(Self::pod(&format!("pod-{b}-{i}"), build))?,
            )
            .await
            .with_context(|| format!("creating pod-{b}-{i} in {namespace}"))?;
        }
        Ok(())
    }

    /// Blocks `from..to`, [`WRITERS`] at a time.
    async fn populate(&self, from: usize, to: usize) -> Result<()> {
        for ns in from.min(MAX_NAMESPACES)..to.min(MAX_NAMESPACES) {
            self.namespace(&format!("scale-{ns}")).await?;
        }
        stream::iter(from..to)
            .map(|b| self.block(b))
            .buffer_unordered(WRITERS)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    async fn churn_set(&self) -> Result<ChurnSet> {
        let set = ChurnSet {
            namespace: "scale-churn".into(),
            probe_namespace: "scale-probe".into(),
            floor_namespace: "scale-probe-floor".into(),
        };
        self.namespace(&set.namespace).await?;
        self.namespace(&set.probe_namespace).await?;
        self.namespace(&set.floor_namespace).await?;
        let ignore = json!({"metadata": {"labels": {"holdfast.dev/ignore": "true"}}});
        Api::<Namespace>::all(self.client.clone())
            .patch(
                &set.floor_namespace,
                &PatchParams::default(),
                &Patch::Merge(&ignore),
            )
            .await?;
        for i in 0..CHURN_APPS {
            self.create(
                &set.namespace,
                &app_resource(),
                self.app(&format!("churn-{i}"), i),
            )
            .await?;
        }
        for i in 0..CHURN_IMAGES {
            self.create(
                &set.namespace,
                &resource(kpack::image()),
                self.image(&format!("churn-{i}")),
            )
            .await?;
        }
        Ok(set)
    }

    /// Writes at a fixed rate for the churn window while the probe creates Apps one at a time;
    /// the probe's latencies and the writes made (the probe's included).
    async fn churn(
        &self,
        set: &ChurnSet,
        settings: &Settings,
        round: usize,
    ) -> Result<([Vec<Duration>; 2], u64)> {
        let writes = Arc::new(AtomicU64::new(0));
        let end = Instant::now() + settings.churn;
        let probe = {
            let (client, writes) = (self.client.clone(), writes.clone());
            let namespaces = [set.probe_namespace.clone(), set.floor_namespace.clone()];
            let app = self.app("probe", 0);
            async move {
                let apis = namespaces
                    .map(|ns| Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &app_resource()));
                let mut latencies = [Vec::new(), Vec::new()];
                let mut i = 0;
                while Instant::now() < end {
                    let mut object = app.clone();
                    object["metadata"]["name"] = json!(format!("probe-{round}-{i}"));
                    // Alternately served by holdfast and ignored by it: the floor of the same
                    // API server at the same size.
                    let arm = i % 2;
                    i += 1;
                    let sent = Instant::now();
                    apis[arm]
                        .create(&PostParams::default(), &serde_json::from_value(object)?)
                        .await
                        .context("probe App CREATE")?;
                    latencies[arm].push(sent.elapsed());
                    writes.fetch_add(1, Ordering::Relaxed);
                }
                anyhow::Ok(latencies)
            }
        };
        let writer = async {
            let mut tick = tokio::time::interval(Duration::from_secs(1) / settings.churn_per_second);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut in_flight = futures::stream::FuturesUnordered::new();
            let mut i = 0usize;
            while Instant::now() < end {
                tokio::select! {
                    _ = tick.tick() => {
                        in_flight.push(self.churn_write(set, round, i));
                        i += 1;
                    }
                    Some(done) = in_flight.next() => {
                        writes.fetch_add(done?, Ordering::Relaxed);
                    }
                }
            }
            while let Some(done) = in_flight.next().await {
                writes.fetch_add(done?, Ordering::Relaxed);
            }
            anyhow::Ok(())
        };
        let (latencies, written) = tokio::join!(probe, writer);
        written?;
        Ok((latencies?, writes.load(Ordering::Relaxed)))
    }

    /// Deletes the Apps the probe created, so that the next level's cluster holds the objects it
    /// states (a churn window's probe creates thousands, which the controller would keep).
    async fn delete_probes(&self, set: &ChurnSet) -> Result<()> {
        for namespace in [&set.probe_namespace, &set.floor_namespace] {
            Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &app_resource())
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
                .with_context(|| format!("deleting the probe's Apps in {namespace}"))?;
        }
        Ok(())
    }

    /// One churn turn: App status, App label, Image label, or a pod created and deleted, in
    /// turn; the writes it made.
    async fn churn_write(&self, set: &ChurnSet, round: usize, i: usize) -> Result<u64> {
        let ns = &set.namespace;
        let apps: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &app_resource());
        let label = json!({"metadata": {"labels": {"bench.holdfast.dev/churn": format!("r{round}-{i}")}}});
        let pod_name = |k: usize| format!("churn-{round}-{k}");
        match i % 4 {
            0 => {
                let mut status = self.status.clone();
                status["status"]["deploy"]["updatedAt"] =
                    json!(format!("2026-12-01T09:{:02}:{:02}Z", (i / 60) % 60, i % 60));
                apps.patch_status(
                    &format!("churn-{}", i % CHURN_APPS),
                    &PatchParams::default(),
                    &Patch::Merge(&status),
                )
                .await?;
            }
            1 => {
                apps.patch(
                    &format!("churn-{}", i % CHURN_APPS),
                    &PatchParams::default(),
                    &Patch::Merge(&label),
                )
                .await?;
            }
            2 => {
                Api::<DynamicObject>::namespaced_with(self.client.clone(), ns, &resource(kpack::image()))
                    .patch(
                        &format!("churn-{}", i % CHURN_IMAGES),
                        &PatchParams::default(),
                        &Patch::Merge(&label),
                    )
                    .await?;
            }
            _ => {
                // A pod created and deleted in turn (two writes).
                let pods = Api::<Pod>::namespaced(self.client.clone(), ns);
                pods.create(
                    &PostParams::default(),
                    &serde_json::from_value(Self::pod(&pod_name(i), None))?,
                )
                .await?;
                pods.delete(&pod_name(i), &DeleteParams::default().grace_period(0))
                    .await?;
                return Ok(2);
            }
        }
        Ok(1)
    }

    /// Everything measured at one size of the cluster.
    async fn level(
        &self,
        env: &mut Env,
        holdfast: &Installed,
        set: &ChurnSet,
        settings: &Settings,
        objects: usize,
        create_s: f64,
    ) -> Result<Row> {
        let pids = |env: &Env| -> Result<(u32, u32)> {
            Ok((
                env.pid_of(WEBHOOK).context("holdfast-webhook is not running")?,
                env.pid_of(CONTROLLER)
                    .context("holdfast-controller is not running")?,
            ))
        };
        let (webhook_pid, controller_pid) = pids(env)?;
        settle(&[webhook_pid, controller_pid]).await?;
        let (webhook, controller) = (Usage::of(Some(webhook_pid))?, Usage::of(Some(controller_pid))?);
        let refresh_s = next_refresh_round(env).await?;
        let (latencies, writes) = self.churn(set, settings, objects).await?;
        let (webhook_after, controller_after) =
            (Usage::of(Some(webhook_pid))?, Usage::of(Some(controller_pid))?);
        self.delete_probes(set).await?;
        let per_write = |before: &Usage, after: &Usage| {
            (after.cpu_ticks - before.cpu_ticks) as f64 / TICKS_PER_SECOND * 1e3 / writes.max(1) as f64
        };
        let [served, floor] = latencies;
        let (p50, p99) = latency::p50_p99_ms(served);
        let (_, floor_p99) = latency::p50_p99_ms(floor);
        let bare_s = bare_reflector(&self.client).await?;
        // From the new process's start: the old one's drain (the webhook's 5 s
        // --shutdown-delay-seconds) is not the new one's start-up.
        let restarted = holdfast.restart(env, WEBHOOK)?;
        holdfast.webhook_ready().await?;
        let ready_s = restarted.elapsed().as_secs_f64();
        let restarted = holdfast.restart(env, CONTROLLER)?;
        holdfast.controller_ready().await?;
        let controller_ready_s = restarted.elapsed().as_secs_f64();
        Ok(Row {
            objects,
            create_s,
            // Peak RSS is the first process's (VmHWM does not survive the restart).
            webhook: Usage {
                peak_rss_kib: webhook_after.peak_rss_kib,
                ..webhook
            },
            controller: Usage {
                peak_rss_kib: controller_after.peak_rss_kib,
                ..controller
            },
            webhook_cpu_ms_per_write: per_write(&webhook, &webhook_after),
            controller_cpu_ms_per_write: per_write(&controller, &controller_after),
            probe_p50_ms: p50,
            probe_p99_ms: p99,
            floor_p99_ms: floor_p99,
            ready_s,
            bare_s,
            controller_ready_s,
            refresh_s,
        })
    }
}

/// Waits until every process in `pids` used less than [`IDLE_SHARE`] of a core over
/// [`IDLE_WINDOW`]: the work the last writes caused is done.
async fn settle(pids: &[u32]) -> Result<()> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let before: Vec<u64> = pids
            .iter()
            .map(|p| Usage::of(Some(*p)).map(|u| u.cpu_ticks))
            .collect::<Result<_>>()?;
        tokio::time::sleep(IDLE_WINDOW).await;
        let busy =
            pids.iter()
                .zip(before)
                .map(|(p, b)| {
                    Ok((Usage::of(Some(*p))?.cpu_ticks - b) as f64
                        / TICKS_PER_SECOND
                        / IDLE_WINDOW.as_secs_f64())
                })
                .collect::<Result<Vec<f64>>>()?;
        if busy.iter().all(|share| *share < IDLE_SHARE) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("holdfast still busy after {SETTLE_TIMEOUT:?}: {busy:?} of a core");
        }
    }
}

/// Seconds until a plain kube reflector of the kinds the webhook watches has listed them all:
/// metadata of namespaces, CFApps, BuildWorkloads, kpack Images and Builds, and the
/// DigestCacheEntries whole.
async fn bare_reflector(client: &Client) -> Result<f64> {
    let started = Instant::now();
    let metadata = [
        ApiResource::erase::<Namespace>(&()),
        resource(korifi::cf_app()),
        resource(korifi::build_workload()),
        resource(kpack::image()),
        resource(kpack::build()),
    ];
    let mut synced: Vec<futures::future::BoxFuture<'_, Result<()>>> = Vec::new();
    for r in metadata {
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &r);
        let stream = reflector::reflector(Writer::new(r.clone()), watcher(api, watcher::Config::default()));
        synced.push(until_listed(stream.boxed()).boxed());
    }
    let entry = resource(GroupVersionKind::gvk(
        "holdfast.dev",
        "v1alpha1",
        "DigestCacheEntry",
    ));
    let entries: Api<DynamicObject> = Api::all_with(client.clone(), &entry);
    let stream = reflector::reflector(
        Writer::new(entry.clone()),
        watcher(entries, watcher::Config::default()),
    );
    synced.push(until_listed(stream.boxed()).boxed());
    futures::future::try_join_all(synced).await?;
    Ok(started.elapsed().as_secs_f64())
}

async fn until_listed<K>(
    mut stream: futures::stream::BoxStream<'_, Result<watcher::Event<K>, watcher::Error>>,
) -> Result<()> {
    while let Some(event) = stream.next().await {
        if matches!(event?, watcher::Event::InitDone) {
            return Ok(());
        }
    }
    bail!("the watch ended before its first list")
}

/// Seconds the controller's next refresh round takes, from its log (`refresh round` lines carry
/// `elapsed_ms`): waits for a round after those already logged, for at most a refresh interval
/// and its jitter past the term's start (`None` if none came).
async fn next_refresh_round(env: &Env) -> Result<Option<f64>> {
    let path = env
        .log_path(CONTROLLER)
        .context("holdfast-controller has no log")?
        .to_path_buf();
    let rounds = |log: &str| -> Vec<f64> {
        log.lines()
            .filter(|l| l.contains("refresh round"))
            .filter_map(|l| {
                let (_, rest) = l.split_once("elapsed_ms=")?;
                rest.split_whitespace().next()?.parse::<f64>().ok()
            })
            .collect()
    };
    let seen = rounds(&std::fs::read_to_string(&path)?).len();
    let deadline = Instant::now() + REFRESH_INTERVAL.mul_f64(1.2) + Duration::from_secs(20);
    // A log file has nothing to watch: polled, as a log shipper would.
    while Instant::now() < deadline {
        let now = rounds(&std::fs::read_to_string(&path)?);
        if now.len() > seen {
            return Ok(now.last().map(|ms| ms / 1e3));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(None)
}

//! Prometheus metrics of the controller, served on its admin port ([`crate::admin`]): the
//! reconciles of every controller, the leader's status, the refresher's rounds, the mirror's
//! copies and deletions, and the digest cache's figures (with the registry requests it made).
//!
//! Every metric is recorded where the work happens (no polling); the label values are
//! constants, so recording allocates nothing after a label set's first use.

use std::{
    future::Future,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use holdfast_cache::{DigestCache, metrics::CacheCollector};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `pinning` or `finalizer`.
    pub controller: &'static str,
    /// The kind reconciled (App, PackageRepository, Package; CFApp, BuildWorkload, Build,
    /// Namespace).
    pub kind: &'static str,
    /// `ok` or `error`.
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub controller: &'static str,
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FetchKindLabels {
    /// App or PackageRepository (the kinds kapp-controller syncs).
    pub kind: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PeerLabels {
    pub group: String,
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

type Durations = Family<KindLabels, Histogram, fn() -> Histogram>;

/// The longest one reconcile may take: every call in it has its own timeout (the resolver's,
/// the API client's), so only a reconcile stuck in a loop of them or in something unbounded
/// reaches it.
pub const RECONCILE_DEADLINE: Duration = Duration::from_secs(60);

/// A reconcile dropped at [`RECONCILE_DEADLINE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the reconcile did not finish within {0:?}")]
pub struct DeadlineExceeded(pub Duration);

/// 1 ms to 30 s: a reconcile answered from the caches takes milliseconds, one that waits on the
/// API server or a registry (bounded by the resolver's timeout) seconds.
const DURATION_BUCKETS: [f64; 13] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

pub struct Metrics {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Durations,
    leader: Gauge,
    refresh_rounds: Family<ResultLabels, Counter>,
    refresh_tags_checked: Counter,
    refresh_tags_moved: Counter,
    refresh_entries_collected: Counter,
    refresh_round_durations: Histogram,
    mirror_copies: Family<ResultLabels, Counter>,
    mirror_copied_bytes: Counter,
    mirror_deletions: Family<ResultLabels, Counter>,
    fetches_avoided: Family<FetchKindLabels, Counter>,
    bundle_moves_cached: Family<FetchKindLabels, Counter>,
    peer_apis: Family<PeerLabels, Gauge>,
    /// The digest cache, once the controller built it.
    cache: Arc<OnceLock<Arc<DigestCache>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("holdfast_controller");
        // No `_total` suffixes: the encoder adds them (prometheus-client panics if given one).
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles by controller (pinning, finalizer), kind and result (ok, error)",
            reconciles.clone(),
        );
        let durations: Durations = Family::new_with_constructor(duration_histogram);
        registry.register(
            "reconcile_duration_seconds",
            "Time a reconcile took, by controller and kind",
            durations.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the Lease and reconciles, 0 while it stands by",
            leader.clone(),
        );
        let refresh_rounds = Family::<ResultLabels, Counter>::default();
        registry.register(
            "refresh_rounds",
            "Refresh rounds by result: ok, failed (skipped: not every pinned kind listed yet; nothing refreshed)",
            refresh_rounds.clone(),
        );
        let refresh_tags_checked = Counter::default();
        registry.register(
            "refresh_tags_checked",
            "Cache keys (tags, tag selections) the refresher asked the registry about",
            refresh_tags_checked.clone(),
        );
        let refresh_tags_moved = Counter::default();
        registry.register(
            "refresh_tags_moved",
            "Cache keys the refresher found holding another digest than before",
            refresh_tags_moved.clone(),
        );
        let refresh_entries_collected = Counter::default();
        registry.register(
            "refresh_entries_collected",
            "Digest cache entries deleted because no object named them for the grace period",
            refresh_entries_collected.clone(),
        );
        // 10 ms to 20 min: a round asks the registry once per named key, within the per-registry
        // budget, so it grows with the number of unique tags.
        let refresh_round_durations = Histogram::new([
            0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0,
        ]);
        registry.register(
            "refresh_round_duration_seconds",
            "How long each refresh round that ran took",
            refresh_round_durations.clone(),
        );
        let mirror_copies = Family::<ResultLabels, Counter>::default();
        registry.register(
            "mirror_copies",
            "Mirror copies finished, by result: copied, failed (retried with backoff), given_up (permanent: not retried while the tag holds that digest)",
            mirror_copies.clone(),
        );
        let mirror_copied_bytes = Counter::default();
        registry.register(
            "mirror_copied_bytes",
            "Bytes of blobs and manifests sent to the mirror (not those already there or mounted)",
            mirror_copied_bytes.clone(),
        );
        let mirror_deletions = Family::<ResultLabels, Counter>::default();
        registry.register(
            "mirror_deletions",
            "Retention's deletions of unreferenced mirror copies, by result: deleted, kept (referenced again, or held by a referenced index or bundle), failed",
            mirror_deletions.clone(),
        );
        let fetches_avoided = Family::<FetchKindLabels, Counter>::default();
        registry.register(
            "fetches_avoided",
            "Fetch sources kapp-controller synced by holdfast's digest instead of resolving a tag at the registry: each sync (status.fetch.startedAt moved) of an App or PackageRepository adds its pins in place; counted by the leader",
            fetches_avoided.clone(),
        );
        let bundle_moves_cached = Family::<FetchKindLabels, Counter>::default();
        registry.register(
            "bundle_moves_cached",
            "Bundle references the controller moved to another location of the same digest (to the mirror's copy, or back) in an App or PackageRepository kapp-controller had fetched and may keep in its per-object cache with the images' earlier locations (a BundleLocationCached Event each)",
            bundle_moves_cached.clone(),
        );
        let peer_apis = Family::<PeerLabels, Gauge>::default();
        registry.register(
            "peer_api_served",
            "1 when the leader's term follows or finalizes the peer's kind (its API was served as the term started), 0 while not (a new term starts once it is)",
            peer_apis.clone(),
        );
        // Every label value the counters below take, at 0 from the start: a family without
        // samples is not exported, and a series that first appears at 1 shows no `increase()`
        // (the alert on the first mirror copy given up would never fire).
        for result in ["ok", "failed"] {
            drop(refresh_rounds.get_or_create(&ResultLabels { result }));
        }
        for result in ["copied", "failed", "given_up"] {
            drop(mirror_copies.get_or_create(&ResultLabels { result }));
        }
        for result in ["deleted", "kept", "failed"] {
            drop(mirror_deletions.get_or_create(&ResultLabels { result }));
        }
        for kind in ["App", "PackageRepository"] {
            drop(fetches_avoided.get_or_create(&FetchKindLabels { kind }));
            drop(bundle_moves_cached.get_or_create(&FetchKindLabels { kind }));
        }
        let cache = Arc::new(OnceLock::new());
        registry.register_collector(Box::new(LateCache(cache.clone())));
        Self {
            registry,
            reconciles,
            durations,
            leader,
            refresh_rounds,
            refresh_tags_checked,
            refresh_tags_moved,
            refresh_entries_collected,
            refresh_round_durations,
            mirror_copies,
            mirror_copied_bytes,
            mirror_deletions,
            fetches_avoided,
            bundle_moves_cached,
            peer_apis,
            cache,
        }
    }

    /// The peers' kinds a term started with: served or not.
    pub fn peer_apis(&self, served: &holdfast_peers::Served) {
        for (gvk, is_served) in served.kinds() {
            let labels = PeerLabels {
                group: gvk.group.clone(),
                kind: gvk.kind.clone(),
            };
            self.peer_apis.get_or_create(&labels).set(i64::from(is_served));
        }
    }

    /// Reports the figures of `cache` (the first cache given; the controller has one).
    pub fn follow_cache(&self, cache: Arc<DigestCache>) {
        let _ = self.cache.set(cache);
    }

    /// Runs one reconcile within [`RECONCILE_DEADLINE`], counting it by its result and timing
    /// it. Past the deadline the reconcile is dropped and fails with [`DeadlineExceeded`]: its
    /// error policy retries it, and a hanging registry or API server cannot hold a reconcile
    /// slot (or the memory of what it was reading) for ever.
    pub async fn reconcile<T, E: From<DeadlineExceeded>>(
        &self,
        controller: &'static str,
        kind: &'static str,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        self.reconcile_within(RECONCILE_DEADLINE, controller, kind, work)
            .await
    }

    async fn reconcile_within<T, E: From<DeadlineExceeded>>(
        &self,
        deadline: Duration,
        controller: &'static str,
        kind: &'static str,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let result = match tokio::time::timeout(deadline, work).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    controller,
                    kind,
                    deadline_s = deadline.as_secs(),
                    "reconcile exceeded its deadline; dropped, to be retried"
                );
                Err(DeadlineExceeded(deadline).into())
            }
        };
        self.durations
            .get_or_create(&KindLabels { controller, kind })
            .observe(started.elapsed().as_secs_f64());
        let result_label = if result.is_ok() { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller,
                kind,
                result: result_label,
            })
            .inc();
        result
    }

    /// The reconciles of `controller` and `kind` that ended with `result` (`ok`, `error`).
    pub fn reconciles(&self, controller: &'static str, kind: &'static str, result: &'static str) -> u64 {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller,
                kind,
                result,
            })
            .get()
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// A refresh round that ran: what it checked, found moved and collected.
    pub fn refresh_round(&self, checked: usize, moved: usize, collected: usize, took: Duration) {
        self.refresh_round_durations.observe(took.as_secs_f64());
        self.refresh_rounds
            .get_or_create(&ResultLabels { result: "ok" })
            .inc();
        self.refresh_tags_checked.inc_by(count(checked));
        self.refresh_tags_moved.inc_by(count(moved));
        self.refresh_entries_collected.inc_by(count(collected));
    }

    /// A refresh round skipped: the watches had not listed every pinned kind yet.
    pub fn refresh_failed(&self) {
        self.refresh_rounds
            .get_or_create(&ResultLabels { result: "failed" })
            .inc();
    }

    /// A finished mirror copy: `copied`, `failed` or `given_up`, with the bytes it sent.
    pub fn mirror_copy(&self, result: &'static str, bytes: u64) {
        self.mirror_copies.get_or_create(&ResultLabels { result }).inc();
        self.mirror_copied_bytes.inc_by(bytes);
    }

    /// A finished retention deletion: `deleted`, `kept` or `failed`.
    pub fn mirror_deletion(&self, result: &'static str) {
        self.mirror_deletions
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// A sync of an object of `kind` whose `pins` pins were in place.
    pub fn fetches_avoided(&self, kind: &'static str, pins: usize) {
        self.fetches_avoided
            .get_or_create(&FetchKindLabels { kind })
            .inc_by(count(pins));
    }

    /// A bundle moved to another location of its digest, in an object kapp-controller fetched
    /// (`crate::cached_fetch`).
    pub fn bundle_move_cached(&self, kind: &'static str) {
        self.bundle_moves_cached
            .get_or_create(&FetchKindLabels { kind })
            .inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        holdfast_runtime::admin::encode(&self.registry)
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// The digest cache's collector, once there is a cache (nothing before).
struct LateCache(Arc<OnceLock<Arc<DigestCache>>>);

impl std::fmt::Debug for LateCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateCache")
    }
}

impl Collector for LateCache {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match self.0.get() {
            Some(cache) => CacheCollector(cache.clone()).encode(encoder),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(prefix))
    }

    #[tokio::test]
    async fn a_reconcile_past_its_deadline_fails_and_is_counted() {
        let metrics = Metrics::new();
        let stuck = std::future::pending::<Result<(), DeadlineExceeded>>();
        let result = metrics
            .reconcile_within(Duration::from_millis(10), "pinning", "App", stuck)
            .await;
        assert_eq!(result, Err(DeadlineExceeded(Duration::from_millis(10))));
        assert_eq!(metrics.reconciles("pinning", "App", "error"), 1);
    }

    #[tokio::test]
    async fn reconciles_are_counted_by_result_and_timed() {
        let metrics = Metrics::new();
        let ok: Result<(), DeadlineExceeded> = metrics.reconcile("pinning", "App", async { Ok(()) }).await;
        let failed: Result<(), DeadlineExceeded> = metrics
            .reconcile("pinning", "App", async { Err(DeadlineExceeded(Duration::ZERO)) })
            .await;
        assert!(ok.is_ok() && failed.is_err());
        metrics.set_leader(true);
        metrics.refresh_round(3, 1, 0, Duration::from_millis(1500));
        metrics.mirror_copy("copied", 1024);
        metrics.fetches_avoided("App", 2);
        let text = metrics.encode().unwrap();
        for expected in [
            "holdfast_controller_reconciles_total{controller=\"pinning\",kind=\"App\",result=\"ok\"} 1",
            "holdfast_controller_reconciles_total{controller=\"pinning\",kind=\"App\",result=\"error\"} 1",
            "holdfast_controller_reconcile_duration_seconds_count{controller=\"pinning\",kind=\"App\"} 2",
            "holdfast_controller_leader 1",
            "holdfast_controller_refresh_rounds_total{result=\"ok\"} 1",
            "holdfast_controller_refresh_tags_checked_total 3",
            "holdfast_controller_refresh_tags_moved_total 1",
            "holdfast_controller_refresh_round_duration_seconds_count 1",
            "holdfast_controller_mirror_copies_total{result=\"copied\"} 1",
            "holdfast_controller_mirror_copied_bytes_total 1024",
            "holdfast_controller_fetches_avoided_total{kind=\"App\"} 2",
        ] {
            assert!(text.lines().any(|l| l == expected), "{expected} not in\n{text}");
        }
        // No cache yet: none of its figures.
        assert!(
            line(&text, "holdfast_controller_registry_lookups").is_none(),
            "{text}"
        );
    }
}

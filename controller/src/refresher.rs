//! The refresher: one registry check per unique cache key per round, never one per object, and
//! only for keys that live objects name — read from a fresh list of every pinned kind, never
//! from the entries (whoever can write an entry must not make the controller read a Secret).
//! Entries that no object names are deleted after a grace period (garbage collection), so the
//! cache holds what the cluster's objects use and nothing is refreshed forever for nobody.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use holdfast_pins::{
    PinnedKind, Pinner,
    resolve::{RefreshReport, named_keys},
};
use holdfast_registry::cache::CacheKey;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, ListParams},
};
use tokio::sync::watch;

use crate::metrics::Metrics;
use tokio_util::sync::CancellationToken;

/// One round's refresh and what it collected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundReport {
    pub refresh: RefreshReport,
    /// Entries deleted: no object named them for the grace period.
    pub collected: usize,
}

/// The refresher's state across rounds: the pinned kinds it lists, and since when each entry
/// has been unnamed.
pub struct Refresher {
    client: Client,
    kinds: Vec<(PinnedKind, ApiResource)>,
    collector: Collector,
    metrics: Arc<Metrics>,
}

impl Refresher {
    pub fn new(client: Client, kinds: Vec<(PinnedKind, ApiResource)>, grace: Duration) -> Self {
        Self {
            client,
            kinds,
            collector: Collector::new(grace),
            metrics: Arc::default(),
        }
    }

    /// Records each round into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// One round: lists every pinned object, refreshes the keys they name, deletes the entries
    /// unnamed for the grace period. A failed list refreshes and deletes nothing.
    #[tracing::instrument(skip_all)]
    pub async fn round(&mut self, pinner: &Pinner) -> Result<RoundReport, kube::Error> {
        let named = match self.named().await {
            Ok(named) => named,
            Err(error) => {
                self.metrics.refresh_failed();
                return Err(error);
            }
        };
        let refresh = pinner.refresh_all(&named).await;
        let cache = pinner.cache();
        let keep: HashSet<CacheKey> = cache.recorded_copies().into_iter().map(|(key, _)| key).collect();
        let held: Vec<CacheKey> = cache.entries().into_iter().map(|e| e.key).collect();
        let due = self.collector.due(held, &named, &keep, Instant::now());
        for key in &due {
            tracing::info!(reference = %key.reference, scope = %key.scope, "deleted a digest cache entry no object names");
            cache.remove(key);
        }
        self.metrics
            .refresh_round(refresh.checked, refresh.moved, due.len());
        Ok(RoundReport {
            refresh,
            collected: due.len(),
        })
    }

    /// The cache keys the objects of every pinned kind name, from a fresh list.
    async fn named(&self) -> Result<HashSet<CacheKey>, kube::Error> {
        let mut named = HashSet::new();
        for (kind, resource) in &self.kinds {
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), resource);
            for object in api.list(&ListParams::default()).await? {
                let value = serde_json::to_value(&object).unwrap_or_default();
                named.extend(named_keys(*kind, &value));
            }
        }
        Ok(named)
    }
}

/// Garbage collection's clock: since when each held entry has been named by no object.
#[derive(Debug)]
pub struct Collector {
    grace: Duration,
    unnamed_since: HashMap<CacheKey, Instant>,
}

impl Collector {
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            unnamed_since: HashMap::new(),
        }
    }

    /// The keys of `held` to delete at `now`: unnamed (not in `named`) since at least the grace
    /// period, and recording no mirror copy (`keep`: retention deletes those copies first). An
    /// entry named again starts over; a restart starts every clock again (a deletion comes
    /// later, never earlier).
    pub fn due(
        &mut self,
        held: Vec<CacheKey>,
        named: &HashSet<CacheKey>,
        keep: &HashSet<CacheKey>,
        now: Instant,
    ) -> Vec<CacheKey> {
        let unnamed: HashSet<CacheKey> = held.into_iter().filter(|key| !named.contains(key)).collect();
        self.unnamed_since.retain(|key, _| unnamed.contains(key));
        let mut due = Vec::new();
        for key in unnamed {
            let since = *self.unnamed_since.entry(key.clone()).or_insert(now);
            if now.duration_since(since) >= self.grace && !keep.contains(&key) {
                self.unnamed_since.remove(&key);
                due.push(key);
            }
        }
        due.sort();
        due
    }
}

/// Rounds start `interval` apart, each shifted by up to a tenth of it so that replicas and
/// restarts do not synchronise on the registry.
pub async fn run(
    refresher: &mut Refresher,
    pinner: &Pinner,
    interval: Duration,
    rounds: watch::Sender<u64>,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval + jitter(interval / 10)) => {}
        }
        // A round asks the registry once per key, each ask bounded by the resolver's timeout:
        // with many keys and a registry down it can last minutes, so it must not hold up a
        // shutdown or a lost Lease. Dropping it part-way loses nothing: the next round starts over.
        let report = tokio::select! {
            _ = cancel.cancelled() => return,
            report = refresher.round(pinner) => report,
        };
        match report {
            Ok(report) => {
                rounds.send_modify(|n| *n += 1);
                tracing::info!(
                    checked = report.refresh.checked,
                    moved = report.refresh.moved,
                    failed = report.refresh.failed,
                    unnamed = report.refresh.unnamed,
                    collected = report.collected,
                    "refresh round"
                );
            }
            Err(error) => tracing::warn!(%error, "refresh round skipped: listing the pinned objects failed"),
        }
    }
}

fn jitter(max: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    max.mul_f64(f64::from(nanos) / 1e9)
}

#[cfg(test)]
mod tests {
    use holdfast_registry::{Reference, cache::Scope};

    use super::*;

    fn key(tag: &str) -> CacheKey {
        CacheKey::tag(
            &Reference::parse(&format!("registry.example/app:{tag}")).unwrap(),
            Scope::Anonymous,
        )
    }

    #[test]
    fn unnamed_entries_are_collected_after_the_grace_period_only() {
        let grace = Duration::from_secs(3600);
        let mut collector = Collector::new(grace);
        let start = Instant::now();
        let (named, unnamed) = (key("named"), key("forged"));
        let held = || vec![named.clone(), unnamed.clone()];
        let names = HashSet::from([named.clone()]);
        let none = HashSet::new();
        assert!(collector.due(held(), &names, &none, start).is_empty());
        assert!(collector.due(held(), &names, &none, start + grace / 2).is_empty());
        assert_eq!(
            collector.due(held(), &names, &none, start + grace),
            std::slice::from_ref(&unnamed)
        );
        // Named again within the grace: its clock starts over.
        let mut collector = Collector::new(grace);
        collector.due(held(), &names, &none, start);
        let both = HashSet::from([named.clone(), unnamed.clone()]);
        collector.due(held(), &both, &none, start + grace / 2);
        assert!(collector.due(held(), &names, &none, start + grace).is_empty());
        assert_eq!(collector.due(held(), &names, &none, start + grace * 2), [unnamed]);
    }

    #[test]
    fn an_entry_recording_a_mirror_copy_waits_for_retention() {
        let mut collector = Collector::new(Duration::ZERO);
        let copied = key("copied");
        let keep = HashSet::from([copied.clone()]);
        let now = Instant::now();
        assert!(
            collector
                .due(vec![copied.clone()], &HashSet::new(), &keep, now)
                .is_empty()
        );
        assert_eq!(
            collector.due(vec![copied.clone()], &HashSet::new(), &HashSet::new(), now),
            [copied]
        );
    }
}

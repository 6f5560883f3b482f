//! The refresher: one registry check per unique cache key per round, never one per object, and
//! only for keys that live objects name — read off the term's watch of every pinned kind
//! ([`Watched`]), never from the entries (whoever can write an entry must not make the
//! controller read a Secret). After a round only the objects naming a key whose digest moved are
//! reconciled, so a round costs what changed, not what the cluster holds. Entries that no object
//! names are deleted after a grace period, or at once while the cache is full (garbage
//! collection), so the cache holds what the cluster's objects use and nothing is refreshed
//! forever for nobody.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use futures::StreamExt;
use holdfast_cache::{CacheEntry, CacheKey, DigestCache, Origin};
use holdfast_pins::{PinnedKind, Pinner, resolve::named_keys};
use holdfast_registry::{Digest, Reference};
use tokio::sync::Semaphore;

use crate::{
    entry_status::EntryStatus,
    metrics::Metrics,
    stored::Stored,
    watched::{Index, Watched},
};
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Before its first complete list a store holds part of its kind or nothing: the entries
    /// only the missing objects name would look unnamed and be collected.
    #[error("the watches have not listed every pinned kind yet; nothing refreshed or collected")]
    NotListed,
}

/// One round's registry checks: keys answered by the registry, of which moved, keys that
/// failed, and entries left alone because no live object names their key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefreshReport {
    pub checked: usize,
    /// How many keys moved (`moved_keys.len()`, for the metrics and the round's log line).
    pub moved: usize,
    pub failed: usize,
    pub unnamed: usize,
    /// The keys whose digest moved: only the objects naming them can need a re-pin.
    pub moved_keys: BTreeSet<CacheKey>,
}

/// Keys of one registry asked at once in a round: a registry that hangs holds this many of the
/// round's checks (each until the resolver's timeout), never the others'.
const CHECKS_PER_REGISTRY: usize = 4;
/// Keys asked at once in a round, over all registries.
const CHECKS_PER_ROUND: usize = 32;

/// Asks the registry once for every cache key in `named` (one check per unique tag or tag
/// selection and credential scope, however many objects use it), each registry's keys in a
/// lane of their own ([`CHECKS_PER_REGISTRY`], at most [`CHECKS_PER_ROUND`] in all), so that
/// one slow registry cannot stall the others'. `named` holds the keys live objects name
/// ([`named_keys`]): an entry no object names is not refreshed, so its Secret is not read,
/// whatever the entry says (anyone who can write an entry must not gain the controller's
/// Secret access through it). The report names the keys that moved, so that only the objects
/// naming them are reconciled again.
pub async fn refresh_named(pinner: &Pinner, named: &HashSet<CacheKey>) -> RefreshReport {
    let cache = pinner.cache();
    let entries = cache.entries();
    let held = entries.len();
    let keys = refreshable(entries, named);
    let mut report = RefreshReport {
        unnamed: held - keys.len(),
        ..RefreshReport::default()
    };
    let mut lanes: BTreeMap<String, Vec<(CacheKey, Digest)>> = BTreeMap::new();
    for (key, before) in keys {
        let registry = Reference::parse(&key.reference)
            .map_or_else(|_| key.reference.clone(), |r| r.registry().to_owned());
        lanes.entry(registry).or_default().push((key, before));
    }
    let round = Semaphore::new(CHECKS_PER_ROUND);
    let check = |key: CacheKey, before: Digest| {
        let round = &round;
        async move {
            let _slot = round.acquire().await;
            let scope = key.scope.clone();
            let answer = cache.refresh(&key, || pinner.credentials(scope)).await;
            (key, before, answer)
        }
    };
    let lanes = lanes.into_values().map(|keys| {
        futures::stream::iter(keys)
            .map(|(key, before)| check(key, before))
            .buffer_unordered(CHECKS_PER_REGISTRY)
            .collect::<Vec<_>>()
    });
    for (key, before, answer) in futures::future::join_all(lanes).await.into_iter().flatten() {
        match answer {
            Ok(answer) if matches!(answer.origin, Origin::Stale { .. }) => report.failed += 1,
            Ok(answer) => {
                report.checked += 1;
                if answer.digest != before {
                    tracing::info!(reference = %key.reference, from = %before, to = %answer.digest, "tag moved");
                    report.moved += 1;
                    report.moved_keys.insert(key);
                }
            }
            Err(error) => {
                tracing::warn!(reference = %key.reference, %error, "refresh failed");
                report.failed += 1;
            }
        }
    }
    report
}

/// The keys of `entries` a refresh round asks the registry for, each with the digest held:
/// those in `named`, once each.
pub fn refreshable(entries: Vec<CacheEntry>, named: &HashSet<CacheKey>) -> Vec<(CacheKey, Digest)> {
    let mut keys: Vec<_> = entries
        .into_iter()
        .filter(|e| named.contains(&e.key))
        .map(|e| (e.key, e.digest))
        .collect();
    keys.sort();
    keys.dedup_by(|a, b| a.0 == b.0);
    keys
}

/// One round's refresh, what it had reconciled and what it collected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundReport {
    pub refresh: RefreshReport,
    /// Objects handed to their pinning controller ([`Refresher::round`] says which).
    pub triggered: usize,
    /// Entries deleted: no object named them for the grace period, or the cache was full.
    pub collected: usize,
    /// How long the round took (its registry checks dominate).
    pub elapsed: Duration,
}

/// The refresher's state across a leader's term: the watches it reads the named keys from,
/// what each object names, the digests held after the last round, and since when each entry
/// has been unnamed.
pub struct Refresher {
    watched: Arc<Watched>,
    /// The cache keys each object names, read again only when the object changed.
    index: Index<CacheKey, PinnedKind>,
    /// Each held key's digest as of the end of the last round (or the term's start): an entry
    /// also moves between rounds, when a reconcile finds it older than the cache's `max_age`
    /// and asks the registry; the other objects naming it must follow.
    digests: HashMap<CacheKey, Digest>,
    collector: Collector,
    metrics: Arc<Metrics>,
}

impl Refresher {
    /// For a term that starts with `cache` as it holds now: what moves from here on is
    /// reconciled (the watches' first lists have every object reconciled once).
    pub fn new(watched: Arc<Watched>, cache: &DigestCache, grace: Duration) -> Self {
        Self {
            watched,
            index: Index::default(),
            digests: digests(&cache.entries()),
            collector: Collector::new(grace),
            metrics: Arc::default(),
        }
    }

    /// Records each round into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Resolves once every kind has been listed in full (a round before that is skipped).
    pub async fn ready(&self) {
        self.watched.ready().await;
    }

    /// One round: refreshes the keys the stored objects name; has the objects reconciled that
    /// name a key whose digest moved since the last round (in this round's refresh or by a
    /// reconcile's lookup in between) or a key the cache does not hold (refused past
    /// `max_entries`, or never resolved: their reconcile asks the registry, as before); deletes
    /// the entries due for collection ([`Collector::due`]). Skipped, refreshing and deleting
    /// nothing, until the watches have listed every kind ([`Error::NotListed`]): it does not
    /// wait, so a kind that cannot be listed shows as skipped rounds.
    #[tracing::instrument(skip_all)]
    pub async fn round(&mut self, pinner: &Pinner) -> Result<RoundReport, Error> {
        let started = Instant::now();
        if !self.watched.fully_listed() {
            self.metrics.refresh_failed();
            return Err(Error::NotListed);
        }
        let named = self.named();
        let refresh = refresh_named(pinner, &named).await;
        let cache = pinner.cache();
        let entries = cache.entries();
        let held = digests(&entries);
        let mut moved: HashSet<&CacheKey> = refresh.moved_keys.iter().collect();
        moved.extend(
            held.iter()
                .filter(|(key, digest)| self.digests.get(*key) != Some(*digest))
                .map(|(key, _)| key),
        );
        let triggered = if moved.is_empty() && named.iter().all(|key| held.contains_key(key)) {
            0
        } else {
            self.trigger(|key| moved.contains(key) || !held.contains_key(key))
                .await
        };
        let keep: HashSet<CacheKey> = cache.recorded_copies().into_iter().map(|(key, _)| key).collect();
        let due = self
            .collector
            .due(&entries, &named, &keep, cache.max_entries(), Instant::now());
        for key in &due {
            tracing::info!(reference = %key.reference, scope = %key.scope, "deleted a digest cache entry no object names");
            cache.remove(key);
        }
        self.digests = held;
        let elapsed = started.elapsed();
        self.metrics
            .refresh_round(refresh.checked, refresh.moved, due.len(), elapsed);
        Ok(RoundReport {
            elapsed,
            refresh,
            triggered,
            collected: due.len(),
        })
    }

    /// Refreshes the keys of `requested` that live objects name, now (`kubectl holdfast
    /// refresh`, through [`crate::entry_status`]), and has the objects naming a key that moved
    /// re-pinned. Returns the refresh and the keys it asked the registry for; the others are
    /// named by no object and left alone, whatever asked for them.
    pub async fn refresh_requested(
        &mut self,
        pinner: &Pinner,
        requested: &HashSet<CacheKey>,
    ) -> Result<(RefreshReport, HashSet<CacheKey>), Error> {
        if !self.watched.fully_listed() {
            return Err(Error::NotListed);
        }
        let named = self.named();
        let asked: HashSet<CacheKey> = requested.intersection(&named).cloned().collect();
        let refresh = refresh_named(pinner, &asked).await;
        if !refresh.moved_keys.is_empty() {
            self.trigger(|key| refresh.moved_keys.contains(key)).await;
        }
        // Moved and handed over here: the next round need not hand them over again.
        for entry in pinner.cache().entries() {
            if refresh.moved_keys.contains(&entry.key) {
                self.digests.insert(entry.key, entry.digest);
            }
        }
        Ok((refresh, asked))
    }

    /// How many stored objects name each key (an object naming it twice counts once): the
    /// entries' `status.usedBy`.
    pub fn used_by(&mut self) -> HashMap<CacheKey, usize> {
        let mut counts = HashMap::new();
        for (kind, object) in self.objects() {
            let keys: HashSet<CacheKey> = self
                .index
                .read(&object, kind, |object, kind| named_keys(kind, object))
                .iter()
                .cloned()
                .collect();
            for key in keys {
                *counts.entry(key).or_default() += 1;
            }
        }
        counts
    }

    /// The keys the stored objects name.
    fn named(&mut self) -> HashSet<CacheKey> {
        let objects = self.objects();
        self.index.union(
            objects.iter().map(|(kind, object)| (object.as_ref(), *kind)),
            |object, kind| named_keys(kind, object),
        )
    }

    /// Every stored object with its kind.
    fn objects(&self) -> Vec<(PinnedKind, Arc<Stored>)> {
        self.watched.objects().collect()
    }

    /// Hands every stored object naming a key `concerns` to its pinning controller, through the
    /// trigger its watch events take; returns how many. Read from the stores as they are now:
    /// an object that came or changed during the round is reconciled by its own watch event.
    async fn trigger(&mut self, concerns: impl Fn(&CacheKey) -> bool) -> usize {
        let watched = self.watched.clone();
        let mut triggered = 0;
        for kind in watched.kinds() {
            for object in kind.store.state() {
                let concerned = self
                    .index
                    .read(&object, kind.kind, |object, kind| named_keys(kind, object))
                    .iter()
                    .any(&concerns);
                if concerned {
                    kind.trigger(object).await;
                    triggered += 1;
                }
            }
        }
        triggered
    }
}

/// Each entry's digest, by key.
fn digests(entries: &[CacheEntry]) -> HashMap<CacheKey, Digest> {
    entries
        .iter()
        .map(|entry| (entry.key.clone(), entry.digest.clone()))
        .collect()
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
    /// period; and while the cache is full (at least `max_entries` held: it refuses new keys),
    /// the other unnamed ones at once, unnamed the longest (then checked the longest ago) first,
    /// until there is room for one. Never an entry recording a mirror copy (`keep`: retention
    /// deletes those copies first). An entry named again starts over; a restart starts every
    /// clock again (a deletion after the grace comes later, never earlier). An entry whose
    /// object the watch has not shown yet may be evicted from a full cache: its next lookup
    /// resolves it again.
    pub fn due(
        &mut self,
        held: &[CacheEntry],
        named: &HashSet<CacheKey>,
        keep: &HashSet<CacheKey>,
        max_entries: usize,
        now: Instant,
    ) -> Vec<CacheKey> {
        let unnamed: Vec<&CacheEntry> = held.iter().filter(|e| !named.contains(&e.key)).collect();
        let unnamed_keys: HashSet<&CacheKey> = unnamed.iter().map(|e| &e.key).collect();
        self.unnamed_since.retain(|key, _| unnamed_keys.contains(key));
        let mut due = Vec::new();
        let mut evictable = Vec::new();
        for entry in unnamed {
            let since = *self.unnamed_since.entry(entry.key.clone()).or_insert(now);
            if keep.contains(&entry.key) {
                continue;
            }
            if now.duration_since(since) >= self.grace {
                due.push(entry.key.clone());
            } else {
                evictable.push((since, entry.checked_at, &entry.key));
            }
        }
        evictable.sort();
        let mut left = held.len() - due.len();
        for (_, _, key) in evictable {
            if left < max_entries {
                break;
            }
            due.push(key.clone());
            left -= 1;
        }
        for key in &due {
            self.unnamed_since.remove(key);
        }
        due.sort();
        due
    }
}

/// How long the entries' status writer lets changes gather before a pass.
const STATUS_COALESCE: Duration = Duration::from_millis(500);

/// Rounds start `interval` apart, each shifted by up to a tenth of it so that replicas and
/// restarts do not synchronise on the registry; in between, `status` writes the entries' status
/// and acts on the refreshes asked for whenever something changed.
pub async fn run(
    refresher: &mut Refresher,
    status: &mut EntryStatus,
    pinner: &Pinner,
    interval: Duration,
    cancel: CancellationToken,
) {
    let next_round = || tokio::time::Instant::now() + interval + jitter(interval / 10);
    let mut round_at = next_round();
    loop {
        let round = tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep_until(round_at) => true,
            _ = status.changed() => false,
        };
        if !round {
            // Changes come in bursts (a round, a re-list, a rollout of Apps): one pass for each
            // burst, each pass a walk of every object and entry.
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(STATUS_COALESCE) => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                written = status.pass(refresher, pinner) => tracing::debug!(written, "digest cache entries' status"),
            }
            continue;
        }
        round_at = next_round();
        // A round asks the registry once per key, each ask bounded by the resolver's timeout:
        // with many keys and a registry down it can last minutes, so it must not hold up a
        // shutdown or a lost Lease. Dropping it part-way loses nothing: the cancellation ends
        // the term, and the next term's watches have every object reconciled once.
        let report = tokio::select! {
            _ = cancel.cancelled() => return,
            report = refresher.round(pinner) => report,
        };
        match report {
            Ok(report) => tracing::info!(
                checked = report.refresh.checked,
                moved = report.refresh.moved,
                failed = report.refresh.failed,
                unnamed = report.refresh.unnamed,
                triggered = report.triggered,
                collected = report.collected,
                elapsed_ms = report.elapsed.as_millis() as u64,
                "refresh round"
            ),
            Err(error) => tracing::warn!(%error, "refresh round skipped"),
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
    use std::{collections::BTreeSet, time::SystemTime};

    use futures::{FutureExt, Stream, StreamExt, future::BoxFuture};
    use holdfast_cache::{CacheConfig, Scope, testing::FakeSource};
    use holdfast_pins::resolve::SecretSource;
    use kube::ResourceExt;
    use serde_json::json;

    use super::*;

    fn key(tag: &str) -> CacheKey {
        CacheKey::tag(
            &Reference::parse(&format!("registry.example/app:{tag}")).unwrap(),
            Scope::Anonymous,
        )
    }

    /// `key`'s entry holding `digest`, checked at `at`.
    fn entry(key: &CacheKey, digest: &Digest, at: SystemTime) -> CacheEntry {
        CacheEntry::resolved(key.clone(), digest.clone(), at)
    }

    /// Entries of `keys`, all checked at the same time.
    fn entries(keys: &[&CacheKey]) -> Vec<CacheEntry> {
        let (digest, now) = (Digest::sha256_of(b"content"), SystemTime::now());
        keys.iter().map(|key| entry(key, &digest, now)).collect()
    }

    #[test]
    fn unnamed_entries_are_collected_after_the_grace_period_only() {
        let grace = Duration::from_secs(3600);
        let mut collector = Collector::new(grace);
        let start = Instant::now();
        let (named, unnamed) = (key("named"), key("forged"));
        let held = entries(&[&named, &unnamed]);
        let names = HashSet::from([named.clone()]);
        let none = HashSet::new();
        let due = |collector: &mut Collector, names: &HashSet<CacheKey>, at| {
            collector.due(&held, names, &none, usize::MAX, at)
        };
        assert!(due(&mut collector, &names, start).is_empty());
        assert!(due(&mut collector, &names, start + grace / 2).is_empty());
        assert_eq!(
            due(&mut collector, &names, start + grace),
            std::slice::from_ref(&unnamed)
        );
        // Named again within the grace: its clock starts over.
        let mut collector = Collector::new(grace);
        due(&mut collector, &names, start);
        let both = HashSet::from([named.clone(), unnamed.clone()]);
        due(&mut collector, &both, start + grace / 2);
        assert!(due(&mut collector, &names, start + grace).is_empty());
        assert_eq!(due(&mut collector, &names, start + grace * 2), [unnamed]);
    }

    #[test]
    fn an_entry_recording_a_mirror_copy_waits_for_retention() {
        let mut collector = Collector::new(Duration::ZERO);
        let copied = key("copied");
        let keep = HashSet::from([copied.clone()]);
        let (held, none) = (entries(&[&copied]), HashSet::new());
        let now = Instant::now();
        assert!(collector.due(&held, &none, &keep, usize::MAX, now).is_empty());
        assert_eq!(collector.due(&held, &none, &none, usize::MAX, now), [copied]);
    }

    /// A full cache (at `max_entries` it refuses new keys) loses its unnamed entries at once,
    /// unnamed the longest first (then checked the longest ago), until there is room for one;
    /// never a named one nor one recording a mirror copy.
    #[test]
    fn a_full_cache_evicts_unnamed_entries_at_once_oldest_first() {
        let mut collector = Collector::new(Duration::from_secs(3600));
        let start = Instant::now();
        let minute = Duration::from_secs(60);
        let (named, copied) = (key("named"), key("copied"));
        let (old, newer, newest) = (key("old"), key("newer"), key("newest"));
        let names = HashSet::from([named.clone()]);
        let keep = HashSet::from([copied.clone()]);

        // Three held, room for five: nothing before the grace; `old`'s clock starts.
        let three = entries(&[&named, &copied, &old]);
        assert!(collector.due(&three, &names, &keep, 5, start).is_empty());
        // Five held: full. The one unnamed the longest goes, and that is room for one.
        let five = entries(&[&named, &copied, &old, &newer, &newest]);
        assert_eq!(
            collector.due(&five, &names, &keep, 5, start + minute),
            std::slice::from_ref(&old)
        );
        // Unnamed since the same round: checked the longest ago goes first.
        let (digest, now) = (Digest::sha256_of(b"content"), SystemTime::now());
        let mut five = entries(&[&named, &copied]);
        five.push(entry(&newer, &digest, now));
        five.push(entry(&newest, &digest, now - minute));
        five.push(entry(&old, &digest, now));
        let mut collector = Collector::new(Duration::from_secs(3600));
        assert_eq!(
            collector.due(&five, &names, &keep, 5, start),
            std::slice::from_ref(&newest)
        );
        // Over the bound (loaded from the store), down to room for one: three go at once.
        let mut collector = Collector::new(Duration::from_secs(3600));
        assert_eq!(collector.due(&five, &names, &keep, 3, start), {
            let mut gone = vec![old, newer, newest];
            gone.sort();
            gone
        });
        // Nothing unnamed but a mirror copy: nothing to evict, however full.
        let mut collector = Collector::new(Duration::from_secs(3600));
        let held = entries(&[&named, &copied]);
        assert!(collector.due(&held, &names, &keep, 1, start).is_empty());
    }

    /// Fails the test if any Secret is read.
    struct NoSecrets;

    impl SecretSource for NoSecrets {
        fn secret(
            &self,
            namespace: &str,
            name: &str,
        ) -> BoxFuture<'static, Result<Option<k8s_openapi::api::core::v1::Secret>, String>> {
            panic!("the refresher read Secret {namespace}/{name}")
        }
    }

    /// A stored App named `name` fetching `registry.example/app:<tag>`.
    fn app(name: &str, tag: &str) -> Stored {
        serde_json::from_value(json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
            "metadata": {"name": name, "namespace": "team", "uid": name, "resourceVersion": "1"},
            "spec": {"fetch": [{"image": {"url": format!("registry.example/app:{tag}")}}]},
        }))
        .unwrap()
    }

    fn digest(n: u8) -> Digest {
        Digest::sha256_of(&[n])
    }

    /// A term whose stores hold `apps` (listed in full or not) and whose cache holds `held`,
    /// each tag holding `digest(1)` in the registry and in the cache; the Apps' controller's
    /// triggers.
    struct Term {
        registry: Arc<FakeSource>,
        pinner: Pinner,
        refresher: Refresher,
        triggered: std::pin::Pin<Box<dyn Stream<Item = Arc<Stored>> + Send>>,
    }

    impl Term {
        fn new(apps: Vec<Stored>, held: &[&CacheKey], listed: bool) -> Self {
            let registry = Arc::new(FakeSource::default());
            let cache = Arc::new(DigestCache::new(registry.clone(), CacheConfig::default(), None));
            for key in held {
                registry.set(&key.reference, digest(1));
                cache.insert(entry(key, &digest(1), SystemTime::now()));
            }
            let watched = Arc::new(Watched::of(vec![(PinnedKind::App, apps)], listed));
            let triggered = Box::pin(watched.take_trigger(0).unwrap());
            let refresher = Refresher::new(watched, &cache, Duration::ZERO);
            let pinner = crate::term::pinner(cache, Some(Arc::new(NoSecrets)), None);
            Self {
                registry,
                pinner,
                refresher,
                triggered,
            }
        }

        async fn round(&mut self) -> Result<RoundReport, Error> {
            self.refresher.round(&self.pinner).await
        }

        /// The names of the objects handed to the controller so far.
        fn triggered(&mut self) -> Vec<String> {
            let mut names = Vec::new();
            while let Some(Some(object)) = self.triggered.next().now_or_never() {
                names.push(object.name_any());
            }
            names.sort();
            names
        }
    }

    /// `kubectl holdfast refresh`: a requested key that an object names is asked of the registry
    /// now and, as it moved, its objects are handed to their controller; a requested key no
    /// object names is not asked at all. `used_by` counts each object once.
    #[tokio::test]
    async fn a_requested_refresh_asks_only_named_keys_and_repins_what_moved() {
        let (named, unnamed) = (key("1.0"), key("forged"));
        let mut term = Term::new(vec![app("a", "1.0"), app("b", "1.0")], &[&named, &unnamed], true);
        term.registry.set(&named.reference, digest(2));
        term.registry.set(&unnamed.reference, digest(2));
        let requested = HashSet::from([named.clone(), unnamed.clone()]);
        let (report, asked) = term
            .refresher
            .refresh_requested(&term.pinner, &requested)
            .await
            .unwrap();
        assert_eq!(asked, HashSet::from([named.clone()]));
        assert_eq!(report.moved_keys, BTreeSet::from([named.clone()]));
        assert_eq!(term.registry.asked(), std::slice::from_ref(&named.reference));
        assert_eq!(term.triggered(), ["a", "b"]);
        assert_eq!(term.refresher.used_by(), HashMap::from([(named.clone(), 2)]));
        // Handed over once: the next round has nothing that moved to hand over again.
        term.registry.set(&unnamed.reference, digest(1));
        assert_eq!(term.round().await.unwrap().triggered, 0);
    }

    #[tokio::test]
    async fn a_requested_refresh_waits_for_the_watches() {
        let named = key("1.0");
        let mut term = Term::new(vec![app("a", "1.0")], &[&named], false);
        let requested = HashSet::from([named]);
        let refreshed = term.refresher.refresh_requested(&term.pinner, &requested).await;
        assert!(matches!(refreshed, Err(Error::NotListed)));
        assert!(term.registry.asked().is_empty());
    }

    fn secret_scope(namespace: &str, name: &str) -> Scope {
        Scope::Secret {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// An entry as anyone who may write `DigestCacheEntry` objects can make one.
    fn hand_made_entry(reference: &str, scope: Scope) -> CacheEntry {
        let key = CacheKey::tag(&Reference::parse(reference).unwrap(), scope);
        entry(&key, &digest(1), SystemTime::now())
    }

    fn pinner_over(registry: Arc<FakeSource>, entries: &[CacheEntry]) -> Pinner {
        let cache = Arc::new(DigestCache::new(registry, CacheConfig::default(), None));
        for entry in entries {
            cache.insert(entry.clone());
        }
        crate::term::pinner(cache, Some(Arc::new(NoSecrets)), None)
    }

    /// Issue 15, item 1: an entry naming `secret:victim/db-creds` and a registry of the writer's
    /// choice made the refresher read that Secret and send it there (`NoSecrets` panics when
    /// asked). Only keys that live objects name are refreshed now.
    #[tokio::test]
    async fn an_entry_no_object_names_is_not_refreshed_and_its_secret_never_read() {
        let registry = Arc::new(FakeSource::default());
        let forged = hand_made_entry("attacker.example/exfil:1", secret_scope("victim", "db-creds"));
        let pinner = pinner_over(registry.clone(), &[forged]);
        let report = refresh_named(&pinner, &HashSet::new()).await;
        assert_eq!((report.checked, report.failed, report.unnamed), (0, 0, 1));
        assert!(registry.asked().is_empty());
    }

    /// The victim's Secret is named by no object of another namespace: refreshing what `team`
    /// names (its own Secret's key) reads nothing of `victim`, whatever entries exist.
    #[tokio::test]
    async fn refreshing_what_one_namespace_names_reads_no_other_namespaces_secret() {
        let registry = Arc::new(FakeSource::default());
        let reference = "registry.corp.com/team/app-config:v1.2.0";
        let victims = hand_made_entry(reference, secret_scope("victim", "db-creds"));
        let pinner = pinner_over(registry.clone(), &[victims]);
        let teams = CacheKey::tag(
            &Reference::parse(reference).unwrap(),
            secret_scope("team", "creds"),
        );
        let report = refresh_named(&pinner, &HashSet::from([teams])).await;
        assert_eq!(report.unnamed, 1);
        assert!(registry.asked().is_empty());
    }

    /// The controller reconciles only the objects naming a key that moved: the report names them.
    #[tokio::test]
    async fn a_refresh_reports_which_keys_moved() {
        let registry = Arc::new(FakeSource::default());
        let entries = [
            hand_made_entry("registry.corp.com/team/app:1", Scope::Anonymous),
            hand_made_entry("registry.corp.com/team/other:1", Scope::Anonymous),
        ];
        for entry in &entries {
            registry.set(&entry.key.reference, digest(1));
        }
        let pinner = pinner_over(registry.clone(), &entries);
        let named = entries.iter().map(|e| e.key.clone()).collect();
        let report = refresh_named(&pinner, &named).await;
        assert_eq!((report.checked, report.moved), (2, 0));
        assert!(report.moved_keys.is_empty());

        registry.set(&entries[0].key.reference, digest(2));
        let report = refresh_named(&pinner, &named).await;
        assert_eq!((report.checked, report.moved), (2, 1));
        assert_eq!(report.moved_keys, BTreeSet::from([entries[0].key.clone()]));
    }

    #[test]
    fn refreshable_keys_are_the_named_ones_once_each() {
        let named_entry = hand_made_entry("registry.corp.com/team/app:1", secret_scope("team", "creds"));
        let other = hand_made_entry("registry.corp.com/team/app:1", secret_scope("victim", "db-creds"));
        let named = HashSet::from([named_entry.key.clone()]);
        let keys = refreshable(vec![named_entry.clone(), other, named_entry.clone()], &named);
        assert_eq!(keys, [(named_entry.key, named_entry.digest)]);
    }

    /// Issue 35: one registry that hangs holds its own lane of a round, never the others':
    /// every other registry's keys are checked while it hangs.
    #[tokio::test]
    async fn a_hanging_registry_holds_up_only_its_own_keys_in_a_round() {
        let registry = Arc::new(FakeSource::default());
        let gate = registry.hang("slow.example");
        let mut entries: Vec<CacheEntry> = (0..20)
            .map(|i| hand_made_entry(&format!("slow.example/app:{i}"), Scope::Anonymous))
            .collect();
        entries.extend((0..5).map(|i| hand_made_entry(&format!("fast.example/app:{i}"), Scope::Anonymous)));
        for entry in &entries {
            registry.set(&entry.key.reference, digest(1));
        }
        let pinner = pinner_over(registry.clone(), &entries);
        let named: HashSet<CacheKey> = entries.iter().map(|e| e.key.clone()).collect();
        let asked = |host: &str| registry.asked().iter().filter(|r| r.starts_with(host)).count();
        let round = refresh_named(&pinner, &named);
        tokio::pin!(round);
        let fast_done = async {
            while asked("fast.example/") < 5 {
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            _ = &mut round => panic!("the round ended while a registry hangs"),
            () = fast_done => {}
        }
        assert_eq!(
            asked("slow.example/"),
            CHECKS_PER_REGISTRY,
            "the hanging registry's lane"
        );
        gate.add_permits(Semaphore::MAX_PERMITS);
        let report = round.await;
        assert_eq!((report.checked, report.failed), (25, 0));
    }

    #[tokio::test]
    async fn a_round_reconciles_exactly_the_objects_naming_a_tag_that_moved() {
        let (moving, still) = (key("moving"), key("still"));
        let apps = vec![app("a1", "moving"), app("a2", "moving"), app("b", "still")];
        let mut term = Term::new(apps, &[&moving, &still], true);
        term.registry.set(&moving.reference, digest(2));
        let report = term.round().await.unwrap();
        assert_eq!(report.refresh.moved_keys, BTreeSet::from([moving]));
        assert_eq!((report.refresh.checked, report.refresh.moved), (2, 1));
        assert_eq!(report.triggered, 2);
        assert_eq!(term.triggered(), ["a1", "a2"]);
    }

    #[tokio::test]
    async fn a_round_where_nothing_moved_reconciles_nothing() {
        let (moving, still) = (key("moving"), key("still"));
        let apps = vec![app("a1", "moving"), app("a2", "moving"), app("b", "still")];
        let mut term = Term::new(apps, &[&moving, &still], true);
        let report = term.round().await.unwrap();
        assert_eq!((report.refresh.checked, report.triggered), (2, 0));
        assert!(term.triggered().is_empty());
        // One ask per tag, not per object.
        assert_eq!(term.registry.asked().len(), 2);
    }

    /// A reconcile found the entry older than the cache's `max_age` and moved it between
    /// rounds: the round's own check sees no move, and yet the other objects naming it follow.
    #[tokio::test]
    async fn a_tag_moved_between_rounds_reconciles_the_objects_naming_it() {
        let (moving, still) = (key("moving"), key("still"));
        let apps = vec![app("a1", "moving"), app("a2", "moving"), app("b", "still")];
        let mut term = Term::new(apps, &[&moving, &still], true);
        term.registry.set(&moving.reference, digest(2));
        let later = SystemTime::now() + Duration::from_secs(1);
        term.pinner.cache().insert(entry(&moving, &digest(2), later));
        let report = term.round().await.unwrap();
        assert_eq!(report.refresh.moved, 0);
        assert_eq!(term.triggered(), ["a1", "a2"]);
        // Once followed, it is not moved again.
        term.round().await.unwrap();
        assert!(term.triggered().is_empty());
    }

    /// An object naming a key the cache does not hold (refused past `max_entries`, never
    /// resolved) is reconciled each round, as before: its reconcile asks the registry.
    #[tokio::test]
    async fn objects_naming_a_key_the_cache_does_not_hold_are_reconciled() {
        let still = key("still");
        let apps = vec![app("b", "still"), app("c", "unheld")];
        let mut term = Term::new(apps, &[&still], true);
        term.round().await.unwrap();
        assert_eq!(term.triggered(), ["c"]);
        assert_eq!(term.registry.asked(), ["registry.example/app:still"]);
    }

    /// Issue 15's property, with the keys read off the watches' stores: an entry that no
    /// stored object names (here, naming a Secret and a registry of its writer's choice) is
    /// not refreshed, its Secret not read ([`NoSecrets`] fails the test), and it is collected.
    #[tokio::test]
    async fn named_keys_come_from_the_stores_and_an_entry_no_object_names_is_not_refreshed() {
        let still = key("still");
        let forged = CacheKey::tag(
            &Reference::parse("attacker.example/exfil:1").unwrap(),
            Scope::Secret {
                namespace: "victim".into(),
                name: "db-creds".into(),
            },
        );
        let mut term = Term::new(vec![app("b", "still")], &[&still, &forged], true);
        let report = term.round().await.unwrap();
        assert_eq!(term.registry.asked(), ["registry.example/app:still"]);
        assert_eq!((report.refresh.checked, report.refresh.unnamed), (1, 1));
        assert!(term.triggered().is_empty());
        // No grace in this term: the forged entry is collected at once, the named one stays.
        assert_eq!(report.collected, 1);
        assert!(term.pinner.cache().get(&forged).is_none());
        assert!(term.pinner.cache().get(&still).is_some());
    }

    /// Before the watches' first complete list the stores are partial: the round is skipped,
    /// nothing refreshed and, above all, nothing collected.
    #[tokio::test]
    async fn a_round_before_the_watches_listed_every_kind_is_skipped() {
        let (still, unnamed) = (key("still"), key("unnamed"));
        let mut term = Term::new(vec![app("b", "still")], &[&still, &unnamed], false);
        assert!(matches!(term.round().await, Err(Error::NotListed)));
        assert!(term.registry.asked().is_empty());
        assert!(term.pinner.cache().get(&unnamed).is_some());
        assert!(term.triggered().is_empty());
    }
}

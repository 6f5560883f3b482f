//! The digest cache: tag (or tag selection) → digest, answered from memory on the admission path,
//! with single-flight on misses, stale-if-error when the registry fails, and a short negative
//! cache.
//!
//! Entries are keyed by what was asked *and* the credential scope it was asked with: an entry
//! resolved with a namespace's Secret is only served to lookups with that same scope (that
//! namespace and Secret name), so a namespace never learns a digest it could not resolve itself.
//! Anonymous entries are public and serve every scope.
//!
//! Persistence is the caller's: an [`EntrySink`] receives every changed entry (the cluster store
//! writes it as a `DigestCacheEntry` object) and [`DigestCache::insert`] loads entries back
//! (from a watch of those objects), so replicas and restarts share one cache.
//!
//! The controller also records, per entry, where the entry's content was copied into the
//! mirror ([`Mirrored`], see `holdfast_registry::mirror`): kept beside the entries (a [`CacheEntry`] is
//! the registry's answer, the mirror record is the controller's), persisted through
//! [`EntrySink::persist_mirror`] and loaded with [`DigestCache::load_mirror`], and handed
//! out with every [`Answer`]. A record names the digest it holds (`…@sha256:…`), so a tag that
//! moved is never answered with the old digest's mirror location. When the new digest's copy is
//! recorded, the old copy is kept as [`Superseded`] (persisted too, so a new leader knows it)
//! until retention deletes it from the mirror.
//!
//! Built on `holdfast-registry`'s public API only (references, digests, credentials, the
//! [`Resolver`] it asks). The crate holds:
//! - the cache itself (this module: [`DigestCache`], its keys, entries, answers and mirror
//!   records; [`Source`], what it asks);
//! - [`cluster_store`]: its `DigestCacheEntry` objects (the CRD's type in
//!   [`cluster_store::crd`]), written by the leader and followed by every replica;
//! - [`metrics`]: its figures as a Prometheus collector, for the webhook's and the
//!   controller's `/metrics`;
//! - `testing` (feature `testing`): the stand-ins for the registry behind the cache that the
//!   other crates' tests use.

use std::{
    collections::{BTreeMap, HashMap},
    fmt,
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};
use serde::{Deserialize, Serialize};

use holdfast_registry::{
    Credentials, Digest, Reference, ResolveError, Resolver, SelectError, VersionSelection, select_tag,
    truncated,
};

pub mod cluster_store;
pub mod metrics;
mod mirror_records;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use mirror_records::Copies;
pub use mirror_records::{MirrorDeletion, MirrorFields, Mirrored, Superseded};

/// Whose credentials resolved an entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Scope {
    /// No credentials: the content is public.
    Anonymous,
    /// The `secretRef` Secret `name` in `namespace`.
    Secret { namespace: String, name: String },
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Anonymous => f.write_str("anonymous"),
            Scope::Secret { namespace, name } => write!(f, "secret:{namespace}/{name}"),
        }
    }
}

/// What a lookup asks: the digest of a tag, or of the tag a selection picks in a repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheKey {
    /// The normalised reference (`registry/repository:tag`), or the repository for a selection.
    pub reference: String,
    /// The `tagSelection`, as canonical JSON, when the tag is selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<String>,
    pub scope: Scope,
}

impl CacheKey {
    pub fn tag(reference: &Reference, scope: Scope) -> Self {
        Self {
            reference: reference.normalized(),
            selection: None,
            scope,
        }
    }

    pub fn selection(repository: &Reference, selection: &VersionSelection, scope: Scope) -> Self {
        Self {
            reference: repository.name(),
            selection: Some(serde_json::to_string(selection).unwrap_or_default()),
            scope,
        }
    }

    /// What to ask the registry for this key: the reference, and the selection if any.
    pub fn target(&self) -> Result<(Reference, Option<VersionSelection>), CacheError> {
        let invalid = |detail: String| CacheError::InvalidKey {
            reference: self.reference.clone(),
            detail,
        };
        let target = Reference::parse(&self.reference).map_err(|e| invalid(e.to_string()))?;
        let selection = match &self.selection {
            Some(json) => Some(serde_json::from_str(json).map_err(|e| invalid(e.to_string()))?),
            None => None,
        };
        Ok((target, selection))
    }

    fn anonymous(&self) -> Self {
        Self {
            scope: Scope::Anonymous,
            ..self.clone()
        }
    }
}

/// One cached answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheEntry {
    pub key: CacheKey,
    pub digest: Digest,
    /// The tag a selection picked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Last successful answer from the registry.
    pub resolved_at: SystemTime,
    /// Last time the registry was asked, whatever it answered.
    pub checked_at: SystemTime,
    /// The last failure, if the last check failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For a Secret scope, the uid of the Secret that resolved it: a Secret deleted and
    /// recreated under the same name is another Secret, and never answers from this entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_uid: Option<String>,
}

/// The largest entry kept (see [`CacheEntry::approximate_bytes`]): references are at most
/// ~640 bytes and admission refuses larger tag selections, so only a key built past those
/// bounds reaches it. With [`CacheConfig::max_entries`] it bounds what the cache holds in
/// memory and in its `DigestCacheEntry` objects.
pub const MAX_ENTRY_BYTES: usize = 4096;

/// The longest registry error recorded in an entry (its `error` field), in bytes.
pub const MAX_ERROR_BYTES: usize = 512;

impl CacheEntry {
    /// The bytes of the entry's variable-length fields, plus a fixed allowance for the rest.
    pub fn approximate_bytes(&self) -> usize {
        const FIXED: usize = 256;
        let scope = match &self.key.scope {
            Scope::Anonymous => 0,
            Scope::Secret { namespace, name } => namespace.len() + name.len(),
        };
        FIXED
            + self.key.reference.len()
            + self.key.selection.as_ref().map_or(0, String::len)
            + scope
            + self.digest.as_str().len()
            + self.tag.as_ref().map_or(0, String::len)
            + self.error.as_ref().map_or(0, String::len)
            + self.secret_uid.as_ref().map_or(0, String::len)
    }

    /// An answer the registry gave `at`: no tag picked, no failure, no Secret behind it.
    pub fn resolved(key: CacheKey, digest: Digest, at: SystemTime) -> Self {
        CacheEntry {
            key,
            digest,
            tag: None,
            resolved_at: at,
            checked_at: at,
            error: None,
            secret_uid: None,
        }
    }
}

/// Credentials for one lookup, with the uid of the Secret they came from (none: anonymous).
#[derive(Debug, Clone)]
pub struct Loaded {
    pub credentials: Credentials,
    pub secret_uid: Option<String>,
}

impl Loaded {
    pub fn anonymous() -> Self {
        Self {
            credentials: Credentials::anonymous(),
            secret_uid: None,
        }
    }
}

/// Where an answer came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Cache,
    Registry,
    /// The registry failed; this is the last digest it gave, within the allowed staleness.
    Stale {
        error: String,
        age: Duration,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub digest: Digest,
    pub tag: Option<String>,
    pub origin: Origin,
    /// When the registry gave this digest (for a Secret scope: with that Secret's credentials).
    pub resolved_at: SystemTime,
    /// Where `digest`'s content is in the mirror, when the controller copied it.
    pub mirrored: Option<Mirrored>,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Registry(#[from] ResolveError),
    #[error("{reference}: {source}")]
    Select {
        reference: String,
        source: Box<SelectError>,
    },
    #[error("credentials: {0}")]
    Credentials(String),
    /// The Secret of a scope does not exist (any more): its entries must not answer.
    #[error("credentials: Secret {namespace}/{name} not found")]
    SecretGone { namespace: String, name: String },
    /// A Secret's entry the webhook may not serve: not resolved since its namespace was created
    /// (a namespace of that name that is gone), or the namespace is not known yet.
    #[error(
        "the cached digest was resolved with a Secret of namespace {namespace} before this namespace existed (or it is not known yet); the controller resolves it anew"
    )]
    NotSinceNamespace { namespace: String },
    #[error("cache key {reference:?} does not parse: {detail}")]
    InvalidKey { reference: String, detail: String },
    #[error("{reference}: the selected tag {tag:?} is not a valid reference: {detail}")]
    SelectedTag {
        reference: String,
        tag: String,
        detail: String,
    },
    /// The lookup's task ended without an answer (it panicked, or the runtime is stopping).
    #[error("the registry lookup ended without an answer: {0}")]
    Interrupted(String),
}

/// Knobs, with the defaults documented in the README's configuration reference.
#[derive(Debug, Clone)]
pub struct CacheConfig {
    /// Answer from memory without asking the registry while an entry is younger than this.
    pub max_age: Duration,
    /// When the registry fails, keep answering with an entry up to this old.
    pub max_staleness: Duration,
    /// How long a failed lookup of an uncached key is remembered, and how long a held entry
    /// whose last check failed is served stale before the registry is asked again.
    pub negative_ttl: Duration,
    /// At most this many entries are held; a new key past it is answered but not kept (nor
    /// persisted), so forged reviews or a flood of objects cannot grow memory or etcd unbounded.
    /// The controller's garbage collection makes room: a full cache loses its entries no object
    /// names at once, not after the grace period.
    pub max_entries: usize,
    /// At most this many new keys are kept per minute (the same bound on the rate).
    pub new_entries_per_minute: u32,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            max_age: Duration::from_secs(10 * 60),
            max_staleness: Duration::from_secs(7 * 24 * 3600),
            negative_ttl: Duration::from_secs(10),
            max_entries: 10_000,
            new_entries_per_minute: 600,
        }
    }
}

/// Receives every entry the cache changed, to persist it.
pub trait EntrySink: Send + Sync {
    fn persist(&self, entry: &CacheEntry);
    /// Deletes the persisted entry with `key` (garbage collection, a replaced Secret).
    fn delete(&self, _key: &CacheKey) {}
    /// Persists the mirror records of the entry with `key` (an entry already persisted), whole.
    fn persist_mirror(&self, _key: &CacheKey, _fields: &MirrorFields) {}
}

/// The registry operations the cache needs; [`Resolver`] is the real one.
pub trait Source: Send + Sync + 'static {
    fn digest<'a>(
        &'a self,
        reference: &'a Reference,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<Digest, ResolveError>>;
    fn tags<'a>(
        &'a self,
        repository: &'a Reference,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<Vec<String>, ResolveError>>;
    /// Whether the registry serves `digest`, which it named for the tag `reference`
    /// ([`ResolveError::DigestNotServed`] if not). Asked only for a digest the cache does not
    /// already hold for the key, so never in a steady state.
    fn confirm<'a>(
        &'a self,
        reference: &'a Reference,
        digest: &'a Digest,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<(), ResolveError>>;
}

impl Source for Resolver {
    fn digest<'a>(
        &'a self,
        reference: &'a Reference,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<Digest, ResolveError>> {
        self.resolve_digest(reference, credentials).boxed()
    }

    fn tags<'a>(
        &'a self,
        repository: &'a Reference,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<Vec<String>, ResolveError>> {
        self.list_tags(repository, credentials).boxed()
    }

    fn confirm<'a>(
        &'a self,
        reference: &'a Reference,
        digest: &'a Digest,
        credentials: &'a Credentials,
    ) -> BoxFuture<'a, Result<(), ResolveError>> {
        self.confirm_served(reference, digest, credentials).boxed()
    }
}

/// The entries serving stale ([`DigestCache::staleness`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Staleness {
    /// Entries whose last check failed, by registry host (bounded by
    /// [`CacheConfig::max_entries`]).
    pub by_registry: BTreeMap<String, u64>,
    /// The age of the oldest digest among them; zero when there is none.
    pub oldest: Duration,
}

/// Counters for metrics.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub stale_answers: AtomicU64,
    /// Stale answers given without asking: the registry failed the entry's last check less
    /// than `negative_ttl` ago.
    pub registry_backoffs: AtomicU64,
    pub negative_hits: AtomicU64,
    /// Lookups that went to the registry (one per flight, however many callers joined it).
    pub registry_lookups: AtomicU64,
    pub registry_errors: AtomicU64,
    /// Of them, registries whose TLS certificate did not verify (a private CA not trusted).
    pub registry_certificate_errors: AtomicU64,
    /// New keys answered but not kept: [`CacheConfig::max_entries`] or the per-minute budget.
    pub refused: AtomicU64,
}

type Resolved = (Digest, Option<String>);

/// What a flight brings back: the resolution, and the uid of the Secret its credentials came
/// from when they could be loaded (a failed resolution still says which Secret it used).
#[derive(Debug, Clone)]
struct Flown {
    secret_uid: Option<String>,
    result: Result<Resolved, CacheError>,
}

type Flight = Shared<BoxFuture<'static, Flown>>;

/// The lookups in flight, by key, each with the id of its flight: a flight removes its own
/// slot when it lands, whether or not anyone still waits for it.
type Flights = Arc<Mutex<HashMap<CacheKey, (u64, Flight)>>>;

/// New keys kept in the current minute.
#[derive(Debug)]
struct Budget {
    since: Instant,
    used: u32,
}

pub struct DigestCache {
    source: Arc<dyn Source>,
    config: CacheConfig,
    entries: RwLock<HashMap<CacheKey, CacheEntry>>,
    /// The controller's mirror records, by entry key.
    mirrored: RwLock<HashMap<CacheKey, Copies>>,
    /// Bumped on every change of an entry or a mirror record.
    changes: tokio::sync::watch::Sender<u64>,
    negative: Mutex<HashMap<CacheKey, (Instant, CacheError)>>,
    flights: Flights,
    /// The id of the next flight.
    next_flight: AtomicU64,
    budget: Mutex<Budget>,
    sink: Option<Arc<dyn EntrySink>>,
    pub stats: CacheStats,
}

impl DigestCache {
    pub fn new(source: Arc<dyn Source>, config: CacheConfig, sink: Option<Arc<dyn EntrySink>>) -> Self {
        Self {
            source,
            config,
            entries: RwLock::default(),
            mirrored: RwLock::default(),
            changes: tokio::sync::watch::Sender::new(0),
            negative: Mutex::default(),
            flights: Flights::default(),
            next_flight: AtomicU64::new(0),
            budget: Mutex::new(Budget {
                since: Instant::now(),
                used: 0,
            }),
            sink,
            stats: CacheStats::default(),
        }
    }

    /// Drops `key`'s entry and deletes it from the store (garbage collection, or its Secret is
    /// gone or was replaced). Its mirror records stay, for retention.
    pub fn remove(&self, key: &CacheKey) {
        if let Some(sink) = &self.sink {
            sink.delete(key);
        }
        self.forget(key);
    }

    /// Drops `key`'s entry from memory only (its object was deleted).
    pub fn forget(&self, key: &CacheKey) {
        let removed = self
            .entries
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
            .is_some();
        if removed {
            self.changed();
        }
    }

    /// Loads an entry (from the persisted store); a newer entry already held wins. Loaded
    /// entries are not held to [`CacheConfig::max_entries`]: the store is their bound.
    pub fn insert(&self, entry: CacheEntry) {
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        match entries.get(&entry.key) {
            Some(held) if held.checked_at >= entry.checked_at => {}
            _ => {
                entries.insert(entry.key.clone(), entry);
                drop(entries);
                self.changed();
            }
        }
    }

    /// Changes whenever an entry or a mirror record changes (loaded, resolved or recorded).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The entry serving `key`: its own, else the anonymous one (public content serves all).
    pub fn get(&self, key: &CacheKey) -> Option<CacheEntry> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries
            .get(key)
            .or_else(|| entries.get(&key.anonymous()))
            .cloned()
    }

    /// [`CacheConfig::max_entries`]: the controller's garbage collection evicts unnamed entries
    /// past it.
    pub fn max_entries(&self) -> usize {
        self.config.max_entries
    }

    /// [`CacheConfig::max_staleness`]: how old a digest may get while it is served stale (the
    /// entries' status says until when).
    pub fn max_staleness(&self) -> Duration {
        self.config.max_staleness
    }

    /// The entries whose last registry check failed (they answer with an older digest until
    /// [`CacheConfig::max_staleness`]), by registry host, and the age of the oldest such digest:
    /// what an operator needs to see an outage coming to its limit (for metrics: no copies).
    pub fn staleness(&self, now: SystemTime) -> Staleness {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        let mut staleness = Staleness::default();
        for entry in entries.values().filter(|e| e.error.is_some()) {
            let host = entry.key.reference.split('/').next().unwrap_or_default();
            *staleness.by_registry.entry(host.to_string()).or_default() += 1;
            staleness.oldest = staleness.oldest.max(age(entry.resolved_at, now));
        }
        staleness
    }

    /// How many entries are held (for metrics: no copies).
    pub fn entry_count(&self) -> usize {
        self.entries.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn entries(&self) -> Vec<CacheEntry> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The digest for `key`: from memory when fresh; else from the registry, once however many
    /// callers ask at the same time; else, if the registry fails, the last digest within the
    /// allowed staleness. `credentials` is only called when the registry must be asked. The
    /// registry is asked from a Tokio task (see `flight`): call it inside a Tokio runtime.
    pub async fn lookup<F>(
        &self,
        key: CacheKey,
        target: Reference,
        selection: Option<VersionSelection>,
        credentials: F,
    ) -> Result<Answer, CacheError>
    where
        F: FnOnce() -> BoxFuture<'static, Result<Loaded, CacheError>>,
    {
        self.lookup_with(key, target, selection, credentials, self.config.max_age)
            .await
    }

    /// Asks the registry again for a held key, whatever the entry's age (the controller's
    /// refresher: one check per unique key). A failure keeps the entry (stale-if-error).
    pub async fn refresh<F>(&self, key: &CacheKey, credentials: F) -> Result<Answer, CacheError>
    where
        F: FnOnce() -> BoxFuture<'static, Result<Loaded, CacheError>>,
    {
        let (target, selection) = key.target()?;
        self.lookup_with(key.clone(), target, selection, credentials, Duration::ZERO)
            .await
    }

    async fn lookup_with<F>(
        &self,
        key: CacheKey,
        target: Reference,
        selection: Option<VersionSelection>,
        credentials: F,
        max_age: Duration,
    ) -> Result<Answer, CacheError>
    where
        F: FnOnce() -> BoxFuture<'static, Result<Loaded, CacheError>>,
    {
        let now = SystemTime::now();
        let held = self.get(&key);
        if let Some(entry) = &held
            && age(entry.resolved_at, now) <= max_age
            && !max_age.is_zero()
        {
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Answer {
                digest: entry.digest.clone(),
                tag: entry.tag.clone(),
                origin: Origin::Cache,
                resolved_at: entry.resolved_at,
                mirrored: self.mirror_of(&entry.key, &entry.digest),
            });
        }
        // The registry failed this entry's last check a moment ago: serve it stale without
        // asking again, so that a registry that is down (or coming back) gets one attempt per
        // key per negative_ttl from each process, not one per lookup. The refresher
        // (max_age zero) always asks.
        if let Some(entry) = &held
            && let Some(error) = &entry.error
            && !max_age.is_zero()
            && age(entry.checked_at, now) < self.config.negative_ttl
            && age(entry.resolved_at, now) <= self.config.max_staleness
        {
            self.stats.stale_answers.fetch_add(1, Ordering::Relaxed);
            self.stats.registry_backoffs.fetch_add(1, Ordering::Relaxed);
            return Ok(self.stale_answer(entry, error.clone(), now));
        }
        if held.is_none() {
            if let Some(error) = self.negative(&key) {
                self.stats.negative_hits.fetch_add(1, Ordering::Relaxed);
                return Err(error);
            }
            self.stats.misses.fetch_add(1, Ordering::Relaxed);
        }
        let held_digest = held.as_ref().map(|entry| entry.digest.clone());
        let Flown { secret_uid, result } = self
            .flight(&key, target, selection, held_digest, credentials)
            .await;
        let checked_at = SystemTime::now();
        match result {
            Ok((digest, tag)) => {
                let mirrored = self.mirror_of(&key, &digest);
                let entry = CacheEntry {
                    tag: tag.clone(),
                    secret_uid,
                    ..CacheEntry::resolved(key, digest.clone(), checked_at)
                };
                self.store(entry);
                Ok(Answer {
                    digest,
                    tag,
                    origin: Origin::Registry,
                    resolved_at: checked_at,
                    mirrored,
                })
            }
            Err(error) => {
                self.stats.registry_errors.fetch_add(1, Ordering::Relaxed);
                if matches!(error, CacheError::Registry(ResolveError::Certificate { .. })) {
                    self.stats
                        .registry_certificate_errors
                        .fetch_add(1, Ordering::Relaxed);
                }
                // An entry of another Secret (deleted, or recreated under its name) never
                // answers again, not even stale: it is dropped.
                let held = match held {
                    Some(entry) if !same_secret(&entry, secret_uid.as_deref(), &error) => {
                        tracing::info!(reference = %entry.key.reference, scope = %entry.key.scope, "dropped a cache entry: its Secret is gone or was replaced");
                        self.remove(&entry.key);
                        None
                    }
                    held => held,
                };
                match held {
                    Some(entry) if age(entry.resolved_at, checked_at) <= self.config.max_staleness => {
                        self.stats.stale_answers.fetch_add(1, Ordering::Relaxed);
                        let answer = self.stale_answer(&entry, error.to_string(), checked_at);
                        self.store(CacheEntry {
                            checked_at,
                            error: Some(truncated(&error.to_string(), MAX_ERROR_BYTES).into_owned()),
                            ..entry
                        });
                        Ok(answer)
                    }
                    _ => {
                        self.remember_failure(key, error.clone());
                        Err(error)
                    }
                }
            }
        }
    }

    /// `entry`'s digest, served stale after `error`.
    fn stale_answer(&self, entry: &CacheEntry, error: String, now: SystemTime) -> Answer {
        Answer {
            digest: entry.digest.clone(),
            tag: entry.tag.clone(),
            origin: Origin::Stale {
                error,
                age: age(entry.resolved_at, now),
            },
            resolved_at: entry.resolved_at,
            mirrored: self.mirror_of(&entry.key, &entry.digest),
        }
    }

    fn negative(&self, key: &CacheKey) -> Option<CacheError> {
        let mut negative = self.negative.lock().unwrap_or_else(|e| e.into_inner());
        match negative.get(key) {
            Some((at, error)) if at.elapsed() < self.config.negative_ttl => Some(error.clone()),
            Some(_) => {
                negative.remove(key);
                None
            }
            None => None,
        }
    }

    /// Remembers a failed miss for [`CacheConfig::negative_ttl`]. Held to
    /// [`CacheConfig::max_entries`] too: past it the expired failures are swept, then the
    /// oldest dropped (forgetting one costs one more registry call).
    fn remember_failure(&self, key: CacheKey, error: CacheError) {
        let mut negative = self.negative.lock().unwrap_or_else(|e| e.into_inner());
        if negative.len() >= self.config.max_entries.max(1) && !negative.contains_key(&key) {
            let ttl = self.config.negative_ttl;
            negative.retain(|_, (at, _)| at.elapsed() < ttl);
            if negative.len() >= self.config.max_entries.max(1)
                && let Some(oldest) = negative
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone())
            {
                negative.remove(&oldest);
            }
        }
        negative.insert(key, (Instant::now(), error));
    }

    /// Failed misses remembered (for metrics).
    pub fn negative_count(&self) -> usize {
        self.negative.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn store(&self, entry: CacheEntry) {
        self.negative
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&entry.key);
        if entry.approximate_bytes() > MAX_ENTRY_BYTES {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(reference = %truncated(&entry.key.reference, 256), bytes = entry.approximate_bytes(), max = MAX_ENTRY_BYTES, "digest cache entry too large; answered without keeping it");
            return;
        }
        let mut entries = self.entries.write().unwrap_or_else(|e| e.into_inner());
        if !entries.contains_key(&entry.key) && !self.admit_new(entries.len()) {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(reference = %entry.key.reference, held = entries.len(), "digest cache full or over its per-minute budget; answered without keeping the entry");
            return;
        }
        if let Some(sink) = &self.sink {
            sink.persist(&entry);
        }
        entries.insert(entry.key.clone(), entry);
        drop(entries);
        self.changed();
    }

    /// Whether a new key may be kept, `held` entries being held: within
    /// [`CacheConfig::max_entries`] and this minute's [`CacheConfig::new_entries_per_minute`].
    fn admit_new(&self, held: usize) -> bool {
        if held >= self.config.max_entries {
            return false;
        }
        let mut budget = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if now.duration_since(budget.since) >= Duration::from_secs(60) {
            *budget = Budget { since: now, used: 0 };
        }
        if budget.used >= self.config.new_entries_per_minute {
            return false;
        }
        budget.used += 1;
        true
    }

    /// Registry lookups in flight (for metrics, and for tests that a cancelled lookup lands).
    pub fn flights_in_flight(&self) -> usize {
        self.flights.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Joins the flight for `key`, or starts it. A flight is a task of its own: a caller that
    /// stops waiting (the admission deadline dropped it) neither cancels nor strands it, so its
    /// per-host permit comes back when the request ends (bounded by the request timeout) and it
    /// removes its single-flight slot when it lands; the next lookup of the key asks afresh.
    async fn flight<F>(
        &self,
        key: &CacheKey,
        target: Reference,
        selection: Option<VersionSelection>,
        held: Option<Digest>,
        credentials: F,
    ) -> Flown
    where
        F: FnOnce() -> BoxFuture<'static, Result<Loaded, CacheError>>,
    {
        let flight = {
            let mut flights = self.flights.lock().unwrap_or_else(|e| e.into_inner());
            match flights.get(key) {
                Some((_, flight)) => flight.clone(),
                None => {
                    self.stats.registry_lookups.fetch_add(1, Ordering::Relaxed);
                    let id = self.next_flight.fetch_add(1, Ordering::Relaxed);
                    let source = self.source.clone();
                    let credentials = credentials();
                    let slots = Arc::clone(&self.flights);
                    let landing = key.clone();
                    // The slot is inserted below while the lock is held, so the task cannot
                    // land before it exists.
                    let task = tokio::spawn(async move {
                        let flown = fly(
                            source.as_ref(),
                            &target,
                            selection.as_ref(),
                            held.as_ref(),
                            credentials,
                        )
                        .await;
                        let mut slots = slots.lock().unwrap_or_else(|e| e.into_inner());
                        if slots.get(&landing).is_some_and(|(flying, _)| *flying == id) {
                            slots.remove(&landing);
                        }
                        flown
                    });
                    let flight = async move {
                        task.await.unwrap_or_else(|e| Flown {
                            secret_uid: None,
                            result: Err(CacheError::Interrupted(e.to_string())),
                        })
                    }
                    .boxed()
                    .shared();
                    flights.insert(key.clone(), (id, flight.clone()));
                    flight
                }
            }
        };
        flight.await
    }
}

/// One flight's work: the credentials, then the registry.
async fn fly(
    source: &dyn Source,
    target: &Reference,
    selection: Option<&VersionSelection>,
    held: Option<&Digest>,
    credentials: BoxFuture<'static, Result<Loaded, CacheError>>,
) -> Flown {
    match credentials.await {
        Ok(loaded) => Flown {
            result: resolve(source, target, selection, held, &loaded.credentials).await,
            secret_uid: loaded.secret_uid,
        },
        Err(error) => Flown {
            secret_uid: None,
            result: Err(error),
        },
    }
}

/// Asks the registry: the tag's digest, or the selected tag's; a digest other than `held` (the
/// entry's) only once the registry confirms it serves it.
async fn resolve(
    source: &dyn Source,
    target: &Reference,
    selection: Option<&VersionSelection>,
    held: Option<&Digest>,
    credentials: &Credentials,
) -> Result<Resolved, CacheError> {
    let Some(selection) = selection else {
        let digest = confirmed(source, target, held, credentials).await?;
        return Ok((digest, None));
    };
    let tags = source.tags(target, credentials).await?;
    let tag = select_tag(&tags, selection)
        .map_err(|source| CacheError::Select {
            reference: target.name(),
            source: Box::new(source),
        })?
        .to_string();
    let tagged = target.with_tag(&tag).map_err(|e| CacheError::SelectedTag {
        reference: target.name(),
        tag: tag.clone(),
        detail: e.to_string(),
    })?;
    Ok((confirmed(source, &tagged, held, credentials).await?, Some(tag)))
}

/// The digest the tag `reference` names, confirmed served unless it is `held` already.
async fn confirmed(
    source: &dyn Source,
    reference: &Reference,
    held: Option<&Digest>,
    credentials: &Credentials,
) -> Result<Digest, CacheError> {
    let digest = source.digest(reference, credentials).await?;
    if held != Some(&digest) {
        source.confirm(reference, &digest, credentials).await?;
    }
    Ok(digest)
}

/// Whether `entry` may still answer after a failed resolution that loaded the credentials of
/// the Secret with `loaded` uid (none: they could not be loaded, for `error`). Anonymous
/// entries always may; a Secret's entry only for the Secret that resolved it, and not once its
/// Secret is gone.
fn same_secret(entry: &CacheEntry, loaded: Option<&str>, error: &CacheError) -> bool {
    match (&entry.key.scope, loaded) {
        (Scope::Anonymous, _) => true,
        (Scope::Secret { .. }, Some(uid)) => entry.secret_uid.as_deref() == Some(uid),
        (Scope::Secret { .. }, None) => !matches!(error, CacheError::SecretGone { .. }),
    }
}

fn age(since: SystemTime, now: SystemTime) -> Duration {
    now.duration_since(since).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::testing::FakeSource;

    /// A registry holding, for each `(reference, seed)`, the digest of `seed`.
    fn fake(refs: &[(&str, &str)]) -> FakeSource {
        FakeSource::with(refs.iter().map(|(reference, seed)| (*reference, digest(seed))))
    }

    fn digest(seed: &str) -> Digest {
        Digest::sha256_of(seed.as_bytes())
    }

    fn anonymous() -> BoxFuture<'static, Result<Loaded, CacheError>> {
        futures::future::ready(Ok(Loaded::anonymous())).boxed()
    }

    fn reference(s: &str) -> Reference {
        Reference::parse(s).unwrap()
    }

    async fn lookup(cache: &DigestCache, r: &str, scope: Scope) -> Result<Answer, CacheError> {
        let target = reference(r);
        cache
            .lookup(CacheKey::tag(&target, scope), target, None, anonymous)
            .await
    }

    /// Every lookup asks the registry (no fresh answers, no backoff after a failure: that is
    /// `a_failed_check_is_not_repeated…`'s), and a failure serves the held digest for an hour.
    fn asking_every_time() -> CacheConfig {
        CacheConfig {
            max_age: Duration::ZERO,
            max_staleness: Duration::from_secs(3600),
            negative_ttl: Duration::ZERO,
            ..Default::default()
        }
    }

    fn cache(source: FakeSource, config: CacheConfig) -> (Arc<FakeSource>, DigestCache) {
        let source = Arc::new(source);
        (source.clone(), DigestCache::new(source, config, None))
    }

    const APP: &str = "registry.example/team/app:1.0.0";

    #[tokio::test]
    async fn a_miss_asks_the_registry_once_then_answers_from_memory() {
        let (source, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        let first = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!(
            (first.digest.clone(), first.origin),
            (digest("v1"), Origin::Registry)
        );
        let second = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!((second.digest, second.origin), (digest("v1"), Origin::Cache));
        assert_eq!(source.calls(), 1);
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_registry_request() {
        let (source, gate) = fake(&[(APP, "v1")]).gated();
        let (source, cache) = cache(source, CacheConfig::default());
        let cache = Arc::new(cache);
        let lookups: Vec<_> = (0..1000)
            .map(|_| {
                let cache = cache.clone();
                tokio::spawn(async move { lookup(&cache, APP, Scope::Anonymous).await })
            })
            .collect();
        // Every lookup has joined the flight once the one registry call is waiting at the gate.
        while source.calls() == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..50 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1000);
        for lookup in lookups {
            assert_eq!(lookup.await.unwrap().unwrap().digest, digest("v1"));
        }
        assert_eq!(source.calls(), 1);
        assert_eq!(cache.stats.registry_lookups.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_lookup_dropped_by_its_caller_lands_and_frees_its_slot() {
        let (source, gate) = fake(&[(APP, "v1")]).gated();
        let (source, cache) = cache(source, CacheConfig::default());
        let cut =
            tokio::time::timeout(Duration::from_millis(20), lookup(&cache, APP, Scope::Anonymous)).await;
        assert!(cut.is_err(), "answered through a closed gate");
        assert_eq!(
            cache.flights_in_flight(),
            1,
            "the flight goes on without its caller"
        );
        gate.add_permits(10);
        while cache.flights_in_flight() > 0 {
            tokio::task::yield_now().await;
        }
        assert_eq!(source.calls(), 1);
        let answer = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!((answer.digest, answer.origin), (digest("v1"), Origin::Registry));
        assert_eq!(source.calls(), 2, "the next lookup asks afresh");
        assert_eq!(cache.flights_in_flight(), 0);
    }

    #[tokio::test]
    async fn failed_misses_are_held_to_the_entry_bound() {
        let config = CacheConfig {
            max_entries: 3,
            ..Default::default()
        };
        let (source, cache) = cache(FakeSource::default(), config);
        source.fail(true);
        for i in 0..10 {
            let r = format!("registry.example/team/app{i}:1.0.0");
            assert!(lookup(&cache, &r, Scope::Anonymous).await.is_err());
        }
        assert_eq!(cache.negative_count(), 3);
        let newest = "registry.example/team/app9:1.0.0";
        assert!(
            cache
                .negative(&CacheKey::tag(&reference(newest), Scope::Anonymous))
                .is_some(),
            "the newest is kept"
        );
    }

    #[tokio::test]
    async fn an_entry_past_the_size_bound_is_answered_but_not_kept() {
        let (_, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        let target = reference(APP);
        let key = CacheKey {
            selection: Some("x".repeat(MAX_ENTRY_BYTES)),
            ..CacheKey::tag(&target, Scope::Anonymous)
        };
        let answer = cache.lookup(key.clone(), target, None, anonymous).await.unwrap();
        assert_eq!(answer.digest, digest("v1"));
        assert!(cache.get(&key).is_none());
        assert_eq!(cache.stats.refused.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_recorded_registry_error_is_bounded() {
        let config = CacheConfig {
            max_age: Duration::ZERO,
            ..Default::default()
        };
        let (source, cache) = cache(fake(&[(APP, "v1")]), config);
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        source.fail(true);
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        let entry = cache
            .get(&CacheKey::tag(&reference(APP), Scope::Anonymous))
            .unwrap();
        assert!(entry.error.as_ref().is_some_and(|e| e.len() <= MAX_ERROR_BYTES));
        assert!(entry.approximate_bytes() <= MAX_ENTRY_BYTES);
    }

    #[tokio::test]
    async fn a_failing_registry_gets_the_last_digest_within_the_staleness_bound() {
        let (source, cache) = cache(fake(&[(APP, "v1")]), asking_every_time());
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        source.fail(true);
        let answer = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!(answer.digest, digest("v1"));
        assert!(
            matches!(answer.origin, Origin::Stale { ref error, .. } if error.contains("no response")),
            "{answer:?}"
        );
        let entry = cache
            .get(&CacheKey::tag(&reference(APP), Scope::Anonymous))
            .unwrap();
        assert!(entry.error.is_some(), "the failed check is recorded");
        let later = entry.resolved_at + Duration::from_secs(90);
        let staleness = cache.staleness(later);
        assert_eq!(
            staleness.by_registry,
            BTreeMap::from([("registry.example".to_string(), 1)])
        );
        assert_eq!(staleness.oldest, Duration::from_secs(90));
        // The registry answers again: nothing serves stale.
        source.fail(false);
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!(cache.staleness(later), Staleness::default());
    }

    /// A tag's new digest is pinned only once the registry confirms it serves it: a digest named
    /// but not served (a proxy's stale or corrupt answer) leaves the held digest answering,
    /// stale, and a miss with the error; a digest already held is never confirmed again, so a
    /// steady state costs one request per check.
    #[tokio::test]
    async fn a_digest_named_but_not_served_is_never_pinned() {
        let (source, cache) = cache(fake(&[(APP, "v1")]), asking_every_time());
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!(source.confirmations(), 1, "a miss confirms its digest");
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!(
            (source.calls(), source.confirmations()),
            (2, 1),
            "the held digest is not confirmed again"
        );

        source.set(APP, digest("v2"));
        source.withhold(&digest("v2"), true);
        let answer = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!(answer.digest, digest("v1"));
        assert!(
            matches!(answer.origin, Origin::Stale { ref error, .. } if error.contains("does not serve")),
            "{answer:?}"
        );
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        assert_eq!(cache.get(&key).unwrap().digest, digest("v1"));

        let other = "registry.example/team/other:1.0";
        source.set(other, digest("other"));
        source.withhold(&digest("other"), true);
        let error = lookup(&cache, other, Scope::Anonymous).await.unwrap_err();
        assert!(error.to_string().contains("does not serve"), "{error}");
        assert!(
            cache
                .get(&CacheKey::tag(&reference(other), Scope::Anonymous))
                .is_none()
        );

        source.withhold(&digest("v2"), false);
        let answer = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        assert_eq!((answer.digest, answer.origin), (digest("v2"), Origin::Registry));
        assert_eq!(cache.get(&key).unwrap().digest, digest("v2"));
    }

    /// A registry that failed an entry's check is asked again only after negative_ttl: the
    /// lookups in between are stale answers without a registry call; the refresher still asks.
    #[tokio::test]
    async fn a_failed_check_is_not_repeated_on_every_lookup_within_the_negative_ttl() {
        for (ttl, asks) in [(Duration::from_secs(3600), false), (Duration::ZERO, true)] {
            let config = CacheConfig {
                max_age: Duration::from_millis(1),
                max_staleness: Duration::from_secs(3600),
                negative_ttl: ttl,
                ..Default::default()
            };
            let (source, cache) = cache(fake(&[(APP, "v1")]), config);
            lookup(&cache, APP, Scope::Anonymous).await.unwrap();
            source.fail(true);
            // Older than max_age: asks, fails, serves stale.
            let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
            let entry = cache.get(&key).unwrap();
            cache.remove(&key);
            cache.insert(CacheEntry {
                resolved_at: entry.resolved_at - Duration::from_secs(60),
                checked_at: entry.checked_at - Duration::from_secs(60),
                ..entry
            });
            let first = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
            assert!(matches!(first.origin, Origin::Stale { .. }), "{first:?}");
            assert_eq!(source.calls(), 2);
            for _ in 0..5 {
                let answer = lookup(&cache, APP, Scope::Anonymous).await.unwrap();
                assert_eq!(answer.digest, digest("v1"));
                assert!(
                    matches!(answer.origin, Origin::Stale { ref error, .. } if error.contains("no response")),
                    "{answer:?}"
                );
            }
            let backoffs = cache.stats.registry_backoffs.load(Ordering::Relaxed);
            if asks {
                assert_eq!(
                    (source.calls(), backoffs),
                    (7, 0),
                    "negative_ttl 0: every lookup asks"
                );
            } else {
                assert_eq!((source.calls(), backoffs), (2, 5), "within negative_ttl: no call");
            }
            // The refresher asks whatever the TTL.
            source.fail(false);
            let refreshed = cache.refresh(&key, anonymous).await.unwrap();
            assert_eq!(refreshed.origin, Origin::Registry);
        }
    }

    #[tokio::test]
    async fn past_the_staleness_bound_the_error_is_returned() {
        let config = CacheConfig {
            max_age: Duration::ZERO,
            max_staleness: Duration::ZERO,
            ..Default::default()
        };
        let (source, cache) = cache(fake(&[(APP, "v1")]), config);
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        let old = SystemTime::now() - Duration::from_secs(60);
        cache.insert(CacheEntry::resolved(key, digest("v0"), old));
        source.fail(true);
        assert!(matches!(
            lookup(&cache, APP, Scope::Anonymous).await,
            Err(CacheError::Registry(_))
        ));
    }

    #[tokio::test]
    async fn failed_misses_are_remembered_briefly() {
        let (source, cache) = cache(fake(&[]), CacheConfig::default());
        assert!(lookup(&cache, APP, Scope::Anonymous).await.is_err());
        assert!(lookup(&cache, APP, Scope::Anonymous).await.is_err());
        assert_eq!(
            source.calls(),
            1,
            "the second failure came from the negative cache"
        );

        let (source, cache) = self::cache(
            fake(&[]),
            CacheConfig {
                negative_ttl: Duration::ZERO,
                ..Default::default()
            },
        );
        assert!(lookup(&cache, APP, Scope::Anonymous).await.is_err());
        assert!(lookup(&cache, APP, Scope::Anonymous).await.is_err());
        assert_eq!(source.calls(), 2);
    }

    #[tokio::test]
    async fn a_credentialed_entry_serves_only_its_own_scope() {
        let (source, cache) = cache(fake(&[(APP, "private")]), CacheConfig::default());
        let team_a = Scope::Secret {
            namespace: "a".into(),
            name: "creds".into(),
        };
        let team_b = Scope::Secret {
            namespace: "b".into(),
            name: "creds".into(),
        };
        lookup(&cache, APP, team_a.clone()).await.unwrap();
        assert!(cache.get(&CacheKey::tag(&reference(APP), team_a)).is_some());
        assert!(
            cache
                .get(&CacheKey::tag(&reference(APP), team_b.clone()))
                .is_none()
        );
        assert!(
            cache
                .get(&CacheKey::tag(&reference(APP), Scope::Anonymous))
                .is_none()
        );
        lookup(&cache, APP, team_b).await.unwrap();
        assert_eq!(source.calls(), 2, "namespace b resolved for itself");
    }

    #[tokio::test]
    async fn an_anonymous_entry_serves_every_scope() {
        let (source, cache) = cache(fake(&[(APP, "public")]), CacheConfig::default());
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        let scoped = Scope::Secret {
            namespace: "a".into(),
            name: "creds".into(),
        };
        assert_eq!(lookup(&cache, APP, scoped).await.unwrap().origin, Origin::Cache);
        assert_eq!(source.calls(), 1);
    }

    #[tokio::test]
    async fn credentials_are_loaded_only_when_the_registry_is_asked() {
        let (_, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        let target = reference(APP);
        let loaded = Arc::new(AtomicUsize::new(0));
        let counter = loaded.clone();
        cache
            .lookup(
                CacheKey::tag(&target, Scope::Anonymous),
                target,
                None,
                move || {
                    counter.fetch_add(1, Ordering::SeqCst);
                    anonymous()
                },
            )
            .await
            .unwrap();
        assert_eq!(loaded.load(Ordering::SeqCst), 0);
    }

    /// The Secret `team/creds` with `uid`, as the controller's loader reads it.
    fn secret(uid: &'static str) -> impl FnOnce() -> BoxFuture<'static, Result<Loaded, CacheError>> {
        move || {
            futures::future::ready(Ok(Loaded {
                credentials: Credentials::anonymous(),
                secret_uid: Some(uid.into()),
            }))
            .boxed()
        }
    }

    fn team_creds() -> Scope {
        Scope::Secret {
            namespace: "team".into(),
            name: "creds".into(),
        }
    }

    /// A cache holding `team/creds`'s entry for [`APP`], resolved with the Secret `uid`, whose
    /// registry now fails.
    fn failing_with_private_entry(uid: &str) -> (DigestCache, CacheKey) {
        let (source, cache) = cache(fake(&[]), CacheConfig::default());
        source.fail(true);
        let key = CacheKey::tag(&reference(APP), team_creds());
        cache.insert(CacheEntry {
            secret_uid: Some(uid.into()),
            ..CacheEntry::resolved(key.clone(), digest("old"), SystemTime::now())
        });
        (cache, key)
    }

    #[tokio::test]
    async fn a_secret_recreated_under_its_name_no_longer_answers_from_the_old_entries() {
        let (cache, key) = failing_with_private_entry("uid-1");
        // The same Secret: stale-if-error as for any entry.
        let answer = cache.refresh(&key, secret("uid-1")).await.unwrap();
        assert!(matches!(answer.origin, Origin::Stale { .. }));
        // Deleted and created again (another uid): the old entry is dropped, not served stale.
        assert!(cache.refresh(&key, secret("uid-2")).await.is_err());
        assert_eq!(cache.get(&key), None);
    }

    #[tokio::test]
    async fn a_deleted_secret_no_longer_answers_from_its_entries() {
        let (cache, key) = failing_with_private_entry("uid-1");
        let gone = || {
            futures::future::ready(Err(CacheError::SecretGone {
                namespace: "team".into(),
                name: "creds".into(),
            }))
            .boxed()
        };
        assert!(cache.refresh(&key, gone).await.is_err());
        assert_eq!(cache.get(&key), None);
        // Any other failure to read it (the API server down) keeps the entry answering.
        let (cache, key) = failing_with_private_entry("uid-1");
        let unreadable = || futures::future::ready(Err(CacheError::Credentials("timeout".into()))).boxed();
        assert!(matches!(
            cache.refresh(&key, unreadable).await.unwrap().origin,
            Origin::Stale { .. }
        ));
    }

    #[tokio::test]
    async fn a_resolution_records_the_secret_it_used() {
        let (_, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        let target = reference(APP);
        let key = CacheKey::tag(&target, team_creds());
        cache
            .lookup(key.clone(), target, None, secret("uid-1"))
            .await
            .unwrap();
        assert_eq!(cache.get(&key).unwrap().secret_uid.as_deref(), Some("uid-1"));
    }

    /// Counts what the cache persists and deletes.
    #[derive(Default)]
    struct CountingSink {
        persisted: AtomicUsize,
        deleted: Mutex<Vec<CacheKey>>,
    }

    impl EntrySink for CountingSink {
        fn persist(&self, _: &CacheEntry) {
            self.persisted.fetch_add(1, Ordering::SeqCst);
        }

        fn delete(&self, key: &CacheKey) {
            self.deleted.lock().unwrap().push(key.clone());
        }
    }

    fn tags(n: usize) -> Vec<(String, &'static str)> {
        (0..n)
            .map(|i| (format!("registry.example/team/app:{i}"), "v"))
            .collect()
    }

    /// A cache over a registry with tags `0..n` and `config`, persisting into a counting sink.
    fn counted(n: usize, config: CacheConfig) -> (DigestCache, Arc<CountingSink>) {
        let refs = tags(n);
        let refs: Vec<(&str, &str)> = refs.iter().map(|(r, d)| (r.as_str(), *d)).collect();
        let sink = Arc::new(CountingSink::default());
        let cache = DigestCache::new(Arc::new(fake(&refs)), config, Some(sink.clone()));
        (cache, sink)
    }

    #[tokio::test]
    async fn new_keys_past_the_cap_are_answered_but_neither_kept_nor_persisted() {
        let config = CacheConfig {
            max_entries: 2,
            ..Default::default()
        };
        let (cache, sink) = counted(3, config);
        for (r, _) in tags(3) {
            assert_eq!(
                lookup(&cache, &r, Scope::Anonymous).await.unwrap().digest,
                digest("v")
            );
        }
        assert_eq!(cache.entry_count(), 2);
        assert_eq!(sink.persisted.load(Ordering::SeqCst), 2);
        assert_eq!(cache.stats.refused.load(Ordering::SeqCst), 1);
        // A held key is still refreshed and persisted.
        let held = CacheKey::tag(&reference("registry.example/team/app:0"), Scope::Anonymous);
        cache.refresh(&held, anonymous).await.unwrap();
        assert_eq!(sink.persisted.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn new_keys_past_the_per_minute_budget_are_not_kept() {
        let config = CacheConfig {
            new_entries_per_minute: 2,
            ..Default::default()
        };
        let (cache, sink) = counted(5, config);
        for (r, _) in tags(5) {
            lookup(&cache, &r, Scope::Anonymous).await.unwrap();
        }
        assert_eq!(
            (cache.entry_count(), sink.persisted.load(Ordering::SeqCst)),
            (2, 2)
        );
    }

    #[tokio::test]
    async fn a_removed_entry_is_deleted_from_the_store() {
        let (cache, sink) = counted(1, CacheConfig::default());
        let (r, _) = &tags(1)[0];
        lookup(&cache, r, Scope::Anonymous).await.unwrap();
        let key = CacheKey::tag(&reference(r), Scope::Anonymous);
        cache.remove(&key);
        assert_eq!(cache.get(&key), None);
        assert_eq!(*sink.deleted.lock().unwrap(), [key]);
    }

    #[tokio::test]
    async fn a_selection_resolves_the_highest_matching_tag() {
        let source = fake(&[("registry.example/team/app:1.1.0", "v11")]);
        source.set_tags(["0.9.0", "1.0.0", "1.1.0", "2.0.0"]);
        let (_, cache) = cache(source, CacheConfig::default());
        let selection: VersionSelection =
            serde_json::from_value(serde_json::json!({"semver": {"constraints": ">=1.0.0 <2.0.0"}})).unwrap();
        let repo = reference("registry.example/team/app");
        let key = CacheKey::selection(&repo, &selection, Scope::Anonymous);
        let answer = cache.lookup(key, repo, Some(selection), anonymous).await.unwrap();
        assert_eq!(
            (answer.digest, answer.tag.as_deref()),
            (digest("v11"), Some("1.1.0"))
        );
    }

    #[tokio::test]
    async fn a_refresh_asks_again_and_sees_a_moved_tag() {
        let (source, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        lookup(&cache, APP, Scope::Anonymous).await.unwrap();
        source.set(APP, digest("v2"));
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        assert_eq!(
            lookup(&cache, APP, Scope::Anonymous).await.unwrap().digest,
            digest("v1"),
            "fresh: from memory"
        );
        let refreshed = cache.refresh(&key, anonymous).await.unwrap();
        assert_eq!(
            (refreshed.digest, refreshed.origin),
            (digest("v2"), Origin::Registry)
        );
        assert_eq!(cache.get(&key).unwrap().digest, digest("v2"));
        assert_eq!(source.calls(), 2);
    }

    #[test]
    fn a_loaded_entry_never_replaces_a_newer_one() {
        let (_, cache) = cache(FakeSource::default(), CacheConfig::default());
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        let now = SystemTime::now();
        let entry = |d: &str, at: SystemTime| CacheEntry::resolved(key.clone(), digest(d), at);
        cache.insert(entry("new", now));
        cache.insert(entry("old", now - Duration::from_secs(5)));
        assert_eq!(cache.get(&key).unwrap().digest, digest("new"));
    }

    #[tokio::test]
    async fn answers_carry_the_mirror_record_of_their_digest_only() {
        let (source, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        let mut changes = cache.changes();
        assert_eq!(
            lookup(&cache, APP, Scope::Anonymous).await.unwrap().mirrored,
            None
        );
        assert!(changes.has_changed().unwrap(), "a resolved entry is a change");
        changes.mark_unchanged();

        let record = Mirrored {
            location: format!("cache.example/m/registry.example/team/app@{}", digest("v1")),
            at: SystemTime::now(),
        };
        cache.record_mirrored(&key, record.clone());
        assert!(changes.has_changed().unwrap());
        assert_eq!(
            lookup(&cache, APP, Scope::Anonymous).await.unwrap().mirrored,
            Some(record.clone())
        );

        // The tag moves: the record is of the old digest and is not handed out with the new one.
        source.set(APP, digest("v2"));
        let moved = cache.refresh(&key, anonymous).await.unwrap();
        assert_eq!((moved.digest, moved.mirrored), (digest("v2"), None));
        assert_eq!(cache.mirrored(&key), Some(record.clone()));
        // The old digest's copy is still the record of the entry serving the tag, for every
        // scope the anonymous entry serves.
        let scoped = CacheKey::tag(
            &reference(APP),
            Scope::Secret {
                namespace: "a".into(),
                name: "creds".into(),
            },
        );
        assert_eq!(cache.serving_record(&scoped), Some(record));
    }

    /// Loads `key`'s mirror fields as an object would hold them.
    fn load(
        cache: &DigestCache,
        key: &CacheKey,
        current: Option<&Mirrored>,
        superseded: &[Superseded],
        deleted: Option<&MirrorDeletion>,
    ) {
        cache.load_mirror(
            key.clone(),
            MirrorFields {
                current: current.cloned(),
                superseded: superseded.to_vec(),
                deleted: deleted.cloned(),
            },
        );
    }

    #[test]
    fn a_loaded_mirror_record_never_replaces_a_later_copy() {
        let (_, cache) = cache(FakeSource::default(), CacheConfig::default());
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        let now = SystemTime::now();
        let record = |d: &str, at: SystemTime| Mirrored {
            location: format!("cache.example/x@{}", digest(d)),
            at,
        };
        load(&cache, &key, Some(&record("new", now)), &[], None);
        let changes = cache.changes();
        load(
            &cache,
            &key,
            Some(&record("old", now - Duration::from_secs(5))),
            &[],
            None,
        );
        load(&cache, &key, Some(&record("new", now)), &[], None);
        assert!(!changes.has_changed().unwrap(), "nothing new was loaded");
        assert!(cache.mirrored(&key).unwrap().holds(&digest("new")));
        assert!(!cache.mirrored(&key).unwrap().holds(&digest("old")));
    }

    #[tokio::test]
    async fn a_deleted_copy_is_no_longer_answered_but_a_later_copy_is() {
        let (_, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        let now = SystemTime::now();
        let copy = Mirrored {
            location: format!("cache.example/m/registry.example/team/app@{}", digest("v1")),
            at: now,
        };
        let deletion = |at| MirrorDeletion {
            location: copy.location.clone(),
            at,
        };
        // A replica: a deletion decided before this copy was recorded (an old persisted one)
        // changes nothing, another copy's deletion neither.
        let (_, replica) = self::cache(FakeSource::default(), CacheConfig::default());
        load(&replica, &key, Some(&copy), &[], None);
        load(
            &replica,
            &key,
            Some(&copy),
            &[],
            Some(&deletion(now - Duration::from_secs(1))),
        );
        assert_eq!(replica.mirrored(&key), Some(copy.clone()));
        let other = MirrorDeletion {
            location: "cache.example/m/other@sha256:0".into(),
            at: now,
        };
        load(&replica, &key, Some(&copy), &[], Some(&other));
        assert_eq!(replica.recorded_copies(), [(key.clone(), copy.location.clone())]);
        // Its deletion: gone.
        load(
            &replica,
            &key,
            None,
            &[],
            Some(&deletion(now + Duration::from_secs(1))),
        );
        assert_eq!(replica.mirrored(&key), None);

        // The leader.
        cache.record_mirrored(&key, copy.clone());
        let mut changes = cache.changes();
        changes.mark_unchanged();
        cache.record_mirror_deleted(&key, deletion(now + Duration::from_secs(1)));
        assert!(changes.has_changed().unwrap());
        assert_eq!(cache.mirrored(&key), None);
        assert_eq!(
            lookup(&cache, APP, Scope::Anonymous).await.unwrap().mirrored,
            None,
            "answers stop naming the deleted copy"
        );
        // The object of its earlier write, loaded late, does not bring the copy back.
        load(&cache, &key, Some(&copy), &[], None);
        assert_eq!(cache.mirrored(&key), None, "the leader's own write, echoed late");
        // Copied again later: answered again.
        let again = Mirrored {
            at: now + Duration::from_secs(2),
            ..copy
        };
        cache.record_mirrored(&key, again.clone());
        assert_eq!(
            lookup(&cache, APP, Scope::Anonymous).await.unwrap().mirrored,
            Some(again.clone())
        );
        load(&replica, &key, Some(&again), &[], None);
        assert_eq!(replica.mirrored(&key), Some(again));
    }

    #[tokio::test]
    async fn a_current_copy_deleted_with_its_superseded_one_is_no_longer_answered() {
        // The leader deletes the current copy (v2), then the superseded one (v1), in one pass:
        // the writes merge, so the replica sees only the last (no copy left, `v1` deleted).
        let (_, replica) = cache(fake(&[(APP, "v2")]), CacheConfig::default());
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        let now = SystemTime::now();
        let copy = |d: &str| format!("cache.example/m/registry.example/team/app@{}", digest(d));
        let v2 = Mirrored {
            location: copy("v2"),
            at: now,
        };
        let v1 = Superseded {
            location: copy("v1"),
            since: now,
        };
        load(&replica, &key, Some(&v2), std::slice::from_ref(&v1), None);
        assert_eq!(
            lookup(&replica, APP, Scope::Anonymous).await.unwrap().mirrored,
            Some(v2.clone())
        );
        let deleted = MirrorDeletion {
            location: v1.location,
            at: now + Duration::from_secs(2),
        };
        load(&replica, &key, None, &[], Some(&deleted));
        assert_eq!(replica.mirrored(&key), None);
        assert!(replica.recorded_copies().is_empty());
        assert_eq!(
            lookup(&replica, APP, Scope::Anonymous).await.unwrap().mirrored,
            None,
            "no answer names the deleted current copy"
        );
    }

    #[tokio::test]
    async fn a_moved_tags_old_copy_is_superseded_until_deleted_and_restored_in_its_place() {
        let (_, cache) = cache(fake(&[(APP, "v1")]), CacheConfig::default());
        let key = CacheKey::tag(&reference(APP), Scope::Anonymous);
        let now = SystemTime::now();
        let copy = |d: &str, at| Mirrored {
            location: format!("cache.example/m/registry.example/team/app@{}", digest(d)),
            at,
        };
        let (v1, v2) = (copy("v1", now), copy("v2", now + Duration::from_secs(1)));
        cache.record_mirrored(&key, v1.clone());
        cache.record_mirrored(&key, v2.clone());
        assert_eq!(cache.mirrored(&key), Some(v2.clone()));
        let mut copies = cache.recorded_copies();
        copies.sort();
        assert_eq!(
            copies,
            [
                (key.clone(), v1.location.clone()),
                (key.clone(), v2.location.clone())
            ]
        );

        // A deletion that did not happen puts the old copy back among the superseded ones.
        let deletion = MirrorDeletion {
            location: v1.location.clone(),
            at: now + Duration::from_secs(2),
        };
        cache.record_mirror_deleted(&key, deletion.clone());
        assert_eq!(cache.recorded_copies(), [(key.clone(), v2.location.clone())]);
        cache.restore_mirror_copy(&key, &v1.location, now + Duration::from_secs(3));
        assert_eq!(cache.mirrored(&key), Some(v2.clone()), "still the current copy");
        assert_eq!(cache.recorded_copies().len(), 2);
        // The deletion loaded late (a watch event) does not drop the restored copy.
        load(&cache, &key, Some(&v2), &[], Some(&deletion));
        assert_eq!(cache.recorded_copies().len(), 2);

        // Loaded by another replica: the superseded list beside the record (no duplicates);
        // the tag moving back to v1 makes that copy current again and supersedes v2.
        let (_, replica) = self::cache(FakeSource::default(), CacheConfig::default());
        let superseded = |location: &str, since| Superseded {
            location: location.to_owned(),
            since,
        };
        let old = superseded(&v1.location, now);
        load(&replica, &key, Some(&v2), &[old.clone(), old], None);
        assert_eq!(replica.recorded_copies().len(), 2, "no duplicates");
        let back = copy("v1", now + Duration::from_secs(4));
        load(
            &replica,
            &key,
            Some(&back),
            &[superseded(&v2.location, back.at)],
            None,
        );
        assert_eq!(replica.mirrored(&key), Some(back));
        let mut copies = replica.recorded_copies();
        copies.sort();
        assert_eq!(copies, [(key.clone(), v1.location), (key.clone(), v2.location)]);
    }
}

//! EMULATOR plumbing (test fixture): the pieces of client-go, knative.dev/pkg/controller and
//! controller-runtime that the emulated peers are built from, with the semantics that shape how
//! those peers behave during deletion:
//!
//! - [`Informer`]: a watch-fed cache (client-go's shared informer + lister). Handlers see
//!   add/update(old, new)/delete, after the cache was updated, exactly like
//!   `ResourceEventHandler`s. Reconcilers read from it (listers, controller-runtime's cached
//!   client), so they act on what they have *seen*, not on the latest state.
//! - [`WorkQueue`]: client-go's rate-limiting work queue: a key is queued at most once, never
//!   processed by two workers at once, re-queued if it was added while being processed; failures
//!   are retried with `DefaultControllerRateLimiter` (per-key 5 ms·2^n up to 1000 s, max'ed with
//!   a 10 qps / burst 100 bucket) — used by both knative (kpack) and controller-runtime (Korifi).
//! - [`spawn_controller`]: workers that pop keys and reconcile them: `Ok(Done)` forgets the key's
//!   failures, `Ok(RequeueAfter(d))` forgets and re-adds after `d`, `Err` re-adds rate-limited.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant},
};

use futures::{StreamExt, future::BoxFuture};
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
    runtime::{
        WatchStreamExt,
        watcher::{self, Event},
    },
};
use tokio::{sync::Notify, task::JoinSet};
use tokio_util::sync::CancellationToken;

use super::Scope;

/// `namespace/name` of an object (namespace empty for cluster-scoped objects).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(namespace: &str, name: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    pub fn of(object: &DynamicObject) -> Self {
        Self {
            namespace: object.metadata.namespace.clone().unwrap_or_default(),
            name: object.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What an informer's event handlers are told (client-go `OnAdd`/`OnUpdate`/`OnDelete`).
pub enum Change {
    Added(Arc<DynamicObject>),
    Updated {
        old: Arc<DynamicObject>,
        new: Arc<DynamicObject>,
    },
    Deleted(Arc<DynamicObject>),
}

type Handler = Box<dyn Fn(&Change) + Send + Sync>;

/// A watch-fed cache of one resource across all namespaces, with event handlers.
pub struct Informer {
    api: Api<DynamicObject>,
    kind: String,
    store: RwLock<HashMap<ObjectKey, Arc<DynamicObject>>>,
    handlers: RwLock<Vec<Handler>>,
    synced: tokio::sync::watch::Sender<bool>,
}

impl Informer {
    pub fn new(client: &Client, resource: &ApiResource) -> Arc<Self> {
        Arc::new(Self {
            api: Api::all_with(client.clone(), resource),
            kind: resource.kind.clone(),
            store: RwLock::default(),
            handlers: RwLock::default(),
            synced: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Registers an event handler; register before [`Informer::run`] to see the initial list.
    pub fn on_change(&self, handler: impl Fn(&Change) + Send + Sync + 'static) {
        self.handlers
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(handler));
    }

    /// The cached object (a lister `Get`).
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<DynamicObject>> {
        self.store
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .cloned()
    }

    /// Cached objects in `namespace` (all namespaces when empty) that satisfy `filter`.
    pub fn list(&self, namespace: &str, filter: impl Fn(&DynamicObject) -> bool) -> Vec<Arc<DynamicObject>> {
        self.store
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(k, o)| (namespace.is_empty() || k.namespace == namespace) && filter(o))
            .map(|(_, o)| o.clone())
            .collect()
    }

    /// Resolves once the initial list has been cached (`WaitForCacheSync`).
    pub async fn synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|synced| *synced).await;
    }

    /// Lists and watches until cancelled, re-listing (with backoff) after watch errors.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        let stream = watcher::watcher(self.api.clone(), watcher::Config::default()).default_backoff();
        futures::pin_mut!(stream);
        let mut relisted: Option<HashSet<ObjectKey>> = None;
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => return,
                event = stream.next() => event,
            };
            match event {
                None => return,
                Some(Err(e)) => {
                    tracing::debug!(kind = %self.kind, error = %e, "emulator watch failed; retrying")
                }
                Some(Ok(Event::Apply(object))) => self.upsert(object),
                Some(Ok(Event::Delete(object))) => self.remove(&ObjectKey::of(&object), Some(object)),
                Some(Ok(Event::Init)) => relisted = Some(HashSet::new()),
                Some(Ok(Event::InitApply(object))) => {
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(ObjectKey::of(&object));
                    }
                    self.upsert(object);
                }
                Some(Ok(Event::InitDone)) => {
                    // A re-list replaces the cache: what was not listed again was deleted meanwhile.
                    if let Some(seen) = relisted.take() {
                        let stale: Vec<ObjectKey> = self
                            .store
                            .read()
                            .unwrap_or_else(PoisonError::into_inner)
                            .keys()
                            .filter(|k| !seen.contains(k))
                            .cloned()
                            .collect();
                        for key in stale {
                            self.remove(&key, None);
                        }
                    }
                    self.synced.send_replace(true);
                }
            }
        }
    }

    fn upsert(&self, object: DynamicObject) {
        let key = ObjectKey::of(&object);
        let new = Arc::new(object);
        let old = self
            .store
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, new.clone());
        self.dispatch(&match old {
            Some(old) => Change::Updated { old, new },
            None => Change::Added(new),
        });
    }

    fn remove(&self, key: &ObjectKey, last_state: Option<DynamicObject>) {
        let cached = self
            .store
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        if let Some(object) = last_state.map(Arc::new).or(cached) {
            self.dispatch(&Change::Deleted(object));
        }
    }

    fn dispatch(&self, change: &Change) {
        for handler in self
            .handlers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            handler(change);
        }
    }
}

/// client-go `workqueue.DefaultControllerRateLimiter()`: the slower of a per-item exponential
/// backoff (5 ms · 2^failures, at most 1000 s) and a 10 qps / burst 100 token bucket.
struct RateLimiter {
    failures: HashMap<ObjectKey, u32>,
    tokens: f64,
    refilled: Instant,
}

impl RateLimiter {
    const BASE: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1000);
    const QPS: f64 = 10.0;
    const BURST: f64 = 100.0;

    fn when(&mut self, key: &ObjectKey) -> Duration {
        let failures = self.failures.entry(key.clone()).or_insert(0);
        let exponential = Self::BASE
            .checked_mul(2u32.saturating_pow(*failures))
            .map_or(Self::MAX, |d| d.min(Self::MAX));
        *failures = failures.saturating_add(1);
        // rate.Limiter.Reserve(): take a token now, wait for the debt to be repaid.
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.refilled).as_secs_f64() * Self::QPS).min(Self::BURST);
        self.refilled = now;
        self.tokens -= 1.0;
        let bucket = if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / Self::QPS)
        };
        exponential.max(bucket)
    }
}

#[derive(Default)]
struct QueueState {
    queue: VecDeque<ObjectKey>,
    dirty: HashSet<ObjectKey>,
    processing: HashSet<ObjectKey>,
}

/// client-go's rate-limiting work queue.
pub struct WorkQueue {
    state: Mutex<QueueState>,
    limiter: Mutex<RateLimiter>,
    notify: Notify,
    cancel: CancellationToken,
}

impl WorkQueue {
    pub fn new(cancel: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            limiter: Mutex::new(RateLimiter {
                failures: HashMap::new(),
                tokens: RateLimiter::BURST,
                refilled: Instant::now(),
            }),
            notify: Notify::new(),
            cancel,
        })
    }

    pub fn add(&self, key: ObjectKey) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !state.dirty.insert(key.clone()) || state.processing.contains(&key) {
            return;
        }
        state.queue.push_back(key);
        drop(state);
        self.notify.notify_one();
    }

    pub fn add_after(self: &Arc<Self>, key: ObjectKey, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = queue.cancel.cancelled() => {}
                _ = tokio::time::sleep(delay) => queue.add(key),
            }
        });
    }

    pub fn add_rate_limited(self: &Arc<Self>, key: ObjectKey) {
        let delay = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .when(&key);
        self.add_after(key, delay);
    }

    pub fn forget(&self, key: &ObjectKey) {
        self.limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .failures
            .remove(key);
    }

    async fn get(&self) -> Option<ObjectKey> {
        loop {
            let notified = self.notify.notified();
            futures::pin_mut!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(key) = state.queue.pop_front() {
                    state.dirty.remove(&key);
                    state.processing.insert(key.clone());
                    if !state.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                _ = notified => {}
            }
        }
    }

    fn done(&self, key: &ObjectKey) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.processing.remove(key);
        if state.dirty.contains(key) {
            state.queue.push_back(key.clone());
            drop(state);
            self.notify.notify_one();
        }
    }
}

/// What a reconcile asks of the queue when it succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Done,
    RequeueAfter(Duration),
}

pub type Reconcile = Arc<dyn Fn(ObjectKey) -> BoxFuture<'static, anyhow::Result<Action>> + Send + Sync>;

/// Decides whether a key's namespace belongs to this emulator instance (see [`Scope`]).
#[derive(Clone)]
pub struct ScopeFilter {
    scope: Scope,
    namespaces: Arc<Informer>,
    api: Api<DynamicObject>,
}

impl ScopeFilter {
    pub fn new(client: &Client, scope: Scope, namespaces: Arc<Informer>) -> Self {
        Self {
            scope,
            namespaces,
            api: Api::all_with(client.clone(), &super::resources::namespace()),
        }
    }

    pub async fn admits(&self, namespace: &str) -> bool {
        let Scope::Labelled { key, value } = &self.scope else {
            return true;
        };
        if namespace.is_empty() {
            return true;
        }
        let matches =
            |ns: &DynamicObject| ns.metadata.labels.as_ref().and_then(|l| l.get(key)) == Some(value);
        match self.namespaces.get(&ObjectKey::new("", namespace)) {
            Some(ns) => matches(&ns),
            // The object's watch event can overtake its namespace's: ask the API server.
            None => matches!(self.api.get_opt(namespace).await, Ok(Some(ns)) if matches(&ns)),
        }
    }
}

/// Starts `workers` workers reconciling keys from `queue` once every informer in `caches` has
/// synced; they stop when the queue's token is cancelled.
pub fn spawn_controller(
    tasks: &mut JoinSet<()>,
    name: &'static str,
    queue: Arc<WorkQueue>,
    workers: usize,
    scope: ScopeFilter,
    caches: Vec<Arc<Informer>>,
    reconcile: Reconcile,
) {
    for _ in 0..workers {
        let (queue, scope, caches, reconcile) =
            (queue.clone(), scope.clone(), caches.clone(), reconcile.clone());
        tasks.spawn(async move {
            for cache in &caches {
                tokio::select! {
                    _ = queue.cancel.cancelled() => return,
                    _ = cache.synced() => {}
                }
            }
            while let Some(key) = queue.get().await {
                let outcome = if scope.admits(&key.namespace).await {
                    reconcile(key.clone()).await
                } else {
                    Ok(Action::Done)
                };
                match outcome {
                    Ok(Action::Done) => queue.forget(&key),
                    Ok(Action::RequeueAfter(delay)) => {
                        queue.forget(&key);
                        queue.add_after(key.clone(), delay);
                    }
                    Err(e) => {
                        tracing::debug!(controller = name, %key, error = format!("{e:#}"), "reconcile failed; retrying with backoff");
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        });
    }
}

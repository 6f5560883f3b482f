//! Stand-ins for the registry behind the digest cache ([`Source`]), for tests (feature
//! `testing`, enabled by the other crates' dev-dependencies only): [`FakeSource`], one fake with
//! every behaviour a test needs, and [`Unreachable`], a registry that must never be asked.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt, future::BoxFuture};
use tokio::sync::{Notify, Semaphore};

use holdfast_registry::{Credentials, Digest, Reference, ResolveError};

use crate::Source;

/// A registry whose tags hold what the test set (by normalised reference; or, [`deriving`],
/// the digest of each reference's own name), with the tag list the test set. Unknown tags, and
/// every lookup while [`fail`] is on, time out. Every digest lookup is counted and recorded,
/// notifies [`started`], then waits for the [`gated`] semaphore, for a [`hang`]ing registry's
/// semaphore and for the [`with_latency`] delay. Every digest it names is served, except those
/// [`withhold`]ing leaves out (a registry, or a proxy before it, naming a digest it cannot serve).
///
/// [`deriving`]: FakeSource::deriving
/// [`fail`]: FakeSource::fail
/// [`started`]: FakeSource::started
/// [`gated`]: FakeSource::gated
/// [`hang`]: FakeSource::hang
/// [`with_latency`]: FakeSource::with_latency
/// [`withhold`]: FakeSource::withhold
#[derive(Default)]
pub struct FakeSource {
    digests: Mutex<HashMap<String, Digest>>,
    tags: Mutex<Vec<String>>,
    derive: bool,
    failing: AtomicBool,
    latency: Duration,
    gate: Option<Arc<Semaphore>>,
    hanging: Mutex<Option<(String, Arc<Semaphore>)>>,
    asked: Mutex<Vec<String>>,
    calls: AtomicUsize,
    withheld: Mutex<HashSet<Digest>>,
    confirmations: AtomicUsize,
    started: Arc<Notify>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeSource {
    /// A registry holding `digests` (reference as written, digest).
    pub fn with<R: AsRef<str>>(digests: impl IntoIterator<Item = (R, Digest)>) -> Self {
        let source = Self::default();
        for (reference, digest) in digests {
            source.set(reference.as_ref(), digest);
        }
        source
    }

    /// A registry where every tag holds the digest of its normalised reference.
    pub fn deriving() -> Self {
        Self {
            derive: true,
            ..Self::default()
        }
    }

    /// `reference` holds `digest` from now on.
    pub fn set(&self, reference: &str, digest: Digest) {
        let key = Reference::parse(reference).map_or_else(|_| reference.to_owned(), |r| r.normalized());
        lock(&self.digests).insert(key, digest);
    }

    /// Every repository lists `tags` from now on.
    pub fn set_tags<S: Into<String>>(&self, tags: impl IntoIterator<Item = S>) {
        *lock(&self.tags) = tags.into_iter().map(Into::into).collect();
    }

    /// With `failing`, every lookup times out.
    pub fn fail(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Digest lookups wait for a permit of the returned semaphore (none at first).
    pub fn gated(self) -> (Self, Arc<Semaphore>) {
        let gate = Arc::new(Semaphore::new(0));
        (
            Self {
                gate: Some(gate.clone()),
                ..self
            },
            gate,
        )
    }

    /// Each digest lookup takes `latency`.
    pub fn with_latency(self, latency: Duration) -> Self {
        Self { latency, ..self }
    }

    /// Lookups of `registry`'s references wait for permits of the returned semaphore.
    pub fn hang(&self, registry: &str) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        *lock(&self.hanging) = Some((registry.to_owned(), gate.clone()));
        gate
    }

    /// The normalised references of every digest lookup so far, sorted.
    pub fn asked(&self) -> Vec<String> {
        let mut asked = lock(&self.asked).clone();
        asked.sort();
        asked
    }

    /// Digest lookups so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// From now on `digest` is named for its tags but not served (or, with `withheld` false,
    /// served again).
    pub fn withhold(&self, digest: &Digest, withheld: bool) {
        let mut set = lock(&self.withheld);
        if withheld {
            set.insert(digest.clone());
        } else {
            set.remove(digest);
        }
    }

    /// Confirmations that a digest is served, so far.
    pub fn confirmations(&self) -> usize {
        self.confirmations.load(Ordering::SeqCst)
    }

    /// Notified as each digest lookup starts.
    pub fn started(&self) -> Arc<Notify> {
        self.started.clone()
    }

    fn timeout(reference: &Reference) -> ResolveError {
        ResolveError::Timeout {
            registry: reference.registry().to_owned(),
            repository: reference.repository(),
            after: Duration::from_secs(3),
        }
    }
}

impl Source for FakeSource {
    fn digest<'a>(
        &'a self,
        reference: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Digest, ResolveError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        lock(&self.asked).push(reference.normalized());
        self.started.notify_one();
        let hanging = lock(&self.hanging)
            .clone()
            .filter(|(registry, _)| registry == reference.registry())
            .map(|(_, gate)| gate);
        async move {
            if let Some(gate) = &self.gate {
                let _open = gate.acquire().await;
            }
            if let Some(gate) = hanging {
                let _open = gate.acquire().await;
            }
            if !self.latency.is_zero() {
                tokio::time::sleep(self.latency).await;
            }
            if self.failing.load(Ordering::SeqCst) {
                return Err(Self::timeout(reference));
            }
            if self.derive {
                return Ok(Digest::sha256_of(reference.normalized().as_bytes()));
            }
            lock(&self.digests)
                .get(&reference.normalized())
                .cloned()
                .ok_or_else(|| Self::timeout(reference))
        }
        .boxed()
    }

    fn tags<'a>(
        &'a self,
        repository: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Vec<String>, ResolveError>> {
        let answer = if self.failing.load(Ordering::SeqCst) {
            Err(Self::timeout(repository))
        } else {
            Ok(lock(&self.tags).clone())
        };
        futures::future::ready(answer).boxed()
    }

    fn confirm<'a>(
        &'a self,
        reference: &'a Reference,
        digest: &'a Digest,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<(), ResolveError>> {
        self.confirmations.fetch_add(1, Ordering::SeqCst);
        let answer = if self.failing.load(Ordering::SeqCst) {
            Err(Self::timeout(reference))
        } else if lock(&self.withheld).contains(digest) {
            Err(ResolveError::DigestNotServed {
                registry: reference.registry().to_owned(),
                repository: reference.repository(),
                tag: reference.identifier().to_owned(),
                digest: digest.as_str().to_owned(),
            })
        } else {
            Ok(())
        };
        futures::future::ready(answer).boxed()
    }
}

/// A registry that must never be asked: any lookup panics (the test fails).
pub struct Unreachable;

impl Source for Unreachable {
    fn digest<'a>(
        &'a self,
        reference: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Digest, ResolveError>> {
        panic!("the registry was asked for {reference}")
    }

    fn tags<'a>(
        &'a self,
        repository: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Vec<String>, ResolveError>> {
        panic!("the registry was asked for the tags of {repository}")
    }

    fn confirm<'a>(
        &'a self,
        reference: &'a Reference,
        digest: &'a Digest,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<(), ResolveError>> {
        panic!("the registry was asked whether it serves {reference}@{digest}")
    }
}

//! A leader's term: everything that writes, built when this replica starts to lead (and again
//! when a peer's API it did not find is installed) and dropped when the term ends.
//! [`Term::start`] is its one constructor — the pinner (from `pinner`, the one place the
//! controller makes one, for the term and for the reconcilers' tests), the watches of the
//! pinned kinds, the reconcile trigger the mirror pulls — and its loops are methods:
//! [`Term::run`] runs them all, as the binary does; the e2e harness and the benchmarks start the
//! same term and run the loops they test.

use std::{sync::Arc, time::Duration};

use holdfast_cache::{
    CacheConfig, DigestCache,
    cluster_store::{self, ClusterSink},
};
use holdfast_peers::Served;
use holdfast_pins::{PinnedKind, Pinner, resolve::SecretSource};
use holdfast_registry::{Resolver, ResolverConfig};
use kube::{Client, api::GroupVersionKind};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    entry_status::EntryStatus,
    finalizer,
    metrics::Metrics,
    mirror::{Mirror, MirrorSettings},
    pinning,
    publisher::Publisher,
    refresher::{self, Refresher},
    watched::Watched,
};

/// What a term is run with (the controller's flags, less the election's).
#[derive(Debug, Clone)]
pub struct TermSettings {
    /// holdfast's namespace: the digest cache's objects.
    pub namespace: String,
    /// Between refresh rounds (jittered by up to a tenth).
    pub refresh: Duration,
    /// Read the Secret an object's `secretRef` names.
    pub read_secrets: bool,
    /// How long a digest cache entry no object names is kept before it is deleted.
    pub cache_gc_grace: Duration,
    /// The fast finalizer's opt-in deletions.
    pub finalizer: finalizer::Options,
    /// The registry client's settings (the mirror copier builds its own from them).
    pub resolver: ResolverConfig,
    /// Publish the digest cache as the pinning policies' parameters.
    pub publish_pins: bool,
}

/// The digest cache shared by every term of this process, followed from `namespace`'s
/// `DigestCacheEntry` objects until `cancel`; its writes stop with `writes` (the leader's).
/// The receiver turns true once the entries are loaded.
pub fn follow_cache(
    client: &Client,
    namespace: &str,
    resolver: ResolverConfig,
    cache: CacheConfig,
    writes: CancellationToken,
    cancel: &CancellationToken,
) -> Result<(Arc<DigestCache>, watch::Receiver<bool>), holdfast_registry::ResolverBuildError> {
    let entries = cluster_store::api(client.clone(), namespace);
    let sink = ClusterSink::start(entries.clone(), writes);
    let cache = Arc::new(DigestCache::new(
        Arc::new(Resolver::new(resolver)?),
        cache,
        Some(sink),
    ));
    let synced = cluster_store::follow(entries, cache.clone(), cancel.clone());
    Ok((cache, synced))
}

/// The controller's pinner over `cache`: reading Secrets through `secrets` when given, pinning
/// to the mirror's copies and waiting for them when `mirror` is set. The one place the
/// controller builds a pinner: [`Term::start`]'s, and the reconcilers' tests' (with their own
/// stand-ins for the Secrets and the registry).
pub(crate) fn pinner(
    cache: Arc<DigestCache>,
    secrets: Option<Arc<dyn SecretSource>>,
    mirror: Option<&MirrorSettings>,
) -> Pinner {
    let pinner = Pinner::new(cache, secrets).with_mirror(mirror.map(MirrorSettings::pins));
    match mirror {
        Some(mirror) => pinner.with_copying(Arc::new(mirror.copying())),
        None => pinner,
    }
}

pub struct Term {
    client: Client,
    settings: TermSettings,
    pinner: Arc<Pinner>,
    /// The peers' kinds served as the term started.
    served: Served,
    watched: Arc<Watched>,
    mirror: Option<MirrorSettings>,
    metrics: Arc<Metrics>,
    /// Bumped by the mirror after each copy: every object reconciled.
    reconcile_all: watch::Sender<u64>,
    leading: CancellationToken,
}

impl Term {
    /// The term of a leader that starts now with `cache`: the pinner over it (reading Secrets
    /// when `settings` say so; pinning to the mirror's copies and waiting for them when
    /// `mirror` is set), and the watches of every pinned kind the cluster serves, until
    /// `leading` is cancelled. The kinds it does not serve are [`Term::missing_kinds`].
    pub async fn start(
        client: Client,
        cache: Arc<DigestCache>,
        settings: TermSettings,
        mirror: Option<MirrorSettings>,
        metrics: Arc<Metrics>,
        leading: CancellationToken,
    ) -> Self {
        let secrets = settings
            .read_secrets
            .then(|| Arc::new(client.clone()) as Arc<dyn SecretSource>);
        let pinner = pinner(cache, secrets, mirror.as_ref());
        let kinds = PinnedKind::ALL
            .map(PinnedKind::gvk)
            .into_iter()
            .chain(finalizer::kinds(settings.finalizer));
        let served = Served::discover(&client, kinds, "the controller leaves this kind alone").await;
        metrics.peer_apis(&served);
        let watched = Arc::new(Watched::start(
            &client,
            pinning::served_kinds(&served),
            &metrics,
            &leading,
        ));
        Self {
            client,
            settings,
            pinner: Arc::new(pinner),
            served,
            watched,
            mirror,
            metrics,
            reconcile_all: watch::channel(0).0,
            leading,
        }
    }

    /// Every loop of the term, until it ends.
    pub async fn run(self) {
        let mut refresher = self.refresher();
        let mut status = self.entry_status();
        tokio::join!(
            refresher::run(
                &mut refresher,
                &mut status,
                &self.pinner,
                self.settings.refresh,
                self.leading.clone()
            ),
            self.pinning(),
            self.finalizer(),
            self.mirror(),
            self.publishing(),
        );
    }

    /// The publisher's passes, when the settings say to publish.
    async fn publishing(&self) {
        if self.settings.publish_pins {
            self.publisher().run(self.leading.clone()).await;
        }
    }

    /// The publisher of the pinning policies' parameters for this term, its passes to be run
    /// (by [`Term::run`], or by a test).
    pub fn publisher(&self) -> Publisher {
        Publisher::start(
            &self.client,
            &self.settings.namespace,
            self.pinner.cache().clone(),
            self.watched.clone(),
            self.mirror.is_some(),
            &self.leading,
        )
    }

    /// The pinning reconcilers of every pinned kind (catch-up and `follow` re-pins).
    pub async fn pinning(&self) {
        pinning::run(
            self.client.clone(),
            self.settings.namespace.clone(),
            self.pinner.clone(),
            self.watched.clone(),
            self.reconcile_all.subscribe(),
            self.metrics.clone(),
            self.leading.clone(),
        )
        .await;
    }

    /// The fast finalizer (nothing without kpack).
    pub async fn finalizer(&self) {
        finalizer::run(
            self.client.clone(),
            self.served.clone(),
            self.settings.finalizer,
            self.metrics.clone(),
            self.leading.clone(),
        )
        .await;
    }

    /// The mirror copier and its retention (nothing without a mirror).
    pub async fn mirror(&self) {
        let Some(settings) = self.mirror.clone() else {
            return;
        };
        Mirror {
            client: self.client.clone(),
            namespace: self.settings.namespace.clone(),
            pinner: self.pinner.clone(),
            watched: self.watched.clone(),
            settings,
            resolver: self.settings.resolver.clone(),
            reconcile: self.reconcile_all.clone(),
            metrics: self.metrics.clone(),
        }
        .run(self.leading.clone())
        .await;
    }

    /// The refresher of this term, its rounds to be run with [`Term::pinner`] (on the
    /// interval by [`Term::run`], or one at a time by a test).
    pub fn refresher(&self) -> Refresher {
        Refresher::new(
            self.watched.clone(),
            self.pinner.cache(),
            self.settings.cache_gc_grace,
        )
        .with_metrics(self.metrics.clone())
    }

    /// The writer of the entries' status for this term, its passes to be run with
    /// [`Term::refresher`] (by [`Term::run`] between rounds, or by a test).
    pub fn entry_status(&self) -> EntryStatus {
        EntryStatus::start(
            &self.client,
            &self.settings.namespace,
            self.pinner.cache(),
            &self.watched,
            &self.leading,
        )
    }

    pub fn pinner(&self) -> &Arc<Pinner> {
        &self.pinner
    }

    /// The peers' kinds this term would follow or finalize and the cluster did not serve as it
    /// started: when one is installed, a new term is due ([`crate::run`]).
    pub fn missing_kinds(&self) -> Vec<GroupVersionKind> {
        self.served.missing()
    }
}

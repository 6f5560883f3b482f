//! The whole controller as `holdfast-controller` runs it: the shared digest cache followed from
//! holdfast's namespace, then, while this replica holds the Lease, the watches of the pinned
//! kinds and, reading them, the refresher, the pinning reconcilers, the fast finalizer and (when
//! a mirror is configured) the mirror copier. The binary and the e2e suites run this same
//! function.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use holdfast_pins::Pinner;
use holdfast_registry::{
    Resolver, ResolverConfig,
    cache::{CacheConfig, DigestCache},
    cluster_store::{self, ClusterSink},
};
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::{
    admin::Health,
    leader::{self, Election},
    metrics::Metrics,
    mirror::MirrorSettings,
    watched::Watched,
};

#[derive(Debug, Clone)]
pub struct Settings {
    /// holdfast's namespace: the digest cache and the Lease.
    pub namespace: String,
    /// Between refresh rounds (jittered by up to a tenth).
    pub refresh: Duration,
    /// The Lease the replicas compete for, and this replica's name in it.
    pub lease: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
    /// The leader stops when no renewal succeeded for this long (under `lease_duration`).
    pub renew_deadline: Duration,
    /// Read the Secret an object's `secretRef` names.
    pub read_secrets: bool,
    /// How long a digest cache entry no object names is kept before it is deleted.
    pub cache_gc_grace: Duration,
    /// The fast finalizer's opt-in deletions.
    pub finalizer: crate::finalizer::Options,
    pub resolver: ResolverConfig,
    pub cache: CacheConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the registry client: {0}")]
    Resolver(String),
    #[error("leader election: {0}")]
    Election(#[from] leader::Error),
}

/// Runs until `cancel` (then hands the Lease back) or until leadership is lost.
pub async fn run(client: Client, settings: Settings, cancel: CancellationToken) -> Result<(), Error> {
    run_with_mirror(client, settings, None, cancel).await
}

/// [`run`], copying pinned content into `mirror` (none: mirroring off) and pinning to the copies.
pub async fn run_with_mirror(
    client: Client,
    settings: Settings,
    mirror: Option<MirrorSettings>,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let (metrics, health) = Default::default();
    run_observed(client, settings, mirror, metrics, health, cancel).await
}

/// [`run_with_mirror`], recording into `metrics` and keeping `health` current (what the admin
/// port serves, [`crate::admin`]).
pub async fn run_observed(
    client: Client,
    settings: Settings,
    mirror: Option<MirrorSettings>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    cancel: CancellationToken,
) -> Result<(), Error> {
    let resolver_config = settings.resolver.clone();
    let resolver = Resolver::new(settings.resolver).map_err(|e| Error::Resolver(e.to_string()))?;
    let entries = cluster_store::api(client.clone(), &settings.namespace);
    // The digest cache's writes are the leader's too: they stop, in flight, when its term ends.
    let cache_writes = cancel.child_token();
    let sink = ClusterSink::start(entries.clone(), cache_writes.clone());
    let cache = Arc::new(DigestCache::new(Arc::new(resolver), settings.cache, Some(sink)));
    metrics.follow_cache(cache.clone());
    let mut synced = cluster_store::follow(entries, cache.clone(), cancel.clone());
    tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        _ = synced.wait_for(|s| *s) => {}
    }
    health.cache_synced.store(true, Ordering::Release);
    let secrets = settings
        .read_secrets
        .then(|| Arc::new(client.clone()) as Arc<dyn holdfast_pins::resolve::SecretSource>);
    let mut pinner =
        Pinner::new(cache.clone(), secrets).with_mirror(mirror.as_ref().map(MirrorSettings::pins));
    if let Some(mirror) = &mirror {
        pinner = pinner.with_copying(Arc::new(mirror.copying()));
    }
    let pinner = Arc::new(pinner);

    let (interval, namespace, work_client) = (settings.refresh, settings.namespace.clone(), client.clone());
    let (gc_grace, finalizer_options) = (settings.cache_gc_grace, settings.finalizer);
    let work_metrics = metrics.clone();
    // Everything that writes runs only on the leader.
    let work = move |leading: CancellationToken| async move {
        // Dropped with the work, however it ends (a lost Lease aborts it).
        let _cache_writes = cache_writes.drop_guard();
        let (reconcile_all_tx, reconcile_all) = tokio::sync::watch::channel(0);
        let kinds = crate::pinning::installed_kinds(&work_client).await;
        let watched = Arc::new(Watched::start(&work_client, kinds, &leading));
        // A completed copy has every object reconciled (a refresh round only those it concerns).
        let copies = {
            let (client, namespace, pinner, mirror, watched) = (
                work_client.clone(),
                namespace.clone(),
                pinner.clone(),
                mirror.clone(),
                watched.clone(),
            );
            let (resolver, reconcile, leading, metrics) = (
                resolver_config.clone(),
                reconcile_all_tx,
                leading.clone(),
                work_metrics.clone(),
            );
            async move {
                if let Some(mirror) = mirror {
                    crate::mirror::Mirror {
                        client,
                        namespace,
                        pinner,
                        watched,
                        settings: mirror,
                        resolver,
                        reconcile,
                        metrics,
                    }
                    .run(leading)
                    .await;
                }
            }
        };
        let refresher = {
            let (watched, pinner, leading, metrics) = (
                watched.clone(),
                pinner.clone(),
                leading.clone(),
                work_metrics.clone(),
            );
            async move {
                let mut refresher =
                    crate::refresher::Refresher::new(watched, pinner.cache(), gc_grace).with_metrics(metrics);
                crate::refresher::run(&mut refresher, &pinner, interval, leading).await
            }
        };
        let pinning = crate::pinning::run(
            work_client.clone(),
            namespace,
            pinner,
            watched,
            reconcile_all,
            work_metrics.clone(),
            leading.clone(),
        );
        let finalizer = crate::finalizer::run(work_client, finalizer_options, work_metrics, leading);
        tokio::join!(refresher, pinning, finalizer, copies);
    };
    let election = Election {
        namespace: settings.namespace,
        lease: settings.lease,
        identity: settings.identity,
        duration: settings.lease_duration,
        renew_every: settings.renew_every,
        renew_deadline: settings.renew_deadline,
    };
    election
        .lead_reporting(client, cancel, &health.election, work)
        .await?;
    Ok(())
}

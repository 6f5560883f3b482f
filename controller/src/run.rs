//! The whole controller as `holdfast-controller` runs it: the shared digest cache followed from
//! holdfast's namespace, then, while this replica holds the Lease, a [`Term`] with every loop
//! (the watches of the pinned kinds and, reading them, the refresher, the pinning reconcilers,
//! the fast finalizer and, when a mirror is configured, the mirror copier). The binary and the
//! e2e suites run this same function.

use std::sync::{Arc, atomic::Ordering};

use holdfast_cache::CacheConfig;
use holdfast_registry::ResolverConfig;
use kube::Client;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::{
    admin::Health,
    leader::{self, Election},
    metrics::Metrics,
    mirror::MirrorSettings,
    term::{Term, TermSettings, follow_cache},
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
    /// Publish the digest cache as the pinning policies' parameters (`--publish-pins`).
    pub publish_pins: bool,
    /// How often the peers' kinds a term did not find are looked for again
    /// ([`holdfast_peers::LOOK_AGAIN_EVERY`]).
    pub look_again_every: Duration,
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
    // The digest cache's writes are the leader's too: they stop, in flight, when its term ends.
    let cache_writes = cancel.child_token();
    let (cache, mut synced) = follow_cache(
        &client,
        &settings.namespace,
        settings.resolver.clone(),
        settings.cache.clone(),
        cache_writes.clone(),
        &cancel,
    )
    .map_err(|e| Error::Resolver(e.to_string()))?;
    metrics.follow_cache(cache.clone());
    tokio::select! {
        _ = cancel.cancelled() => return Ok(()),
        _ = synced.wait_for(|s| *s) => {}
    }
    health.cache_synced.store(true, Ordering::Release);
    let (term_client, term_settings) = (client.clone(), settings.term());
    let look_again = settings.look_again_every;
    // Everything that writes runs only on the leader; the writes stop with the term, however
    // it ends (a lost Lease aborts it). A term follows the peers' kinds served as it starts;
    // when one it did not find is installed (Korifi after holdfast), the term winds down and
    // the next one follows that kind too.
    let work = move |leading: CancellationToken| async move {
        let _cache_writes = cache_writes.drop_guard();
        loop {
            let this_term = leading.child_token();
            let term = Term::start(
                term_client.clone(),
                cache.clone(),
                term_settings.clone(),
                mirror.clone(),
                metrics.clone(),
                this_term.clone(),
            )
            .await;
            let missing = term.missing_kinds();
            let run = term.run();
            tokio::pin!(run);
            tokio::select! {
                () = &mut run => return,
                _ = holdfast_peers::installed(&term_client, &missing, look_again) => {
                    tracing::info!("a new term follows the APIs installed");
                    this_term.cancel();
                    run.await;
                }
            }
        }
    };
    settings
        .election()
        .lead_reporting(client, cancel, &health.election, work)
        .await?;
    Ok(())
}

impl Settings {
    /// What each term runs with.
    pub fn term(&self) -> TermSettings {
        TermSettings {
            namespace: self.namespace.clone(),
            refresh: self.refresh,
            read_secrets: self.read_secrets,
            cache_gc_grace: self.cache_gc_grace,
            finalizer: self.finalizer,
            resolver: self.resolver.clone(),
            publish_pins: self.publish_pins,
        }
    }

    fn election(&self) -> Election {
        Election {
            namespace: self.namespace.clone(),
            lease: self.lease.clone(),
            identity: self.identity.clone(),
            duration: self.lease_duration,
            renew_every: self.renew_every,
            renew_deadline: self.renew_deadline,
        }
    }
}

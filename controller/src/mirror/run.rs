//! The mirror's task: reads the cache and the reference index, plans with [`MirrorState`],
//! starts the copies and deletions the plan names, and reports what they did (Events, metrics,
//! records, a reconcile). The `select!` over cancellation, changes and joins is all it decides.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use holdfast_cache::{DigestCache, Mirrored, Scope};
use holdfast_pins::{
    Pinner,
    mirror_scope::Copying,
    resolve::{SecretSource, load_credentials},
};
use holdfast_registry::{
    Credentials, Resolver, ResolverConfig,
    mirror::{Copier, CopierConfig, CopyError, CopyReport, MirrorLocation},
};
use kube::{Client, runtime::events::EventType};
use tokio::{sync::watch, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use super::{
    CopyJob, MirrorSettings,
    announcer::Announcer,
    copier_resolver_config,
    references::References,
    retention::{self, Expired, Outcome},
    state::{Copied, MirrorState, Plan, Snapshot},
    wanted,
};
use crate::{
    backoff::{FIRST_RETRY, RETRY_CEILING},
    metrics::Metrics,
    watched::Watched,
};

/// The mirror copier of a leader's term: what [`Mirror::run`] needs.
pub struct Mirror {
    pub client: Client,
    /// Holdfast's namespace: the mirror's Secret, the cache entries' Events.
    pub namespace: String,
    /// Its cache, and its [`Copying`], which the mirror keeps up to date.
    pub pinner: Arc<Pinner>,
    pub watched: Arc<Watched>,
    pub settings: MirrorSettings,
    pub resolver: ResolverConfig,
    /// Bumped after each completed copy so that the pinning reconcilers move `follow` pins to
    /// the mirror, and after a copy given up on so that those waiting for it go upstream.
    pub reconcile: watch::Sender<u64>,
    pub metrics: Arc<Metrics>,
}

/// What the loop reports to, besides [`MirrorState`].
struct Reporter {
    cache: Arc<DigestCache>,
    copying: Arc<Copying>,
    announcer: Arc<Announcer>,
    metrics: Arc<Metrics>,
    reconcile: watch::Sender<u64>,
    grace: Duration,
}

impl Mirror {
    /// Copies and deletes until `cancel`.
    pub async fn run(self, cancel: CancellationToken) {
        let Mirror {
            client,
            namespace,
            pinner,
            watched,
            settings,
            resolver,
            reconcile,
            metrics,
        } = self;
        let config = CopierConfig::new(settings.location.clone());
        let resolver = match Resolver::new(copier_resolver_config(
            &resolver,
            settings.concurrency,
            config.blob_concurrency,
        )) {
            Ok(resolver) => resolver,
            Err(error) => {
                tracing::error!(%error, "mirror: cannot build the registry client; not mirroring");
                return;
            }
        };
        let (cache, copying) = (pinner.cache().clone(), pinner.copying().clone());
        let references = Arc::new(References::new(client.clone(), settings.pins(), watched));
        // Copies start from the kinds listed so far. Retention waits until every kind is listed:
        // before that, a copy is not known to be unreferenced (a kind that cannot be listed — an
        // aggregated API down, a forbidden list — keeps deletions off, not copies).
        let (listed_tx, mut listed) = watch::channel(false);
        {
            let references = references.clone();
            tokio::spawn(async move {
                references.ready().await;
                tracing::debug!("mirror: every pinned kind listed; retention's clocks run");
                let _ = listed_tx.send(true);
            });
        }
        let reporter = Reporter {
            cache: cache.clone(),
            copying: copying.clone(),
            announcer: Arc::new(Announcer::new(client.clone(), &namespace, cancel.clone())),
            metrics,
            reconcile,
            grace: settings.retention,
        };
        let mut changes = cache.changes();
        let mut objects = references.changes();
        let mut state = MirrorState::new(&settings);
        let mut work = Work {
            client,
            namespace,
            settings,
            resolver,
            config,
            copier: None,
            cache,
            copying,
            references,
            copies: JoinSet::new(),
            deletions: JoinSet::new(),
        };
        loop {
            let (now, wall) = (Instant::now(), SystemTime::now());
            if *listed.borrow() {
                state.all_listed();
            }
            let snapshot = work.snapshot();
            state.observe(wall, &snapshot);
            let plan = state.plan(now, wall, &snapshot);
            let wake = work.start(plan, &mut state, now, wall).await;
            tokio::select! {
                _ = cancel.cancelled() => {
                    work.copies.abort_all();
                    work.deletions.abort_all();
                    reporter.announcer.close().await;
                    return;
                }
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                // Once: the sender is dropped after sending, and its channel then reads as changed.
                _ = listed.changed(), if !state.is_listed() => {}
                changed = objects.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                Some(done) = work.copies.join_next() => {
                    let Ok((job, result)) = done else { continue };
                    let copied = state.copy_finished(&job.target, result, Instant::now());
                    reporter.copied(&job, copied);
                }
                Some(done) = work.deletions.join_next() => {
                    let Ok((expired, outcome)) = done else { continue };
                    let retry_in = state.deletion_finished(&expired.location, &outcome, Instant::now());
                    reporter.deletion(expired, outcome, retry_in);
                }
                _ = sleep_until(wake) => {}
            }
        }
    }
}

/// The loop's I/O: what it reads for a plan, and the copies and deletions it runs.
struct Work {
    client: Client,
    namespace: String,
    settings: MirrorSettings,
    resolver: Resolver,
    config: CopierConfig,
    /// The copier for the mirror credentials last read, with them.
    copier: Option<(Credentials, Arc<Copier>)>,
    cache: Arc<DigestCache>,
    copying: Arc<Copying>,
    references: Arc<References>,
    copies: JoinSet<(CopyJob, Result<CopyReport, CopyError>)>,
    deletions: JoinSet<(Expired, Outcome)>,
}

impl Work {
    /// What the cache and the reference index say now (and the copies given up on that are
    /// still wanted; the others are forgotten).
    fn snapshot(&self) -> Snapshot {
        let referenced = self.references.in_stores();
        let needed = wanted(
            &self.cache.entries(),
            |key| self.cache.mirrored(key),
            &referenced,
            &self.settings,
        );
        self.copying
            .retain_given_up(|target| needed.iter().any(|job| job.target == target));
        Snapshot {
            given_up: needed
                .iter()
                .filter(|job| self.copying.given_up(&job.target))
                .map(|job| job.target.clone())
                .collect(),
            wanted: needed,
            records: self.cache.recorded_copies(),
            referenced,
        }
    }

    /// Starts what `plan` names; the loop's deadline (the plan's, or later when the mirror's
    /// credentials could not be read and everything planned waits for a retry).
    async fn start(
        &mut self,
        plan: Plan,
        state: &mut MirrorState,
        now: Instant,
        wall: SystemTime,
    ) -> Option<Instant> {
        if plan.copies.is_empty() && plan.deletions.is_empty() {
            return plan.wake_at;
        }
        let current = match current_copier(
            &self.client,
            &self.namespace,
            &self.settings,
            &self.resolver,
            &self.config,
            &mut self.copier,
        )
        .await
        {
            Ok(current) => current,
            Err(error) => {
                for job in plan.copies {
                    let delay = state.retry_copy(&job.target, Instant::now());
                    tracing::warn!(target = %job.target, %error, retry_in = ?delay, "mirror: no credentials for the mirror");
                }
                for expired in plan.deletions {
                    let delay = state.retry_deletion(&expired.location, Instant::now());
                    tracing::warn!(location = %expired.location, %error, retry_in = ?delay, "mirror: no credentials for the mirror");
                }
                return state.wake_at(now, wall);
            }
        };
        for job in plan.copies {
            state.copy_started(&job.target);
            let copier = copier_into(&current, &job.mirror, &self.resolver, &self.config, &self.copier);
            let secrets: Arc<dyn SecretSource> = Arc::new(self.client.clone());
            self.copies.spawn(async move {
                tracing::debug!(source = %job.source, target = %job.target, scope = %job.scope, "mirror: copying");
                // A tenant's Secret is read only to read the source, only here.
                let result = match source_credentials(secrets, &job).await {
                    Ok(credentials) => copier.copy(&job.source, &credentials).await,
                    Err(error) => Err(CopyError::Credentials(error)),
                };
                (job, result)
            });
        }
        for expired in plan.deletions {
            tracing::info!(location = %expired.location, grace = ?self.settings.retention, "mirror: no object references this copy; deleting it");
            state.deletion_started(&expired.location);
            let (copier, cache, references) = (current.clone(), self.cache.clone(), self.references.clone());
            self.deletions.spawn(async move {
                let outcome = retention::delete(&expired, &cache, &references, &copier).await;
                (expired, outcome)
            });
        }
        plan.wake_at
    }
}

impl Reporter {
    fn copied(&self, job: &CopyJob, copied: Copied) {
        match copied {
            Copied::Copied(report) => {
                self.metrics.mirror_copy("copied", report.bytes_copied);
                // Before the record: the record has objects re-pinned, and the pins read this.
                if let Some(colocated) = report.colocated_upstream {
                    self.copying.record_colocated(&job.target, colocated);
                }
                record(&self.cache, job, SystemTime::now());
                tracing::info!(
                    source = %job.source,
                    target = %report.target,
                    manifests_copied = report.manifests_copied,
                    blobs_copied = report.blobs_copied,
                    blobs_present = report.blobs_present,
                    blobs_mounted = report.blobs_mounted,
                    bytes_copied = report.bytes_copied,
                    bundle_images = report.bundle_images,
                    colocated_upstream = ?report.colocated_upstream,
                    "mirror: copied"
                );
                let note = format!(
                    "copied {} to {}: {} manifests and {} blobs ({} bytes) sent, {} blobs mounted, {} already there",
                    job.source,
                    report.target,
                    report.manifests_copied,
                    report.blobs_copied,
                    report.bytes_copied,
                    report.blobs_mounted,
                    report.blobs_present,
                );
                self.announcer
                    .spawn(job.keys.clone(), EventType::Normal, "MirrorCopied", "Copy", note);
                self.reconcile.send_modify(|n| *n = n.wrapping_add(1));
            }
            Copied::GivenUp(error) => {
                self.metrics.mirror_copy("given_up", 0);
                tracing::error!(
                    source = %job.source,
                    target = %job.target,
                    %error,
                    "mirror: copy failed permanently; not retried while the tag holds this digest"
                );
                let note = format!(
                    "{error}; not retried while the entry holds this digest (objects stay pinned upstream)"
                );
                self.copy_failed(job, note);
                self.copying.give_up(&job.target);
                self.reconcile.send_modify(|n| *n = n.wrapping_add(1));
            }
            Copied::Failed { error, retry_in } => {
                self.metrics.mirror_copy("failed", 0);
                tracing::warn!(
                    source = %job.source,
                    target = %job.target,
                    %error,
                    transient = error.is_transient(),
                    retry_in = ?retry_in,
                    "mirror: copy failed"
                );
                if retry_in == FIRST_RETRY {
                    let note = format!("{error}; retrying with backoff (up to every {RETRY_CEILING:?})");
                    self.copy_failed(job, note);
                }
            }
        }
    }

    fn copy_failed(&self, job: &CopyJob, note: String) {
        self.announcer.spawn(
            job.keys.clone(),
            EventType::Warning,
            "MirrorCopyFailed",
            "Copy",
            note,
        );
    }

    fn deletion(&self, expired: Expired, outcome: Outcome, retry_in: Option<Duration>) {
        match outcome {
            Outcome::Deleted(deletion) => {
                self.metrics.mirror_deletion("deleted");
                tracing::info!(location = %expired.location, ?deletion, "mirror: deleted an unreferenced copy");
                let note = format!(
                    "deleted {} from the mirror: no object referenced it for {:?}",
                    expired.location, self.grace
                );
                self.announcer
                    .spawn(expired.keys, EventType::Normal, "MirrorDeleted", "Delete", note);
            }
            Outcome::Referenced => {
                self.metrics.mirror_deletion("kept");
                tracing::info!(location = %expired.location, "mirror: an object references the copy again; kept");
            }
            Outcome::Held { holder } => {
                self.metrics.mirror_deletion("kept");
                // Its records stay dropped: it is part of `holder` now (module docs).
                tracing::info!(location = %expired.location, %holder, "mirror: a copy an object references holds this one (an index's manifest, a bundle's image); kept, no longer timed");
            }
            Outcome::Failed(error) => {
                self.metrics.mirror_deletion("failed");
                tracing::error!(location = %expired.location, %error, retry_in = ?retry_in.unwrap_or_default(), "mirror: could not delete an unreferenced copy; kept");
                if retry_in == Some(FIRST_RETRY) {
                    let note = format!("{error}; kept, retrying with backoff");
                    self.announcer.spawn(
                        expired.keys,
                        EventType::Warning,
                        "MirrorDeleteFailed",
                        "Delete",
                        note,
                    );
                }
            }
        }
    }
}

/// Records the copy on every key of `job` whose entry still holds the copied digest.
fn record(cache: &DigestCache, job: &CopyJob, at: SystemTime) {
    let Some(digest) = job.source.digest() else {
        return;
    };
    for key in &job.keys {
        if cache
            .get(key)
            .is_some_and(|entry| entry.key == *key && entry.digest == *digest)
        {
            cache.record_mirrored(
                key,
                Mirrored {
                    location: job.target.clone(),
                    at,
                },
            );
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The copier into `mirror`: `current` for the public location; for a namespace's private
/// location one of its own with the same mirror credentials (it remembers no blob of another
/// namespace's copies to mount from).
fn copier_into(
    current: &Arc<Copier>,
    mirror: &MirrorLocation,
    resolver: &Resolver,
    config: &CopierConfig,
    held: &Option<(Credentials, Arc<Copier>)>,
) -> Arc<Copier> {
    match held {
        Some((credentials, _)) if current.config().mirror != *mirror => Arc::new(Copier::new(
            resolver.clone(),
            CopierConfig {
                mirror: mirror.clone(),
                ..config.clone()
            },
            credentials.clone(),
        )),
        _ => current.clone(),
    }
}

/// The copier for the mirror's current credentials (rebuilt when the Secret changed).
async fn current_copier(
    client: &Client,
    namespace: &str,
    settings: &MirrorSettings,
    resolver: &Resolver,
    config: &CopierConfig,
    held: &mut Option<(Credentials, Arc<Copier>)>,
) -> Result<Arc<Copier>, holdfast_cache::CacheError> {
    let credentials = match &settings.secret {
        Some(name) => {
            load_credentials(
                Some(Arc::new(client.clone())),
                Scope::Secret {
                    namespace: namespace.to_owned(),
                    name: name.clone(),
                },
            )
            .await?
            .credentials
        }
        None => Credentials::anonymous(),
    };
    if let Some((used, copier)) = held.as_ref()
        && *used == credentials
    {
        return Ok(copier.clone());
    }
    let copier = Arc::new(Copier::new(resolver.clone(), config.clone(), credentials.clone()));
    *held = Some((credentials, copier.clone()));
    Ok(copier)
}

/// The credentials that read `job`'s source: anonymous, or its Secret, only while that Secret
/// is the one that resolved the entry (same uid; an entry recording none gets no Secret).
async fn source_credentials(secrets: Arc<dyn SecretSource>, job: &CopyJob) -> Result<Credentials, String> {
    if matches!(job.scope, Scope::Secret { .. }) && job.secret_uid.is_none() {
        return Err(format!(
            "{}: the entry records no Secret uid; not read",
            job.scope
        ));
    }
    let loaded = load_credentials(Some(secrets), job.scope.clone())
        .await
        .map_err(|e| e.to_string())?;
    if loaded.secret_uid != job.secret_uid {
        return Err(format!(
            "{}: the Secret was replaced since it resolved the entry; not used",
            job.scope
        ));
    }
    Ok(loaded.credentials)
}

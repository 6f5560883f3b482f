//! The mirror copier's reconciler: every digest the cache answers with is copied into the
//! mirror (`holdfast_registry::mirror`), recorded on its cache entry, and then every object is
//! reconciled so that `follow` pins move to the mirror's copy.
//!
//! - **What**: entries of the anonymous scope (public content, into the public location), and
//!   with `--mirror-pull-secret` entries resolved with a `secretRef` (into their namespace's
//!   private location, read with that Secret: `holdfast_pins::mirror_scope`), from the configured
//!   source registries (all when none is listed), not already in the mirror, whose record does
//!   not name this mirror's copy of their current digest, and whose copy an object references
//!   (`crate::references`: pinned to it, or to the same digest upstream), so that what
//!   retention deletes is not copied again, or whose tag moved away from a copy an object
//!   references (`follow` pins wait on the old copy for the new one:
//!   `holdfast_pins::repin::stays_on_mirror`). One copy per mirror location, however many keys
//!   (tags, selections) answer with that digest.
//! - **When**: event-driven: whenever the cache changes (a new entry from the webhook, a moved
//!   tag from the refresher, a record from another replica) or a pinned object changes, and
//!   when a retry or a retention deadline is due.
//! - **How**: at most `concurrency` copies at a time, each in a task of its own, so neither the
//!   pinning reconcilers nor the refresher ever wait for one; a failed copy is retried with a
//!   doubling delay per location (an outage, a rate limit, credentials, anything the mirror
//!   answered), except a permanent failure ([`CopyError::is_permanent`]: the digest is gone
//!   upstream, content that does not match it, a manifest the copier cannot copy), which is
//!   reported once and not tried again while the entry holds that digest (a new leader, or the
//!   copy becoming unwanted and wanted again, tries once more; the pinner learns of it through
//!   the shared [`Copying`], and the objects waiting for that copy are reconciled so they go
//!   upstream); a copy resumes where the last one stopped (the copier skips what the mirror
//!   holds).
//! - **Retention** (`crate::retention`): copies no object references for
//!   `--mirror-retention-seconds` are deleted from the mirror.
//! - **Events** on the cache entries (`kubectl describe hfdigest -n holdfast-system`):
//!   `MirrorCopied`, `MirrorCopyFailed` (the first failure of a streak, and a permanent one),
//!   `MirrorDeleted`, `MirrorDeleteFailed` (the first failure of a streak). The controller has
//!   no metrics endpoint; these and the logs are what it reports.
//! - **Credentials** for the mirror come from a Secret in holdfast's namespace (dockerconfigjson
//!   or username/password, as vendir reads them), read before each batch of copies; without one
//!   the mirror is used anonymously.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use holdfast_pins::{
    MirrorPins, NamespaceSelector, Pinner,
    repin::{Copying, selects},
    resolve::{SecretSource, load_credentials},
};
use holdfast_registry::{
    Credentials, Reference, Resolver, ResolverConfig,
    cache::{CacheEntry, CacheKey, DigestCache, Mirrored, Scope},
    cluster_store,
    mirror::{Copier, CopierConfig, CopyError, CopyReport, MirrorLocation},
};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams},
    runtime::events::{Event, EventType, Recorder},
};
use tokio::{sync::watch, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    backoff::{Backoff, FIRST_RETRY, RETRY_CEILING},
    metrics::Metrics,
    references::References,
    retention::{self, Expired, Outcome, Retention},
    watched::Watched,
};

/// Mirror settings of the controller.
#[derive(Debug, Clone)]
pub struct MirrorSettings {
    pub location: MirrorLocation,
    /// Namespaces whose objects are pinned to the mirror (`--mirror-namespace-selector`).
    pub namespaces: NamespaceSelector,
    /// The mirror pull Secret private pins name (`--mirror-pull-secret`).
    pub pull_secret: Option<String>,
    /// Source registries (`host[:port]`) whose content is mirrored; empty: all.
    pub registries: Vec<String>,
    /// Secret in holdfast's namespace with the mirror's credentials (pull and push).
    pub secret: Option<String>,
    /// Copies running at the same time.
    pub concurrency: usize,
    /// How long a copy no object references stays in the mirror.
    pub retention: Duration,
}

impl MirrorSettings {
    /// The mirror as the pinner sees it.
    pub fn pins(&self) -> MirrorPins {
        MirrorPins {
            location: self.location.clone(),
            namespaces: self.namespaces.clone(),
            pull_secret: self.pull_secret.clone(),
        }
    }

    /// The copier as the pinner sees it, to share between them (`Pinner::with_copying`).
    pub fn copying(&self) -> Copying {
        Copying::new(self.registries.clone())
    }
}

/// One copy to make: `source` (`repo@sha256:…`) to `target` in `mirror`, read with the
/// credentials of `scope`, recorded on every key in `keys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyJob {
    pub source: Reference,
    pub target: String,
    /// The public location, or a namespace's private one (`MirrorPins::location_for`).
    pub mirror: MirrorLocation,
    /// Whose credentials read the source: anonymous, or the `secretRef` Secret of the first key.
    pub scope: Scope,
    /// The uid of that Secret when it resolved the entry: a Secret is read only while it is
    /// the one the controller resolved with (never for an entry that records none).
    pub secret_uid: Option<String>,
    pub keys: Vec<CacheKey>,
}

/// The copies `entries` need: the pure decision of the reconciler. `recorded` gives an entry's
/// mirror record; entries whose record names the mirror's copy of their digest need nothing,
/// nor do those whose copy no object references (`referenced`, see `crate::references`) unless
/// their record names another copy an object references (the tag moved: `follow` pins on the
/// old copy wait for this one).
pub fn wanted(
    entries: &[CacheEntry],
    recorded: impl Fn(&CacheKey) -> Option<Mirrored>,
    referenced: &HashSet<String>,
    settings: &MirrorSettings,
) -> Vec<CopyJob> {
    let mut jobs: BTreeMap<String, CopyJob> = BTreeMap::new();
    let pins = settings.pins();
    for entry in entries {
        let Some(mirror) = pins.location_for(&entry.key.scope) else {
            continue;
        };
        let Ok((target, _)) = entry.key.target() else {
            continue;
        };
        if !selects(&settings.registries, &target) || settings.location.contains(&target) {
            continue;
        }
        let Ok(source) = Reference::parse(&format!("{}@{}", target.name(), entry.digest)) else {
            continue;
        };
        let Ok(location) = mirror.pinned_for(&source, &entry.digest) else {
            continue;
        };
        let record = recorded(&entry.key);
        let waited_for = record
            .as_ref()
            .is_some_and(|m| m.location != location && referenced.contains(&m.location));
        if !(referenced.contains(&location) || waited_for) || record.is_some_and(|m| m.location == location) {
            continue;
        }
        jobs.entry(location.clone())
            .or_insert_with(|| CopyJob {
                source,
                target: location,
                mirror,
                scope: entry.key.scope.clone(),
                secret_uid: entry.secret_uid.clone(),
                keys: Vec::new(),
            })
            .keys
            .push(entry.key.clone());
    }
    jobs.into_values().collect()
}

/// The copier's own registry client: the controller's settings (plain-HTTP hosts, trusted CAs),
/// with enough per-host slots for `concurrency` copies of `blob_concurrency` blobs each, both on
/// the source and on the mirror side (see `holdfast_registry::mirror`).
pub fn copier_resolver_config(
    base: &ResolverConfig,
    concurrency: usize,
    blob_concurrency: usize,
) -> ResolverConfig {
    ResolverConfig {
        max_concurrent_per_host: base
            .max_concurrent_per_host
            .max(2 * blob_concurrency * concurrency.max(1)),
        ..base.clone()
    }
}

/// Copies and deletes until `cancel`, for `pinner` (its cache, and its [`Copying`], which this
/// keeps up to date). `reconcile` is bumped after each completed copy so that the pinning
/// reconcilers move `follow` pins to the mirror, and after a copy given up on so that those
/// waiting for it go upstream.
// Nine: the metrics came last, the shared watch after them. Issue 16's item 1 (the mirror as a struct owning its state)
// makes these its fields.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    client: Client,
    namespace: String,
    pinner: Arc<Pinner>,
    watched: Arc<Watched>,
    settings: MirrorSettings,
    resolver: ResolverConfig,
    reconcile: watch::Sender<u64>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
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
    let announcer = Arc::new(Announcer::new(client.clone(), &namespace));
    let mut copier: Option<(Credentials, Arc<Copier>)> = None;
    let mut changes = cache.changes();
    let mut objects = references.changes();
    let retries: Backoff<String> = Backoff::new(FIRST_RETRY, RETRY_CEILING);
    let mut retry_at: HashMap<String, Instant> = HashMap::new();
    let mut running: HashSet<String> = HashSet::new();
    let mut copies: JoinSet<(CopyJob, Result<CopyReport, CopyError>)> = JoinSet::new();
    let limit = settings.concurrency.max(1);
    let mut retention = Retention::default();
    let delete_retries: Backoff<String> = Backoff::new(FIRST_RETRY, RETRY_CEILING);
    let mut delete_retry_at: HashMap<String, Instant> = HashMap::new();
    let mut deleting: HashSet<String> = HashSet::new();
    let mut deletions: JoinSet<(Expired, Outcome)> = JoinSet::new();
    loop {
        let now = Instant::now();
        let referenced = references.in_stores();
        let needed = wanted(
            &cache.entries(),
            |key| cache.mirrored(key),
            &referenced,
            &settings,
        );
        copying.retain_given_up(|target| needed.iter().any(|job| job.target == target));
        let jobs: Vec<CopyJob> = needed
            .into_iter()
            .filter(|job| {
                !running.contains(&job.target)
                    && !deleting.contains(&job.target)
                    && !copying.given_up(&job.target)
            })
            .filter(|job| retry_at.get(&job.target).is_none_or(|at| *at <= now))
            .take(limit.saturating_sub(running.len()))
            .collect();
        // No clock runs before every kind is listed: a copy is not known to be unreferenced.
        let all_listed = *listed.borrow();
        let expired: Vec<Expired> = if all_listed {
            retention.expired(
                &cache.recorded_copies(),
                &settings.location,
                &referenced,
                SystemTime::now(),
                settings.retention,
                |location| deleting.contains(location),
            )
        } else {
            Vec::new()
        }
        .into_iter()
        .filter(|e| !deleting.contains(&e.location) && !running.contains(&e.location))
        .filter(|e| delete_retry_at.get(&e.location).is_none_or(|at| *at <= now))
        // Each deletion lists every pinned object afresh: as many at a time as copies.
        .take(limit.saturating_sub(deleting.len()))
        .collect();
        if !jobs.is_empty() || !expired.is_empty() {
            match current_copier(&client, &namespace, &settings, &resolver, &config, &mut copier).await {
                Ok(current) => {
                    for job in jobs {
                        running.insert(job.target.clone());
                        let copier = copier_into(&current, &job.mirror, &resolver, &config, &copier);
                        let secrets: Arc<dyn SecretSource> = Arc::new(client.clone());
                        copies.spawn(async move {
                            tracing::debug!(source = %job.source, target = %job.target, scope = %job.scope, "mirror: copying");
                            // A tenant's Secret is read only to read the source, only here.
                            let result = match source_credentials(secrets, &job).await {
                                Ok(credentials) => copier.copy(&job.source, &credentials).await,
                                Err(error) => Err(CopyError::Credentials(error)),
                            };
                            (job, result)
                        });
                    }
                    for expired in expired {
                        tracing::info!(location = %expired.location, grace = ?settings.retention, "mirror: no object references this copy; deleting it");
                        deleting.insert(expired.location.clone());
                        let (copier, cache, references) =
                            (current.clone(), cache.clone(), references.clone());
                        deletions.spawn(async move {
                            let outcome = retention::delete(&expired, &cache, &references, &copier).await;
                            (expired, outcome)
                        });
                    }
                }
                Err(error) => {
                    for job in jobs {
                        let delay = retries.failed(job.target.clone());
                        tracing::warn!(target = %job.target, %error, retry_in = ?delay, "mirror: no credentials for the mirror");
                        retry_at.insert(job.target, Instant::now() + delay);
                    }
                    for expired in expired {
                        let delay = delete_retries.failed(expired.location.clone());
                        tracing::warn!(location = %expired.location, %error, retry_in = ?delay, "mirror: no credentials for the mirror");
                        delete_retry_at.insert(expired.location, Instant::now() + delay);
                    }
                }
            }
        }
        let next_retry = retry_at
            .iter()
            .filter(|(target, _)| !running.contains(*target))
            .chain(
                delete_retry_at
                    .iter()
                    .filter(|(location, _)| !deleting.contains(*location)),
            )
            .map(|(_, at)| *at)
            .min();
        // Copies already handed to a deletion, being copied, waiting for a retry or for a free
        // deletion slot wake the loop through those (a join or `next_retry`), not through their
        // past deadline.
        let next_due = retention
            .next_due(settings.retention, |location| {
                deleting.len() >= limit
                    || deleting.contains(location)
                    || running.contains(location)
                    || delete_retry_at.get(location).is_some_and(|at| *at > now)
            })
            .map(|due| Instant::now() + due.duration_since(SystemTime::now()).unwrap_or_default());
        let wake = next_retry.into_iter().chain(next_due).min();
        tokio::select! {
            _ = cancel.cancelled() => {
                copies.abort_all();
                deletions.abort_all();
                return;
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            // Once: the sender is dropped after sending, and its channel then reads as changed.
            _ = listed.changed(), if !all_listed => {}
            changed = objects.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            Some(done) = copies.join_next() => {
                let Ok((job, result)) = done else { continue };
                running.remove(&job.target);
                match result {
                    Ok(report) => {
                        metrics.mirror_copy("copied", report.bytes_copied);
                        retries.succeeded(&job.target);
                        retry_at.remove(&job.target);
                        record(&cache, &job, SystemTime::now());
                        tracing::info!(
                            source = %job.source,
                            target = %report.target,
                            manifests_copied = report.manifests_copied,
                            blobs_copied = report.blobs_copied,
                            blobs_present = report.blobs_present,
                            blobs_mounted = report.blobs_mounted,
                            bytes_copied = report.bytes_copied,
                            bundle_images = report.bundle_images,
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
                        announcer.spawn(job.keys.clone(), EventType::Normal, "MirrorCopied", "Copy", note);
                        reconcile.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    Err(error) if error.is_permanent() => {
                        metrics.mirror_copy("given_up", 0);
                        retries.succeeded(&job.target);
                        retry_at.remove(&job.target);
                        tracing::error!(
                            source = %job.source,
                            target = %job.target,
                            %error,
                            "mirror: copy failed permanently; not retried while the tag holds this digest"
                        );
                        let note = format!(
                            "{error}; not retried while the entry holds this digest (objects stay pinned upstream)"
                        );
                        announcer.spawn(job.keys.clone(), EventType::Warning, "MirrorCopyFailed", "Copy", note);
                        copying.give_up(&job.target);
                        reconcile.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    Err(error) => {
                        metrics.mirror_copy("failed", 0);
                        let delay = retries.failed(job.target.clone());
                        tracing::warn!(
                            source = %job.source,
                            target = %job.target,
                            %error,
                            transient = error.is_transient(),
                            retry_in = ?delay,
                            "mirror: copy failed"
                        );
                        if delay == FIRST_RETRY {
                            let note = format!("{error}; retrying with backoff (up to every {RETRY_CEILING:?})");
                            announcer.spawn(job.keys.clone(), EventType::Warning, "MirrorCopyFailed", "Copy", note);
                        }
                        retry_at.insert(job.target, Instant::now() + delay);
                    }
                }
            }
            Some(done) = deletions.join_next() => {
                let Ok((expired, outcome)) = done else { continue };
                deleting.remove(&expired.location);
                match outcome {
                    Outcome::Deleted(deletion) => {
                        metrics.mirror_deletion("deleted");
                        retention.forget(&expired.location);
                        delete_retries.succeeded(&expired.location);
                        delete_retry_at.remove(&expired.location);
                        tracing::info!(location = %expired.location, ?deletion, "mirror: deleted an unreferenced copy");
                        let note = format!(
                            "deleted {} from the mirror: no object referenced it for {:?}",
                            expired.location, settings.retention
                        );
                        announcer.spawn(expired.keys, EventType::Normal, "MirrorDeleted", "Delete", note);
                    }
                    Outcome::Referenced => {
                        metrics.mirror_deletion("kept");
                        retention.forget(&expired.location);
                        tracing::info!(location = %expired.location, "mirror: an object references the copy again; kept");
                    }
                    Outcome::Held { holder } => {
                        metrics.mirror_deletion("kept");
                        // Its records stay dropped: it is part of `holder` now (module docs).
                        retention.forget(&expired.location);
                        delete_retries.succeeded(&expired.location);
                        delete_retry_at.remove(&expired.location);
                        tracing::info!(location = %expired.location, %holder, "mirror: a copy an object references holds this one (an index's manifest, a bundle's image); kept, no longer timed");
                    }
                    Outcome::Failed(error) => {
                        metrics.mirror_deletion("failed");
                        let delay = delete_retries.failed(expired.location.clone());
                        tracing::error!(location = %expired.location, %error, retry_in = ?delay, "mirror: could not delete an unreferenced copy; kept");
                        if delay == FIRST_RETRY {
                            let note = format!("{error}; kept, retrying with backoff");
                            announcer.spawn(expired.keys, EventType::Warning, "MirrorDeleteFailed", "Delete", note);
                        }
                        delete_retry_at.insert(expired.location, Instant::now() + delay);
                    }
                }
            }
            _ = sleep_until(wake) => {}
        }
    }
}

/// Records Events on the cache entries a copy or a deletion concerns, in holdfast's namespace.
struct Announcer {
    recorder: Recorder,
    entries: Api<DynamicObject>,
    namespace: String,
}

impl Announcer {
    fn new(client: Client, namespace: &str) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), crate::pinning::MANAGER.into()),
            entries: cluster_store::api(client, namespace),
            namespace: namespace.to_owned(),
        }
    }

    /// Publishes in the background: an Event is a courtesy, never a wait for the copier.
    fn spawn(
        self: &Arc<Self>,
        keys: Vec<CacheKey>,
        type_: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) {
        let this = self.clone();
        tokio::spawn(async move {
            let event = Event {
                type_,
                reason: reason.into(),
                note: Some(crate::pinning::truncate(note)),
                action: action.into(),
                secondary: None,
            };
            for key in keys {
                let reference = this.reference(&key).await;
                if let Err(error) = this.recorder.publish(&event, &reference).await {
                    tracing::warn!(reference = %key.reference, reason, %error, "recording an Event");
                }
            }
        });
    }

    /// The entry's object reference, with its uid when the list finds it (`kubectl describe`
    /// matches Events by uid; the Role has list, not get).
    async fn reference(&self, key: &CacheKey) -> ObjectReference {
        let name = cluster_store::object_name(key);
        let uid = self
            .entries
            .list_metadata(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await
            .ok()
            .and_then(|list| list.items.into_iter().next())
            .and_then(|object| object.metadata.uid);
        ObjectReference {
            api_version: Some("holdfast.dev/v1alpha1".into()),
            kind: Some("DigestCacheEntry".into()),
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            uid,
            ..ObjectReference::default()
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
) -> Result<Arc<Copier>, holdfast_registry::cache::CacheError> {
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

#[cfg(test)]
mod tests {
    use holdfast_registry::{Digest, cache::CacheKey};

    use super::*;

    fn settings(registries: &[&str]) -> MirrorSettings {
        MirrorSettings {
            location: MirrorLocation::new("cache.corp.com:5000", "m").unwrap(),
            namespaces: NamespaceSelector::default(),
            pull_secret: None,
            registries: registries.iter().map(|r| r.to_string()).collect(),
            secret: None,
            concurrency: 2,
            retention: Duration::from_secs(60),
        }
    }

    /// Every location the entries could be copied to, in every mirror the tests use: all
    /// referenced.
    fn referenced(entries: &[CacheEntry]) -> HashSet<String> {
        let mirrors = [
            MirrorLocation::new("cache.corp.com:5000", "m").unwrap(),
            MirrorLocation::new("new-cache.corp.com", "m").unwrap(),
        ];
        entries
            .iter()
            .flat_map(|e| {
                let (target, _) = e.key.target().unwrap();
                mirrors
                    .iter()
                    .filter_map(|m| m.pinned_for(&target, &e.digest).ok())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    fn entry(reference: &str, scope: Scope, seed: &str) -> CacheEntry {
        CacheEntry::resolved(
            CacheKey::tag(&Reference::parse(reference).unwrap(), scope),
            Digest::sha256_of(seed.as_bytes()),
            SystemTime::now(),
        )
    }

    #[test]
    fn public_entries_are_copied_once_per_location() {
        let entries = [
            entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "a"),
            // Another tag of the same content: one copy, recorded on both keys.
            entry("registry.corp.com/team/app:latest", Scope::Anonymous, "a"),
            entry("nginx:1.25", Scope::Anonymous, "n"),
            // A secretRef's content stays upstream.
            entry(
                "registry.corp.com/private/app:1.0",
                Scope::Secret {
                    namespace: "apps".into(),
                    name: "creds".into(),
                },
                "p",
            ),
            // Already in the mirror.
            entry("cache.corp.com:5000/m/x/y:1", Scope::Anonymous, "m"),
        ];
        let jobs = wanted(&entries, |_| None, &referenced(&entries), &settings(&[]));
        let targets: Vec<&str> = jobs.iter().map(|j| j.target.as_str()).collect();
        let a = Digest::sha256_of(b"a");
        let n = Digest::sha256_of(b"n");
        assert_eq!(
            targets,
            [
                format!("cache.corp.com:5000/m/index.docker.io/library/nginx@{n}"),
                format!("cache.corp.com:5000/m/registry.corp.com/team/app@{a}"),
            ]
        );
        assert_eq!(jobs[1].keys.len(), 2);
        assert_eq!(
            jobs[1].source.to_string(),
            format!("registry.corp.com/team/app@{a}")
        );
    }

    #[test]
    fn private_entries_are_copied_with_their_secret_into_their_namespaces_path() {
        let tenant = |namespace: &str| Scope::Secret {
            namespace: namespace.into(),
            name: "creds".into(),
        };
        let entries = [
            entry("registry.corp.com/private/app:1.0", tenant("team-a"), "p"),
            entry("registry.corp.com/private/app:1.0", tenant("team-b"), "p"),
        ];
        let p = Digest::sha256_of(b"p");
        let a_copy = format!("cache.corp.com:5000/m/namespaces/team-a/registry.corp.com/private/app@{p}");
        let pull = MirrorSettings {
            pull_secret: Some("mirror-pull".into()),
            ..settings(&[])
        };
        // Only copies an object references (team-b's is not): one job, team-a's Secret.
        let jobs = wanted(&entries, |_| None, &[a_copy.clone()].into(), &pull);
        assert_eq!(jobs.len(), 1, "{jobs:?}");
        assert_eq!(
            (&jobs[0].target, &jobs[0].scope, jobs[0].mirror.prefix()),
            (&a_copy, &tenant("team-a"), "m/namespaces/team-a")
        );
        assert_eq!(jobs[0].keys, [entries[0].key.clone()]);
        // Without a pull Secret private content is never copied.
        assert!(wanted(&entries, |_| None, &[a_copy].into(), &settings(&[])).is_empty());
    }

    #[test]
    fn only_listed_registries_are_mirrored() {
        let entries = [
            entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "a"),
            entry("nginx:1.25", Scope::Anonymous, "n"),
        ];
        let all = referenced(&entries);
        let jobs = wanted(&entries, |_| None, &all, &settings(&["docker.io"]));
        assert_eq!(jobs.len(), 1);
        assert!(jobs[0].source.is_docker_hub());
        let jobs = wanted(&entries, |_| None, &all, &settings(&["Registry.corp.com"]));
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].source.registry(), "registry.corp.com");
    }

    #[test]
    fn an_entry_recorded_for_its_digest_needs_nothing_and_a_moved_tag_is_copied_again() {
        let entries = [entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "a")];
        let here = settings(&[]);
        let moved = [entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "b")];
        let all: HashSet<String> = referenced(&entries)
            .into_iter()
            .chain(referenced(&moved))
            .collect();
        let jobs = wanted(&entries, |_| None, &all, &here);
        let record = Mirrored {
            location: jobs[0].target.clone(),
            at: SystemTime::now(),
        };
        assert!(wanted(&entries, |_| Some(record.clone()), &all, &here).is_empty());
        assert_eq!(wanted(&moved, |_| Some(record.clone()), &all, &here).len(), 1);
        // A record of another mirror (the configuration changed) is copied again.
        let other = MirrorSettings {
            location: MirrorLocation::new("new-cache.corp.com", "m").unwrap(),
            ..here
        };
        assert_eq!(wanted(&entries, |_| Some(record.clone()), &all, &other).len(), 1);
    }

    #[test]
    fn a_moved_tag_is_copied_for_the_objects_waiting_on_its_old_copy() {
        let old = [entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "a")];
        let moved = [entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "b")];
        let here = settings(&[]);
        let old_copy = wanted(&old, |_| None, &referenced(&old), &here)[0].target.clone();
        let record = Mirrored {
            location: old_copy.clone(),
            at: SystemTime::now(),
        };
        // Nothing names the new digest yet: the follow pins stay on the old copy and wait.
        let jobs = wanted(&moved, |_| Some(record.clone()), &[old_copy].into(), &here);
        assert_eq!(jobs.len(), 1);
        assert!(jobs[0].target.ends_with(moved[0].digest.as_str()), "{jobs:?}");
        // Nobody on the old copy (nor on the new digest): nothing to copy.
        assert!(wanted(&moved, |_| Some(record.clone()), &HashSet::new(), &here).is_empty());
    }

    #[test]
    fn content_no_object_references_is_not_copied() {
        let entries = [
            entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "a"),
            entry("registry.corp.com/team/gone:1.0", Scope::Anonymous, "g"),
        ];
        let only_app: HashSet<String> = referenced(&entries[..1]);
        let jobs = wanted(&entries, |_| None, &only_app, &settings(&[]));
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].keys, [entries[0].key.clone()]);
        assert!(wanted(&entries, |_| None, &HashSet::new(), &settings(&[])).is_empty());
    }

    #[test]
    fn the_copier_gets_slots_for_every_blob_in_flight() {
        let base = ResolverConfig::default();
        assert_eq!(copier_resolver_config(&base, 4, 4).max_concurrent_per_host, 32);
        assert_eq!(
            copier_resolver_config(&base, 1, 1).max_concurrent_per_host,
            base.max_concurrent_per_host
        );
    }
}

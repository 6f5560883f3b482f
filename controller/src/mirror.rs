//! The mirror copier's reconciler: every digest the cache answers with is copied into the
//! mirror (`holdfast_registry::mirror`), recorded on its cache entry, and then every object is
//! reconciled so that `follow` pins move to the mirror's copy.
//!
//! - **What**: entries of the anonymous scope (public content; a `secretRef`'s credentials are
//!   for the upstream registry, so such references stay pinned upstream), from the configured
//!   source registries (all when none is listed), not already in the mirror, whose record does
//!   not name this mirror's copy of their current digest. One copy per mirror location, however
//!   many keys (tags, selections) answer with that digest.
//! - **When**: event-driven: whenever the cache changes (a new entry from the webhook, a moved
//!   tag from the refresher, a record from another replica), and when a retry is due.
//! - **How**: at most `concurrency` copies at a time, each in a task of its own, so neither the
//!   pinning reconcilers nor the refresher ever wait for one; a failed copy is retried with a
//!   doubling delay per location (transient or not: a registry may come back, a manifest may be
//!   fixed upstream under the same tag); a copy resumes where the last one stopped (the copier
//!   skips what the mirror holds).
//! - **Credentials** for the mirror come from a Secret in holdfast's namespace (dockerconfigjson
//!   or username/password, as vendir reads them), read before each batch of copies; without one
//!   the mirror is used anonymously.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use holdfast_pins::{MirrorPins, NamespaceSelector, resolve::load_credentials};
use holdfast_registry::{
    Credentials, Reference, Resolver, ResolverConfig,
    cache::{CacheEntry, CacheKey, DigestCache, Mirrored, Scope},
    mirror::{Copier, CopierConfig, CopyError, CopyReport, MirrorLocation},
};
use kube::Client;
use tokio::{sync::watch, task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::backoff::Backoff;

/// First retry of a failed copy, doubling up to the ceiling.
const FIRST_RETRY: Duration = Duration::from_secs(2);
const RETRY_CEILING: Duration = Duration::from_secs(300);

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
}

/// One copy to make: `source` (`repo@sha256:…`) to `target`, recorded on every key in `keys`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyJob {
    pub source: Reference,
    pub target: String,
    pub keys: Vec<CacheKey>,
}

/// Whether content from `registry` is mirrored under `registries` (empty: every registry).
/// Docker Hub may be listed as `docker.io`, `index.docker.io` or `registry-1.docker.io`.
pub fn selects(registries: &[String], source: &Reference) -> bool {
    const HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
    registries.is_empty()
        || registries.iter().any(|listed| {
            let listed = listed.trim().to_ascii_lowercase();
            listed == source.registry().to_ascii_lowercase()
                || (source.is_docker_hub() && HUB.contains(&listed.as_str()))
        })
}

/// The copies `entries` need: the pure decision of the reconciler. `recorded` gives an entry's
/// mirror record; entries whose record names the mirror's copy of their digest need nothing.
pub fn wanted(
    entries: &[CacheEntry],
    recorded: impl Fn(&CacheKey) -> Option<Mirrored>,
    settings: &MirrorSettings,
) -> Vec<CopyJob> {
    let mut jobs: BTreeMap<String, CopyJob> = BTreeMap::new();
    for entry in entries {
        if entry.key.scope != Scope::Anonymous {
            continue;
        }
        let Ok((target, _)) = entry.key.target() else {
            continue;
        };
        if !selects(&settings.registries, &target) || settings.location.contains(&target) {
            continue;
        }
        let Ok(source) = Reference::parse(&format!("{}@{}", target.name(), entry.digest)) else {
            continue;
        };
        let Ok(location) = settings.location.pinned_for(&source, &entry.digest) else {
            continue;
        };
        if recorded(&entry.key).is_some_and(|m| m.location == location) {
            continue;
        }
        jobs.entry(location.clone())
            .or_insert_with(|| CopyJob {
                source,
                target: location,
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

/// Copies until `cancel`. `reconcile` is bumped after each completed copy so that the pinning
/// reconcilers move `follow` pins to the mirror.
pub async fn run(
    client: Client,
    namespace: String,
    cache: Arc<DigestCache>,
    settings: MirrorSettings,
    resolver: ResolverConfig,
    reconcile: watch::Sender<u64>,
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
    let mut copier: Option<(Credentials, Arc<Copier>)> = None;
    let mut changes = cache.changes();
    let retries: Backoff<String> = Backoff::new(FIRST_RETRY, RETRY_CEILING);
    let mut retry_at: HashMap<String, Instant> = HashMap::new();
    let mut running: HashSet<String> = HashSet::new();
    let mut copies: JoinSet<(CopyJob, Result<CopyReport, CopyError>)> = JoinSet::new();
    let limit = settings.concurrency.max(1);
    loop {
        let now = Instant::now();
        let jobs: Vec<CopyJob> = wanted(&cache.entries(), |key| cache.mirrored(key), &settings)
            .into_iter()
            .filter(|job| !running.contains(&job.target))
            .filter(|job| retry_at.get(&job.target).is_none_or(|at| *at <= now))
            .take(limit.saturating_sub(running.len()))
            .collect();
        if !jobs.is_empty() {
            match current_copier(&client, &namespace, &settings, &resolver, &config, &mut copier).await {
                Ok(current) => {
                    for job in jobs {
                        running.insert(job.target.clone());
                        let copier = current.clone();
                        copies.spawn(async move {
                            tracing::debug!(source = %job.source, target = %job.target, "mirror: copying");
                            let result = copier.copy(&job.source, &Credentials::anonymous()).await;
                            (job, result)
                        });
                    }
                }
                Err(error) => {
                    for job in jobs {
                        let delay = retries.failed(job.target.clone());
                        tracing::warn!(target = %job.target, %error, retry_in = ?delay, "mirror: no credentials for the mirror");
                        retry_at.insert(job.target, Instant::now() + delay);
                    }
                }
            }
        }
        let next_retry = retry_at
            .iter()
            .filter(|(target, _)| !running.contains(*target))
            .map(|(_, at)| *at)
            .min();
        tokio::select! {
            _ = cancel.cancelled() => {
                copies.abort_all();
                return;
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            Some(done) = copies.join_next() => {
                let Ok((job, result)) = done else { continue };
                running.remove(&job.target);
                match result {
                    Ok(report) => {
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
                        reconcile.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    Err(error) => {
                        let delay = retries.failed(job.target.clone());
                        tracing::warn!(
                            source = %job.source,
                            target = %job.target,
                            %error,
                            transient = error.is_transient(),
                            retry_in = ?delay,
                            "mirror: copy failed"
                        );
                        retry_at.insert(job.target, Instant::now() + delay);
                    }
                }
            }
            _ = sleep_until(next_retry) => {}
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
                Some(client.clone()),
                Scope::Secret {
                    namespace: namespace.to_owned(),
                    name: name.clone(),
                },
            )
            .await?
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
        }
    }

    fn entry(reference: &str, scope: Scope, seed: &str) -> CacheEntry {
        let now = SystemTime::now();
        CacheEntry {
            key: CacheKey::tag(&Reference::parse(reference).unwrap(), scope),
            digest: Digest::sha256_of(seed.as_bytes()),
            tag: None,
            resolved_at: now,
            checked_at: now,
            error: None,
        }
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
        let jobs = wanted(&entries, |_| None, &settings(&[]));
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
    fn only_listed_registries_are_mirrored() {
        let entries = [
            entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "a"),
            entry("nginx:1.25", Scope::Anonymous, "n"),
        ];
        let jobs = wanted(&entries, |_| None, &settings(&["docker.io"]));
        assert_eq!(jobs.len(), 1);
        assert!(jobs[0].source.is_docker_hub());
        let jobs = wanted(&entries, |_| None, &settings(&["Registry.corp.com"]));
        assert_eq!(jobs.len(), 1);
        assert_eq!(jobs[0].source.registry(), "registry.corp.com");
    }

    #[test]
    fn an_entry_recorded_for_its_digest_needs_nothing_and_a_moved_tag_is_copied_again() {
        let entries = [entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "a")];
        let here = settings(&[]);
        let jobs = wanted(&entries, |_| None, &here);
        let record = Mirrored {
            location: jobs[0].target.clone(),
            at: SystemTime::now(),
        };
        assert!(wanted(&entries, |_| Some(record.clone()), &here).is_empty());
        let moved = [entry("registry.corp.com/team/app:1.0", Scope::Anonymous, "b")];
        assert_eq!(wanted(&moved, |_| Some(record.clone()), &here).len(), 1);
        // A record of another mirror (the configuration changed) is copied again.
        let other = MirrorSettings {
            location: MirrorLocation::new("new-cache.corp.com", "m").unwrap(),
            ..here
        };
        assert_eq!(wanted(&entries, |_| Some(record.clone()), &other).len(), 1);
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

//! The mirror copier's reconciler: every digest the cache answers with is copied into the
//! mirror (`holdfast_registry::mirror`), recorded on its cache entry, and then every object is
//! reconciled so that `follow` pins move to the mirror's copy.
//!
//! - **What**: entries of the anonymous scope (public content, into the public location), and
//!   with `--mirror-pull-secret` entries resolved with a `secretRef` (into their namespace's
//!   private location, read with that Secret: `holdfast_pins::mirror_scope`), from the configured
//!   source registries (all when none is listed), not already in the mirror, whose record does
//!   not name this mirror's copy of their current digest, and whose copy an object references
//!   (`references`: pinned to it, or to the same digest upstream), so that what
//!   retention deletes is not copied again, or whose tag moved away from a copy an object
//!   references (`follow` pins wait on the old copy for the new one:
//!   `holdfast_pins::mirror_scope::stays_on_mirror`). One copy per mirror location, however many keys
//!   (tags, selections) answer with that digest.
//! - **When**: event-driven: whenever the cache changes (a new entry from the webhook, a moved
//!   tag from the refresher, a record from another replica) or a pinned object changes, and
//!   when a retry or a retention deadline is due.
//! - **How**: at most `concurrency` copies at a time, each in a task of its own, so neither the
//!   pinning reconcilers nor the refresher ever wait for one; a failed copy is retried with a
//!   doubling delay per location (an outage, a rate limit, credentials, anything the mirror
//!   answered), except a permanent failure ([`CopyError::is_permanent`](holdfast_registry::mirror::CopyError::is_permanent): the digest is gone
//!   upstream, content that does not match it, a manifest the copier cannot copy), which is
//!   reported once and not tried again while the entry holds that digest (a new leader, or the
//!   copy becoming unwanted and wanted again, tries once more; the pinner learns of it through
//!   the shared [`Copying`], and the objects waiting for that copy are reconciled so they go
//!   upstream); a copy resumes where the last one stopped (the copier skips what the mirror
//!   holds).
//! - **Retention** (`retention`): copies no object references for
//!   `--mirror-retention-seconds` are deleted from the mirror.
//! - **Events** on the cache entries (`kubectl describe hfdigest -n holdfast-system`):
//!   `MirrorCopied`, `MirrorCopyFailed` (the first failure of a streak, and a permanent one),
//!   `MirrorDeleted`, `MirrorDeleteFailed` (the first failure of a streak); beside them the
//!   logs and the admin port's `holdfast_controller_mirror_*` metrics.
//! - **Credentials** for the mirror come from a Secret in holdfast's namespace (dockerconfigjson
//!   or username/password, as vendir reads them), read before each batch of copies; without one
//!   the mirror is used anonymously.
//! - **Where**: [`MirrorState`] (`state.rs`) owns what the loop remembers (copies and deletions
//!   running, both backoffs, retention's clocks, whether every kind is listed) and plans purely
//!   from a [`Snapshot`]; [`Mirror::run`] (`run.rs`) reads, starts, reports and waits in one
//!   `select!`; `announcer.rs` records the Events.

mod announcer;
pub mod references;
pub mod retention;
mod run;
mod state;

use std::{
    collections::{BTreeMap, HashSet},
    time::Duration,
};

use holdfast_cache::{CacheEntry, CacheKey, Mirrored, Scope};
use holdfast_pins::{
    MirrorPins, NamespaceSelector,
    mirror_scope::{Copying, selects},
};
use holdfast_registry::{Reference, ResolverConfig, mirror::MirrorLocation};

pub use self::{
    run::Mirror,
    state::{Copied, MirrorState, Plan, Snapshot},
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
/// nor do those whose copy no object references (`referenced`, see `references`) unless
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

#[cfg(test)]
mod tests {
    use holdfast_cache::CacheKey;
    use holdfast_registry::Digest;

    use std::time::SystemTime;

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

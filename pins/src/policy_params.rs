//! The digest cache as the parameters of holdfast's MutatingAdmissionPolicies
//! (`manifests/base/policy/`): the API server pins a cached tag itself, and calls the webhook
//! only for what the parameters do not answer.
//!
//! The policy looks up each fetch reference **as written** (the object's string, not its
//! normalised form: CEL parses no references) and writes the value found, so a parameter holds
//! exactly what [`pin_patch`](crate::pin_patch) would write into that field. Pure: what to
//! publish is a function of the objects' written references ([`written_sites`], per object), the
//! cache's entries and the namespaces, at a time ([`desired`]); the controller's publisher
//! writes the result, sharded ([`shards`]).
//!
//! What is published, so that the policy's pin is the webhook's:
//!
//! - only references an object names (in its spec, or as the original of a pin in place): the
//!   webhook pins a new spelling, and the next pass publishes it;
//! - only plain tags (a `tagSelection` needs the registry's tag list: the webhook's);
//! - the entry that serves the reference's cache key (its own scope's, else the anonymous one, as
//!   [`DigestCache::get`]), while it is within the cache's `max_staleness` (as the webhook serves
//!   it stale);
//! - for a source with a `secretRef`: only in that object's namespace's parameters, keyed with the
//!   Secret's name, and only an entry resolved since the namespace was created (the webhook's
//!   [`SecretScoped::ResolvedSince`](crate::SecretScoped)); an object that names a Secret has all
//!   its references published there, so the one parameter object answers all of it;
//! - with a mirror configured, no entry whose digest has a mirror copy (the webhook would pin
//!   the copy in the namespaces the mirror selects);
//! - nothing from namespaces holdfast leaves alone (kube-system, its own, `holdfast.dev/ignore`).

pub mod crd;

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, SystemTime},
};

use holdfast_cache::{CacheKey, DigestCache, Scope};
use holdfast_registry::Reference;
use serde_json::Value;

use crate::{Need, ObjectPlan, PinnedKind, plan, repin};

/// The largest map one parameter object holds, in bytes of its keys and values: a third of
/// etcd's 1.5 MiB object limit, leaving room for the JSON around it and the object's metadata.
pub const MAX_SHARD_BYTES: usize = 512 * 1024;

/// One reference an object names, as the policy would look it up.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WrittenSite {
    pub namespace: String,
    /// The parameter key: the reference as written, after `<secret name> ` when the source
    /// names a `secretRef`.
    pub key: String,
    pub reference: Reference,
    pub scope: Scope,
    /// Whether the object names a `secretRef` anywhere: all its references are then published
    /// in its namespace's parameters.
    pub private_object: bool,
}

/// The references `object` names that the policy could pin: every plain tag, as written now
/// or recorded as the original of a pin in place (`holdfast.dev/original-refs`), whatever its
/// pin policy; nothing for objects opted out or being deleted.
pub fn written_sites(kind: PinnedKind, object: &Value) -> Vec<WrittenSite> {
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let originals = repin::originals(object);
    let plan_of = ObjectPlan::new(kind, &originals, None);
    let private_object = plan_of.sites.iter().any(|site| site.secret_ref.is_some());
    plan_of
        .sites
        .iter()
        .filter_map(|site| {
            let Ok(Need::Tag(reference)) = plan(site) else {
                return None;
            };
            let (key, scope) = match &site.secret_ref {
                Some(secret) => (
                    param_key(Some(secret), &site.reference),
                    Scope::Secret {
                        namespace: namespace.to_owned(),
                        name: secret.clone(),
                    },
                ),
                None => (site.reference.clone(), Scope::Anonymous),
            };
            Some(WrittenSite {
                namespace: namespace.to_owned(),
                key,
                reference,
                scope,
                private_object,
            })
        })
        .collect()
}

/// The key the policy looks `reference` up under: the reference, after `<secret> ` when its
/// source names the Secret `secret` (neither a Secret's name nor a reference has a space).
pub fn param_key(secret: Option<&str>, reference: &str) -> String {
    match secret {
        Some(secret) => format!("{secret} {reference}"),
        None => reference.to_owned(),
    }
}

/// What the publisher knows of a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamespaceState {
    /// Not seen yet: no private pins (the webhook would not serve them either).
    Unknown,
    /// One the webhooks never serve: kube-system, holdfast's own, or labelled
    /// `holdfast.dev/ignore=true`.
    Ignored,
    /// Pinned, created at this time.
    Pinned { created: SystemTime },
}

/// The settings [`desired`] depends on.
#[derive(Debug, Clone, Copy)]
pub struct Publishing {
    /// The cache's `max_staleness`: an entry older is not served, not even stale.
    pub max_staleness: Duration,
    /// Whether the webhook pins to mirror copies (`--mirror-registry`).
    pub mirror: bool,
}

/// The parameters to publish: the cluster-wide map and one map per namespace (absent when
/// empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredPins {
    pub anonymous: BTreeMap<String, String>,
    pub by_namespace: BTreeMap<String, BTreeMap<String, String>>,
}

/// What to publish for `sites` (every object's [`written_sites`]) from `cache` at `now`.
pub fn desired<'a>(
    sites: impl IntoIterator<Item = &'a WrittenSite>,
    cache: &DigestCache,
    namespace: impl Fn(&str) -> NamespaceState,
    publishing: Publishing,
    now: SystemTime,
) -> DesiredPins {
    let mut desired = DesiredPins::default();
    let mut seen = HashSet::new();
    for site in sites {
        if !seen.insert((&site.namespace, &site.key, site.private_object)) {
            continue;
        }
        let state = namespace(&site.namespace);
        if state == NamespaceState::Ignored {
            continue;
        }
        let Some(entry) = cache.get(&CacheKey::tag(&site.reference, site.scope.clone())) else {
            continue;
        };
        let age = now.duration_since(entry.resolved_at).unwrap_or_default();
        if age > publishing.max_staleness
            || publishing.mirror && cache.mirror_of(&entry.key, &entry.digest).is_some()
        {
            continue;
        }
        let pinned = site.reference.pinned(&entry.digest);
        let private = matches!(site.scope, Scope::Secret { .. });
        if !private {
            desired.anonymous.insert(site.key.clone(), pinned.clone());
        }
        if !site.private_object {
            continue;
        }
        // The webhook, which reads no Secret, serves a Secret's entry only if it was resolved
        // since the namespace was created: a namespace re-created under the name gets none.
        let serves = match state {
            NamespaceState::Pinned { created } => !private || entry.resolved_at >= created,
            NamespaceState::Unknown | NamespaceState::Ignored => false,
        };
        if serves {
            desired
                .by_namespace
                .entry(site.namespace.clone())
                .or_default()
                .insert(site.key.clone(), pinned);
        }
    }
    desired
}

/// `pins` in as few maps of at most `max_bytes` (keys and values) as hold it: each key in the
/// map its hash picks, so that a change moves no other key. One (possibly empty) map when it
/// fits in one.
pub fn shards(pins: &BTreeMap<String, String>, max_bytes: usize) -> Vec<BTreeMap<String, String>> {
    let bytes = |key: &String, value: &String| key.len() + value.len();
    let mut count = 1;
    loop {
        let mut maps = vec![BTreeMap::new(); count];
        let mut sizes = vec![0usize; count];
        for (key, value) in pins {
            // usize from u64: on 32-bit targets the modulo below still picks a valid index.
            let index = (fnv1a(key.as_bytes()) % count as u64) as usize;
            sizes[index] += bytes(key, value);
            maps[index].insert(key.clone(), value.clone());
        }
        // One entry larger than the budget fits nowhere: its own map, however many there are.
        if sizes.iter().all(|size| *size <= max_bytes) || count >= pins.len().max(1) {
            return maps;
        }
        count += 1;
    }
}

/// FNV-1a, 64 bits: stable across builds and processes (a shard's keys must not move when the
/// controller restarts).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

//! Retention: a mirror copy that no object references (`super::references`) for the grace
//! period (`--mirror-retention-seconds`) is deleted from the mirror, never while referenced.
//!
//! - **What is known**: the copies recorded on cache entries: each entry's current copy
//!   (`spec.mirror`) and the copies it recorded before its tag moved and the new digest was
//!   copied (`spec.mirrorSuperseded`), so a moved tag's old copy is deleted once its objects
//!   have moved on to the new one.
//! - **The clock** of a copy starts when this leader first sees it unreferenced and stops when
//!   it is referenced again; a restart or a new leader starts it anew (a deletion only ever
//!   comes later than the grace, never earlier).
//! - **Deleting** ([`delete`]): the entries' records are replaced by `spec.mirrorDeleted` first,
//!   so the webhook replicas (through their watch) and this controller stop pinning to the
//!   copy; after [`SETTLE`] the objects are listed afresh from the API server, and only if none
//!   references the copy is its manifest deleted (`DELETE /v2/<repository>/manifests/<digest>`);
//!   otherwise, or when the mirror refuses, the records are restored (a superseded copy as
//!   superseded).
//! - **Held by another copy** ([`holder`]): a copy can also be part of another copy in the same
//!   mirror repository (a platform manifest of a copied index, an image of a copied bundle's
//!   ImagesLock). If a copy there that objects reference holds it (read from the mirror,
//!   [`Copier::contents`]), it is not deleted and its records stay dropped: it belongs to that
//!   copy now, like the index's other manifests, and retention does not come back to it every
//!   grace period (an object that references it again has it copied, that is recorded, again).
//! - **The window that remains**: an admission a webhook replica answered from a cache that had
//!   not seen the deletion yet, whose object reaches the API server after that fresh list, is
//!   pinned to a copy that is then deleted. The copy is then referenced again, so the mirror
//!   copier copies it again (from upstream, while an entry answers with that digest); until it
//!   has, kapp-controller's fetches of that object fail.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, SystemTime},
};

use holdfast_cache::{CacheKey, DigestCache, MirrorDeletion};
use holdfast_registry::{
    Digest, Reference,
    mirror::{Copier, CopyError, DeleteError, Deletion, MirrorLocation},
};

use super::references::References;

/// Between recording a deletion on the entries and checking the objects again: long enough for
/// the webhook replicas' watches to deliver it and for an admission already answered (within
/// the webhook's deadline, 3 s by default) to reach the API server.
pub const SETTLE: Duration = Duration::from_secs(5);

/// A copy to delete, with the keys of the entries that record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    pub location: String,
    pub keys: Vec<CacheKey>,
}

/// The retention's memory: since when each recorded copy has been unreferenced.
#[derive(Debug, Default)]
pub struct Retention {
    unreferenced_since: HashMap<String, SystemTime>,
}

impl Retention {
    /// The copies of `mirror` among `records` (entry key, copy: current or superseded) that
    /// nothing in `referenced` names and that have been unreferenced for `grace` at `now`.
    /// Records of another mirror (the configuration changed) are never deleted: that registry
    /// is not this controller's any more. A copy `deleting` names keeps its clock although its
    /// records are gone meanwhile (a deletion drops them first): if the deletion fails and
    /// restores them, the copy is due again at once and retried with backoff, not after a whole
    /// new grace period.
    pub fn expired(
        &mut self,
        records: &[(CacheKey, String)],
        mirror: &MirrorLocation,
        referenced: &HashSet<String>,
        now: SystemTime,
        grace: Duration,
        deleting: impl Fn(&str) -> bool,
    ) -> Vec<Expired> {
        self.observe(records, mirror, referenced, now, deleting);
        self.due(records, mirror, referenced, now, grace)
    }

    /// The bookkeeping half of [`Retention::expired`]: starts the clocks of the copies of
    /// `mirror` among `records` that nothing in `referenced` names, and drops the others' (but
    /// those `deleting` names).
    pub fn observe(
        &mut self,
        records: &[(CacheKey, String)],
        mirror: &MirrorLocation,
        referenced: &HashSet<String>,
        now: SystemTime,
        deleting: impl Fn(&str) -> bool,
    ) {
        let candidates = candidates(records, mirror, referenced);
        self.unreferenced_since
            .retain(|location, _| candidates.contains_key(location.as_str()) || deleting(location));
        for location in candidates.keys() {
            self.unreferenced_since
                .entry((*location).to_owned())
                .or_insert(now);
        }
    }

    /// The pure half of [`Retention::expired`]: the unreferenced copies of `mirror` among
    /// `records` whose clock ([`Retention::observe`]) has run for `grace` at `now`.
    pub fn due(
        &self,
        records: &[(CacheKey, String)],
        mirror: &MirrorLocation,
        referenced: &HashSet<String>,
        now: SystemTime,
        grace: Duration,
    ) -> Vec<Expired> {
        candidates(records, mirror, referenced)
            .into_iter()
            .filter_map(|(location, mut keys)| {
                let since = self.unreferenced_since.get(location)?;
                if now.duration_since(*since).unwrap_or_default() < grace {
                    return None;
                }
                keys.sort();
                Some(Expired {
                    location: location.to_owned(),
                    keys,
                })
            })
            .collect()
    }

    /// When the next unreferenced copy's grace ends, among the copies `waiting` does not name.
    /// A copy whose grace has ended but that waits for something else (its deletion or copy
    /// running, a retry later) must not count: its deadline is past, and the caller would wake at
    /// once, find it still waiting, and spin.
    pub fn next_due(&self, grace: Duration, waiting: impl Fn(&str) -> bool) -> Option<SystemTime> {
        self.unreferenced_since
            .iter()
            .filter(|(location, _)| !waiting(location))
            .map(|(_, since)| *since + grace)
            .min()
    }

    /// Forgets `location` (deleted, or found referenced after all).
    pub fn forget(&mut self, location: &str) {
        self.unreferenced_since.remove(location);
    }
}

/// The copies of `mirror` among `records` that nothing in `referenced` names, with the keys
/// that record each.
fn candidates<'a>(
    records: &'a [(CacheKey, String)],
    mirror: &MirrorLocation,
    referenced: &HashSet<String>,
) -> BTreeMap<&'a str, Vec<CacheKey>> {
    let mut candidates: BTreeMap<&str, Vec<CacheKey>> = BTreeMap::new();
    for (key, location) in records {
        let ours = Reference::parse(location)
            .is_ok_and(|parsed| parsed.digest().is_some() && mirror.contains(&parsed));
        if ours && !referenced.contains(location) {
            candidates.entry(location.as_str()).or_default().push(key.clone());
        }
    }
    candidates
}

/// What [`delete`] did.
#[derive(Debug)]
pub enum Outcome {
    /// Deleted from the mirror (or it was already gone).
    Deleted(Deletion),
    /// Referenced again by the time of the check: kept, records restored.
    Referenced,
    /// Held by `holder`, a referenced copy in the same repository: kept, records dropped.
    Held { holder: String },
    /// The check or the deletion failed: kept, records restored.
    Failed(DeleteFailure),
}

#[derive(Debug, thiserror::Error)]
pub enum DeleteFailure {
    #[error("listing the pinned objects before deleting: {0}")]
    List(#[from] kube::Error),
    #[error(transparent)]
    Mirror(#[from] DeleteError),
    #[error("reading what the repository's other copies hold before deleting: {0}")]
    Contents(#[from] CopyError),
}

/// The copies of `candidate`'s mirror repository among `referenced`, other than `candidate`:
/// those that may hold it.
pub fn siblings(candidate: &Reference, referenced: &HashSet<String>) -> Vec<Reference> {
    let mut siblings: Vec<Reference> = referenced
        .iter()
        .filter_map(|location| Reference::parse(location).ok())
        .filter(|other| {
            other.name() == candidate.name()
                && other.digest().is_some()
                && other.digest() != candidate.digest()
        })
        .collect();
    siblings.sort_by_key(Reference::to_string);
    siblings
}

/// The first of `siblings` (a copy, what it holds) that holds `candidate`'s digest.
pub fn holder<'a>(candidate: &Digest, siblings: &'a [(String, Vec<Digest>)]) -> Option<&'a str> {
    siblings
        .iter()
        .find(|(_, held)| held.contains(candidate))
        .map(|(location, _)| location.as_str())
}

/// Reads what each sibling of `location` holds from the mirror; which one holds `location`.
async fn held_by(
    location: &Reference,
    referenced: &HashSet<String>,
    copier: &Copier,
) -> Result<Option<String>, CopyError> {
    let Some(digest) = location.digest() else {
        return Ok(None);
    };
    let mut held = Vec::new();
    for sibling in siblings(location, referenced) {
        let contents = copier.contents(&sibling).await?;
        held.push((sibling.to_string(), contents));
    }
    Ok(holder(digest, &held).map(str::to_owned))
}

/// Deletes `expired` from the mirror as the module docs describe.
pub async fn delete(
    expired: &Expired,
    cache: &DigestCache,
    references: &References,
    copier: &Copier,
) -> Outcome {
    let deletion = MirrorDeletion {
        location: expired.location.clone(),
        at: SystemTime::now(),
    };
    for key in &expired.keys {
        cache.record_mirror_deleted(key, deletion.clone());
    }
    tokio::time::sleep(SETTLE).await;
    let outcome = match references.listed().await {
        Ok(referenced) if referenced.contains(&expired.location) => Outcome::Referenced,
        Ok(referenced) => match Reference::parse(&expired.location) {
            Ok(location) => match held_by(&location, &referenced, copier).await {
                Ok(Some(holder)) => Outcome::Held { holder },
                Ok(None) => match copier.delete(&location).await {
                    Ok(done) => Outcome::Deleted(done),
                    Err(error) => Outcome::Failed(error.into()),
                },
                Err(error) => Outcome::Failed(error.into()),
            },
            Err(_) => Outcome::Failed(DeleteError::NotInMirror(expired.location.clone()).into()),
        },
        Err(error) => Outcome::Failed(error.into()),
    };
    if !matches!(outcome, Outcome::Deleted(_) | Outcome::Held { .. }) {
        // The copy is still there: record it again (a later record wins over the deletion).
        for key in &expired.keys {
            cache.restore_mirror_copy(key, &expired.location, SystemTime::now());
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use holdfast_cache::Scope;

    use super::*;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const GRACE: Duration = Duration::from_secs(60);

    fn mirror() -> MirrorLocation {
        MirrorLocation::new("cache.corp.com:5000", "m").unwrap()
    }

    fn record(tag: &str, location: &str) -> (CacheKey, String) {
        let key = CacheKey::tag(
            &Reference::parse(&format!("registry.corp.com/team/app:{tag}")).unwrap(),
            Scope::Anonymous,
        );
        (key, location.to_owned())
    }

    fn copy(digest: &str) -> String {
        format!("cache.corp.com:5000/m/registry.corp.com/team/app@{digest}")
    }

    fn locations(expired: &[Expired]) -> Vec<&str> {
        expired.iter().map(|e| e.location.as_str()).collect()
    }

    /// `Retention::expired` with this module's mirror and grace, no deletion running.
    fn due(
        retention: &mut Retention,
        records: &[(CacheKey, String)],
        referenced: &HashSet<String>,
        at: SystemTime,
    ) -> Vec<Expired> {
        retention.expired(records, &mirror(), referenced, at, GRACE, |_| false)
    }

    #[test]
    fn an_unreferenced_copy_is_due_after_the_grace_and_a_referenced_one_never() {
        let records = [record("1.0", &copy(D1)), record("2.0", &copy(D2))];
        let referenced: HashSet<String> = [copy(D2)].into();
        let mut retention = Retention::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let decide = |r: &mut Retention, at| due(r, &records, &referenced, at);
        assert!(decide(&mut retention, t0).is_empty(), "the clock starts now");
        assert_eq!(retention.next_due(GRACE, |_| false), Some(t0 + GRACE));
        assert!(decide(&mut retention, t0 + GRACE - Duration::from_secs(1)).is_empty());
        let due = decide(&mut retention, t0 + GRACE);
        assert_eq!(locations(&due), [copy(D1)]);
        assert_eq!(due[0].keys, [records[0].0.clone()]);
        // Long after: the referenced copy is still never due.
        assert_eq!(locations(&decide(&mut retention, t0 + 100 * GRACE)), [copy(D1)]);
        // A due copy that waits for something else (its deletion, a retry) sets no deadline.
        let d1 = copy(D1);
        assert_eq!(retention.next_due(GRACE, |location| location == d1), None);
    }

    #[test]
    fn a_reference_in_between_restarts_the_clock() {
        let records = [record("1.0", &copy(D1))];
        let none = HashSet::new();
        let some: HashSet<String> = [copy(D1)].into();
        let mut retention = Retention::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(due(&mut retention, &records, &none, t0).is_empty());
        let t1 = t0 + GRACE / 2;
        assert!(due(&mut retention, &records, &some, t1).is_empty());
        assert_eq!(retention.next_due(GRACE, |_| false), None, "referenced: no clock");
        let t2 = t0 + GRACE;
        assert!(
            due(&mut retention, &records, &none, t2).is_empty(),
            "unreferenced again only since t2"
        );
        assert_eq!(due(&mut retention, &records, &none, t2 + GRACE).len(), 1);
    }

    #[test]
    fn a_failed_deletion_is_due_again_at_once_not_after_a_new_grace() {
        let records = [record("1.0", &copy(D1))];
        let none = HashSet::new();
        let d1 = copy(D1);
        let mut retention = Retention::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!(due(&mut retention, &records, &none, t0).is_empty());
        assert_eq!(due(&mut retention, &records, &none, t0 + GRACE).len(), 1);
        // The deletion drops the records first; while it runs, the clock stays.
        let deleting = |location: &str| location == d1;
        assert!(
            retention
                .expired(&[], &mirror(), &none, t0 + GRACE, GRACE, deleting)
                .is_empty()
        );
        // It failed and restored them: due again at once (the caller's backoff paces it).
        assert_eq!(due(&mut retention, &records, &none, t0 + GRACE).len(), 1);
        // Without the deletion running, a vanished record takes its clock with it.
        retention.expired(&[], &mirror(), &none, t0 + GRACE, GRACE, |_| false);
        assert!(due(&mut retention, &records, &none, t0 + GRACE).is_empty());
    }

    #[test]
    fn a_moved_tags_superseded_copy_is_deleted_once_unreferenced_and_the_new_one_kept() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let resolver = holdfast_registry::Resolver::new(Default::default()).unwrap();
        let cache = DigestCache::new(std::sync::Arc::new(resolver), Default::default(), None);
        let (key, _) = record("1.0", "");
        let copied = |digest: &str, at| holdfast_cache::Mirrored {
            location: copy(digest),
            at,
        };
        cache.record_mirrored(&key, copied(D1, SystemTime::UNIX_EPOCH));
        cache.record_mirrored(&key, copied(D2, SystemTime::UNIX_EPOCH + GRACE));
        // The objects moved on to the new copy: the old one is known, unreferenced, due.
        let referenced: HashSet<String> = [copy(D2)].into();
        let mut retention = Retention::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let records = cache.recorded_copies();
        assert!(due(&mut retention, &records, &referenced, t0).is_empty());
        let due = due(&mut retention, &records, &referenced, t0 + GRACE);
        assert_eq!(locations(&due), [copy(D1)]);
        assert_eq!(due[0].keys, [key]);
        // While an object is still on the old copy (a freeze pin), it is kept.
        let both: HashSet<String> = [copy(D1), copy(D2)].into();
        assert!(
            Retention::default()
                .expired(&records, &mirror(), &both, t0, Duration::ZERO, |_| false)
                .is_empty()
        );
    }

    #[test]
    fn one_deletion_per_copy_with_every_key_that_records_it() {
        let records = [
            record("1.0", &copy(D1)),
            record("latest", &copy(D1)),
            // Another mirror's copy (the configuration changed): never deleted here.
            record(
                "old",
                &format!("old-cache.corp.com/m/registry.corp.com/team/app@{D2}"),
            ),
        ];
        let mut retention = Retention::default();
        let t0 = SystemTime::UNIX_EPOCH;
        retention.expired(&records, &mirror(), &HashSet::new(), t0, Duration::ZERO, |_| {
            false
        });
        let due = retention.expired(&records, &mirror(), &HashSet::new(), t0, Duration::ZERO, |_| {
            false
        });
        assert_eq!(locations(&due), [copy(D1)]);
        let mut keys = vec![records[0].0.clone(), records[1].0.clone()];
        keys.sort();
        assert_eq!(due[0].keys, keys);
    }

    #[test]
    fn only_the_other_digests_of_the_same_mirror_repository_are_siblings() {
        let candidate = Reference::parse(&copy(D1)).unwrap();
        let referenced: HashSet<String> = [
            copy(D1),
            copy(D2),
            format!("cache.corp.com:5000/m/registry.corp.com/team/other@{D2}"),
            "cache.corp.com:5000/m/registry.corp.com/team/app:1.0".to_owned(),
            "not a reference".to_owned(),
        ]
        .into();
        let siblings: Vec<String> = siblings(&candidate, &referenced)
            .iter()
            .map(Reference::to_string)
            .collect();
        assert_eq!(siblings, [copy(D2)]);
    }

    #[test]
    fn a_copy_held_by_a_referenced_index_or_bundle_is_kept() {
        let digest = |d: &str| d.parse::<Digest>().unwrap();
        const D3: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";
        // D1 is a platform manifest of the index D2 (or an image of the bundle D2's lock).
        let held = [(copy(D3), vec![]), (copy(D2), vec![digest(D3), digest(D1)])];
        assert_eq!(holder(&digest(D1), &held), Some(copy(D2).as_str()));
        assert_eq!(holder(&digest(D2), &held), None, "nothing holds the index");
        assert_eq!(holder(&digest(D1), &held[..1]), None);
        assert_eq!(holder(&digest(D1), &[]), None, "no referenced sibling");
    }

    #[test]
    fn forgotten_and_vanished_records_lose_their_clock() {
        let records = [record("1.0", &copy(D1))];
        let mut retention = Retention::default();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        due(&mut retention, &records, &HashSet::new(), t0);
        retention.forget(&copy(D1));
        assert_eq!(retention.next_due(GRACE, |_| false), None);
        due(&mut retention, &records, &HashSet::new(), t0);
        due(&mut retention, &[], &HashSet::new(), t0);
        assert_eq!(
            retention.next_due(GRACE, |_| false),
            None,
            "no record: nothing to time"
        );
    }
}

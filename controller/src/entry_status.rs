//! The status of every `DigestCacheEntry` (conditions `Resolved`, `Stale`, `Mirrored`, the
//! digest and check time observed, how many objects name it), written by the leader through the
//! status subresource; and the refreshes asked for with the annotation
//! [`REFRESH_ANNOTATION`] (`kubectl holdfast refresh`), acted on here, through the refresher,
//! so that only keys live objects name reach the registry (an entry's annotation never makes
//! the controller read a Secret). The spec stays what the cache resolved; the status is what
//! an operator reads.

use std::{
    collections::{HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    time::{Duration, SystemTime},
};

use holdfast_cache::{
    CacheEntry, CacheKey, DigestCache, Mirrored,
    cluster_store::{
        self, Condition, ConditionStatus, DigestCacheEntryStatus, FIELD_MANAGER, REFRESH_ANNOTATION,
        RefreshOutcome, RefreshResult, StatusApply, crd::Timestamp,
    },
};
use holdfast_pins::Pinner;
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    runtime::{
        reflector::{Store, store::Writer},
        watcher,
    },
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    refresher::Refresher,
    watched::{Handlers, Watched, spawn_watch},
};

pub const RESOLVED: &str = "Resolved";
pub const STALE: &str = "Stale";
pub const MIRRORED: &str = "Mirrored";

/// What the controller knows of one entry when it writes its status.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    pub entry: &'a CacheEntry,
    /// The entry's mirror record, if it holds the entry's digest.
    pub mirrored: Option<&'a Mirrored>,
    /// Whether a mirror is configured at all.
    pub mirroring: bool,
    pub used_by: usize,
    pub max_staleness: Duration,
}

/// The status of an entry as `observed` at `now`; each condition keeps the transition time it
/// has in `previous` while its status is unchanged, so the same observation writes nothing.
pub fn status_of(
    observed: &Observed<'_>,
    previous: Option<&DigestCacheEntryStatus>,
    last_refresh: Option<RefreshOutcome>,
    now: SystemTime,
) -> DigestCacheEntryStatus {
    let entry = observed.entry;
    let at = |time: SystemTime| rfc3339(time);
    let stale_until = entry.resolved_at + observed.max_staleness;
    let resolved = match &entry.error {
        None => (
            ConditionStatus::True,
            "Resolved",
            format!(
                "the registry answered {} at {}",
                answered(entry),
                at(entry.checked_at)
            ),
        ),
        Some(error) => (
            ConditionStatus::False,
            "RegistryError",
            format!("the last check, at {}, failed: {error}", at(entry.checked_at)),
        ),
    };
    let stale = match &entry.error {
        None => (
            ConditionStatus::False,
            "Fresh",
            "the last registry check succeeded".to_owned(),
        ),
        Some(_) if now <= stale_until => (
            ConditionStatus::True,
            "ServingStale",
            format!(
                "serving {}, resolved at {}, until {} (--cache-max-staleness-seconds {})",
                entry.digest,
                at(entry.resolved_at),
                at(stale_until),
                observed.max_staleness.as_secs()
            ),
        ),
        Some(_) => (
            ConditionStatus::True,
            "StalenessExceeded",
            format!(
                "{}, resolved at {}, is older than --cache-max-staleness-seconds ({}) allows: references naming it are left unpinned until the registry answers",
                entry.digest,
                at(entry.resolved_at),
                observed.max_staleness.as_secs()
            ),
        ),
    };
    let mirrored = match (observed.mirrored, observed.mirroring) {
        (Some(copy), _) => (
            ConditionStatus::True,
            "Copied",
            format!("copied to {} at {}", copy.location, at(copy.at)),
        ),
        (None, true) => (
            ConditionStatus::False,
            "NotCopied",
            "the current digest's content is not in the mirror (yet)".to_owned(),
        ),
        (None, false) => (
            ConditionStatus::False,
            "MirrorOff",
            "no mirror is configured (--mirror-registry)".to_owned(),
        ),
    };
    let conditions = [(RESOLVED, resolved), (STALE, stale), (MIRRORED, mirrored)]
        .into_iter()
        .map(|(type_, (status, reason, message))| {
            let since = previous
                .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
                .filter(|c| c.status == status)
                .map_or(Timestamp(now), |c| c.last_transition_time);
            Condition {
                type_: type_.to_owned(),
                status,
                reason: reason.to_owned(),
                message,
                last_transition_time: since,
            }
        })
        .collect();
    DigestCacheEntryStatus {
        conditions,
        observed_digest: Some(entry.digest.clone()),
        last_check_time: Some(Timestamp(entry.checked_at)),
        used_by: Some(u32::try_from(observed.used_by).unwrap_or(u32::MAX)),
        serve_stale_until: entry.error.is_some().then_some(Timestamp(stale_until)),
        last_refresh: last_refresh.or_else(|| previous.and_then(|p| p.last_refresh.clone())),
    }
}

/// `sha256:…`, with the tag a selection picked.
fn answered(entry: &CacheEntry) -> String {
    match &entry.tag {
        Some(tag) => format!("{} (tag {tag})", entry.digest),
        None => entry.digest.to_string(),
    }
}

fn rfc3339(time: SystemTime) -> String {
    serde_json::to_value(Timestamp(time))
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// What a refresh request came to, for one key (`asked`: the keys live objects name, which the
/// refresher checked; `moved`: those whose digest changed).
pub fn refresh_result(
    key: &CacheKey,
    asked: &HashSet<CacheKey>,
    moved: &std::collections::BTreeSet<CacheKey>,
    now_held: Option<&CacheEntry>,
) -> RefreshResult {
    if !asked.contains(key) {
        RefreshResult::NotNamed
    } else if moved.contains(key) {
        RefreshResult::Moved
    } else if now_held.is_none_or(|entry| entry.error.is_some()) {
        RefreshResult::Failed
    } else {
        RefreshResult::Checked
    }
}

/// The status writer of a leader's term: the entries' objects as a watch keeps them (their
/// annotations and the status they hold), and what it wrote.
pub struct EntryStatus {
    api: Api<DynamicObject>,
    entries: Store<DynamicObject>,
    /// Bumped when an entry is added or deleted or its refresh annotation changes.
    entry_changes: watch::Receiver<u64>,
    /// Bumped when an entry's spec or mirror record changes.
    cache_changes: watch::Receiver<u64>,
    /// Bumped when what the objects name may have changed (`usedBy`).
    object_changes: watch::Receiver<u64>,
    written: HashMap<String, DigestCacheEntryStatus>,
}

impl EntryStatus {
    /// Watches the entries in `namespace` until `cancel`.
    pub fn start(
        client: &Client,
        namespace: &str,
        cache: &DigestCache,
        watched: &Watched,
        cancel: &CancellationToken,
    ) -> Self {
        let api = cluster_store::api(client.clone(), namespace);
        let writer = Writer::new(cluster_store::resource());
        let entries = writer.as_reader();
        let (changed, entry_changes) = watch::channel(0);
        spawn_watch(
            api.clone(),
            writer,
            Handlers {
                slim: |entry: &mut DynamicObject| holdfast_peers::slim_metadata(&mut entry.metadata),
                fingerprint: refresh_fingerprint,
                observe: |_: &watcher::Event<DynamicObject>| {},
            },
            &changed,
            None,
            cancel,
        );
        // The sender lives in the watch's task; dropping ours leaves it the only one.
        drop(changed);
        Self {
            api,
            entries,
            entry_changes,
            cache_changes: cache.changes(),
            object_changes: watched.changes(),
            written: HashMap::new(),
        }
    }

    /// Resolves when there may be a status to write or a refresh to act on.
    pub async fn changed(&mut self) {
        tokio::select! {
            _ = bumped(&mut self.entry_changes) => {}
            _ = bumped(&mut self.cache_changes) => {}
            _ = bumped(&mut self.object_changes) => {}
        }
    }

    /// Acts on the refreshes asked for (through `refresher`, which checks only named keys and
    /// has the objects of moved keys re-pinned), then writes every entry's status that changed.
    /// Returns how many statuses it wrote.
    pub async fn pass(&mut self, refresher: &mut Refresher, pinner: &Pinner) -> usize {
        let cache = pinner.cache();
        let objects = self.entries.state();
        let mut by_key: HashMap<CacheKey, (String, Option<DigestCacheEntryStatus>)> = HashMap::new();
        let mut requests: Vec<(CacheKey, String)> = Vec::new();
        for object in &objects {
            let Ok(typed) = cluster_store::parse(object) else {
                continue;
            };
            let key = CacheEntry::from(&typed.spec).key;
            if let Some(token) = object.annotations().get(REFRESH_ANNOTATION) {
                let done = typed.status.as_ref().and_then(|s| s.last_refresh.as_ref());
                if done.is_none_or(|d| &d.request != token) {
                    requests.push((key.clone(), token.clone()));
                }
            }
            by_key.insert(key, (object.name_any(), typed.status));
        }
        let mut outcomes: HashMap<CacheKey, RefreshOutcome> = HashMap::new();
        if !requests.is_empty() {
            let keys: HashSet<CacheKey> = requests.iter().map(|(key, _)| key.clone()).collect();
            match refresher.refresh_requested(pinner, &keys).await {
                Ok((report, asked)) => {
                    let now = Timestamp(SystemTime::now());
                    for (key, token) in requests {
                        let result =
                            refresh_result(&key, &asked, &report.moved_keys, cache.get(&key).as_ref());
                        tracing::info!(reference = %key.reference, scope = %key.scope, ?result, "refresh asked for");
                        outcomes.insert(
                            key,
                            RefreshOutcome {
                                request: token,
                                result,
                                at: now,
                            },
                        );
                    }
                }
                Err(error) => tracing::info!(%error, "refresh asked for; waiting for the watches"),
            }
        }
        let used_by = refresher.used_by();
        let (mirroring, max_staleness, now) = (
            pinner.mirror().is_some(),
            cache.max_staleness(),
            SystemTime::now(),
        );
        let mut written = 0;
        let mut live = HashSet::new();
        for entry in cache.entries() {
            let Some((name, stored)) = by_key.get(&entry.key) else {
                // Not created yet: its object's watch event brings it back.
                continue;
            };
            live.insert(name.clone());
            let mirrored = cache.mirror_of(&entry.key, &entry.digest);
            let observed = Observed {
                entry: &entry,
                mirrored: mirrored.as_ref(),
                mirroring,
                used_by: used_by.get(&entry.key).copied().unwrap_or_default(),
                max_staleness,
            };
            let previous = self.written.get(name).or(stored.as_ref());
            let status = status_of(&observed, previous, outcomes.remove(&entry.key), now);
            if previous == Some(&status) {
                continue;
            }
            let apply = StatusApply::new(name.clone(), status.clone());
            match self
                .api
                .patch_status(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&apply),
                )
                .await
            {
                Ok(_) => {
                    written += 1;
                    self.written.insert(name.clone(), status);
                }
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    tracing::warn!(%error, name, reference = %entry.key.reference, "writing a digest cache entry's status")
                }
            }
        }
        self.written.retain(|name, _| live.contains(name));
        written
    }
}

/// Resolves at `counter`'s next change; never once its sender is gone (the term is ending).
async fn bumped(counter: &mut watch::Receiver<u64>) {
    if counter.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What of an entry's object wakes the status writer besides its spec: the refresh asked for.
fn refresh_fingerprint(entry: &DynamicObject) -> u64 {
    let mut hasher = DefaultHasher::new();
    entry.annotations().get(REFRESH_ANNOTATION).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use holdfast_cache::Scope;
    use holdfast_registry::Digest;

    use super::*;

    const T0: Duration = Duration::from_secs(1_700_000_000);

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(seconds)
    }

    fn digest(n: u8) -> Digest {
        format!("sha256:{}", format!("{n:02x}").repeat(32))
            .parse()
            .unwrap()
    }

    fn key(tag: &str) -> CacheKey {
        CacheKey {
            reference: format!("reg.io/team/app:{tag}"),
            selection: None,
            scope: Scope::Anonymous,
        }
    }

    fn observed(entry: &CacheEntry) -> Observed<'_> {
        Observed {
            entry,
            mirrored: None,
            mirroring: false,
            used_by: 3,
            max_staleness: Duration::from_secs(3600),
        }
    }

    fn condition<'a>(status: &'a DigestCacheEntryStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn a_resolved_entry_is_resolved_fresh_and_counts_its_objects() {
        let entry = CacheEntry::resolved(key("1.0"), digest(1), at(0));
        let status = status_of(&observed(&entry), None, None, at(10));
        assert_eq!(condition(&status, RESOLVED).status, ConditionStatus::True);
        assert_eq!(condition(&status, STALE).status, ConditionStatus::False);
        assert_eq!(condition(&status, MIRRORED).reason, "MirrorOff");
        assert_eq!(status.observed_digest, Some(digest(1)));
        assert_eq!(status.last_check_time, Some(Timestamp(at(0))));
        assert_eq!(status.used_by, Some(3));
        assert_eq!(status.serve_stale_until, None);
        // The same observation later writes the same status: transition times are kept.
        assert_eq!(status_of(&observed(&entry), Some(&status), None, at(20)), status);
    }

    #[test]
    fn a_failed_check_serves_stale_until_the_limit_then_says_it_is_exceeded() {
        let entry = CacheEntry {
            checked_at: at(600),
            error: Some("registry answered 503".into()),
            ..CacheEntry::resolved(key("1.0"), digest(1), at(0))
        };
        let fresh = status_of(
            &observed(&CacheEntry::resolved(key("1.0"), digest(1), at(0))),
            None,
            None,
            at(0),
        );
        let stale = status_of(&observed(&entry), Some(&fresh), None, at(600));
        assert_eq!(condition(&stale, RESOLVED).reason, "RegistryError");
        assert!(
            condition(&stale, RESOLVED)
                .message
                .contains("registry answered 503")
        );
        assert_eq!(condition(&stale, STALE).reason, "ServingStale");
        assert_eq!(condition(&stale, STALE).last_transition_time, Timestamp(at(600)));
        assert_eq!(stale.serve_stale_until, Some(Timestamp(at(3600))));
        let exceeded = status_of(&observed(&entry), Some(&stale), None, at(3601));
        assert_eq!(condition(&exceeded, STALE).reason, "StalenessExceeded");
        // Still True: the transition time is the one it turned stale at.
        assert_eq!(
            condition(&exceeded, STALE).last_transition_time,
            Timestamp(at(600))
        );
    }

    #[test]
    fn mirrored_says_where_the_copy_is_or_that_it_is_missing() {
        let entry = CacheEntry::resolved(key("1.0"), digest(1), at(0));
        let copy = Mirrored {
            location: format!("mirror.local/hf/reg.io/team/app@{}", digest(1)),
            at: at(5),
        };
        let mut seen = observed(&entry);
        seen.mirroring = true;
        assert_eq!(
            condition(&status_of(&seen, None, None, at(1)), MIRRORED).reason,
            "NotCopied"
        );
        seen.mirrored = Some(&copy);
        let status = status_of(&seen, None, None, at(6));
        assert_eq!(condition(&status, MIRRORED).status, ConditionStatus::True);
        assert!(condition(&status, MIRRORED).message.contains(&copy.location));
    }

    #[test]
    fn a_refresh_outcome_is_kept_until_another_replaces_it() {
        let entry = CacheEntry::resolved(key("1.0"), digest(1), at(0));
        let outcome = RefreshOutcome {
            request: "r1".into(),
            result: RefreshResult::Checked,
            at: Timestamp(at(1)),
        };
        let first = status_of(&observed(&entry), None, Some(outcome.clone()), at(1));
        assert_eq!(first.last_refresh, Some(outcome.clone()));
        assert_eq!(
            status_of(&observed(&entry), Some(&first), None, at(2)).last_refresh,
            Some(outcome)
        );
    }

    #[test]
    fn a_refresh_result_says_what_the_request_came_to() {
        let (named, moved, failed, unnamed) = (key("a"), key("b"), key("c"), key("d"));
        let asked = HashSet::from([named.clone(), moved.clone(), failed.clone()]);
        let moved_keys = BTreeSet::from([moved.clone()]);
        let held = CacheEntry::resolved(named.clone(), digest(1), at(0));
        let broken = CacheEntry {
            error: Some("timeout".into()),
            ..held.clone()
        };
        assert_eq!(
            refresh_result(&named, &asked, &moved_keys, Some(&held)),
            RefreshResult::Checked
        );
        assert_eq!(
            refresh_result(&moved, &asked, &moved_keys, Some(&held)),
            RefreshResult::Moved
        );
        assert_eq!(
            refresh_result(&failed, &asked, &moved_keys, Some(&broken)),
            RefreshResult::Failed
        );
        assert_eq!(
            refresh_result(&unnamed, &asked, &moved_keys, None),
            RefreshResult::NotNamed
        );
    }
}

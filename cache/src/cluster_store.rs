//! The digest cache persisted in the cluster: each entry is a [`DigestCacheEntry`] object in
//! holdfast's namespace (typed in [`crd`], which generates the CRD in `manifests/crds/`), written
//! by server-side apply in the background and read back through a watch into every replica's
//! [`DigestCache`].
//!
//! The mirror record of an entry (`spec.mirror`, `spec.mirroredAt`) is written by a field manager
//! of its own, [`MIRROR_FIELD_MANAGER`]: the entry's own applies (every refresh) leave it alone,
//! and it names the digest it holds, so a moved tag never serves a stale record. The copies a
//! moved tag's entry recorded before (`spec.mirrorSuperseded`: location and since when) are
//! kept beside it until retention deletes them. When the controller deletes a copy from the
//! mirror (retention), the same manager applies `spec.mirrorDeleted` and `spec.mirrorDeletedAt`
//! without that copy, which drops it (fields a manager stops applying are removed) and tells
//! every replica to stop pinning to it. Each write applies the manager's fields whole
//! ([`MirrorFields`]), and replicas load them whole: writes to one object merge and a re-list
//! skips states, so a copy the object no longer records is gone whatever `mirrorDeleted` names.

use std::{collections::HashMap, sync::Arc};

use futures::StreamExt;
use kube::{
    Api, Client, CustomResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use sha2::{Digest as _, Sha256};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

pub mod crd;

pub use crd::{
    Condition, ConditionStatus, DigestCacheEntry, DigestCacheEntrySpec, DigestCacheEntryStatus, MirrorApply,
    MirrorRecord, REFRESH_ANNOTATION, RefreshOutcome, RefreshResult, StatusApply,
};

use crate::{
    CacheEntry, CacheKey, DigestCache, EntrySink, MirrorDeletion, MirrorFields, Mirrored, Superseded,
};

pub const FIELD_MANAGER: &str = "holdfast";
/// Owner of `spec.mirror` and `spec.mirroredAt` (the controller's mirror copies).
pub const MIRROR_FIELD_MANAGER: &str = "holdfast-mirror";

pub fn resource() -> ApiResource {
    DigestCacheEntry::api_resource()
}

/// The object name for a key: stable, and short enough for any reference.
pub fn object_name(key: &CacheKey) -> String {
    let bytes = serde_json::to_vec(key).unwrap_or_default();
    format!("d-{}", &hex::encode(Sha256::digest(bytes))[..40])
}

/// The object holding `entry`: what [`FIELD_MANAGER`] applies, without the mirror fields.
pub fn to_object(entry: &CacheEntry) -> DigestCacheEntry {
    DigestCacheEntry::new(&object_name(&entry.key), entry.into())
}

/// The apply configuration that records `fields` on the object of `key`: only the fields
/// [`MIRROR_FIELD_MANAGER`] owns, all of them (those left out are removed).
pub fn mirror_patch(key: &CacheKey, fields: &MirrorFields) -> MirrorApply {
    MirrorApply::new(object_name(key), fields.into())
}

/// `object` as the typed entry; an error for an object holdfast did not write (a field
/// missing, a digest or time that does not parse).
pub fn parse(object: &DynamicObject) -> Result<DigestCacheEntry, serde_json::Error> {
    serde_json::to_value(object).and_then(serde_json::from_value)
}

/// The superseded copies an object records.
pub fn superseded_from_object(object: &DynamicObject) -> Vec<Superseded> {
    mirror_fields_from_object(object).superseded
}

/// The mirror deletion an object records, if any.
pub fn mirror_deleted_from_object(object: &DynamicObject) -> Option<MirrorDeletion> {
    mirror_fields_from_object(object).deleted
}

/// The mirror record an object holds, if any.
pub fn mirrored_from_object(object: &DynamicObject) -> Option<Mirrored> {
    mirror_fields_from_object(object).current
}

/// Every mirror field an object holds (what [`MIRROR_FIELD_MANAGER`] last applied); none for
/// an object holdfast did not write.
pub fn mirror_fields_from_object(object: &DynamicObject) -> MirrorFields {
    parse(object)
        .map(|typed| MirrorFields::from(&typed.spec.mirror))
        .unwrap_or_default()
}

/// The entry an object holds; `None` for an object holdfast did not write.
pub fn from_object(object: &DynamicObject) -> Option<CacheEntry> {
    parse(object).ok().map(|typed| CacheEntry::from(&typed.spec))
}

/// Persists entries in the background: `persist` never waits for the API server, and a burst of
/// changes to one key is written once.
pub struct ClusterSink {
    tx: mpsc::UnboundedSender<Write>,
}

/// What the sink writes.
enum Write {
    Entry(CacheEntry),
    /// The [`MIRROR_FIELD_MANAGER`]'s fields of one object: the last one asked for wins.
    Mirror(CacheKey, MirrorFields),
    /// The object of an entry dropped from the cache.
    Delete(CacheKey),
}

impl ClusterSink {
    /// Writes until `cancel`, which also drops a write in flight (nothing queued is written after).
    pub fn start(api: Api<DynamicObject>, cancel: CancellationToken) -> Arc<Self> {
        let (tx, mut rx) = mpsc::unbounded_channel::<Write>();
        tokio::spawn(async move {
            let params = PatchParams::apply(FIELD_MANAGER).force();
            let mirror_params = PatchParams::apply(MIRROR_FIELD_MANAGER).force();
            loop {
                let first = tokio::select! {
                    _ = cancel.cancelled() => return,
                    next = rx.recv() => match next { Some(write) => write, None => return },
                };
                let mut entries: HashMap<CacheKey, CacheEntry> = HashMap::new();
                let mut records: HashMap<CacheKey, MirrorFields> = HashMap::new();
                let mut deletions: Vec<CacheKey> = Vec::new();
                let mut next = Some(first);
                while let Some(write) = next {
                    match write {
                        Write::Entry(entry) => {
                            deletions.retain(|key| *key != entry.key);
                            entries.insert(entry.key.clone(), entry);
                        }
                        Write::Mirror(key, fields) => {
                            records.insert(key, fields);
                        }
                        Write::Delete(key) => {
                            entries.remove(&key);
                            deletions.push(key);
                        }
                    }
                    next = rx.try_recv().ok();
                }
                // Entries first: a record applies to an object that exists. Each write is dropped,
                // in flight, the moment `cancel` fires (the controller's leadership ended).
                let writes = async {
                    for entry in entries.into_values() {
                        let name = object_name(&entry.key);
                        if let Err(error) = api.patch(&name, &params, &Patch::Apply(&to_object(&entry))).await
                        {
                            tracing::warn!(%error, reference = %entry.key.reference, "could not persist a digest cache entry");
                        }
                    }
                    for (key, fields) in records {
                        let name = object_name(&key);
                        let patch = mirror_patch(&key, &fields);
                        if let Err(error) = api.patch(&name, &mirror_params, &Patch::Apply(&patch)).await {
                            let location = fields.current.as_ref().map(|c| c.location.as_str());
                            tracing::warn!(%error, reference = %key.reference, ?location, "could not persist a mirror record");
                        }
                    }
                    for key in deletions {
                        match api.delete(&object_name(&key), &DeleteParams::default()).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(status)) if status.code == 404 => {}
                            Err(error) => {
                                tracing::warn!(%error, reference = %key.reference, scope = %key.scope, "could not delete a digest cache entry")
                            }
                        }
                    }
                };
                if cancel.run_until_cancelled(writes).await.is_none() {
                    return;
                }
            }
        });
        Arc::new(Self { tx })
    }
}

impl EntrySink for ClusterSink {
    fn persist(&self, entry: &CacheEntry) {
        let _ = self.tx.send(Write::Entry(entry.clone()));
    }

    fn persist_mirror(&self, key: &CacheKey, fields: &MirrorFields) {
        let _ = self.tx.send(Write::Mirror(key.clone(), fields.clone()));
    }

    fn delete(&self, key: &CacheKey) {
        let _ = self.tx.send(Write::Delete(key.clone()));
    }
}

/// Loads every persisted entry into `cache` and follows changes (other replicas, the controller).
/// The receiver turns `true` once the first full list is in.
pub fn follow(
    api: Api<DynamicObject>,
    cache: Arc<DigestCache>,
    cancel: CancellationToken,
) -> watch::Receiver<bool> {
    let (synced_tx, synced) = watch::channel(false);
    tokio::spawn(async move {
        let events = watcher(api, watcher::Config::default()).default_backoff();
        let mut events = std::pin::pin!(events.take_until(cancel.cancelled_owned()));
        while let Some(event) = events.next().await {
            match event {
                Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                    load(&cache, &object);
                }
                Ok(watcher::Event::Delete(object)) => {
                    if let Some(entry) = from_object(&object) {
                        cache.forget(&entry.key);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    let _ = synced_tx.send(true);
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "watching digest cache entries; retrying with backoff"),
            }
        }
    });
    synced
}

/// Loads what `object` holds into `cache`: its entry, and its mirror records whole (what the
/// object no longer records is gone, see [`DigestCache::load_mirror`]). An object holdfast did
/// not write is left out, with a warning: it must not stop the others from loading.
fn load(cache: &DigestCache, object: &DynamicObject) {
    match parse(object) {
        Ok(typed) => {
            let entry = CacheEntry::from(&typed.spec);
            let key = entry.key.clone();
            cache.insert(entry);
            cache.load_mirror(key, MirrorFields::from(&typed.spec.mirror));
        }
        Err(error) => {
            let name = object.metadata.name.as_deref().unwrap_or_default();
            tracing::warn!(%error, name, "ignoring a digest cache entry holdfast cannot read");
        }
    }
}

/// The namespaced API for the entries (holdfast's namespace). Untyped on purpose: a list or watch
/// of `Api<DigestCacheEntry>` fails whole on one object that does not parse (kube's watcher then
/// re-lists with backoff, never synced), so [`follow`] parses each object on its own ([`parse`]).
pub fn api(client: Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, namespace, &resource())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use serde_json::{Value, json};

    use super::*;
    use holdfast_registry::Digest;

    use crate::Scope;

    /// What the API server gets for `object`.
    fn json_of(object: impl serde::Serialize) -> Value {
        serde_json::to_value(object).unwrap()
    }

    /// An entry with every field set: a selection picked its tag, with a Secret, and the last
    /// check failed.
    fn full_entry(resolved_at: SystemTime, checked_at: SystemTime) -> CacheEntry {
        CacheEntry {
            key: CacheKey {
                reference: "registry.example/team/app".into(),
                selection: Some(r#"{"semver":{"constraints":">=1.0.0"}}"#.into()),
                scope: Scope::Secret {
                    namespace: "apps".into(),
                    name: "creds".into(),
                },
            },
            digest: Digest::sha256_of(b"x"),
            tag: Some("1.2.0".into()),
            resolved_at,
            checked_at,
            error: Some("timeout".into()),
            secret_uid: Some("0b5f-uid".into()),
        }
    }

    #[test]
    fn entries_round_trip_through_objects() {
        let now = SystemTime::now();
        let entry = full_entry(now - Duration::from_secs(30), now);
        let object: DynamicObject = serde_json::from_value(json_of(to_object(&entry))).unwrap();
        let back = from_object(&object).unwrap();
        assert_eq!(back.key, entry.key);
        assert_eq!(
            (back.digest, back.tag, back.error, back.secret_uid),
            (entry.digest, entry.tag, entry.error, entry.secret_uid)
        );
        // RFC 3339 keeps sub-second precision here; the API server stores the string as given.
        assert_eq!(back.checked_at, entry.checked_at);
        assert_eq!(object.data["spec"]["state"], "Stale");
        assert!(object.metadata.name.unwrap().starts_with("d-"));
    }

    /// An anonymous entry for `registry.example/team/app:1.0`, resolved to the digest of `seed`.
    fn tag_entry(seed: &[u8], now: SystemTime) -> CacheEntry {
        let key = CacheKey {
            reference: "registry.example/team/app:1.0".into(),
            selection: None,
            scope: Scope::Anonymous,
        };
        CacheEntry::resolved(key, Digest::sha256_of(seed), now)
    }

    #[test]
    fn mirror_records_are_applied_alone_and_read_back() {
        let now = SystemTime::now();
        let entry = tag_entry(b"x", now);
        let key = entry.key.clone();
        let mirrored = Mirrored {
            location: format!("cache.example/m/registry.example/team/app@{}", entry.digest),
            at: now,
        };
        let copied = MirrorFields {
            current: Some(mirrored.clone()),
            ..MirrorFields::default()
        };
        let patch = json_of(mirror_patch(&key, &copied));
        // Only the record's fields: the entry's own applies keep owning the rest.
        let mut fields: Vec<&String> = patch["spec"].as_object().unwrap().keys().collect();
        fields.sort();
        assert_eq!(fields, ["mirror", "mirroredAt"]);
        assert_eq!(patch["metadata"]["name"], json!(object_name(&key)));

        // Applied on the entry's object (the manager's fields beside the entry's): read back.
        let applied = |patch: &Value| {
            let mut object = json_of(to_object(&entry));
            for (field, value) in patch["spec"].as_object().unwrap() {
                object["spec"][field] = value.clone();
            }
            serde_json::from_value::<DynamicObject>(object).unwrap()
        };
        assert!(mirrored_from_object(&applied(&json!({"spec": {}}))).is_none());
        let object = applied(&patch);
        assert_eq!(mirrored_from_object(&object), Some(mirrored.clone()));
        assert_eq!(from_object(&object), Some(entry.clone()));
        assert!(superseded_from_object(&object).is_empty());

        // The tag moved and the new digest was copied: the old copy is superseded, beside it.
        let moved = Mirrored {
            location: format!(
                "cache.example/m/registry.example/team/app@{}",
                Digest::sha256_of(b"y")
            ),
            at: now + Duration::from_secs(1),
        };
        let superseded = Superseded {
            location: mirrored.location.clone(),
            since: moved.at,
        };
        let object = applied(&json_of(mirror_patch(
            &key,
            &MirrorFields {
                current: Some(moved.clone()),
                superseded: vec![superseded.clone()],
                deleted: None,
            },
        )));
        assert_eq!(mirrored_from_object(&object), Some(moved.clone()));
        assert_eq!(superseded_from_object(&object), [superseded]);

        // The superseded copy deleted: the manager's fields are the current copy and the
        // deletion, so the superseded list goes.
        let deleted = MirrorDeletion {
            location: mirrored.location,
            at: now + Duration::from_secs(2),
        };
        let patch = json_of(mirror_patch(
            &key,
            &MirrorFields {
                current: Some(moved.clone()),
                superseded: Vec::new(),
                deleted: Some(deleted.clone()),
            },
        ));
        let mut fields: Vec<&String> = patch["spec"].as_object().unwrap().keys().collect();
        fields.sort();
        assert_eq!(
            fields,
            ["mirror", "mirrorDeleted", "mirrorDeletedAt", "mirroredAt"]
        );
        let object = applied(&patch);
        assert_eq!(mirror_deleted_from_object(&object), Some(deleted.clone()));
        assert_eq!(mirrored_from_object(&object), Some(moved));
        assert!(superseded_from_object(&object).is_empty());

        // The current copy deleted: only the deletion is left.
        let only_deleted = MirrorFields {
            deleted: Some(deleted),
            ..MirrorFields::default()
        };
        assert!(mirrored_from_object(&applied(&json_of(mirror_patch(&key, &only_deleted)))).is_none());
    }

    #[test]
    fn a_replica_drops_a_current_copy_its_object_no_longer_records() {
        let now = SystemTime::now();
        let entry = tag_entry(b"v2", now);
        let key = entry.key.clone();
        let copy = |seed: &[u8]| {
            format!(
                "cache.example/m/registry.example/team/app@{}",
                Digest::sha256_of(seed)
            )
        };
        // The entry's object with the mirror manager's fields `fields` (those it holds now).
        let object = |fields: &MirrorFields| {
            let mut object = json_of(to_object(&entry));
            for (field, value) in json_of(mirror_patch(&key, fields))["spec"].as_object().unwrap() {
                object["spec"][field] = value.clone();
            }
            serde_json::from_value::<DynamicObject>(object).unwrap()
        };
        let replica = DigestCache::new(Arc::new(crate::testing::Unreachable), Default::default(), None);
        let v2 = Mirrored {
            location: copy(b"v2"),
            at: now,
        };
        load(
            &replica,
            &object(&MirrorFields {
                current: Some(v2.clone()),
                superseded: vec![Superseded {
                    location: copy(b"v1"),
                    since: now,
                }],
                deleted: None,
            }),
        );
        assert_eq!(replica.mirrored(&key), Some(v2));
        assert_eq!(replica.recorded_copies().len(), 2);

        // The leader deleted v2, then v1, in one pass; the merged write leaves no copy and
        // names only v1's deletion.
        load(
            &replica,
            &object(&MirrorFields {
                deleted: Some(MirrorDeletion {
                    location: copy(b"v1"),
                    at: now + Duration::from_secs(2),
                }),
                ..MirrorFields::default()
            }),
        );
        assert_eq!(replica.mirrored(&key), None, "v2 was deleted from the mirror");
        assert!(replica.recorded_copies().is_empty());
        assert_eq!(replica.get(&key), Some(entry));
    }

    #[test]
    fn foreign_objects_are_ignored() {
        let object: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "holdfast.dev/v1alpha1", "kind": "DigestCacheEntry", "metadata": {"name": "x"}, "spec": {"reference": "r"}})).unwrap();
        assert!(from_object(&object).is_none());
    }

    /// The objects are those holdfast wrote before they were typed (existing clusters hold them,
    /// other replicas read them): same fields, unset ones left out, each manager's fields alone.
    #[test]
    fn objects_are_written_as_before() {
        let at = |secs, nanos| SystemTime::UNIX_EPOCH + Duration::new(secs, nanos);
        let full = full_entry(at(1_700_000_000, 0), at(1_700_000_030, 250_000_000));
        let digest = full.digest.clone();
        let name = object_name(&full.key);
        assert_eq!(
            json_of(to_object(&full)),
            json!({
                "apiVersion": "holdfast.dev/v1alpha1",
                "kind": "DigestCacheEntry",
                "metadata": {"name": name},
                "spec": {
                    "reference": "registry.example/team/app",
                    "selection": r#"{"semver":{"constraints":">=1.0.0"}}"#,
                    "scope": "secret:apps/creds",
                    "secretUID": "0b5f-uid",
                    "digest": digest.as_str(),
                    "tag": "1.2.0",
                    "resolvedAt": "2023-11-14T22:13:20Z",
                    "checkedAt": "2023-11-14T22:13:50.25Z",
                    "state": "Stale",
                    "error": "timeout",
                },
            })
        );
        let fresh = tag_entry(b"x", at(1_700_000_000, 0));
        assert_eq!(
            json_of(to_object(&fresh))["spec"],
            json!({
                "reference": "registry.example/team/app:1.0",
                "scope": "anonymous",
                "digest": digest.as_str(),
                "resolvedAt": "2023-11-14T22:13:20Z",
                "checkedAt": "2023-11-14T22:13:20Z",
                "state": "Fresh",
            })
        );

        let copy = |version: &str| format!("cache.example/m/registry.example/team/app-{version}");
        let fields = MirrorFields {
            current: Some(Mirrored {
                location: copy("v3"),
                at: at(1_700_000_300, 0),
            }),
            superseded: vec![Superseded {
                location: copy("v2"),
                since: at(1_700_000_300, 0),
            }],
            deleted: Some(MirrorDeletion {
                location: copy("v1"),
                at: at(1_700_000_200, 0),
            }),
        };
        assert_eq!(
            json_of(mirror_patch(&full.key, &fields)),
            json!({
                "apiVersion": "holdfast.dev/v1alpha1",
                "kind": "DigestCacheEntry",
                "metadata": {"name": name},
                "spec": {
                    "mirror": copy("v3"),
                    "mirroredAt": "2023-11-14T22:18:20Z",
                    "mirrorSuperseded": [{"location": copy("v2"), "since": "2023-11-14T22:18:20Z"}],
                    "mirrorDeleted": copy("v1"),
                    "mirrorDeletedAt": "2023-11-14T22:16:40Z",
                },
            })
        );
        assert_eq!(
            json_of(mirror_patch(&full.key, &MirrorFields::default()))["spec"],
            json!({})
        );
    }

    /// An object that does not parse (a bad digest, scope or time) is skipped, and the others
    /// still load.
    #[test]
    fn objects_that_do_not_parse_are_skipped() {
        let now = SystemTime::now();
        let entry = tag_entry(b"x", now);
        let broken = |field: &str, value: Value| {
            let mut object = json_of(to_object(&entry));
            object["spec"][field] = value;
            serde_json::from_value::<DynamicObject>(object).unwrap()
        };
        let replica = DigestCache::new(Arc::new(crate::testing::Unreachable), Default::default(), None);
        for object in [
            broken("digest", json!("sha256:nope")),
            broken("scope", json!("someone")),
            broken("checkedAt", json!("yesterday")),
            broken("mirroredAt", json!(3)),
        ] {
            assert!(from_object(&object).is_none(), "{:?}", object.data);
            load(&replica, &object);
        }
        assert!(replica.entries().is_empty());
        load(&replica, &broken("tag", json!("1.0")));
        assert_eq!(replica.entries().len(), 1);
    }
}

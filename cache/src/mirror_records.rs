//! The controller's mirror records on the cache's entries (see the parent module's docs): the
//! current copy of each entry, the copies it superseded, the deletions retention recorded; how
//! they are loaded, recorded, persisted and read.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{CacheKey, DigestCache};
use holdfast_registry::Digest;

/// Where an entry's content was copied in the mirror, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mirrored {
    /// `<mirror>/<prefix>/<source host>/<source repository>@sha256:…`.
    pub location: String,
    /// When the copy completed.
    pub at: SystemTime,
}

impl Mirrored {
    /// Whether this records a copy of `digest` (not of a digest the tag held before).
    pub fn holds(&self, digest: &Digest) -> bool {
        self.location
            .rsplit_once('@')
            .is_some_and(|(_, held)| held == digest.as_str())
    }
}

/// A mirror copy the controller deleted (retention, see `holdfast_controller::retention`):
/// recorded on every entry whose record named it, so that no replica pins to it any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorDeletion {
    /// The deleted copy (`<mirror>/<prefix>/…@sha256:…`).
    pub location: String,
    /// When it was decided; a copy recorded later (the content was copied again) wins.
    pub at: SystemTime,
}

/// A copy an entry recorded before its tag moved and the new digest's copy was recorded in its
/// place: still in the mirror (objects may still be pinned to it) until retention deletes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superseded {
    /// `<mirror>/<prefix>/…@sha256:…`.
    pub location: String,
    /// When it stopped being the entry's record (or was recorded again after a deletion that
    /// did not happen).
    pub since: SystemTime,
}

/// Everything the controller records on one entry about the mirror, persisted in one write
/// ([`EntrySink::persist_mirror`](super::EntrySink::persist_mirror)): the current copy, the
/// superseded ones, the last deletion.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MirrorFields {
    pub current: Option<Mirrored>,
    pub superseded: Vec<Superseded>,
    pub deleted: Option<MirrorDeletion>,
}

/// One entry's copies in memory.
#[derive(Debug, Clone, Default)]
pub(super) struct Copies {
    current: Option<Mirrored>,
    superseded: Vec<Superseded>,
    /// Recorded by this cache (the leader): loads of the key's object are echoes, ignored.
    recorded_here: bool,
}

impl Copies {
    /// `mirrored` becomes the current copy; the one it replaces (another location) is superseded.
    fn copied(&mut self, mirrored: Mirrored) {
        if let Some(previous) = self.current.take().filter(|p| p.location != mirrored.location) {
            self.supersede(previous.location, mirrored.at);
        }
        self.superseded.retain(|s| s.location != mirrored.location);
        self.current = Some(mirrored);
    }

    /// Adds `location` to the superseded copies, unless it is the current one or already there.
    fn supersede(&mut self, location: String, since: SystemTime) {
        let held = self.current.as_ref().is_some_and(|c| c.location == location)
            || self.superseded.iter().any(|s| s.location == location);
        if !held {
            self.superseded.push(Superseded { location, since });
        }
    }

    /// Drops the copy `deleted` names, unless it was recorded after the deletion was decided;
    /// whether anything was dropped.
    fn deleted(&mut self, deleted: &MirrorDeletion) -> bool {
        let before = (self.current.is_some(), self.superseded.len());
        if self
            .current
            .as_ref()
            .is_some_and(|c| c.location == deleted.location && c.at <= deleted.at)
        {
            self.current = None;
        }
        self.superseded
            .retain(|s| !(s.location == deleted.location && s.since <= deleted.at));
        before != (self.current.is_some(), self.superseded.len())
    }
}

impl DigestCache {
    /// Loads `key`'s mirror records as a persisted object holds them, replacing those held: the
    /// leader deletes copies in passes whose writes may merge (only the last deletion reaches
    /// the object) and a re-list skips states, so only the object's whole fields say what is
    /// left. A held current copy recorded later than the object's is kept (the object lags),
    /// unless its deletion is recorded. Keys this cache recorded itself ([`Self::record_mirrored`]
    /// and the like: the leader, the only writer) are left alone: their objects only echo those
    /// writes, possibly an older one.
    pub fn load_mirror(&self, key: CacheKey, fields: MirrorFields) {
        let mut records = self.mirrored.write().unwrap_or_else(|e| e.into_inner());
        let copies = records.entry(key).or_default();
        if copies.recorded_here {
            return;
        }
        let current = match (copies.current.clone(), fields.current) {
            (Some(held), Some(loaded)) if held.at > loaded.at => Some(held),
            (_, loaded) => loaded,
        };
        let mut loaded = Copies {
            current,
            ..Copies::default()
        };
        for copy in fields.superseded {
            loaded.supersede(copy.location, copy.since);
        }
        if let Some(deleted) = &fields.deleted {
            loaded.deleted(deleted);
        }
        let changed = (&loaded.current, &loaded.superseded) != (&copies.current, &copies.superseded);
        *copies = loaded;
        if changed {
            drop(records);
            self.changed();
        }
    }

    /// Records that the content of `key`'s entry is in the mirror (the copy it recorded before,
    /// of a digest the tag held earlier, is superseded), and persists the record.
    pub fn record_mirrored(&self, key: &CacheKey, mirrored: Mirrored) {
        self.change_copies(key, None, |copies| copies.copied(mirrored));
    }

    /// Records that `deleted.location` is being deleted from the mirror: `key`'s record of that
    /// copy (current or superseded) is dropped (answers stop naming it) and the deletion is
    /// persisted.
    pub fn record_mirror_deleted(&self, key: &CacheKey, deleted: MirrorDeletion) {
        self.change_copies(key, Some(deleted.clone()), |copies| {
            copies.deleted(&deleted);
        });
    }

    /// Records `location` again on `key` after a deletion that did not happen (retention found
    /// it referenced, or the mirror refused): superseded when `key` records another copy now,
    /// else its current copy.
    pub fn restore_mirror_copy(&self, key: &CacheKey, location: &str, at: SystemTime) {
        self.change_copies(key, None, |copies| match &copies.current {
            Some(current) if current.location != location => copies.supersede(location.to_owned(), at),
            _ => {
                copies.current = Some(Mirrored {
                    location: location.to_owned(),
                    at,
                })
            }
        });
    }

    /// Applies `change` to `key`'s copies and persists them whole, with `deleted` (the
    /// persisted order is the order of the changes).
    fn change_copies(
        &self,
        key: &CacheKey,
        deleted: Option<MirrorDeletion>,
        change: impl FnOnce(&mut Copies),
    ) {
        let mut records = self.mirrored.write().unwrap_or_else(|e| e.into_inner());
        let copies = records.entry(key.clone()).or_default();
        copies.recorded_here = true;
        change(copies);
        if let Some(sink) = &self.sink {
            sink.persist_mirror(
                key,
                &MirrorFields {
                    current: copies.current.clone(),
                    superseded: copies.superseded.clone(),
                    deleted,
                },
            );
        }
        drop(records);
        self.changed();
    }

    /// Every copy recorded on an entry, current or superseded, with the key of its entry
    /// (what retention knows of the mirror).
    pub fn recorded_copies(&self) -> Vec<(CacheKey, String)> {
        let records = self.mirrored.read().unwrap_or_else(|e| e.into_inner());
        let mut copies = Vec::new();
        for (key, held) in records.iter() {
            let superseded = held.superseded.iter().map(|s| &s.location);
            for location in held.current.iter().map(|c| &c.location).chain(superseded) {
                copies.push((key.clone(), location.clone()));
            }
        }
        copies
    }

    /// The mirror record of the entry with exactly `key` (no anonymous fallback).
    pub fn mirrored(&self, key: &CacheKey) -> Option<Mirrored> {
        self.mirrored
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .and_then(|copies| copies.current.clone())
    }

    /// The current mirror record of the entry serving `key` (see [`DigestCache::get`]),
    /// whatever digest it holds: after a tag moved, the old digest's copy until the new one is
    /// recorded.
    pub fn serving_record(&self, key: &CacheKey) -> Option<Mirrored> {
        self.get(key).and_then(|entry| self.mirrored(&entry.key))
    }

    /// `key`'s mirror record if it holds `digest`.
    pub fn mirror_of(&self, key: &CacheKey, digest: &Digest) -> Option<Mirrored> {
        self.mirrored(key).filter(|m| m.holds(digest))
    }
}

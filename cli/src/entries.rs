//! The digest cache as the cluster holds it: the `DigestCacheEntry` objects in holdfast's
//! namespace, by key, with the status the controller wrote.

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use holdfast_cache::{
    CacheEntry, CacheKey,
    cluster_store::{self, ConditionStatus, DigestCacheEntry},
};
use kube::{ResourceExt, api::DynamicObject};

/// One entry: its object's name, what it holds, and the controller's status.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub object: DigestCacheEntry,
    pub entry: CacheEntry,
}

impl Entry {
    /// Whether the last registry check failed (the digest is served stale, or no longer).
    pub fn is_stale(&self) -> bool {
        self.entry.error.is_some()
    }

    /// Whether the controller says the staleness limit has run out (references naming it are
    /// then left unpinned).
    pub fn staleness_exceeded(&self) -> bool {
        self.condition("Stale")
            .is_some_and(|c| c.status == ConditionStatus::True && c.reason == "StalenessExceeded")
    }

    /// Until when a stale entry is served (its status; `None` before the controller wrote one).
    pub fn serve_stale_until(&self) -> Option<SystemTime> {
        self.object
            .status
            .as_ref()
            .and_then(|s| s.serve_stale_until)
            .map(|t| t.0)
    }

    /// Where the current digest's content was copied in the mirror.
    pub fn mirror_copy(&self) -> Option<&str> {
        let mirror = self.object.spec.mirror.mirror.as_deref()?;
        mirror
            .rsplit_once('@')
            .is_some_and(|(_, digest)| digest == self.entry.digest.as_str())
            .then_some(mirror)
    }

    pub fn condition(&self, type_: &str) -> Option<&cluster_store::Condition> {
        self.object
            .status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }

    /// How many objects name it, as the controller counted.
    pub fn used_by(&self) -> Option<u32> {
        self.object.status.as_ref().and_then(|s| s.used_by)
    }
}

/// Every entry, by key.
#[derive(Debug, Default)]
pub struct Entries {
    by_key: HashMap<CacheKey, Entry>,
}

impl Entries {
    /// The entries among `objects`; an object that does not parse is reported on standard error
    /// and skipped (the webhook and the controller skip it too).
    pub fn from_objects(objects: &[DynamicObject]) -> Self {
        let mut by_key = HashMap::new();
        for object in objects {
            match cluster_store::parse(object) {
                Ok(parsed) => {
                    let entry = CacheEntry::from(&parsed.spec);
                    by_key.insert(
                        entry.key.clone(),
                        Entry {
                            name: object.name_any(),
                            object: parsed,
                            entry,
                        },
                    );
                }
                Err(error) => eprintln!(
                    "warning: DigestCacheEntry {} does not parse: {error}",
                    object.name_any()
                ),
            }
        }
        Self { by_key }
    }

    pub fn get(&self, key: &CacheKey) -> Option<&Entry> {
        self.by_key.get(key)
    }

    /// Every entry, in key order.
    pub fn all(&self) -> Vec<&Entry> {
        let mut all: Vec<&Entry> = self.by_key.values().collect();
        all.sort_by(|a, b| a.entry.key.cmp(&b.entry.key));
        all
    }

    /// The entries of `reference` (normalised as keys are), in every scope and selection.
    pub fn of_reference(&self, reference: &str) -> Vec<&Entry> {
        self.all()
            .into_iter()
            .filter(|e| e.entry.key.reference == reference)
            .collect()
    }
}

/// `3m ago`, `in 2h`, for people.
pub fn relative(time: SystemTime, now: SystemTime) -> String {
    match time.duration_since(now) {
        Ok(ahead) => format!("in {}", short(ahead)),
        Err(behind) => format!("{} ago", short(behind.duration())),
    }
}

/// `45s`, `3m`, `2h5m`, `3d4h`.
pub fn short(duration: Duration) -> String {
    let s = duration.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_kubectl_prints_ages() {
        assert_eq!(short(Duration::from_secs(45)), "45s");
        assert_eq!(short(Duration::from_secs(200)), "3m");
        assert_eq!(short(Duration::from_secs(7500)), "2h5m");
        assert_eq!(short(Duration::from_secs(3 * 86400 + 4 * 3600)), "3d4h");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(relative(now - Duration::from_secs(120), now), "2m ago");
        assert_eq!(relative(now + Duration::from_secs(120), now), "in 2m");
    }
}

//! What holdfast did to one object, and why: a pure function of the object as stored, whether
//! its namespace is served, and the cluster's digest cache. `status` counts these reports,
//! `explain` prints one.

use holdfast_cache::CacheKey;
use holdfast_pins::{
    Need, OriginalRefs, PinPolicy, PinnedKind, fetch_sites, plan, repin::originals, resolve::site_key,
};
use serde_json::Value;

use crate::entries::{Entries, Entry};

/// Whether holdfast's webhook serves the object's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    Yes,
    /// Not served: why, in words (the selector and the namespace's labels).
    No(String),
}

/// The object as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ObjectState {
    /// Every reference holdfast can pin is pinned, from fresh entries.
    Pinned,
    /// Pinned, and some reference points into the mirror.
    PinnedToMirror,
    /// Pinned, but some entry's last registry check failed (served stale).
    PinnedStale,
    /// Some reference is a tag holdfast has not pinned.
    Unpinned,
    /// `holdfast.dev/pin: disabled`.
    OptedOut,
    /// Its namespace is not served.
    Ignored,
    /// No reference to pin: none, or only digests the user wrote.
    NothingToPin,
}

impl ObjectState {
    /// Whether an operator should look (`status` exits 1).
    pub fn needs_attention(self) -> bool {
        matches!(self, Self::Unpinned | Self::PinnedStale)
    }

    pub fn words(self) -> &'static str {
        match self {
            Self::Pinned => "pinned",
            Self::PinnedToMirror => "pinned to the mirror",
            Self::PinnedStale => "pinned from a stale entry",
            Self::Unpinned => "not pinned",
            Self::OptedOut => "opted out",
            Self::Ignored => "in a namespace holdfast ignores",
            Self::NothingToPin => "nothing to pin",
        }
    }
}

/// One fetch reference.
#[derive(Debug, Clone)]
pub struct SiteReport<'a> {
    /// `spec.fetch[0].image.url`.
    pub field: String,
    /// As the user wrote it (from `holdfast.dev/original-refs` when holdfast pinned it).
    pub written: String,
    /// As stored now.
    pub stored: String,
    pub pin: SitePin,
    /// The cache key it is (or would be) resolved under, and the entry the cluster holds for it.
    pub key: Option<CacheKey>,
    pub entry: Option<&'a Entry>,
}

/// What holds the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SitePin {
    /// holdfast pinned it: the digest, and the mirror repository when pinned into the mirror.
    Holdfast { digest: String, mirror: Option<String> },
    /// The user wrote a digest: holdfast never touches it.
    UserDigest,
    /// A tag, not pinned: why.
    Unpinned(String),
}

/// The whole report.
#[derive(Debug, Clone)]
pub struct ObjectReport<'a> {
    pub policy: PinPolicy,
    pub state: ObjectState,
    pub sites: Vec<SiteReport<'a>>,
    /// Why, in words, for the object as a whole.
    pub why: String,
}

/// The report of `object` (of `kind`, in `namespace`).
pub fn report<'a>(
    kind: PinnedKind,
    object: &Value,
    namespace: &str,
    served: &Served,
    entries: &'a Entries,
) -> ObjectReport<'a> {
    let (policy, _) = PinPolicy::from_object(object);
    let recorded = OriginalRefs::from_object(object).unwrap_or_default();
    let written = originals(object);
    let written_sites = fetch_sites(kind, &written);
    let mut sites = Vec::new();
    for site in fetch_sites(kind, object) {
        let pointer = site.pointer.to_string();
        let original = written_sites.iter().find(|w| w.pointer == site.pointer);
        let in_place = recorded.get(&pointer).filter(|r| r.is_in_place(object, &pointer));
        let (pin, key) = match (in_place, plan(&site)) {
            (Some(record), _) => (
                SitePin::Holdfast {
                    digest: record.digest.to_string(),
                    mirror: record.mirror.clone(),
                },
                original.and_then(|o| site_key(o, namespace)),
            ),
            (None, Ok(Need::AlreadyPinned)) => (SitePin::UserDigest, None),
            (None, Err(error)) => (SitePin::Unpinned(error.to_string()), None),
            (None, Ok(_)) => (SitePin::Unpinned(String::new()), site_key(&site, namespace)),
        };
        let entry = key.as_ref().and_then(|key| entries.get(key));
        let pin = match pin {
            SitePin::Unpinned(reason) if reason.is_empty() => {
                SitePin::Unpinned(why_unpinned(policy, served, entry))
            }
            pin => pin,
        };
        sites.push(SiteReport {
            field: site.field.clone(),
            written: original.map_or_else(|| site.reference.clone(), |o| o.reference.clone()),
            stored: site.reference.clone(),
            pin,
            key,
            entry,
        });
    }
    let holdfast = || sites.iter().filter(|s| matches!(s.pin, SitePin::Holdfast { .. }));
    let state = if policy == PinPolicy::Disabled {
        ObjectState::OptedOut
    } else if matches!(served, Served::No(_)) {
        ObjectState::Ignored
    } else if sites.iter().any(|s| matches!(s.pin, SitePin::Unpinned(_))) {
        ObjectState::Unpinned
    } else if holdfast().any(|s| s.entry.is_some_and(Entry::is_stale)) {
        ObjectState::PinnedStale
    } else if holdfast().any(|s| matches!(&s.pin, SitePin::Holdfast { mirror: Some(_), .. })) {
        ObjectState::PinnedToMirror
    } else if holdfast().next().is_some() {
        ObjectState::Pinned
    } else {
        ObjectState::NothingToPin
    };
    let why = match state {
        ObjectState::OptedOut => "it is opted out: holdfast.dev/pin is disabled (a label, or an annotation); neither the webhook nor the controller pins it".to_owned(),
        ObjectState::Ignored => match served {
            Served::No(why) => why.clone(),
            Served::Yes => String::new(),
        },
        ObjectState::Unpinned => "some references are not pinned; see each reference".to_owned(),
        ObjectState::PinnedStale => "pinned, but the registry failed on the last check of an entry: the digest is served from the cache until the staleness limit; see the entry's Stale condition".to_owned(),
        ObjectState::PinnedToMirror => "pinned; some references point at holdfast's mirror copy of their content".to_owned(),
        ObjectState::Pinned => match policy {
            PinPolicy::Freeze => "pinned, and frozen (holdfast.dev/pin: freeze): the digest stays until the reference is changed".to_owned(),
            _ => "pinned; the controller re-pins when a tag moves (holdfast.dev/pin: follow, the default)".to_owned(),
        },
        ObjectState::NothingToPin => "nothing to pin: no OCI image or imgpkg bundle reference with a tag".to_owned(),
    };
    ObjectReport {
        policy,
        state,
        sites,
        why,
    }
}

/// Why a tag is not pinned, from what the cluster shows.
fn why_unpinned(policy: PinPolicy, served: &Served, entry: Option<&Entry>) -> String {
    if policy == PinPolicy::Disabled {
        return "opted out (holdfast.dev/pin: disabled)".to_owned();
    }
    if let Served::No(why) = served {
        return why.clone();
    }
    match entry {
        None => "no digest cache entry: the registry has not answered holdfast for it (see the Events: PinFailed says what the registry said)".to_owned(),
        Some(entry) if entry.staleness_exceeded() => format!(
            "the registry fails ({}) and the cached digest is older than the controller's --cache-max-staleness-seconds allows",
            entry.entry.error.as_deref().unwrap_or("no error recorded")
        ),
        Some(entry) => format!(
            "the cache holds {} for it, but it was admitted unpinned (the webhook was unreachable or past its deadline): the controller's catch-up pins it",
            entry.entry.digest
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use holdfast_cache::{
        CacheEntry, Scope,
        cluster_store::{DigestCacheEntry, DigestCacheEntrySpec},
    };
    use kube::api::DynamicObject;
    use serde_json::json;

    use super::*;

    const DIGEST: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    fn app(url: &str, annotations: Value, labels: Value) -> Value {
        json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
            "metadata": {"name": "a", "namespace": "team", "annotations": annotations, "labels": labels},
            "spec": {"fetch": [{"image": {"url": url}}, {"git": {"url": "https://example.com/repo"}}]},
        })
    }

    fn pinned() -> Value {
        let record = json!({"/spec/fetch/0/image/url": {"ref": "reg.io/team/app:1.0", "digest": DIGEST}});
        app(
            &format!("reg.io/team/app@{DIGEST}"),
            json!({"holdfast.dev/original-refs": record.to_string()}),
            json!({}),
        )
    }

    fn entries(error: Option<&str>) -> Entries {
        let key = CacheKey::tag(&"reg.io/team/app:1.0".parse().unwrap(), Scope::Anonymous);
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let entry = CacheEntry {
            error: error.map(str::to_owned),
            ..CacheEntry::resolved(key, DIGEST.parse().unwrap(), at)
        };
        let object = DigestCacheEntry::new("e1", DigestCacheEntrySpec::from(&entry));
        let object: DynamicObject = serde_json::from_value(serde_json::to_value(object).unwrap()).unwrap();
        Entries::from_objects(&[object])
    }

    #[test]
    fn a_pinned_app_names_its_digest_and_entry() {
        let entries = entries(None);
        let report = report(PinnedKind::App, &pinned(), "team", &Served::Yes, &entries);
        assert_eq!(report.state, ObjectState::Pinned);
        assert_eq!(
            report.sites.len(),
            1,
            "the git source is not a reference holdfast pins"
        );
        let site = &report.sites[0];
        assert_eq!(site.written, "reg.io/team/app:1.0");
        assert_eq!(site.stored, format!("reg.io/team/app@{DIGEST}"));
        assert_eq!(
            site.pin,
            SitePin::Holdfast {
                digest: DIGEST.into(),
                mirror: None
            }
        );
        assert_eq!(site.entry.map(|e| e.name.as_str()), Some("e1"));
    }

    #[test]
    fn a_stale_entry_makes_the_app_pinned_stale_and_needing_attention() {
        let entries = entries(Some("503"));
        let report = report(PinnedKind::App, &pinned(), "team", &Served::Yes, &entries);
        assert_eq!(report.state, ObjectState::PinnedStale);
        assert!(report.state.needs_attention());
    }

    #[test]
    fn an_ignored_namespace_and_an_opt_out_say_so() {
        let entries = Entries::default();
        let tagged = app("reg.io/team/app:1.0", json!({}), json!({}));
        let served = Served::No("namespace kube-system is not served".into());
        let report = report(PinnedKind::App, &tagged, "kube-system", &served, &entries);
        assert_eq!(report.state, ObjectState::Ignored);
        assert_eq!(report.why, "namespace kube-system is not served");
        assert!(!report.state.needs_attention());
        let opted_out = app(
            "reg.io/team/app:1.0",
            json!({}),
            json!({"holdfast.dev/pin": "disabled"}),
        );
        let report = super::report(PinnedKind::App, &opted_out, "team", &Served::Yes, &entries);
        assert_eq!(report.state, ObjectState::OptedOut);
        assert!(matches!(&report.sites[0].pin, SitePin::Unpinned(why) if why.contains("opted out")));
    }

    #[test]
    fn an_unpinned_tag_says_whether_the_cache_has_it() {
        let tagged = app("reg.io/team/app:1.0", json!({}), json!({}));
        let none = Entries::default();
        let report = report(PinnedKind::App, &tagged, "team", &Served::Yes, &none);
        assert_eq!(report.state, ObjectState::Unpinned);
        assert!(
            matches!(&report.sites[0].pin, SitePin::Unpinned(why) if why.contains("no digest cache entry"))
        );
        let held = entries(None);
        let report = super::report(PinnedKind::App, &tagged, "team", &Served::Yes, &held);
        assert!(matches!(&report.sites[0].pin, SitePin::Unpinned(why) if why.contains("catch-up")));
    }

    #[test]
    fn a_digest_the_user_wrote_is_theirs_and_an_invalid_reference_says_why() {
        let theirs = app(&format!("reg.io/team/app@{DIGEST}"), json!({}), json!({}));
        let none = Entries::default();
        let report = report(PinnedKind::App, &theirs, "team", &Served::Yes, &none);
        assert_eq!(report.sites[0].pin, SitePin::UserDigest);
        assert_eq!(report.state, ObjectState::NothingToPin);
        let invalid = app("reg.io/Team/App:1.0", json!({}), json!({}));
        let report = super::report(PinnedKind::App, &invalid, "team", &Served::Yes, &none);
        assert!(
            matches!(&report.sites[0].pin, SitePin::Unpinned(why) if why.contains("not a valid image reference"))
        );
    }
}

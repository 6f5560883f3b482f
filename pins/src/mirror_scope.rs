//! Which objects are pinned to the mirror, and where its copies live: the decisions the webhook
//! and the controller share, pure functions of the mirror settings (`--mirror-registry`,
//! `--mirror-prefix`, `--mirror-namespace-selector`, `--mirror-pull-secret`).
//!
//! - **Namespaces.** Objects are pinned to the mirror only in namespaces whose labels match the
//!   selector (empty: every namespace); elsewhere they stay pinned upstream, and the controller
//!   moves `follow` pins back upstream when a namespace stops matching. A selector rather than a
//!   fixed label, so a platform can reuse the labels its namespaces already carry (a tier, a
//!   tenant class) instead of adding one.
//! - **Public content** (resolved anonymously) is copied to `<mirror>/<prefix>/<host>/<repository>`
//!   and serves every selected namespace, as its cache entry does.
//! - **Private content** (resolved with a `secretRef`) is mirrored only when a mirror pull
//!   Secret is configured: the controller copies it, with the tenant's Secret, into
//!   `<mirror>/<prefix>/namespaces/<namespace>/<host>/<repository>`, and a pinned site's
//!   `secretRef` then names the pull Secret (which the platform provides in every selected
//!   namespace) instead of the tenant's; `holdfast.dev/original-refs` keeps the tenant's name.
//!   The tenant's Secret is never copied. A namespace is only ever pinned to its own path (its
//!   cache entries are keyed by its own Secrets), so with pull credentials that can read only
//!   their namespace's path the mirror serves a private copy to no one who could not fetch it
//!   upstream. `namespaces` is never a source host component (those hold a `.` or a `_`, or are
//!   `localhost`), so the paths of private copies cannot meet those of public ones.
//! - **The copier** as re-pinning sees it: which registries it copies from ([`selects`],
//!   `--mirror-source-registry`), the copies it gave up on ([`Copying`]), and when a `follow` pin
//!   waits on its old copy for the new one ([`stays_on_mirror`]).

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    str::FromStr,
    sync::RwLock,
};

use holdfast_cache::{Mirrored, Scope};
use holdfast_registry::{Digest, Reference, mirror::MirrorLocation};
use kube::core::{Expression, Selector, SelectorExt};

use crate::Resolution;

/// The path component under the prefix that holds the copies of private content, by namespace.
pub const NAMESPACED: &str = "namespaces";

/// The mirror as pinning sees it: where copies are, which namespaces are pinned to them, and
/// the Secret private copies are pulled with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorPins {
    pub location: MirrorLocation,
    pub namespaces: NamespaceSelector,
    /// The Secret, in every selected namespace, that pulls from the mirror; without it content
    /// resolved with a `secretRef` is neither copied nor pinned to the mirror.
    pub pull_secret: Option<String>,
}

impl MirrorPins {
    /// Every namespace, public content only.
    pub fn new(location: MirrorLocation) -> Self {
        Self {
            location,
            namespaces: NamespaceSelector::default(),
            pull_secret: None,
        }
    }

    /// Whether objects in a namespace with these labels are pinned to the mirror.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces.matches(labels)
    }

    /// Where content resolved with `scope` is copied; `None` for private content without a
    /// pull Secret, or a namespace that makes no valid repository path.
    pub fn location_for(&self, scope: &Scope) -> Option<MirrorLocation> {
        match scope {
            Scope::Anonymous => Some(self.location.clone()),
            Scope::Secret { namespace, .. } => {
                self.pull_secret.as_ref()?;
                let prefix = match self.location.prefix() {
                    "" => format!("{NAMESPACED}/{namespace}"),
                    prefix => format!("{prefix}/{NAMESPACED}/{namespace}"),
                };
                MirrorLocation::new(self.location.registry(), &prefix).ok()
            }
        }
    }

    /// The mirror repository to pin `source` at `digest` to, for a site resolved with `scope`
    /// whose entry carries `recorded`, and the Secret its `secretRef` must then name (`Some`
    /// for a site with a `secretRef`: the tenant's credentials are for the upstream registry).
    /// A private site takes its namespace's copy, or the public one when its content was also
    /// resolvable anonymously; a public site only the public copy.
    pub fn pin_target(
        &self,
        scope: &Scope,
        source: &Reference,
        digest: &Digest,
        recorded: Option<&Mirrored>,
    ) -> Option<(String, Option<String>)> {
        match scope {
            Scope::Anonymous => mirror_repository(&self.location, source, digest, recorded)
                .map(|repository| (repository, None)),
            Scope::Secret { .. } => {
                let pull = self.pull_secret.clone()?;
                [self.location_for(scope)?, self.location.clone()]
                    .iter()
                    .find_map(|location| mirror_repository(location, source, digest, recorded))
                    .map(|repository| (repository, Some(pull)))
            }
        }
    }
}

/// A label selector over namespaces, in `kubectl get -l` syntax: `key=value`, `key==value`,
/// `key!=value`, `key in (a,b)`, `key notin (a,b)`, `key`, `!key`, joined by commas (all must
/// hold). Empty selects everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceSelector {
    text: String,
    selector: Selector,
}

/// Why a selector does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("label selector requirement {requirement:?}: {reason}")]
pub struct SelectorError {
    pub requirement: String,
    pub reason: String,
}

impl NamespaceSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.selector.matches(labels)
    }

    /// Whether every namespace is selected.
    pub fn selects_all(&self) -> bool {
        self.selector.selects_all()
    }
}

impl fmt::Display for NamespaceSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for NamespaceSelector {
    type Err = SelectorError;

    fn from_str(text: &str) -> Result<Self, SelectorError> {
        let text = text.trim();
        let mut expressions = Vec::new();
        if !text.is_empty() {
            for requirement in split_requirements(text) {
                expressions.push(expression(requirement.trim())?);
            }
        }
        Ok(Self {
            text: text.to_owned(),
            selector: expressions.into_iter().collect(),
        })
    }
}

/// `text` split at the commas outside parentheses.
fn split_requirements(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn expression(requirement: &str) -> Result<Expression, SelectorError> {
    let invalid = |reason: &str| SelectorError {
        requirement: requirement.to_owned(),
        reason: reason.to_owned(),
    };
    if let Some(key) = requirement.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(label_key(key.trim()).map_err(invalid)?));
    }
    if let Some((key, value)) = requirement.split_once("!=") {
        return Ok(Expression::NotEqual(
            label_key(key.trim()).map_err(invalid)?,
            label_value(value.trim()).map_err(invalid)?,
        ));
    }
    if let Some((key, value)) = requirement
        .split_once("==")
        .or_else(|| requirement.split_once('='))
    {
        return Ok(Expression::Equal(
            label_key(key.trim()).map_err(invalid)?,
            label_value(value.trim()).map_err(invalid)?,
        ));
    }
    let Some((head, rest)) = requirement.split_once('(') else {
        return Ok(Expression::Exists(label_key(requirement).map_err(invalid)?));
    };
    let inner = rest
        .strip_suffix(')')
        .ok_or_else(|| invalid("a value list must end with ')'"))?;
    let values = inner
        .split(',')
        .map(|v| label_value(v.trim()))
        .collect::<Result<_, _>>()
        .map_err(invalid)?;
    match head.split_whitespace().collect::<Vec<_>>()[..] {
        [key, "in"] => Ok(Expression::In(label_key(key).map_err(invalid)?, values)),
        [key, "notin"] => Ok(Expression::NotIn(label_key(key).map_err(invalid)?, values)),
        _ => Err(invalid("expected `key in (…)` or `key notin (…)`")),
    }
}

fn label_key(key: &str) -> Result<String, &'static str> {
    let valid = !key.is_empty()
        && key.len() <= 317
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
    valid
        .then(|| key.to_owned())
        .ok_or("a label key is letters, digits, '.', '_', '-' and one optional '/'")
}

fn label_value(value: &str) -> Result<String, &'static str> {
    let valid = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    valid
        .then(|| value.to_owned())
        .ok_or("a label value is at most 63 letters, digits, '.', '_' and '-'")
}

/// Whether content from `source`'s registry is mirrored under `registries`
/// (`--mirror-source-registry`; empty: every registry). Docker Hub may be listed as
/// `docker.io`, `index.docker.io` or `registry-1.docker.io`.
pub fn selects(registries: &[String], source: &Reference) -> bool {
    const HUB: [&str; 3] = ["docker.io", "index.docker.io", "registry-1.docker.io"];
    registries.is_empty()
        || registries.iter().any(|listed| {
            let listed = listed.trim().to_ascii_lowercase();
            listed == source.registry().to_ascii_lowercase()
                || (source.is_docker_hub() && HUB.contains(&listed.as_str()))
        })
}

/// The mirror copier (the controller's leader) as re-pinning sees it: which registries it
/// copies from, and the copies it gave up on (a permanent failure: not tried again while the
/// copy stays wanted). Kept in memory, shared by the copier and the pinner: a new leader tries
/// every copy once more.
#[derive(Debug, Default)]
pub struct Copying {
    registries: Vec<String>,
    given_up: RwLock<HashSet<String>>,
    /// By mirror location, whether the bundle copied there had its images in its own repository
    /// upstream ([`Copying::record_colocated`]).
    colocated: RwLock<HashMap<String, bool>>,
}

/// Bundle copies whose upstream layout is remembered; the map is cleared when it is full (an
/// unknown layout is reported as possibly colocated).
const MAX_REMEMBERED_LAYOUTS: usize = 10_000;

impl Copying {
    /// The copier of `registries` (`--mirror-source-registry`; empty: every registry).
    pub fn new(registries: Vec<String>) -> Self {
        Self {
            registries,
            given_up: RwLock::default(),
            colocated: RwLock::default(),
        }
    }

    /// Records whether the bundle copied to `location` had every image of its ImagesLock in its
    /// own repository upstream (`holdfast_registry::mirror::CopyReport::colocated_upstream`).
    pub fn record_colocated(&self, location: &str, colocated: bool) {
        let mut layouts = self.colocated.write().unwrap_or_else(|e| e.into_inner());
        if layouts.len() >= MAX_REMEMBERED_LAYOUTS {
            layouts.clear();
        }
        layouts.insert(location.to_owned(), colocated);
    }

    /// Whether the bundle copied to `location` had its images in its own repository upstream;
    /// `None` when this copier did not see (another leader copied it, or it is not a bundle).
    pub fn colocated_upstream(&self, location: &str) -> Option<bool> {
        self.colocated
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(location)
            .copied()
    }

    /// Whether content from `source`'s registry is copied.
    pub fn copies_from(&self, source: &Reference) -> bool {
        selects(&self.registries, source)
    }

    /// Records that the copy to `location` failed permanently.
    pub fn give_up(&self, location: &str) {
        self.given_up
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(location.to_owned());
    }

    pub fn given_up(&self, location: &str) -> bool {
        self.given_up
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(location)
    }

    /// Forgets the given-up copies `wanted` rejects: one wanted again is tried once more.
    pub fn retain_given_up(&self, wanted: impl Fn(&str) -> bool) {
        self.given_up
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|location| wanted(location));
    }

    /// Whether the copy of `source`'s content to `location` is coming: its registry is copied
    /// from and the copier has not given up on it.
    pub fn coming(&self, source: &Reference, location: &str) -> bool {
        self.copies_from(source) && !self.given_up(location)
    }
}

/// Whether a `follow` site pinned to a mirror copy (`recorded`) stays there although its tag
/// now holds another digest (`fresh`) that is not mirrored yet: so that the object is updated
/// once, straight to the new copy when it is recorded, instead of twice (upstream now, to the
/// mirror after the copy) and pinned upstream meanwhile. Only while `coming(old copy, new copy)`
/// (the new one in the same mirror repository) says the copier is making the new copy (see
/// [`Copying::coming`]); a copy given up on lets the site go upstream. A pin to another mirror
/// (the configuration changed) does not stay.
pub fn stays_on_mirror(
    recorded: &Resolution,
    fresh: &Resolution,
    mirror: &MirrorLocation,
    coming: impl FnOnce(&str, &str) -> bool,
) -> bool {
    let Some(repository) = &recorded.mirror else {
        return false;
    };
    if fresh.mirror.is_some() || fresh.digest == recorded.digest {
        return false;
    }
    let ours = Reference::parse(repository).is_ok_and(|r| !r.is_pinned() && mirror.contains(&r));
    let (old, new) = (
        format!("{repository}@{}", recorded.digest),
        format!("{repository}@{}", fresh.digest),
    );
    ours && coming(&old, &new)
}

/// The mirror repository to pin `source` at `digest` to: `Some` only when `recorded` is the
/// copy of exactly that content in `mirror` (a record of another mirror, prefix or digest is
/// not used).
pub fn mirror_repository(
    mirror: &MirrorLocation,
    source: &Reference,
    digest: &Digest,
    recorded: Option<&Mirrored>,
) -> Option<String> {
    let recorded = recorded?;
    let expected = mirror.pinned_for(source, digest).ok()?;
    if recorded.location != expected {
        return None;
    }
    expected
        .rsplit_once('@')
        .map(|(repository, _)| repository.to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(text: &str) -> NamespaceSelector {
        text.parse().unwrap()
    }

    #[test]
    fn selectors_match_as_kubectl_reads_them() {
        let prod = labels(&[("holdfast.dev/mirror", "true"), ("tier", "prod")]);
        let dev = labels(&[("tier", "dev")]);
        let cases = [
            ("", true, true),
            ("holdfast.dev/mirror=true", true, false),
            ("holdfast.dev/mirror==true", true, false),
            ("tier!=prod", false, true),
            ("tier in (prod, staging)", true, false),
            ("tier notin (prod)", false, true),
            ("holdfast.dev/mirror", true, false),
            ("!holdfast.dev/mirror", false, true),
            ("tier in (prod,dev), !legacy", true, true),
            ("tier in (prod,dev),holdfast.dev/mirror=true", true, false),
        ];
        for (text, on_prod, on_dev) in cases {
            let parsed = selector(text);
            assert_eq!(
                (parsed.matches(&prod), parsed.matches(&dev)),
                (on_prod, on_dev),
                "{text:?}"
            );
            assert_eq!(parsed.to_string(), text.trim());
        }
        assert!(selector(" ").selects_all());
    }

    #[test]
    fn malformed_selectors_are_errors() {
        for text in [
            "a=b,,c=d",
            "tier in prod",
            "tier in (prod",
            "tier within (a)",
            "a b=c",
            "=x",
            "t=a b",
        ] {
            assert!(text.parse::<NamespaceSelector>().is_err(), "{text:?} parsed");
        }
    }

    fn pins(pull: Option<&str>) -> MirrorPins {
        MirrorPins {
            pull_secret: pull.map(str::to_owned),
            ..MirrorPins::new(MirrorLocation::new("cache.corp.com:5000", "m").unwrap())
        }
    }

    fn tenant(namespace: &str) -> Scope {
        Scope::Secret {
            namespace: namespace.into(),
            name: "creds".into(),
        }
    }

    #[test]
    fn private_content_goes_to_its_namespace_path_and_only_with_a_pull_secret() {
        assert_eq!(pins(None).location_for(&tenant("team-a")), None);
        let with = pins(Some("mirror-pull"));
        assert_eq!(with.location_for(&Scope::Anonymous), Some(with.location.clone()));
        let scoped = with.location_for(&tenant("team-a")).unwrap();
        assert_eq!(
            (scoped.registry(), scoped.prefix()),
            ("cache.corp.com:5000", "m/namespaces/team-a")
        );
        let bare = MirrorPins {
            pull_secret: Some("p".into()),
            ..MirrorPins::new(MirrorLocation::new("cache.corp.com", "").unwrap())
        };
        assert_eq!(bare.location_for(&tenant("b")).unwrap().prefix(), "namespaces/b");
    }

    #[test]
    fn a_site_is_pinned_only_to_a_copy_its_scope_may_read() {
        let source = Reference::parse("registry.corp.com/team/app:1").unwrap();
        let digest = Digest::sha256_of(b"a");
        let record = |location: &MirrorLocation| Mirrored {
            location: location.pinned_for(&source, &digest).unwrap(),
            at: SystemTime::now(),
        };
        let with = pins(Some("mirror-pull"));
        let public = record(&with.location);
        let team_a = record(&with.location_for(&tenant("team-a")).unwrap());
        let a_repo = "cache.corp.com:5000/m/namespaces/team-a/registry.corp.com/team/app";

        // A tenant's own copy, with the pull Secret written.
        assert_eq!(
            with.pin_target(&tenant("team-a"), &source, &digest, Some(&team_a)),
            Some((a_repo.to_owned(), Some("mirror-pull".to_owned())))
        );
        // Another namespace's copy is never used, by another tenant or anonymously.
        assert_eq!(
            with.pin_target(&tenant("team-b"), &source, &digest, Some(&team_a)),
            None
        );
        assert_eq!(
            with.pin_target(&Scope::Anonymous, &source, &digest, Some(&team_a)),
            None
        );
        // Public content serves a private site too, through the pull Secret.
        assert_eq!(
            with.pin_target(&tenant("team-b"), &source, &digest, Some(&public)),
            Some((
                "cache.corp.com:5000/m/registry.corp.com/team/app".to_owned(),
                Some("mirror-pull".to_owned())
            ))
        );
        assert_eq!(
            with.pin_target(&Scope::Anonymous, &source, &digest, Some(&public)),
            Some((
                "cache.corp.com:5000/m/registry.corp.com/team/app".to_owned(),
                None
            ))
        );
        // Without a pull Secret a private site stays upstream.
        assert_eq!(
            pins(None).pin_target(&tenant("team-a"), &source, &digest, Some(&public)),
            None
        );
    }

    fn resolution(seed: &str, mirror: Option<&str>) -> Resolution {
        Resolution {
            digest: holdfast_registry::Digest::sha256_of(seed.as_bytes()),
            selected_tag: None,
            mirror: mirror.map(str::to_owned),
            pull_secret: None,
        }
    }

    const REPO: &str = "cache.corp.com:5000/m/reg.io/team/app";

    fn mirror() -> MirrorLocation {
        MirrorLocation::new("cache.corp.com:5000", "m").unwrap()
    }

    #[test]
    fn a_mirror_pin_waits_for_its_moved_tags_copy_and_only_for_it() {
        let on_old_copy = resolution("v1", Some(REPO));
        let moved = resolution("v2", None);
        let old_copy = format!("{REPO}@{}", on_old_copy.digest);
        let new_copy = format!("{REPO}@{}", moved.digest);
        let asked = std::cell::RefCell::new(Vec::new());
        let coming = |old: &str, new: &str| {
            asked.borrow_mut().push((old.to_owned(), new.to_owned()));
            true
        };
        assert!(stays_on_mirror(&on_old_copy, &moved, &mirror(), coming));
        assert_eq!(
            *asked.borrow(),
            [(old_copy, new_copy)],
            "the old and the new digest's copies, same repository"
        );
        // Given up on (a permanent failure), or not being made: upstream it goes.
        assert!(!stays_on_mirror(&on_old_copy, &moved, &mirror(), |_, _| false));
        // The new copy is recorded: straight to it.
        let copied = resolution("v2", Some(REPO));
        assert!(!stays_on_mirror(&on_old_copy, &copied, &mirror(), |_, _| true));
        // Same digest, no copy (deleted, or the namespace left the mirror): upstream.
        let same = resolution("v1", None);
        assert!(!stays_on_mirror(&on_old_copy, &same, &mirror(), |_, _| true));
        // Pinned upstream, or to another mirror: nothing to wait on.
        let upstream = resolution("v1", None);
        assert!(!stays_on_mirror(&upstream, &moved, &mirror(), |_, _| true));
        let elsewhere = resolution("v1", Some("old-cache.corp.com/m/reg.io/team/app"));
        assert!(!stays_on_mirror(&elsewhere, &moved, &mirror(), |_, _| true));
    }

    #[test]
    fn the_copier_is_waited_on_for_its_registries_until_it_gives_up() {
        let source = holdfast_registry::Reference::parse("reg.io/team/app:1").unwrap();
        let hub = holdfast_registry::Reference::parse("nginx:1.25").unwrap();
        let copying = Copying::new(vec!["Reg.io".into()]);
        assert!(copying.coming(&source, "l1"));
        assert!(!copying.coming(&hub, "l2"), "a registry not copied from");
        assert!(Copying::new(vec!["docker.io".into()]).copies_from(&hub));
        assert!(Copying::default().copies_from(&hub), "none listed: all");
        copying.give_up("l1");
        assert!(!copying.coming(&source, "l1"));
        copying.retain_given_up(|location| location != "l1");
        assert!(copying.coming(&source, "l1"), "wanted again: tried once more");
    }
}

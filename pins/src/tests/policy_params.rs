//! What the controller publishes for the pinning policy (`crate::policy_params`): the
//! references objects write, the entries that may answer them, and that a published value is what
//! the webhook writes into the field.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use holdfast_cache::{
    CacheEntry, CacheKey, DigestCache, MirrorFields, Mirrored, Scope, testing::Unreachable,
};

use super::*;
use crate::policy_params::{
    DesiredPins, MAX_SHARD_BYTES, NamespaceState, Publishing, WrittenSite, desired, shards, written_sites,
};

const PUBLISHING: Publishing = Publishing {
    max_staleness: Duration::from_secs(7 * 24 * 3600),
    mirror: false,
};

fn reference(text: &str) -> holdfast_registry::Reference {
    holdfast_registry::Reference::parse(text).unwrap()
}

fn secret(namespace: &str, name: &str) -> Scope {
    Scope::Secret {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// A cache holding `entries` (reference as written, scope, digest seed, resolved at), which never
/// asks a registry.
fn cache(entries: &[(&str, Scope, u8, SystemTime)]) -> DigestCache {
    let cache = DigestCache::new(Arc::new(Unreachable), Default::default(), None);
    for (text, scope, seed, at) in entries {
        cache.insert(CacheEntry::resolved(
            CacheKey::tag(&reference(text), scope.clone()),
            digest(*seed),
            *at,
        ));
    }
    cache
}

fn sites_of(objects: &[(PinnedKind, Value)]) -> Vec<WrittenSite> {
    objects
        .iter()
        .flat_map(|(kind, object)| written_sites(*kind, object))
        .collect()
}

fn keys(sites: &[WrittenSite]) -> Vec<&str> {
    sites.iter().map(|site| site.key.as_str()).collect()
}

#[test]
fn an_object_writes_its_plain_tags_as_written_and_the_originals_of_its_pins() {
    let object = app(json!([
        {"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}},
        {"imgpkgBundle": {"image": "nginx:1.25"}},
        {"image": {"url": format!("registry.corp.com/team/pinned@{}", sha(4))}},
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {"constraints": ">=1.0.0"}}}},
        {"git": {"url": "https://git.corp.com/config"}},
        {"image": {"url": "Not A Reference"}},
    ]));
    let sites = written_sites(PinnedKind::App, &object);
    assert_eq!(
        keys(&sites),
        ["registry.corp.com/team/app-config:v1.2.0", "nginx:1.25"]
    );
    assert!(
        sites
            .iter()
            .all(|s| s.scope == Scope::Anonymous && !s.private_object)
    );
    assert!(sites.iter().all(|s| s.namespace == "apps"));

    // Pinned by the webhook: the originals recorded in place are what it writes.
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(written_sites(PinnedKind::App, &pinned), sites);
    // Frozen, too: a new object writing the same tag is pinned to the tag's digest now.
    let frozen = with_metadata(pinned.clone(), "labels", json!({PIN_KEY: "freeze"}));
    assert_eq!(written_sites(PinnedKind::App, &frozen), sites);
    // Opted out, or being deleted: nothing.
    let disabled = with_metadata(object.clone(), "labels", json!({PIN_KEY: "disabled"}));
    assert!(written_sites(PinnedKind::App, &disabled).is_empty());
    let deleting = with_metadata(object, "deletionTimestamp", json!("2026-12-06T10:00:00Z"));
    assert!(written_sites(PinnedKind::App, &deleting).is_empty());
}

#[test]
fn a_source_naming_a_secret_is_keyed_with_it_and_marks_its_object_private() {
    let object = pkgr(
        json!({"imgpkgBundle": {"image": "registry.corp.com/pkgs/repo-bundle:1.4.0", "secretRef": {"name": "creds"}}}),
    );
    let sites = written_sites(PinnedKind::PackageRepository, &object);
    assert_eq!(keys(&sites), ["creds registry.corp.com/pkgs/repo-bundle:1.4.0"]);
    assert_eq!(sites[0].scope, secret("apps", "creds"));
    assert!(sites[0].private_object);

    let mixed = app(json!([
        {"image": {"url": "registry.corp.com/team/app-config:v1.2.0", "secretRef": {"name": "creds"}}},
        {"imgpkgBundle": {"image": "nginx:1.25"}},
    ]));
    let sites = written_sites(PinnedKind::App, &mixed);
    assert_eq!(
        keys(&sites),
        ["creds registry.corp.com/team/app-config:v1.2.0", "nginx:1.25"]
    );
    assert!(sites.iter().all(|s| s.private_object));
    assert_eq!(sites[1].scope, Scope::Anonymous);
}

/// Public references go to the cluster-wide map; an object that names a Secret has all its
/// references in its namespace's map, a Secret's entries only if resolved since the namespace
/// was created, and nothing of a namespace not seen yet or left alone.
#[test]
fn private_pins_go_to_their_own_namespace_only_and_only_since_it_exists() {
    let now = SystemTime::now();
    let created = now - Duration::from_secs(3600);
    let public = with_metadata(
        app(json!([{"image": {"url": "nginx:1.25"}}])),
        "namespace",
        json!("team"),
    );
    let private = |namespace: &str, url: &str| {
        with_metadata(
            app(json!([{"image": {"url": url, "secretRef": {"name": "creds"}}},
                       {"imgpkgBundle": {"image": "nginx:1.25"}}])),
            "namespace",
            json!(namespace),
        )
    };
    let objects = [
        (PinnedKind::App, public),
        (
            PinnedKind::App,
            private("team", "registry.corp.com/team/app-config:v1.2.0"),
        ),
        (
            PinnedKind::App,
            private("old", "registry.corp.com/team/app-config:v1.2.0"),
        ),
        (
            PinnedKind::App,
            private("new", "registry.corp.com/team/app-config:v1.2.0"),
        ),
        (
            PinnedKind::App,
            private("ignored", "registry.corp.com/team/ignored:1"),
        ),
        (
            PinnedKind::App,
            private("unseen", "registry.corp.com/team/app-config:v1.2.0"),
        ),
    ];
    let cache = cache(&[
        ("nginx:1.25", Scope::Anonymous, 6, now),
        (
            "registry.corp.com/team/app-config:v1.2.0",
            secret("team", "creds"),
            1,
            now,
        ),
        (
            "registry.corp.com/team/app-config:v1.2.0",
            secret("old", "creds"),
            1,
            created - Duration::from_secs(1),
        ),
        (
            "registry.corp.com/team/app-config:v1.2.0",
            secret("new", "creds"),
            1,
            created,
        ),
        (
            "registry.corp.com/team/ignored:1",
            secret("ignored", "creds"),
            1,
            now,
        ),
        (
            "registry.corp.com/team/app-config:v1.2.0",
            secret("unseen", "creds"),
            1,
            now,
        ),
    ]);
    let namespace = |name: &str| match name {
        "ignored" => NamespaceState::Ignored,
        "unseen" => NamespaceState::Unknown,
        _ => NamespaceState::Pinned { created },
    };
    let sites = sites_of(&objects);
    let published = desired(&sites, &cache, namespace, PUBLISHING, now);
    let nginx = ("nginx:1.25".to_owned(), format!("nginx@{}", sha(6)));
    let config = (
        "creds registry.corp.com/team/app-config:v1.2.0".to_owned(),
        format!("registry.corp.com/team/app-config@{}", sha(1)),
    );
    assert_eq!(
        published,
        DesiredPins {
            anonymous: BTreeMap::from([nginx.clone()]),
            by_namespace: BTreeMap::from([
                ("team".to_owned(), BTreeMap::from([config.clone(), nginx.clone()])),
                // Resolved before the namespace of that name was created: another namespace's.
                ("old".to_owned(), BTreeMap::from([nginx.clone()])),
                ("new".to_owned(), BTreeMap::from([config, nginx])),
            ]),
        }
    );
}

/// A Secret's site is answered by the anonymous entry when its own scope has none (the cache's
/// fallback), under its Secret's key; an entry past the staleness limit answers nothing, nor, with
/// a mirror, one whose digest has a mirror copy (the webhook would pin the copy).
#[test]
fn the_entry_that_answers_is_the_webhooks() {
    let now = SystemTime::now();
    let created = now - Duration::from_secs(3600);
    let object = with_metadata(
        app(
            json!([{"image": {"url": "registry.corp.com/team/public:v1", "secretRef": {"name": "creds"}}},
                   {"image": {"url": "registry.corp.com/team/old:v1"}},
                   {"image": {"url": "registry.corp.com/team/mirrored:v1"}}]),
        ),
        "namespace",
        json!("team"),
    );
    let sites = sites_of(&[(PinnedKind::App, object)]);
    let cache = cache(&[
        ("registry.corp.com/team/public:v1", Scope::Anonymous, 1, now),
        (
            "registry.corp.com/team/old:v1",
            Scope::Anonymous,
            2,
            now - PUBLISHING.max_staleness - Duration::from_secs(1),
        ),
        ("registry.corp.com/team/mirrored:v1", Scope::Anonymous, 3, now),
    ]);
    cache.load_mirror(
        CacheKey::tag(&reference("registry.corp.com/team/mirrored:v1"), Scope::Anonymous),
        MirrorFields {
            current: Some(Mirrored {
                location: format!(
                    "mirror.corp.com/holdfast/registry.corp.com/team/mirrored@{}",
                    sha(3)
                ),
                at: now,
            }),
            ..MirrorFields::default()
        },
    );
    let namespace = |_: &str| NamespaceState::Pinned { created };
    let published = desired(&sites, &cache, namespace, PUBLISHING, now);
    let public = (
        "creds registry.corp.com/team/public:v1".to_owned(),
        format!("registry.corp.com/team/public@{}", sha(1)),
    );
    let mirrored = (
        "registry.corp.com/team/mirrored:v1".to_owned(),
        format!("registry.corp.com/team/mirrored@{}", sha(3)),
    );
    assert_eq!(published.anonymous, BTreeMap::from([mirrored.clone()]));
    assert_eq!(
        published.by_namespace["team"],
        BTreeMap::from([public.clone(), mirrored])
    );
    let with_mirror = Publishing {
        mirror: true,
        ..PUBLISHING
    };
    let published = desired(&sites, &cache, namespace, with_mirror, now);
    assert!(published.anonymous.is_empty(), "{published:?}");
    assert_eq!(published.by_namespace["team"], BTreeMap::from([public]));
}

/// What the policy writes from the parameters is what the webhook's pinner writes into each
/// field, for every kind and source (the e2e equivalence test compares whole stored objects).
#[test]
fn a_published_pin_is_what_the_webhook_writes() {
    let now = SystemTime::now();
    let created = now - Duration::from_secs(3600);
    let objects = [
        (
            PinnedKind::App,
            app(json!([
                {"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}},
                {"imgpkgBundle": {"image": "nginx"}},
                {"imgpkgBundle": {"image": "docker.io/library/nginx:1.25", "secretRef": {"name": "creds"}}},
                {"image": {"url": "localhost:5000/team/app:1"}},
            ])),
        ),
        (
            PinnedKind::PackageRepository,
            pkgr(json!({"imgpkgBundle": {"image": "registry.corp.com/pkgs/repo-bundle:1.4.0"}})),
        ),
        (
            PinnedKind::Package,
            package(json!([{"imgpkgBundle": {"image": "index.docker.io/library/nginx:1.25"}}])),
        ),
    ];
    let cache = Arc::new(cache(&[
        (
            "registry.corp.com/team/app-config:v1.2.0",
            Scope::Anonymous,
            1,
            now,
        ),
        ("nginx:latest", Scope::Anonymous, 7, now),
        ("nginx:1.25", Scope::Anonymous, 6, now),
        ("nginx:1.25", secret("apps", "creds"), 5, now),
        ("localhost:5000/team/app:1", Scope::Anonymous, 3, now),
        (
            "registry.corp.com/pkgs/repo-bundle:1.4.0",
            Scope::Anonymous,
            8,
            now,
        ),
    ]));
    let sites = sites_of(&objects);
    let published = desired(
        &sites,
        &cache,
        |_: &str| NamespaceState::Pinned { created },
        PUBLISHING,
        now,
    );
    let pinner = Pinner::new(cache.clone(), None);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut compared = 0;
    for (kind, object) in &objects {
        let outcome = runtime.block_on(pinner.pin(
            *kind,
            "apps",
            &BTreeMap::new(),
            SecretScoped::ResolvedSince(created),
            object,
            None,
        ));
        assert_eq!(outcome.warnings, Vec::<String>::new());
        let pinned = apply(object, &outcome.ops);
        let private = fetch_sites(*kind, object).iter().any(|s| s.secret_ref.is_some());
        for site in fetch_sites(*kind, object) {
            let key = crate::policy_params::param_key(site.secret_ref.as_deref(), &site.reference);
            let params = if private {
                &published.by_namespace["apps"]
            } else {
                &published.anonymous
            };
            assert_eq!(
                params.get(&key).map(String::as_str),
                pinned.pointer(site.pointer.as_str()).and_then(Value::as_str),
                "{}",
                site.field
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 6);
}

#[test]
fn the_pins_are_sharded_by_size_and_a_key_stays_in_its_shard() {
    let pins: BTreeMap<String, String> = (0..2000)
        .map(|n| {
            (
                format!("registry.corp.com/team/app-{n}:v1.2.{n}"),
                format!("registry.corp.com/team/app-{n}@{}", sha((n % 250) as u8)),
            )
        })
        .collect();
    let bytes = |map: &BTreeMap<String, String>| map.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let total = bytes(&pins);
    assert!(total > MAX_SHARD_BYTES / 8, "{total}");

    assert_eq!(shards(&pins, MAX_SHARD_BYTES), vec![pins.clone()], "fits in one");
    assert_eq!(shards(&BTreeMap::new(), MAX_SHARD_BYTES), vec![BTreeMap::new()]);

    let budget = total / 3;
    let split = shards(&pins, budget);
    assert!(split.len() >= 3, "{}", split.len());
    assert!(split.iter().all(|shard| bytes(shard) <= budget));
    let mut union = BTreeMap::new();
    for shard in &split {
        union.extend(shard.clone());
    }
    assert_eq!(union, pins, "every pin in exactly one shard");

    // One more pin: if the count holds, no other key moves.
    let mut more = pins.clone();
    more.insert("nginx:1.25".into(), format!("nginx@{}", sha(6)));
    let again = shards(&more, budget);
    if again.len() == split.len() {
        let changed = split.iter().zip(&again).filter(|(a, b)| a != b).count();
        assert_eq!(changed, 1);
    }
}

/// The repository part of a reference as the webhook's `matchConditions` take it in CEL: up to
/// the last `:` when the text after it has no `/`.
fn cel_repository(reference: &str) -> &str {
    match reference.rfind(':') {
        Some(colon) if !reference[colon..].contains('/') => &reference[..colon],
        _ => reference,
    }
}

proptest::proptest! {
    // The pattern's repetitions are unbounded: most generated references pass the length bound.
    #![proptest_config(proptest::test_runner::Config {
        cases: 64,
        max_global_rejects: 5_000,
        ..proptest::test_runner::Config::default()
    })]

    /// Every reference `PLAIN_REFERENCE_PATTERN` matches (and the CEL check's length bound
    /// admits) is one the webhook would keep pinned as the CEL check expects: it parses, has no
    /// digest, and its pin is its repository part as written, `@`, the digest. So an annotation
    /// entry the condition takes for in place is one the webhook leaves alone.
    #[test]
    fn what_the_webhooks_condition_takes_for_in_place_is(
        reference in proptest::string::string_regex(crate::PLAIN_REFERENCE_PATTERN).unwrap(),
        seed in 0u8..=255,
    ) {
        proptest::prop_assume!(reference.len() <= 240);
        let parsed = holdfast_registry::Reference::parse(&reference);
        proptest::prop_assert!(parsed.is_ok(), "{reference}: {parsed:?}");
        let parsed = parsed.unwrap();
        proptest::prop_assert!(!parsed.is_pinned());
        let digest = digest(seed);
        proptest::prop_assert_eq!(
            parsed.pinned(&digest),
            format!("{}@{digest}", cel_repository(&reference))
        );
    }
}

/// The pattern is wide enough for what people write (else their pinned objects still go to the
/// webhook after the policy pinned them: correct, only slower).
#[test]
fn the_references_people_write_are_plain() {
    let pattern = regex::Regex::new(&format!("^{}$", crate::PLAIN_REFERENCE_PATTERN)).unwrap();
    for reference in [
        "nginx",
        "nginx:1.25",
        "docker.io/library/nginx:1.25",
        "index.docker.io/bitnami/nginx:1.25.3-debian-12-r0",
        "ghcr.io/carvel-dev/kapp-controller-bundle:v0.53.1",
        "registry.corp.com:5000/team/app-config:v1.2.0",
        "localhost:5000/team/app:1",
        "127.0.0.1:33033/demo/app-config:1.0.0",
        "my-registry.example/a/b/c__d---e.f:latest",
    ] {
        assert!(pattern.is_match(reference), "{reference} is not plain");
    }
}

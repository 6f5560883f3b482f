//! Mirror.

use super::*;

const MIRROR_REPO: &str = "cache.corp.com:5000/mirror/registry.corp.com/team/app-config";

/// Pins the App's one tagged image to `resolution`, as the controller does after a copy.
fn pin_one(object: &Value, resolution: Resolution) -> PinOutcome {
    let plan = ObjectPlan::new(PinnedKind::App, object, None);
    pin_patch(object, &plan.sites, &[(0, resolution)], plan.policy)
}

#[test]
fn a_mirrored_digest_is_pinned_to_the_mirror_and_the_original_kept() {
    let object = app(json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}}]));
    let mirrored = Resolution {
        digest: digest(1),
        selected_tag: None,
        mirror: Some(MIRROR_REPO.into()),
        pull_secret: None,
    };
    let pinned = apply(&object, &pin_one(&object, mirrored.clone()).ops);
    assert_eq!(
        pinned["spec"]["fetch"][0]["image"]["url"],
        json!(format!("{MIRROR_REPO}@{}", sha(1)))
    );
    assert_eq!(
        annotation_of(&pinned),
        json!({"/spec/fetch/0/image/url": {"ref": "registry.corp.com/team/app-config:v1.2.0", "digest": sha(1), "mirror": MIRROR_REPO}})
    );
    // In place: nothing more to do, and the controller tracks it (the original comes back).
    assert_eq!(
        run(PinnedKind::App, &pinned, Some(&pinned), &registry()).ops,
        vec![]
    );
    let recorded = OriginalRefs::from_object(&pinned).unwrap();
    assert_eq!(recorded.in_place(&pinned).count(), 1);
    assert_eq!(
        repin::unpinned(&pinned)["spec"]["fetch"][0]["image"]["url"],
        "registry.corp.com/team/app-config:v1.2.0"
    );
    // `freeze` on an UPDATE that brings the tag back reuses the mirror pin as recorded.
    let frozen = with_metadata(pinned.clone(), "labels", json!({PIN_KEY: "freeze"}));
    let back = with_tags_back(
        &frozen,
        &[(
            "/spec/fetch/0/image/url",
            "registry.corp.com/team/app-config:v1.2.0",
        )],
        None,
    );
    let plan = ObjectPlan::new(PinnedKind::App, &back, Some(&frozen));
    assert_eq!(plan.steps, vec![Step::Reuse(mirrored)]);
}

#[test]
fn an_upstream_pin_moves_to_the_mirror_once_mirrored() {
    let object = app(json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}}]));
    let upstream = apply(&object, &run(PinnedKind::App, &object, None, &registry()).ops);
    // The controller's reconcile: back to the tag, pinned again from the cache, now mirrored.
    let desired = repin::unpinned(&upstream);
    let mirrored = Resolution {
        digest: digest(1),
        selected_tag: None,
        mirror: Some(MIRROR_REPO.into()),
        pull_secret: None,
    };
    let desired = apply(&desired, &pin_one(&desired, mirrored).ops);
    let ops = repin::update(&upstream, &desired);
    let moved = apply(&upstream, &ops);
    assert_eq!(
        moved["spec"]["fetch"][0]["image"]["url"],
        json!(format!("{MIRROR_REPO}@{}", sha(1)))
    );
    assert_eq!(
        annotation_of(&moved)["/spec/fetch/0/image/url"]["mirror"],
        MIRROR_REPO
    );
}

#[test]
fn a_mirror_that_is_not_a_bare_repository_is_never_written() {
    let object = app(json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}}]));
    let outcome = pin_one(
        &object,
        Resolution {
            digest: digest(1),
            selected_tag: None,
            mirror: Some(format!("{MIRROR_REPO}:tag")),
            pull_secret: None,
        },
    );
    assert_eq!(outcome.ops, vec![]);
    assert!(
        outcome.warnings[0].contains("internal error"),
        "{:?}",
        outcome.warnings
    );
}

#[test]
fn only_a_record_of_this_mirror_and_digest_is_used() {
    use holdfast_cache::Mirrored;
    use holdfast_registry::{Reference, mirror::MirrorLocation};
    use std::time::SystemTime;

    let mirror = MirrorLocation::new("cache.corp.com:5000", "mirror").unwrap();
    let source = Reference::parse("registry.corp.com/team/app-config:v1.2.0").unwrap();
    let record = |location: String| Mirrored {
        location,
        at: SystemTime::now(),
    };
    let here = record(format!("{MIRROR_REPO}@{}", sha(1)));
    assert_eq!(
        mirror_scope::mirror_repository(&mirror, &source, &digest(1), Some(&here)),
        Some(MIRROR_REPO.to_owned())
    );
    assert_eq!(
        mirror_scope::mirror_repository(&mirror, &source, &digest(1), None),
        None
    );
    // Another digest (the tag moved), another prefix, another mirror.
    assert_eq!(
        mirror_scope::mirror_repository(&mirror, &source, &digest(2), Some(&here)),
        None
    );
    let other_prefix = MirrorLocation::new("cache.corp.com:5000", "other").unwrap();
    assert_eq!(
        mirror_scope::mirror_repository(&other_prefix, &source, &digest(1), Some(&here)),
        None
    );
    let elsewhere = record(format!(
        "old-cache.corp.com/mirror/registry.corp.com/team/app-config@{}",
        sha(1)
    ));
    assert_eq!(
        mirror_scope::mirror_repository(&mirror, &source, &digest(1), Some(&elsewhere)),
        None
    );
}

/// Digest 1 in the mirror, pulled with the mirror pull Secret `mirror-pull`.
fn private_mirror_pin() -> Resolution {
    Resolution {
        digest: digest(1),
        selected_tag: None,
        mirror: Some(MIRROR_REPO.into()),
        pull_secret: Some("mirror-pull".into()),
    }
}

#[test]
fn a_private_pin_to_the_mirror_names_the_pull_secret_and_goes_back_with_the_users() {
    let object = app(
        json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0",
        "secretRef": {"name": "team-creds"}, "subPath": "config"}}]),
    );
    let mirrored = private_mirror_pin();
    let pinned = apply(&object, &pin_one(&object, mirrored.clone()).ops);
    let image = &pinned["spec"]["fetch"][0]["image"];
    assert_eq!(image["url"], json!(format!("{MIRROR_REPO}@{}", sha(1))));
    assert_eq!(image["secretRef"]["name"], "mirror-pull");
    assert_eq!(image["subPath"], "config");
    let recorded = &annotation_of(&pinned)["/spec/fetch/0/image/url"];
    assert_eq!(
        (&recorded["secretRef"], &recorded["pullSecret"]),
        (&json!("team-creds"), &json!("mirror-pull"))
    );
    // In place: nothing more to do; the controller's unpinned view has the user's Secret back.
    assert_eq!(pin_one(&pinned, mirrored.clone()).ops, vec![]);
    let unpinned = repin::unpinned(&pinned);
    assert_eq!(
        unpinned["spec"]["fetch"][0]["image"],
        object["spec"]["fetch"][0]["image"]
    );
    // Pinned again to the same copy: no update at all.
    let again = apply(&unpinned, &pin_one(&unpinned, mirrored.clone()).ops);
    assert_eq!(repin::update(&pinned, &again), vec![]);
    // The namespace left the mirror: pinned upstream with the user's Secret, entry rewritten.
    let upstream = Resolution {
        mirror: None,
        pull_secret: None,
        ..mirrored
    };
    let back = apply(&unpinned, &pin_one(&unpinned, upstream).ops);
    let moved = apply(&pinned, &repin::update(&pinned, &back));
    let image = &moved["spec"]["fetch"][0]["image"];
    assert_eq!(
        image["url"],
        json!(format!("registry.corp.com/team/app-config@{}", sha(1)))
    );
    assert_eq!(image["secretRef"]["name"], "team-creds");
    assert_eq!(
        annotation_of(&moved)["/spec/fetch/0/image/url"],
        json!({"ref": "registry.corp.com/team/app-config:v1.2.0", "digest": sha(1)})
    );
}

#[test]
fn a_user_who_replaces_the_pull_secret_takes_the_pin_over() {
    let object = app(
        json!([{"imgpkgBundle": {"image": "registry.corp.com/team/app-config:v1.2.0",
        "secretRef": {"name": "team-creds"}}}]),
    );
    let mirrored = private_mirror_pin();
    let mut pinned = apply(&object, &pin_one(&object, mirrored).ops);
    assert_eq!(
        pinned["spec"]["fetch"][0]["imgpkgBundle"]["secretRef"]["name"],
        "mirror-pull"
    );
    pinned["spec"]["fetch"][0]["imgpkgBundle"]["secretRef"]["name"] = json!("other");
    // No longer holdfast's pin: the controller leaves it, and the entry is dropped.
    assert_eq!(repin::unpinned(&pinned), pinned);
    let plan = ObjectPlan::new(PinnedKind::App, &pinned, None);
    let outcome = pin_patch(&pinned, &plan.sites, &[], plan.policy);
    assert!(
        matches!(&outcome.ops[..], [PatchOperation::Remove(r)] if r.path.as_str().ends_with("original-refs")),
        "{:?}",
        outcome.ops
    );
}

#[test]
fn a_site_without_a_secret_ref_gets_none_written() {
    let object = app(json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}}]));
    let outcome = pin_one(&object, private_mirror_pin());
    let pinned = apply(&object, &outcome.ops);
    assert!(pinned["spec"]["fetch"][0]["image"].get("secretRef").is_none());
    assert!(
        annotation_of(&pinned)["/spec/fetch/0/image/url"]
            .get("pullSecret")
            .is_none()
    );
}

/// The private mirror pin of `object`'s first fetch entry, as the webhook admits it.
fn pinned_to_private_copy(object: &Value) -> Value {
    apply(object, &pin_one(object, private_mirror_pin()).ops)
}

fn team_app() -> Value {
    app(
        json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0",
        "secretRef": {"name": "team-creds"}}}]),
    )
}

#[test]
fn a_url_edited_on_a_private_mirror_pin_goes_upstream_with_the_users_secret() {
    let pinned = pinned_to_private_copy(&team_app());
    assert_eq!(
        pinned["spec"]["fetch"][0]["image"]["secretRef"]["name"],
        "mirror-pull"
    );
    // The user patches a new tag in, leaving the pull Secret holdfast wrote; with and without
    // the annotation (a replace that drops it: the old object's is used).
    let mut edited = pinned.clone();
    edited["spec"]["fetch"][0]["image"]["url"] = json!("registry.corp.com/team/app-config:v1.3.0");
    let mut bare = edited.clone();
    bare["metadata"]["annotations"] = json!({});
    for object in [&edited, &bare] {
        let plan = ObjectPlan::new(PinnedKind::App, object, Some(&pinned));
        let site = &plan.sites[0];
        assert_eq!(site.secret_ref.as_deref(), Some("mirror-pull"));
        assert_eq!(
            site.upstream_secret.as_deref(),
            Some("team-creds"),
            "resolved with the user's Secret, not the mirror's"
        );
        assert!(matches!(&plan.steps[0], Step::Resolve { fallback: None, .. }));
        // Pinned upstream: the user's Secret is back, the entry has no Secrets.
        let upstream = Resolution {
            digest: digest(2),
            selected_tag: None,
            mirror: None,
            pull_secret: None,
        };
        let out = apply(
            object,
            &pin_patch(object, &plan.sites, &[(0, upstream)], plan.policy).ops,
        );
        let image = &out["spec"]["fetch"][0]["image"];
        assert_eq!(
            image["url"],
            json!(format!("registry.corp.com/team/app-config@{}", sha(2)))
        );
        assert_eq!(image["secretRef"]["name"], "team-creds");
        assert_eq!(
            annotation_of(&out)["/spec/fetch/0/image/url"],
            json!({"ref": "registry.corp.com/team/app-config:v1.3.0", "digest": sha(2)})
        );
        // Left unpinned (the registry failed): the user's Secret is back all the same, since
        // the entry that recorded it goes.
        let out = apply(object, &pin_patch(object, &plan.sites, &[], plan.policy).ops);
        let image = &out["spec"]["fetch"][0]["image"];
        assert_eq!(image["url"], "registry.corp.com/team/app-config:v1.3.0");
        assert_eq!(image["secretRef"]["name"], "team-creds");
        assert!(
            out["metadata"]["annotations"]
                .get(ORIGINAL_REFS_ANNOTATION)
                .is_none()
        );
        // Pinned to the new digest's private copy: the pull Secret stays and the user's is
        // still recorded.
        let mirrored = Resolution {
            digest: digest(2),
            ..private_mirror_pin()
        };
        let ops = pin_patch(object, &plan.sites, &[(0, mirrored)], plan.policy).ops;
        assert!(
            !paths(&ops).iter().any(|p| p.ends_with("secretRef/name")),
            "{ops:?}"
        );
        let out = apply(object, &ops);
        assert_eq!(
            out["spec"]["fetch"][0]["image"]["secretRef"]["name"],
            "mirror-pull"
        );
        let recorded = &annotation_of(&out)["/spec/fetch/0/image/url"];
        assert_eq!(
            (&recorded["secretRef"], &recorded["pullSecret"]),
            (&json!("team-creds"), &json!("mirror-pull"))
        );
        // …and it is in place: the controller's view of it has the user's Secret back.
        assert_eq!(
            repin::unpinned(&out)["spec"]["fetch"][0]["image"]["secretRef"]["name"],
            "team-creds"
        );
    }
}

#[test]
fn a_private_mirror_pin_in_place_or_replaced_keeps_its_secret() {
    let pinned = pinned_to_private_copy(&team_app());
    // In place: the pull Secret is what it fetches with.
    let plan = ObjectPlan::new(PinnedKind::App, &pinned, Some(&pinned));
    assert_eq!(plan.sites[0].upstream_secret.as_deref(), Some("mirror-pull"));
    assert_eq!(pin_patch(&pinned, &plan.sites, &[], plan.policy).ops, vec![]);
    // The user's own digest with the pull Secret: holdfast touches neither.
    let mut own = pinned.clone();
    own["spec"]["fetch"][0]["image"]["url"] = json!(format!("registry.corp.com/team/app-config@{}", sha(3)));
    let plan = ObjectPlan::new(PinnedKind::App, &own, Some(&pinned));
    let ops = pin_patch(&own, &plan.sites, &[], plan.policy).ops;
    assert_eq!(paths(&ops), [ANNOTATION_PATH]);
    // A Secret the user named themselves is theirs, whatever the old entry says.
    let mut renamed = pinned.clone();
    renamed["spec"]["fetch"][0]["image"]["url"] = json!("registry.corp.com/team/app-config:v1.3.0");
    renamed["spec"]["fetch"][0]["image"]["secretRef"]["name"] = json!("other");
    let plan = ObjectPlan::new(PinnedKind::App, &renamed, Some(&pinned));
    assert_eq!(plan.sites[0].upstream_secret.as_deref(), Some("other"));
}

#[test]
fn freeze_on_a_private_mirror_pin_keeps_the_users_secret_recorded() {
    // The original tag sent again with the pull Secret (the recorded pin is reused).
    let pinned = pinned_to_private_copy(&with_metadata(
        team_app(),
        "labels",
        json!({"holdfast.dev/pin": "freeze"}),
    ));
    let mut resent = pinned.clone();
    resent["spec"]["fetch"][0]["image"]["url"] = json!("registry.corp.com/team/app-config:v1.2.0");
    let outcome = run(PinnedKind::App, &resent, Some(&pinned), &registry());
    assert_eq!(apply(&resent, &outcome.ops), pinned);
}

#[test]
fn the_reconcile_of_an_edited_private_mirror_pin_resolves_with_the_users_secret() {
    let namespace = "team";
    let pinned = with_metadata(pinned_to_private_copy(&team_app()), "namespace", json!(namespace));
    let mut stored = pinned.clone();
    stored["spec"]["fetch"][0]["image"]["url"] = json!("registry.corp.com/team/app-config:v1.3.0");
    let reference = holdfast_registry::Reference::parse("registry.corp.com/team/app-config:v1.3.0").unwrap();
    let scope = |name: &str| holdfast_cache::Scope::Secret {
        namespace: namespace.into(),
        name: name.into(),
    };
    let cache = holdfast_cache::DigestCache::new(
        std::sync::Arc::new(holdfast_cache::testing::Unreachable),
        Default::default(),
        None,
    );
    // Only the user's Secret's entry is held; the pull Secret's would need the registry,
    // which this pinner (no Secret reads) cannot ask with it.
    cache.insert(holdfast_cache::CacheEntry::resolved(
        holdfast_cache::CacheKey::tag(&reference, scope("team-creds")),
        digest(2),
        std::time::SystemTime::now(),
    ));
    let pinner = Pinner::new(std::sync::Arc::new(cache), None);
    let update = block_on(pinner.reconcile(PinnedKind::App, namespace, &BTreeMap::new(), &stored)).unwrap();
    assert_eq!(update.warnings, Vec::<String>::new());
    let out = apply(&stored, &update.ops);
    let image = &out["spec"]["fetch"][0]["image"];
    assert_eq!(
        image["url"],
        json!(format!("registry.corp.com/team/app-config@{}", sha(2)))
    );
    assert_eq!(image["secretRef"]["name"], "team-creds");
    // The webhook's UPDATE, likewise.
    let outcome = block_on(pinner.pin(
        PinnedKind::App,
        namespace,
        &BTreeMap::new(),
        crate::SecretScoped::ResolvedSince(std::time::UNIX_EPOCH),
        &stored,
        Some(&pinned),
    ));
    assert_eq!(outcome.warnings, Vec::<String>::new());
    assert_eq!(apply(&stored, &outcome.ops), out);
}

fn secret_scope(namespace: &str, name: &str) -> holdfast_cache::Scope {
    holdfast_cache::Scope::Secret {
        namespace: namespace.into(),
        name: name.into(),
    }
}

#[test]
fn objects_name_the_keys_of_their_own_secret_and_namespace_only() {
    let team_app = with_metadata(
        app(
            json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0", "secretRef": {"name": "creds"}}},
                   {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {"constraints": ">=1.0.0"}}}}]),
        ),
        "namespace",
        json!("team"),
    );
    let keys = resolve::named_keys(PinnedKind::App, &team_app);
    let config = holdfast_registry::Reference::parse("registry.corp.com/team/app-config:v1.2.0").unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        keys[0],
        holdfast_cache::CacheKey::tag(&config, secret_scope("team", "creds"))
    );
    assert_eq!(keys[1].scope, holdfast_cache::Scope::Anonymous);
    assert!(keys[1].selection.is_some());

    // Pinned (follow): the original tag is what it names, still with its own Secret.
    let (outcome, _) = pin_and_settle(PinnedKind::App, &team_app);
    let pinned = apply(&team_app, &outcome.ops);
    assert_eq!(resolve::named_keys(PinnedKind::App, &pinned), keys);
    // What a refresh round does with these keys: the controller's refresher
    // (`refreshing_what_one_namespace_names_reads_no_other_namespaces_secret`).
}

/// Runs `work` on a runtime of its own: the digest cache's lookups are tasks.
fn block_on<F: std::future::Future>(work: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(work)
}

/// The webhook's pin takes a Secret's entry only if it was resolved since the namespace was
/// created: a namespace deleted and re-created under its name is not pinned from the earlier
/// namespace's private entries (nor to their mirror copies), and one the webhook does not know
/// yet takes none; anonymous entries answer whatever the namespace.
#[test]
fn a_secrets_entry_older_than_its_namespace_does_not_pin() {
    use std::time::{Duration, SystemTime};

    use crate::SecretScoped;
    let namespace = "team";
    let resolved_at = SystemTime::now() - Duration::from_secs(600);
    let private = |url: &str| {
        with_metadata(
            app(json!([{"image": {"url": url, "secretRef": {"name": "team-creds"}}}])),
            "namespace",
            json!(namespace),
        )
    };
    let public = with_metadata(
        app(json!([{"image": {"url": "registry.corp.com/team/public:v1"}}])),
        "namespace",
        json!(namespace),
    );
    let cache = holdfast_cache::DigestCache::new(
        std::sync::Arc::new(holdfast_cache::testing::Unreachable),
        Default::default(),
        None,
    );
    let reference = |r: &str| holdfast_registry::Reference::parse(r).unwrap();
    cache.insert(holdfast_cache::CacheEntry::resolved(
        holdfast_cache::CacheKey::tag(
            &reference("registry.corp.com/team/app-config:v1.2.0"),
            holdfast_cache::Scope::Secret {
                namespace: namespace.into(),
                name: "team-creds".into(),
            },
        ),
        digest(2),
        resolved_at,
    ));
    cache.insert(holdfast_cache::CacheEntry::resolved(
        holdfast_cache::CacheKey::tag(
            &reference("registry.corp.com/team/public:v1"),
            holdfast_cache::Scope::Anonymous,
        ),
        digest(3),
        resolved_at,
    ));
    let pinner = Pinner::new(std::sync::Arc::new(cache), None);
    let pin = |object: &Value, scoped| {
        block_on(pinner.pin(PinnedKind::App, namespace, &BTreeMap::new(), scoped, object, None))
    };
    let object = private("registry.corp.com/team/app-config:v1.2.0");

    let same_namespace = pin(
        &object,
        SecretScoped::ResolvedSince(resolved_at - Duration::from_secs(60)),
    );
    assert_eq!(same_namespace.unresolved, 0, "{:?}", same_namespace.warnings);
    assert!(
        apply(&object, &same_namespace.ops)["spec"]["fetch"][0]["image"]["url"]
            .as_str()
            .unwrap()
            .ends_with(&sha(2))
    );
    for scoped in [
        SecretScoped::ResolvedSince(resolved_at + Duration::from_secs(60)),
        SecretScoped::None,
    ] {
        let outcome = pin(&object, scoped);
        assert_eq!(outcome.unresolved, 1, "{scoped:?}");
        assert!(outcome.ops.is_empty(), "{scoped:?}: {:?}", outcome.ops);
        assert!(
            outcome
                .warnings
                .iter()
                .any(|w| w.contains("before this namespace existed")),
            "{:?}",
            outcome.warnings
        );
        let anonymous = pin(&public, scoped);
        assert_eq!(anonymous.unresolved, 0, "{scoped:?}: {:?}", anonymous.warnings);
    }
}

//! Patches.

use super::*;

#[test]
fn app_tag_is_pinned_and_the_original_recorded() {
    let object =
        app(json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0", "subPath": "config"}}]));
    let (outcome, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(outcome.warnings, Vec::<String>::new());
    assert_eq!(
        paths(&outcome.ops),
        ["/spec/fetch/0/image/url", "/metadata/annotations"]
    );
    assert_eq!(
        pinned["spec"]["fetch"][0]["image"],
        json!({"url": format!("registry.corp.com/team/app-config@{}", sha(1)), "subPath": "config"})
    );
    assert_eq!(
        annotation_of(&pinned),
        json!({"/spec/fetch/0/image/url": {"ref": "registry.corp.com/team/app-config:v1.2.0", "digest": sha(1)}})
    );
}

#[test]
fn tag_selection_is_resolved_and_removed() {
    let selection =
        json!({"semver": {"constraints": ">=1.0.0 <2.0.0", "prereleases": {"identifiers": ["rc"]}}});
    let object = app(json!([{
        "imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": selection, "secretRef": {"name": "reg-creds"}},
        "path": "bundle",
    }]));
    let (outcome, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(
        paths(&outcome.ops),
        [
            "/spec/fetch/0/imgpkgBundle/image",
            "/spec/fetch/0/imgpkgBundle/tagSelection",
            "/metadata/annotations"
        ]
    );
    assert!(matches!(outcome.ops[1], PatchOperation::Remove(_)));
    // 1.5.0-rc.1 is kept by the prerelease filter and is the highest below 2.0.0.
    assert_eq!(
        pinned["spec"]["fetch"][0],
        json!({
            "imgpkgBundle": {"image": format!("registry.corp.com/team/app-bundle@{}", sha(5)), "secretRef": {"name": "reg-creds"}},
            "path": "bundle",
        })
    );
    assert_eq!(
        annotation_of(&pinned),
        json!({"/spec/fetch/0/imgpkgBundle/image": {
            "ref": "registry.corp.com/team/app-bundle",
            "tagSelection": selection,
            "tag": "1.5.0-rc.1",
            "digest": sha(5),
        }})
    );
}

#[test]
fn mixed_entries_pin_only_oci_references() {
    let git = json!({"git": {"url": "https://github.com/corp/app", "ref": "origin/main"}, "path": "src"});
    let helm = json!({"helmChart": {"name": "redis", "version": "17.0.0", "repository": {"url": "oci://registry.corp.com/charts"}}});
    let inline = json!({"inline": {"paths": {"values.yml": "image: nginx:1.25"}}});
    let object = app(json!([
        git,
        {"image": {"url": "nginx:1.25"}},
        helm,
        {"imgpkgBundle": {"image": format!("registry.corp.com/team/app-bundle@{}", sha(3))}},
        inline,
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle:1.0.0"}},
    ]));
    let (outcome, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(
        paths(&outcome.ops),
        [
            "/spec/fetch/1/image/url",
            "/spec/fetch/5/imgpkgBundle/image",
            "/metadata/annotations"
        ]
    );
    let fetch = &pinned["spec"]["fetch"];
    assert_eq!(fetch[0], git);
    assert_eq!(fetch[2], helm);
    assert_eq!(fetch[4], inline);
    assert_eq!(
        fetch[3], object["spec"]["fetch"][3],
        "an existing digest is never touched"
    );
    assert_eq!(fetch[1]["image"]["url"], format!("nginx@{}", sha(6)));
    assert_eq!(
        fetch[5]["imgpkgBundle"]["image"],
        format!("registry.corp.com/team/app-bundle@{}", sha(2))
    );
    let recorded = annotation_of(&pinned);
    let keys: Vec<&String> = recorded.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        ["/spec/fetch/1/image/url", "/spec/fetch/5/imgpkgBundle/image"]
    );
    // Everything but the two fields and the annotation is as it was.
    let mut restored = pinned.clone();
    restored["spec"]["fetch"][1]["image"]["url"] = json!("nginx:1.25");
    restored["spec"]["fetch"][5]["imgpkgBundle"]["image"] = json!("registry.corp.com/team/app-bundle:1.0.0");
    restored["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    assert_eq!(restored, object);
}

#[test]
fn already_pinned_references_get_no_operations() {
    let object = app(json!([
        {"image": {"url": format!("registry.corp.com/team/app-config@{}", sha(1))}},
        {"imgpkgBundle": {"image": format!("registry.corp.com/team/app-bundle:1.0.0@{}", sha(2))}},
    ]));
    let plan = ObjectPlan::new(PinnedKind::App, &object, None);
    assert_eq!(plan.steps, vec![Step::Keep, Step::Keep]);
    let outcome = run(PinnedKind::App, &object, None, &registry());
    assert_eq!(outcome, PinOutcome::default());
}

#[test]
fn each_kind_is_pinned_and_settles() {
    let cases = [
        (
            PinnedKind::App,
            app(json!([{"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle:1.4.2"}}])),
            "/spec/fetch/0/imgpkgBundle/image",
        ),
        (
            PinnedKind::PackageRepository,
            pkgr(json!({"imgpkgBundle": {"image": "registry.corp.com/pkgs/repo-bundle:1.4.0"}})),
            "/spec/fetch/imgpkgBundle/image",
        ),
        (
            PinnedKind::PackageRepository,
            pkgr(json!({"image": {"url": "registry.corp.com/team/app-config:v1.2.0", "subPath": "repo"}})),
            "/spec/fetch/image/url",
        ),
        (
            PinnedKind::Package,
            package(json!([{"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}}])),
            "/spec/template/spec/fetch/0/image/url",
        ),
        (
            PinnedKind::Package,
            package(
                json!([{"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {}}}}]),
            ),
            "/spec/template/spec/fetch/0/imgpkgBundle/image",
        ),
    ];
    for (kind, object, pointer) in cases {
        let (outcome, pinned) = pin_and_settle(kind, &object);
        assert_eq!(outcome.warnings, Vec::<String>::new(), "{kind}");
        assert_eq!(paths(&outcome.ops)[0], pointer, "{kind}");
        let value = pinned.pointer(pointer).unwrap().as_str().unwrap();
        assert!(value.contains("@sha256:"), "{kind}: {value}");
        assert!(annotation_of(&pinned).get(pointer).is_some(), "{kind}");
        let source = pointer.rsplit_once('/').unwrap().0;
        assert!(
            pinned.pointer(&format!("{source}/tagSelection")).is_none(),
            "{kind}"
        );
    }
}

#[test]
fn docker_hub_short_names_keep_the_users_spelling() {
    let cases = [
        ("nginx:1.25", format!("nginx@{}", sha(6))),
        ("nginx", format!("nginx@{}", sha(7))),
        ("docker.io/nginx:1.25", format!("docker.io/nginx@{}", sha(6))),
        (
            "docker.io/library/nginx:latest",
            format!("docker.io/library/nginx@{}", sha(7)),
        ),
        (
            "index.docker.io/library/nginx:1.25",
            format!("index.docker.io/library/nginx@{}", sha(6)),
        ),
    ];
    for (reference, expected) in cases {
        let object = app(json!([{"image": {"url": reference}}]));
        let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
        assert_eq!(
            pinned["spec"]["fetch"][0]["image"]["url"], expected,
            "{reference}"
        );
        assert_eq!(
            annotation_of(&pinned)["/spec/fetch/0/image/url"]["ref"],
            reference,
            "{reference}"
        );
    }
}

#[test]
fn invalid_sites_are_left_alone_with_a_warning_and_the_others_pinned() {
    let object = app(json!([
        {"image": {"url": "Registry.corp.com/App:1"}},
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle:1.0.0", "tagSelection": {"semver": {}}}},
        {"image": {"url": "nginx:1.25"}},
    ]));
    let plan = ObjectPlan::new(PinnedKind::App, &object, None);
    assert!(matches!(
        plan.steps[0],
        Step::Invalid(SiteError::InvalidReference { .. })
    ));
    assert!(matches!(
        plan.steps[1],
        Step::Invalid(SiteError::TagWithSelection { .. })
    ));
    assert!(matches!(plan.steps[2], Step::Resolve { fallback: None, .. }));
    let (outcome, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(outcome.warnings.len(), 2, "{:?}", outcome.warnings);
    assert!(outcome.warnings[0].starts_with("spec.fetch[0].image.url: "));
    assert!(outcome.warnings[1].starts_with("spec.fetch[1].imgpkgBundle.image: "));
    assert_eq!(
        paths(&outcome.ops),
        ["/spec/fetch/2/image/url", "/metadata/annotations"]
    );
    assert_eq!(pinned["spec"]["fetch"][0], object["spec"]["fetch"][0]);
    assert_eq!(pinned["spec"]["fetch"][1], object["spec"]["fetch"][1]);
}

#[test]
fn unresolved_sites_stay_as_written() {
    let object = app(json!([{"image": {"url": "registry.corp.com/team/unknown:1"}}]));
    let outcome = run(PinnedKind::App, &object, None, &registry());
    assert_eq!(outcome, PinOutcome::default());
}

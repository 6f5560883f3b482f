//! Idempotency and reinvocation.

use super::*;

#[test]
fn an_update_with_the_tag_again_gives_the_same_bytes() {
    let selection = json!({"semver": {"constraints": ">=1.0.0 <2.0.0"}});
    let object = app(json!([
        {"image": {"url": "nginx:1.25"}},
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": selection}},
    ]));
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    let update = with_tags_back(
        &pinned,
        &[
            ("/spec/fetch/0/image/url", "nginx:1.25"),
            (
                "/spec/fetch/1/imgpkgBundle/image",
                "registry.corp.com/team/app-bundle",
            ),
        ],
        Some(("/spec/fetch/1/imgpkgBundle", selection)),
    );
    let outcome = run(PinnedKind::App, &update, Some(&pinned), &registry());
    // Only the fields: the annotation already says exactly this.
    assert_eq!(
        paths(&outcome.ops),
        [
            "/spec/fetch/0/image/url",
            "/spec/fetch/1/imgpkgBundle/image",
            "/spec/fetch/1/imgpkgBundle/tagSelection"
        ]
    );
    let again = apply(&update, &outcome.ops);
    assert_eq!(again.to_string(), pinned.to_string());
}

#[test]
fn the_same_manifest_applied_twice_gives_the_same_object() {
    // CREATE, then an UPDATE carrying the same manifest (the annotation lost, as a server-side
    // apply that does not own it would send): same bytes both times.
    let object = package(json!([
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {"constraints": "<2.0.0"}}}},
        {"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}},
    ]));
    let first = apply(&object, &run(PinnedKind::Package, &object, None, &registry()).ops);
    let second = apply(
        &object,
        &run(PinnedKind::Package, &object, Some(&first), &registry()).ops,
    );
    assert_eq!(first.to_string(), second.to_string());
    let third = run(PinnedKind::Package, &second, Some(&first), &registry());
    assert_eq!(third.ops, vec![]);
}

#[test]
fn follow_pins_the_tags_new_digest() {
    let object = app(json!([{"image": {"url": "nginx:1.25"}}]));
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    let update = with_tags_back(&pinned, &[("/spec/fetch/0/image/url", "nginx:1.25")], None);
    let moved = registry().retag("index.docker.io/library/nginx", "1.25", 60);
    let plan = ObjectPlan::new(PinnedKind::App, &update, Some(&pinned));
    assert!(
        matches!(&plan.steps[0], Step::Resolve { fallback: Some(r), .. } if r.digest == digest(6)),
        "{:?}",
        plan.steps
    );
    let repinned = apply(&update, &run(PinnedKind::App, &update, Some(&pinned), &moved).ops);
    assert_eq!(
        repinned["spec"]["fetch"][0]["image"]["url"],
        format!("nginx@{}", sha(60))
    );
    assert_eq!(
        annotation_of(&repinned)["/spec/fetch/0/image/url"]["digest"],
        sha(60)
    );
}

#[test]
fn follow_keeps_the_recorded_pin_when_resolution_fails() {
    let object = app(json!([{"image": {"url": "nginx:1.25"}}]));
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    let update = with_tags_back(&pinned, &[("/spec/fetch/0/image/url", "nginx:1.25")], None);
    let down = Registry(BTreeMap::new());
    let again = apply(&update, &run(PinnedKind::App, &update, Some(&pinned), &down).ops);
    assert_eq!(again.to_string(), pinned.to_string());
}

#[test]
fn freeze_keeps_the_recorded_digest_until_the_reference_changes() {
    let object = with_metadata(
        app(json!([
            {"image": {"url": "nginx:1.25"}},
            {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {"constraints": "<2.0.0"}}}},
        ])),
        "labels",
        json!({PIN_KEY: "freeze"}),
    );
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(
        pinned["spec"]["fetch"][0]["image"]["url"],
        format!("nginx@{}", sha(6))
    );

    // Both tags move; the manifest is sent again, once with the annotation and once without
    // (server-side apply): the frozen digests stay.
    let moved = registry()
        .retag("index.docker.io/library/nginx", "1.25", 60)
        .retag("registry.corp.com/team/app-bundle", "1.9.0", 61);
    let update = with_tags_back(
        &pinned,
        &[
            ("/spec/fetch/0/image/url", "nginx:1.25"),
            (
                "/spec/fetch/1/imgpkgBundle/image",
                "registry.corp.com/team/app-bundle",
            ),
        ],
        Some((
            "/spec/fetch/1/imgpkgBundle",
            json!({"semver": {"constraints": "<2.0.0"}}),
        )),
    );
    let mut without_annotation = update.clone();
    without_annotation["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("annotations");
    for update in [update, without_annotation] {
        let plan = ObjectPlan::new(PinnedKind::App, &update, Some(&pinned));
        assert!(matches!(&plan.steps[0], Step::Reuse(r) if r.digest == digest(6)));
        assert!(
            matches!(&plan.steps[1], Step::Reuse(r) if r.digest == digest(3) && r.selected_tag.as_deref() == Some("1.4.2"))
        );
        let again = apply(&update, &run(PinnedKind::App, &update, Some(&pinned), &moved).ops);
        assert_eq!(again.to_string(), pinned.to_string());
    }

    // The user changes the tag (or the selection): resolved afresh.
    let changed = with_tags_back(&pinned, &[("/spec/fetch/0/image/url", "nginx:latest")], None);
    let plan = ObjectPlan::new(PinnedKind::App, &changed, Some(&pinned));
    assert!(matches!(&plan.steps[0], Step::Resolve { .. }));
    let repinned = apply(
        &changed,
        &run(PinnedKind::App, &changed, Some(&pinned), &moved).ops,
    );
    assert_eq!(
        repinned["spec"]["fetch"][0]["image"]["url"],
        format!("nginx@{}", sha(7))
    );
    let changed = with_tags_back(
        &pinned,
        &[(
            "/spec/fetch/1/imgpkgBundle/image",
            "registry.corp.com/team/app-bundle",
        )],
        Some((
            "/spec/fetch/1/imgpkgBundle",
            json!({"semver": {"constraints": "<3.0.0"}}),
        )),
    );
    let plan = ObjectPlan::new(PinnedKind::App, &changed, Some(&pinned));
    assert!(matches!(&plan.steps[1], Step::Resolve { .. }));
}

#[test]
fn reinvocation_after_another_webhook_is_a_no_op() {
    let object = app(json!([
        {"image": {"url": "registry.corp.com/team/app-config:v1.2.0"}},
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle:latest"}},
    ]));
    let (_, mut pinned) = pin_and_settle(PinnedKind::App, &object);
    // Another mutating webhook adds a label; we are called again.
    pinned["metadata"]["labels"] = json!({"team": "a"});
    assert_eq!(
        run(PinnedKind::App, &pinned, None, &registry()),
        PinOutcome::default()
    );
}

//! The annotation.

use super::*;

#[test]
fn annotation_is_created_whatever_metadata_looks_like() {
    let fetch = json!([{"image": {"url": "nginx:1.25"}}]);
    let value = format!(
        r#"{{"/spec/fetch/0/image/url":{{"digest":"{}","ref":"nginx:1.25"}}}}"#,
        sha(6)
    );
    let cases = [
        // no annotations
        (app(fetch.clone()), "/metadata/annotations"),
        // annotations: null
        (
            with_metadata(app(fetch.clone()), "annotations", Value::Null),
            "/metadata/annotations",
        ),
        // other annotations
        (
            with_metadata(
                app(fetch.clone()),
                "annotations",
                json!({"kapp.k14s.io/identity": "v1"}),
            ),
            ANNOTATION_PATH,
        ),
        // an empty map (what a controller's store keeps of an object whose only annotation was
        // kubectl's last-applied copy): added into, the map on the server keeps the rest
        (
            with_metadata(app(fetch.clone()), "annotations", json!({})),
            ANNOTATION_PATH,
        ),
    ];
    for (object, path) in cases {
        let outcome = run(PinnedKind::App, &object, None, &registry());
        assert_eq!(paths(&outcome.ops), ["/spec/fetch/0/image/url", path]);
        let pinned = apply(&object, &outcome.ops);
        assert_eq!(pinned["metadata"]["annotations"][ORIGINAL_REFS_ANNOTATION], value);
        if path == ANNOTATION_PATH && object["metadata"]["annotations"]["kapp.k14s.io/identity"] == "v1" {
            assert_eq!(pinned["metadata"]["annotations"]["kapp.k14s.io/identity"], "v1");
        }
    }

    // No metadata at all (not something the API server sends, but not a reason to fail).
    let bare = json!({"spec": {"fetch": fetch}});
    let outcome = run(PinnedKind::App, &bare, None, &registry());
    assert_eq!(paths(&outcome.ops), ["/spec/fetch/0/image/url", "/metadata"]);
    assert_eq!(
        apply(&bare, &outcome.ops)["metadata"]["annotations"][ORIGINAL_REFS_ANNOTATION],
        value
    );
}

#[test]
fn annotation_bytes_are_canonical() {
    // Keys sorted at every level, compact, whatever order the user wrote tagSelection in.
    let object = app(json!([
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {"prereleases": {}, "constraints": "<2.0.0"}}}},
        {"image": {"url": "nginx:1.25"}},
    ]));
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    let expected = format!(
        concat!(
            r#"{{"/spec/fetch/0/imgpkgBundle/image":{{"digest":"{}","ref":"registry.corp.com/team/app-bundle","#,
            r#""tag":"1.5.0-rc.1","tagSelection":{{"semver":{{"constraints":"<2.0.0","prereleases":{{}}}}}}}},"#,
            r#""/spec/fetch/1/image/url":{{"digest":"{}","ref":"nginx:1.25"}}}}"#
        ),
        sha(5),
        sha(6)
    );
    assert_eq!(
        pinned["metadata"]["annotations"][ORIGINAL_REFS_ANNOTATION],
        expected
    );
}

#[test]
fn annotation_merge_keeps_pins_in_place_and_drops_the_rest() {
    // fetch[0] was pinned earlier (in place); fetch[1] is a new tag; fetch[2] was pinned by
    // holdfast but the user has since written their own digest; fetch[7] is gone.
    let bundle_pin = format!("registry.corp.com/team/app-bundle@{}", sha(3));
    let existing = json!({
        "/spec/fetch/0/imgpkgBundle/image": {"ref": "registry.corp.com/team/app-bundle:1.4.2", "digest": sha(3)},
        "/spec/fetch/2/image/url": {"ref": "registry.corp.com/team/app-config:v1.2.0", "digest": sha(1)},
        "/spec/fetch/7/image/url": {"ref": "nginx:1.25", "digest": sha(6)},
    });
    let object = with_metadata(
        app(json!([
            {"imgpkgBundle": {"image": bundle_pin}},
            {"image": {"url": "nginx:1.25"}},
            {"image": {"url": format!("registry.corp.com/team/app-config@{}", sha(42))}},
        ])),
        "annotations",
        json!({ORIGINAL_REFS_ANNOTATION: existing.to_string(), "other": "kept"}),
    );
    let (outcome, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(paths(&outcome.ops), ["/spec/fetch/1/image/url", ANNOTATION_PATH]);
    assert!(matches!(outcome.ops[1], PatchOperation::Replace(_)));
    assert_eq!(
        annotation_of(&pinned),
        json!({
            "/spec/fetch/0/imgpkgBundle/image": {"ref": "registry.corp.com/team/app-bundle:1.4.2", "digest": sha(3)},
            "/spec/fetch/1/image/url": {"ref": "nginx:1.25", "digest": sha(6)},
        })
    );
    assert_eq!(pinned["metadata"]["annotations"]["other"], "kept");
    assert_eq!(pinned["spec"]["fetch"][2], object["spec"]["fetch"][2]);
}

#[test]
fn a_repin_records_what_the_user_writes_now() {
    // The entry said v1.2.0; the user now asks for nginx:1.25 at the same place.
    let existing = json!({"/spec/fetch/0/image/url": {"ref": "registry.corp.com/team/app-config:v1.2.0", "digest": sha(1)}});
    let object = with_metadata(
        app(json!([{"image": {"url": "nginx:1.25"}}])),
        "annotations",
        json!({ORIGINAL_REFS_ANNOTATION: existing.to_string()}),
    );
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(
        annotation_of(&pinned),
        json!({"/spec/fetch/0/image/url": {"ref": "nginx:1.25", "digest": sha(6)}})
    );
}

#[test]
fn stale_entries_alone_are_removed() {
    // The user replaced holdfast's pin with their own digest: the entry must go, so the
    // controller never "re-pins" the user's digest from the old tag.
    let existing = json!({"/spec/fetch/0/image/url": {"ref": "nginx:1.25", "digest": sha(6)}});
    let object = with_metadata(
        app(json!([{"image": {"url": format!("nginx@{}", sha(99))}}])),
        "annotations",
        json!({ORIGINAL_REFS_ANNOTATION: existing.to_string()}),
    );
    let (outcome, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(paths(&outcome.ops), [ANNOTATION_PATH]);
    assert!(matches!(outcome.ops[0], PatchOperation::Remove(_)));
    assert!(
        pinned["metadata"]["annotations"]
            .get(ORIGINAL_REFS_ANNOTATION)
            .is_none()
    );
    assert_eq!(pinned["spec"], object["spec"]);
}

#[test]
fn a_reformatted_annotation_with_the_same_content_is_left_alone() {
    let existing = format!(
        "{{\n  \"/spec/fetch/0/image/url\": {{ \"ref\": \"nginx:1.25\", \"digest\": \"{}\" }}\n}}",
        sha(6)
    );
    let object = with_metadata(
        app(json!([{"image": {"url": format!("nginx@{}", sha(6))}}])),
        "annotations",
        json!({ORIGINAL_REFS_ANNOTATION: existing}),
    );
    assert_eq!(
        run(PinnedKind::App, &object, None, &registry()),
        PinOutcome::default()
    );
}

#[test]
fn an_unreadable_annotation_is_rewritten_with_a_warning() {
    let object = with_metadata(
        app(json!([{"image": {"url": "nginx:1.25"}}])),
        "annotations",
        json!({ORIGINAL_REFS_ANNOTATION: "nginx:1.25"}),
    );
    let (outcome, pinned) = pin_and_settle(PinnedKind::App, &object);
    assert_eq!(outcome.warnings.len(), 1, "{:?}", outcome.warnings);
    assert!(
        outcome.warnings[0].contains("is not the JSON object holdfast writes"),
        "{}",
        outcome.warnings[0]
    );
    assert_eq!(
        annotation_of(&pinned),
        json!({"/spec/fetch/0/image/url": {"ref": "nginx:1.25", "digest": sha(6)}})
    );

    // With nothing pinned, the unreadable annotation is removed.
    let object = with_metadata(
        app(json!([{"git": {"url": "https://github.com/corp/app"}}])),
        "annotations",
        json!({ORIGINAL_REFS_ANNOTATION: "[]"}),
    );
    let outcome = run(PinnedKind::App, &object, None, &registry());
    assert_eq!(paths(&outcome.ops), [ANNOTATION_PATH]);
    assert_eq!(outcome.warnings.len(), 1);
}

#[test]
fn original_refs_can_be_read_back() {
    let object = app(json!([
        {"image": {"url": "nginx:1.25", "secretRef": {"name": "creds"}}},
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {"constraints": "<1.2.0"}}}},
    ]));
    let (_, pinned) = pin_and_settle(PinnedKind::App, &object);
    let refs = OriginalRefs::from_object(&pinned).unwrap();
    let in_place: Vec<&str> = refs.in_place(&pinned).map(|(pointer, _)| pointer).collect();
    assert_eq!(
        in_place,
        ["/spec/fetch/0/image/url", "/spec/fetch/1/imgpkgBundle/image"]
    );
    let bundle = refs.get("/spec/fetch/1/imgpkgBundle/image").unwrap();
    assert_eq!(bundle.tag.as_deref(), Some("1.0.0"));
    assert_eq!(bundle.digest, digest(2));
    assert_eq!(
        bundle.pinned().unwrap(),
        format!("registry.corp.com/team/app-bundle@{}", sha(2))
    );
    assert!(OriginalRefs::from_object(&object).unwrap().is_empty());
    let broken = with_metadata(object, "annotations", json!({ORIGINAL_REFS_ANNOTATION: "{"}));
    assert!(OriginalRefs::from_object(&broken).is_err());
}

//! Policy.

use super::*;

#[test]
fn pin_policy_is_read_from_the_label_or_the_annotation() {
    let cases: Vec<(Value, Value, PinPolicy, usize)> = vec![
        (json!(null), json!(null), PinPolicy::Follow, 0),
        (json!({PIN_KEY: "follow"}), json!(null), PinPolicy::Follow, 0),
        (json!({PIN_KEY: "freeze"}), json!(null), PinPolicy::Freeze, 0),
        (json!({PIN_KEY: "disabled"}), json!(null), PinPolicy::Disabled, 0),
        (json!(null), json!({PIN_KEY: "freeze"}), PinPolicy::Freeze, 0),
        (
            json!({PIN_KEY: "freeze"}),
            json!({PIN_KEY: "freeze"}),
            PinPolicy::Freeze,
            0,
        ),
        (
            json!({PIN_KEY: "disabled"}),
            json!({PIN_KEY: "follow"}),
            PinPolicy::Disabled,
            1,
        ),
        (json!({PIN_KEY: "off"}), json!(null), PinPolicy::Follow, 1),
        (json!({PIN_KEY: "Freeze"}), json!(null), PinPolicy::Follow, 1),
        (json!({PIN_KEY: ""}), json!(null), PinPolicy::Follow, 1),
        (json!(null), json!({PIN_KEY: "true"}), PinPolicy::Follow, 1),
        (
            json!({"holdfast.dev/pin-policy": "freeze"}),
            json!(null),
            PinPolicy::Follow,
            0,
        ),
    ];
    for (labels, annotations, expected, warning_count) in cases {
        let mut object = app(json!([]));
        object["metadata"]["labels"] = labels.clone();
        object["metadata"]["annotations"] = annotations.clone();
        let (policy, warnings) = PinPolicy::from_object(&object);
        assert_eq!(policy, expected, "{labels} {annotations}");
        assert_eq!(
            warnings.len(),
            warning_count,
            "{labels} {annotations}: {warnings:?}"
        );
    }

    let mut object = app(json!([]));
    object["metadata"]["labels"] = json!({PIN_KEY: "off"});
    let (_, warnings) = PinPolicy::from_object(&object);
    assert_eq!(
        warnings,
        [
            "metadata.labels[\"holdfast.dev/pin\"]: unknown value \"off\"; expected follow, freeze or \
             disabled; using the default, follow"
        ]
    );
    assert_eq!("freeze".parse::<PinPolicy>(), Ok(PinPolicy::Freeze));
    assert_eq!(
        "frozen".parse::<PinPolicy>().unwrap_err().to_string(),
        "unknown value \"frozen\"; expected follow, freeze or disabled"
    );
    for policy in [PinPolicy::Follow, PinPolicy::Freeze, PinPolicy::Disabled] {
        assert_eq!(policy.to_string().parse::<PinPolicy>(), Ok(policy));
    }
}

#[test]
fn opted_out_objects_get_no_operations() {
    let object = with_metadata(
        app(json!([{"image": {"url": "nginx:1.25"}}])),
        "labels",
        json!({PIN_KEY: "disabled"}),
    );
    let plan = ObjectPlan::new(PinnedKind::App, &object, None);
    assert_eq!(plan.policy, PinPolicy::Disabled);
    assert!(plan.sites.is_empty() && plan.steps.is_empty());
    assert_eq!(
        run(PinnedKind::App, &object, None, &registry()),
        PinOutcome::default()
    );

    // Even a caller that resolved anyway gets nothing.
    let sites = fetch_sites(PinnedKind::App, &object);
    let resolution = Resolution {
        digest: digest(6),
        selected_tag: None,
        mirror: None,
        pull_secret: None,
    };
    let outcome = pin_patch(&object, &sites, &[(0, resolution)], PinPolicy::Disabled);
    assert_eq!(outcome, PinOutcome::default());
}

#[test]
fn objects_being_deleted_are_never_patched() {
    let existing = json!({"/spec/fetch/0/image/url": {"ref": "nginx:1.25", "digest": sha(6)}});
    let mut object = with_metadata(
        app(json!([{"image": {"url": "nginx:1.25"}}])),
        "annotations",
        json!({ORIGINAL_REFS_ANNOTATION: existing.to_string()}),
    );
    object["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    object["metadata"]["finalizers"] = json!([]);
    assert!(is_terminating(&object));
    let plan = ObjectPlan::new(PinnedKind::App, &object, None);
    assert!(plan.sites.is_empty() && plan.steps.is_empty());
    assert_eq!(
        run(PinnedKind::App, &object, None, &registry()),
        PinOutcome::default()
    );
    let sites = fetch_sites(PinnedKind::App, &object);
    let resolution = Resolution {
        digest: digest(6),
        selected_tag: None,
        mirror: None,
        pull_secret: None,
    };
    let outcome = pin_patch(&object, &sites, &[(0, resolution)], PinPolicy::Follow);
    assert_eq!(outcome, PinOutcome::default());
}

#[test]
fn unknown_policy_values_pin_with_the_default_and_warn() {
    let object = with_metadata(
        app(json!([{"image": {"url": "nginx:1.25"}}])),
        "labels",
        json!({PIN_KEY: "off"}),
    );
    let outcome = run(PinnedKind::App, &object, None, &registry());
    assert_eq!(
        paths(&outcome.ops),
        ["/spec/fetch/0/image/url", "/metadata/annotations"]
    );
    assert_eq!(outcome.warnings.len(), 1);
}

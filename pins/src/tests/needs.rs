//! What each site needs.

use super::*;

fn site(reference: &str, tag_selection: Option<Value>) -> FetchSite {
    let mut source = json!({"url": reference});
    if let Some(selection) = tag_selection {
        source["tagSelection"] = selection;
    }
    fetch_sites(PinnedKind::App, &app(json!([{"image": source}]))).remove(0)
}

#[test]
fn plan_says_what_each_reference_needs() {
    let pinned = format!("registry.corp.com/team/app@{}", sha(1));
    let tag_and_digest = format!("registry.corp.com/team/app:1.0@{}", sha(1));
    let semver = json!({"semver": {"constraints": ">=1.0.0"}});
    let cases: Vec<(String, Option<Value>, &str)> = vec![
        (
            "nginx:1.25".into(),
            None,
            "tag index.docker.io/library/nginx:1.25",
        ),
        ("nginx".into(), None, "tag index.docker.io/library/nginx:latest"),
        ("localhost:5000/app:v1".into(), None, "tag localhost:5000/app:v1"),
        (pinned.clone(), None, "pinned"),
        (tag_and_digest, None, "pinned"),
        (
            "registry.corp.com/team/app".into(),
            Some(semver.clone()),
            "select registry.corp.com/team/app",
        ),
    ];
    for (reference, selection, expected) in cases {
        let got = match plan(&site(&reference, selection)).unwrap() {
            Need::AlreadyPinned => "pinned".to_owned(),
            Need::Tag(r) => format!("tag {}", r.normalized()),
            Need::Select(r, s) => {
                assert_eq!(s.semver.unwrap().constraints, ">=1.0.0");
                assert_eq!(r.tag(), None);
                format!("select {}", r.name())
            }
        };
        assert_eq!(got, expected, "{reference}");
    }
}

#[test]
fn plan_rejects_what_vendir_would_fail_on() {
    let semver = json!({"semver": {"constraints": ">=1.0.0"}});
    let err = plan(&site("registry.corp.com/team/app:1.0", Some(semver.clone()))).unwrap_err();
    assert!(
        matches!(&err, SiteError::TagWithSelection { tag, .. } if tag == "1.0"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.starts_with("spec.fetch[0].image.url: "), "{message}");
    assert!(message.contains("vendir appends"), "{message}");
    assert!(
        message.contains("remove the tag or the tagSelection"),
        "{message}"
    );

    let err = plan(&site(
        &format!("registry.corp.com/team/app@{}", sha(1)),
        Some(semver),
    ))
    .unwrap_err();
    assert!(matches!(err, SiteError::DigestWithSelection { .. }), "{err:?}");
    assert!(err.to_string().contains("remove the tagSelection"));

    let err = plan(&site("registry.corp.com/team/app", Some(json!("latest")))).unwrap_err();
    assert!(matches!(err, SiteError::InvalidTagSelection { .. }), "{err:?}");

    let err = plan(&site("registry.corp.com/team/app", Some(json!({"git": {}})))).unwrap_err();
    assert!(matches!(err, SiteError::UnsupportedSelection { .. }), "{err:?}");
    assert!(err.to_string().contains("Unsupported version selection type"));
}

#[test]
fn a_tag_selection_past_the_bound_is_left_unpinned_with_its_size() {
    let at_bound = |constraints: String| json!({"semver": {"constraints": constraints}});
    // `{"semver":{"constraints":"…"}}` is 29 bytes around the constraints.
    let fits = ">=1.0.0 ".repeat(124);
    assert!(plan(&site("registry.corp.com/team/app", Some(at_bound(fits)))).is_ok());
    let err = plan(&site(
        "registry.corp.com/team/app",
        Some(at_bound("1".repeat(MAX_TAG_SELECTION_BYTES))),
    ))
    .unwrap_err();
    assert!(
        matches!(
            err,
            SiteError::SelectionTooLarge {
                max: MAX_TAG_SELECTION_BYTES,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("more than holdfast pins (1024); left unpinned"),
        "{err}"
    );
}

#[test]
fn plan_reports_unparsable_references_specifically() {
    let cases = [
        ("", "image reference is empty"),
        ("registry.corp.com/Team/App:1", "must be lowercase"),
        ("https://registry.corp.com/app:1", "URL scheme"),
        ("nginx:", "no tag after it"),
        ("nginx@sha256:abc", "invalid digest"),
    ];
    for (reference, expected) in cases {
        let err = plan(&site(reference, None)).unwrap_err();
        assert!(
            matches!(err, SiteError::InvalidReference { .. }),
            "{reference}: {err:?}"
        );
        let message = err.to_string();
        assert!(message.contains(expected), "{reference}: {message}");
        assert!(message.starts_with("spec.fetch[0].image.url: "), "{message}");
        assert!(message.ends_with("left unpinned"), "{message}");
    }
}

//! Caller mistakes.

use super::*;

#[test]
fn resolutions_that_do_not_fit_are_ignored_with_a_warning() {
    let object = app(json!([
        {"image": {"url": "nginx:1.25"}},
        {"image": {"url": format!("nginx@{}", sha(6))}},
    ]));
    let sites = fetch_sites(PinnedKind::App, &object);
    let r = |n| Resolution {
        digest: digest(n),
        selected_tag: None,
        mirror: None,
        pull_secret: None,
    };
    let outcome = pin_patch(
        &object,
        &sites,
        &[(0, r(6)), (0, r(7)), (1, r(8)), (5, r(9))],
        PinPolicy::Follow,
    );
    assert_eq!(
        paths(&outcome.ops),
        ["/spec/fetch/0/image/url", "/metadata/annotations"]
    );
    let pinned = apply(&object, &outcome.ops);
    assert_eq!(
        pinned["spec"]["fetch"][0]["image"]["url"],
        format!("nginx@{}", sha(6))
    );
    assert_eq!(pinned["spec"]["fetch"][1], object["spec"]["fetch"][1]);
    assert_eq!(outcome.warnings.len(), 2, "{:?}", outcome.warnings);

    // Sites from another object.
    let other = app(json!([{"image": {"url": "nginx:1.24"}}]));
    let outcome = pin_patch(&other, &sites, &[(0, r(6))], PinPolicy::Follow);
    assert_eq!(outcome.ops, vec![]);
    assert_eq!(outcome.warnings.len(), 1);
}

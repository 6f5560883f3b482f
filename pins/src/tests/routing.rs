//! Routing and sites.

use super::*;

#[test]
fn kinds_route_by_group_and_resource() {
    let cases = [
        ("kappctrl.k14s.io", "apps", Some(PinnedKind::App)),
        (
            "packaging.carvel.dev",
            "packagerepositories",
            Some(PinnedKind::PackageRepository),
        ),
        ("data.packaging.carvel.dev", "packages", Some(PinnedKind::Package)),
        ("packaging.carvel.dev", "packageinstalls", None),
        ("internal.packaging.carvel.dev", "internalpackages", None),
        ("apps", "deployments", None),
        ("kappctrl.k14s.io", "packages", None),
    ];
    for (group, resource, expected) in cases {
        assert_eq!(
            PinnedKind::from_group_resource(group, resource),
            expected,
            "{group}/{resource}"
        );
    }
    for kind in PinnedKind::ALL {
        assert_eq!(
            PinnedKind::from_group_resource(kind.group(), kind.resource()),
            Some(kind)
        );
    }
}

#[test]
fn app_sites_cover_image_and_bundle_and_skip_other_sources() {
    let object = app(json!([
        {"git": {"url": "https://github.com/corp/app", "ref": "origin/main"}},
        {"image": {"url": "registry.corp.com/team/app-config:v1.2.0", "secretRef": {"name": "reg-creds"}, "subPath": "config"}, "path": "cfg"},
        {"http": {"url": "https://example.com/app.tgz"}},
        {"imgpkgBundle": {"image": "registry.corp.com/team/app-bundle", "tagSelection": {"semver": {"constraints": ">=1.0.0 <2.0.0"}}}, "path": "bundle"},
        {"helmChart": {"name": "redis", "repository": {"url": "oci://registry.corp.com/charts"}}},
        {"inline": {"paths": {"a.yml": "image: nginx:1.25"}}},
    ]));
    let sites = fetch_sites(PinnedKind::App, &object);
    assert_eq!(sites.len(), 2);

    let image = &sites[0];
    assert_eq!(image.kind, SiteKind::Image);
    assert_eq!(image.pointer.as_str(), "/spec/fetch/1/image/url");
    assert_eq!(image.field, "spec.fetch[1].image.url");
    assert_eq!(image.reference, "registry.corp.com/team/app-config:v1.2.0");
    assert_eq!(image.secret_ref.as_deref(), Some("reg-creds"));
    assert_eq!(image.tag_selection, None);
    assert_eq!(image.tag_selection_pointer, None);

    let bundle = &sites[1];
    assert_eq!(bundle.kind, SiteKind::ImgpkgBundle);
    assert_eq!(bundle.pointer.as_str(), "/spec/fetch/3/imgpkgBundle/image");
    assert_eq!(bundle.field, "spec.fetch[3].imgpkgBundle.image");
    assert_eq!(bundle.secret_ref, None);
    assert_eq!(
        bundle.tag_selection_pointer.as_ref().map(|p| p.as_str()),
        Some("/spec/fetch/3/imgpkgBundle/tagSelection")
    );
    let semver = bundle.tag_selection.as_ref().unwrap().semver.as_ref().unwrap();
    assert_eq!(semver.constraints, ">=1.0.0 <2.0.0");
    assert_eq!(
        bundle.tag_selection_json,
        Some(json!({"semver": {"constraints": ">=1.0.0 <2.0.0"}}))
    );
}

#[test]
fn package_repository_fetch_is_one_object() {
    let image = fetch_sites(
        PinnedKind::PackageRepository,
        &pkgr(json!({"image": {"url": "registry.corp.com/pkgs/repo-image:1.4.0", "subPath": "repo"}})),
    );
    assert_eq!(paths_of(&image), ["/spec/fetch/image/url"]);
    assert_eq!(image[0].field, "spec.fetch.image.url");

    let bundle = fetch_sites(
        PinnedKind::PackageRepository,
        &pkgr(
            json!({"imgpkgBundle": {"image": "registry.corp.com/pkgs/repo-bundle:1.4.0", "secretRef": {"name": "reg-creds"}}}),
        ),
    );
    assert_eq!(paths_of(&bundle), ["/spec/fetch/imgpkgBundle/image"]);
    assert_eq!(bundle[0].secret_ref.as_deref(), Some("reg-creds"));

    let git = pkgr(json!({"git": {"url": "https://github.com/corp/repo", "ref": "v1"}}));
    assert!(fetch_sites(PinnedKind::PackageRepository, &git).is_empty());
}

#[test]
fn package_fetch_is_under_the_template() {
    let object = package(json!([
        {"imgpkgBundle": {"image": "registry.corp.com/pkgs/app-bundle:1.2.0"}},
        {"image": {"url": "registry.corp.com/pkgs/app-cfg:1.2.0", "subPath": "config"}},
    ]));
    let sites = fetch_sites(PinnedKind::Package, &object);
    assert_eq!(
        paths_of(&sites),
        [
            "/spec/template/spec/fetch/0/imgpkgBundle/image",
            "/spec/template/spec/fetch/1/image/url"
        ]
    );
    assert_eq!(sites[0].field, "spec.template.spec.fetch[0].imgpkgBundle.image");
}

fn paths_of(sites: &[FetchSite]) -> Vec<&str> {
    sites.iter().map(|s| s.pointer.as_str()).collect()
}

#[test]
fn shapes_without_references_yield_no_sites() {
    let cases = [
        (PinnedKind::App, json!({"metadata": {"name": "x"}})),
        (PinnedKind::App, app(json!(null))),
        (PinnedKind::App, app(json!({"image": {"url": "nginx:1.25"}}))), // not a list
        (PinnedKind::App, app(json!([{"image": {"subPath": "x"}}]))),    // no url
        (PinnedKind::App, app(json!([{"image": {"url": 5}}]))),
        (PinnedKind::App, app(json!([{"image": "nginx:1.25"}]))), // source not an object
        (
            PinnedKind::App,
            app(json!([{"imgpkgBundle": {"url": "nginx:1.25"}}])),
        ), // bundle's key is `image`
        (
            PinnedKind::PackageRepository,
            pkgr(json!([{"image": {"url": "nginx:1.25"}}])),
        ), // a list
        (
            PinnedKind::Package,
            app(json!([{"image": {"url": "nginx:1.25"}}])),
        ), // App shape
    ];
    for (kind, object) in cases {
        assert!(fetch_sites(kind, &object).is_empty(), "{kind}: {object}");
    }
}

#[test]
fn a_null_tag_selection_counts_as_absent() {
    let object = app(json!([{"image": {"url": "nginx:1.25", "tagSelection": null}}]));
    let site = &fetch_sites(PinnedKind::App, &object)[0];
    assert_eq!(site.tag_selection_json, None);
    assert_eq!(site.tag_selection_pointer, None);
    assert!(matches!(plan(site), Ok(Need::Tag(_))));
}

#[test]
fn json_pointers_escape_their_tokens() {
    let path = PointerBuf::from_tokens(["metadata", "annotations", ORIGINAL_REFS_ANNOTATION]);
    assert_eq!(path.as_str(), ANNOTATION_PATH);
}

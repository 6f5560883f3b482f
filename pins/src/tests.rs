use std::collections::BTreeMap;

use holdfast_registry::{Digest, select_tag};
use json_patch::{PatchOperation, jsonptr::PointerBuf};
use serde_json::{Value, json};

use super::*;

const ANNOTATION_PATH: &str = "/metadata/annotations/holdfast.dev~1original-refs";

fn digest(n: u8) -> Digest {
    Digest::parse(&format!("sha256:{}", format!("{n:02x}").repeat(32))).unwrap()
}

fn sha(n: u8) -> String {
    digest(n).to_string()
}

/// A registry for the tests: tags and their digests, by normalised repository name.
struct Registry(BTreeMap<&'static str, Vec<(&'static str, u8)>>);

fn registry() -> Registry {
    Registry(BTreeMap::from([
        ("registry.corp.com/team/app-config", vec![("v1.2.0", 1)]),
        (
            "registry.corp.com/team/app-bundle",
            vec![
                ("1.0.0", 2),
                ("1.4.2", 3),
                ("2.0.0", 4),
                ("1.5.0-rc.1", 5),
                ("latest", 9),
            ],
        ),
        ("index.docker.io/library/nginx", vec![("1.25", 6), ("latest", 7)]),
        ("registry.corp.com/pkgs/repo-bundle", vec![("1.4.0", 8)]),
    ]))
}

impl Registry {
    fn digest_of(&self, name: &str, tag: &str) -> Option<Digest> {
        self.0
            .get(name)?
            .iter()
            .find(|(t, _)| *t == tag)
            .map(|(_, n)| digest(*n))
    }

    fn resolve(&self, need: &Need) -> Option<Resolution> {
        match need {
            Need::AlreadyPinned => None,
            Need::Tag(reference) => Some(Resolution {
                digest: self.digest_of(&reference.name(), reference.identifier())?,
                selected_tag: None,
                mirror: None,
                pull_secret: None,
            }),
            Need::Select(repository, selection) => {
                let tags: Vec<&str> = self
                    .0
                    .get(repository.name().as_str())?
                    .iter()
                    .map(|(t, _)| *t)
                    .collect();
                let tag = select_tag(&tags, selection).ok()?;
                Some(Resolution {
                    digest: self.digest_of(&repository.name(), tag)?,
                    selected_tag: Some(tag.to_owned()),
                    mirror: None,
                    pull_secret: None,
                })
            }
        }
    }

    /// Moves a tag to another digest.
    fn retag(mut self, name: &'static str, tag: &'static str, n: u8) -> Self {
        let tags = self.0.entry(name).or_default();
        tags.retain(|(t, _)| *t != tag);
        tags.push((tag, n));
        self
    }
}

/// The caller's part, as the webhook does it: plan, resolve (fallback on failure), patch.
fn run(kind: PinnedKind, object: &Value, old: Option<&Value>, registry: &Registry) -> PinOutcome {
    let plan = ObjectPlan::new(kind, object, old);
    let resolutions: Vec<(usize, Resolution)> = plan
        .steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| match step {
            Step::Resolve { need, fallback } => registry
                .resolve(need)
                .or_else(|| fallback.clone())
                .map(|r| (index, r)),
            Step::Reuse(resolution) => Some((index, resolution.clone())),
            Step::Keep | Step::Invalid(_) => None,
        })
        .collect();
    let mut outcome = pin_patch(object, &plan.sites, &resolutions, plan.policy);
    outcome.warnings.splice(0..0, plan.warnings);
    outcome
}

fn apply(object: &Value, ops: &[PatchOperation]) -> Value {
    let mut doc = object.clone();
    json_patch::patch(&mut doc, ops).unwrap();
    doc
}

/// Pins, applies, and checks that running the rule again on the result changes nothing.
fn pin_and_settle(kind: PinnedKind, object: &Value) -> (PinOutcome, Value) {
    let outcome = run(kind, object, None, &registry());
    let pinned = apply(object, &outcome.ops);
    let again = run(kind, &pinned, Some(&pinned), &registry());
    assert_eq!(
        again.ops,
        vec![],
        "second run on the pinned object must be a no-op"
    );
    (outcome, pinned)
}

fn annotation_of(object: &Value) -> Value {
    let text = object["metadata"]["annotations"][ORIGINAL_REFS_ANNOTATION]
        .as_str()
        .unwrap();
    serde_json::from_str(text).unwrap()
}

fn paths(ops: &[PatchOperation]) -> Vec<String> {
    ops.iter().map(|op| op.path().to_string()).collect()
}

fn app(fetch: Value) -> Value {
    json!({
        "apiVersion": "kappctrl.k14s.io/v1alpha1",
        "kind": "App",
        "metadata": {"name": "simple-app", "namespace": "apps"},
        "spec": {"serviceAccountName": "apps-sa", "fetch": fetch, "template": [{"ytt": {}}], "deploy": [{"kapp": {}}]},
    })
}

fn pkgr(fetch: Value) -> Value {
    json!({
        "apiVersion": "packaging.carvel.dev/v1alpha1",
        "kind": "PackageRepository",
        "metadata": {"name": "corp-repo", "namespace": "apps"},
        "spec": {"syncPeriod": "10m", "fetch": fetch},
    })
}

fn package(fetch: Value) -> Value {
    json!({
        "apiVersion": "data.packaging.carvel.dev/v1alpha1",
        "kind": "Package",
        "metadata": {"name": "app.corp.com.1.2.0", "namespace": "apps"},
        "spec": {"refName": "app.corp.com", "version": "1.2.0", "template": {"spec": {"fetch": fetch, "deploy": [{"kapp": {}}]}}},
    })
}

fn with_metadata(mut object: Value, key: &str, value: Value) -> Value {
    object["metadata"][key] = value;
    object
}

// ---------------------------------------------------------------------------------------------
// Routing and sites

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

// ---------------------------------------------------------------------------------------------
// What each site needs

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

// ---------------------------------------------------------------------------------------------
// Patches

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

// ---------------------------------------------------------------------------------------------
// The annotation

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
    ];
    for (object, path) in cases {
        let outcome = run(PinnedKind::App, &object, None, &registry());
        assert_eq!(paths(&outcome.ops), ["/spec/fetch/0/image/url", path]);
        let pinned = apply(&object, &outcome.ops);
        assert_eq!(pinned["metadata"]["annotations"][ORIGINAL_REFS_ANNOTATION], value);
        if path == ANNOTATION_PATH {
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

// ---------------------------------------------------------------------------------------------
// Policy

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

// ---------------------------------------------------------------------------------------------
// Idempotency and reinvocation

/// The UPDATE an apply sends when it puts the tag back: the pinned object with the originals
/// restored in the spec (the annotation stays, as client-side apply leaves it).
fn with_tags_back(pinned: &Value, originals: &[(&str, &str)], tag_selection: Option<(&str, Value)>) -> Value {
    let mut object = pinned.clone();
    for (pointer, reference) in originals {
        *object.pointer_mut(pointer).unwrap() = json!(reference);
    }
    if let Some((source, selection)) = tag_selection {
        object.pointer_mut(source).unwrap()["tagSelection"] = selection;
    }
    object
}

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

// ---------------------------------------------------------------------------------------------
// Caller mistakes

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

// ---------------------------------------------------------------------------------------------
// Mirror

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
    use holdfast_registry::{Reference, cache::Mirrored, mirror::MirrorLocation};
    use std::time::SystemTime;

    let mirror = MirrorLocation::new("cache.corp.com:5000", "mirror").unwrap();
    let source = Reference::parse("registry.corp.com/team/app-config:v1.2.0").unwrap();
    let record = |location: String| Mirrored {
        location,
        at: SystemTime::now(),
    };
    let here = record(format!("{MIRROR_REPO}@{}", sha(1)));
    assert_eq!(
        resolve::mirror_repository(&mirror, &source, &digest(1), Some(&here)),
        Some(MIRROR_REPO.to_owned())
    );
    assert_eq!(
        resolve::mirror_repository(&mirror, &source, &digest(1), None),
        None
    );
    // Another digest (the tag moved), another prefix, another mirror.
    assert_eq!(
        resolve::mirror_repository(&mirror, &source, &digest(2), Some(&here)),
        None
    );
    let other_prefix = MirrorLocation::new("cache.corp.com:5000", "other").unwrap();
    assert_eq!(
        resolve::mirror_repository(&other_prefix, &source, &digest(1), Some(&here)),
        None
    );
    let elsewhere = record(format!(
        "old-cache.corp.com/mirror/registry.corp.com/team/app-config@{}",
        sha(1)
    ));
    assert_eq!(
        resolve::mirror_repository(&mirror, &source, &digest(1), Some(&elsewhere)),
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
    let scope = |name: &str| holdfast_registry::cache::Scope::Secret {
        namespace: namespace.into(),
        name: name.into(),
    };
    let cache =
        holdfast_registry::cache::DigestCache::new(std::sync::Arc::new(NoRegistry), Default::default(), None);
    // Only the user's Secret's entry is held; the pull Secret's would need the registry,
    // which this pinner (no Secret reads) cannot ask with it.
    cache.insert(holdfast_registry::cache::CacheEntry::resolved(
        holdfast_registry::cache::CacheKey::tag(&reference, scope("team-creds")),
        digest(2),
        std::time::SystemTime::now(),
    ));
    let pinner = Pinner::new(std::sync::Arc::new(cache), None);
    let update =
        futures::executor::block_on(pinner.reconcile(PinnedKind::App, namespace, &BTreeMap::new(), &stored))
            .unwrap();
    assert_eq!(update.warnings, Vec::<String>::new());
    let out = apply(&stored, &update.ops);
    let image = &out["spec"]["fetch"][0]["image"];
    assert_eq!(
        image["url"],
        json!(format!("registry.corp.com/team/app-config@{}", sha(2)))
    );
    assert_eq!(image["secretRef"]["name"], "team-creds");
    // The webhook's UPDATE, likewise.
    let outcome = futures::executor::block_on(pinner.pin(
        PinnedKind::App,
        namespace,
        &BTreeMap::new(),
        &stored,
        Some(&pinned),
    ));
    assert_eq!(outcome.warnings, Vec::<String>::new());
    assert_eq!(apply(&stored, &outcome.ops), out);
}

/// A registry that is never to be asked.
struct NoRegistry;

impl holdfast_registry::cache::Source for NoRegistry {
    fn digest<'a>(
        &'a self,
        _: &'a holdfast_registry::Reference,
        _: &'a holdfast_registry::Credentials,
    ) -> futures::future::BoxFuture<'a, Result<Digest, holdfast_registry::ResolveError>> {
        unreachable!("the registry was asked")
    }

    fn tags<'a>(
        &'a self,
        _: &'a holdfast_registry::Reference,
        _: &'a holdfast_registry::Credentials,
    ) -> futures::future::BoxFuture<'a, Result<Vec<String>, holdfast_registry::ResolveError>> {
        unreachable!("the registry was asked")
    }
}

/// Records every Secret read, answering each with a Secret of `uid`.
struct RecordingSecrets {
    uid: &'static str,
    reads: std::sync::Mutex<Vec<(String, String)>>,
}

impl RecordingSecrets {
    fn new(uid: &'static str) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            uid,
            reads: std::sync::Mutex::default(),
        })
    }

    fn reads(&self) -> Vec<(String, String)> {
        self.reads.lock().unwrap().clone()
    }
}

impl resolve::SecretSource for RecordingSecrets {
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> futures::future::BoxFuture<'static, Result<Option<k8s_openapi::api::core::v1::Secret>, String>> {
        self.reads.lock().unwrap().push((namespace.into(), name.into()));
        let secret = k8s_openapi::api::core::v1::Secret {
            metadata: kube::api::ObjectMeta {
                uid: Some(self.uid.into()),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                ("username".into(), k8s_openapi::ByteString(b"db".to_vec())),
                ("password".into(), k8s_openapi::ByteString(b"hunter2".to_vec())),
            ])),
            ..Default::default()
        };
        Box::pin(futures::future::ready(Ok(Some(secret))))
    }
}

fn secret_scope(namespace: &str, name: &str) -> holdfast_registry::cache::Scope {
    holdfast_registry::cache::Scope::Secret {
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// An entry as anyone who may write `DigestCacheEntry` objects can make one.
fn hand_made_entry(
    reference: &str,
    scope: holdfast_registry::cache::Scope,
) -> holdfast_registry::cache::CacheEntry {
    holdfast_registry::cache::CacheEntry::resolved(
        holdfast_registry::cache::CacheKey::tag(
            &holdfast_registry::Reference::parse(reference).unwrap(),
            scope,
        ),
        digest(1),
        std::time::SystemTime::now(),
    )
}

/// Issue 15, item 1: an entry naming `secret:victim/db-creds` and a registry of the writer's
/// choice made the refresher read that Secret and send it there (`NoRegistry` panics when
/// asked). Only keys that live objects name are refreshed now.
#[test]
fn an_entry_no_object_names_is_not_refreshed_and_its_secret_never_read() {
    let cache =
        holdfast_registry::cache::DigestCache::new(std::sync::Arc::new(NoRegistry), Default::default(), None);
    cache.insert(hand_made_entry(
        "attacker.example/exfil:1",
        secret_scope("victim", "db-creds"),
    ));
    let secrets = RecordingSecrets::new("uid-1");
    let pinner = Pinner::new(std::sync::Arc::new(cache), Some(secrets.clone()));
    let report = futures::executor::block_on(pinner.refresh_all(&std::collections::HashSet::new()));
    assert_eq!(secrets.reads(), Vec::<(String, String)>::new());
    assert_eq!((report.checked, report.failed, report.unnamed), (0, 0, 1));
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
        holdfast_registry::cache::CacheKey::tag(&config, secret_scope("team", "creds"))
    );
    assert_eq!(keys[1].scope, holdfast_registry::cache::Scope::Anonymous);
    assert!(keys[1].selection.is_some());

    // Pinned (follow): the original tag is what it names, still with its own Secret.
    let (outcome, _) = pin_and_settle(PinnedKind::App, &team_app);
    let pinned = apply(&team_app, &outcome.ops);
    assert_eq!(resolve::named_keys(PinnedKind::App, &pinned), keys);

    // The victim's Secret is named by no object of another namespace: refreshing what `team`
    // names reads `team/creds` only, whatever entries exist.
    let cache =
        holdfast_registry::cache::DigestCache::new(std::sync::Arc::new(NoRegistry), Default::default(), None);
    cache.insert(hand_made_entry(
        "registry.corp.com/team/app-config:v1.2.0",
        secret_scope("victim", "db-creds"),
    ));
    let secrets = RecordingSecrets::new("uid-1");
    let pinner = Pinner::new(std::sync::Arc::new(cache), Some(secrets.clone()));
    let named = keys.into_iter().collect();
    let report = futures::executor::block_on(pinner.refresh_all(&named));
    assert!(secrets.reads().is_empty());
    assert_eq!(report.unnamed, 1);
}

#[test]
fn refreshable_keys_are_the_named_ones_once_each() {
    let named_entry = hand_made_entry("registry.corp.com/team/app:1", secret_scope("team", "creds"));
    let other = hand_made_entry("registry.corp.com/team/app:1", secret_scope("victim", "db-creds"));
    let named = std::collections::HashSet::from([named_entry.key.clone()]);
    let keys = resolve::refreshable(vec![named_entry.clone(), other, named_entry.clone()], &named);
    assert_eq!(keys, [(named_entry.key, named_entry.digest)]);
}

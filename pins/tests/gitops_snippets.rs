//! README's Argo CD `ignoreDifferences` snippet names exactly the fields holdfast patches, for
//! every pinned kind: the reference, `tagSelection` and `secretRef.name` of every fetch source
//! that [`fetch_sites`] finds, and the `holdfast.dev/original-refs` annotation. A user who copies
//! it is neither left OutOfSync nor hiding a field holdfast never touches.

// Helpers outside #[test] fns are not covered by clippy.toml's allow-expect-in-tests.
#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};

use holdfast_pins::{ORIGINAL_REFS_ANNOTATION, PinnedKind, fetch_sites};
use serde_json::{Value, json};

/// A fetch source of type `key` with every field holdfast may patch: a tag, a tagSelection, a
/// secretRef.
fn source(key: &str, reference: &str) -> Value {
    json!({key: {reference: "registry.example/repo", "tagSelection": {"semver": {"constraints": ">=1.0.0"}}, "secretRef": {"name": "creds"}}})
}

/// Objects of `kind` that hold a source of each type: one object with a list of both, or (a
/// PackageRepository's fetch is a single source) one object per type.
fn samples(kind: PinnedKind) -> Vec<Value> {
    let wrap = |mut value: Value| {
        for key in kind.fetch_path().iter().rev() {
            value = json!({ *key: value });
        }
        value
    };
    let sources = [source("image", "url"), source("imgpkgBundle", "image")];
    if kind.fetch_is_list() {
        vec![wrap(Value::Array(sources.to_vec()))]
    } else {
        sources.into_iter().map(wrap).collect()
    }
}

/// `/spec/fetch/0/image/url` → `.spec.fetch[]?.image.url` (any index: Argo CD's jq form).
fn jq(pointer: &str) -> String {
    pointer
        .split('/')
        .skip(1)
        .map(|token| {
            if token.parse::<usize>().is_ok() {
                "[]?".to_string()
            } else {
                format!(".{token}")
            }
        })
        .collect::<String>()
        .replace(".[]?", "[]?")
}

fn patched_paths(kind: PinnedKind) -> BTreeSet<String> {
    let mut paths = BTreeSet::new();
    for object in samples(kind) {
        let sites = fetch_sites(kind, &object);
        assert!(!sites.is_empty(), "{kind}: the sample has no fetch sites");
        for site in sites {
            paths.insert(jq(&site.pointer.to_string()));
            paths.insert(jq(&site.secret_name_pointer().to_string()));
            let selection = site.tag_selection_pointer.expect("the sample has a tagSelection");
            paths.insert(jq(&selection.to_string()));
        }
    }
    paths.insert(format!(".metadata.annotations[\"{ORIGINAL_REFS_ANNOTATION}\"]"));
    paths
}

/// The README's snippet: (group, kind) → its jqPathExpressions.
fn readme_snippet() -> BTreeMap<(String, String), BTreeSet<String>> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
    let start = readme
        .find("<!-- gitops-argocd")
        .expect("no gitops-argocd marker in README");
    let end = readme.find("<!-- /gitops-argocd -->").expect("no closing marker");
    let block = &readme[start..end];
    let yaml = block
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("no yaml block");
    let doc: serde_yaml::Value = serde_yaml::from_str(yaml).expect("the snippet is YAML");
    let mut out = BTreeMap::new();
    for entry in doc["spec"]["ignoreDifferences"]
        .as_sequence()
        .expect("ignoreDifferences")
    {
        let group = entry["group"].as_str().expect("group").to_string();
        let kind = entry["kind"].as_str().expect("kind").to_string();
        let paths = entry["jqPathExpressions"]
            .as_sequence()
            .expect("jqPathExpressions")
            .iter()
            .map(|p| p.as_str().expect("a string").to_string())
            .collect();
        out.insert((group, kind), paths);
    }
    out
}

#[test]
fn readme_argocd_snippet_names_exactly_the_patched_fields() {
    let snippet = readme_snippet();
    let expected: BTreeMap<(String, String), BTreeSet<String>> = PinnedKind::ALL
        .into_iter()
        .map(|kind| {
            (
                (kind.group().to_string(), kind.kind().to_string()),
                patched_paths(kind),
            )
        })
        .collect();
    assert_eq!(
        snippet, expected,
        "README's Argo CD snippet and the fields holdfast patches differ"
    );
}

#[test]
fn jq_paths_drop_indexes() {
    assert_eq!(jq("/spec/fetch/0/image/url"), ".spec.fetch[]?.image.url");
    assert_eq!(
        jq("/spec/fetch/imgpkgBundle/image"),
        ".spec.fetch.imgpkgBundle.image"
    );
}

//! The pinning rule's unit tests, one module per concern; the fixtures (a fake registry, the
//! caller's plan-resolve-patch loop, objects of each kind) are here.

use std::collections::BTreeMap;

use holdfast_registry::{Digest, select_tag};
use json_patch::{PatchOperation, jsonptr::PointerBuf};
use serde_json::{Value, json};

use super::*;

mod annotation;
mod caller_mistakes;
mod idempotency;
mod mirror;
mod needs;
mod patches;
mod policy;
mod policy_params;
mod routing;

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

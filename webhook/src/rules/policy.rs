//! Policy (validating): which registries fetch references may name, and which namespaces take
//! only digests — from a reviewable config file. In `audit` mode every denial becomes a warning.
//!
//! Runs after the mutating webhook, so it sees what holdfast pinned: a namespace that requires
//! digests denies only what could not be pinned (a tag the registry did not resolve, an invalid
//! reference), with a message that says what to fix.
//!
//! The sources holdfast does not pin are judged too, so they are no way around the policy: the
//! allowlist applies to where an `http`, `git` or `helmChart` source fetches from (its URL's
//! `host[:port]/path`), and a namespace that requires digests takes them only when their spec
//! fixes the content (`http` with `sha256`, `git` at a full commit id; never `helmChart`).

use holdfast_pins::{PinnedKind, fetch_sites, other_sources::other_sources};
use holdfast_registry::Reference;
use kube::core::admission::Operation;
use serde::Deserialize;

use crate::{
    cluster::ClusterView,
    decision::{Decision, Verdict},
    review::Request,
};

pub const NAME: &str = "policy";

/// The policy file (`--policy-file`, YAML).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Policy {
    /// `registry` or `registry/repository-prefix` entries; empty means every registry is allowed.
    /// Matched against the normalised reference (`docker.io/x` is `index.docker.io/library/x`).
    #[serde(default)]
    pub allowed_registries: Vec<String>,
    /// Namespaces carrying this label with value `"true"` accept only digest references.
    #[serde(default = "default_require_digests_label")]
    pub require_digests_label: String,
    #[serde(default)]
    pub mode: Mode,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deny what breaks the policy.
    #[default]
    Enforce,
    /// Admit with warnings instead (to roll a policy out).
    Audit,
}

pub fn default_require_digests_label() -> String {
    "holdfast.dev/require-digests".into()
}

impl Policy {
    pub fn from_yaml(text: &str) -> Result<Self, serde_yaml::Error> {
        serde_yaml::from_str(text)
    }

    fn allows(&self, reference: &Reference) -> bool {
        self.allows_location(&reference.name())
    }

    /// Whether `location` (`host[:port]/path`) is one of the allowed entries or below one.
    fn allows_location(&self, location: &str) -> bool {
        self.allowed_registries.is_empty()
            || self.allowed_registries.iter().any(|allowed| {
                let allowed = allowed.trim_end_matches('/');
                location == allowed
                    || location
                        .strip_prefix(allowed)
                        .is_some_and(|rest| rest.starts_with('/'))
            })
    }
}

pub fn evaluate(
    kind: PinnedKind,
    request: &Request<'_>,
    policy: &Policy,
    cluster: &dyn ClusterView,
) -> Verdict {
    let (Operation::Create | Operation::Update) = request.operation else {
        return Verdict::allow();
    };
    let object: serde_json::Value = match super::object(request, NAME) {
        Ok(object) => object,
        Err(answer) => return answer,
    };
    // An object on its way out (kapp-controller removing its finalizer) is never held up.
    if holdfast_pins::is_terminating(&object) {
        return Verdict::allow();
    }
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let requires_digests = cluster
        .namespace_label(namespace, &policy.require_digests_label)
        .as_deref()
        == Some("true");
    check(kind, &object, policy, requires_digests, namespace)
}

/// The pure decision: every violation named, then denied (enforce) or warned (audit).
pub fn check(
    kind: PinnedKind,
    object: &serde_json::Value,
    policy: &Policy,
    requires_digests: bool,
    namespace: &str,
) -> Verdict {
    let mut violations = Vec::new();
    for site in fetch_sites(kind, object) {
        match Reference::parse(&site.reference) {
            Err(e) => violations.push(format!(
                "{}: {:?} is not a valid image reference: {e}",
                site.field, site.reference
            )),
            Ok(reference) => {
                if !policy.allows(&reference) {
                    violations.push(format!(
                        "{}: registry of {:?} is not allowed (allowed: {}); mirror the image to an allowed registry",
                        site.field,
                        site.reference,
                        policy.allowed_registries.join(", ")
                    ));
                }
                if requires_digests && !reference.is_pinned() {
                    violations.push(format!(
                        "{}: {:?} could not be pinned to a digest and namespace {namespace} requires digests ({}=true); \
                         check that the tag exists and the registry is reachable, or write repo@sha256:…",
                        site.field, site.reference, policy.require_digests_label
                    ));
                }
            }
        }
    }
    for source in other_sources(kind, object) {
        let allowed = policy.allowed_registries.is_empty()
            || source
                .location
                .as_deref()
                .is_some_and(|location| policy.allows_location(location));
        if !allowed {
            violations.push(format!(
                "{}: {} source {:?} is not in an allowed location (allowed: {})",
                source.field,
                source.source,
                source.url,
                policy.allowed_registries.join(", ")
            ));
        }
        if requires_digests && !source.fixed {
            violations.push(format!(
                "{}: the {} source {:?} does not fix its content and namespace {namespace} requires digests ({}=true); {}",
                source.field,
                source.source,
                source.url,
                policy.require_digests_label,
                match source.source {
                    "http" => "give its sha256",
                    "git" => "set ref to a full commit id",
                    _ => "use an imgpkgBundle or image source by digest",
                }
            ));
        }
    }
    match (violations.is_empty(), policy.mode) {
        (true, _) => Verdict::allow(),
        (false, Mode::Audit) => Verdict {
            decision: Decision::Allow,
            warnings: violations
                .into_iter()
                .map(|v| format!("holdfast policy (audit): {v}"))
                .collect(),
        },
        (false, Mode::Enforce) => {
            Decision::Deny(format!("holdfast policy: {}", violations.join("; "))).into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

    fn app(urls: &[&str]) -> serde_json::Value {
        let fetch: Vec<_> = urls.iter().map(|u| json!({"image": {"url": u}})).collect();
        json!({"spec": {"fetch": fetch}})
    }

    fn policy(yaml: &str) -> Policy {
        Policy::from_yaml(yaml).unwrap()
    }

    #[test]
    fn the_default_policy_allows_everything() {
        let verdict = check(
            PinnedKind::App,
            &app(&["docker.io/nginx:1"]),
            &Policy::default(),
            false,
            "ns",
        );
        assert_eq!(verdict, Verdict::allow());
    }

    #[test]
    fn registries_outside_the_allowlist_are_denied_by_name() {
        let p = policy("allowedRegistries: [registry.corp.com, ghcr.io/org]\n");
        let ok = app(&[
            &format!("registry.corp.com/team/app@{DIGEST}"),
            "ghcr.io/org/tool:1",
        ]);
        assert_eq!(check(PinnedKind::App, &ok, &p, false, "ns"), Verdict::allow());
        let verdict = check(
            PinnedKind::App,
            &app(&["ghcr.io/organisation/tool:1", "nginx"]),
            &p,
            false,
            "ns",
        );
        let Decision::Deny(message) = verdict.decision else {
            panic!("not denied")
        };
        assert!(
            message.contains("spec.fetch[0].image.url") && message.contains("ghcr.io/organisation/tool:1"),
            "{message}"
        );
        assert!(
            message.contains("spec.fetch[1].image.url"),
            "Docker Hub is not in the list: {message}"
        );
    }

    #[test]
    fn namespaces_requiring_digests_deny_what_was_not_pinned() {
        let p = Policy::default();
        let pinned = app(&[&format!("registry.corp.com/team/app@{DIGEST}")]);
        assert_eq!(check(PinnedKind::App, &pinned, &p, true, "ns"), Verdict::allow());
        let verdict = check(
            PinnedKind::App,
            &app(&["registry.corp.com/team/app:1.0"]),
            &p,
            true,
            "prod",
        );
        let Decision::Deny(message) = verdict.decision else {
            panic!("not denied")
        };
        assert!(
            message.contains("could not be pinned") && message.contains("prod"),
            "{message}"
        );
    }

    #[test]
    fn audit_mode_warns_instead() {
        let p = policy("mode: audit\nallowedRegistries: [registry.corp.com]\n");
        let verdict = check(PinnedKind::App, &app(&["nginx:1"]), &p, false, "ns");
        assert_eq!(verdict.decision, Decision::Allow);
        assert!(
            verdict.warnings[0].starts_with("holdfast policy (audit):"),
            "{:?}",
            verdict.warnings
        );
    }

    #[test]
    fn other_sources_are_held_to_the_allowlist_by_location() {
        let p = policy("allowedRegistries: [registry.corp.com, git.corp.com/platform]\n");
        let fetch = |entries: serde_json::Value| json!({"spec": {"fetch": entries}});
        let ok = fetch(json!([
            {"helmChart": {"name": "a", "repository": {"url": "oci://registry.corp.com/charts"}}},
            {"git": {"url": "https://git.corp.com/platform/config", "ref": "origin/main"}},
            {"inline": {"paths": {"a.yml": "x"}}},
        ]));
        assert_eq!(check(PinnedKind::App, &ok, &p, false, "ns"), Verdict::allow());
        let bad = fetch(json!([
            {"http": {"url": "https://evil.example/x.tgz"}},
            {"git": {"url": "https://git.corp.com/platformer/x"}},
            {"helmChart": {"name": "a", "repository": {"url": "file:///etc"}}},
        ]));
        let Decision::Deny(message) = check(PinnedKind::App, &bad, &p, false, "ns").decision else {
            panic!("not denied")
        };
        for field in [
            "spec.fetch[0].http.url",
            "spec.fetch[1].git.url",
            "spec.fetch[2].helmChart.repository.url",
        ] {
            assert!(
                message.contains(&format!("{field}: ")),
                "{field} not in {message}"
            );
        }
    }

    #[test]
    fn namespaces_requiring_digests_take_other_sources_only_when_fixed() {
        let p = Policy::default();
        let fetch = |entries: serde_json::Value| json!({"spec": {"fetch": entries}});
        let fixed = fetch(json!([
            {"http": {"url": "https://f.corp.com/x.tgz", "sha256": "b".repeat(64)}},
            {"git": {"url": "https://git.corp.com/x", "ref": "0123456789abcdef0123456789abcdef01234567"}},
        ]));
        assert_eq!(check(PinnedKind::App, &fixed, &p, true, "prod"), Verdict::allow());
        let moving = fetch(json!([
            {"http": {"url": "https://f.corp.com/x.tgz"}},
            {"git": {"url": "https://git.corp.com/x", "ref": "origin/main"}},
            {"helmChart": {"name": "a", "repository": {"url": "https://charts.corp.com"}}},
        ]));
        let Decision::Deny(message) = check(PinnedKind::App, &moving, &p, true, "prod").decision else {
            panic!("not denied")
        };
        for hint in [
            "give its sha256",
            "set ref to a full commit id",
            "use an imgpkgBundle or image source by digest",
        ] {
            assert!(message.contains(hint), "{hint} not in {message}");
        }
        assert_eq!(
            check(PinnedKind::App, &moving, &p, false, "dev"),
            Verdict::allow(),
            "no allowlist and no digests required: nothing to judge"
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(Policy::from_yaml("allowedRegistry: [x]\n").is_err());
        assert!(Policy::from_yaml("mode: strict\n").is_err());
    }
}

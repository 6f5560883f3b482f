//! The pinning policy (`manifests/base/policy/pin-cached.yaml`; issue 31): two
//! MutatingAdmissionPolicies of one body, one per parameter kind, and their bindings. What the
//! manifests must hold of them ([`check_pinning_policy`]) and SECURITY.md's table of them
//! ([`policies_from_doc`], [`policies_from_manifests`]).

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use serde_yaml::Value;

use crate::{
    tables::{plain, table},
    yaml::{at, find, id, items, of_kind, strings, text, webhooks},
};

/// The policies (and their bindings, named alike), each with the parameter kind it reads.
pub const PINNING_POLICIES: [&str; 2] = ["holdfast-pin-cached", "holdfast-pin-cached-private"];

/// The parameter kind each of [`PINNING_POLICIES`] reads.
const PARAM_KINDS: [&str; 2] = ["ClusterDigestPins", "DigestPins"];

/// The webhook whose namespaces and objects the bindings serve, and which pins what the policy
/// leaves.
const PIN_WEBHOOK: &str = "pin-fetch-refs.holdfast.dev";

/// The controller's flag that publishes the parameters.
const PUBLISH_OFF: &str = "--publish-pins=false";

/// The pinning policy of a rendering, whole or absent (components/no-pinning-policy): both
/// policies of one body (but their name and parameter kind), each reading its kind, failing
/// open, matching only App and PackageRepository (Packages are served by kapp-controller's
/// aggregated API server, which runs no policy); each binding with its policy's name, parameters
/// by selector with no namespace (the private kind is read in the admitted object's namespace
/// only; the cluster kind has none) and skipped when there are none, serving exactly the
/// namespaces and objects the webhook pin-fetch-refs serves; and the controller publishing
/// parameters exactly while the policy is installed.
pub fn check_pinning_policy(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let policies: Vec<&Value> = PINNING_POLICIES
        .iter()
        .filter_map(|name| find(objects, "MutatingAdmissionPolicy", name).ok())
        .collect();
    let bindings: Vec<&Value> = PINNING_POLICIES
        .iter()
        .filter_map(|name| find(objects, "MutatingAdmissionPolicyBinding", name).ok())
        .collect();
    let publishes = find(objects, "Deployment", "holdfast-controller").is_ok_and(|controller| {
        !strings(at(controller, "spec.template.spec.containers.0.args")).contains(&PUBLISH_OFF.to_owned())
    });
    if policies.is_empty() && bindings.is_empty() {
        if publishes {
            problems.push(format!(
                "no pinning policy, yet the controller publishes its parameters (pass {PUBLISH_OFF})"
            ));
        }
        return problems;
    }
    if policies.len() != PINNING_POLICIES.len() || bindings.len() != PINNING_POLICIES.len() {
        problems.push(format!(
            "the pinning policy is partial: policies and bindings {PINNING_POLICIES:?} go together"
        ));
        return problems;
    }
    if !publishes {
        problems.push(format!(
            "the pinning policy is installed but the controller runs {PUBLISH_OFF}: it would pin nothing"
        ));
    }
    let body = |policy: &Value| {
        let mut spec = at(policy, "spec").cloned().unwrap_or_default();
        if let Some(spec) = spec.as_mapping_mut() {
            spec.remove("paramKind");
        }
        spec
    };
    if body(policies[0]) != body(policies[1]) {
        problems.push(format!(
            "{} and {} differ in more than their parameters",
            id(policies[0]),
            id(policies[1])
        ));
    }
    let webhook = webhooks(objects)
        .into_iter()
        .find(|(_, w)| text(w, "name") == PIN_WEBHOOK)
        .map(|(_, w)| w);
    for ((policy, binding), kind) in policies.iter().zip(&bindings).zip(PARAM_KINDS) {
        if text(policy, "spec.paramKind.kind") != kind
            || text(policy, "spec.paramKind.apiVersion") != "holdfast.dev/v1alpha1"
        {
            problems.push(format!(
                "{}: its parameters are not holdfast.dev {kind}",
                id(policy)
            ));
        }
        if text(policy, "spec.failurePolicy") != "Ignore" {
            problems.push(format!(
                "{}: failurePolicy is not Ignore (it must fail open)",
                id(policy)
            ));
        }
        let resources: BTreeSet<String> = items(policy, "spec.matchConstraints.resourceRules")
            .iter()
            .flat_map(|r| strings(r.get("resources")))
            .collect();
        if resources != BTreeSet::from(["apps".to_owned(), "packagerepositories".to_owned()]) {
            problems.push(format!(
                "{}: matches {resources:?}, not apps and packagerepositories",
                id(policy)
            ));
        }
        if text(binding, "spec.policyName") != text(policy, "metadata.name") {
            problems.push(format!("{}: binds another policy", id(binding)));
        }
        let namespaced = at(binding, "spec.paramRef.namespace").is_some();
        let allow = text(binding, "spec.paramRef.parameterNotFoundAction") == "Allow";
        let by_selector = at(binding, "spec.paramRef.selector").is_some();
        if namespaced || !allow || !by_selector {
            problems.push(format!(
                "{}: paramRef must select by label, name no namespace and Allow when none is found",
                id(binding)
            ));
        }
        if let Some(webhook) = webhook {
            for selector in ["namespaceSelector", "objectSelector"] {
                if at(binding, &format!("spec.matchResources.{selector}")) != webhook.get(selector) {
                    problems.push(format!(
                        "{}: its {selector} is not the one of {PIN_WEBHOOK}",
                        id(binding)
                    ));
                }
            }
        }
    }
    problems
}

/// `(policy, parameters, objects and operations, failurePolicy, reinvocationPolicy,
/// matchConditions)`: SECURITY.md's table of the pinning policy.
pub type PolicyRow = (String, String, String, String, String, String);

/// The rows of SECURITY.md's table of the pinning policy.
pub fn policies_from_doc(markdown: &str) -> Result<BTreeSet<PolicyRow>> {
    let mut rows = BTreeSet::new();
    for cells in table(markdown, "| Policy | Parameters |")? {
        ensure!(cells.len() >= 7, "short policy row {cells:?}");
        let c = |i: usize| plain(&cells[i]);
        rows.insert((c(0), c(1), c(2), c(3), c(4), c(5)));
    }
    Ok(rows)
}

/// A row per pinning policy of `objects`, as SECURITY.md writes it.
pub fn policies_from_manifests(objects: &[Value]) -> BTreeSet<PolicyRow> {
    of_kind(objects, "MutatingAdmissionPolicy")
        .into_iter()
        .map(|policy| {
            let rules: Vec<String> = items(policy, "spec.matchConstraints.resourceRules")
                .iter()
                .map(|r| {
                    format!(
                        "{}/{} {}: {}",
                        strings(r.get("apiGroups")).join(","),
                        strings(r.get("apiVersions")).join(","),
                        strings(r.get("resources")).join(","),
                        strings(r.get("operations")).join(", ")
                    )
                })
                .collect();
            let conditions: Vec<&str> = items(policy, "spec.matchConditions")
                .iter()
                .map(|c| text(c, "name"))
                .collect();
            (
                text(policy, "metadata.name").to_owned(),
                format!(
                    "{} {}",
                    text(policy, "spec.paramKind.apiVersion"),
                    text(policy, "spec.paramKind.kind")
                ),
                rules.join("; "),
                text(policy, "spec.failurePolicy").to_owned(),
                text(policy, "spec.reinvocationPolicy").to_owned(),
                conditions.join(", "),
            )
        })
        .collect()
}

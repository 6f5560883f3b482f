//! The webhook configurations register exactly what the webhook's code serves, and the code
//! routes each request to the rule [`SERVED`] names.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use holdfast_webhook::{
    review::Request,
    rules::{
        Family, MUTATE_PATH, Rule, VALIDATE_PATH, pin_fetch_refs, policy, stamp_owners, terminating_guard,
    },
};
use serde_json::json;
use serde_yaml::Value;

use crate::yaml::{is_mutating, items, strings, text, webhooks};

/// `(path, group, version, resource, operations, rule)`.
type Served = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);

/// What the webhook's code serves — `Rule::route` maps each of these to the named rule — and
/// therefore exactly what the webhook configurations must register, no more and no less.
const SERVED: &[Served] = &[
    (
        MUTATE_PATH,
        "kappctrl.k14s.io",
        "v1alpha1",
        "apps",
        &["CREATE", "UPDATE"],
        pin_fetch_refs::NAME,
    ),
    (
        MUTATE_PATH,
        "packaging.carvel.dev",
        "v1alpha1",
        "packagerepositories",
        &["CREATE", "UPDATE"],
        pin_fetch_refs::NAME,
    ),
    (
        MUTATE_PATH,
        "data.packaging.carvel.dev",
        "v1alpha1",
        "packages",
        &["CREATE", "UPDATE"],
        pin_fetch_refs::NAME,
    ),
    (
        MUTATE_PATH,
        "kpack.io",
        "v1alpha2",
        "images",
        &["CREATE", "UPDATE"],
        stamp_owners::NAME,
    ),
    (
        VALIDATE_PATH,
        "kappctrl.k14s.io",
        "v1alpha1",
        "apps",
        &["CREATE", "UPDATE"],
        policy::NAME,
    ),
    (
        VALIDATE_PATH,
        "packaging.carvel.dev",
        "v1alpha1",
        "packagerepositories",
        &["CREATE", "UPDATE"],
        policy::NAME,
    ),
    (
        VALIDATE_PATH,
        "data.packaging.carvel.dev",
        "v1alpha1",
        "packages",
        &["CREATE", "UPDATE"],
        policy::NAME,
    ),
    (
        VALIDATE_PATH,
        "kpack.io",
        "v1alpha2",
        "builds",
        &["CREATE"],
        terminating_guard::NAME,
    ),
    (
        VALIDATE_PATH,
        "kpack.io",
        "v1alpha2",
        "images",
        &["UPDATE"],
        terminating_guard::NAME,
    ),
    (
        VALIDATE_PATH,
        "",
        "v1",
        "pods",
        &["CREATE"],
        terminating_guard::NAME,
    ),
];

/// The rules of the webhook configurations are exactly [`SERVED`], and the code routes each to
/// the rule the table names.
pub fn check_served(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut registered = BTreeSet::new();
    for (configuration, webhook) in webhooks(objects) {
        let path = text(webhook, "clientConfig.service.path").to_owned();
        for rule in items(webhook, "rules") {
            for group in strings(rule.get("apiGroups")) {
                for version in strings(rule.get("apiVersions")) {
                    for resource in strings(rule.get("resources")) {
                        for operation in strings(rule.get("operations")) {
                            registered.insert((
                                path.clone(),
                                group.clone(),
                                version.clone(),
                                resource.clone(),
                                operation,
                            ));
                        }
                    }
                }
            }
        }
        if (path_family(text(webhook, "clientConfig.service.path")) == Some(Family::Mutating))
            != is_mutating(configuration)
        {
            problems.push(format!(
                "{}: path and configuration kind disagree",
                text(webhook, "name")
            ));
        }
    }
    let mut served = BTreeSet::new();
    for (path, group, version, resource, operations, rule) in SERVED {
        for operation in *operations {
            served.insert((
                path.to_string(),
                group.to_string(),
                version.to_string(),
                resource.to_string(),
                operation.to_string(),
            ));
            match route(path, group, version, resource, operation) {
                Ok(Some(name)) if name == *rule => {}
                other => problems.push(format!(
                    "the code routes {path} {group}/{version} {resource} {operation} to {other:?}, not {rule}"
                )),
            }
        }
    }
    for extra in registered.difference(&served) {
        problems.push(format!("registered but not served by the code: {extra:?}"));
    }
    for missing in served.difference(&registered) {
        problems.push(format!("served by the code but not registered: {missing:?}"));
    }
    problems
}

fn path_family(path: &str) -> Option<Family> {
    match path {
        MUTATE_PATH => Some(Family::Mutating),
        VALIDATE_PATH => Some(Family::Validating),
        _ => None,
    }
}

/// The rule `holdfast_webhook` routes a request to.
fn route(
    path: &str,
    group: &str,
    version: &str,
    resource: &str,
    operation: &str,
) -> Result<Option<&'static str>> {
    let family = path_family(path).with_context(|| format!("unknown path {path}"))?;
    let api_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let body = json!({
        "uid": "u", "kind": {"group": group, "version": version, "kind": "X"},
        "resource": {"group": group, "version": version, "resource": resource},
        "name": "n", "namespace": "ns", "operation": operation, "userInfo": {},
        "object": {"apiVersion": api_version, "kind": "X", "metadata": {"name": "n", "namespace": "ns"}},
        "oldObject": null, "dryRun": false,
    })
    .to_string();
    let request: Request = serde_json::from_str(&body)?;
    Ok(Rule::route(family, &request).map(Rule::name))
}

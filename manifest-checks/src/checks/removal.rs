//! Removal by kapp (`kapp delete`, the Carvel package's PackageInstall deleted) deletes the
//! webhook configurations before anything an admission goes through: the Service each webhook
//! calls, the Deployment whose pods it selects, the NetworkPolicies admitting traffic to them and
//! their Namespace. Otherwise kapp deletes them all at once, and for a moment the API server calls
//! a webhook that is gone (Helm: the chart's pre-delete hook). kapp orders deletes by a change
//! group on the configurations and a change rule on each of the others.

use std::collections::BTreeSet;

use serde_yaml::Value;

use crate::yaml::{at, id, items, of_kind, text, webhooks};

/// kapp's annotation naming an object's change group.
pub const CHANGE_GROUP: &str = "kapp.k14s.io/change-group";
/// kapp's annotation (or prefix of several: `kapp.k14s.io/change-rule.NAME`) of a change rule.
pub const CHANGE_RULE: &str = "kapp.k14s.io/change-rule";
/// The change group of holdfast's webhook configurations.
pub const WEBHOOK_CONFIGURATIONS_GROUP: &str = "holdfast.dev/webhook-configurations";

fn annotation<'a>(object: &'a Value, key: &str) -> &'a str {
    at(object, "metadata.annotations")
        .and_then(|a| a.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn has_rule(object: &Value, rule: &str) -> bool {
    at(object, "metadata.annotations")
        .and_then(Value::as_mapping)
        .is_some_and(|a| {
            a.iter().any(|(k, v)| {
                k.as_str().is_some_and(|k| k.starts_with(CHANGE_RULE)) && v.as_str() == Some(rule)
            })
        })
}

/// Whether every `key: value` of `selector` (a map of strings) is among `labels`.
fn selects(selector: Option<&Value>, labels: Option<&Value>) -> bool {
    let (Some(selector), Some(labels)) = (
        selector.and_then(Value::as_mapping),
        labels.and_then(Value::as_mapping),
    ) else {
        return false;
    };
    !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// What kapp would delete out of order.
pub fn check_removal_order(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let rule = format!("delete after deleting {WEBHOOK_CONFIGURATIONS_GROUP}");
    let mut configurations = BTreeSet::new();
    let mut services = BTreeSet::new();
    for (configuration, webhook) in webhooks(objects) {
        if annotation(configuration, CHANGE_GROUP) != WEBHOOK_CONFIGURATIONS_GROUP
            && configurations.insert(id(configuration))
        {
            problems.push(format!(
                "{}: not in the change group {WEBHOOK_CONFIGURATIONS_GROUP} ({CHANGE_GROUP}): kapp \
                 would not delete it first",
                id(configuration)
            ));
        }
        let service = at(webhook, "clientConfig.service");
        if let Some(service) = service {
            services.insert((text(service, "namespace"), text(service, "name")));
        }
    }
    let mut needed: Vec<&Value> = Vec::new();
    for (namespace, name) in services {
        let in_namespace = |o: &&Value| text(o, "metadata.namespace") == namespace;
        let Some(service) = of_kind(objects, "Service")
            .into_iter()
            .find(|s| in_namespace(s) && text(s, "metadata.name") == name)
        else {
            continue;
        };
        needed.push(service);
        for deployment in of_kind(objects, "Deployment").into_iter().filter(in_namespace) {
            let pods = at(deployment, "spec.template.metadata.labels");
            if !selects(at(service, "spec.selector"), pods) {
                continue;
            }
            needed.push(deployment);
            needed.extend(
                of_kind(objects, "NetworkPolicy")
                    .into_iter()
                    .filter(in_namespace)
                    // Those that admit traffic: deleting one that denies opens, never blocks.
                    .filter(|p| !items(p, "spec.ingress").is_empty())
                    .filter(|p| selects(at(p, "spec.podSelector.matchLabels"), pods)),
            );
        }
        needed.extend(
            of_kind(objects, "Namespace")
                .into_iter()
                .filter(|n| text(n, "metadata.name") == namespace),
        );
    }
    let mut seen = BTreeSet::new();
    for object in needed {
        if seen.insert(id(object)) && !has_rule(object, &rule) {
            problems.push(format!(
                "{}: an admission goes through it, and it has no `{CHANGE_RULE}: {rule}`: kapp \
                 could delete it while the API server still calls the webhooks",
                id(object)
            ));
        }
    }
    problems
}

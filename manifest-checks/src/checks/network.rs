//! NetworkPolicies: ingress to holdfast's namespace is denied unless opened, and never to the
//! admin ports for everyone.

use serde_yaml::Value;

use crate::{
    HOLDFAST_NAMESPACE,
    yaml::{at, id, items, of_kind, strings, text},
};

/// Ingress is denied by default in holdfast's namespace; the admin ports (the webhook's 8080,
/// the controller's 8081) admit only selected scrapers.
pub fn check_network(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let policies: Vec<&Value> = of_kind(objects, "NetworkPolicy")
        .into_iter()
        .filter(|p| text(p, "metadata.namespace") == HOLDFAST_NAMESPACE)
        .collect();
    let default_deny = policies.iter().any(|p| {
        at(p, "spec.podSelector")
            .and_then(Value::as_mapping)
            .is_some_and(|m| m.is_empty())
            && strings(at(p, "spec.policyTypes")).iter().any(|t| t == "Ingress")
            && items(p, "spec.ingress").is_empty()
    });
    if !default_deny {
        problems.push(format!(
            "no default-deny ingress NetworkPolicy in {HOLDFAST_NAMESPACE}"
        ));
    }
    for policy in &policies {
        for (i, rule) in items(policy, "spec.ingress").iter().enumerate() {
            let admin = items(rule, "ports").iter().any(|p| {
                text(p, "port") == "admin"
                    || matches!(at(p, "port").and_then(Value::as_i64), Some(8080 | 8081))
            });
            if admin && items(rule, "from").is_empty() {
                problems.push(format!(
                    "{}: ingress[{i}] opens the admin port to everyone",
                    id(policy)
                ));
            }
        }
    }
    problems
}

//! High availability: both Deployments run replicas that a rollout or a drain cannot all take
//! down, and the controller's replicas can elect a leader.

use std::collections::BTreeSet;

use serde_yaml::Value;

use crate::{
    HOLDFAST_NAMESPACE,
    yaml::{at, find, items, kind, of_kind, strings, text},
};

/// The webhook runs >= 2 replicas spread by anti-affinity with a PodDisruptionBudget; the
/// controller runs >= 2 replicas spread by anti-affinity, which elect a leader: each knows its
/// pod name and its ServiceAccount may get, create and update its ControllerLease.
pub fn check_availability(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(webhook) = find(objects, "Deployment", "holdfast-webhook") else {
        return vec!["no Deployment holdfast-webhook".into()];
    };
    if at(webhook, "spec.replicas").and_then(Value::as_i64).unwrap_or(1) < 2 {
        problems.push("holdfast-webhook runs fewer than 2 replicas".into());
    }
    if at(webhook, "spec.template.spec.affinity.podAntiAffinity").is_none() {
        problems.push("holdfast-webhook has no podAntiAffinity".into());
    }
    if !disruption_budgeted(objects, webhook) {
        problems.push("no PodDisruptionBudget with minAvailable >= 1 selects holdfast-webhook".into());
    }
    match find(objects, "Deployment", "holdfast-controller") {
        Ok(controller) => {
            problems.extend(check_controller_election(objects, controller));
            if !disruption_budgeted(objects, controller) {
                problems
                    .push("no PodDisruptionBudget with minAvailable >= 1 selects holdfast-controller".into());
            }
        }
        Err(e) => problems.push(e.to_string()),
    }
    problems
}

/// Whether a PodDisruptionBudget with `minAvailable` >= 1 selects `deployment`'s pods.
fn disruption_budgeted(objects: &[Value], deployment: &Value) -> bool {
    let labels = at(deployment, "spec.template.metadata.labels");
    of_kind(objects, "PodDisruptionBudget").iter().any(|pdb| {
        at(pdb, "spec.minAvailable").and_then(Value::as_i64).unwrap_or(0) >= 1
            && at(pdb, "spec.selector.matchLabels")
                .and_then(Value::as_mapping)
                .is_some_and(|selector| {
                    selector
                        .iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
                })
    })
}

/// The verbs on `holdfast.dev` controllerleases that the roles bound to `account` grant on the
/// ControllerLease `lease` in holdfast's namespace.
fn lease_verbs(objects: &[Value], account: &str, lease: &str) -> BTreeSet<String> {
    let bound = objects
        .iter()
        .filter(|b| ["RoleBinding", "ClusterRoleBinding"].contains(&kind(b)))
        .filter(|b| {
            let namespace = text(b, "metadata.namespace");
            (namespace.is_empty() || namespace == HOLDFAST_NAMESPACE)
                && items(b, "subjects").iter().any(|s| {
                    text(s, "kind") == "ServiceAccount"
                        && text(s, "namespace") == HOLDFAST_NAMESPACE
                        && text(s, "name") == account
                })
        })
        .filter_map(|b| find(objects, text(b, "roleRef.kind"), text(b, "roleRef.name")).ok());
    bound
        .flat_map(|role| items(role, "rules"))
        .filter(|rule| strings(rule.get("apiGroups")).iter().any(|g| g == "holdfast.dev"))
        .filter(|rule| {
            strings(rule.get("resources"))
                .iter()
                .any(|r| r == "controllerleases")
        })
        .filter(|rule| {
            let names = strings(rule.get("resourceNames"));
            names.is_empty() || names.iter().any(|n| n == lease)
        })
        .flat_map(|rule| strings(rule.get("verbs")))
        .collect()
}

/// The controller's high availability: >= 2 replicas, spread, rolled without a gap, each with its
/// identity, and the RBAC its election calls (controller/src/leader.rs: get, create, update of
/// the ControllerLease named by --lease-name).
fn check_controller_election(objects: &[Value], controller: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let replicas = at(controller, "spec.replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    if replicas < 2 {
        problems.push(format!(
            "holdfast-controller runs {replicas} replica(s): it has leader election and must run at least 2"
        ));
    }
    if text(controller, "spec.strategy.type") == "Recreate" {
        problems.push("holdfast-controller uses strategy Recreate: a rollout would leave no replica".into());
    }
    if at(controller, "spec.template.spec.affinity.podAntiAffinity").is_none() {
        problems.push("holdfast-controller has no podAntiAffinity".into());
    }
    let container = at(controller, "spec.template.spec.containers.0");
    let args = strings(container.and_then(|c| c.get("args")));
    let lease = crate::fence::lease_name(controller);
    let identity = container
        .map(|c| items(c, "env"))
        .unwrap_or_default()
        .into_iter()
        .any(|e| text(e, "name") == "POD_NAME" && text(e, "valueFrom.fieldRef.fieldPath") == "metadata.name");
    if !identity && !args.iter().any(|a| a.starts_with("--identity=")) {
        problems.push(
            "holdfast-controller has no identity for leader election: POD_NAME from the downward API (metadata.name)"
                .into(),
        );
    }
    let granted = lease_verbs(objects, "holdfast-controller", lease);
    for verb in ["get", "create", "update"] {
        if !granted.contains(verb) {
            problems.push(format!(
                "holdfast-controller runs {replicas} replicas with leader election but may not {verb} its ControllerLease {HOLDFAST_NAMESPACE}/{lease}"
            ));
        }
    }
    problems
}

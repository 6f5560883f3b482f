//! The settings every webhook must have: what it excludes, how it fails, how long it may take,
//! and that it calls holdfast's Service.

use holdfast_webhook::rules::{MUTATE_PATH, VALIDATE_PATH};
use serde_yaml::Value;

use crate::{
    HOLDFAST_NAMESPACE, IGNORE_LABEL,
    yaml::{at, id, is_mutating, is_terminating_guard, items, strings, text, webhooks},
};

/// The automatic namespace name label (Kubernetes >= 1.21).
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The longest `timeoutSeconds` a webhook may have.
const MAX_TIMEOUT_SECONDS: i64 = 10;

/// Every webhook: excludes kube-system, holdfast's namespace and the opt-out label; sideEffects
/// None; explicit timeoutSeconds <= 10; admissionReviewVersions [v1]; mutating and terminating
/// guard fail open; mutating reinvoked IfNeeded; served by holdfast's Service on its path; no
/// committed caBundle; rules without wildcards or subresources.
pub fn check_webhooks(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let all = webhooks(objects);
    if all.is_empty() {
        problems.push("no webhooks".into());
    }
    for (configuration, webhook) in all {
        let name = format!("{} / {}", id(configuration), text(webhook, "name"));
        let mut problem = |p: String| problems.push(format!("{name}: {p}"));

        let expressions = items(webhook, "namespaceSelector.matchExpressions");
        if webhook.get("namespaceSelector").is_none() {
            problem("no namespaceSelector".into());
        }
        let excludes = |key: &str, values: &[&str]| {
            expressions.iter().any(|e| {
                text(e, "key") == key
                    && text(e, "operator") == "NotIn"
                    && values
                        .iter()
                        .all(|v| strings(e.get("values")).iter().any(|x| x == v))
            })
        };
        if !excludes(NAME_LABEL, &["kube-system", HOLDFAST_NAMESPACE]) {
            problem(format!(
                "namespaceSelector does not exclude kube-system and {HOLDFAST_NAMESPACE} by {NAME_LABEL}"
            ));
        }
        if !excludes(IGNORE_LABEL, &["true"]) {
            problem(format!("namespaceSelector does not honour {IGNORE_LABEL}=true"));
        }
        if text(webhook, "sideEffects") != "None" {
            problem(format!(
                "sideEffects {:?}, not None",
                text(webhook, "sideEffects")
            ));
        }
        match at(webhook, "timeoutSeconds").and_then(Value::as_i64) {
            Some(t) if (1..=MAX_TIMEOUT_SECONDS).contains(&t) => {}
            other => problem(format!(
                "timeoutSeconds {other:?}, want 1..={MAX_TIMEOUT_SECONDS}"
            )),
        }
        if strings(webhook.get("admissionReviewVersions")) != ["v1"] {
            problem("admissionReviewVersions is not [v1]".into());
        }
        let failure = text(webhook, "failurePolicy");
        if is_mutating(configuration) || is_terminating_guard(configuration, webhook) {
            if failure != "Ignore" {
                problem(format!("failurePolicy {failure:?}: must fail open (Ignore)"));
            }
        } else if !["Ignore", "Fail"].contains(&failure) {
            problem(format!("failurePolicy {failure:?} not set explicitly"));
        }
        if is_mutating(configuration) && text(webhook, "reinvocationPolicy") != "IfNeeded" {
            problem("reinvocationPolicy is not IfNeeded".into());
        }
        let path = if is_mutating(configuration) {
            MUTATE_PATH
        } else {
            VALIDATE_PATH
        };
        if at(webhook, "clientConfig.url").is_some() {
            problem("clientConfig.url: must call holdfast's Service".into());
        }
        if text(webhook, "clientConfig.service.namespace") != HOLDFAST_NAMESPACE
            || text(webhook, "clientConfig.service.path") != path
        {
            problem(format!(
                "clientConfig.service is not {HOLDFAST_NAMESPACE} {path} (holdfast serves {path} there)"
            ));
        }
        if at(webhook, "clientConfig.caBundle").is_some() {
            problem("a committed caBundle (holdfast or cert-manager injects it)".into());
        }
        for (i, rule) in items(webhook, "rules").iter().enumerate() {
            for field in ["apiGroups", "apiVersions", "resources", "operations"] {
                let values = strings(rule.get(field));
                if values.is_empty() || values.iter().any(|v| v.contains('*')) {
                    problem(format!("rules[{i}].{field} is empty or has a wildcard"));
                }
            }
            if strings(rule.get("resources")).iter().any(|r| r.contains('/')) {
                problem(format!("rules[{i}] names a subresource"));
            }
            if text(rule, "scope") != "Namespaced" {
                problem(format!("rules[{i}].scope is not Namespaced"));
            }
        }
    }
    problems
}

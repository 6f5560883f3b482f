//! holdfast installed in another namespace by a kustomize `namespace:` override (issue 35). The
//! namespace transformer moves every namespaced object, the webhooks' Service references and the
//! bindings' subjects, and renames the Namespace object, but rewrites no string value: not a
//! namespaceSelector's values, not CEL, not a certificate's names. Whatever holdfast relies on
//! must therefore name no namespace, or be rewritten by the overlay. [`check_relocated`] says
//! what of a rendering still points at another namespace than the one it installs into.

use serde_yaml::Value;

use crate::{
    HOLDFAST_NAMESPACE, IGNORE_LABEL,
    fence::{FENCE, account_condition},
    yaml::{find, id, items, of_kind, strings, text, webhooks},
};

/// The automatic namespace name label (Kubernetes >= 1.21).
const NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// What of `objects`, rendered to install into `namespace`, no longer holds there:
///
/// - every webhook calls the Service in `namespace` and never serves `namespace` itself: its
///   namespaceSelector excludes it by name, or the rendered Namespace carries
///   `holdfast.dev/ignore: "true"` and the selector honours that label;
/// - the controller's fence matches the controller's ServiceAccount of `namespace`;
/// - no other string names `holdfast-system` (the fence's CEL, cert-manager's names and its
///   `inject-ca-from`, a flag), since nothing rewrites it. The name values of a
///   namespaceSelector are exempt: the label above stands in for them.
pub fn check_relocated(objects: &[Value], namespace: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let ignored = of_kind(objects, "Namespace")
        .into_iter()
        .find(|n| text(n, "metadata.name") == namespace)
        .is_some_and(|n| label(n, IGNORE_LABEL) == "true");
    for (configuration, webhook) in webhooks(objects) {
        let name = format!("{} / {}", id(configuration), text(webhook, "name"));
        if text(webhook, "clientConfig.service.namespace") != namespace {
            problems.push(format!(
                "{name}: calls the Service in {:?}, not {namespace}",
                text(webhook, "clientConfig.service.namespace")
            ));
        }
        let expressions = items(webhook, "namespaceSelector.matchExpressions");
        let excludes = |key: &str, value: &str| {
            expressions.iter().any(|e| {
                text(e, "key") == key
                    && text(e, "operator") == "NotIn"
                    && strings(e.get("values")).iter().any(|v| v == value)
            })
        };
        let excluded = excludes(NAME_LABEL, namespace) || ignored && excludes(IGNORE_LABEL, "true");
        if !excluded {
            problems.push(format!(
                "{name}: serves holdfast's own namespace {namespace}: its namespaceSelector excludes it neither by {NAME_LABEL} nor, on a Namespace labelled {IGNORE_LABEL}=true, by that label"
            ));
        }
    }
    match (
        find(objects, "ValidatingAdmissionPolicy", FENCE),
        find(objects, "Deployment", "holdfast-controller"),
    ) {
        (Ok(policy), Ok(controller)) => {
            let account = text(controller, "spec.template.spec.serviceAccountName");
            let exact = format!("request.userInfo.username == 'system:serviceaccount:{namespace}:{account}'");
            let conditions = items(policy, "spec.matchConditions");
            let binds = conditions.len() == 1
                && [exact, account_condition(account)]
                    .contains(&text(conditions[0], "expression").to_owned());
            if !binds {
                problems.push(format!(
                    "{}: does not match the controller's ServiceAccount {namespace}/{account}",
                    id(policy)
                ));
            }
        }
        _ => problems.push(format!("no ValidatingAdmissionPolicy {FENCE} (or no controller)")),
    }
    if namespace != HOLDFAST_NAMESPACE {
        for object in objects {
            let mut found = Vec::new();
            named_at(object, "", &mut found);
            for path in found {
                problems.push(format!(
                    "{}: {path} names {HOLDFAST_NAMESPACE}, which the namespace override does not rewrite",
                    id(object)
                ));
            }
        }
    }
    problems
}

/// A label's value ('' when absent).
fn label<'a>(object: &'a Value, key: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(|l| l.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// The paths under `value` of the strings naming `holdfast-system`, but a namespaceSelector's
/// name values.
fn named_at(value: &Value, path: &str, found: &mut Vec<String>) {
    match value {
        Value::String(s) if s.contains(HOLDFAST_NAMESPACE) => found.push(path.to_owned()),
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                named_at(item, &format!("{path}.{i}"), found);
            }
        }
        Value::Mapping(map) => {
            let name_values = map.get("key").and_then(Value::as_str) == Some(NAME_LABEL);
            for (k, v) in map {
                let key = k.as_str().unwrap_or_default();
                if name_values && key == "values" {
                    continue;
                }
                if key.contains(HOLDFAST_NAMESPACE) {
                    found.push(format!("{path}.{key} (a key)"));
                }
                named_at(v, &format!("{path}.{key}"), found);
            }
        }
        _ => {}
    }
}

//! Reading parsed manifests: values at dotted paths (`spec.template.spec.containers.0`), lists
//! of strings, objects by kind and name. A missing field reads as empty, so that a check reports
//! what is absent instead of stopping at it.

use anyhow::{Context, Result};
use serde_yaml::Value;

/// The value at a dotted path; numeric segments index sequences.
pub fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |v, key| match key.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(key),
        })
}

/// The value at a dotted path, to mutate a copy; a missing step is an error.
pub fn at_mut<'a>(value: &'a mut Value, path: &str) -> Result<&'a mut Value> {
    let mut current = value;
    for key in path.split('.') {
        let next = match key.parse::<usize>() {
            Ok(i) => current.get_mut(i),
            Err(_) => current.get_mut(key),
        };
        current = next.with_context(|| format!("no {key:?} on the way to {path}"))?;
    }
    Ok(current)
}

/// The string at a dotted path, `""` when absent.
pub fn text<'a>(value: &'a Value, path: &str) -> &'a str {
    at(value, path).and_then(Value::as_str).unwrap_or_default()
}

/// A sequence as strings (a non-string item in its debug form), empty when absent.
pub fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_sequence)
        .map(|items| {
            items
                .iter()
                .map(|v| v.as_str().map(str::to_owned).unwrap_or_else(|| format!("{v:?}")))
                .collect()
        })
        .unwrap_or_default()
}

/// The sequence at a dotted path, empty when absent.
pub fn items<'a>(value: &'a Value, path: &str) -> Vec<&'a Value> {
    at(value, path)
        .and_then(Value::as_sequence)
        .map(|s| s.iter().collect())
        .unwrap_or_default()
}

/// An object's `kind`.
pub fn kind(object: &Value) -> &str {
    text(object, "kind")
}

/// `Kind namespace/name`, to name an object in a problem.
pub fn id(object: &Value) -> String {
    match at(object, "metadata.namespace").and_then(Value::as_str) {
        Some(ns) => format!("{} {ns}/{}", kind(object), text(object, "metadata.name")),
        None => format!("{} {}", kind(object), text(object, "metadata.name")),
    }
}

/// Every object of a kind.
pub fn of_kind<'a>(objects: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind(o) == wanted).collect()
}

/// The object of a kind and name.
pub fn find<'a>(objects: &'a [Value], wanted: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| kind(o) == wanted && text(o, "metadata.name") == name)
        .with_context(|| format!("no {wanted} {name}"))
}

/// The object of a kind and name, to mutate a copy.
pub fn find_mut<'a>(objects: &'a mut [Value], wanted: &str, name: &str) -> Result<&'a mut Value> {
    objects
        .iter_mut()
        .find(|o| kind(o) == wanted && text(o, "metadata.name") == name)
        .with_context(|| format!("no {wanted} {name}"))
}

const WEBHOOK_CONFIGURATIONS: [&str; 2] = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"];

/// `(configuration, webhook)` for every webhook of every configuration.
pub fn webhooks(objects: &[Value]) -> Vec<(&Value, &Value)> {
    objects
        .iter()
        .filter(|o| WEBHOOK_CONFIGURATIONS.contains(&kind(o)))
        .flat_map(|c| items(c, "webhooks").into_iter().map(move |w| (c, w)))
        .collect()
}

/// Whether a webhook configuration is a MutatingWebhookConfiguration.
pub(crate) fn is_mutating(configuration: &Value) -> bool {
    kind(configuration) == "MutatingWebhookConfiguration"
}

/// A terminating-guard webhook: one whose rules name kpack Builds/Images or Pods on /validate.
pub(crate) fn is_terminating_guard(configuration: &Value, webhook: &Value) -> bool {
    !is_mutating(configuration)
        && items(webhook, "rules").iter().any(|rule| {
            let groups = strings(rule.get("apiGroups"));
            let resources = strings(rule.get("resources"));
            groups.iter().any(|g| g == "kpack.io" || g.is_empty())
                && resources
                    .iter()
                    .any(|r| ["builds", "images", "pods"].contains(&r.as_str()))
        })
}

//! The monitoring objects (components/monitoring): a scrape reads holdfast's admin port as it
//! is, plain HTTP with no credentials, so a monitor carries no secret and names no Secret, and
//! it scrapes only holdfast's own pods.

use serde_yaml::Value;

use crate::{
    HOLDFAST_NAMESPACE,
    yaml::{at, id, items, of_kind, strings, text},
};

/// Keys that would hand a scrape credentials or TLS material (the Prometheus Operator's
/// `basicAuth`, `bearerTokenSecret`, `bearerTokenFile`, `authorization`, `oauth2`, `tlsConfig`'s
/// `keySecret`, …): none belongs in a monitor of holdfast.
const CREDENTIAL_WORDS: [&str; 5] = ["secret", "token", "auth", "password", "tls"];

/// PodMonitors and ServiceMonitors scrape `/metrics` on the `admin` port over plain HTTP,
/// without credentials, of holdfast's pods in holdfast's namespace only; no monitoring object
/// (monitors, PrometheusRules) has a credential key.
pub fn check_monitoring(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let monitors = [
        ("PodMonitor", "spec.podMetricsEndpoints"),
        ("ServiceMonitor", "spec.endpoints"),
    ];
    for (kind, endpoints) in monitors {
        for monitor in of_kind(objects, kind) {
            // Without a namespaceSelector a monitor scrapes its own namespace; `any: true`
            // widens one to every namespace, whatever `matchNames` says.
            let own = text(monitor, "metadata.namespace");
            let widened = at(monitor, "spec.namespaceSelector").is_some_and(|selector| {
                selector.get("any").and_then(Value::as_bool) == Some(true)
                    || strings(selector.get("matchNames")) != [own]
            });
            if own != HOLDFAST_NAMESPACE || widened {
                problems.push(format!(
                    "{}: scrapes namespaces other than {HOLDFAST_NAMESPACE}",
                    id(monitor)
                ));
            }
            // (The label's key has dots: looked up in the mapping, not by a dotted path.)
            let name = at(monitor, "spec.selector.matchLabels")
                .and_then(|labels| labels.get("app.kubernetes.io/name"))
                .and_then(Value::as_str);
            if name != Some("holdfast") {
                problems.push(format!("{}: selects pods that are not holdfast's", id(monitor)));
            }
            for (i, endpoint) in items(monitor, endpoints).iter().enumerate() {
                let scheme = text(endpoint, "scheme");
                if text(endpoint, "port") != "admin" || !(scheme.is_empty() || scheme == "http") {
                    problems.push(format!(
                        "{}: endpoint {i} is not the admin port over plain HTTP",
                        id(monitor)
                    ));
                }
            }
        }
    }
    for kind in ["PodMonitor", "ServiceMonitor", "PrometheusRule"] {
        for object in of_kind(objects, kind) {
            if let Some(key) = at(object, "spec").and_then(credential_key) {
                problems.push(format!("{}: carries a credential ({key})", id(object)));
            }
        }
    }
    problems
}

/// The first key under `value` that names a credential.
fn credential_key(value: &Value) -> Option<String> {
    match value {
        Value::Mapping(map) => map.iter().find_map(|(k, v)| {
            let key = k.as_str().unwrap_or_default();
            let lower = key.to_ascii_lowercase();
            if CREDENTIAL_WORDS.iter().any(|w| lower.contains(w)) {
                Some(key.to_string())
            } else {
                credential_key(v)
            }
        }),
        Value::Sequence(list) => list.iter().find_map(credential_key),
        _ => None,
    }
}

//! SECURITY.md's webhook settings table: every security-relevant field of every webhook
//! (selectors, matchConditions, failure policy, side effects, timeout, scope), written as the
//! document writes it, so that any change to one of them is a change to the document.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use serde_yaml::Value;

use super::{plain, table};
use crate::{
    load::{manifests, parse_documents, read},
    yaml::{at, items, strings, text, webhooks},
};

/// A label selector as SECURITY.md writes it: `key operator (values)` and `key=value` terms,
/// `; ` between them, `—` for none.
fn selector_text(selector: Option<&Value>) -> String {
    let Some(selector) = selector else {
        return "—".into();
    };
    let mut terms: Vec<String> = Vec::new();
    if let Some(labels) = at(selector, "matchLabels").and_then(Value::as_mapping) {
        for (k, v) in labels {
            terms.push(format!(
                "{}={}",
                k.as_str().unwrap_or_default(),
                v.as_str().unwrap_or_default()
            ));
        }
    }
    for expression in items(selector, "matchExpressions") {
        let values = strings(expression.get("values"));
        let operator = text(expression, "operator");
        terms.push(if values.is_empty() {
            format!("{} {operator}", text(expression, "key"))
        } else {
            format!("{} {operator} ({})", text(expression, "key"), values.join(", "))
        });
    }
    if terms.is_empty() {
        "—".into()
    } else {
        terms.join("; ")
    }
}

/// `name: expression` of a webhook's matchConditions, `; ` between them, `—` for none.
fn conditions_text(webhook: Option<&Value>) -> String {
    let conditions: Vec<String> = webhook
        .map(|w| items(w, "matchConditions"))
        .unwrap_or_default()
        .iter()
        .map(|c| format!("{}: {}", text(c, "name"), text(c, "expression")))
        .collect();
    if conditions.is_empty() {
        "—".into()
    } else {
        conditions.join("; ")
    }
}

/// `(webhook, namespaceSelector, objectSelector, matchConditions, failurePolicy, sideEffects,
/// timeoutSeconds, scope)`.
pub type SettingsRow = (String, String, String, String, String, String, String, String);

/// The header of SECURITY.md's webhook settings table.
const SETTINGS_TABLE: &str = "| Webhook setting | namespaceSelector |";

/// The rows of SECURITY.md's webhook settings table (8 cells each).
pub fn settings_from_doc(markdown: &str) -> Result<BTreeSet<SettingsRow>> {
    let mut rows = BTreeSet::new();
    for cells in table(markdown, SETTINGS_TABLE)? {
        ensure!(
            cells.len() == 8,
            "webhook settings row with {} cells: {cells:?}",
            cells.len()
        );
        let c = |i: usize| plain(&cells[i]);
        rows.insert((c(0), c(1), c(2), c(3), c(4), c(5), c(6), c(7)));
    }
    Ok(rows)
}

/// The settings of every webhook in `objects`; matchConditions from `conditions` (the
/// match-conditions component's webhooks, by name).
pub fn settings_from_manifests(objects: &[Value], conditions: &[Value]) -> BTreeSet<SettingsRow> {
    let with_conditions: Vec<&Value> = conditions.iter().flat_map(|c| items(c, "webhooks")).collect();
    webhooks(objects)
        .into_iter()
        .map(|(_, webhook)| {
            let name = text(webhook, "name");
            let scalar = |field: &str| match webhook.get(field) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(s)) => s.clone(),
                _ => "—".into(),
            };
            let mut scopes: Vec<String> = items(webhook, "rules")
                .iter()
                .map(|r| match r.get("scope") {
                    Some(Value::String(scope)) => scope.clone(),
                    _ => "*".into(),
                })
                .collect();
            scopes.sort();
            scopes.dedup();
            let in_base = conditions_text(Some(webhook));
            let component = with_conditions.iter().find(|w| text(w, "name") == name).copied();
            (
                name.to_owned(),
                selector_text(webhook.get("namespaceSelector")),
                selector_text(webhook.get("objectSelector")),
                // The base has none; a condition in the base would show as a mismatch.
                if in_base == "—" {
                    conditions_text(component)
                } else {
                    format!("base: {in_base}")
                },
                scalar("failurePolicy"),
                scalar("sideEffects"),
                scalar("timeoutSeconds"),
                scopes.join(", "),
            )
        })
        .collect()
}

/// The rows only one side has.
pub fn compare_settings(doc: &BTreeSet<SettingsRow>, manifests: &BTreeSet<SettingsRow>) -> Vec<String> {
    let mut problems: Vec<String> = manifests
        .difference(doc)
        .map(|row| format!("in the manifests but not in SECURITY.md's webhook settings: {row:?}"))
        .collect();
    problems.extend(
        doc.difference(manifests)
            .map(|row| format!("in SECURITY.md's webhook settings but not in the manifests: {row:?}")),
    );
    problems
}

/// The webhook configurations of `components/match-conditions` (patches, read as written).
pub fn match_conditions_component() -> Result<Vec<Value>> {
    let dir = manifests().join("components/match-conditions");
    let mut objects = Vec::new();
    for file in ["mutating.yaml", "validating.yaml"] {
        objects.extend(parse_documents(&read(&dir.join(file))?)?);
    }
    Ok(objects)
}

//! Roles and ClusterRoles list what they grant: no wildcard, no aggregation.

use serde_yaml::Value;

use crate::yaml::{id, items, kind, strings};

/// No `*` in any Role or ClusterRole; no aggregation, no non-resource URLs; every rule has verbs.
pub fn check_no_wildcards(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    for role in objects
        .iter()
        .filter(|o| ["Role", "ClusterRole"].contains(&kind(o)))
    {
        if role.get("aggregationRule").is_some() {
            problems.push(format!("{}: aggregationRule (rules not listed)", id(role)));
        }
        for (i, rule) in items(role, "rules").iter().enumerate() {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                for value in strings(rule.get(field)) {
                    if value.contains('*') {
                        problems.push(format!(
                            "{}: rules[{i}].{field} has the wildcard {value:?}",
                            id(role)
                        ));
                    }
                }
            }
            if rule.get("nonResourceURLs").is_some() {
                problems.push(format!("{}: rules[{i}] grants nonResourceURLs", id(role)));
            }
            if strings(rule.get("verbs")).is_empty() || strings(rule.get("resources")).is_empty() {
                problems.push(format!("{}: rules[{i}] lists no verbs or no resources", id(role)));
            }
        }
    }
    problems
}

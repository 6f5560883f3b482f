//! SECURITY.md's RBAC tables (the base's, and the one of what components add) and the rules of
//! the manifests' Roles and ClusterRoles, as rows of the same shape.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use serde_yaml::Value;

use super::{cell_list, plain, table};
use crate::yaml::{items, kind, strings, text};

/// `(role, group, resources, resourceNames, verbs)`, role as "ClusterRole name".
pub type RbacRow = (
    String,
    String,
    BTreeSet<String>,
    BTreeSet<String>,
    BTreeSet<String>,
);

/// The header of SECURITY.md's table of the base's RBAC.
pub const RBAC_TABLE: &str = "| Role | API group | Resources | Names | Verbs |";

/// The header of its table of the RBAC objects components add (same columns).
pub const COMPONENT_RBAC_TABLE: &str = "| Role (component) | API group | Resources | Names | Verbs |";

/// The rows of the RBAC table under `header`; a duplicate row is an error.
pub fn rbac_from_doc(markdown: &str, header: &str) -> Result<BTreeSet<RbacRow>> {
    let mut rows = BTreeSet::new();
    for cells in table(markdown, header)? {
        ensure!(cells.len() >= 5, "short RBAC row {cells:?}");
        let role = plain(&cells[0])
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        let group = match plain(&cells[1]).as_str() {
            "core" => String::new(),
            group => group.to_owned(),
        };
        let row = (
            role,
            group,
            cell_list(&cells[2]),
            cell_list(&cells[3]),
            cell_list(&cells[4]),
        );
        ensure!(rows.insert(row.clone()), "duplicate RBAC row {row:?}");
    }
    Ok(rows)
}

/// A row per API group of every rule of every Role and ClusterRole.
pub fn rbac_from_manifests(objects: &[Value]) -> BTreeSet<RbacRow> {
    let set = |v: Option<&Value>| strings(v).into_iter().collect::<BTreeSet<_>>();
    let mut rows = BTreeSet::new();
    for role in objects
        .iter()
        .filter(|o| ["Role", "ClusterRole"].contains(&kind(o)))
    {
        for rule in items(role, "rules") {
            for group in strings(rule.get("apiGroups")) {
                rows.insert((
                    format!("{} {}", kind(role), text(role, "metadata.name")),
                    group,
                    set(rule.get("resources")),
                    set(rule.get("resourceNames")),
                    set(rule.get("verbs")),
                ));
            }
        }
    }
    rows
}

/// The rows only one side has.
pub fn compare_rbac(doc: &BTreeSet<RbacRow>, manifests: &BTreeSet<RbacRow>) -> Vec<String> {
    let mut problems = Vec::new();
    for row in manifests.difference(doc) {
        problems.push(format!(
            "in the manifests but not in SECURITY.md's RBAC table: {row:?}"
        ));
    }
    for row in doc.difference(manifests) {
        problems.push(format!(
            "in SECURITY.md's RBAC table but not in the manifests: {row:?}"
        ));
    }
    problems
}

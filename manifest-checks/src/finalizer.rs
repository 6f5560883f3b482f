//! The controller's `delete` RBAC against the fast finalizer's table
//! (`controller/src/deletable.rs`): the controller may delete exactly what the table lists.

use std::collections::BTreeSet;

use serde_yaml::Value;

use crate::tables::rbac::rbac_from_manifests;

/// `(group, resource)` of every `delete` the controller's roles grant on others' objects (its
/// own digest cache, `holdfast.dev`, aside).
pub fn controller_deletes(objects: &[Value]) -> BTreeSet<(String, String)> {
    rbac_from_manifests(objects)
        .into_iter()
        .filter(|(role, group, _, _, verbs)| {
            role.split_whitespace()
                .nth(1)
                .is_some_and(|name| name.starts_with("holdfast-controller"))
                && group != "holdfast.dev"
                && verbs.contains("delete")
        })
        .flat_map(|(_, group, resources, _, _)| resources.into_iter().map(move |r| (group.clone(), r)))
        .collect()
}

/// `(group, resource)` of the fast finalizer's table, opt-in ones or the others.
pub fn deletable(opt_in: bool) -> BTreeSet<(String, String)> {
    holdfast_controller::deletable::DELETABLE
        .iter()
        .filter(|d| d.opt_in.is_some() == opt_in)
        .map(|d| (d.group.to_owned(), d.resource.to_owned()))
        .collect()
}

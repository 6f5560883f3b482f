//! The checks of what SECURITY.md promises. Each returns what is wrong, empty when all is well,
//! so one run reports every broken promise, and a test can mutate a copy and look for the problem
//! it should cause.

mod availability;
mod containers;
mod monitoring;
mod network;
mod removal;
mod roles;
mod served;
mod webhooks;

use serde_yaml::Value;

pub use self::removal::{CHANGE_GROUP, CHANGE_RULE, WEBHOOK_CONFIGURATIONS_GROUP, check_removal_order};
pub use self::{
    availability::check_availability, containers::check_containers, monitoring::check_monitoring,
    network::check_network, roles::check_no_wildcards, served::check_served, webhooks::check_webhooks,
};
use crate::{fence::check_fence, policies::check_pinning_policy};

/// Everything SECURITY.md promises of any rendering of the manifests.
pub fn check_all(objects: &[Value]) -> Vec<String> {
    [
        check_no_wildcards(objects),
        check_webhooks(objects),
        check_served(objects),
        check_containers(objects),
        check_availability(objects),
        check_network(objects),
        check_removal_order(objects),
        check_monitoring(objects),
        check_fence(objects),
        check_pinning_policy(objects),
    ]
    .concat()
}

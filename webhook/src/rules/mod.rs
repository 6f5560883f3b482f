//! The admission rules. Each is a pure function of the request and a read-only view of the
//! cluster; this module only routes a request to its rule.

pub mod pin_refs;
pub mod stamp_owners;

use kube::core::{DynamicObject, admission::AdmissionRequest};

use crate::{cluster::ClusterView, decision::Verdict};

/// The webhook paths, one per rule family: the manifests register exactly these.
pub const MUTATE_PATH: &str = "/mutate";
pub const VALIDATE_PATH: &str = "/validate";

/// Which family a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Mutating,
    Validating,
}

/// A rule that applies to a request, by name (the `rule` label of metrics and logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    StampOwners,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::StampOwners => stamp_owners::NAME,
        }
    }

    /// The rule for a request's group and resource on a family's path; `None` when holdfast has
    /// no rule for it (a webhook configuration broader than the code).
    pub fn route(family: Family, request: &AdmissionRequest<DynamicObject>) -> Option<Rule> {
        let resource = &request.resource;
        match (
            family,
            resource.group.as_str(),
            resource.resource.as_str(),
            request.sub_resource.as_deref(),
        ) {
            (Family::Mutating, "kpack.io", "images", None) => Some(Rule::StampOwners),
            _ => None,
        }
    }

    /// Evaluates the rule: lookups through the cluster view, then the rule's pure decision.
    pub async fn evaluate(
        self,
        request: &AdmissionRequest<DynamicObject>,
        cluster: &dyn ClusterView,
    ) -> Verdict {
        match self {
            Rule::StampOwners => stamp_owners::evaluate(request, cluster).await,
        }
    }
}

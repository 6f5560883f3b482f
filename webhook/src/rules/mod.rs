//! The admission rules. Each is a pure function of the request and what it looked up through
//! the [`RuleContext`] (a read-only view of the cluster, the digest cache); this module only routes a
//! request to its rule.

pub mod pin_fetch_refs;
pub mod policy;
pub mod stamp_owners;
pub mod terminating_guard;

use std::sync::Arc;

use holdfast_cache::DigestCache;
use holdfast_peers::kpack;
use holdfast_pins::{PinnedKind, Pinner, mirror_scope::MirrorPins};
use serde::de::DeserializeOwned;

use crate::{cluster::ClusterView, decision::Verdict, review::Request};

/// The I/O edges the rules consult. Built by [`RuleContext::new`] only, the one place the
/// webhook's pinner is made: without Secrets, since anyone who reaches the port can send a
/// review naming any namespace's `secretRef`. Private references are pinned from entries the
/// controller resolved, or by the controller's catch-up.
pub struct RuleContext {
    cluster: Arc<dyn ClusterView>,
    pinner: Arc<Pinner>,
    policy: policy::Policy,
}

impl RuleContext {
    /// The context over `cluster` and `cache`, judging by `policy`, pinning to the mirror's
    /// copies the controller recorded when `mirror` is set.
    pub fn new(
        cluster: Arc<dyn ClusterView>,
        cache: Arc<DigestCache>,
        policy: policy::Policy,
        mirror: Option<MirrorPins>,
    ) -> Self {
        Self {
            cluster,
            pinner: Arc::new(Pinner::new(cache, None).with_mirror(mirror)),
            policy,
        }
    }

    /// The digest cache the rules pin from (its figures are the admin port's metrics).
    pub fn cache(&self) -> &Arc<DigestCache> {
        self.pinner.cache()
    }

    /// The view of the cluster the rules consult (which peers it serves is a metric).
    pub fn cluster(&self) -> &Arc<dyn ClusterView> {
        &self.cluster
    }
}

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
    PinFetchRefs(PinnedKind),
    Policy(PinnedKind),
    TerminatingGuard,
}

impl Rule {
    pub fn name(self) -> &'static str {
        match self {
            Rule::StampOwners => stamp_owners::NAME,
            Rule::PinFetchRefs(_) => pin_fetch_refs::NAME,
            Rule::Policy(_) => policy::NAME,
            Rule::TerminatingGuard => terminating_guard::NAME,
        }
    }

    /// The rule for a request's group and resource on a family's path; `None` when holdfast has
    /// no rule for it (a webhook configuration broader than the code).
    pub fn route(family: Family, request: &Request<'_>) -> Option<Rule> {
        let resource = &request.resource;
        match (
            family,
            &*resource.group,
            &*resource.resource,
            request.sub_resource.as_deref(),
        ) {
            (Family::Mutating, kpack::GROUP, "images", None) => Some(Rule::StampOwners),
            (Family::Mutating, group, resource, None) => {
                PinnedKind::from_group_resource(group, resource).map(Rule::PinFetchRefs)
            }
            (Family::Validating, kpack::GROUP, "builds" | "images", None)
            | (Family::Validating, "", "pods", None) => Some(Rule::TerminatingGuard),
            (Family::Validating, group, resource, None) => {
                PinnedKind::from_group_resource(group, resource).map(Rule::Policy)
            }
            _ => None,
        }
    }

    /// Evaluates the rule: lookups through the context, then the rule's pure decision.
    pub async fn evaluate(self, request: &Request<'_>, context: &RuleContext) -> Verdict {
        match self {
            Rule::StampOwners => stamp_owners::evaluate(request, context.cluster.as_ref()).await,
            Rule::PinFetchRefs(kind) => {
                pin_fetch_refs::evaluate(kind, request, &context.pinner, context.cluster.as_ref()).await
            }
            Rule::TerminatingGuard => terminating_guard::evaluate(request, context.cluster.as_ref()).await,
            Rule::Policy(kind) => policy::evaluate(kind, request, &context.policy, context.cluster.as_ref()),
        }
    }
}

/// The request's object as `T`, or the answer when there is none (admit: nothing to decide on)
/// or it does not read as `T` (admit unchanged, with a warning). The API server only sends
/// objects that passed its own decoding; whoever sends others must not be able to hold a
/// request up through holdfast.
fn object<T: DeserializeOwned>(request: &Request<'_>, rule: &'static str) -> Result<T, Verdict> {
    match request.object() {
        Ok(Some(object)) => Ok(object),
        Ok(None) => Err(Verdict::allow()),
        Err(error) => {
            tracing::warn!(uid = &*request.uid, rule, %error, "object cannot be read; admitting unchanged");
            Err(Verdict::allow().with_warning(format!("holdfast {rule}: {error}; admitted unchanged")))
        }
    }
}

//! Pin fetch refs, as an admission rule: the request's object through `holdfast_pins` (which
//! finds the references, resolves them through the digest cache and builds the patch).

use holdfast_pins::{PinOutcome, PinnedKind, Pinner, SecretScoped};
use kube::core::admission::Operation;

use crate::{
    cluster::ClusterView,
    decision::{Decision, Verdict},
    review::Request,
};

pub use holdfast_pins::NAME;

/// `cluster` gives the namespace's labels, which decide whether the object is pinned to the
/// mirror. A namespace the watch has not seen yet reads as unlabelled: a selector that requires a
/// label does not select it, a negative one (`!key`, `key!=v`) does; either way the controller
/// re-pins the object once it sees the namespace's real labels.
pub async fn evaluate(
    kind: PinnedKind,
    request: &Request<'_>,
    pinner: &Pinner,
    cluster: &dyn ClusterView,
) -> Verdict {
    let (Operation::Create | Operation::Update) = request.operation else {
        return Verdict::allow();
    };
    let object: serde_json::Value = match super::object(request, NAME) {
        Ok(object) => object,
        Err(answer) => return answer,
    };
    // Only compared with the object (which fields the user changed): unreadable reads as absent.
    let old: Option<serde_json::Value> = request.old_object().ok().flatten();
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let labels = cluster.namespace_labels(namespace);
    // Entries resolved with a Secret only from this namespace's lifetime (the webhook cannot
    // read the Secret to check its uid, as the controller does).
    let secret_scoped = cluster
        .namespace_created(namespace)
        .map_or(SecretScoped::None, SecretScoped::ResolvedSince);
    pinner
        .pin(kind, namespace, &labels, secret_scoped, &object, old.as_ref())
        .await
        .into()
}

impl From<PinOutcome> for Verdict {
    fn from(outcome: PinOutcome) -> Self {
        let decision = if outcome.ops.is_empty() {
            Decision::Allow
        } else {
            Decision::Patch(outcome.ops)
        };
        Verdict {
            decision,
            warnings: outcome.warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use json_patch::{PatchOperation, RemoveOperation, jsonptr::PointerBuf};

    #[test]
    fn an_empty_outcome_allows_and_ops_patch_with_the_warnings() {
        assert_eq!(Verdict::from(PinOutcome::default()), Verdict::allow());
        let op = PatchOperation::Remove(RemoveOperation {
            path: PointerBuf::from_tokens(["spec", "x"]),
        });
        let verdict = Verdict::from(PinOutcome {
            ops: vec![op],
            warnings: vec!["w".into()],
            ..PinOutcome::default()
        });
        assert!(matches!(verdict.decision, Decision::Patch(ref ops) if ops.len() == 1));
        assert_eq!(verdict.warnings, ["w"]);
    }
}

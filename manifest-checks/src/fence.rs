//! The controller's fence (`manifests/base/controller/fence.yaml`; issue 15, item 5): a
//! ValidatingAdmissionPolicy on the controller's ServiceAccount, whose rows must be the fast
//! finalizer's table for the controller's flags, so that the token can do no more than the code.

use std::collections::BTreeSet;

use holdfast_controller::leader::crd::ControllerLease;
use kube::Resource;
use serde_yaml::Value;

use crate::yaml::{at, find, id, items, of_kind, strings, text};

/// The fence's name (its policy and its binding).
pub const FENCE: &str = "holdfast-controller-fence";
/// The term fence's name (its policy and its binding): the controller's writes only from the pod
/// that holds its ControllerLease (`manifests/base/controller/term-fence.yaml`).
pub const TERM_FENCE: &str = "holdfast-controller-term";
/// Where the API server names a bound token's pod in the requests' user info.
const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// What the fence can see of one row of the fast finalizer's table, as the policy's `deletable`
/// variable writes it: the resource (`resource.group`), the label that finds it, and the kind
/// (`Kind.group`) an ownerReference must name — the controller reference if `controller` — or
/// `''` when its namespace must be being deleted. Whether that owner is being deleted, and has
/// that uid, is not in the request: the controller checks it (`deletable::permits`).
pub fn fence_row(row: &holdfast_controller::deletable::Deletable) -> String {
    use holdfast_controller::deletable::Condition;
    let resource = match row.group {
        "" => row.resource.to_owned(),
        group => format!("{}.{group}", row.resource),
    };
    let (owner, controller) = match row.condition {
        Condition::OwnerTerminating {
            group,
            kind,
            controller,
            ..
        } => (format!("{kind}.{group}"), controller),
        // The request shows the first hop only (the controller reference to the parent).
        Condition::GrandOwnerTerminating { group, kind, .. } => (format!("{kind}.{group}"), true),
        Condition::NamespaceTerminating => (String::new(), false),
    };
    format!(
        "{{'resource': '{resource}', 'label': '{}', 'owner': '{owner}', 'controller': '{controller}'}}",
        row.label.unwrap_or_default()
    )
}

/// The rows of the fence for a controller started with `args`: every row of `DELETABLE` that
/// is always on or whose opt-in flag the args set.
pub fn fence_rows_for(args: &[String]) -> Vec<String> {
    holdfast_controller::deletable::DELETABLE
        .iter()
        .filter(|d| d.opt_in.is_none_or(|flag| args.contains(&format!("{flag}=true"))))
        .map(fence_row)
        .collect()
}

/// The policy's variable `name`, as written.
pub fn fence_variable<'a>(policy: &'a Value, name: &str) -> &'a str {
    items(policy, "spec.variables")
        .into_iter()
        .find(|v| text(v, "name") == name)
        .map(|v| text(v, "expression"))
        .unwrap_or_default()
}

/// The fence's one match condition: the ServiceAccount `account` of whatever namespace holdfast
/// is installed in. No namespace is named, so a kustomize `namespace:` override (which rewrites
/// no string inside CEL) keeps the fence on the controller; the namespace of the controller's own
/// digest cache entries is the account's (`request.userInfo.username.split(':')[2]`).
pub fn account_condition(account: &str) -> String {
    format!("request.userInfo.username.matches('^system:serviceaccount:[^:]+:{account}$')")
}

/// A policy's resource rule: its operations, API groups and resources.
type Rule = (Vec<String>, Vec<String>, Vec<String>);

fn resource_rules(policy: &Value) -> Vec<Rule> {
    items(policy, "spec.matchConstraints.resourceRules")
        .into_iter()
        .map(|r| {
            (
                strings(r.get("operations")),
                strings(r.get("apiGroups")),
                strings(r.get("resources")),
            )
        })
        .collect()
}

/// The rows of the policy's `deletable` variable: one per line, as the file lays them out.
pub fn fence_rows(policy: &Value) -> Vec<String> {
    fence_variable(policy, "deletable")
        .lines()
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .filter(|l| l.starts_with('{'))
        .collect()
}

/// The fence is installed, fails closed, denies, binds to holdfast-controller's ServiceAccount
/// (as the controller Deployment runs it, in its namespace), holds the table's rows for the
/// controller's flags, and answers every refusal with 403 Forbidden: a 422 without causes is what
/// the controller takes for a failed resourceVersion guard and retries quietly
/// (`controller/src/pinning.rs`, `guard_failed`).
pub fn check_fence(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let (Ok(policy), Ok(controller)) = (
        find(objects, "ValidatingAdmissionPolicy", FENCE),
        find(objects, "Deployment", "holdfast-controller"),
    ) else {
        return vec![format!("no ValidatingAdmissionPolicy {FENCE} (or no controller)")];
    };
    if text(policy, "spec.failurePolicy") != "Fail" {
        problems.push(format!("{}: failurePolicy is not Fail", id(policy)));
    }
    let account = text(controller, "spec.template.spec.serviceAccountName");
    let conditions = items(policy, "spec.matchConditions");
    if conditions.len() != 1 || text(conditions[0], "expression") != account_condition(account) {
        problems.push(format!(
            "{}: does not match the ServiceAccount {account} alone (in any namespace: {})",
            id(policy),
            account_condition(account)
        ));
    }
    let rules: BTreeSet<Rule> = resource_rules(policy).into_iter().collect();
    // Every DELETE, the UPDATEs of the pinned kinds kube-apiserver admits itself (Packages go to
    // kapp-controller's aggregated API server, which no policy of kube-apiserver sees) and of
    // namespaces.
    let mut expected = BTreeSet::from([(vec!["DELETE".into()], vec!["*".into()], vec!["*".into()])]);
    // The fast finalizer's nudge of a namespace being deleted (controller/src/finalizer.rs).
    expected.insert((vec!["UPDATE".into()], vec!["".into()], vec!["namespaces".into()]));
    for kind in holdfast_pins::PinnedKind::ALL {
        if kind != holdfast_pins::PinnedKind::Package {
            expected.insert((
                vec!["UPDATE".into()],
                vec![kind.group().into()],
                vec![kind.resource().into()],
            ));
        }
    }
    if rules != expected {
        problems.push(format!("{}: matches {rules:?}, not {expected:?}", id(policy)));
    }
    let args = strings(at(controller, "spec.template.spec.containers.0.args"));
    let (rows, wanted) = (fence_rows(policy), fence_rows_for(&args));
    if rows != wanted {
        problems.push(format!(
            "{}: the deletable rows are not controller/src/deletable.rs's DELETABLE for the controller's flags; they should read:\n{}",
            id(policy),
            wanted.join(",\n")
        ));
    }
    for (i, validation) in items(policy, "spec.validations").iter().enumerate() {
        if text(validation, "reason") != "Forbidden" {
            problems.push(format!(
                "{}: validations[{i}] answers without reason Forbidden",
                id(policy)
            ));
        }
    }
    let bindings: Vec<&Value> = of_kind(objects, "ValidatingAdmissionPolicyBinding")
        .into_iter()
        .filter(|b| text(b, "spec.policyName") == FENCE)
        .collect();
    let enforced = bindings.iter().any(|b| {
        strings(b.get("spec").and_then(|s| s.get("validationActions"))) == ["Deny"]
            && at(b, "spec.matchResources").is_none()
            && at(b, "spec.paramRef").is_none()
    });
    if !enforced {
        problems.push(format!(
            "no binding of {FENCE} with validationActions [Deny] on every object"
        ));
    }
    problems.extend(check_term_fence(objects, controller, account));
    problems
}

/// The ControllerLease the controller Deployment elects with: its `--lease-name`, or the
/// binary's default.
pub fn lease_name(controller: &Value) -> &str {
    at(controller, "spec.template.spec.containers.0.args")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--lease-name="))
        .unwrap_or(holdfast_controller::leader::LEASE)
}

/// The term fence is installed, judges every write (subresources too) of the controller's
/// ServiceAccount's pods but the election's own against the ControllerLease, and its binding
/// denies, with that lease as its parameter: the one the controller Deployment elects with, in
/// its namespace. It fails open and passes all without the lease: kube-apiserver resolves the
/// parameter for every write its rules match before it evaluates a condition, so either
/// refusal would refuse every write in the cluster whenever the lease is missing or unread. The
/// parameter is holdfast's ControllerLease, never a built-in kind (whose informer in the API
/// server freezes: kubernetes/kubernetes#130887).
fn check_term_fence(objects: &[Value], controller: &Value, account: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(policy) = find(objects, "ValidatingAdmissionPolicy", TERM_FENCE) else {
        return vec![format!("no ValidatingAdmissionPolicy {TERM_FENCE}")];
    };
    let name = id(policy);
    if text(policy, "spec.failurePolicy") != "Ignore" {
        problems.push(format!(
            "{name}: failurePolicy is not Ignore (a Lease not yet read would refuse every write in the cluster)"
        ));
    }
    let lease_kind = (
        format!(
            "{}/{}",
            ControllerLease::group(&()),
            ControllerLease::version(&())
        ),
        ControllerLease::kind(&()).into_owned(),
    );
    let param_kind = (
        text(policy, "spec.paramKind.apiVersion").to_owned(),
        text(policy, "spec.paramKind.kind").to_owned(),
    );
    if param_kind != lease_kind {
        problems.push(format!(
            "{name}: its parameter is {param_kind:?}, not the controller's election, {lease_kind:?}"
        ));
    }
    let conditions: Vec<&str> = items(policy, "spec.matchConditions")
        .into_iter()
        .map(|c| text(c, "expression"))
        .collect();
    let replicas = format!(
        "{} && '{POD_NAME_EXTRA}' in request.userInfo.?extra.orValue({{}})",
        account_condition(account)
    );
    if conditions.first() != Some(&replicas.as_str()) {
        problems.push(format!(
            "{name}: its first condition is not the pods of {account}: {replicas}"
        ));
    }
    // The election's own writes, and nothing else, pass unjudged.
    let election = format!(
        "request.resource.group != '{}' || request.resource.resource != '{}'",
        ControllerLease::group(&()),
        ControllerLease::plural(&())
    );
    if conditions.get(1..) != Some(&[election.as_str()][..]) {
        problems.push(format!(
            "{name}: its conditions after the first are not the election's exception alone: {election}"
        ));
    }
    let rules = resource_rules(policy);
    let every_write = (
        vec!["CREATE".into(), "UPDATE".into(), "DELETE".into()],
        vec!["*".into()],
        vec!["*/*".into()],
    );
    if rules != [every_write] {
        problems.push(format!("{name}: matches {rules:?}, not every write"));
    }
    let lease = lease_name(controller);
    let namespace = text(controller, "metadata.namespace");
    let bound = of_kind(objects, "ValidatingAdmissionPolicyBinding")
        .into_iter()
        .any(|b| {
            text(b, "spec.policyName") == TERM_FENCE
                && strings(at(b, "spec.validationActions")) == ["Deny"]
                && at(b, "spec.matchResources").is_none()
                && text(b, "spec.paramRef.name") == lease
                && text(b, "spec.paramRef.namespace") == namespace
                && text(b, "spec.paramRef.parameterNotFoundAction") == "Allow"
        });
    if !bound {
        problems.push(format!(
            "no binding of {TERM_FENCE} with validationActions [Deny] and paramRef the ControllerLease {namespace}/{lease} (parameterNotFoundAction Allow: Deny would refuse every write in the cluster while there is no lease)"
        ));
    }
    problems
}

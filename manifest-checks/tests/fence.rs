//! The controller's fence (a ValidatingAdmissionPolicy) is the fast finalizer's table
//! (`DELETABLE`) for the controller's flags, in the base and with `components/fast-org-deletion`;
//! drifts from the table or the controller are caught; its fetch fields are those of
//! kapp-controller's upstream CRDs (collected by `make deps`; skipped without them). The term
//! fence judges the pods of the controller's ServiceAccount against the ControllerLease it elects
//! with.

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use holdfast_manifest_checks::{
    fence::{
        FENCE, TERM_FENCE, account_condition, check_fence, fence_row, fence_rows, fence_rows_for,
        fence_variable,
    },
    load::{base, kubectl, manifests, render, render_with_components},
    report::{assert_clean, expect_caught},
    upstream::{property_names, upstream_fetch_schema},
    yaml::{at_mut, find, find_mut, kind, text},
};
use serde_yaml::Value;

#[test]
fn the_fence_is_the_fast_finalizers_table_and_binds_the_controller() -> Result<()> {
    let objects = base()?;
    assert_clean("the base's fence", &check_fence(&objects));
    // The base's rows are the always-on ones; the opt-in rows come with their component.
    let policy = find(&objects, "ValidatingAdmissionPolicy", FENCE)?;
    ensure!(
        fence_rows(policy) == fence_rows_for(&[]),
        "{:?}",
        fence_rows(policy)
    );
    Ok(())
}

/// `components/fast-org-deletion` turns on `--delete-org-spaces` and the fence's CFSpace row
/// together, and changes nothing else of the fence.
#[test]
fn the_fence_lets_cfspaces_go_only_with_fast_org_deletion() -> Result<()> {
    let Some(kubectl) = kubectl() else {
        eprintln!("kubectl is not on PATH: the fence with fast-org-deletion is not checked");
        return Ok(());
    };
    let base = render(&kubectl, &manifests())?;
    let opted = render_with_components(&kubectl, &["fast-org-deletion"])?;
    assert_clean("base + fast-org-deletion", &check_fence(&opted));
    let all_rows: Vec<String> = holdfast_controller::deletable::DELETABLE
        .iter()
        .map(fence_row)
        .collect();
    let policy = find(&opted, "ValidatingAdmissionPolicy", FENCE)?;
    ensure!(fence_rows(policy) == all_rows, "{:?}", fence_rows(policy));
    ensure!(
        fence_rows(find(&base, "ValidatingAdmissionPolicy", FENCE)?) != all_rows,
        "the base's fence already holds the opt-in rows"
    );
    let mut without_rows = policy.clone();
    let mut base_policy = find(&base, "ValidatingAdmissionPolicy", FENCE)?.clone();
    for p in [&mut without_rows, &mut base_policy] {
        *at_mut(p, "spec.variables.1.expression")? = Value::Null;
    }
    ensure!(
        without_rows == base_policy,
        "components/fast-org-deletion changes more of the fence than its deletable rows"
    );
    Ok(())
}

#[test]
fn a_fence_that_drifts_from_the_table_or_the_controller_is_caught() -> Result<()> {
    fn with(change: impl FnOnce(&mut Vec<Value>) -> Result<()>) -> Result<Vec<String>> {
        let mut objects = base()?;
        change(&mut objects)?;
        Ok(check_fence(&objects))
    }
    fn policy(objects: &mut [Value]) -> Result<&mut Value> {
        find_mut(objects, "ValidatingAdmissionPolicy", FENCE)
    }
    let rows = |objects: &mut Vec<Value>, edit: &dyn Fn(&str) -> String| -> Result<()> {
        let expression = at_mut(policy(objects)?, "spec.variables.1.expression")?;
        *expression = Value::from(edit(expression.as_str().unwrap_or_default()));
        Ok(())
    };
    expect_caught(
        "a row dropped",
        with(|o| {
            rows(o, &|e| {
                e.replace(&fence_row(&holdfast_controller::deletable::BUILD_POD), "")
            })
        })?,
        "DELETABLE",
    );
    expect_caught(
        "the opt-in row without its flag",
        with(|o| {
            rows(o, &|e| {
                e.replace(
                    "\n]",
                    &format!(
                        ",\n  {}\n]",
                        fence_row(&holdfast_controller::deletable::NAMESPACE_SPACE)
                    ),
                )
            })
        })?,
        "DELETABLE",
    );
    expect_caught(
        "pods without their label",
        with(|o| rows(o, &|e| e.replace("'label': 'kpack.io/build'", "'label': ''")))?,
        "DELETABLE",
    );
    expect_caught(
        "fails open",
        with(|o| {
            *at_mut(policy(o)?, "spec.failurePolicy")? = Value::from("Ignore");
            Ok(())
        })?,
        "failurePolicy",
    );
    expect_caught(
        "another account",
        with(|o| {
            *at_mut(policy(o)?, "spec.matchConditions.0.expression")? = Value::from(
                "request.userInfo.username == 'system:serviceaccount:default:holdfast-controller'",
            );
            Ok(())
        })?,
        "does not match",
    );
    expect_caught(
        "no longer every delete",
        with(|o| {
            *at_mut(policy(o)?, "spec.matchConstraints.resourceRules.0.resources")? =
                serde_yaml::from_str("[pods]")?;
            Ok(())
        })?,
        "matches",
    );
    expect_caught(
        "a 422",
        with(|o| {
            at_mut(policy(o)?, "spec.validations.2")?
                .as_mapping_mut()
                .context("validation")?
                .remove("reason");
            Ok(())
        })?,
        "reason Forbidden",
    );
    expect_caught(
        "warn only",
        with(|o| {
            *at_mut(
                find_mut(o, "ValidatingAdmissionPolicyBinding", FENCE)?,
                "spec.validationActions",
            )? = serde_yaml::from_str("[Warn]")?;
            Ok(())
        })?,
        "no binding",
    );
    expect_caught(
        "no fence",
        with(|o| {
            o.retain(|d| kind(d) != "ValidatingAdmissionPolicy");
            Ok(())
        })?,
        "no ValidatingAdmissionPolicy",
    );
    let term_binding = |o: &mut Vec<Value>, path: &str, value: &str| -> Result<()> {
        *at_mut(find_mut(o, "ValidatingAdmissionPolicyBinding", TERM_FENCE)?, path)? =
            serde_yaml::from_str(value)?;
        Ok(())
    };
    expect_caught(
        "the term fence on another lease",
        with(|o| term_binding(o, "spec.paramRef.name", "other-lease"))?,
        TERM_FENCE,
    );
    expect_caught(
        "the term fence on a lease of another namespace",
        with(|o| term_binding(o, "spec.paramRef.namespace", "elsewhere"))?,
        TERM_FENCE,
    );
    expect_caught(
        "the term fence refusing every write in the cluster while no lease exists",
        with(|o| term_binding(o, "spec.paramRef.parameterNotFoundAction", "Deny"))?,
        TERM_FENCE,
    );
    expect_caught(
        "the term fence refusing every write in the cluster while its lease is unread",
        with(|o| {
            *at_mut(
                find_mut(o, "ValidatingAdmissionPolicy", TERM_FENCE)?,
                "spec.failurePolicy",
            )? = Value::from("Fail");
            Ok(())
        })?,
        "failurePolicy is not Ignore",
    );
    expect_caught(
        "the term fence on every token of the account, not its pods'",
        with(|o| {
            *at_mut(
                find_mut(o, "ValidatingAdmissionPolicy", TERM_FENCE)?,
                "spec.matchConditions.0.expression",
            )? = Value::from(account_condition("holdfast-controller"));
            Ok(())
        })?,
        "its first condition",
    );
    expect_caught(
        "the term fence without subresources",
        with(|o| {
            *at_mut(
                find_mut(o, "ValidatingAdmissionPolicy", TERM_FENCE)?,
                "spec.matchConstraints.resourceRules.0.resources",
            )? = serde_yaml::from_str("['*']")?;
            Ok(())
        })?,
        "not every write",
    );
    expect_caught(
        "the term fence on a coordination.k8s.io Lease (a built-in kind, whose informer freezes)",
        with(|o| {
            *at_mut(
                find_mut(o, "ValidatingAdmissionPolicy", TERM_FENCE)?,
                "spec.paramKind",
            )? = serde_yaml::from_str("{apiVersion: coordination.k8s.io/v1, kind: Lease}")?;
            Ok(())
        })?,
        "not the controller's election",
    );
    expect_caught(
        "the term fence leaving every holdfast.dev write unjudged",
        with(|o| {
            *at_mut(
                find_mut(o, "ValidatingAdmissionPolicy", TERM_FENCE)?,
                "spec.matchConditions.1.expression",
            )? = Value::from("request.resource.group != 'holdfast.dev'");
            Ok(())
        })?,
        "the election's exception alone",
    );
    expect_caught(
        "no term fence",
        with(|o| {
            o.retain(|d| text(d, "metadata.name") != TERM_FENCE);
            Ok(())
        })?,
        "no ValidatingAdmissionPolicy holdfast-controller-term",
    );
    Ok(())
}

/// The fence compares fetch entries field by field (CEL in Kubernetes 1.30 cannot drop a key
/// from an object): every field of the upstream CRDs' fetch entries must be either one it holds
/// unchanged (`fixed`, `sources`) or one pinning rewrites (`pins/src/sites.rs`: a source's
/// reference, `secretRef.name`, `tagSelection`). A field a new kapp-controller adds fails here.
#[test]
fn the_fence_holds_every_fetch_field_of_the_upstream_crds() -> Result<()> {
    let Some(schemas) = upstream_fetch_schema()? else {
        eprintln!(
            "kapp-controller's CRDs are not collected (make deps): the fence's fetch fields are not checked"
        );
        return Ok(());
    };
    ensure!(schemas.len() >= 2, "found only {schemas:?}");
    let objects = base()?;
    let policy = find(&objects, "ValidatingAdmissionPolicy", FENCE)?;
    // `f.?git`, `f.?image.?subPath`: the paths the policy holds unchanged.
    let fixed: BTreeSet<String> = fence_variable(policy, "fixed")
        .split("f.?")
        .skip(1)
        .map(|s| {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '?')
                .collect::<String>()
                .replace('?', "")
        })
        .collect();
    let sources = fence_variable(policy, "sources");
    let mut problems = Vec::new();
    for kind in [
        holdfast_pins::SiteKind::Image,
        holdfast_pins::SiteKind::ImgpkgBundle,
    ] {
        let source = kind.source_key();
        for needle in [
            format!("has(f.{source})"),
            format!("f.?{source}.?secretRef.hasValue()"),
        ] {
            if !sources.contains(&needle) {
                problems.push(format!("the fence's sources do not hold {needle}"));
            }
        }
    }
    for (crd, entry) in &schemas {
        let mut held: BTreeSet<String> = fixed.iter().filter(|p| !p.contains('.')).cloned().collect();
        for kind in [
            holdfast_pins::SiteKind::Image,
            holdfast_pins::SiteKind::ImgpkgBundle,
        ] {
            let source = kind.source_key();
            held.insert(source.to_owned());
            let schema = &entry["properties"][source];
            let rewritten = BTreeSet::from([
                kind.ref_key().to_owned(),
                "secretRef".into(),
                "tagSelection".into(),
            ]);
            let unchanged: BTreeSet<String> = fixed
                .iter()
                .filter_map(|p| p.strip_prefix(&format!("{source}.")).map(str::to_owned))
                .collect();
            let covered: BTreeSet<String> = rewritten.union(&unchanged).cloned().collect();
            if property_names(schema) != covered {
                problems.push(format!(
                    "{crd}: fetch[].{source} has {:?}; the fence covers {covered:?}",
                    property_names(schema)
                ));
            }
            let secret = property_names(&schema["properties"]["secretRef"]);
            if secret != BTreeSet::from(["name".to_owned()]) {
                problems.push(format!(
                    "{crd}: fetch[].{source}.secretRef has {secret:?}, not only name"
                ));
            }
        }
        let fields = property_names(entry);
        if !fields.is_subset(&held) {
            problems.push(format!(
                "{crd}: fetch entries have {:?} that the fence does not hold",
                fields.difference(&held).collect::<Vec<_>>()
            ));
        }
    }
    assert_clean("the fence's fetch fields", &problems);
    Ok(())
}

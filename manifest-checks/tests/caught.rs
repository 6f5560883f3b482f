//! Every check catches what it is for: each runs on mutated copies of the base (a wildcard verb,
//! a missing namespaceSelector, a drifted table row, …) and must report the mutation.

use anyhow::{Context, Result, ensure};
use holdfast_manifest_checks::{
    IGNORE_LABEL,
    checks::{
        check_availability, check_containers, check_network, check_no_wildcards, check_served, check_webhooks,
    },
    load::base,
    report::{assert_clean, expect_caught},
    tables::{
        rbac::{RBAC_TABLE, compare_rbac, rbac_from_doc, rbac_from_manifests},
        security_md,
        settings::{
            compare_settings, match_conditions_component, settings_from_doc, settings_from_manifests,
        },
    },
    yaml::{at_mut, find_mut, strings, text},
};
use serde_yaml::Value;

#[test]
fn a_wildcard_in_any_role_field_is_caught() -> Result<()> {
    for (field, role_kind, role) in [
        ("verbs", "ClusterRole", "holdfast-controller"),
        ("resources", "ClusterRole", "holdfast-webhook"),
        ("apiGroups", "Role", "holdfast-webhook"),
        ("resourceNames", "ClusterRole", "holdfast-webhook-certs"),
    ] {
        let mut objects = base()?;
        let rule = at_mut(find_mut(&mut objects, role_kind, role)?, "rules.0")?;
        let list = rule
            .get_mut(field)
            .and_then(Value::as_sequence_mut)
            .with_context(|| format!("{role} rules[0] has no {field}"))?;
        list.push(Value::from("*"));
        expect_caught(
            &format!("`*` in {role}.{field}"),
            check_no_wildcards(&objects),
            "wildcard",
        );
    }
    // A rule added with everything, as `kubectl create clusterrole --verb='*'` would write it.
    let mut objects = base()?;
    let rules = at_mut(
        find_mut(&mut objects, "ClusterRole", "holdfast-controller")?,
        "rules",
    )?;
    let everything: Value = serde_yaml::from_str("{apiGroups: ['*'], resources: ['*'], verbs: ['*']}")?;
    rules.as_sequence_mut().context("rules")?.push(everything);
    expect_caught("a rule of wildcards", check_no_wildcards(&objects), "wildcard");
    Ok(())
}

#[test]
fn a_webhook_without_its_namespace_exclusions_is_caught() -> Result<()> {
    // No namespaceSelector at all.
    let mut objects = base()?;
    let webhook = at_mut(
        find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?,
        "webhooks.0",
    )?;
    webhook
        .as_mapping_mut()
        .context("webhook")?
        .remove("namespaceSelector");
    expect_caught(
        "no namespaceSelector",
        check_webhooks(&objects),
        "no namespaceSelector",
    );

    // kube-system no longer excluded.
    let mut objects = base()?;
    let values = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks.2.namespaceSelector.matchExpressions.0.values",
    )?;
    values
        .as_sequence_mut()
        .context("values")?
        .retain(|v| v.as_str() != Some("kube-system"));
    expect_caught(
        "kube-system not excluded",
        check_webhooks(&objects),
        "kube-system",
    );

    // The opt-out label dropped.
    let mut objects = base()?;
    let expressions = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks.0.namespaceSelector.matchExpressions",
    )?;
    expressions
        .as_sequence_mut()
        .context("matchExpressions")?
        .retain(|e| e.get("key").and_then(Value::as_str) != Some(IGNORE_LABEL));
    expect_caught("no opt-out label", check_webhooks(&objects), IGNORE_LABEL);
    Ok(())
}

#[test]
fn unsafe_webhook_settings_are_caught() -> Result<()> {
    let cases: [(&str, &str, &str, &str, &str); 7] = [
        (
            "MutatingWebhookConfiguration",
            "webhooks.0.sideEffects",
            "Some",
            "sideEffects",
            "sideEffects",
        ),
        (
            "MutatingWebhookConfiguration",
            "webhooks.1.timeoutSeconds",
            "30",
            "timeout 30",
            "timeoutSeconds",
        ),
        (
            "MutatingWebhookConfiguration",
            "webhooks.0.failurePolicy",
            "Fail",
            "mutation fails closed",
            "fail open",
        ),
        (
            "ValidatingWebhookConfiguration",
            "webhooks.1.failurePolicy",
            "Fail",
            "guard fails closed",
            "fail open",
        ),
        (
            "ValidatingWebhookConfiguration",
            "webhooks.2.failurePolicy",
            "Fail",
            "pod guard fails closed",
            "fail open",
        ),
        (
            "MutatingWebhookConfiguration",
            "webhooks.0.reinvocationPolicy",
            "Never",
            "no reinvocation",
            "IfNeeded",
        ),
        (
            "ValidatingWebhookConfiguration",
            "webhooks.0.clientConfig.service.path",
            "/mutate",
            "wrong path",
            "clientConfig",
        ),
    ];
    for (configuration, path, value, what, needle) in cases {
        let mut objects = base()?;
        *at_mut(find_mut(&mut objects, configuration, "holdfast")?, path)? = serde_yaml::from_str(value)?;
        expect_caught(what, check_webhooks(&objects), needle);
    }
    // admissionReviewVersions with v1beta1 too.
    let mut objects = base()?;
    *at_mut(
        find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?,
        "webhooks.0.admissionReviewVersions",
    )? = serde_yaml::from_str("[v1, v1beta1]")?;
    expect_caught(
        "v1beta1 reviews",
        check_webhooks(&objects),
        "admissionReviewVersions",
    );
    Ok(())
}

#[test]
fn rules_the_code_does_not_serve_and_served_rules_left_out_are_caught() -> Result<()> {
    // A rule for Deployments: holdfast has no rule for them.
    let mut objects = base()?;
    let rules = at_mut(
        find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?,
        "webhooks.1.rules",
    )?;
    let deployments: Value = serde_yaml::from_str(
        "{apiGroups: [apps], apiVersions: [v1], resources: [deployments], operations: [CREATE], scope: Namespaced}",
    )?;
    rules.as_sequence_mut().context("rules")?.push(deployments);
    expect_caught(
        "deployments registered",
        check_served(&objects),
        "not served by the code",
    );

    // The build-pod webhook removed.
    let mut objects = base()?;
    let list = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks",
    )?;
    list.as_sequence_mut().context("webhooks")?.truncate(2);
    expect_caught("pods not registered", check_served(&objects), "not registered");

    // DELETE added to the terminating guard.
    let mut objects = base()?;
    let operations = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks.1.rules.0.operations",
    )?;
    operations
        .as_sequence_mut()
        .context("operations")?
        .push(Value::from("DELETE"));
    expect_caught("DELETE registered", check_served(&objects), "DELETE");
    Ok(())
}

#[test]
fn containers_that_are_not_restricted_are_caught() -> Result<()> {
    let cases: [(&str, &str, &str); 7] = [
        (
            "securityContext.readOnlyRootFilesystem",
            "false",
            "readOnlyRootFilesystem",
        ),
        (
            "securityContext.allowPrivilegeEscalation",
            "true",
            "allowPrivilegeEscalation",
        ),
        ("securityContext.capabilities", "{drop: [NET_RAW]}", "drop ALL"),
        ("securityContext.runAsNonRoot", "false", "runAsNonRoot"),
        (
            "securityContext.seccompProfile",
            "{type: Unconfined}",
            "seccompProfile",
        ),
        ("resources", "{requests: {cpu: 10m, memory: 10Mi}}", "limits.cpu"),
        ("securityContext.privileged", "true", "privileged"),
    ];
    for (path, value, needle) in cases {
        let mut objects = base()?;
        let container = at_mut(
            find_mut(&mut objects, "Deployment", "holdfast-controller")?,
            "spec.template.spec.containers.0",
        )?;
        let (parent, key) = path.rsplit_once('.').unwrap_or(("", path));
        let target = if parent.is_empty() {
            container
        } else {
            at_mut(container, parent)?
        };
        target
            .as_mapping_mut()
            .context("not a mapping")?
            .insert(Value::from(key), serde_yaml::from_str(value)?);
        expect_caught(path, check_containers(&objects), needle);
    }
    Ok(())
}

#[test]
fn a_drifted_rbac_table_is_caught() -> Result<()> {
    let doc = rbac_from_doc(&security_md()?, RBAC_TABLE)?;
    let mut objects = base()?;
    let verbs = at_mut(
        find_mut(&mut objects, "ClusterRole", "holdfast-controller")?,
        "rules.0.verbs",
    )?;
    verbs
        .as_sequence_mut()
        .context("verbs")?
        .push(Value::from("update"));
    expect_caught(
        "an undocumented verb",
        compare_rbac(&doc, &rbac_from_manifests(&objects)),
        "not in SECURITY.md",
    );
    Ok(())
}

#[test]
fn a_controller_without_high_availability_or_lease_rbac_is_caught() -> Result<()> {
    assert_clean("the base", &check_availability(&base()?));
    let mut objects = base()?;
    *at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-controller")?,
        "spec.replicas",
    )? = Value::from(1);
    expect_caught(
        "one controller",
        check_availability(&objects),
        "must run at least 2",
    );

    // Each lease rule removed from the controller's Role: the election could not run.
    for verb in ["create", "get"] {
        let mut objects = base()?;
        let rules = at_mut(find_mut(&mut objects, "Role", "holdfast-controller")?, "rules")?
            .as_sequence_mut()
            .context("rules")?;
        let index = rules
            .iter()
            .position(|r| {
                strings(r.get("resources")) == ["controllerleases"]
                    && strings(r.get("verbs")).contains(&verb.to_owned())
            })
            .with_context(|| format!("Role holdfast-controller has no lease rule with {verb}"))?;
        rules.remove(index);
        expect_caught(
            &format!("no lease rule with {verb}"),
            check_availability(&objects),
            &format!("may not {verb} its ControllerLease"),
        );
    }
    // The Lease named by --lease-name is not the one RBAC names.
    let mut objects = base()?;
    at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-controller")?,
        "spec.template.spec.containers.0.args",
    )?
    .as_sequence_mut()
    .context("args")?
    .iter_mut()
    .filter(|a| a.as_str().is_some_and(|a| a.starts_with("--lease-name=")))
    .for_each(|a| *a = Value::from("--lease-name=other"));
    expect_caught(
        "another lease",
        check_availability(&objects),
        "may not get its ControllerLease",
    );
    // No identity: every replica would claim the Lease as the same holder.
    let mut objects = base()?;
    at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-controller")?,
        "spec.template.spec.containers.0.env",
    )?
    .as_sequence_mut()
    .context("env")?
    .retain(|e| text(e, "name") != "POD_NAME");
    expect_caught("no identity", check_availability(&objects), "no identity");

    let mut objects = base()?;
    *at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-webhook")?,
        "spec.replicas",
    )? = Value::from(1);
    expect_caught("one webhook", check_availability(&objects), "fewer than 2");
    Ok(())
}

#[test]
fn an_open_admin_port_is_caught() -> Result<()> {
    let mut objects = base()?;
    let rule = at_mut(
        find_mut(&mut objects, "NetworkPolicy", "holdfast-webhook")?,
        "spec.ingress.1",
    )?;
    rule.as_mapping_mut().context("rule")?.remove("from");
    expect_caught("admin port open", check_network(&objects), "admin port");

    let mut objects = base()?;
    let rule = at_mut(
        find_mut(&mut objects, "NetworkPolicy", "holdfast-controller")?,
        "spec.ingress.0",
    )?;
    rule.as_mapping_mut().context("rule")?.remove("from");
    expect_caught(
        "controller admin port open",
        check_network(&objects),
        "admin port",
    );
    Ok(())
}

#[test]
fn a_drifted_webhook_setting_is_caught() -> Result<()> {
    let doc = settings_from_doc(&security_md()?)?;
    let conditions = match_conditions_component()?;
    let drifts: [(&str, &str, Value); 6] = [
        ("namespaceSelector", "namespace", Value::Null),
        (
            "objectSelector",
            "objectSelector",
            serde_yaml::from_str("{matchLabels: {a: b}}")?,
        ),
        ("failurePolicy", "failurePolicy", Value::String("Fail".into())),
        ("sideEffects", "sideEffects", Value::String("NoneOnDryRun".into())),
        ("timeoutSeconds", "timeoutSeconds", serde_yaml::from_str("30")?),
        (
            "matchConditions",
            "matchConditions",
            serde_yaml::from_str("[{name: x, expression: 'true'}]")?,
        ),
    ];
    for (field, needle, value) in drifts {
        let mut objects = base()?;
        let configuration = find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?;
        let webhook = at_mut(configuration, "webhooks.0")?;
        match (field, value) {
            ("namespaceSelector", _) => {
                if let Some(map) = webhook.as_mapping_mut() {
                    map.remove("namespaceSelector");
                }
            }
            (field, value) => webhook[field] = value,
        }
        let problems = compare_settings(&doc, &settings_from_manifests(&objects, &conditions));
        ensure!(
            !problems.is_empty(),
            "a changed {field} ({needle}) went unnoticed"
        );
    }
    // A rule's scope widened to cluster-wide objects.
    let mut objects = base()?;
    let configuration = find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?;
    at_mut(configuration, "webhooks.0.rules.0")?["scope"] = Value::String("*".into());
    ensure!(
        !compare_settings(&doc, &settings_from_manifests(&objects, &conditions)).is_empty(),
        "a widened scope went unnoticed"
    );
    Ok(())
}

#[test]
fn a_removal_kapp_would_do_out_of_order_is_caught() -> Result<()> {
    use holdfast_manifest_checks::checks::{CHANGE_GROUP, CHANGE_RULE, check_removal_order};
    assert_clean("removal order (the base)", &check_removal_order(&base()?));
    // Each object an admission goes through, without its rule; a configuration without its group.
    for (what, object_kind, name, key) in [
        (
            "the webhook's Deployment",
            "Deployment",
            "holdfast-webhook",
            CHANGE_RULE,
        ),
        (
            "the webhook's Service",
            "Service",
            "holdfast-webhook",
            CHANGE_RULE,
        ),
        (
            "the webhook's NetworkPolicy",
            "NetworkPolicy",
            "holdfast-webhook",
            CHANGE_RULE,
        ),
        (
            "holdfast's Namespace",
            "Namespace",
            "holdfast-system",
            CHANGE_RULE,
        ),
        (
            "the mutating configuration",
            "MutatingWebhookConfiguration",
            "holdfast",
            CHANGE_GROUP,
        ),
        (
            "the validating configuration",
            "ValidatingWebhookConfiguration",
            "holdfast",
            CHANGE_GROUP,
        ),
    ] {
        let mut objects = base()?;
        let annotations = at_mut(find_mut(&mut objects, object_kind, name)?, "metadata.annotations")?;
        annotations
            .as_mapping_mut()
            .with_context(|| format!("{object_kind} {name}: annotations"))?
            .remove(key)
            .with_context(|| format!("{object_kind} {name} has no {key}"))?;
        expect_caught(
            &format!("{what} without {key}"),
            check_removal_order(&objects),
            name,
        );
    }
    Ok(())
}

#[test]
fn a_pinning_policy_that_could_cross_namespaces_or_drift_is_caught() -> Result<()> {
    use holdfast_manifest_checks::policies::check_pinning_policy;
    assert_clean("the base's pinning policy", &check_pinning_policy(&base()?));
    // The private parameters read from one namespace for every object.
    let mut objects = base()?;
    let binding = find_mut(
        &mut objects,
        "MutatingAdmissionPolicyBinding",
        "holdfast-pin-cached-private",
    )?;
    at_mut(binding, "spec.paramRef")?
        .as_mapping_mut()
        .context("paramRef")?
        .insert("namespace".into(), "holdfast-system".into());
    expect_caught(
        "a private binding with a paramRef namespace",
        check_pinning_policy(&objects),
        "name no namespace",
    );
    // One body changed: the two policies no longer pin alike.
    let mut objects = base()?;
    let policy = find_mut(&mut objects, "MutatingAdmissionPolicy", "holdfast-pin-cached")?;
    *at_mut(policy, "spec.failurePolicy")? = "Fail".into();
    expect_caught(
        "policies of two bodies",
        check_pinning_policy(&objects),
        "differ in more than their parameters",
    );
    // A binding serving holdfast's own namespace.
    let mut objects = base()?;
    let binding = find_mut(
        &mut objects,
        "MutatingAdmissionPolicyBinding",
        "holdfast-pin-cached",
    )?;
    at_mut(binding, "spec.matchResources")?
        .as_mapping_mut()
        .context("matchResources")?
        .remove("namespaceSelector");
    expect_caught(
        "a binding without the webhook's namespaceSelector",
        check_pinning_policy(&objects),
        "namespaceSelector is not the one",
    );
    // The policy off, the controller still publishing.
    let mut objects = base()?;
    objects.retain(|o| !text(o, "kind").starts_with("MutatingAdmissionPolicy"));
    expect_caught(
        "no policy, parameters published",
        check_pinning_policy(&objects),
        "yet the controller publishes",
    );
    Ok(())
}

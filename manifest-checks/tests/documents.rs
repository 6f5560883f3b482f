//! SECURITY.md's tables and README.md agree with the manifests row for row: RBAC (base and
//! components), webhooks, every security-relevant webhook setting, the webhook's flags.

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail, ensure};
use holdfast_manifest_checks::{
    HOLDFAST_NAMESPACE,
    load::{base, load_kustomization, manifests, read, repo, subdirectories},
    policies::{policies_from_doc, policies_from_manifests},
    report::assert_clean,
    tables::{
        rbac::{COMPONENT_RBAC_TABLE, RBAC_TABLE, compare_rbac, rbac_from_doc, rbac_from_manifests},
        security_md,
        settings::{
            compare_settings, match_conditions_component, settings_from_doc, settings_from_manifests,
        },
        webhooks::{webhooks_from_doc, webhooks_from_manifests},
    },
    yaml::{at, find, items, of_kind, strings, text, webhooks},
};
use serde_yaml::Value;

#[test]
fn the_rbac_table_in_security_md_is_the_rbac_of_the_manifests() -> Result<()> {
    let doc = rbac_from_doc(&security_md()?, RBAC_TABLE)?;
    let manifests = rbac_from_manifests(&base()?);
    ensure!(manifests.len() > 10, "only {} RBAC rules found", manifests.len());
    assert_clean("SECURITY.md vs manifests (RBAC)", &compare_rbac(&doc, &manifests));
    Ok(())
}

/// The Roles components add (their own `resources:`, e.g. `no-secret-reads`' Role for the
/// mirror Secret) are SECURITY.md's component RBAC table, row for row.
#[test]
fn the_component_rbac_table_in_security_md_is_the_rbac_components_add() -> Result<()> {
    let doc = rbac_from_doc(&security_md()?, COMPONENT_RBAC_TABLE)?;
    let mut added = Vec::new();
    for component in subdirectories(&manifests().join("components"))? {
        added.extend(load_kustomization(
            &manifests().join("components").join(component),
        )?);
    }
    let manifests = rbac_from_manifests(&added);
    ensure!(!manifests.is_empty(), "no component adds RBAC");
    assert_clean(
        "SECURITY.md vs components (RBAC)",
        &compare_rbac(&doc, &manifests),
    );
    Ok(())
}

#[test]
fn the_webhook_table_in_security_md_is_the_webhooks_of_the_manifests() -> Result<()> {
    let doc = webhooks_from_doc(&security_md()?)?;
    let manifests = webhooks_from_manifests(&base()?);
    assert_eq!(
        doc, manifests,
        "SECURITY.md's webhook table (left) vs the manifests (right)"
    );
    Ok(())
}

#[test]
fn the_policy_table_in_security_md_is_the_pinning_policy_of_the_manifests() -> Result<()> {
    let doc = policies_from_doc(&security_md()?)?;
    let manifests = policies_from_manifests(&base()?);
    ensure!(!manifests.is_empty(), "the base has no pinning policy");
    assert_eq!(
        doc, manifests,
        "SECURITY.md's pinning policy table (left) vs the manifests (right)"
    );
    Ok(())
}

/// The webhook Deployment's flags are documented (README.md, "Configuration") and agree with
/// the objects they name: ports, Service, configurations (and their RBAC resourceNames), the TLS
/// Secret, the policy file.
#[test]
fn the_webhook_deployment_agrees_with_the_readme_and_the_other_objects() -> Result<()> {
    let objects = base()?;
    let readme = read(&repo().join("README.md"))?;
    let deployment = find(&objects, "Deployment", "holdfast-webhook")?;
    ensure!(text(deployment, "metadata.namespace") == HOLDFAST_NAMESPACE);
    let container = at(deployment, "spec.template.spec.containers.0").context("no container")?;
    let mut flags: Vec<(String, String)> = Vec::new();
    for arg in strings(container.get("args")) {
        let (flag, value) = arg
            .split_once('=')
            .with_context(|| format!("write flags as --flag=value: {arg}"))?;
        ensure!(
            readme.contains(&format!("`{flag}`")),
            "{flag} is not documented in README.md"
        );
        flags.push((flag.to_owned(), value.to_owned()));
    }
    let flag = |name: &str| -> Vec<String> {
        flags
            .iter()
            .filter(|(f, _)| f == name)
            .flat_map(|(_, v)| v.split(',').map(str::to_owned))
            .collect()
    };
    let one = |name: &str| -> Result<String> {
        match flag(name).as_slice() {
            [value] => Ok(value.clone()),
            other => bail!("{name}: {other:?}"),
        }
    };
    let port = |name: &str| {
        items(container, "ports")
            .into_iter()
            .find(|p| text(p, "name") == name)
            .and_then(|p| at(p, "containerPort").and_then(Value::as_i64))
            .map(|p| p.to_string())
    };
    let flag_port = |name: &str| one(name).map(|a| a.rsplit(':').next().unwrap_or_default().to_owned());
    assert_eq!(port("https"), Some(flag_port("--addr")?), "--addr vs port https");
    assert_eq!(
        port("admin"),
        Some(flag_port("--admin-addr")?),
        "--admin-addr vs port admin"
    );
    // --namespace is POD_NAMESPACE: the pod's own namespace.
    let namespace_env = items(container, "env")
        .into_iter()
        .find(|e| text(e, "name") == "POD_NAMESPACE")
        .context("no POD_NAMESPACE")?;
    assert_eq!(
        text(namespace_env, "valueFrom.fieldRef.fieldPath"),
        "metadata.namespace"
    );

    // The Service the webhooks call selects these pods and routes its port to the TLS port.
    let service_name = one("--service-name")?;
    let service = find(&objects, "Service", &service_name)?;
    let pod_labels = at(deployment, "spec.template.metadata.labels").context("no pod labels")?;
    let selects = at(service, "spec.selector")
        .and_then(Value::as_mapping)
        .is_some_and(|s| s.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    ensure!(selects, "Service {service_name} does not select the webhook pods");
    for (_, webhook) in webhooks(&objects) {
        assert_eq!(text(webhook, "clientConfig.service.name"), service_name);
        let port = at(webhook, "clientConfig.service.port")
            .and_then(Value::as_i64)
            .unwrap_or(443);
        let routed = items(service, "spec.ports")
            .iter()
            .any(|p| at(p, "port").and_then(Value::as_i64) == Some(port) && text(p, "targetPort") == "https");
        ensure!(routed, "Service port {port} does not lead to the TLS port");
    }

    // The configurations holdfast injects into are exactly the ones installed, and RBAC names them.
    let names = |k: &str| -> BTreeSet<String> {
        of_kind(&objects, k)
            .iter()
            .map(|o| text(o, "metadata.name").to_owned())
            .collect()
    };
    let set = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();
    assert_eq!(
        set(flag("--mutating-webhook-configurations")),
        names("MutatingWebhookConfiguration")
    );
    assert_eq!(
        set(flag("--validating-webhook-configurations")),
        names("ValidatingWebhookConfiguration")
    );
    let certs = find(&objects, "ClusterRole", "holdfast-webhook-certs")?;
    let allowed: BTreeSet<String> = items(certs, "rules")
        .iter()
        .flat_map(|r| strings(r.get("resourceNames")))
        .collect();
    let configured: BTreeSet<String> = names("MutatingWebhookConfiguration")
        .union(&names("ValidatingWebhookConfiguration"))
        .cloned()
        .collect();
    assert_eq!(allowed, configured, "resourceNames vs the configurations");

    // The certificate Secret exists and ships empty (holdfast may not create it), and it is the
    // one RBAC names.
    let tls_secret = one("--tls-secret")?;
    let secret = find(&objects, "Secret", &tls_secret)?;
    ensure!(secret.get("data").is_none(), "the TLS Secret must ship empty");
    let role = find(&objects, "Role", "holdfast-webhook-certs")?;
    assert_eq!(
        items(role, "rules")
            .iter()
            .flat_map(|r| strings(r.get("resourceNames")))
            .collect::<Vec<_>>(),
        [tls_secret]
    );

    // The policy file is on a mounted volume and parses with the webhook's own parser.
    let policy = one("--policy-file")?;
    let mounted = items(container, "volumeMounts")
        .iter()
        .any(|m| policy.starts_with(&format!("{}/", text(m, "mountPath"))));
    ensure!(mounted, "{policy} is not on a mounted volume");
    let policy_text = read(&manifests().join("base/webhook/policy.yaml"))?;
    holdfast_webhook::rules::policy::Policy::from_yaml(&policy_text)?;
    Ok(())
}

/// Issue 15, item 7: SECURITY.md held the manifests to names, paths and failure policies only.
/// Every security-relevant field of every webhook is now in its settings table.
#[test]
fn every_security_relevant_webhook_setting_is_the_one_security_md_states() -> Result<()> {
    let doc = settings_from_doc(&security_md()?)?;
    let manifests = settings_from_manifests(&base()?, &match_conditions_component()?);
    assert_clean(
        "SECURITY.md vs manifests (webhook settings)",
        &compare_settings(&doc, &manifests),
    );
    Ok(())
}

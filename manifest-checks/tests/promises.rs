//! The manifests keep every promise of SECURITY.md: the base as written, every rendering by
//! `kubectl kustomize` (skipped without kubectl), and the objects one by one.

use std::collections::BTreeSet;

use anyhow::{Context, Result, ensure};
use holdfast_manifest_checks::{
    HOLDFAST_NAMESPACE, check_all,
    finalizer::{controller_deletes, deletable},
    load::{
        base, kubectl, load_kustomization, manifests, parse_documents, read, render, render_with_components,
        repo, subdirectories,
    },
    report::assert_clean,
    tables::rbac::{RbacRow, rbac_from_manifests},
    yaml::{at, find, id, items, kind, of_kind, strings, text},
};
use serde_yaml::Value;

#[test]
fn the_base_keeps_every_promise() -> Result<()> {
    assert_clean("manifests/ (as written)", &check_all(&base()?));
    Ok(())
}

#[test]
fn bindings_grant_holdfast_roles_to_holdfast_service_accounts_only() -> Result<()> {
    let objects = base()?;
    let mut problems = Vec::new();
    for binding in objects
        .iter()
        .filter(|o| ["RoleBinding", "ClusterRoleBinding"].contains(&kind(o)))
    {
        let role_kind = text(binding, "roleRef.kind");
        let role = text(binding, "roleRef.name");
        if find(&objects, role_kind, role).is_err() {
            problems.push(format!(
                "{}: binds {role_kind} {role}, which is not holdfast's",
                id(binding)
            ));
        }
        for subject in items(binding, "subjects") {
            let account = (
                text(subject, "kind"),
                text(subject, "namespace"),
                text(subject, "name"),
            );
            let ours = account.0 == "ServiceAccount"
                && account.1 == HOLDFAST_NAMESPACE
                && find(&objects, "ServiceAccount", account.2).is_ok();
            if !ours {
                problems.push(format!("{}: binds {account:?}", id(binding)));
            }
        }
    }
    for role in objects
        .iter()
        .filter(|o| ["Role", "ClusterRole"].contains(&kind(o)))
    {
        let bound = objects.iter().any(|b| {
            text(b, "roleRef.kind") == kind(role) && text(b, "roleRef.name") == text(role, "metadata.name")
        });
        if !bound {
            problems.push(format!("{}: not bound to anything", id(role)));
        }
        if kind(role) == "Role" && text(role, "metadata.namespace") != HOLDFAST_NAMESPACE {
            problems.push(format!("{}: a Role outside {HOLDFAST_NAMESPACE}", id(role)));
        }
    }
    assert_clean("bindings", &problems);
    Ok(())
}

/// The e2e harness installs every `*.yaml` in manifests/crds as a CRD, and holdfast's code
/// addresses the digest cache by a fixed group, version and plural.
#[test]
fn the_crds_directory_holds_only_crds_and_the_cache_crd_matches_the_code() -> Result<()> {
    let dir = manifests().join("crds");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "yaml") {
            for doc in parse_documents(&read(&path)?)? {
                ensure!(
                    kind(&doc) == "CustomResourceDefinition",
                    "{} holds a {} (the harness loads *.yaml here as CRDs)",
                    path.display(),
                    kind(&doc)
                );
                found.push(doc);
            }
        }
    }
    let resource = holdfast_cache::cluster_store::resource();
    let crd = found
        .iter()
        .find(|c| text(c, "spec.names.kind") == resource.kind)
        .context("no DigestCacheEntry CRD")?;
    assert_eq!(text(crd, "spec.group"), resource.group);
    assert_eq!(text(crd, "spec.names.plural"), resource.plural);
    assert_eq!(text(crd, "spec.scope"), "Namespaced");
    ensure!(
        items(crd, "spec.versions")
            .iter()
            .any(|v| text(v, "name") == resource.version
                && at(v, "storage").and_then(Value::as_bool) == Some(true)),
        "no stored {} version",
        resource.version
    );
    // Whatever renders the base installs it.
    ensure!(
        find(
            &base()?,
            "CustomResourceDefinition",
            &format!("{}.{}", resource.plural, resource.group)
        )
        .is_ok()
    );
    Ok(())
}

#[test]
fn holdfasts_namespace_enforces_the_restricted_pod_security_profile() -> Result<()> {
    let objects = base()?;
    let namespace = find(&objects, "Namespace", HOLDFAST_NAMESPACE)?;
    let labels = at(namespace, "metadata.labels").context("no labels")?;
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .and_then(Value::as_str),
        Some("restricted")
    );
    for object in &objects {
        if let Some(ns) = at(object, "metadata.namespace").and_then(Value::as_str) {
            assert_eq!(
                ns,
                HOLDFAST_NAMESPACE,
                "{} is outside holdfast's namespace",
                id(object)
            );
        }
    }
    Ok(())
}

#[test]
fn every_rendering_keeps_every_promise() -> Result<()> {
    let Some(kubectl) = kubectl() else {
        eprintln!("kubectl is not on PATH: the renderings are not checked");
        return Ok(());
    };
    // `kubectl apply -k manifests/` must work.
    let base = render(&kubectl, &manifests())?;
    assert_clean("kubectl kustomize manifests/", &check_all(&base));
    // The policy ConfigMap is generated (name with a content hash) and mounted by that name.
    let generated = of_kind(&base, "ConfigMap")
        .iter()
        .map(|c| text(c, "metadata.name").to_owned())
        .find(|n| n.starts_with("holdfast-policy-"))
        .context("no generated holdfast-policy ConfigMap")?;
    let webhook = find(&base, "Deployment", "holdfast-webhook")?;
    ensure!(
        items(webhook, "spec.template.spec.volumes")
            .iter()
            .any(|v| text(v, "configMap.name") == generated),
        "the webhook does not mount {generated}"
    );

    for overlay in subdirectories(&manifests().join("overlays"))? {
        let objects = render(&kubectl, &manifests().join("overlays").join(&overlay))?;
        assert_clean(&format!("overlays/{overlay}"), &check_all(&objects));
    }

    // Every component alone and all together.
    let components = subdirectories(&manifests().join("components"))?;
    ensure!(!components.is_empty(), "no components");
    let mut selections: Vec<Vec<String>> = components.iter().map(|c| vec![c.clone()]).collect();
    selections.push(components.clone());
    for selection in selections {
        let objects = render_with_components(&kubectl, &selection)?;
        assert_clean(&format!("base + components {selection:?}"), &check_all(&objects));
    }
    Ok(())
}

#[test]
fn the_kind_overlay_runs_the_image_make_image_builds() -> Result<()> {
    let Some(kubectl) = kubectl() else {
        eprintln!("kubectl is not on PATH: the kind overlay is not checked");
        return Ok(());
    };
    let makefile = read(&repo().join("Makefile"))?;
    let image = makefile
        .lines()
        .find_map(|l| l.strip_prefix("IMAGE ?="))
        .map(str::trim)
        .context("no `IMAGE ?=` in the Makefile")?;
    let objects = render(&kubectl, &manifests().join("overlays/kind"))?;
    for deployment in of_kind(&objects, "Deployment") {
        for container in items(deployment, "spec.template.spec.containers") {
            assert_eq!(text(container, "image"), image, "{}", id(deployment));
            assert_eq!(
                text(container, "imagePullPolicy"),
                "IfNotPresent",
                "{}",
                id(deployment)
            );
        }
    }
    Ok(())
}

/// The controller's admin port: `--admin-addr` (documented) is the container's `admin` port,
/// the probes ask it (`/healthz` for liveness, `/readyz` for readiness), and a NetworkPolicy
/// opens it to scrapers only.
#[test]
fn the_controller_serves_its_probes_and_metrics_on_its_admin_port() -> Result<()> {
    let objects = base()?;
    let readme = read(&repo().join("README.md"))?;
    let deployment = find(&objects, "Deployment", "holdfast-controller")?;
    let container = at(deployment, "spec.template.spec.containers.0").context("no container")?;
    let addr = strings(container.get("args"))
        .into_iter()
        .find_map(|a| a.strip_prefix("--admin-addr=").map(str::to_owned))
        .context("no --admin-addr")?;
    let controller_section = readme
        .split_once("### `holdfast-controller`")
        .map(|(_, rest)| rest)
        .context("no holdfast-controller section in README.md")?;
    ensure!(
        controller_section.contains("`--admin-addr`"),
        "--admin-addr is not documented for holdfast-controller in README.md"
    );
    let admin = items(container, "ports")
        .into_iter()
        .find(|p| text(p, "name") == "admin")
        .and_then(|p| at(p, "containerPort").and_then(Value::as_i64))
        .context("no container port named admin")?;
    assert_eq!(
        addr.rsplit(':').next(),
        Some(admin.to_string().as_str()),
        "--admin-addr vs port admin"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = at(container, &format!("{probe}.httpGet")).with_context(|| format!("no {probe}"))?;
        assert_eq!(text(get, "path"), path, "{probe}");
        assert_eq!(text(get, "port"), "admin", "{probe}");
    }
    let pod_labels = at(deployment, "spec.template.metadata.labels").context("no pod labels")?;
    let opened = of_kind(&objects, "NetworkPolicy").into_iter().any(|policy| {
        let selects = at(policy, "spec.podSelector.matchLabels")
            .and_then(Value::as_mapping)
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        selects
            && items(policy, "spec.ingress").iter().any(|rule| {
                !items(rule, "from").is_empty()
                    && items(rule, "ports").iter().any(|p| text(p, "port") == "admin")
            })
    });
    ensure!(
        opened,
        "no NetworkPolicy lets scrapers reach the controller's admin port"
    );
    Ok(())
}

/// The controller may delete exactly what `controller/src/deletable.rs` lists: the base grants
/// the always-on kinds, `components/fast-org-deletion` the opt-in ones (and sets their flag).
#[test]
fn the_controllers_delete_rules_are_the_fast_finalizers_table() -> Result<()> {
    ensure!(
        controller_deletes(&base()?) == deletable(false),
        "base: the controller's delete rules {:?} are not the table's {:?}",
        controller_deletes(&base()?),
        deletable(false)
    );
    let component = load_kustomization(&manifests().join("components/fast-org-deletion"))?;
    ensure!(
        controller_deletes(&component) == deletable(true),
        "components/fast-org-deletion: {:?} are not the table's opt-in kinds {:?}",
        controller_deletes(&component),
        deletable(true)
    );
    let kustomization = read(&manifests().join("components/fast-org-deletion/kustomization.yaml"))?;
    for flag in holdfast_controller::deletable::DELETABLE
        .iter()
        .filter_map(|d| d.opt_in)
    {
        ensure!(
            kustomization.contains(&format!("{flag}=true")),
            "components/fast-org-deletion does not set {flag}"
        );
    }
    Ok(())
}

/// Issue 15, item 6: the component issued a self-signed leaf with `rotationPolicy: Always`, so
/// the trust anchor in the caBundle changed on every renewal. The certificate the webhook
/// configurations inject from must come from a CA Issuer whose CA a self-signed bootstrap
/// Issuer signed.
#[test]
fn cert_manager_issues_the_leaf_from_a_ca_issuer_chain() -> Result<()> {
    let objects = load_kustomization(&manifests().join("components/cert-manager"))?;
    let issuer = |name: &str| -> Result<&Value> { find(&objects, "Issuer", name) };
    let injected = read(&manifests().join("components/cert-manager/kustomization.yaml"))?;
    let from = "cert-manager.io/inject-ca-from: holdfast-system/";
    let leaf_name = injected
        .lines()
        .find_map(|line| line.trim().strip_prefix(from))
        .context("the webhook configurations inject no CA")?;
    let leaf = find(&objects, "Certificate", leaf_name)?;
    ensure!(
        at(leaf, "spec.isCA") != Some(&Value::Bool(true)),
        "the leaf is a CA"
    );
    let ca_issuer = issuer(text(leaf, "spec.issuerRef.name"))?;
    let ca_secret = text(ca_issuer, "spec.ca.secretName");
    ensure!(!ca_secret.is_empty(), "the leaf's Issuer is not a CA Issuer");
    let ca = of_kind(&objects, "Certificate")
        .into_iter()
        .find(|c| text(c, "spec.secretName") == ca_secret)
        .context("no Certificate makes the CA Issuer's Secret")?;
    ensure!(
        at(ca, "spec.isCA") == Some(&Value::Bool(true)),
        "the CA Certificate is not a CA"
    );
    let bootstrap = issuer(text(ca, "spec.issuerRef.name"))?;
    ensure!(
        at(bootstrap, "spec.selfSigned").is_some(),
        "the CA is not issued by a self-signed bootstrap Issuer"
    );
    Ok(())
}

/// `components/restrict-egress` selects both Deployments' pods and allows what they call: DNS,
/// the API server and registries (HTTPS).
#[test]
fn the_egress_component_allows_dns_the_api_server_and_registries() -> Result<()> {
    let objects = load_kustomization(&manifests().join("components/restrict-egress"))?;
    let policy = find(&objects, "NetworkPolicy", "holdfast-egress")?;
    ensure!(
        strings(at(policy, "spec.policyTypes")) == ["Egress"],
        "not an egress policy"
    );
    let selector = at(policy, "spec.podSelector.matchLabels").context("no podSelector")?;
    for deployment in of_kind(&base()?, "Deployment") {
        let labels = at(deployment, "spec.template.metadata.labels");
        let selected = selector
            .as_mapping()
            .is_some_and(|m| m.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)));
        ensure!(selected, "{} is not selected", id(deployment));
    }
    let ports: BTreeSet<i64> = items(policy, "spec.egress")
        .iter()
        .flat_map(|rule| items(rule, "ports"))
        .filter_map(|p| at(p, "port").and_then(Value::as_i64))
        .collect();
    for port in [53, 443, 6443] {
        ensure!(ports.contains(&port), "egress to port {port} is not allowed");
    }
    Ok(())
}

/// Issue 31: the pinning policies' parameters decide, for every namespace, which digest a cached
/// tag is pinned to by the API server itself: only the controller's roles may write them, and
/// no role aggregates into the built-in ones a tenant is given.
#[test]
fn only_the_controller_may_write_the_digest_pins() -> Result<()> {
    let objects = base()?;
    let writes: Vec<RbacRow> = rbac_from_manifests(&objects)
        .into_iter()
        .filter(|(role, group, resources, _, verbs)| {
            !role.ends_with("holdfast-controller")
                && (group == "holdfast.dev" || group == "*")
                && (resources.contains("digestpins")
                    || resources.contains("clusterdigestpins")
                    || resources.contains("*"))
                && verbs
                    .iter()
                    .any(|v| !["get", "list", "watch"].contains(&v.as_str()))
        })
        .collect();
    ensure!(writes.is_empty(), "others may write the digest pins: {writes:?}");
    for role in of_kind(&objects, "ClusterRole") {
        let labels = at(role, "metadata.labels");
        let aggregated = labels.and_then(Value::as_mapping).is_some_and(|l| {
            l.keys()
                .any(|k| k.as_str().is_some_and(|k| k.contains("aggregate-to")))
        });
        ensure!(!aggregated, "{} aggregates into a built-in role", id(role));
    }
    Ok(())
}

/// Issue 15, items 1-2: the webhook's ServiceAccount could create and patch DigestCacheEntry
/// objects, so its token (or any pod reaching port 8443, through forged reviews) could plant
/// entries naming another namespace's Secret and grow etcd. It may only read them now.
#[test]
fn the_webhook_cannot_write_the_digest_cache() -> Result<()> {
    let writes: Vec<RbacRow> = rbac_from_manifests(&base()?)
        .into_iter()
        .filter(|(role, group, resources, _, verbs)| {
            role.ends_with("holdfast-webhook")
                && group == "holdfast.dev"
                && resources.contains("digestcacheentries")
                && verbs
                    .iter()
                    .any(|v| !["get", "list", "watch"].contains(&v.as_str()))
        })
        .collect();
    ensure!(
        writes.is_empty(),
        "the webhook may write digest cache entries: {writes:?}"
    );
    Ok(())
}

/// Issue 31: the webhook's something-to-pin skips an object whose annotation entries are in
/// place, reading each entry's reference with `holdfast_pins::PLAIN_REFERENCE_PATTERN` (whose
/// references pin as CEL expects: `holdfast-pins`,
/// `what_the_webhooks_condition_takes_for_in_place_is`). The condition holds that pattern, not
/// another.
#[test]
fn the_in_place_check_reads_references_with_the_plain_pattern() -> Result<()> {
    let component = holdfast_manifest_checks::tables::settings::match_conditions_component()?;
    let condition = component
        .iter()
        .flat_map(|c| items(c, "webhooks"))
        .filter(|w| text(w, "name") == "pin-fetch-refs.holdfast.dev")
        .flat_map(|w| items(w, "matchConditions"))
        .find(|c| text(c, "name") == "something-to-pin")
        .map(|c| text(c, "expression").to_owned())
        .context("no something-to-pin condition")?;
    let pattern = holdfast_pins::PLAIN_REFERENCE_PATTERN;
    ensure!(
        condition.contains(&format!("\"ref\":\"{pattern}\"$'")),
        "something-to-pin does not read references with PLAIN_REFERENCE_PATTERN"
    );
    Ok(())
}

/// Every webhook matchCondition parses in the oldest API server that calls holdfast's webhooks:
/// kapp-controller's aggregated API server, which admits Packages (k8s.io/apiserver v0.27,
/// cel-go 0.12), has no CEL optional syntax (`.?field`, `[?index]`, `orValue`). There a
/// condition that does not compile is an error, and failurePolicy Ignore skips the webhook:
/// every Package would go unpinned, silently.
#[test]
fn match_conditions_use_no_cel_optional_syntax() -> Result<()> {
    let component = holdfast_manifest_checks::tables::settings::match_conditions_component()?;
    let mut problems = Vec::new();
    for webhook in component.iter().flat_map(|c| items(c, "webhooks")) {
        for condition in items(webhook, "matchConditions") {
            let expression = text(condition, "expression");
            if [".?", "[?", "orValue(", "optional."]
                .iter()
                .any(|syntax| expression.contains(syntax))
            {
                problems.push(format!(
                    "{}: {} uses CEL optional syntax",
                    text(webhook, "name"),
                    text(condition, "name")
                ));
            }
        }
    }
    ensure!(problems.is_empty(), "{problems:#?}");
    Ok(())
}

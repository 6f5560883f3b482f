//! The Helm chart (charts/holdfast) renders exactly what kustomize renders of manifests/ for the
//! same settings — the chart's defaults are `manifests/overlays/recommended` without its
//! Namespace, in the release's namespace; every component of manifests/components/ is a value —
//! and every rendering of the default replicas keeps SECURITY.md's promises. No differences are allowed: `helm template` adds no
//! label or annotation (what `helm install` and kapp add to installed objects is listed in
//! `chart::HELM_ADDS` and `chart::KAPP_ADDS`, and checked by the e2e suites `chart` and
//! `package`).

use anyhow::{Context, Result, ensure};
use holdfast_manifest_checks::{
    chart::{Budget, Settings, differences, helm, helm_template, helm_template_for, helm_template_in},
    check_all,
    load::kubectl,
    report::assert_clean,
};
use serde_json::json;

fn same_as_kustomize(what: &str, settings: &Settings) -> Result<Vec<serde_json::Value>> {
    let kubectl = kubectl().context("kubectl is not on PATH")?;
    let rendered = settings.helm_template(&helm()?)?;
    let expected = settings.kustomize(&kubectl)?;
    ensure!(
        expected.len() > 15,
        "kustomize rendered only {} objects",
        expected.len()
    );
    assert_clean(
        &format!("helm template vs kustomize ({what})"),
        &differences(&expected, &rendered),
    );
    Ok(rendered)
}

fn keeps_the_promises(what: &str, rendered: &[serde_json::Value]) -> Result<()> {
    let objects: Vec<serde_yaml::Value> = rendered
        .iter()
        .map(serde_yaml::to_value)
        .collect::<Result<_, _>>()?;
    assert_clean(&format!("SECURITY.md promises ({what})"), &check_all(&objects));
    Ok(())
}

#[test]
fn the_charts_defaults_are_the_recommended_overlay() -> Result<()> {
    let rendered = same_as_kustomize("defaults", &Settings::recommended())?;
    keeps_the_promises("defaults", &rendered)?;
    // The defaults are the chart's own: no values at all render the same.
    let bare = helm_template(&helm()?, &json!({}))?;
    assert_clean("helm template without values", &differences(&rendered, &bare));
    Ok(())
}

#[test]
fn without_match_conditions_the_chart_is_the_base() -> Result<()> {
    same_as_kustomize("matchConditions=false", &Settings::default()).map(drop)
}

/// The CRDs are templates (upgraded by `helm upgrade`), kept when the release goes (crds.keep,
/// as the base annotates them), left out with crds.install=false; each the kustomize overlay of
/// the same choice.
#[test]
fn the_crd_is_a_template_kept_on_removal_or_left_out() -> Result<()> {
    let crds = |rendered: &[serde_json::Value]| -> Vec<serde_json::Value> {
        rendered
            .iter()
            .filter(|o| o["kind"] == "CustomResourceDefinition")
            .cloned()
            .collect()
    };
    let kept = crds(&same_as_kustomize("defaults", &Settings::recommended())?);
    let names: Vec<&str> = kept
        .iter()
        .filter_map(|crd| crd["metadata"]["name"].as_str())
        .collect();
    ensure!(
        names == holdfast_manifest_checks::HOLDFAST_CRDS,
        "CRDs rendered: {names:?}"
    );
    for (annotation, value) in [
        ("helm.sh/resource-policy", "keep"),
        ("kapp.k14s.io/delete-strategy", "orphan"),
    ] {
        for crd in &kept {
            ensure!(
                crd["metadata"]["annotations"][annotation] == value,
                "the CRD is not kept on removal: {}",
                crd["metadata"]
            );
        }
    }
    // Not from crds/, which Helm never upgrades.
    let chart = holdfast_manifest_checks::chart::chart();
    ensure!(
        !chart.join("crds").exists(),
        "{} holds crds/: Helm installs it once and never upgrades it",
        chart.display()
    );
    let not_kept = Settings {
        crds_not_kept: true,
        ..Settings::recommended()
    };
    let rendered = crds(&same_as_kustomize("crds.keep=false", &not_kept)?);
    ensure!(
        rendered.len() == holdfast_manifest_checks::HOLDFAST_CRDS.len()
            && rendered
                .iter()
                .all(|crd| crd["metadata"].get("annotations").is_none()),
        "crds.keep=false: {rendered:?}"
    );
    let without = Settings {
        without_crds: true,
        ..Settings::recommended()
    };
    let rendered = crds(&same_as_kustomize("crds.install=false", &without)?);
    ensure!(
        rendered.is_empty(),
        "crds.install=false rendered {} CRDs",
        rendered.len()
    );
    Ok(())
}

/// proxy.https alone: both containers get HTTPS_PROXY and the default NO_PROXY, no HTTP_PROXY;
/// without a proxy, neither gets any of them.
#[test]
fn a_proxy_is_the_environment_of_both_components() -> Result<()> {
    use holdfast_manifest_checks::chart::{DEFAULT_NO_PROXY, Proxy};
    let env_of = |rendered: &[serde_json::Value], name: &str| -> Vec<(String, String)> {
        rendered
            .iter()
            .filter(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
            .flat_map(|d| {
                d["spec"]["template"]["spec"]["containers"][0]["env"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
            .filter(|(n, _)| n.ends_with("_PROXY"))
            .collect()
    };
    let proxied = Settings {
        proxy: Some(Proxy {
            https: Some("http://proxy.corp.example:3128".into()),
            ..Proxy::default()
        }),
        ..Settings::recommended()
    };
    let rendered = same_as_kustomize("proxy.https", &proxied)?;
    let recommended = same_as_kustomize("defaults", &Settings::recommended())?;
    for name in ["holdfast-webhook", "holdfast-controller"] {
        let env = env_of(&rendered, name);
        ensure!(
            env == [
                (
                    "HTTPS_PROXY".to_string(),
                    "http://proxy.corp.example:3128".to_string()
                ),
                ("NO_PROXY".to_string(), DEFAULT_NO_PROXY.to_string()),
            ],
            "{name}: {env:?}"
        );
        ensure!(
            env_of(&recommended, name).is_empty(),
            "{name} has a proxy by default"
        );
    }
    // The schema's default is the one the chart renders.
    let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        holdfast_manifest_checks::chart::chart().join("values.schema.json"),
    )?)?;
    ensure!(schema["properties"]["proxy"]["properties"]["noProxy"]["default"] == DEFAULT_NO_PROXY);
    Ok(())
}

/// registryCA.secret: components/registry-ca with its volume from that Secret; both sources at
/// once are refused.
#[test]
fn the_registry_ca_can_come_from_a_secret() -> Result<()> {
    let settings = Settings {
        registry_ca: Some("corp-registry-ca".into()),
        registry_ca_secret: true,
        ..Settings::recommended()
    };
    let rendered = same_as_kustomize("registryCA.secret", &settings)?;
    for name in ["holdfast-webhook", "holdfast-controller"] {
        let deployment = rendered
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == name)
            .context(name)?;
        let volumes = deployment["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ensure!(
            volumes.contains(&json!({"name": "registry-ca", "secret": {"secretName": "corp-registry-ca"}})),
            "{name}: {volumes:?}"
        );
    }
    let both = json!({"registryCA": {"configMap": "a", "secret": "b"}});
    ensure!(
        helm_template(&helm()?, &both).is_err(),
        "registryCA with both a ConfigMap and a Secret rendered"
    );
    Ok(())
}

/// namespace.create renders the base's Namespace (with its Pod Security labels), in the
/// release's namespace.
#[test]
fn namespace_create_is_the_bases_namespace() -> Result<()> {
    let settings = Settings {
        create_namespace: true,
        ..Settings::recommended()
    };
    let rendered = same_as_kustomize("namespace.create", &settings)?;
    keeps_the_promises("namespace.create", &rendered)?;
    let namespace = rendered
        .iter()
        .find(|o| o["kind"] == "Namespace")
        .context("no Namespace")?;
    ensure!(namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted");
    Ok(())
}

/// `helm template -n some-ns`: every namespaced object is in some-ns, everything that names
/// holdfast's namespace (webhook clientConfigs and namespaceSelectors, binding subjects, the
/// fence's CEL, cert-manager's names) names some-ns, and nothing names holdfast-system.
#[test]
fn everything_goes_to_the_release_namespace() -> Result<()> {
    for create_namespace in [false, true] {
        let settings = Settings {
            namespace: Some("some-ns".into()),
            create_namespace,
            cert_manager: true,
            ..Settings::recommended()
        };
        let rendered = same_as_kustomize("helm template -n some-ns", &settings)?;
        let text = serde_json::to_string(&rendered)?;
        ensure!(
            !text.contains("holdfast-system"),
            "a rendering in some-ns names holdfast-system"
        );
        for object in &rendered {
            let kind = object["kind"].as_str().unwrap_or_default();
            let cluster_wide = [
                "Namespace",
                "CustomResourceDefinition",
                "ClusterRole",
                "ClusterRoleBinding",
                "MutatingWebhookConfiguration",
                "ValidatingWebhookConfiguration",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
                "MutatingAdmissionPolicy",
                "MutatingAdmissionPolicyBinding",
            ];
            if !cluster_wide.contains(&kind) {
                ensure!(
                    object["metadata"]["namespace"] == "some-ns",
                    "{kind} {} is in {}",
                    object["metadata"]["name"],
                    object["metadata"]["namespace"]
                );
            }
        }
        ensure!(
            rendered.iter().any(|o| o["kind"] == "Namespace") == create_namespace,
            "namespace.create={create_namespace} and the Namespace is {}rendered",
            if create_namespace { "not " } else { "" }
        );
    }
    Ok(())
}

/// One replica of each renders no PodDisruptionBudget that would block a drain; maxUnavailable
/// renders one that never does.
#[test]
fn a_budget_is_rendered_only_when_a_drain_can_satisfy_it() -> Result<()> {
    let one = Settings {
        webhook_replicas: Some(1),
        controller_replicas: Some(1),
        ..Settings::recommended()
    };
    let rendered = same_as_kustomize("replicas=1", &one)?;
    ensure!(
        !rendered.iter().any(|o| o["kind"] == "PodDisruptionBudget"),
        "one replica each and a PodDisruptionBudget"
    );
    let mut budgeted = one.clone();
    budgeted.webhook.budget = Some(Budget {
        max_unavailable: 1,
        ..Budget::default()
    });
    budgeted.controller.budget = Some(Budget {
        enabled: true,
        min_available: 2,
        max_unavailable: 0,
    });
    budgeted.controller_replicas = Some(3);
    let rendered = same_as_kustomize("replicas=1 with maxUnavailable", &budgeted)?;
    let budgets: Vec<_> = rendered
        .iter()
        .filter(|o| o["kind"] == "PodDisruptionBudget")
        .collect();
    ensure!(budgets.len() == 2, "{} budgets", budgets.len());
    // A budget nobody wants: none, with the default replicas.
    let mut off = Settings::recommended();
    off.webhook.budget = Some(Budget {
        enabled: false,
        ..Budget::default()
    });
    same_as_kustomize("podDisruptionBudget.enabled=false", &off).map(drop)
}

/// `pinningPolicy.enabled: auto` (the default) follows the API server: on Kubernetes 1.30 to 1.35,
/// which serve no MutatingAdmissionPolicy v1, the release is exactly that of `false`
/// (components/no-pinning-policy), so no install there fails on an unknown kind; on 1.36 or newer
/// the policy is rendered, also when the API list names group/versions only (the Carvel
/// package's helmTemplate step: `kubernetesVersion` and `kubernetesAPIs` from discovery).
#[test]
fn the_pinning_policy_follows_the_api_server() -> Result<()> {
    use holdfast_manifest_checks::chart::ApiServer;
    let helm = helm()?;
    let older = helm_template_for(
        &helm,
        &json!({}),
        ApiServer {
            version: "1.35.4",
            serves: &["admissionregistration.k8s.io/v1"],
        },
    )?;
    let off = helm_template(&helm, &json!({"pinningPolicy": {"enabled": false}}))?;
    let diff = differences(&off, &older);
    ensure!(diff.is_empty(), "auto on 1.35 differs from false: {diff:#?}");
    let policies = |objects: &[serde_json::Value]| {
        objects
            .iter()
            .filter(|o| o["kind"] == "MutatingAdmissionPolicy")
            .count()
    };
    ensure!(policies(&older) == 0, "a policy rendered for Kubernetes 1.35");
    let carvel = helm_template_for(
        &helm,
        &json!({}),
        ApiServer {
            version: "v1.36.2",
            serves: &["admissionregistration.k8s.io/v1"],
        },
    )?;
    ensure!(
        policies(&carvel) == 2,
        "auto on 1.36 with group/versions only rendered no pinning policy"
    );
    ensure!(
        policies(&helm_template(&helm, &json!({}))?) == 2,
        "auto on the tested API server rendered no pinning policy"
    );
    Ok(())
}

/// Every component of manifests/components/ at once, each as its chart value, with every other
/// value changed too, in a namespace the chart creates.
#[test]
fn every_component_is_a_value() -> Result<()> {
    let settings = Settings::all_components();
    let rendered = same_as_kustomize("every component", &settings)?;
    let components = holdfast_manifest_checks::load::subdirectories(
        &holdfast_manifest_checks::load::manifests().join("components"),
    )?;
    // Each component left a trace the chart had to render too.
    let text = serde_json::to_string(&rendered)?;
    for (component, trace) in [
        ("cert-manager", Some("cert-manager.io/inject-ca-from")),
        ("fast-org-deletion", Some("holdfast-controller-cfspaces")),
        ("match-conditions", Some("not-being-deleted")),
        ("no-secret-reads", Some("holdfast-mirror-secret")),
        ("no-pinning-policy", Some("--publish-pins=false")),
        ("policy-all-namespaces", None),
        ("policy-fail-closed", Some("\"failurePolicy\":\"Fail\"")),
        ("restrict-egress", Some("holdfast-egress")),
        ("restrict-webhook-port", Some("carvel-system")),
        ("monitoring", Some("HoldfastNoLeader")),
        ("registry-ca", Some("corp-registry-ca")),
    ] {
        ensure!(
            components.contains(&component.to_string()),
            "no component {component}"
        );
        if let Some(trace) = trace {
            ensure!(text.contains(trace), "{component}: {trace} not rendered");
        }
    }
    ensure!(
        components.len() == 11,
        "manifests/components/ has {components:?}: give a new one its chart value and list it here"
    );
    // SECURITY.md's promises name holdfast-system: checked with it named back.
    let back: Vec<_> = rendered
        .into_iter()
        .map(|o| holdfast_manifest_checks::chart::renamed(o, settings.namespace(), "holdfast-system"))
        .collect();
    keeps_the_promises("every component", &back)
}

/// carvel.enabled=false and korifi.enabled=false: the other half only, with every value and
/// component that half has; both off is refused.
#[test]
fn each_half_alone_is_the_kustomize_overlay_without_the_other() -> Result<()> {
    for carvel in [true, false] {
        let what = if carvel {
            "korifi.enabled=false"
        } else {
            "carvel.enabled=false"
        };
        let settings = Settings::one_half(carvel);
        let rendered = same_as_kustomize(what, &settings)?;
        // What SECURITY.md promises of any webhook and container still holds (with holdfast's
        // namespace named as SECURITY.md names it); check_served does not: the code serves the
        // other half's routes, which nothing calls.
        let objects: Vec<serde_yaml::Value> = rendered
            .iter()
            .map(|o| {
                serde_yaml::to_value(holdfast_manifest_checks::chart::renamed(
                    o.clone(),
                    settings.namespace(),
                    "holdfast-system",
                ))
            })
            .collect::<Result<_, _>>()?;
        for check in [
            holdfast_manifest_checks::checks::check_no_wildcards,
            holdfast_manifest_checks::checks::check_webhooks,
            holdfast_manifest_checks::checks::check_containers,
        ] {
            assert_clean(what, &check(&objects));
        }
        let text = serde_json::to_string(&rendered)?;
        let (gone, kept) = if carvel {
            (
                ["stamp-owners.holdfast.dev", "korifi.cloudfoundry.org"],
                "pin-fetch-refs.holdfast.dev",
            )
        } else {
            (
                ["pin-fetch-refs.holdfast.dev", "kappctrl.k14s.io\",\"resources"],
                "stamp-owners.holdfast.dev",
            )
        };
        for gone in gone {
            ensure!(!text.contains(gone), "{what}: {gone} is still rendered");
        }
        ensure!(text.contains(kept), "{what}: {kept} is not rendered");
    }
    let both = serde_json::json!({"carvel": {"enabled": false}, "korifi": {"enabled": false}});
    ensure!(
        helm_template(&helm()?, &both).is_err(),
        "both halves off rendered"
    );
    Ok(())
}

/// `global` is accepted (Helm gives it to every subchart), whatever it holds, and changes nothing.
#[test]
fn global_values_are_accepted() -> Result<()> {
    let defaults = helm_template(&helm()?, &json!({}))?;
    let global = helm_template(
        &helm()?,
        &json!({"global": {"x": 1, "imageRegistry": "r.example"}}),
    )?;
    assert_clean("global values", &differences(&defaults, &global));
    let elsewhere = helm_template_in(&helm()?, "some-ns", &json!({"global": {"x": 1}}))?;
    ensure!(elsewhere.len() == defaults.len());
    Ok(())
}

#[test]
fn cert_manager_mode_is_the_cert_manager_component() -> Result<()> {
    let settings = Settings {
        cert_manager: true,
        ..Settings::recommended()
    };
    let rendered = same_as_kustomize("certMode=cert-manager", &settings)?;
    keeps_the_promises("certMode=cert-manager", &rendered)
}

#[test]
fn every_value_changes_what_the_same_kustomize_overlay_changes() -> Result<()> {
    let settings = Settings::everything_changed();
    let rendered = same_as_kustomize("every value changed", &settings)?;
    keeps_the_promises("every value changed", &rendered)?;
    // And the values did change something: the overlay is not the recommended one.
    let recommended = helm_template(&helm()?, &Settings::recommended().values())?;
    let changed = differences(&recommended, &rendered);
    for expected in [
        "holdfast-webhook: /spec/replicas",
        "holdfast-controller: /spec/template/spec/containers/0/args",
        "/spec/template/spec/imagePullSecrets",
        "namespaceSelector/matchExpressions",
        "ConfigMap holdfast-system/holdfast-policy-",
    ] {
        ensure!(
            changed.iter().any(|d| d.contains(expected)),
            "no change at {expected}: {changed:#?}"
        );
    }
    Ok(())
}

/// helm refuses values the schema does not describe (the schema is also the Carvel Package's
/// valuesSchema): a misspelt key fails instead of being ignored.
#[test]
fn the_values_schema_refuses_unknown_values() -> Result<()> {
    for values in [
        json!({"replica": 3}),
        json!({"webhook": {"replica": 3}}),
        json!({"certMode": "vault"}),
        json!({"image": {"digest": "latest"}}),
        json!({"namespace": "holdfast-system"}),
        json!({"webhook": {"timeoutSeconds": 30}}),
        json!({"controller": {"podDisruptionBudget": {"minAvailable": "50%"}}}),
        json!({"korifi": {"deleteOrgSpace": true}}),
    ] {
        ensure!(
            helm_template(&helm()?, &values).is_err(),
            "helm template accepted {values}"
        );
    }
    Ok(())
}

/// `helm lint` finds nothing wrong with the chart (errors fail it; the chart has no icon, which
/// helm only notes as INFO).
#[test]
fn helm_lint_passes() -> Result<()> {
    let out = std::process::Command::new(helm()?)
        .arg("lint")
        .arg(holdfast_manifest_checks::chart::chart())
        .arg("--strict")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.contains("0 chart(s) failed"),
        "helm lint --strict: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The chart is released with holdfast: its version, appVersion and default image tag are the
/// workspace's version (the tag the base's `images:` names too).
#[test]
fn the_chart_is_versioned_with_holdfast() -> Result<()> {
    let dir = holdfast_manifest_checks::chart::chart();
    let chart: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(dir.join("Chart.yaml"))?)?;
    let values: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(dir.join("values.yaml"))?)?;
    let version = env!("CARGO_PKG_VERSION");
    for (what, found) in [
        ("Chart.yaml version", &chart["version"]),
        ("Chart.yaml appVersion", &chart["appVersion"]),
        ("values.yaml image.tag", &values["image"]["tag"]),
    ] {
        ensure!(
            found.as_str() == Some(version),
            "{what} is {found:?}, holdfast is {version}"
        );
    }
    Ok(())
}

/// As a subchart (an umbrella chart's dependency, which Helm hands `global`), holdfast renders,
/// with its values under its name.
#[test]
fn the_chart_renders_as_a_subchart() -> Result<()> {
    let helm = helm()?;
    let scratch = tempfile::tempdir()?;
    let umbrella = scratch.path();
    std::fs::write(
        umbrella.join("Chart.yaml"),
        format!(
            "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n- name: holdfast\n  version: {}\n  repository: file://{}\n",
            env!("CARGO_PKG_VERSION"),
            holdfast_manifest_checks::chart::chart().canonicalize()?.display()
        ),
    )?;
    std::fs::write(
        umbrella.join("values.yaml"),
        "global:\n  imageRegistry: registry.example\nholdfast:\n  webhook:\n    replicas: 3\n",
    )?;
    let run = |args: &[&str]| -> Result<String> {
        let out = std::process::Command::new(&helm)
            .args(args)
            .arg(umbrella)
            .output()?;
        ensure!(
            out.status.success(),
            "helm {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    };
    run(&["dependency", "build"])?;
    let rendered =
        holdfast_manifest_checks::chart::parse(&run(&["template", "platform", "-n", "platform"])?)?;
    let webhook = rendered
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "holdfast-webhook")
        .context("no webhook Deployment")?;
    ensure!(webhook["spec"]["replicas"] == 3 && webhook["metadata"]["namespace"] == "platform");
    Ok(())
}

/// The `pre-delete` hook that makes `helm uninstall` delete the webhook configurations before the
/// Service and the pods: its ClusterRole may delete only holdfast's two configurations, its Job
/// runs the webhook's one-shot mode under the same restrictions as the webhook, every object is a
/// hook deleted once it succeeds, and with the value off there is no hook at all.
#[test]
fn the_uninstall_hook_deletes_only_holdfasts_webhook_configurations() -> Result<()> {
    let hooks = holdfast_manifest_checks::chart::helm_hooks(&helm()?, &json!({}))?;
    let kinds: Vec<&str> = hooks.iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"]
    );
    for hook in &hooks {
        let annotations = &hook["metadata"]["annotations"];
        assert_eq!(annotations["helm.sh/hook"], "pre-delete", "{}", hook["kind"]);
        assert_eq!(
            annotations["helm.sh/hook-delete-policy"], "before-hook-creation,hook-succeeded",
            "{}",
            hook["kind"]
        );
    }
    let role = &hooks[1];
    assert_eq!(
        role["rules"],
        json!([{
            "apiGroups": ["admissionregistration.k8s.io"],
            "resourceNames": ["holdfast"],
            "resources": ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
            "verbs": ["delete"],
        }])
    );
    let binding = &hooks[2];
    assert_eq!(binding["subjects"][0]["name"], "holdfast-uninstall");
    assert_eq!(binding["roleRef"]["name"], "holdfast-uninstall");
    let pod = &hooks[3]["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "holdfast-uninstall");
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    let container = &pod["containers"][0];
    assert_eq!(container["args"][0], "--remove-webhook-configurations");
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    // The webhook's placement applies to the hook's pod.
    let placed = holdfast_manifest_checks::chart::helm_hooks(
        &helm()?,
        &json!({"webhook": {"nodeSelector": {"pool": "system"}, "tolerations": [{"key": "k", "operator": "Exists"}]}}),
    )?;
    let placed = &placed[3]["spec"]["template"]["spec"];
    assert_eq!(placed["nodeSelector"], json!({"pool": "system"}));
    assert_eq!(placed["tolerations"][0]["key"], "k");
    let off = holdfast_manifest_checks::chart::helm_hooks(
        &helm()?,
        &json!({"uninstall": {"removeWebhooksFirst": false}}),
    )?;
    assert!(off.is_empty(), "hooks rendered with the value off: {off:?}");
    Ok(())
}

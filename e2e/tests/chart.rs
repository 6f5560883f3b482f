//! The Helm chart on the control plane: `helm install` of the chart `make package` pushed to the
//! registry (an OCI artefact, whose default image is the release's by digest) creates exactly the objects `kubectl kustomize` renders of
//! manifests/ for the same settings — differing only by what `chart::HELM_ADDS` lists — with the
//! webhook configurations calling the installed Service; `helm upgrade` to other settings
//! changes what the kustomize overlay of those changes and keeps what holdfast itself wrote: its
//! TLS Secret's data, the caBundle it injected, and the digest cache entries. The CRD is the
//! release's: adopted from the control plane with `--take-ownership` (refused without), upgraded
//! by `helm upgrade` to the next chart version (its new field is stored, not pruned), and kept,
//! with every entry's spec and status, by `crds.install=false` and by `helm uninstall`. The
//! release goes where users put it, `helm install -n NAMESPACE --create-namespace` (a namespace
//! the chart does not render), everything namespaced in it, and `helm uninstall` leaves the
//! namespace.
//! (holdfast's pods run on kwok's nodes, without containers: the objects are what is checked.)

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, dist, e2e_main,
    upgrade::{self, CRD, KeptEntry},
};
use holdfast_manifest_checks::{
    chart::{self, HELM_ADDS, Settings, differences},
    load::kubectl,
};
use serde_json::{Value, json};

e2e_main!(helm_install_is_the_kustomize_rendering_and_upgrade_keeps_what_holdfast_wrote);

/// Not the kustomize base's namespace: the chart puts everything in the release's.
const NAMESPACE: &str = "platform-holdfast";

fn helm(env: &Env, args: &[&str], values: Option<&Value>) -> Result<String> {
    let scratch = tempfile::tempdir()?;
    let mut command = std::process::Command::new(chart::helm()?);
    command.env("KUBECONFIG", env.kubeconfig()).args(args);
    if let Some(values) = values {
        let file = scratch.path().join("values.json");
        std::fs::write(&file, serde_json::to_vec(values)?)?;
        command.arg("--values").arg(file);
    }
    let out = command.output().context("running helm")?;
    ensure!(
        out.status.success(),
        "helm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Installed objects vs the kustomize rendering of `settings`; returns the installed ones.
fn check_installed(env: &Env, settings: &Settings, release_manifest: &str) -> Result<Vec<Value>> {
    let expected = settings.kustomize(&kubectl().context("kubectl is not on PATH")?)?;
    // The CRD too: a template of the release, not crds/ (which Helm leaves out of the manifest).
    let released = chart::parse(release_manifest)?;
    let drift = differences(&expected, &released);
    ensure!(
        drift.is_empty(),
        "the release's manifest is not the kustomize rendering:\n{}",
        drift.join("\n")
    );
    let drift = dist::installed_differences(env, &expected, HELM_ADDS)?;
    ensure!(
        drift.is_empty(),
        "installed objects differ from the rendering:\n{}",
        drift.join("\n")
    );
    let installed = dist::installed(env, &expected)?;
    let webhooks = dist::webhooks_call_the_service(&installed)?;
    ensure!(webhooks == 5, "{webhooks} webhooks checked, the chart has 5");
    Ok(installed)
}

async fn helm_install_is_the_kustomize_rendering_and_upgrade_keeps_what_holdfast_wrote(
    env: Arc<Env>,
) -> Result<()> {
    let packaged = dist::package(&env)?;
    let (chart_repository, _) = packaged.chart.split_once('@').context("chart without digest")?;
    let chart = format!("oci://{chart_repository}");
    let version = env!("CARGO_PKG_VERSION");
    let settings = Settings {
        namespace: Some(NAMESPACE.into()),
        image: Some((packaged.image.repository.clone(), packaged.image.digest.clone())),
        insecure_registries: vec![env.registry().to_string()],
        ..Settings::recommended()
    };
    // The released chart, into the release's namespace.
    let released = [
        chart.as_str(),
        "--version",
        version,
        "--plain-http",
        "-n",
        NAMESPACE,
    ];
    // `helm install` or `helm upgrade` of the chart with these settings, checked.
    let release = |verb: &str, settings: &Settings| -> Result<Vec<Value>> {
        let mut args = vec![verb, "holdfast"];
        args.extend(released);
        if verb == "install" {
            // The control plane created holdfast's CRD (as kustomize or `kubectl apply -f
            // manifests/crds` would): the release adopts it, as README says.
            args.extend(["--create-namespace", "--take-ownership"]);
        }
        helm(&env, &args, Some(&user_values(settings)?))?;
        let manifest = helm(&env, &["get", "manifest", "holdfast", "-n", NAMESPACE], None)?;
        let installed = check_installed(&env, settings, &manifest)?;
        for object in &installed {
            if let Some(ns) = object["metadata"]["namespace"].as_str() {
                ensure!(
                    ns == NAMESPACE,
                    "{} is in {ns}, not the release's namespace {NAMESPACE}",
                    chart::object_id(object)
                );
            }
        }
        Ok(installed)
    };
    // Without --take-ownership Helm refuses a CRD it did not create (the control plane created
    // all of holdfast's), naming it (README).
    let crds = [CRD, "clusterdigestpins.holdfast.dev", "digestpins.holdfast.dev"];
    let mut install = vec!["install", "holdfast"];
    install.extend(released);
    install.push("--create-namespace");
    let refused = helm(&env, &install, None)
        .err()
        .context("helm install over a CRD Helm did not create succeeded")?;
    ensure!(
        crds.iter().any(|crd| format!("{refused:#}").contains(crd)),
        "helm install refused, but not for one of holdfast's CRDs: {refused:#}"
    );
    release("install", &settings)?;
    for name in crds {
        let crd = env.kubectl_get("crd", name, "default")?;
        ensure!(
            crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == "holdfast",
            "the release did not adopt the CRD {name}: {}",
            crd["metadata"]
        );
    }

    // What the webhook writes when it runs: its certificates into the Secret, the caBundle into
    // the configurations; and a digest cache entry the controller would have written.
    let pem = |what: &str| format!("-----BEGIN {what}-----\nAAAA\n-----END {what}-----\n");
    let tls = json!({"stringData": {"ca.crt": pem("CERTIFICATE"), "ca.key": pem("PRIVATE KEY"), "tls.crt": pem("CERTIFICATE"), "tls.key": pem("PRIVATE KEY"), "ca-bundle.crt": pem("CERTIFICATE")}});
    let kubectl_ok = |args: &[&str]| holdfast_e2e::accounts::kubectl_ok(&env, args);
    kubectl_ok(&[
        "patch",
        "secret",
        "holdfast-webhook-tls",
        "-n",
        NAMESPACE,
        "--type=merge",
        "-p",
        &tls.to_string(),
    ])?;
    let bundle = "Y2EtYnVuZGxl";
    for kind in ["mutatingwebhookconfiguration", "validatingwebhookconfiguration"] {
        let configuration: Value =
            serde_json::from_str(&kubectl_ok(&["get", kind, "holdfast", "-o", "json"])?)?;
        let count = configuration["webhooks"].as_array().map_or(0, Vec::len);
        let ops: Vec<Value> = (0..count)
            .map(|i| json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}))
            .collect();
        kubectl_ok(&[
            "patch",
            kind,
            "holdfast",
            "--type=json",
            "-p",
            &Value::from(ops).to_string(),
        ])?;
    }
    let kept = KeptEntry::write(&env, NAMESPACE)?;
    let secret_before = env.kubectl_get("secret", "holdfast-webhook-tls", NAMESPACE)?;

    // Other settings: one webhook replica, a policy in audit mode allowing one registry.
    let upgraded = Settings {
        webhook_replicas: Some(1),
        policy: Some(chart::Policy {
            allowed_registries: vec![env.registry().to_string()],
            require_digests_label: "holdfast.dev/require-digests".into(),
            mode: "audit".into(),
        }),
        ..settings.clone()
    };
    let installed = release("upgrade", &upgraded)?;

    let secret_after = env.kubectl_get("secret", "holdfast-webhook-tls", NAMESPACE)?;
    ensure!(
        secret_after["data"] == secret_before["data"] && secret_before["data"]["tls.key"].is_string(),
        "helm upgrade changed the TLS Secret's data: {} -> {}",
        secret_before["data"],
        secret_after["data"]
    );
    for configuration in installed.iter().filter(|o| {
        o["kind"]
            .as_str()
            .is_some_and(|k| k.ends_with("WebhookConfiguration"))
    }) {
        for webhook in configuration["webhooks"].as_array().into_iter().flatten() {
            ensure!(
                webhook["clientConfig"]["caBundle"] == bundle,
                "helm upgrade dropped the injected caBundle of {}",
                webhook["name"]
            );
        }
    }
    let entry_kept = |when: &str| kept.check(&env, when);
    entry_kept("helm upgrade")?;
    // The old policy ConfigMap went with the old release revision.
    let configmaps: Value = serde_json::from_str(&kubectl_ok(&[
        "get",
        "configmaps",
        "-n",
        NAMESPACE,
        "-o",
        "json",
    ])?)?;
    let policies: Vec<&str> = configmaps["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["metadata"]["name"].as_str())
        .filter(|n| n.starts_with("holdfast-policy-"))
        .collect();
    ensure!(
        policies.len() == 1,
        "policy ConfigMaps after the upgrade: {policies:?}"
    );

    // The next chart version, whose CRD has a field this one's has not: `helm upgrade` upgrades
    // the CRD (from crds/ it would not, and the API server would prune the field), keeping every
    // entry and its fields.
    let next = next_version(&env, &chart, version)?;
    let next_chart = next.path().join("holdfast").to_string_lossy().into_owned();
    let upgrade_to_next = |values: &Value| {
        helm(
            &env,
            &["upgrade", "holdfast", &next_chart, "-n", NAMESPACE],
            Some(values),
        )
    };
    let mut values = user_values(&upgraded)?;
    upgrade_to_next(&values)?;
    entry_kept("helm upgrade to the next chart version")?;
    upgrade::new_field_is_stored(&env, NAMESPACE)?;

    // crds.install=false: Helm no longer renders the CRD, and keeps it (crds.keep).
    values["crds"] = json!({"install": false});
    upgrade_to_next(&values)?;
    entry_kept("helm upgrade with crds.install=false")?;

    // The namespace is not the release's: helm uninstall leaves it, and the CRD with every entry.
    helm(&env, &["uninstall", "holdfast", "-n", NAMESPACE, "--wait"], None)?;
    entry_kept("helm uninstall")?;
    let namespace = env.kubectl_get("namespace", NAMESPACE, "default")?;
    ensure!(
        namespace["status"]["phase"] == "Active",
        "helm uninstall left the namespace {NAMESPACE} {}",
        namespace["status"]
    );
    Ok(())
}

/// What a user sets: `settings`' values without the image, which is the released chart's default.
fn user_values(settings: &Settings) -> Result<Value> {
    let mut values = settings.values();
    values.as_object_mut().context("values")?.remove("image");
    Ok(values)
}

/// The released chart pulled and made the next release's ([`upgrade::make_next_chart`]: its
/// version `<version>-next`, its CRD with a new field).
fn next_version(env: &Env, chart: &str, version: &str) -> Result<tempfile::TempDir> {
    let dir = tempfile::tempdir()?;
    let out = dir.path().to_string_lossy().into_owned();
    helm(
        env,
        &[
            "pull",
            chart,
            "--version",
            version,
            "--plain-http",
            "--untar",
            "--untardir",
            &out,
        ],
        None,
    )?;
    upgrade::make_next_chart(&dir.path().join("holdfast"), version, &format!("{version}-next"))?;
    Ok(dir)
}

//! The Carvel package with the real kapp-controller: the release `make package` pushed, copied
//! with `imgpkg copy` to another repository (a private registry); a PackageRepository naming the
//! copy's repository bundle (by tag, as users write it) is stored pinned by a running holdfast and
//! reconciles; its Package fetches the copied package bundle by digest; a PackageInstall
//! of holdfast with a user's values reconciles and creates exactly the objects `kubectl
//! kustomize` renders of manifests/ for the same settings — differing only by what
//! `chart::PACKAGE_ADDS` lists (kapp's and kbld's labels and annotations) — with the webhook
//! configurations calling the installed Service and the Deployments running the copied image;
//! deleting the PackageInstall deletes the webhook configurations before anything an admission
//! goes through, and keeps the digest cache's CRD.
//! (holdfast's pods run on kwok's nodes, without
//! containers: the objects are what is checked.)

use std::{collections::BTreeSet, sync::Arc};

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, dist, e2e_main,
    objects::{api_for, create_all},
    peers::kapp_controller,
    webhook::{LocalWebhook, Registration},
};
use holdfast_manifest_checks::{
    chart::{PACKAGE_ADDS, Settings, object_id},
    load::kubectl,
};
use k8s_openapi::jiff::Timestamp;

e2e_main!(a_package_install_of_holdfast_is_the_kustomize_rendering);

const INSTALLER: &str = "holdfast-installer";

async fn a_package_install_of_holdfast_is_the_kustomize_rendering(env: Arc<Env>) -> Result<()> {
    env.kapp_controller().await?;
    let packaged = dist::package(&env)?;
    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let ns = webhook.namespace("packages").await?;
    let client = env.client().await?;

    // The release copied into a "private registry" (another repository) the way README says:
    // imgpkg copies the repository bundle, the package bundle and the image together, and what
    // gets installed must name the copies only.
    let private = format!("{}/private/holdfast", env.registry());
    let copy = std::process::Command::new(holdfast_e2e::tools::peer_bin("imgpkg", "imgpkg")?)
        .args([
            "copy",
            "-b",
            &packaged.repository_tag,
            "--to-repo",
            &private,
            "--registry-insecure",
        ])
        .output()?;
    ensure!(
        copy.status.success(),
        "imgpkg copy: {}",
        String::from_utf8_lossy(&copy.stderr)
    );
    let relocated = |reference: &str| -> Result<String> {
        let (_, digest) = reference
            .split_once('@')
            .context("a release reference without digest")?;
        Ok(format!("{private}@{digest}"))
    };
    let repository_tag = format!("{private}:{}", env!("CARGO_PKG_VERSION"));

    let repository = format!(
        "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageRepository\nmetadata: {{name: holdfast}}\nspec:\n  fetch: {{imgpkgBundle: {{image: {repository_tag}}}}}\n"
    );
    let created = create_all(&client, &ns, &repository).await?;
    let stored = &created[0];
    ensure!(
        stored.data["spec"]["fetch"]["imgpkgBundle"]["image"] == relocated(&packaged.repository)?.as_str(),
        "the PackageRepository was stored as {}, not pinned to the copy of {}",
        stored.data["spec"]["fetch"]["imgpkgBundle"]["image"],
        packaged.repository
    );
    ensure!(
        stored
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("holdfast.dev/original-refs")),
        "the PackageRepository was not pinned by holdfast"
    );
    let repositories = api_for(&client, stored, Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &repositories, "holdfast").await?;
    let version = env!("CARGO_PKG_VERSION");
    let package = env.kubectl_get(
        "packages.data.packaging.carvel.dev",
        &format!("holdfast.holdfast.dev.{version}"),
        &ns,
    )?;
    ensure!(
        package["spec"]["template"]["spec"]["fetch"][0]["imgpkgBundle"]["image"]
            == relocated(&packaged.bundle)?.as_str(),
        "the Package fetches {}, not the copy of the bundle by digest {}",
        package["spec"]["template"]["spec"]["fetch"][0],
        packaged.bundle
    );
    for key in [
        "global",
        "carvel",
        "korifi",
        "secrets",
        "networkPolicy",
        "insecureRegistries",
        "webhook",
        "policy",
        "mirror",
        "certMode",
        "namespaceSelector",
    ] {
        ensure!(
            package["spec"]["valuesSchema"]["openAPIv3"]["properties"][key].is_object(),
            "the Package's valuesSchema does not describe {key}"
        );
    }
    env.kubectl_get(
        "packagemetadatas.data.packaging.carvel.dev",
        "holdfast.holdfast.dev",
        &ns,
    )?;

    // What a user sets: their registry over plain HTTP, one webhook replica, a stricter policy.
    let settings = Settings {
        // The package installs into holdfast-system and creates it.
        create_namespace: true,
        // The copy of the image, by the digest the release's ImagesLock names.
        image: Some((private.clone(), packaged.image.digest.clone())),
        insecure_registries: vec![env.registry().to_string()],
        webhook_replicas: Some(1),
        policy: Some(holdfast_manifest_checks::chart::Policy {
            allowed_registries: vec![env.registry().to_string()],
            require_digests_label: "holdfast.dev/require-digests".into(),
            mode: "enforce".into(),
        }),
        ..Settings::recommended()
    };
    let mut values = settings.values();
    // The image comes from the package (its ImagesLock), not from the user.
    values.as_object_mut().context("values")?.remove("image");
    let install = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {INSTALLER}}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: holdfast-values}}\nstringData:\n  values.yaml: '{values}'\n---\napiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageInstall\nmetadata: {{name: holdfast}}\nspec:\n  serviceAccountName: {INSTALLER}\n  packageRef: {{refName: holdfast.holdfast.dev, versionSelection: {{constraints: {version}}}}}\n  values: [{{secretRef: {{name: holdfast-values}}}}]\n"
    );
    // holdfast installs cluster-wide objects (CRD, webhook configurations, ClusterRoles).
    env.kubectl_apply(
        &ns,
        &format!("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {ns}-{INSTALLER}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\nsubjects: [{{kind: ServiceAccount, name: {INSTALLER}, namespace: {ns}}}]\n"),
    )?;
    let created = create_all(&client, &ns, &install).await?;
    let installs = api_for(&client, &created[2], Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &installs, "holdfast").await?;

    let expected = settings.kustomize(&kubectl().context("kubectl is not on PATH")?)?;
    let drift = dist::installed_differences(&env, &expected, PACKAGE_ADDS)?;
    ensure!(
        drift.is_empty(),
        "installed objects differ from the rendering:\n{}",
        drift.join("\n")
    );
    let installed = dist::installed(&env, &expected)?;
    let webhooks = dist::webhooks_call_the_service(&installed)?;
    ensure!(webhooks == 5, "{webhooks} webhooks checked, the chart has 5");

    // Exactly those objects: what kapp deployed for the PackageInstall's App (the objects
    // carrying the app label kapp-controller reports).
    let app = env.kubectl_get("apps.kappctrl.k14s.io", "holdfast", &ns)?;
    let label = app["status"]["deploy"]["kapp"]["associatedResources"]["label"]
        .as_str()
        .context("the App reports no kapp app label")?;
    let kapp = holdfast_e2e::tools::peer_bin("kapp", "kapp")?;
    let out = std::process::Command::new(kapp)
        .env("KUBECONFIG", env.kubeconfig())
        .args([
            "inspect",
            "-a",
            &format!("label:{label}"),
            "--json",
            "--tty=false",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "kapp inspect: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let deployed: BTreeSet<String> = inspected["Tables"][0]["Rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| row["owner"] == "kapp")
        .map(|row| {
            let ns = row["namespace"]
                .as_str()
                .filter(|n| !n.is_empty() && *n != "(cluster)");
            let (kind, name) = (
                row["kind"].as_str().unwrap_or_default(),
                row["name"].as_str().unwrap_or_default(),
            );
            match ns {
                Some(ns) => format!("{kind} {ns}/{name}"),
                None => format!("{kind} {name}"),
            }
        })
        .collect();
    let rendered: BTreeSet<String> = expected.iter().map(object_id).collect();
    ensure!(
        deployed == rendered,
        "kapp deployed other objects than rendered:\nonly deployed: {:?}\nonly rendered: {:?}",
        deployed.difference(&rendered).collect::<Vec<_>>(),
        rendered.difference(&deployed).collect::<Vec<_>>()
    );

    // Removal: the PackageInstall deleted, kapp deletes both webhook configurations before
    // anything an admission goes through (their change group and rules; the audit log's
    // deletes), and keeps the CRD (its delete strategy orphan).
    let removed_at = Timestamp::now();
    holdfast_e2e::accounts::kubectl_ok(
        &env,
        &[
            "delete",
            "packageinstall",
            "holdfast",
            "-n",
            &ns,
            "--wait",
            "--timeout=180s",
        ],
    )?;
    let deletes: Vec<_> = env
        .audit_log()?
        .into_iter()
        .filter(|e| e.verb == "delete" && e.succeeded() && e.request_received_timestamp > removed_at)
        .collect();
    let configurations: Vec<_> = deletes
        .iter()
        .filter(|e| {
            e.object_ref.api_group == "admissionregistration.k8s.io" && e.object_ref.name == "holdfast"
        })
        .collect();
    ensure!(
        configurations.len() == 2,
        "deletes of the webhook configurations: {:?}",
        configurations.iter().map(|e| e.describe()).collect::<Vec<_>>()
    );
    let configurations_gone = configurations
        .iter()
        .map(|e| e.stage_timestamp)
        .max()
        .context("no configuration delete")?;
    for (resource, namespace, name) in [
        ("deployments", "holdfast-system", "holdfast-webhook"),
        ("services", "holdfast-system", "holdfast-webhook"),
        ("networkpolicies", "holdfast-system", "holdfast-webhook"),
        ("namespaces", "", "holdfast-system"),
    ] {
        let delete = deletes
            .iter()
            .find(|e| {
                // A namespace's own requests name it as their namespace too.
                e.object_ref.resource == resource
                    && e.object_ref.name == name
                    && (e.object_ref.namespace == namespace || resource == "namespaces")
            })
            .with_context(|| format!("kapp did not delete {resource} {namespace}/{name}"))?;
        ensure!(
            delete.request_received_timestamp >= configurations_gone,
            "kapp deleted {resource} {namespace}/{name} before the webhook configurations were gone: {} vs {:?}",
            delete.describe(),
            configurations.iter().map(|e| e.describe()).collect::<Vec<_>>()
        );
    }
    env.kubectl_get("crd", "digestcacheentries.holdfast.dev", "default")
        .context("kapp deleted the CRD (the digest cache) with the package")?;
    webhook.stop().await
}

//! Smoke tests of the harness itself: the control plane, its controllers, the peers' upstream CRDs
//! (and kapp-controller's packaging API) and the registry behave like a real cluster's, so the
//! suites built on them test something real.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, e2e_main, images,
    objects::{api_for, create_all, parse_documents},
    wait,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, PostParams, PropagationPolicy},
};
use serde_json::json;

// Serial, the namespace deletion first: once kapp-controller runs (the examples test starts it),
// its aggregated packaging API is part of discovery, and while kube-apiserver reports that group
// stale (it was, now and then, for more than the 60 s wait, after the APIService was Available and
// its discovery fresh) the namespace controller deletes nothing in any namespace
// (NamespaceDeletionDiscoveryFailure). This test is about the control plane's own deletion.
e2e_main!(serial:
    namespace_deletion_completes_with_custom_resources,
    crds_accept_the_examples,
    crds_reject_schema_violations,
    garbage_collector_deletes_dependents_in_foreground,
    registry_answers_pushed_and_moved_tags,
);

fn example(env: &Env, file: &str) -> Result<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.replace("REGISTRY", env.registry()))
}

async fn crds_accept_the_examples(env: Arc<Env>) -> Result<()> {
    // Packages are served by kapp-controller's aggregated API, not by a CRD.
    env.kapp_controller().await?;
    let client = env.client().await?;
    let ns = env.namespace("examples").await?;
    let mut kinds = Vec::new();
    let mut workload_uid = String::new();
    for file in [
        "app-image.yaml",
        "packagerepository.yaml",
        "package.yaml",
        "korifi-app.yaml",
        "korifi-image.yaml",
    ] {
        // The Image is owned by the BuildWorkload korifi-app.yaml made, by its uid (as the demo
        // script substitutes it).
        let text = example(&env, file)?.replace("BUILDWORKLOAD_UID", &workload_uid);
        for object in create_all(&client, &ns, &text).await? {
            if object.types.as_ref().is_some_and(|t| t.kind == "BuildWorkload") {
                workload_uid = object.uid().context("no uid")?;
            }
            let api = api_for(&client, &object, Some(&ns)).await?;
            let stored = api.get(&object.name_any()).await?;
            // Structural schemas prune unknown fields: what we sent must come back intact.
            ensure!(
                stored.data["spec"] == object.data["spec"],
                "{} spec was altered on storage",
                object.name_any()
            );
            kinds.push(object.types.map(|t| t.kind).unwrap_or_default());
        }
    }
    kinds.sort();
    ensure!(
        kinds
            == [
                "App",
                "BuildWorkload",
                "CFApp",
                "Image",
                "Package",
                "PackageRepository"
            ],
        "created {kinds:?}"
    );
    Ok(())
}

async fn crds_reject_schema_violations(env: Arc<Env>) -> Result<()> {
    let client = env.client().await?;
    let ns = env.namespace("schema").await?;
    // spec.fetch of an App is a list; an object there must be refused by the structural schema.
    let bad = parse_documents(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {name: bad}\nspec:\n  fetch: {image: {url: x}}\n",
    )?;
    let api = api_for(&client, &bad[0], Some(&ns)).await?;
    match api.create(&PostParams::default(), &bad[0]).await {
        Err(kube::Error::Api(e)) if e.code == 422 => {
            ensure!(
                e.message.contains("spec.fetch"),
                "unexpected message: {}",
                e.message
            );
            Ok(())
        }
        other => anyhow::bail!("expected 422 Invalid, got {other:?}"),
    }
}

fn dynamic(api_version: &str, kind: &str, name: &str, spec: serde_json::Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": api_version, "kind": kind, "metadata": {"name": name}, "spec": spec,
    }))?)
}

async fn garbage_collector_deletes_dependents_in_foreground(env: Arc<Env>) -> Result<()> {
    let client = env.client().await?;
    let ns = env.namespace("gc").await?;
    let app = dynamic(
        "korifi.cloudfoundry.org/v1alpha1",
        "CFApp",
        "app-1",
        json!({
            "displayName": "app-1", "desiredState": "STOPPED", "lifecycle": {"type": "buildpack", "data": {"buildpacks": [], "stack": "cflinuxfs3"}},
        }),
    )?;
    let apps = api_for(&client, &app, Some(&ns)).await?;
    let app = apps.create(&PostParams::default(), &app).await?;
    let mut image = dynamic(
        "kpack.io/v1alpha2",
        "Image",
        "app-1",
        json!({"tag": "example.com/app-1"}),
    )?;
    image.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "korifi.cloudfoundry.org/v1alpha1".into(),
            kind: "CFApp".into(),
            name: app.name_any(),
            uid: app.uid().context("no uid")?,
            block_owner_deletion: Some(true),
            controller: None,
        },
    ]);
    let images = api_for(&client, &image, Some(&ns)).await?;
    let image = images.create(&PostParams::default(), &image).await?;

    apps.delete(
        &app.name_any(),
        &DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..Default::default()
        },
    )
    .await?;
    // Foreground: the owner stays (with the foregroundDeletion finalizer) until the GC removed its dependent.
    wait::deleted(&images, &image.name_any(), &image.uid().context("no uid")?).await?;
    wait::deleted(&apps, &app.name_any(), &app.uid().context("no uid")?).await?;
    Ok(())
}

async fn namespace_deletion_completes_with_custom_resources(env: Arc<Env>) -> Result<()> {
    let client = env.client().await?;
    let ns = env.namespace("nsdel").await?;
    // noopDelete: were kapp-controller running (a filtered run may order tests otherwise), it
    // would put its delete finalizer on the App and run `kapp delete` as the App's
    // ServiceAccount, which may deploy nothing here; noopDelete lets the App go without.
    let app = example(&env, "app-image.yaml")?.replacen("\nspec:\n", "\nspec:\n  noopDelete: true\n", 1);
    create_all(&client, &ns, &app).await?;
    create_all(&client, &ns, &example(&env, "korifi-app.yaml")?).await?;
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("cm".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await?;

    let namespaces: Api<Namespace> = Api::all(client);
    let uid = namespaces.get(&ns).await?.uid().context("no uid")?;
    namespaces.delete(&ns, &DeleteParams::default()).await?;
    if let Err(error) = wait::deleted(&namespaces, &ns, &uid).await {
        // What holds it: the namespace controller's conditions say.
        let conditions = namespaces
            .get_opt(&ns)
            .await?
            .and_then(|n| n.status)
            .and_then(|s| s.conditions)
            .unwrap_or_default();
        let conditions: Vec<String> = conditions
            .iter()
            .filter(|c| c.status == "True")
            .map(|c| format!("{}: {}", c.type_, c.message.as_deref().unwrap_or_default()))
            .collect();
        return Err(error.context(format!("namespace {ns} still there: {conditions:?}")));
    }
    Ok(())
}

async fn registry_answers_pushed_and_moved_tags(env: Arc<Env>) -> Result<()> {
    let registry = env.registry();
    let repo = holdfast_e2e::control_plane::unique_name("smoke/config");
    let v1 = images::Image::with_files(&[("config.yml", b"greeting: hello\n")])?;
    let pushed = images::push(registry, &repo, "1.0.0", &v1).await?;
    ensure!(
        pushed == v1.digest(),
        "push reported {pushed}, built {}",
        v1.digest()
    );
    ensure!(images::head_digest(registry, &repo, "1.0.0").await?.as_deref() == Some(v1.digest()));

    let v2 = images::Image::with_files(&[("config.yml", b"greeting: bonjour\n")])?;
    ensure!(
        v2.digest() != v1.digest(),
        "different content must give a different digest"
    );
    images::retag(registry, &repo, "1.0.0", &v2).await?;
    ensure!(
        images::head_digest(registry, &repo, "1.0.0").await?.as_deref() == Some(v2.digest()),
        "tag did not move"
    );
    // The old content stays reachable by digest: pins keep working after a tag moves.
    ensure!(
        images::head_digest(registry, &repo, v1.digest())
            .await?
            .as_deref()
            == Some(v1.digest())
    );

    let arm = images::Image::with_files(&[("config.yml", b"arch: arm64\n")])?;
    let index = images::push_index(registry, &repo, "multi", &[("amd64", &v1), ("arm64", &arm)]).await?;
    ensure!(images::head_digest(registry, &repo, "multi").await?.as_deref() == Some(index.as_str()));
    ensure!(images::head_digest(registry, &repo, "missing").await?.is_none());

    let bundle = images::Image::bundle(
        &[("config/app.yml", b"kind: ConfigMap\n")],
        &[format!("{registry}/{repo}@{}", v1.digest())],
    )?;
    ensure!(images::push(registry, &repo, "bundle-1.0.0", &bundle).await? == bundle.digest());
    Ok(())
}

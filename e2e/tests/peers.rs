//! The real peers and kwok nodes do their jobs on the local control plane, so the suites built on
//! them test what a cluster does: kwok runs pods and honours grace periods; the real
//! kapp-controller fetches, templates and deploys an App, and syncs a PackageRepository whose
//! Packages its aggregated API serves.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, e2e_main, images, objects::api_for, objects::create_all, peers::kapp_controller, wait,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, PostParams},
};
use serde_json::Value;

e2e_main!(
    kwok_runs_pods_and_honours_grace_periods,
    kapp_controller_deploys_an_app,
    kapp_controller_serves_the_packages_of_a_repository,
);

fn pod(name: &str, grace: i64, restart: &str) -> Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "restartPolicy": restart,
            "containers": [{"name": "main", "image": "example.invalid/app:1"}],
        },
    }))?)
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("")
}

async fn kwok_runs_pods_and_honours_grace_periods(env: Arc<Env>) -> Result<()> {
    let client = env.client().await?;
    let ns = env.namespace("kwok").await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    for (name, grace) in [("graceful", 6), ("forced", 30)] {
        pods.create(&PostParams::default(), &pod(name, grace, "Always")?)
            .await?;
        wait::until(&pods, name, |p: Option<&Pod>| {
            p.is_some_and(|p| phase(p) == "Running")
        })
        .await?;
    }
    // A pod that must not restart finishes, as its container would.
    pods.create(&PostParams::default(), &pod("job", 30, "Never")?)
        .await?;
    wait::until(&pods, "job", |p: Option<&Pod>| {
        p.is_some_and(|p| phase(p) == "Succeeded")
    })
    .await?;

    let graceful = pods.get("graceful").await?.uid().context("uid")?;
    let started = std::time::Instant::now();
    pods.delete("graceful", &DeleteParams::default()).await?;
    wait::deleted(&pods, "graceful", &graceful).await?;
    let took = started.elapsed();
    // deletionTimestamp has a resolution of one second.
    ensure!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(9),
        "a pod with a 6 s grace period went after {took:?}"
    );

    let forced = pods.get("forced").await?.uid().context("uid")?;
    let started = std::time::Instant::now();
    pods.delete(
        "forced",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await?;
    wait::deleted(&pods, "forced", &forced).await?;
    let forced_took = started.elapsed();
    ensure!(
        forced_took < Duration::from_secs(2),
        "a grace-0 delete took {forced_took:?}"
    );
    eprintln!("kwok: graceful delete (6 s grace) took {took:.1?}, grace 0 took {forced_took:.1?}");
    Ok(())
}

/// A namespace with a ServiceAccount kapp may deploy with (what a kapp-controller user creates).
async fn deployer_namespace(env: &Env, prefix: &str) -> Result<String> {
    let ns = env.namespace(prefix).await?;
    kapp_controller::add_deployer(env, &ns)?;
    Ok(ns)
}

async fn kapp_controller_deploys_an_app(env: Arc<Env>) -> Result<()> {
    env.kapp_controller().await?;
    let client = env.client().await?;
    let ns = deployer_namespace(&env, "kc-app").await?;
    let config = images::Image::with_files(&[(
        "config.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: deployed}\ndata: {greeting: hello}\n",
    )])?;
    images::push(env.registry(), "peers/app-config", "1.0.0", &config).await?;
    let app = format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: simple}}\nspec:\n  serviceAccountName: deployer\n  fetch: [{{image: {{url: {}/peers/app-config:1.0.0}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n",
        env.registry()
    );
    let created = create_all(&client, &ns, &app).await?;
    let apps = api_for(&client, &created[0], Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &apps, "simple").await?;
    let cm = Api::<ConfigMap>::namespaced(client, &ns).get("deployed").await?;
    ensure!(
        cm.data
            .as_ref()
            .and_then(|d| d.get("greeting"))
            .map(String::as_str)
            == Some("hello"),
        "deployed ConfigMap: {cm:?}"
    );
    Ok(())
}

async fn kapp_controller_serves_the_packages_of_a_repository(env: Arc<Env>) -> Result<()> {
    env.kapp_controller().await?;
    let client = env.client().await?;
    let ns = deployer_namespace(&env, "kc-repo").await?;
    let reg = env.registry();
    let content = images::Image::with_files(&[(
        "config.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-package}\n",
    )])?;
    let content = images::push(reg, "peers/pkg-content", "1.0.0", &content).await?;
    let packages = format!(
        "apiVersion: data.packaging.carvel.dev/v1alpha1\nkind: PackageMetadata\nmetadata: {{name: greeter.peers.holdfast.dev}}\nspec: {{displayName: greeter}}\n---\napiVersion: data.packaging.carvel.dev/v1alpha1\nkind: Package\nmetadata: {{name: greeter.peers.holdfast.dev.1.0.0}}\nspec:\n  refName: greeter.peers.holdfast.dev\n  version: 1.0.0\n  template:\n    spec:\n      fetch: [{{image: {{url: {reg}/peers/pkg-content@{content}}}}}]\n      template: [{{ytt: {{}}}}]\n      deploy: [{{kapp: {{}}}}]\n"
    );
    let bundle = images::Image::bundle(&[("packages/greeter.yml", packages.as_bytes())], &[])?;
    images::push(reg, "peers/repo", "1.0.0", &bundle).await?;
    let repo = format!(
        "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageRepository\nmetadata: {{name: repo}}\nspec:\n  fetch: {{imgpkgBundle: {{image: {reg}/peers/repo:1.0.0}}}}\n"
    );
    let created = create_all(&client, &ns, &repo).await?;
    let repos = api_for(&client, &created[0], Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &repos, "repo").await?;

    // Served by kapp-controller's aggregated API server, as `kubectl get packages` shows them.
    let out = env
        .kubectl()
        .args([
            "get",
            "packages.data.packaging.carvel.dev",
            "-n",
            &ns,
            "-o",
            "json",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl get packages: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: Value = serde_json::from_slice(&out.stdout)?;
    let names: Vec<&str> = list["items"]
        .as_array()
        .context("no items")?
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    ensure!(
        names == ["greeter.peers.holdfast.dev.1.0.0"],
        "packages: {names:?}"
    );
    Ok(())
}

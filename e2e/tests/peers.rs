//! The real peers and kwok nodes do their jobs on the local control plane, so the suites built on
//! them test what a cluster does: kwok runs pods and honours grace periods; the real
//! kapp-controller fetches, templates and deploys an App, and syncs a PackageRepository whose
//! Packages its aggregated API serves; the real kpack builds an Image through its own reconciles
//! (builder, Build, build pod on a kwok node, cache volume from the real local-path-provisioner).

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use holdfast_e2e::{
    Env, e2e_main, images,
    objects::{api_for, create_all},
    peers::{
        condition, kapp_controller,
        korifi::{cf, org_deletion},
        kpack, until_condition,
    },
    wait,
};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, PostParams},
};
use serde_json::Value;

e2e_main!(
    kwok_runs_pods_and_honours_grace_periods,
    kapp_controller_deploys_an_app,
    kapp_controller_serves_the_packages_of_a_repository,
    kpack_builds_an_image,
    kpack_denies_build_env_from_secrets,
    korifi_stages_and_runs_an_app,
    korifi_org_deletion_completes,
);

/// An environment of its own for a Korifi test: Korifi needs kpack v0.17.1, the shared
/// environment's tests run v0.17.2. `None` on an existing cluster (the peers run only locally).
async fn korifi_env(test: &str) -> Result<Option<Env>> {
    let env = Env::start().await?;
    if env.is_existing_cluster() {
        eprintln!("{test}: skipped (the Korifi peer runs only on the local control plane)");
        return Ok(None);
    }
    eprintln!("{test}: own control plane ready in {:.1?}", env.boot_time());
    Ok(Some(env))
}

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

/// An Image built from source in the registry goes all the way through kpack's own reconciles:
/// the webhook defaults it, the image reconciler creates its cache claim and Build, the build
/// reconciler the pod, which kube-scheduler places on a kwok node once the local-path-provisioner
/// has bound the claim; when kwok completes it (the containers' stand-in having pushed the app
/// image), kpack marks the Build succeeded and the Image ready with the pushed digest. No test
/// writes any status. The Image also reads as v1alpha1, through kpack's conversion webhook.
async fn kpack_builds_an_image(env: Arc<Env>) -> Result<()> {
    if env.is_existing_cluster() {
        eprintln!("kpack: skipped (the kpack peer runs only on the local control plane)");
        return Ok(());
    }
    let started = std::time::Instant::now();
    let builder = env.kpack().await?.cluster_builder().to_string();
    eprintln!(
        "kpack: started (webhook, controller, ClusterBuilder ready) in {:.1?}",
        started.elapsed()
    );
    let built = std::time::Instant::now();
    let client = env.client().await?;
    let ns = env.namespace("kpack-image").await?;
    let reg = env.registry();
    let source = images::Image::with_files(&[("app/main.txt", b"hello from the e2e source\n")])?;
    let source = images::push(reg, "peers/kpack-app-source", "1", &source).await?;
    let image = format!(
        "apiVersion: kpack.io/v1alpha2\nkind: Image\nmetadata: {{name: app}}\nspec:\n  tag: {reg}/peers/kpack-app\n  builder: {{kind: ClusterBuilder, name: {builder}}}\n  source: {{registry: {{image: {reg}/peers/kpack-app-source@{source}}}}}\n"
    );
    let created = create_all(&client, &ns, &image).await?;
    // Defaulted by kpack's mutating webhook.
    ensure!(
        created[0].data["spec"]["serviceAccountName"] == "default",
        "Image not defaulted by kpack's webhook: {}",
        created[0].data["spec"]
    );

    let builds: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kpack::resource("Build"));
    let build = until_condition(
        &builds,
        "app-build-1",
        "Succeeded",
        true,
        Duration::from_secs(120),
    )
    .await
    .with_context(|| env.kpack_log(15))?;
    let latest = build.data["status"]["latestImage"].as_str().unwrap_or_default();
    let pushed = images::head_digest(reg, "peers/kpack-app", "latest")
        .await?
        .context("app image not pushed")?;
    ensure!(
        latest == format!("{reg}/peers/kpack-app@{pushed}"),
        "Build latestImage {latest} is not the pushed {pushed}"
    );
    let images_api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kpack::resource("Image"));
    let ready = until_condition(&images_api, "app", "Ready", false, Duration::from_secs(60))
        .await
        .with_context(|| env.kpack_log(15))?;
    ensure!(
        ready.data["status"]["latestImage"] == latest,
        "Image status: {}",
        ready.data["status"]
    );
    eprintln!(
        "kpack: Image built (Build succeeded, Image ready) in {:.1?}",
        built.elapsed()
    );

    let pod_name = build.data["status"]["podName"]
        .as_str()
        .context("Build without podName")?;
    let pod = Api::<Pod>::namespaced(client.clone(), &ns).get(pod_name).await?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    ensure!(
        phase(&pod) == "Succeeded" && node.starts_with("kwok-node-"),
        "build pod {pod_name}: {} on {node:?}",
        phase(&pod)
    );
    // A build pod that mounts the Image's cache claim is scheduled only once the provisioner
    // made its volume; the claim's phase is written after that binding, so it may lag the
    // build. kpack names the claim in a Build from the Image's stored status (v0.17.2
    // image_builds.go, getBuildCacheConfig: `im.Status.BuildCacheName`), so a Build made before
    // that status was written goes without it: seen under load (the pod scheduled, the claim
    // left waiting for a first consumer). The claim is checked when the pod mounts it.
    let mounts_cache = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
        v.persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == "app-cache")
    });
    if mounts_cache {
        let claims = Api::<PersistentVolumeClaim>::namespaced(client, &ns);
        wait::until(&claims, "app-cache", |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
        .await
        .context("the Image's cache claim bound")?;
    } else {
        eprintln!("kpack: the first Build ran without the cache claim (created before the claim)");
    }

    let out = env
        .kubectl()
        .args(["get", "images.v1alpha1.kpack.io", "app", "-n", &ns, "-o", "json"])
        .output()?;
    ensure!(
        out.status.success(),
        "v1alpha1 read (conversion webhook): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v1alpha1: Value = serde_json::from_slice(&out.stdout)?;
    ensure!(
        v1alpha1["apiVersion"] == "kpack.io/v1alpha1",
        "converted: {}",
        v1alpha1["apiVersion"]
    );
    Ok(())
}

/// kpack v0.17.2's webhook denies an Image whose build env is taken from a Secret (kpack#1945) —
/// as Korifi v0.18.0 writes every app's Image (VCAP_APPLICATION, VCAP_SERVICES): why Korifi runs
/// on kpack v0.17.1 here. Shows when a kpack upgrade changes it.
async fn kpack_denies_build_env_from_secrets(env: Arc<Env>) -> Result<()> {
    if env.is_existing_cluster() {
        eprintln!("kpack: skipped (the kpack peer runs only on the local control plane)");
        return Ok(());
    }
    let kpack = env.kpack().await?;
    if kpack.release() != kpack::V0_17_2 {
        eprintln!(
            "kpack: skipped (this environment runs kpack {})",
            kpack.release().version
        );
        return Ok(());
    }
    let client = env.client().await?;
    let ns = env.namespace("kpack-secret-env").await?;
    let reg = env.registry();
    let image = format!(
        "apiVersion: kpack.io/v1alpha2\nkind: Image\nmetadata: {{name: app}}\nspec:\n  tag: {reg}/peers/kpack-secret-env\n  builder: {{kind: ClusterBuilder, name: {}}}\n  source: {{registry: {{image: {reg}/peers/kpack-app-source:1}}}}\n  build:\n    env:\n    - name: VCAP_SERVICES\n      valueFrom: {{secretKeyRef: {{name: app-vcap-services, key: VCAP_SERVICES}}}}\n",
        kpack.cluster_builder()
    );
    let denied = create_all(&client, &ns, &image)
        .await
        .err()
        .context("an Image with build env from a Secret was admitted")?;
    ensure!(
        format!("{denied:#}").contains("secretKeyRef is not supported for build environment variables"),
        "denied for another reason: {denied:#}"
    );
    Ok(())
}

/// A Korifi org, space and app made through the real controllers, as the Korifi API would ask for
/// them: the CFOrg and CFSpace get their namespaces; the CFBuild a BuildWorkload, which Korifi's
/// kpack-image-builder turns into a kpack Image whose Build kpack runs and marks succeeded, and
/// whose droplet Korifi reads from the registry; the started app's CFProcess an AppWorkload,
/// which the statefulset-runner turns into a StatefulSet whose pod runs on a kwok node.
async fn korifi_stages_and_runs_an_app(_shared: Arc<Env>) -> Result<()> {
    let Some(env) = korifi_env("korifi_stages_and_runs_an_app").await? else {
        return Ok(());
    };
    let started = std::time::Instant::now();
    let korifi = env.korifi().await?;
    eprintln!("korifi: started (with kpack) in {:.1?}", started.elapsed());
    let client = env.client().await?;
    let pushed = std::time::Instant::now();
    let org = cf::create_org(&client, "e2e-org")
        .await
        .with_context(|| env.korifi_log(20))?;
    let space = cf::create_space(&client, &org, "e2e-space")
        .await
        .with_context(|| env.korifi_log(20))?;
    let app = cf::push_app(
        &client,
        env.registry(),
        korifi.repository_prefix(),
        &space,
        "e2e-app",
    )
    .await
    .with_context(|| env.korifi_log(30))?;
    let pods = match cf::until_running(&client, &app, 1).await {
        Ok(pods) => pods,
        Err(e) => bail!(
            "{e:#}\nprocesses: {}\n{}",
            cf::process_summary(&client, &app).await,
            env.korifi_log(30)
        ),
    };
    eprintln!(
        "korifi: org, space, app staged and running in {:.1?}",
        pushed.elapsed()
    );

    let images: Api<DynamicObject> = Api::namespaced_with(client.clone(), &space, &kpack::resource("Image"));
    let image = images
        .get(&app.guid)
        .await
        .context("Korifi's kpack Image (named after the app)")?;
    ensure!(
        condition(&image, "Ready") == Some(true),
        "Image: {}",
        image.data["status"]
    );
    let node = pods[0]
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    ensure!(node.starts_with("kwok-node-"), "app pod on {node:?}");
    Ok(())
}

/// Apps in the org-deletion test's org (`HOLDFAST_E2E_ORG_APPS` overrides).
const ORG_APPS: usize = 3;

/// The Korifi/kpack part of the org-deletion scenario: an org with one space and a few apps,
/// each with a succeeded Build and a running pod, all made through the real controllers; `cf
/// delete-org` completes — the CFOrg, both namespaces and the cache volumes are gone, seen on
/// watches — and the test prints how long each took.
async fn korifi_org_deletion_completes(_shared: Arc<Env>) -> Result<()> {
    let Some(env) = korifi_env("korifi_org_deletion_completes").await? else {
        return Ok(());
    };
    let apps = std::env::var("HOLDFAST_E2E_ORG_APPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(ORG_APPS);
    let korifi = env.korifi().await?;
    let client = env.client().await?;
    let populated = std::time::Instant::now();
    let org = org_deletion::populate(&client, env.registry(), korifi.repository_prefix(), apps)
        .await
        .with_context(|| env.korifi_log(30))?;
    eprintln!(
        "korifi: org with 1 space and {apps} apps (staged, running) made in {:.1?}",
        populated.elapsed()
    );
    let deletion = org_deletion::delete(&client, &org, Duration::from_secs(300))
        .await
        .with_context(|| env.korifi_log(30))?;
    eprintln!(
        "korifi: org with {apps} apps deleted in {:.1?} (CFApps gone after {:.1?}, space namespace {:.1?}, org namespace {:.1?}, CFOrg {:.1?}, cache volumes {:.1?}); kpack created {} Builds and {} build pods meanwhile",
        deletion.total(),
        deletion.apps,
        deletion.space_namespace,
        deletion.org_namespace,
        deletion.org,
        deletion.volumes,
        deletion.builds_created(),
        deletion.build_pods_created()
    );
    Ok(())
}

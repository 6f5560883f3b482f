//! Pinning with the real kapp-controller: Apps that holdfast pinned keep reconciling while the
//! registry is down, and Apps left on a tag (a namespace holdfast does not serve) fail — counted
//! from a watch on the Apps' status conditions.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::{Context, Result, ensure};
use futures::TryStreamExt;
use holdfast_e2e::{
    Env, e2e_main, images,
    objects::{api_for, create_all},
    peers::kapp_controller::{self, SeenApps},
    webhook::{LocalWebhook, Registration},
};
use kube::{
    Api, ResourceExt,
    api::DynamicObject,
    runtime::{WatchStreamExt, watcher},
};
use tokio::task::JoinHandle;

// Serial: one kapp-controller serves the suite, and the outage test's failing tag Apps hold its
// workers for their fetch timeouts, which delayed the repository test's syncs past its limit.
e2e_main!(
    serial: pinned_apps_keep_reconciling_through_a_registry_outage,
    a_repositorys_packages_are_pinned_through_the_aggregated_api_and_install_pinned,
    applying_a_tag_again_changes_nothing_with_kapp_or_kubectl,
    every_app_shape_reconciles_pinned,
);

/// kapp-controller's sync period for the test's Apps; the outage lasts three of them.
const SYNC_PERIOD: Duration = Duration::from_secs(10);
const APPS: usize = 3;
/// The shortest sync period kapp-controller gives a PackageRepository (shorter ones get 30 s).
const REPO_SYNC_PERIOD: Duration = Duration::from_secs(30);

fn app(name: &str, url: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: {}\n  syncPeriod: {}s\n  fetch: [{{image: {{url: {url}}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n",
        kapp_controller::DEPLOYER,
        SYNC_PERIOD.as_secs()
    )
}

/// What a watch saw of each App while it ran.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// Status versions reporting `ReconcileFailed` (for a reason of the App's own).
    failed: usize,
    /// Status versions reporting kapp-controller's reaper race (`failed_by_reaper_race`).
    raced: usize,
    /// Distinct `status.deploy.updatedAt` values reported with `ReconcileSucceeded`: one per
    /// successful sync.
    succeeded_syncs: std::collections::BTreeSet<String>,
}

/// Watches the Apps of `api` until aborted; the shared map holds what it saw.
fn watch_apps(api: Api<DynamicObject>) -> (SeenApps<Seen>, JoinHandle<()>) {
    kapp_controller::watch_apps(api, |entry: &mut Seen, app| {
        if kapp_controller::reconcile_failed(app) {
            entry.failed += 1;
        }
        if kapp_controller::failed_by_reaper_race(app) {
            entry.raced += 1;
        }
        if kapp_controller::has_condition(app, "ReconcileSucceeded")
            && let Some(at) = app.data["status"]["deploy"]["updatedAt"].as_str()
        {
            entry.succeeded_syncs.insert(at.to_string());
        }
    })
}

async fn pinned_apps_keep_reconciling_through_a_registry_outage(env: Arc<Env>) -> Result<()> {
    env.kapp_controller().await?;
    let mut upstream = env.spare_registry().await?;
    // One configuration per App (kapp refuses two Apps deploying the same ConfigMap).
    let mut digests = Vec::new();
    for i in 0..APPS {
        let config = images::Image::with_files(&[(
            "config.yml",
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: outage-{i}}}\ndata: {{k: v}}\n")
                .as_bytes(),
        )])?;
        digests.push(images::push(&upstream.addr, &format!("team/config-{i}"), "1.0.0", &config).await?);
    }
    let url = |i: usize| format!("{}/team/config-{i}:1.0.0", upstream.addr);

    let mut registration = Registration::shipped();
    registration.insecure_registries.push(upstream.addr.clone());
    let webhook = LocalWebhook::start(env.clone(), registration).await?;
    let pinned_ns = webhook.namespace("outage-pinned").await?;
    // A namespace the webhook does not serve: its Apps stay on the tag, as without holdfast.
    let tag_ns = env.namespace("outage-tag").await?;
    let client = env.client().await?;
    let mut apis = Vec::new();
    for ns in [&pinned_ns, &tag_ns] {
        kapp_controller::add_deployer(&env, ns)?;
        let mut api = None;
        for i in 0..APPS {
            let created = create_all(&client, ns, &app(&format!("app-{i}"), &url(i))).await?;
            api = Some(api_for(&client, &created[0], Some(ns)).await?);
        }
        apis.push(api.context("no Apps")?);
    }
    for api in &apis {
        for i in 0..APPS {
            kapp_controller::until_reconciled(&env, api, &format!("app-{i}")).await?;
        }
    }
    for (i, digest) in digests.iter().enumerate() {
        let stored = apis[0].get(&format!("app-{i}")).await?;
        let pinned = stored.data["spec"]["fetch"][0]["image"]["url"]
            .as_str()
            .unwrap_or_default();
        ensure!(
            pinned == format!("{}/team/config-{i}@{digest}", upstream.addr),
            "not pinned: {pinned}"
        );
        let tagged = apis[1].get(&format!("app-{i}")).await?;
        ensure!(
            tagged.data["spec"]["fetch"][0]["image"]["url"] == url(i).as_str(),
            "a tag App was changed"
        );
    }

    let (pinned_seen, pinned_watch) = watch_apps(apis[0].clone());
    let (tag_seen, tag_watch) = watch_apps(apis[1].clone());
    upstream.stop();
    let started = std::time::Instant::now();
    // The outage lasts at least three sync periods, and until the watch has seen every tag App
    // fail (kapp-controller's fetch retries take a while to give up), at most three minutes.
    let all_tag_apps_failed = || {
        tag_seen
            .lock()
            .is_ok_and(|seen| seen.len() == APPS && seen.values().all(|s| s.failed > 0))
    };
    while started.elapsed() < SYNC_PERIOD * 3 || !all_tag_apps_failed() {
        if started.elapsed() > Duration::from_secs(180) {
            break;
        }
        // Reads the watches' local record; nothing here asks the API server.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let outage = started.elapsed();
    pinned_watch.abort();
    tag_watch.abort();
    upstream.start().await?;

    let pinned_seen = pinned_seen
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let tag_seen = tag_seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    for i in 0..APPS {
        let name = format!("app-{i}");
        let pinned = pinned_seen.get(&name).cloned().unwrap_or_default();
        let tagged = tag_seen.get(&name).cloned().unwrap_or_default();
        ensure!(
            pinned.failed == 0,
            "pinned {name} failed {} times during the outage",
            pinned.failed
        );
        ensure!(
            pinned.succeeded_syncs.len() >= 2,
            "pinned {name} did not keep reconciling: {} successful syncs in {outage:?}",
            pinned.succeeded_syncs.len()
        );
        ensure!(
            tagged.failed > 0,
            "tag {name} never failed while its registry was down"
        );
    }
    let failed: usize = tag_seen.values().map(|s| s.failed).sum();
    let synced: usize = pinned_seen.values().map(|s| s.succeeded_syncs.len()).sum();
    let raced: usize = pinned_seen
        .values()
        .chain(tag_seen.values())
        .map(|s| s.raced)
        .sum();
    eprintln!(
        "registry outage of {outage:?}: {APPS} pinned Apps, 0 failed reconciles, {synced} successful syncs; {APPS} tag Apps, {failed} failed reconcile statuses; {raced} statuses of kapp-controller's reaper race"
    );
    webhook.stop().await
}

/// What a watch saw of one Package across repository syncs.
#[derive(Debug, Default)]
struct PackageVersions {
    /// Every resourceVersion stored.
    versions: std::collections::BTreeSet<String>,
    /// Every fetch reference stored.
    references: std::collections::BTreeSet<String>,
    generations: std::collections::BTreeSet<i64>,
}

/// The fetch reference of a Package's App template: an image's url or a bundle's image.
fn package_reference(package: &serde_json::Value) -> Option<&str> {
    let fetch = &package["spec"]["template"]["spec"]["fetch"][0];
    fetch["image"]["url"]
        .as_str()
        .or_else(|| fetch["imgpkgBundle"]["image"].as_str())
}

/// A PackageRepository (an imgpkg bundle) whose Packages name their content by tag, one an
/// image and one an imgpkg bundle, and a PackageInstall of the first.
///
/// - The image Package reaches the API through kapp-controller's aggregated API server, whose
///   admission chain calls holdfast: it is stored pinned, with `holdfast.dev/original-refs`.
/// - The bundle Package arrives pinned: the repository's templating runs kbld over bundle
///   repositories, and kbld resolves every `image:` string itself. holdfast leaves it alone.
/// - Across three more syncs no Package ever holds a tag, generations stay 1, and the bundle
///   Package is never written. The image Package is written at most once a sync (its
///   resourceVersion moves, nothing else): kapp-controller marks a repository's Packages
///   `kapp.k14s.io/disable-original`, so kapp diffs against the live Package and sends the tag
///   back every sync, and kube-apiserver's field manager stamps that update before mutating
///   admission pins it again. No webhook can avoid that write; BENCHMARKS.md and issue 13 say so.
/// - The PackageInstall's App is created from the pinned template (the App rule has nothing to
///   do), reconciles and deploys; it is never rewritten by kapp-controller, since the Package and
///   the App agree.
async fn a_repositorys_packages_are_pinned_through_the_aggregated_api_and_install_pinned(
    env: Arc<Env>,
) -> Result<()> {
    env.kapp_controller().await?;
    let reg = env.registry();
    let content = images::Image::with_files(&[(
        "config.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-package}\n",
    )])?;
    let content_digest = images::push(reg, "fight/pkg-content", "1.0.0", &content).await?;
    let bundled = images::Image::bundle(
        &[(
            "config/config.yml",
            b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-bundle}\n",
        )],
        &[],
    )?;
    let bundled_digest = images::push(reg, "fight/pkg-bundle", "1.0.0", &bundled).await?;
    let package = |name: &str, fetch: &str| {
        format!(
            "apiVersion: data.packaging.carvel.dev/v1alpha1\nkind: Package\nmetadata: {{name: {name}.fight.holdfast.dev.1.0.0}}\nspec:\n  refName: {name}.fight.holdfast.dev\n  version: 1.0.0\n  template:\n    spec:\n      fetch: [{fetch}]\n      template: [{{ytt: {{}}}}]\n      deploy: [{{kapp: {{}}}}]\n"
        )
    };
    let packages = [
        package(
            "image",
            &format!("{{image: {{url: {reg}/fight/pkg-content:1.0.0}}}}"),
        ),
        package(
            "bundle",
            &format!("{{imgpkgBundle: {{image: {reg}/fight/pkg-bundle:1.0.0}}}}"),
        ),
    ]
    .join("---\n");
    let bundle = images::Image::bundle(&[("packages/packages.yml", packages.as_bytes())], &[])?;
    images::push(reg, "fight/repo", "1.0.0", &bundle).await?;
    let pinned = BTreeMap::from([
        (
            "image.fight.holdfast.dev.1.0.0",
            format!("{reg}/fight/pkg-content@{content_digest}"),
        ),
        (
            "bundle.fight.holdfast.dev.1.0.0",
            format!("{reg}/fight/pkg-bundle@{bundled_digest}"),
        ),
    ]);

    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let ns = webhook.namespace("fight").await?;
    kapp_controller::add_deployer(&env, &ns)?;
    let client = env.client().await?;
    let repo = format!(
        "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageRepository\nmetadata: {{name: repo}}\nspec:\n  syncPeriod: {}s\n  fetch: {{imgpkgBundle: {{image: {reg}/fight/repo:1.0.0}}}}\n",
        REPO_SYNC_PERIOD.as_secs()
    );
    let created = create_all(&client, &ns, &repo).await?;
    let repos = api_for(&client, &created[0], Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &repos, "repo").await?;
    for (name, reference) in &pinned {
        let stored = env.kubectl_get("packages.data.packaging.carvel.dev", name, &ns)?;
        ensure!(
            package_reference(&stored) == Some(reference.as_str()),
            "Package {name} is not pinned: {:?}",
            package_reference(&stored)
        );
        let by_holdfast = stored["metadata"]["annotations"]["holdfast.dev/original-refs"].is_string();
        ensure!(
            by_holdfast == name.starts_with("image."),
            "Package {name}: pinned by holdfast {by_holdfast}, expected only the image Package to be"
        );
    }

    // The PackageInstall's App comes from the pinned template.
    let install = format!(
        "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageInstall\nmetadata: {{name: install}}\nspec:\n  serviceAccountName: {}\n  packageRef: {{refName: image.fight.holdfast.dev, versionSelection: {{constraints: 1.0.0}}}}\n",
        kapp_controller::DEPLOYER
    );
    let created = create_all(&client, &ns, &install).await?;
    let installs = api_for(&client, &created[0], Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &installs, "install").await?;
    let app = env.kubectl_get("apps.kappctrl.k14s.io", "install", &ns)?;
    ensure!(
        app["spec"]["fetch"][0]["image"]["url"] == pinned["image.fight.holdfast.dev.1.0.0"].as_str(),
        "the PackageInstall's App is not pinned: {}",
        app["spec"]["fetch"][0]
    );
    env.kubectl_get("configmaps", "from-package", &ns)
        .context("the PackageInstall's App did not deploy its ConfigMap")?;

    // Three more syncs, each seen as the repository's status.fetch.updatedAt moving, with every
    // version of every Package stored meanwhile.
    let seen: Arc<std::sync::Mutex<BTreeMap<String, PackageVersions>>> = Arc::default();
    let packages_api = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &ns,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("data.packaging.carvel.dev", "v1alpha1", "Package"),
            "packages",
        ),
    );
    let watching = {
        let seen = seen.clone();
        tokio::spawn(async move {
            let stream = watcher(packages_api, watcher::Config::default()).applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Ok(Some(package)) = stream.try_next().await {
                let value = serde_json::to_value(&package).unwrap_or_default();
                let Ok(mut seen) = seen.lock() else { return };
                let entry = seen.entry(package.name_any()).or_default();
                entry.versions.extend(package.resource_version());
                entry
                    .references
                    .extend(package_reference(&value).map(String::from));
                entry.generations.extend(package.metadata.generation);
            }
        })
    };
    let mut syncs = std::collections::BTreeSet::new();
    let stream = watcher(repos.clone(), watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    const MORE_SYNCS: usize = 3;
    // kapp-controller adds jitter to each period, and a loaded machine delays reconciles: three
    // syncs took 70 s alone, one took 360 s beside the outage test and two other suites.
    let limit = REPO_SYNC_PERIOD * 10 * MORE_SYNCS as u32;
    let waited = tokio::time::timeout(limit, async {
        while let Some(repo) = stream.try_next().await? {
            if kapp_controller::has_condition(&repo, "ReconcileSucceeded")
                && let Some(at) = repo.data["status"]["deploy"]["updatedAt"].as_str()
            {
                syncs.insert(at.to_string());
            }
            // The first value is the sync already seen.
            if syncs.len() > MORE_SYNCS {
                return Ok::<_, anyhow::Error>(());
            }
        }
        Ok(())
    })
    .await;
    watching.abort();
    ensure!(
        waited.is_ok(),
        "the repository synced {} times in {limit:?}",
        syncs.len().saturating_sub(1)
    );
    let seen = std::mem::take(&mut *seen.lock().map_err(|_| anyhow::anyhow!("watch poisoned"))?);
    for (name, reference) in &pinned {
        let versions = seen
            .get(*name)
            .with_context(|| format!("the watch never saw Package {name}"))?;
        ensure!(
            versions.references == [reference.clone()].into(),
            "Package {name} held other references across the syncs: {:?}",
            versions.references
        );
        ensure!(
            versions.generations == [1].into(),
            "Package {name}'s generation moved: {:?}",
            versions.generations
        );
        // The first version is the one the watch started from.
        let writes = versions.versions.len() - 1;
        eprintln!("Package {name}: {writes} writes in {MORE_SYNCS} repository syncs");
        if name.starts_with("bundle.") {
            ensure!(writes == 0, "kapp rewrote the kbld-pinned Package {writes} times");
        } else {
            ensure!(
                writes <= MORE_SYNCS,
                "the pinned Package was written {writes} times in {MORE_SYNCS} syncs"
            );
        }
    }
    let app = env.kubectl_get("apps.kappctrl.k14s.io", "install", &ns)?;
    ensure!(
        app["metadata"]["generation"] == 1,
        "kapp-controller rewrote the PackageInstall's App: generation {}",
        app["metadata"]["generation"]
    );
    webhook.stop().await
}

/// A tag App applied again, the way users apply: `kapp deploy` of a file holding it shows no
/// pending change on the second deploy (no kapp configuration added), and `kubectl apply`
/// client-side and `--server-side` twice leave the stored App's spec, generation and annotations
/// as they were.
async fn applying_a_tag_again_changes_nothing_with_kapp_or_kubectl(env: Arc<Env>) -> Result<()> {
    // kapp waits for the Apps it deploys to reconcile.
    env.kapp_controller().await?;
    let reg = env.registry();
    let config = images::Image::with_files(&[(
        "config.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: reapplied}\n",
    )])?;
    let digest = images::push(reg, "reapply/config", "1.0.0", &config).await?;
    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let ns = webhook.namespace("reapply").await?;
    kapp_controller::add_deployer(&env, &ns)?;
    let dir = tempfile::tempdir()?;
    let kapp = holdfast_e2e::tools::peer_bin("kapp", "kapp")?;
    let pinned = format!("{reg}/reapply/config@{digest}");

    let file = dir.path().join("app.yml");
    std::fs::write(&file, app("by-kapp", &format!("{reg}/reapply/config:1.0.0")))?;
    let deploy = |extra: &[&str]| -> Result<std::process::Output> {
        Ok(std::process::Command::new(&kapp)
            .env("KUBECONFIG", env.kubeconfig())
            .args(["deploy", "-a", "reapply", "-n", &ns, "-f"])
            .arg(&file)
            .args(["-y", "--tty=false", "--wait-timeout=2m"])
            .args(extra)
            .output()?)
    };
    let first = deploy(&[])?;
    ensure!(
        first.status.success(),
        "kapp deploy: {}",
        String::from_utf8_lossy(&first.stderr)
    );
    let stored = env.kubectl_get("apps.kappctrl.k14s.io", "by-kapp", &ns)?;
    ensure!(
        stored["spec"]["fetch"][0]["image"]["url"] == pinned.as_str(),
        "kapp's App was not pinned"
    );
    // --diff-exit-status: 2 when nothing would change, 3 when something would.
    let second = deploy(&["--diff-run", "--diff-exit-status"])?;
    ensure!(
        second.status.code() == Some(2),
        "a second kapp deploy of the same file has pending changes:\n{}",
        String::from_utf8_lossy(&second.stdout)
    );

    for server_side in [false, true] {
        let name = if server_side {
            "by-kubectl-ssa"
        } else {
            "by-kubectl"
        };
        let yaml = app(name, &format!("{reg}/reapply/config:1.0.0"));
        let apply = |yaml: &str| {
            let mut args = vec!["-n", ns.as_str()];
            if server_side {
                args.push("--server-side");
            }
            env.kubectl_apply_with(&args, yaml)
        };
        apply(&yaml)?;
        let before = env.kubectl_get("apps.kappctrl.k14s.io", name, &ns)?;
        ensure!(
            before["spec"]["fetch"][0]["image"]["url"] == pinned.as_str(),
            "kubectl's App was not pinned"
        );
        apply(&yaml)?;
        let after = env.kubectl_get("apps.kappctrl.k14s.io", name, &ns)?;
        // kapp-controller writes the App's status meanwhile: its spec, generation and
        // annotations are what an apply could change.
        for (what, pointer) in [
            ("spec", "/spec"),
            ("generation", "/metadata/generation"),
            ("annotations", "/metadata/annotations"),
        ] {
            ensure!(
                after.pointer(pointer) == before.pointer(pointer),
                "a second kubectl apply{} changed the App's {what}",
                if server_side { " --server-side" } else { "" }
            );
        }
    }
    webhook.stop().await
}

/// An App of each fetch shape holdfast pins — an image by tag, an imgpkg bundle by tag, an
/// image by `tagSelection.semver` — is stored pinned to the digest the tag (or the highest
/// matching version) holds, and the real kapp-controller reconciles each and deploys its
/// ConfigMap.
async fn every_app_shape_reconciles_pinned(env: Arc<Env>) -> Result<()> {
    env.kapp_controller().await?;
    let reg = env.registry();
    let config = |name: &str, data: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata: {{v: '{data}'}}\n")
    };
    let image = images::Image::with_files(&[("config.yml", config("shape-image", "1").as_bytes())])?;
    let image_digest = images::push(reg, "shapes/image", "1.0.0", &image).await?;
    let bundle = images::Image::bundle(
        &[("config/config.yml", config("shape-bundle", "1").as_bytes())],
        &[],
    )?;
    let bundle_digest = images::push(reg, "shapes/bundle", "1.0.0", &bundle).await?;
    let old = images::Image::with_files(&[("config.yml", config("shape-semver", "1.0.0").as_bytes())])?;
    images::push(reg, "shapes/semver", "1.0.0", &old).await?;
    let new = images::Image::with_files(&[("config.yml", config("shape-semver", "1.1.0").as_bytes())])?;
    let semver_digest = images::push(reg, "shapes/semver", "1.1.0", &new).await?;

    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let ns = webhook.namespace("shapes").await?;
    kapp_controller::add_deployer(&env, &ns)?;
    let client = env.client().await?;
    let app = |name: &str, fetch: &str, template: &str| {
        format!(
            "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: {}\n  fetch: [{fetch}]\n  template: [{template}]\n  deploy: [{{kapp: {{}}}}]\n",
            kapp_controller::DEPLOYER
        )
    };
    let shapes = [
        (
            "image",
            app(
                "image",
                &format!("{{image: {{url: {reg}/shapes/image:1.0.0}}}}"),
                "{ytt: {}}",
            ),
            "/spec/fetch/0/image/url",
            format!("{reg}/shapes/image@{image_digest}"),
            "shape-image",
        ),
        (
            "bundle",
            app(
                "bundle",
                &format!("{{imgpkgBundle: {{image: {reg}/shapes/bundle:1.0.0}}}}"),
                "{ytt: {paths: [config]}}",
            ),
            "/spec/fetch/0/imgpkgBundle/image",
            format!("{reg}/shapes/bundle@{bundle_digest}"),
            "shape-bundle",
        ),
        (
            "semver",
            app(
                "semver",
                &format!(
                    "{{image: {{url: {reg}/shapes/semver, tagSelection: {{semver: {{constraints: '>=1.0.0'}}}}}}}}"
                ),
                "{ytt: {}}",
            ),
            "/spec/fetch/0/image/url",
            format!("{reg}/shapes/semver@{semver_digest}"),
            "shape-semver",
        ),
    ];
    for (name, yaml, pointer, pinned, configmap) in &shapes {
        let created = create_all(&client, &ns, yaml).await?;
        let stored = &created[0];
        ensure!(
            stored.data.pointer(pointer).and_then(|v| v.as_str()) == Some(pinned.as_str()),
            "App {name} was stored as {:?}, not pinned to {pinned}",
            stored.data.pointer(pointer)
        );
        ensure!(
            stored.data.pointer("/spec/fetch/0/image/tagSelection").is_none(),
            "App {name} kept its tagSelection"
        );
        let apps = api_for(&client, stored, Some(&ns)).await?;
        kapp_controller::until_reconciled(&env, &apps, name).await?;
        let deployed = env.kubectl_get("configmaps", configmap, &ns)?;
        if *name == "semver" {
            ensure!(
                deployed["data"]["v"] == "1.1.0",
                "App semver deployed {} instead of the highest matching version",
                deployed["data"]["v"]
            );
        }
    }
    webhook.stop().await
}

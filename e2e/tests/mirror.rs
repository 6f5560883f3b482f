//! Mirroring with the webhook and the controller, on two real registries on loopback (an
//! upstream and a mirror): Apps admitted with a tagged image and a tagged imgpkg bundle are pinned
//! upstream, the controller copies the content (the bundle relocated) and re-pins them to the
//! mirror, and the real kapp-controller reconciles them, and new Apps (each with an empty vendir
//! cache: the cache is per App) created while the upstream registry is stopped, without a single
//! request to the upstream registry (the bundle found fully relocated: its templates get the
//! mirror's image locations); Apps still pinned upstream fail while it is stopped. A bundle whose
//! ImagesLock names an image upstream does not have is reported (a `MirrorCopyFailed` Event),
//! and nothing is pinned to the mirror, which holds no manifest of it. Copies no App names any more are deleted
//! after the retention grace, a moved tag moves the Apps that follow it once, only the selected
//! namespaces are pinned to the mirror, and a private image's copy serves its namespace only.
//!
//! The copier alone (byte-for-byte copies, resuming after an outage, memory):
//! `tests/mirror_copier.rs`.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use futures::TryStreamExt;
use holdfast_cache::{CacheKey, Mirrored, Scope, cluster_store};
use holdfast_e2e::{
    Env,
    control_plane::SpareRegistry,
    controller::LocalController,
    e2e_main,
    images::{self, Image},
    mirror::{PREFIX, mirrored, same_content, wiring},
    objects::api_for,
    peers::kapp_controller,
    wait,
    webhook::LocalWebhook,
};
use holdfast_pins::{MirrorPins, ORIGINAL_REFS_ANNOTATION, PinnedKind};
use holdfast_registry::{
    Digest, Reference,
    mirror::{MirrorLocation, host_component},
};
use kube::api::{DynamicObject, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use serde_json::json;

// Serial. The test with kapp-controller runs last: once started it reconciles every App of the
// environment, and its finalizer would hold the Apps other tests delete.
e2e_main!(serial:
    unreferenced_copies_are_deleted_after_the_grace,
    a_moved_tag_moves_follow_apps_once_and_its_old_copy_goes,
    only_selected_namespaces_are_pinned_to_the_mirror,
    a_private_image_is_mirrored_for_its_namespace_only,
    a_bundle_with_a_missing_image_is_reported_and_not_mirrored,
    apps_are_repinned_to_the_mirror_and_sync_without_upstream,
    apps_fetched_upstream_keep_reconciling_after_a_repin_to_the_mirror,
);

/// The reference of an App's first fetch entry: `image.url` or `imgpkgBundle.image`.
fn url_of(app: Option<&DynamicObject>) -> Option<String> {
    let fetch = app?.data.pointer("/spec/fetch/0")?;
    fetch
        .pointer("/image/url")
        .or_else(|| fetch.pointer("/imgpkgBundle/image"))
        .and_then(|u| u.as_str())
        .map(str::to_owned)
}

/// The `holdfast.dev/original-refs` annotation of `object`, parsed.
fn original_refs(object: &DynamicObject) -> Result<serde_json::Value> {
    let annotation = object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ORIGINAL_REFS_ANNOTATION))
        .context("no original-refs annotation")?;
    Ok(serde_json::from_str(annotation)?)
}

/// An App named `name` with the one fetch entry `fetch`, as kapp-controller reconciles it: ytt
/// over the fetched `config/` (names prefixed with the App's), and for a bundle kbld with its
/// ImagesLock (what kapp-controller's docs give bundles), deployed with [`kapp_controller::DEPLOYER`].
fn app_object(name: &str, fetch: serde_json::Value) -> Result<DynamicObject> {
    let mut ytt = kapp_controller::own_names_template(name);
    ytt["ytt"]["paths"] = json!(["config"]);
    let mut template = vec![ytt];
    if fetch.get("imgpkgBundle").is_some() {
        template.push(json!({"kbld": {"paths": ["-", ".imgpkg/images.yml"]}}));
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "kappctrl.k14s.io/v1alpha1",
        "kind": "App",
        "metadata": {"name": name},
        "spec": {"serviceAccountName": kapp_controller::DEPLOYER, "fetch": [fetch],
                 "template": template, "deploy": [{"kapp": {}}]},
    }))?)
}

/// A ConfigMap `name` whose `data.image` is `image` (kbld rewrites it from a bundle's ImagesLock).
fn image_config(name: &str, image: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata: {{image: {image:?}}}\n")
}

/// `data.image` of the ConfigMap `name` that an App deployed in `namespace`.
async fn deployed_image(client: &kube::Client, namespace: &str, name: &str) -> Result<Option<String>> {
    let config = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .with_context(|| format!("ConfigMap {namespace}/{name} not deployed"))?;
    Ok(config.data.and_then(|d| d.get("image").cloned()))
}

/// Waits on a watch (at most 90 s: a failing App is retried with backoff up to its 30 s sync
/// period) until kapp-controller reports `condition` on the App `name`.
async fn until_condition(api: &kube::Api<DynamicObject>, name: &str, condition: &'static str) -> Result<()> {
    // A failure by kapp-controller's reaper race is not the failure a test waits for.
    let seen = move |a: Option<&DynamicObject>| {
        a.is_some_and(|a| {
            kapp_controller::has_condition(a, condition) && !kapp_controller::failed_by_reaper_race(a)
        })
    };
    tokio::time::timeout(
        Duration::from_secs(90),
        kube::runtime::wait::await_condition(api.clone(), name, seen),
    )
    .await
    .with_context(|| format!("App {name} not {condition} within 90 s"))??;
    Ok(())
}

/// The bundle App of [`bundle_is_repinned_relocated`], pinned to the mirror.
struct BundleApp {
    namespace: String,
    /// The bundle by tag, as written.
    tag: String,
    /// The bundle upstream, by digest.
    upstream: String,
    /// The bundle in the mirror, by digest.
    mirrored: String,
    /// Its ImagesLock as pushed: the images upstream, each in its own repository.
    lock: Vec<String>,
    /// The same images in the bundle's mirror repository, where the copy relocated them.
    relocated: Vec<String>,
}

/// An App with a tagged imgpkg bundle whose ImagesLock lists two images in other repositories
/// (an image and a two-platform index): re-pinned to the mirror, where the bundle and both
/// images are in the bundle's one repository (fully relocated), byte for byte.
async fn bundle_is_repinned_relocated(
    env: &Env,
    webhook: &LocalWebhook,
    upstream: &SpareRegistry,
    mirror: &SpareRegistry,
) -> Result<BundleApp> {
    let (up, m) = (upstream.addr.as_str(), mirror.addr.as_str());
    let (one_digest, two_digest) = holdfast_e2e::mirror::push_locked_images(up).await?;
    let lock = vec![
        format!("{up}/images/one@{one_digest}"),
        format!("{up}/images/two@{two_digest}"),
    ];
    let config = [image_config("one", &lock[0]), image_config("two", &lock[1])].join("---\n");
    let bundle = Image::bundle(&[("config/app.yml", config.as_bytes())], &lock)?;
    let bundle_digest = images::push(up, "bundles/app", "1.0", &bundle).await?;
    let client = env.client().await?;
    let ns = webhook.namespace("mirror-bundle").await?;
    kapp_controller::add_deployer(env, &ns)?;
    let tag = format!("{up}/bundles/app:1.0");
    let app = app_object("bundle", json!({"imgpkgBundle": {"image": tag}}))?;
    let api = api_for(&client, &app, Some(&ns)).await?;
    api.create(&PostParams::default(), &app).await?;
    let repo = mirrored(up, "bundles/app");
    let expected = format!("{m}/{repo}@{bundle_digest}");
    wait::until(&api, "bundle", move |a: Option<&DynamicObject>| {
        url_of(a).as_deref() == Some(expected.as_str())
    })
    .await?;
    let compared = same_content((up, "bundles/app"), (m, &repo), &bundle_digest).await?;
    ensure!(compared == (1, 2), "bundle: compared {compared:?}");
    let compared = same_content((up, "images/one"), (m, &repo), &one_digest).await?;
    ensure!(compared == (1, 2), "locked image: compared {compared:?}");
    let compared = same_content((up, "images/two"), (m, &repo), &two_digest).await?;
    ensure!(compared == (3, 4), "locked index: compared {compared:?}");
    Ok(BundleApp {
        namespace: ns,
        tag,
        upstream: format!("{up}/bundles/app@{bundle_digest}"),
        mirrored: format!("{m}/{repo}@{bundle_digest}"),
        lock,
        relocated: vec![
            format!("{m}/{repo}@{one_digest}"),
            format!("{m}/{repo}@{two_digest}"),
        ],
    })
}

/// Every request to a registry's API in its access log.
const ANY_REQUEST: &str = " /v2/";

/// The webhook and the controller with `--mirror-registry` (content from `up` copied to `m`) and
/// `--mirror-retention-seconds`: the webhook pins upstream until the controller has recorded a
/// copy, then straight to the mirror.
async fn mirroring(
    env: &Arc<Env>,
    up: &str,
    m: &str,
    retention: Duration,
) -> Result<(LocalWebhook, LocalController)> {
    let pins = MirrorPins::new(MirrorLocation::new(m, PREFIX)?);
    mirroring_with(env, up, pins, None, retention).await
}

/// [`mirroring`] with the mirror's scope (`pins`: namespaces, pull Secret) and, for a mirror
/// that requires credentials, `mirror_user` in the mirror Secret (`--mirror-secret`).
async fn mirroring_with(
    env: &Arc<Env>,
    up: &str,
    pins: MirrorPins,
    mirror_user: Option<(&str, &str)>,
    retention: Duration,
) -> Result<(LocalWebhook, LocalController)> {
    let m = pins.location.registry().to_owned();
    let secret = mirror_user.map(|_| MIRROR_SECRET.to_owned());
    let (registration, settings) = wiring(up, pins, secret, retention);
    let webhook = LocalWebhook::start(env.clone(), registration).await?;
    let controller = async {
        let client = env.client().await?;
        if let Some(user) = mirror_user {
            kube::Api::namespaced(client.clone(), &webhook.system_namespace)
                .create(&PostParams::default(), &basic_secret(MIRROR_SECRET, user))
                .await?;
        }
        LocalController::start_mirroring(
            env,
            client,
            webhook.system_namespace.clone(),
            &[up.to_owned(), m],
            Some(settings),
        )
        .await
    }
    .await;
    match controller {
        Ok(controller) => Ok((webhook, controller)),
        Err(error) => {
            webhook.stop().await?;
            Err(error)
        }
    }
}

/// A bundle whose ImagesLock names an image upstream does not have cannot be fully relocated:
/// the copy fails for good, a `MirrorCopyFailed` Event on the tag's cache entry names the
/// missing image, the App stays pinned upstream, a new App of the tag is admitted upstream too,
/// and the mirror holds no manifest of the bundle (no partial copy to pin to).
async fn a_bundle_with_a_missing_image_is_reported_and_not_mirrored(env: Arc<Env>) -> Result<()> {
    let upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let (webhook, controller) = mirroring(&env, &up, &m, Duration::from_secs(86_400)).await?;
    let result = partial_bundle_scenario(&env, &webhook, &up, &m).await;
    controller.stop().await;
    webhook.stop().await?;
    result
}

async fn partial_bundle_scenario(env: &Env, webhook: &LocalWebhook, up: &str, m: &str) -> Result<()> {
    let present = Image::with_files(&[("present.yml", b"present: 1\n")])?;
    let present_digest = images::push(up, "images/present", "1", &present).await?;
    let missing = format!("{up}/images/missing@{}", images::sha256_digest(b"never pushed"));
    let lock = vec![format!("{up}/images/present@{present_digest}"), missing];
    let bundle = Image::bundle(&[("config/app.yml", b"app: 1\n")], &lock)?;
    let digest = images::push(up, "bundles/partial", "1.0", &bundle).await?;
    let client = env.client().await?;
    let ns = webhook.namespace("mirror-partial").await?;
    let tag = format!("{up}/bundles/partial:1.0");
    let pinned = Some(format!("{up}/bundles/partial@{digest}"));
    let app = app_object("partial", json!({"imgpkgBundle": {"image": tag}}))?;
    let api = api_for(&client, &app, Some(&ns)).await?;
    let created = api.create(&PostParams::default(), &app).await?;
    ensure!(
        url_of(Some(&created)) == pinned,
        "admitted: {:?}",
        url_of(Some(&created))
    );

    let entry = cluster_store::object_name(&CacheKey::tag(&Reference::parse(&tag)?, Scope::Anonymous));
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(
        client.clone(),
        &webhook.system_namespace,
    );
    let failed = kube::runtime::watcher(events, kube::runtime::watcher::Config::default())
        .applied_objects()
        .try_filter(|e| {
            futures::future::ready(
                e.reason.as_deref() == Some("MirrorCopyFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(entry.as_str()),
            )
        });
    let mut failed = std::pin::pin!(failed);
    let event = tokio::time::timeout(wait::DEFAULT_TIMEOUT, failed.try_next())
        .await
        .context("no MirrorCopyFailed Event on the cache entry")??
        .context("the Event watch ended")?;
    let note = event.note.unwrap_or_default();
    ensure!(
        note.contains("images/missing") && note.contains("not retried"),
        "the Event does not name the missing image: {note}"
    );

    ensure!(
        url_of(Some(&api.get("partial").await?)) == pinned,
        "the App left its upstream pin"
    );
    let again = app_object("partial-2", json!({"imgpkgBundle": {"image": tag}}))?;
    let admitted = api.create(&PostParams::default(), &again).await?;
    ensure!(
        url_of(Some(&admitted)) == pinned,
        "a new App of the tag: {:?}",
        url_of(Some(&admitted))
    );
    let repo = mirrored(up, "bundles/partial");
    ensure!(
        images::fetch_raw(m, &repo, "manifests", &digest).await.is_err(),
        "the mirror serves the bundle {m}/{repo}@{digest}"
    );
    Ok(())
}

async fn apps_are_repinned_to_the_mirror_and_sync_without_upstream(env: Arc<Env>) -> Result<()> {
    let mut upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let web = Image::with_files(&[(
        "config/web.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\ndata: {k: v}\n",
    )])?;
    let digest = images::push(&up, "apps/web", "1.0", &web).await?;
    let (webhook, controller) = mirroring(&env, &up, &m, Duration::from_secs(86_400)).await?;
    let result = match bundle_is_repinned_relocated(&env, &webhook, &upstream, &mirror).await {
        Ok(bundle) => repin_and_sync(&env, &webhook, &mut upstream, &mirror, &digest, &bundle).await,
        Err(error) => Err(error),
    };
    controller.stop().await;
    webhook.stop().await?;
    result
}

async fn repin_and_sync(
    env: &Env,
    webhook: &LocalWebhook,
    upstream: &mut SpareRegistry,
    mirror: &SpareRegistry,
    digest: &str,
    bundle: &BundleApp,
) -> Result<()> {
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let client = env.client().await?;
    let ns = webhook.namespace("mirror-pin").await?;
    kapp_controller::add_deployer(env, &ns)?;
    let written = format!("{up}/apps/web:1.0");
    let app = app_object("web", json!({"image": {"url": written}}))?;
    let api = api_for(&client, &app, Some(&ns)).await?;
    let created = api.create(&PostParams::default(), &app).await?;
    ensure!(
        url_of(Some(&created)) == Some(format!("{up}/apps/web@{digest}")),
        "admitted pinned upstream (the copy had not run yet): {:?}",
        url_of(Some(&created))
    );

    // The controller copies, records the copy, and re-pins the App to the mirror.
    let repo = mirrored(&up, "apps/web");
    let location = format!("{m}/{repo}@{digest}");
    let expected = location.clone();
    let repinned = wait::until(&api, "web", move |a: Option<&DynamicObject>| {
        url_of(a).as_deref() == Some(expected.as_str())
    })
    .await?
    .context("the App is gone")?;
    let recorded = original_refs(&repinned)?;
    ensure!(
        recorded["/spec/fetch/0/image/url"]
            == json!({"ref": written, "digest": digest, "mirror": format!("{m}/{repo}")}),
        "original-refs: {recorded}"
    );

    // The copy is recorded on the persisted entry, and `kubectl get hfdigest` shows it.
    let entries = cluster_store::api(client.clone(), &webhook.system_namespace)
        .list(&ListParams::default())
        .await?;
    let entry = entries
        .items
        .iter()
        .find(|e| e.data["spec"]["reference"] == json!(format!("{up}/apps/web:1.0")))
        .context("no cache entry for the tag")?;
    ensure!(
        entry.data["spec"]["mirror"] == json!(location) && entry.data["spec"]["mirroredAt"].is_string(),
        "entry spec: {}",
        entry.data["spec"]
    );
    let table = env
        .kubectl()
        .args(["get", "hfdigest", "-n", &webhook.system_namespace])
        .output()?;
    let table = String::from_utf8_lossy(&table.stdout);
    ensure!(
        table.contains("MIRROR") && table.contains(&location),
        "kubectl get hfdigest:\n{table}"
    );

    // Byte for byte in the mirror.
    let compared = same_content((&up, "apps/web"), (&m, &repo), digest).await?;
    ensure!(compared == (1, 2), "compared {compared:?}");

    // A new App with the same tag, once the webhook's copy of the shared cache has the record, is
    // admitted pinned straight to the mirror.
    until_recorded(webhook, &written, digest).await?;
    let fresh = app_object("web-2", json!({"image": {"url": written}}))?;
    let admitted = api.create(&PostParams::default(), &fresh).await?;
    ensure!(
        url_of(Some(&admitted)) == Some(location.clone()),
        "admitted: {:?}",
        url_of(Some(&admitted))
    );

    // The real kapp-controller from here on: each App's first reconcile has an empty vendir
    // cache (kapp-controller keeps one per App), so its fetch shows where the content is.
    let before = upstream.requests_matching(ANY_REQUEST);
    let from_mirror = mirror.requests_matching(&format!("/v2/{repo}/"));
    env.kapp_controller().await?;
    for name in ["web", "web-2"] {
        kapp_controller::until_reconciled(env, &api, name).await?;
        deployed_image(&client, &ns, &format!("{name}-web")).await?;
    }
    ensure!(
        upstream.requests_matching(ANY_REQUEST) == before,
        "kapp-controller asked the upstream registry"
    );
    ensure!(
        mirror.requests_matching(&format!("/v2/{repo}/")) > from_mirror,
        "kapp-controller did not fetch from the mirror"
    );

    // Upstream down: an App created now is pinned to the mirror from the shared cache and
    // reconciles from it on its first (uncached) fetch.
    upstream.stop();
    let during = app_object("web-3", json!({"image": {"url": written}}))?;
    let admitted = api.create(&PostParams::default(), &during).await?;
    ensure!(
        url_of(Some(&admitted)) == Some(location.clone()),
        "admitted during the outage: {:?}",
        url_of(Some(&admitted))
    );
    kapp_controller::until_reconciled(env, &api, "web-3").await?;
    deployed_image(&client, &ns, "web-3-web").await?;

    // The bundle Apps too, the one re-pinned and one created during the outage: imgpkg finds
    // both locked images in the bundle's mirror repository (fully relocated), so the ImagesLock
    // kbld applies names the mirror, and that is what the deployed ConfigMaps hold.
    let bundles = api_for(&client, &admitted, Some(&bundle.namespace)).await?;
    let during = app_object("bundle-2", json!({"imgpkgBundle": {"image": bundle.tag}}))?;
    let admitted = bundles.create(&PostParams::default(), &during).await?;
    ensure!(
        url_of(Some(&admitted)) == Some(bundle.mirrored.clone()),
        "bundle admitted during the outage: {:?}",
        url_of(Some(&admitted))
    );
    for app in ["bundle", "bundle-2"] {
        kapp_controller::until_reconciled(env, &bundles, app).await?;
        for (config, relocated) in ["one", "two"].iter().zip(&bundle.relocated) {
            let image = deployed_image(&client, &bundle.namespace, &format!("{app}-{config}")).await?;
            ensure!(
                image.as_ref() == Some(relocated),
                "{app}'s ConfigMap {config} names {image:?}, not the relocated {relocated}"
            );
        }
    }
    ensure!(
        upstream.requests_matching(ANY_REQUEST) == before,
        "requests reached the upstream registry"
    );
    apps_pinned_upstream_need_it(env, webhook, &client, upstream, digest, bundle).await
}

/// The converse of the reconciles without upstream, to show they could fail: an image App and
/// the bundle App pinned upstream by digest (opted out of holdfast, so never re-pinned to the
/// mirror) fail while upstream is stopped. Upstream back, they reconcile, with requests in its
/// access log; the bundle upstream is not relocated (its images are in other repositories), so
/// its templates get the ImagesLock as pushed.
async fn apps_pinned_upstream_need_it(
    env: &Env,
    webhook: &LocalWebhook,
    client: &kube::Client,
    upstream: &mut SpareRegistry,
    digest: &str,
    bundle: &BundleApp,
) -> Result<()> {
    let up = upstream.addr.clone();
    let ns = webhook.namespace("upstream-pin").await?;
    kapp_controller::add_deployer(env, &ns)?;
    let apps = [
        app_object(
            "web",
            json!({"image": {"url": format!("{up}/apps/web@{digest}")}}),
        )?,
        app_object("bundle", json!({"imgpkgBundle": {"image": bundle.upstream}}))?,
    ];
    let api = api_for(client, &apps[0], Some(&ns)).await?;
    for mut app in apps {
        app.metadata.labels = Some([(holdfast_pins::PIN_KEY.to_owned(), "disabled".to_owned())].into());
        api.create(&PostParams::default(), &app).await?;
    }
    for app in ["web", "bundle"] {
        until_condition(&api, app, "ReconcileFailed").await?;
    }

    upstream.start().await?;
    // The access log starts anew with the registry.
    let before = upstream.requests_matching(ANY_REQUEST);
    for app in ["web", "bundle"] {
        until_condition(&api, app, "ReconcileSucceeded").await?;
    }
    ensure!(
        upstream.requests_matching(ANY_REQUEST) > before,
        "no request in upstream's access log"
    );
    for (config, locked) in ["one", "two"].iter().zip(&bundle.lock) {
        let image = deployed_image(client, &ns, &format!("bundle-{config}")).await?;
        ensure!(
            image.as_ref() == Some(locked),
            "the upstream bundle's ConfigMap {config} names {image:?}, not {locked}"
        );
    }
    for (app, written) in [
        ("web", format!("{up}/apps/web@{digest}")),
        ("bundle", bundle.upstream.clone()),
    ] {
        let pinned = url_of(Some(&api.get(app).await?));
        ensure!(pinned == Some(written), "{app} moved: {pinned:?}");
    }
    Ok(())
}

/// Waits (on the cache's change channel) until the webhook's copy of the shared cache has the
/// controller's record of the copy of `digest` for the anonymous entry of `tag`.
async fn until_recorded(webhook: &LocalWebhook, tag: &str, digest: &str) -> Result<()> {
    let key = CacheKey::tag(&Reference::parse(tag)?, Scope::Anonymous);
    let held = Digest::parse(digest)?;
    until_webhook_record(webhook, &key, |m| m.is_some_and(|m| m.holds(&held)))
        .await
        .context("the mirror record never reached the webhook's cache")
}

/// Waits (on the cache's change channel, at most 30 s) until the mirror record of `key` in the
/// webhook's copy of the shared cache satisfies `condition`.
async fn until_webhook_record(
    webhook: &LocalWebhook,
    key: &CacheKey,
    condition: impl Fn(Option<Mirrored>) -> bool,
) -> Result<()> {
    let mut changes = webhook.cache.changes();
    tokio::time::timeout(Duration::from_secs(30), async {
        while !condition(webhook.cache.mirrored(key)) {
            if changes.changed().await.is_err() {
                break;
            }
        }
    })
    .await
    .context("timed out")
}

/// The namespace label the selection test selects on.
const MIRROR_LABEL: (&str, &str) = ("holdfast.dev/mirror", "true");

/// The mirror `m` for the namespaces labelled [`MIRROR_LABEL`] only.
fn selected_mirror(m: &str) -> Result<MirrorPins> {
    Ok(MirrorPins {
        namespaces: format!("{}={}", MIRROR_LABEL.0, MIRROR_LABEL.1).parse()?,
        ..MirrorPins::new(MirrorLocation::new(m, PREFIX)?)
    })
}

/// Webhook and controller with `--mirror-namespace-selector holdfast.dev/mirror=true`: the same
/// tagged image in a labelled and an unlabelled namespace. After the copy, the labelled
/// namespace's App is re-pinned to the mirror and a new App there is admitted pinned to it; in
/// the other namespace a new App is admitted pinned upstream and the controller's decision for
/// the first one is to leave it upstream. Unlabelling the namespace would move the pin back.
async fn only_selected_namespaces_are_pinned_to_the_mirror(env: Arc<Env>) -> Result<()> {
    let upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let web = Image::with_files(&[("config/web.yml", b"kind: selected\n")])?;
    let digest = images::push(&up, "apps/selected", "1.0", &web).await?;
    let client = env.client().await?;
    let pins = selected_mirror(&m)?;
    let (webhook, controller) = mirroring_with(&env, &up, pins, None, Duration::from_secs(86_400)).await?;
    let result = selection(&webhook, &controller, &client, &up, &m, &digest).await;
    controller.stop().await;
    webhook.stop().await?;
    result
}

async fn selection(
    webhook: &LocalWebhook,
    controller: &LocalController,
    client: &kube::Client,
    up: &str,
    m: &str,
    digest: &str,
) -> Result<()> {
    let selected = webhook.namespace_labelled("mirror-on", &[MIRROR_LABEL]).await?;
    let other = webhook.namespace("mirror-off").await?;
    let written = format!("{up}/apps/selected:1.0");
    let upstream_pin = format!("{up}/apps/selected@{digest}");
    let mirror_pin = format!("{m}/{}@{digest}", mirrored(up, "apps/selected"));
    let app = app_object("web", json!({"image": {"url": written}}))?;
    let on = api_for(client, &app, Some(&selected)).await?;
    let off = api_for(client, &app, Some(&other)).await?;
    on.create(&PostParams::default(), &app).await?;
    let first_off = off.create(&PostParams::default(), &app).await?;
    ensure!(
        url_of(Some(&first_off)) == Some(upstream_pin.clone()),
        "{:?}",
        url_of(Some(&first_off))
    );

    // The copy is made (public content), and the labelled namespace's App moves to it.
    let expected = mirror_pin.clone();
    wait::until(&on, "web", move |a: Option<&DynamicObject>| {
        url_of(a).as_deref() == Some(expected.as_str())
    })
    .await?;

    // Once the webhook's cache has the record: admitted to the mirror only where selected.
    until_recorded(webhook, &written, digest).await?;
    let second = app_object("web-2", json!({"image": {"url": written}}))?;
    let admitted_on = on.create(&PostParams::default(), &second).await?;
    ensure!(
        url_of(Some(&admitted_on)) == Some(mirror_pin.clone()),
        "selected namespace: {:?}",
        url_of(Some(&admitted_on))
    );
    let admitted_off = off.create(&PostParams::default(), &second).await?;
    ensure!(
        url_of(Some(&admitted_off)) == Some(upstream_pin.clone()),
        "unselected namespace: {:?}",
        url_of(Some(&admitted_off))
    );

    // The controller's decision, from the same cache: the unselected App stays upstream; the
    // selected one, were its namespace unlabelled, would go back upstream.
    let stored = serde_json::to_value(off.get("web").await?)?;
    let none = Default::default();
    let update = controller
        .pinner
        .reconcile(PinnedKind::App, &other, &none, &stored)
        .await?;
    ensure!(
        update.ops.is_empty(),
        "the unselected App would change: {:?}",
        update.ops
    );
    ensure!(url_of(Some(&off.get("web").await?)) == Some(upstream_pin.clone()));
    let stored = serde_json::to_value(on.get("web").await?)?;
    let update = controller
        .pinner
        .reconcile(PinnedKind::App, &selected, &none, &stored)
        .await?;
    let ops = serde_json::to_value(&update.ops)?;
    let back = json!({"op": "replace", "path": "/spec/fetch/0/image/url", "value": upstream_pin});
    ensure!(
        ops.as_array().is_some_and(|ops| ops.contains(&back)),
        "unlabelled, the selected App would get {ops}"
    );
    Ok(())
}

/// Waits until `condition` holds, asking every 200 ms for at most `within`: for a registry,
/// which has no watch.
async fn poll_until<F, Fut>(what: &str, within: Duration, mut condition: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut ticks = tokio::time::interval(Duration::from_millis(200));
    loop {
        ticks.tick().await;
        if condition().await? {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
    }
}

/// The reasons of the Events recorded on the cache entry of `key` in `namespace`.
async fn entry_events(client: &kube::Client, namespace: &str, key: &CacheKey) -> Result<Vec<String>> {
    let name = cluster_store::object_name(key);
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str()))
        .filter_map(|e| e.reason)
        .collect())
}

/// Retention with a 2 s grace: of two Apps pinned to the mirror, the one deleted has its copy
/// deleted from the mirror (HEAD 404) and recorded as deleted on its cache entry, so the
/// webhook stops pinning to it; the other App's copy stays. The tag used again is admitted
/// upstream, copied again and re-pinned to the mirror.
async fn unreferenced_copies_are_deleted_after_the_grace(env: Arc<Env>) -> Result<()> {
    let upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let (webhook, controller) = mirroring(&env, &up, &m, Duration::from_secs(2)).await?;
    let result = retention_scenario(&env, &webhook, &up, &m).await;
    controller.stop().await;
    webhook.stop().await?;
    result
}

async fn retention_scenario(env: &Env, webhook: &LocalWebhook, up: &str, m: &str) -> Result<()> {
    let keep = Image::with_files(&[("keep.yml", b"keep: 1\n")])?;
    let gone = Image::with_files(&[("gone.yml", b"gone: 1\n")])?;
    let keep_digest = images::push(up, "apps/keep", "1.0", &keep).await?;
    let gone_digest = images::push(up, "apps/gone", "1.0", &gone).await?;
    let (keep_repo, gone_repo) = (mirrored(up, "apps/keep"), mirrored(up, "apps/gone"));
    let gone_copy = format!("{m}/{gone_repo}@{gone_digest}");
    let client = env.client().await?;
    let ns = webhook.namespace("mirror-retention").await?;
    let mut api = None;
    for (name, repository, copy) in [
        ("keep", "apps/keep", format!("{m}/{keep_repo}@{keep_digest}")),
        ("gone", "apps/gone", gone_copy.clone()),
    ] {
        let app = app_object(name, json!({"image": {"url": format!("{up}/{repository}:1.0")}}))?;
        let apps = api_for(&client, &app, Some(&ns)).await?;
        apps.create(&PostParams::default(), &app).await?;
        wait::until(&apps, name, move |a: Option<&DynamicObject>| {
            url_of(a).as_deref() == Some(copy.as_str())
        })
        .await?;
        api = Some(apps);
    }
    let api = api.context("no App API")?;
    ensure!(images::head_digest(m, &gone_repo, &gone_digest).await?.is_some());

    // The App goes; 2 s later (and the deletion's settling time) so does its copy.
    let deleted = api.get("gone").await?;
    api.delete("gone", &Default::default()).await?;
    wait::deleted(&api, "gone", &deleted.metadata.uid.context("no uid")?).await?;
    let gone_key = CacheKey::tag(
        &Reference::parse(&format!("{up}/apps/gone:1.0"))?,
        Scope::Anonymous,
    );
    let system = webhook.system_namespace.clone();
    let (c, ns_, key, repo, digest) = (
        &client,
        system.as_str(),
        &gone_key,
        gone_repo.as_str(),
        gone_digest.as_str(),
    );
    poll_until(
        "the unreferenced copy deleted",
        Duration::from_secs(60),
        move || async move {
            Ok(images::head_digest(m, repo, digest).await?.is_none()
                && entry_events(c, ns_, key)
                    .await?
                    .iter()
                    .any(|r| r == "MirrorDeleted"))
        },
    )
    .await?;
    ensure!(
        images::head_digest(m, &keep_repo, &keep_digest).await? == Some(keep_digest.clone()),
        "the copy the other App references was deleted too"
    );
    let reasons = entry_events(&client, &system, &gone_key).await?;
    ensure!(
        reasons.iter().any(|r| r == "MirrorCopied"),
        "Events on the entry: {reasons:?}"
    );

    // The entry records the deletion instead of the copy.
    let entry = cluster_store::api(client.clone(), &system)
        .get(&cluster_store::object_name(&gone_key))
        .await?;
    ensure!(
        entry.data["spec"]["mirrorDeleted"] == json!(gone_copy)
            && entry.data["spec"]["mirrorDeletedAt"].is_string()
            && entry.data["spec"].get("mirror").is_none(),
        "entry spec: {}",
        entry.data["spec"]
    );

    // Once the webhook's cache has it, the tag is admitted upstream, never to the deleted copy;
    // the controller copies it again and moves the App to the new copy.
    until_webhook_record(webhook, &gone_key, |m| m.is_none())
        .await
        .context("the webhook's cache still names the deleted copy")?;
    let again = app_object("again", json!({"image": {"url": format!("{up}/apps/gone:1.0")}}))?;
    let admitted = api.create(&PostParams::default(), &again).await?;
    ensure!(
        url_of(Some(&admitted)) == Some(format!("{up}/apps/gone@{gone_digest}")),
        "admitted: {:?}",
        url_of(Some(&admitted))
    );
    let copy = gone_copy.clone();
    wait::until(&api, "again", move |a: Option<&DynamicObject>| {
        url_of(a).as_deref() == Some(copy.as_str())
    })
    .await?;
    ensure!(
        images::head_digest(m, &gone_repo, &gone_digest).await? == Some(gone_digest.clone()),
        "re-pinned to a copy the mirror does not have"
    );
    Ok(())
}

/// A tag moved upstream, with a 2 s retention grace: the two `follow` Apps pinned to the mirror
/// copy of its old digest stay there until the new digest's copy is recorded, then move straight
/// to it, each with exactly one update (the MODIFIED events of a watch from before the move);
/// the old copy, recorded as superseded on the tag's entry, is then deleted from the mirror
/// (HEAD 404) while the new one stays.
async fn a_moved_tag_moves_follow_apps_once_and_its_old_copy_goes(env: Arc<Env>) -> Result<()> {
    let upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let (webhook, controller) = mirroring(&env, &up, &m, Duration::from_secs(2)).await?;
    let result = moved_tag_scenario(&env, &webhook, &controller, &up, &m).await;
    controller.stop().await;
    webhook.stop().await?;
    result
}

async fn moved_tag_scenario(
    env: &Env,
    webhook: &LocalWebhook,
    controller: &LocalController,
    up: &str,
    m: &str,
) -> Result<()> {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};

    let repo = mirrored(up, "apps/moving");
    let first = Image::with_files(&[("config/app.yml", b"version: 1\n")])?;
    let old_digest = images::push(up, "apps/moving", "1.0", &first).await?;
    let (old_copy, written) = (
        format!("{m}/{repo}@{old_digest}"),
        format!("{up}/apps/moving:1.0"),
    );
    let client = env.client().await?;
    let ns = webhook.namespace("mirror-moved").await?;
    let names = ["first", "second"];
    let mut api = None;
    for name in names {
        let app = app_object(name, json!({"image": {"url": written}}))?;
        let apps = api_for(&client, &app, Some(&ns)).await?;
        apps.create(&PostParams::default(), &app).await?;
        let copy = old_copy.clone();
        wait::until(&apps, name, move |a: Option<&DynamicObject>| {
            url_of(a).as_deref() == Some(copy.as_str())
        })
        .await?;
        api = Some(apps);
    }
    let api = api.context("no App API")?;

    // Every change of the Apps from here on, then the tag moves and the controller refreshes.
    let from = api
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .context("no list resourceVersion")?;
    let mut events = api
        .watch(&WatchParams::default().timeout(120), &from)
        .await?
        .boxed();
    let second = Image::with_files(&[("config/app.yml", b"version: 2\n")])?;
    let new_digest = images::push(up, "apps/moving", "1.0", &second).await?;
    ensure!(new_digest != old_digest, "the tag did not move");
    let new_copy = format!("{m}/{repo}@{new_digest}");
    let report = controller.refresh().await?;
    ensure!(
        report.moved >= 1,
        "the refresh did not see the tag move: {report:?}"
    );

    // The fetch reference of each App after each of its updates, until both hold the new copy.
    let mut updates: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    let arrived = |updates: &BTreeMap<String, Vec<Option<String>>>| {
        names.iter().all(|name| {
            updates
                .get(*name)
                .and_then(|seen| seen.last())
                .is_some_and(|url| url.as_deref() == Some(new_copy.as_str()))
        })
    };
    tokio::time::timeout(Duration::from_secs(90), async {
        while !arrived(&updates) {
            match events.next().await.context("the watch ended")?? {
                WatchEvent::Modified(app) => updates
                    .entry(app.metadata.name.clone().unwrap_or_default())
                    .or_default()
                    .push(url_of(Some(&app))),
                WatchEvent::Error(status) => bail!("watch: {status:?}"),
                _ => {}
            }
        }
        anyhow::Ok(())
    })
    .await
    .with_context(|| format!("the Apps never reached {new_copy}: {updates:?}"))??;
    for name in names {
        ensure!(
            updates.get(name) == Some(&vec![Some(new_copy.clone())]),
            "{name}: one update straight to the new copy expected, got {:?}",
            updates.get(name)
        );
        // And none to come: the controller's decision for the App as stored is no change.
        let stored = serde_json::to_value(api.get(name).await?)?;
        let update = controller
            .pinner
            .reconcile(PinnedKind::App, &ns, &Default::default(), &stored)
            .await?;
        ensure!(
            update.ops.is_empty(),
            "{name} would change again: {:?}",
            update.ops
        );
    }

    // Nothing references the old copy any more: 2 s later (and the deletion's settling time)
    // it is deleted from the mirror; the new one stays.
    let (repo_ref, old_ref) = (repo.as_str(), old_digest.as_str());
    poll_until(
        "the superseded copy deleted",
        Duration::from_secs(60),
        move || async move { Ok(images::head_digest(m, repo_ref, old_ref).await?.is_none()) },
    )
    .await?;
    ensure!(
        images::head_digest(m, &repo, &new_digest).await? == Some(new_digest.clone()),
        "the new copy was deleted too"
    );
    let key = CacheKey::tag(&Reference::parse(&written)?, Scope::Anonymous);
    let entry = cluster_store::api(client.clone(), &webhook.system_namespace)
        .get(&cluster_store::object_name(&key))
        .await?;
    let spec = &entry.data["spec"];
    ensure!(
        spec["mirror"] == json!(new_copy)
            && spec["mirrorDeleted"] == json!(old_copy)
            && spec.get("mirrorSuperseded").is_none(),
        "entry spec: {spec}"
    );
    Ok(())
}

/// A Secret of the shape vendir reads: `username` and `password`.
fn basic_secret(name: &str, (user, password): (&str, &str)) -> k8s_openapi::api::core::v1::Secret {
    k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some(
            [
                ("username".to_string(), user.to_string()),
                ("password".to_string(), password.to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

/// `GET /v2/<repository>/manifests/<digest>` with basic auth (or none): status and body.
async fn manifest_as(
    registry: &str,
    repository: &str,
    digest: &str,
    user: Option<(&str, &str)>,
) -> Result<(u16, Vec<u8>)> {
    let url = format!("http://{registry}/v2/{repository}/manifests/{digest}");
    let mut request = reqwest::Client::new()
        .get(&url)
        .header(reqwest::header::ACCEPT, images::OCI_MANIFEST);
    if let Some((user, password)) = user {
        request = request.basic_auth(user, Some(password));
    }
    let answer = request.send().await?;
    Ok((answer.status().as_u16(), answer.bytes().await?.to_vec()))
}

const PULL_SECRET: &str = "mirror-pull";
const MIRROR_SECRET: &str = "holdfast-mirror";

/// An upstream and a mirror that both require credentials; `--mirror-pull-secret mirror-pull`.
/// Namespace A (with credentials for the private image) gets its App pinned to its own mirror
/// path, `secretRef` pointing at the pull Secret, the user's Secret name kept in
/// original-refs, the manifest in the mirror byte for byte and not readable anonymously.
/// Namespace B, selected too but whose Secret has no access upstream, is never pinned to A's
/// copy: not by the webhook, not by the controller.
async fn a_private_image_is_mirrored_for_its_namespace_only(env: Arc<Env>) -> Result<()> {
    let puller = ("puller", "correct horse battery staple");
    let mirror_user = ("mirror", "tr0ub4dor&3");
    let upstream = env.spare_registry_with_users(&[puller]).await?;
    let mirror = env.spare_registry_with_users(&[mirror_user]).await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let image = Image::with_files(&[("config.yml", b"private: true\n")])?;
    let digest = images::push_as(&up, Some(puller), "team/private", "1.0.0", &image).await?;
    let client = env.client().await?;
    let pins = MirrorPins {
        pull_secret: Some(PULL_SECRET.into()),
        ..selected_mirror(&m)?
    };
    let (webhook, controller) =
        mirroring_with(&env, &up, pins, Some(mirror_user), Duration::from_secs(86_400)).await?;
    let result = private_scenario(
        &webhook,
        &controller,
        &client,
        (&up, puller),
        (&m, mirror_user),
        &digest,
    )
    .await;
    controller.stop().await;
    webhook.stop().await?;
    result
}

async fn private_scenario(
    webhook: &LocalWebhook,
    controller: &LocalController,
    client: &kube::Client,
    (up, puller): (&str, (&str, &str)),
    (m, mirror_user): (&str, (&str, &str)),
    digest: &str,
) -> Result<()> {
    let a = webhook.namespace_labelled("private-a", &[MIRROR_LABEL]).await?;
    let b = webhook.namespace_labelled("private-b", &[MIRROR_LABEL]).await?;
    for (namespace, upstream_user) in [(&a, puller), (&b, ("puller", "wrong"))] {
        let secrets = kube::Api::namespaced(client.clone(), namespace);
        secrets
            .create(
                &PostParams::default(),
                &basic_secret("registry-creds", upstream_user),
            )
            .await?;
        secrets
            .create(&PostParams::default(), &basic_secret(PULL_SECRET, mirror_user))
            .await?;
    }
    let written = format!("{up}/team/private:1.0.0");
    let fetch = json!({"image": {"url": written, "secretRef": {"name": "registry-creds"}}});
    let app = app_object("private", fetch.clone())?;
    let on_a = api_for(client, &app, Some(&a)).await?;
    let on_b = api_for(client, &app, Some(&b)).await?;
    on_a.create(&PostParams::default(), &app).await?;

    // The controller pins upstream with A's Secret, copies with it into A's path, re-pins.
    let repo = format!("{PREFIX}/namespaces/{a}/{}/team/private", host_component(up));
    let expected = format!("{m}/{repo}@{digest}");
    let secret_of = |o: Option<&DynamicObject>| {
        o.and_then(|o| o.data.pointer("/spec/fetch/0/image/secretRef/name"))
            .and_then(|n| n.as_str())
            .map(str::to_owned)
    };
    let wanted = expected.clone();
    let pinned = wait::until(&on_a, "private", move |o: Option<&DynamicObject>| {
        url_of(o).as_deref() == Some(wanted.as_str()) && secret_of(o).as_deref() == Some(PULL_SECRET)
    })
    .await?
    .context("the App is gone")?;
    let recorded = original_refs(&pinned)?;
    ensure!(
        recorded["/spec/fetch/0/image/url"]
            == json!({"ref": written, "digest": digest, "mirror": format!("{m}/{repo}"),
                      "secretRef": "registry-creds", "pullSecret": PULL_SECRET}),
        "original-refs: {recorded}"
    );

    // In the mirror, byte for byte, behind the mirror's credentials; not in the public path.
    let (status, upstream_bytes) = manifest_as(up, "team/private", digest, Some(puller)).await?;
    ensure!(status == 200, "upstream manifest: HTTP {status}");
    let (status, copy) = manifest_as(m, &repo, digest, Some(mirror_user)).await?;
    ensure!(
        status == 200 && copy == upstream_bytes,
        "mirror copy: HTTP {status}"
    );
    let (status, _) = manifest_as(m, &repo, digest, None).await?;
    ensure!(status == 401, "anonymous read of the private copy: HTTP {status}");
    let public = mirrored(up, "team/private");
    let (status, _) = manifest_as(m, &public, digest, Some(mirror_user)).await?;
    ensure!(
        status == 404,
        "the private image is in the public path: HTTP {status}"
    );

    // Once the webhook's cache has A's record, a new App in A is admitted straight to it.
    let key = CacheKey::tag(
        &Reference::parse(&written)?,
        Scope::Secret {
            namespace: a.clone(),
            name: "registry-creds".into(),
        },
    );
    let held = Digest::parse(digest)?;
    until_webhook_record(webhook, &key, |r| r.is_some_and(|r| r.holds(&held)))
        .await
        .context("A's mirror record never reached the webhook's cache")?;
    let second = app_object("private-2", fetch.clone())?;
    let admitted = on_a.create(&PostParams::default(), &second).await?;
    ensure!(
        url_of(Some(&admitted)) == Some(expected.clone())
            && secret_of(Some(&admitted)).as_deref() == Some(PULL_SECRET),
        "A, admitted: {:?} {:?}",
        url_of(Some(&admitted)),
        secret_of(Some(&admitted))
    );

    // B: the same reference and Secret name, no access upstream: admitted as written, and the
    // controller's decision (it asks the registry with B's Secret, which fails) changes nothing.
    let in_b = on_b.create(&PostParams::default(), &app).await?;
    ensure!(
        url_of(Some(&in_b)) == Some(written.clone())
            && secret_of(Some(&in_b)).as_deref() == Some("registry-creds"),
        "B, admitted: {:?} {:?}",
        url_of(Some(&in_b)),
        secret_of(Some(&in_b))
    );
    let labels = [(MIRROR_LABEL.0.to_owned(), MIRROR_LABEL.1.to_owned())].into();
    let update = controller
        .pinner
        .reconcile(PinnedKind::App, &b, &labels, &serde_json::to_value(&in_b)?)
        .await?;
    ensure!(
        update.ops.is_empty() && update.unresolved == 1,
        "B would get {:?} (unresolved {})",
        update.ops,
        update.unresolved
    );
    Ok(())
}

/// The App of a colocated bundle in [`apps_fetched_upstream_keep_reconciling_after_a_repin_to_the_mirror`].
const COLOCATED: &str = "colocated";

/// Apps reconciled from upstream first (kapp-controller's per-App vendir cache warm: it keeps
/// what it fetched by digest), then re-pinned to the mirror when their namespace is selected,
/// with upstream stopped: an image App and a bundle App whose images are in other repositories
/// upstream reconcile from the mirror (the bundle was never cached: not relocated upstream, so
/// imgpkg does not cache it, and its templates now get the mirror's locations). A bundle whose
/// images are in its own repository upstream (as `imgpkg copy` leaves it) was cached with its
/// ImagesLock pointing there, under the digest alone (vendir's cache key): kapp-controller
/// v0.53.1 reconciles the re-pinned App from that cache, and its templates keep the upstream
/// image locations. holdfast cannot change that key (every form of the reference has the same
/// digest), so it says so: a `BundleLocationCached` Warning Event on that App, none on the others,
/// and re-creating the App (a new vendir cache) deploys the mirror's locations.
async fn apps_fetched_upstream_keep_reconciling_after_a_repin_to_the_mirror(env: Arc<Env>) -> Result<()> {
    let mut upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());
    let pins = selected_mirror(&m)?;
    let (webhook, controller) = mirroring_with(&env, &up, pins, None, Duration::from_secs(86_400)).await?;
    let result = warm_cache_scenario(&env, &webhook, &mut upstream, &m).await;
    controller.stop().await;
    webhook.stop().await?;
    result
}

async fn warm_cache_scenario(
    env: &Env,
    webhook: &LocalWebhook,
    upstream: &mut SpareRegistry,
    m: &str,
) -> Result<()> {
    let up = upstream.addr.clone();
    let web = Image::with_files(&[(
        "config/web.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\ndata: {k: v}\n",
    )])?;
    let web_digest = images::push(&up, "apps/warm", "1.0", &web).await?;
    // Spread: the two locked images in repositories of their own.
    let (one, two) = holdfast_e2e::mirror::push_locked_images(&up).await?;
    let spread_lock = [format!("{up}/images/one@{one}"), format!("{up}/images/two@{two}")];
    let spread = Image::bundle(
        &[("config/app.yml", image_config("one", &spread_lock[0]).as_bytes())],
        &spread_lock[..1],
    )?;
    let spread_digest = images::push(&up, "bundles/spread", "1.0", &spread).await?;
    // Colocated: the locked image in the bundle's own repository.
    let locked = Image::with_files(&[("colocated.yml", b"colocated: 1\n")])?;
    let locked_digest = images::push(&up, "bundles/colocated", "image", &locked).await?;
    let colocated_lock = [format!("{up}/bundles/colocated@{locked_digest}")];
    let colocated = Image::bundle(
        &[(
            "config/app.yml",
            image_config("one", &colocated_lock[0]).as_bytes(),
        )],
        &colocated_lock,
    )?;
    let colocated_digest = images::push(&up, "bundles/colocated", "1.0", &colocated).await?;

    // Reconciled from upstream in a namespace the mirror does not select.
    let client = env.client().await?;
    let ns = webhook.namespace("warm-cache").await?;
    kapp_controller::add_deployer(env, &ns)?;
    let apps = [
        (
            "web",
            json!({"image": {"url": format!("{up}/apps/warm:1.0")}}),
            "apps/warm",
            &web_digest,
        ),
        (
            "spread",
            json!({"imgpkgBundle": {"image": format!("{up}/bundles/spread:1.0")}}),
            "bundles/spread",
            &spread_digest,
        ),
        (
            COLOCATED,
            json!({"imgpkgBundle": {"image": format!("{up}/bundles/colocated:1.0")}}),
            "bundles/colocated",
            &colocated_digest,
        ),
    ];
    let mut api = None;
    for (name, fetch, _, _) in &apps {
        let app = app_object(name, fetch.clone())?;
        let apps_api = api_for(&client, &app, Some(&ns)).await?;
        apps_api.create(&PostParams::default(), &app).await?;
        api = Some(apps_api);
    }
    let api = api.context("no App")?;
    env.kapp_controller().await?;
    for (name, _, repository, digest) in &apps {
        let app = kapp_controller::until_reconciled(env, &api, name).await?;
        ensure!(
            url_of(Some(&app)) == Some(format!("{up}/{repository}@{digest}")),
            "{name} not pinned upstream: {:?}",
            url_of(Some(&app))
        );
    }
    let deployed = |app: &str| {
        let name = format!("{app}-one");
        let (client, ns) = (client.clone(), ns.clone());
        async move { deployed_image(&client, &ns, &name).await }
    };
    ensure!(
        deployed("spread").await?.as_ref() == Some(&spread_lock[0]),
        "spread from upstream"
    );
    ensure!(
        deployed(COLOCATED).await?.as_ref() == Some(&colocated_lock[0]),
        "colocated from upstream"
    );

    // The namespace selected: copied, and every App re-pinned to the mirror.
    let namespaces = kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone());
    let label = json!({"metadata": {"labels": {MIRROR_LABEL.0: MIRROR_LABEL.1}}});
    namespaces
        .patch(
            &ns,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&label),
        )
        .await?;
    for (name, _, repository, digest) in &apps {
        let expected = format!("{m}/{}@{digest}", mirrored(&up, repository));
        wait::until(&api, name, move |a: Option<&DynamicObject>| {
            url_of(a).as_deref() == Some(expected.as_str())
        })
        .await
        .with_context(|| format!("{name} not re-pinned to the mirror"))?;
    }

    // Upstream stopped: each App reconciles its new spec (the re-pin) all the same.
    upstream.stop();
    for (name, _, _, _) in &apps {
        kapp_controller::until_reconciled(env, &api, name)
            .await
            .with_context(|| format!("{name} after the re-pin, upstream stopped"))?;
    }
    deployed_image(&client, &ns, "web-web").await?;
    let spread_mirrored = format!("{m}/{}@{one}", mirrored(&up, "bundles/spread"));
    let image = deployed("spread").await?;
    ensure!(
        image.as_ref() == Some(&spread_mirrored),
        "spread: {image:?}, not the mirror's {spread_mirrored} (fetched afresh: never cached)"
    );
    let image = deployed(COLOCATED).await?;
    ensure!(
        image.as_ref() == Some(&colocated_lock[0]),
        "colocated: {image:?}; kapp-controller's cache was expected to keep the upstream location {}",
        colocated_lock[0]
    );

    // holdfast says so on that App only.
    let warned = app_events(&client, &ns, "BundleLocationCached").await?;
    ensure!(warned == [COLOCATED], "BundleLocationCached Events on {warned:?}");

    // Re-created (a new uid, so an empty vendir cache): the mirror's locations.
    let uid = api.get(COLOCATED).await?.metadata.uid.context("no uid")?;
    api.delete(COLOCATED, &Default::default()).await?;
    wait::deleted(&api, COLOCATED, &uid).await?;
    let again = app_object(COLOCATED, apps[2].1.clone())?;
    api.create(&PostParams::default(), &again).await?;
    kapp_controller::until_reconciled(env, &api, COLOCATED).await?;
    let colocated_mirrored = format!("{m}/{}@{locked_digest}", mirrored(&up, "bundles/colocated"));
    let image = deployed(COLOCATED).await?;
    ensure!(
        image.as_ref() == Some(&colocated_mirrored),
        "re-created: {image:?}, not the mirror's {colocated_mirrored}"
    );
    Ok(())
}

/// The names of the Apps in `namespace` with an Event of `reason`.
async fn app_events(client: &kube::Client, namespace: &str, reason: &str) -> Result<Vec<String>> {
    let events = kube::Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let mut names: Vec<String> = events
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

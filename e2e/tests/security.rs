//! The privilege paths of issue 15 on the real kube-apiserver: what a stolen webhook token and a
//! pod that reaches port 8443 can no longer do.
//!
//! - A `DigestCacheEntry` made by hand (as anyone who could write entries could) that names
//!   `secret:<victim>/db-creds` and a registry of the writer's choice: the controller's refresh
//!   neither reads that Secret nor sends anything to that registry.
//! - Forged AdmissionReviews with fresh tags that a registry answers: no entry is persisted, and
//!   the webhook keeps at most `--cache-max-entries` of them in memory.
//! - The controller's fence (`manifests/base/controller/fence.yaml`, item 5), with a token for
//!   holdfast-controller's ServiceAccount: it cannot delete a ConfigMap (even with RBAC granting
//!   it), a pod that is not a Build's build pod, or a kpack Image no Korifi owner names outside a
//!   namespace being deleted; it cannot change an App's `spec.deploy`, labels or other sources;
//!   it can delete a build pod and an app's Image, and send the pin patches the controller
//!   sends. With `components/fast-org-deletion` it can delete a CFSpace only in a namespace being
//!   deleted. Packages, served by kapp-controller's aggregated API, are out of the fence's sight.
//! - The controller's term fence (`manifests/base/controller/term-fence.yaml`, found by the soak):
//!   a controller pod's write is admitted only while that pod holds the Lease.

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use anyhow::{Context, Result, bail, ensure};
use holdfast_cache::{CacheConfig, CacheEntry, CacheKey, Scope, cluster_store};
use holdfast_controller::leader::{
    LEASE,
    crd::{ControllerLease, ControllerLeaseSpec},
};
use holdfast_e2e::{
    Env,
    accounts::{
        CONTROLLER, FENCE, Forbidden, NAMESPACE, TERM_FENCE, client_with_token, install_rbac, kubectl_ok,
        manifests, pod_token, service_account_client, until_refused,
    },
    controller::LocalController,
    e2e_main, images,
    objects::api_for,
    scenarios, wait,
    webhook::{LocalWebhook, Registration, rule},
};
use holdfast_pins::{PinPolicy, PinnedKind, Resolution};
use holdfast_registry::{Digest, Reference};
use k8s_openapi::api::{
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::{ConfigMap, Namespace, Pod, Secret},
};
use kube::{
    Client, ResourceExt,
    api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

e2e_main!(
    a_hand_made_entry_naming_another_namespaces_secret_sends_nothing,
    forged_reviews_with_fresh_tags_persist_nothing,
    the_fence_lets_the_controllers_token_delete_only_what_the_fast_finalizer_deletes,
    the_fence_lets_the_controllers_token_change_only_fetch_references,
    the_fence_lets_the_controllers_token_delete_only_the_pins_it_published,
    with_fast_org_deletion_the_fence_lets_cfspaces_go_only_from_namespaces_being_deleted,
    packages_are_out_of_the_fences_sight,
    the_term_fence_admits_a_controller_pods_writes_only_while_it_holds_the_lease,
    a_tenant_churning_tag_selections_keeps_the_cache_objects_within_their_bound,
);

async fn a_hand_made_entry_naming_another_namespaces_secret_sends_nothing(env: Arc<Env>) -> Result<()> {
    let attacker = env.spare_registry().await?;
    let client = env.client().await?;
    let victim = env.namespace("victim").await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db-creds"},
        "stringData": {"username": "db", "password": "hunter2"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), &victim)
        .create(&PostParams::default(), &secret)
        .await?;
    let controller =
        LocalController::start(&env, client.clone(), std::slice::from_ref(&attacker.addr)).await?;

    // What the webhook's token could create before: an entry for the attacker's registry,
    // resolved "with" the victim's Secret.
    let reference = Reference::parse(&format!("{}/exfil/app:1", attacker.addr))?;
    let now = SystemTime::now();
    let entry = CacheEntry {
        key: CacheKey::tag(
            &reference,
            Scope::Secret {
                namespace: victim.clone(),
                name: "db-creds".into(),
            },
        ),
        digest: Digest::sha256_of(b"planted"),
        tag: None,
        resolved_at: now,
        checked_at: now,
        error: None,
        secret_uid: None,
    };
    let object: DynamicObject =
        serde_json::from_value(serde_json::to_value(cluster_store::to_object(&entry))?)?;
    let entries = cluster_store::api(client.clone(), &controller.namespace);
    entries.create(&PostParams::default(), &object).await?;
    holdfast_e2e::wait::until(
        &entries,
        &cluster_store::object_name(&entry.key),
        |e: Option<&DynamicObject>| e.is_some(),
    )
    .await?;
    // The controller's cache has loaded it; a refresh round must leave it alone.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = attacker.requests_matching("/v2/exfil/");
    let report = controller.refresh().await?;
    let after = attacker.requests_matching("/v2/exfil/");
    ensure!(
        after == before,
        "the controller sent {} request(s) to the entry's registry",
        after - before
    );
    ensure!(report.unnamed >= 1 && report.checked == 0, "{report:?}");
    controller.stop().await;
    Ok(())
}

async fn forged_reviews_with_fresh_tags_persist_nothing(env: Arc<Env>) -> Result<()> {
    const CAP: usize = 3;
    let registry = env.spare_registry().await?;
    let image = images::Image::with_files(&[("config.yml", b"forged: true\n")])?;
    let mut registration = Registration::rules(vec![rule(
        "kappctrl.k14s.io",
        "v1alpha1",
        &["apps"],
        &["CREATE", "UPDATE"],
    )]);
    registration.insecure_registries = vec![registry.addr.clone()];
    registration.cache = CacheConfig {
        max_entries: CAP,
        ..CacheConfig::default()
    };
    let webhook = LocalWebhook::start(env.clone(), registration).await?;
    let http = reqwest::Client::builder()
        // A forged client trusts whatever it reaches; so does this one.
        .danger_accept_invalid_certs(true)
        .build()?;
    for i in 0..10 {
        let tag = format!("fresh-{i}");
        images::push(&registry.addr, "forged/app", &tag, &image).await?;
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": format!("forged-{i}"),
                "kind": {"group": "kappctrl.k14s.io", "version": "v1alpha1", "kind": "App"},
                "resource": {"group": "kappctrl.k14s.io", "version": "v1alpha1", "resource": "apps"},
                "name": "forged", "namespace": "anywhere", "operation": "CREATE",
                "userInfo": {"username": "nobody"},
                "dryRun": i % 2 == 0,
                "object": {
                    "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
                    "metadata": {"name": "forged", "namespace": "anywhere"},
                    "spec": {"fetch": [{"image": {"url": format!("{}/forged/app:{tag}", registry.addr)}}]},
                },
            },
        });
        let answer: serde_json::Value = http
            .post(format!("https://{}/mutate", webhook.addr))
            .json(&review)
            .send()
            .await?
            .json()
            .await?;
        ensure!(answer["response"]["allowed"] == json!(true), "{answer}");
    }
    ensure!(
        webhook.cache.entry_count() <= CAP,
        "the webhook holds {} entries past its cap of {CAP}",
        webhook.cache.entry_count()
    );
    let client = env.client().await?;
    let persisted = cluster_store::api(client, &webhook.system_namespace)
        .list(&ListParams::default())
        .await
        .context("listing digest cache entries")?;
    ensure!(
        persisted.items.is_empty(),
        "forged reviews persisted {} DigestCacheEntry object(s)",
        persisted.items.len()
    );
    webhook.stop().await
}

/// The most a `DigestCacheEntry` object takes as the API server returns it (JSON), metadata and
/// managed fields included: its spec fields are at most `MAX_ENTRY_BYTES`.
const MAX_ENTRY_OBJECT_BYTES: usize = holdfast_cache::MAX_ENTRY_BYTES + 4096;

/// Issue 35: a tenant churning its Apps through ever new tag selections (each a new cache key)
/// grows holdfast's namespace by at most `--cache-max-entries` objects of at most
/// [`MAX_ENTRY_OBJECT_BYTES`] each, whatever it does.
async fn a_tenant_churning_tag_selections_keeps_the_cache_objects_within_their_bound(
    env: Arc<Env>,
) -> Result<()> {
    const CAP: usize = 4;
    const CHURN: usize = 10;
    let registry = env.spare_registry().await?;
    let image = images::Image::with_files(&[("config.yml", b"churn: true\n")])?;
    for patch in 0..3 {
        images::push(&registry.addr, "team/churn", &format!("1.0.{patch}"), &image).await?;
    }
    let client = env.client().await?;
    let cache = CacheConfig {
        max_entries: CAP,
        ..CacheConfig::default()
    };
    let controller =
        LocalController::start_with_cache(&env, client.clone(), std::slice::from_ref(&registry.addr), cache)
            .await?;
    let ns = env.namespace("churn").await?;
    for i in 0..CHURN {
        // Distinct constraints (a key each) that all select 1.0.2.
        let yaml = format!(
            "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: churn-{i}}}\nspec:\n  serviceAccountName: default\n  paused: true\n  fetch:\n  - image: {{url: {}/team/churn, tagSelection: {{semver: {{constraints: '>=1.0.0 <1.0.{}'}}}}}}\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n",
            registry.addr,
            3 + i
        );
        let created = scenarios::create(&client, &ns, &yaml).await?;
        let api = api_for(&client, &created, Some(&ns)).await?;
        wait::until(&api, &created.name_any(), |app: Option<&DynamicObject>| {
            app.and_then(|a| a.data["spec"]["fetch"][0]["image"]["url"].as_str())
                .is_some_and(|url| url.contains("@sha256:"))
        })
        .await?;
        api.delete(&created.name_any(), &DeleteParams::default()).await?;
    }
    let entries = cluster_store::api(client, &controller.namespace)
        .list(&ListParams::default())
        .await
        .context("listing digest cache entries")?;
    let sizes: Vec<usize> = entries
        .items
        .iter()
        .map(|entry| serde_json::to_vec(entry).map(|json| json.len()))
        .collect::<Result<_, _>>()?;
    ensure!(
        sizes.len() <= CAP,
        "{} DigestCacheEntry objects past the cap of {CAP}",
        sizes.len()
    );
    ensure!(
        !sizes.is_empty(),
        "no entry persisted: the churn pinned nothing through the cache"
    );
    let (largest, total) = (
        sizes.iter().max().copied().unwrap_or(0),
        sizes.iter().sum::<usize>(),
    );
    ensure!(
        largest <= MAX_ENTRY_OBJECT_BYTES,
        "a DigestCacheEntry of {largest} bytes, past {MAX_ENTRY_OBJECT_BYTES}"
    );
    eprintln!(
        "{CHURN} tag selections churned: {} entries, {total} bytes in all (bound {}), largest {largest}",
        sizes.len(),
        CAP * MAX_ENTRY_OBJECT_BYTES
    );
    controller.stop().await;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The controller's fence

/// holdfast's RBAC and the base's fence, installed once for the whole binary: the tests run at
/// the same time, and one of them swaps the fence for `components/fast-org-deletion`'s for a
/// while, which another test's install must not undo.
async fn fenced(env: &Env) -> Result<()> {
    static INSTALLED: tokio::sync::OnceCell<Result<(), String>> = tokio::sync::OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async { install_rbac(env).await.map_err(|e| format!("{e:#}")) })
        .await
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The controller's ServiceAccount, as the RBAC authorizer and the fence know it.
fn controller_user() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{CONTROLLER}")
}

/// `result` is the fence's refusal: 403, naming the policy.
fn refused_by_fence<T>(what: &str, result: kube::Result<T>) -> Result<String> {
    match result {
        Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(FENCE) => Ok(e.message),
        Err(e) => bail!("{what}: refused, but not by {FENCE}: {e}"),
        Ok(_) => bail!("{what}: the controller's token was let through"),
    }
}

/// Whether RBAC lets the controller's ServiceAccount `verb` `resource` in `namespace`.
async fn rbac_allows(
    client: &Client,
    verb: &str,
    (group, resource): (&str, &str),
    namespace: &str,
) -> Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(controller_user()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{NAMESPACE}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                group: Some(group.into()),
                resource: Some(resource.into()),
                namespace: Some(namespace.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// A Role of the test's own granting the controller `delete configmaps` in `namespace`, so that
/// only the fence stands between its token and a ConfigMap; returns once RBAC says so (the
/// authorizer follows roles through its own watch: a bounded poll, as there is nothing to watch).
async fn grant_configmap_deletes(env: &Env, client: &Client, namespace: &str) -> Result<()> {
    env.kubectl_apply(
        namespace,
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: test-only-delete-configmaps}}\nrules: [{{apiGroups: [\"\"], resources: [configmaps], verbs: [delete]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: test-only-delete-configmaps}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: test-only-delete-configmaps}}\nsubjects: [{{kind: ServiceAccount, name: {CONTROLLER}, namespace: {NAMESPACE}}}]\n"
        ),
    )?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !rbac_allows(client, "delete", ("", "configmaps"), namespace).await? {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "RBAC still refuses the controller's delete of configmaps in {namespace}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn the_fence_lets_the_controllers_token_delete_only_what_the_fast_finalizer_deletes(
    env: Arc<Env>,
) -> Result<()> {
    fenced(&env).await?;
    let admin = env.client().await?;
    let controller = service_account_client(&env, CONTROLLER, &Forbidden::new()).await?;
    let namespace = env.namespace("fence-deletes").await?;
    grant_configmap_deletes(&env, &admin, &namespace).await?;

    let configmap: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "settings"}}))?;
    Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &configmap)
        .await?;
    let app = scenarios::create(&admin, &namespace, &scenarios::cfapp("app")).await?;
    let korifis = scenarios::create(&admin, &namespace, &scenarios::image_owned_by("app", &app)?).await?;
    let loose = scenarios::create(&admin, &namespace, &scenarios::kpack_image("loose")).await?;
    let build = scenarios::create(
        &admin,
        &namespace,
        &scenarios::kpack_build("loose-build-1", &loose)?,
    )
    .await?;
    let build_pod = scenarios::create(
        &admin,
        &namespace,
        &scenarios::build_pod("loose-build-1-pod", &build)?,
    )
    .await?;
    scenarios::create(
        &admin,
        &namespace,
        &scenarios::labelled_pod("decoy", "loose-build-1"),
    )
    .await?;
    let plain = scenarios::labelled_pod("plain", "x").replace(", labels: {kpack.io/build: x}", "");
    scenarios::create(&admin, &namespace, &plain).await?;

    // Refused: RBAC grants each of these (the ConfigMap by the test's Role); the fence does not.
    let configmaps = Api::<ConfigMap>::namespaced(controller.clone(), &namespace);
    let message = refused_by_fence(
        "a ConfigMap",
        configmaps.delete("settings", &DeleteParams::default()).await,
    )?;
    ensure!(message.contains("configmaps"), "{message}");
    let pods = Api::<Pod>::namespaced(controller.clone(), &namespace);
    refused_by_fence(
        "an unlabelled pod",
        pods.delete("plain", &DeleteParams::default()).await,
    )?;
    refused_by_fence(
        "a pod that only carries the kpack.io/build label",
        pods.delete("decoy", &DeleteParams::default()).await,
    )?;
    let images = api_for(&controller, &loose, Some(&namespace)).await?;
    refused_by_fence(
        "a kpack Image no CFApp or BuildWorkload owns, in a live namespace",
        images.delete("loose", &DeleteParams::default()).await,
    )?;
    // A leaf of a CFApp's tree goes through its parent's hop: a BuildWorkload controlled by a
    // CFBuild may go, one labelled for the app but controlled by the CFApp itself may not.
    let korifi_child = |kind: &str, name: &str, owner: &DynamicObject, spec: String| {
        scenarios::korifi_child(kind, name, "app", owner, &spec)
    };
    let cf_build = scenarios::create(
        &admin,
        &namespace,
        &korifi_child(
            "CFBuild",
            "app-build",
            &app,
            scenarios::korifi_specs::build("app"),
        )?,
    )
    .await?;
    let leaf = scenarios::create(
        &admin,
        &namespace,
        &korifi_child(
            "BuildWorkload",
            "app-build",
            &cf_build,
            scenarios::korifi_specs::build_workload("app-build"),
        )?,
    )
    .await?;
    let hopless = scenarios::create(
        &admin,
        &namespace,
        &korifi_child(
            "BuildWorkload",
            "skips-a-hop",
            &app,
            scenarios::korifi_specs::build_workload("app-build"),
        )?,
    )
    .await?;
    let workloads = api_for(&controller, &leaf, Some(&namespace)).await?;
    refused_by_fence(
        "a BuildWorkload no CFBuild controls",
        workloads.delete("skips-a-hop", &DeleteParams::default()).await,
    )?;
    workloads
        .delete("app-build", &DeleteParams::default())
        .await
        .context("the fence refused the delete of a CFBuild's BuildWorkload")?;

    // Let through: the build pod of a Build (grace 0, as the finalizer deletes it), the Image of
    // a CFApp.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete(&build_pod.name_any(), &now)
        .await
        .context("the fence refused the delete of a build pod")?;
    wait::deleted(
        &Api::<Pod>::namespaced(admin.clone(), &namespace),
        &build_pod.name_any(),
        &build_pod.uid().context("no uid")?,
    )
    .await?;
    images
        .delete(&korifis.name_any(), &DeleteParams::default())
        .await
        .context("the fence refused the delete of a CFApp's kpack Image")?;
    ensure!(
        Api::<ConfigMap>::namespaced(admin.clone(), &namespace)
            .get_opt("settings")
            .await?
            .is_some(),
        "ConfigMap settings is gone"
    );
    for name in ["plain", "decoy"] {
        ensure!(
            Api::<Pod>::namespaced(admin.clone(), &namespace)
                .get_opt(name)
                .await?
                .is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
            "pod {name} is being deleted"
        );
    }

    // Once its namespace is being deleted, any kpack Image in it may go (NAMESPACE_IMAGE).
    let held = scenarios::kpack_image("held").replace(
        "metadata: {name: held}",
        &format!("metadata: {{name: held, finalizers: [{}]}}", scenarios::HOLD),
    );
    let held = scenarios::create(&admin, &namespace, &held).await?;
    refused_by_fence(
        "an Image in a live namespace",
        images.delete("held", &DeleteParams::default()).await,
    )?;
    for object in [&app, &build, &cf_build, &leaf, &hopless] {
        scenarios::release(&admin, &namespace, object).await?;
    }
    // The finalizer's nudge: the token may annotate a namespace only while it is being deleted.
    let nudge =
        json!({"metadata": {"annotations": {holdfast_controller::finalizer::NUDGE_ANNOTATION: "now"}}});
    let as_controller = Api::<Namespace>::all(controller.clone());
    refused_by_fence(
        "the nudge of a live namespace",
        as_controller
            .patch(&namespace, &PatchParams::default(), &Patch::Merge(&nudge))
            .await,
    )?;
    let namespaces = Api::<Namespace>::all(admin.clone());
    namespaces.delete(&namespace, &DeleteParams::default()).await?;
    wait::until(&namespaces, &namespace, |n: Option<&Namespace>| {
        n.is_some_and(|n| n.metadata.deletion_timestamp.is_some())
    })
    .await?;
    // The API server's own namespace cache, which the policy reads, follows a moment later.
    let dry_run = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let held_now = api_for(&admin, &held, Some(&namespace)).await?;
    loop {
        // An object already being deleted is deleted again without admission: had the namespace
        // controller come first (its first pass is 5 s after the namespace's deletion), a
        // success here would show nothing.
        ensure!(
            held_now.get("held").await?.metadata.deletion_timestamp.is_none(),
            "the namespace controller deleted the Image before the fence was asked"
        );
        match images.delete("held", &dry_run).await {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(FENCE) => ensure!(
                tokio::time::Instant::now() < deadline,
                "the fence still refuses the Image of a namespace being deleted: {}",
                e.message
            ),
            Err(e) => return Err(e).context("deleting the Image of a namespace being deleted"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Being deleted: the nudge is let through, another annotation is not.
    as_controller
        .patch(&namespace, &PatchParams::default(), &Patch::Merge(&nudge))
        .await
        .context("the fence refused the nudge of a namespace being deleted")?;
    let other = json!({"metadata": {"annotations": {"example.com/other": "x"}}});
    refused_by_fence(
        "another annotation on a namespace being deleted",
        as_controller
            .patch(&namespace, &PatchParams::default(), &Patch::Merge(&other))
            .await,
    )?;
    scenarios::release(&admin, &namespace, &held).await
}

/// An App as a tenant writes one: a `tagSelection` with a `secretRef`, a bundle by tag, a git
/// source, and labels and annotations of its own.
fn tenant_app(registry: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata:\n  name: app\n  labels: {{team: a}}\n  annotations: {{team.example/owner: a}}\nspec:\n  serviceAccountName: default\n  paused: true\n  fetch:\n  - image: {{url: {registry}/team/config, secretRef: {{name: creds}}, tagSelection: {{semver: {{constraints: '>=1.0.0'}}}}}}\n  - imgpkgBundle: {{image: '{registry}/team/bundle:1.0.0'}}\n  - git: {{url: 'https://git.example/team/config', ref: main}}\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

/// Pins the object `name` of `api` as the controller does (`controller/src/pinning.rs`): the
/// JSON patch from what it holds to what it should hold, guarded by its resourceVersion, with
/// holdfast's field manager. `read` stands for the controller's watch (it may not `get`); read
/// again and retried when the guard fails because someone else (kapp-controller) wrote the
/// object in between.
async fn pin_as_the_controller(
    read: &Api<DynamicObject>,
    api: &Api<DynamicObject>,
    kind: PinnedKind,
    name: &str,
    resolutions: &[(usize, Resolution)],
) -> Result<DynamicObject> {
    let params = PatchParams {
        field_manager: Some(holdfast_controller::pinning::MANAGER.into()),
        ..Default::default()
    };
    for _ in 0..5 {
        let stored = serde_json::to_value(read.get(name).await?)?;
        let sites = holdfast_pins::fetch_sites(kind, &stored);
        let outcome = holdfast_pins::pin_patch(&stored, &sites, resolutions, PinPolicy::Follow);
        ensure!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
        let mut desired = stored.clone();
        json_patch::patch(&mut desired, &outcome.ops)?;
        let ops = holdfast_pins::repin::update(&stored, &desired);
        ensure!(ops.len() > 2, "nothing to pin: {ops:?}");
        match api
            .patch(name, &params, &Patch::Json::<()>(json_patch::Patch(ops)))
            .await
        {
            Ok(pinned) => return Ok(pinned),
            Err(kube::Error::Api(e))
                if e.code == 422 && e.details.as_ref().is_none_or(|d| d.causes.is_empty()) => {}
            Err(e) => return Err(e).with_context(|| format!("pinning {name} with the controller's token")),
        }
    }
    bail!("{name} kept changing under the controller's pin patch")
}

/// The pinning policy's parameters: RBAC lets the controller delete any `DigestPins` and
/// `ClusterDigestPins` (its publisher deletes those no longer wanted); the fence only those it
/// published, labelled `app.kubernetes.io/managed-by: holdfast-controller`.
async fn the_fence_lets_the_controllers_token_delete_only_the_pins_it_published(env: Arc<Env>) -> Result<()> {
    use holdfast_pins::policy_params::crd::{ClusterDigestPins, DigestPins, MANAGED_BY, MANAGED_LABEL};
    fenced(&env).await?;
    let admin = env.client().await?;
    let controller = service_account_client(&env, CONTROLLER, &Forbidden::new()).await?;
    let namespace = env.namespace("fence-pins").await?;
    let suffix = namespace.rsplit('-').next().unwrap_or_default().to_owned();
    let labelled =
        |published: bool| published.then(|| [(MANAGED_LABEL.to_owned(), MANAGED_BY.to_owned())].into());
    for published in [false, true] {
        let name = if published { "published" } else { "foreign" };
        let mut pins = DigestPins::new(name, Default::default());
        pins.metadata.labels = labelled(published);
        Api::<DigestPins>::namespaced(admin.clone(), &namespace)
            .create(&PostParams::default(), &pins)
            .await?;
        let mut pins = ClusterDigestPins::new(&format!("{name}-{suffix}"), Default::default());
        pins.metadata.labels = labelled(published);
        Api::<ClusterDigestPins>::all(admin.clone())
            .create(&PostParams::default(), &pins)
            .await?;
    }
    let private = Api::<DigestPins>::namespaced(controller.clone(), &namespace);
    let cluster = Api::<ClusterDigestPins>::all(controller);
    refused_by_fence(
        "a DigestPins it did not publish",
        private.delete("foreign", &DeleteParams::default()).await,
    )?;
    refused_by_fence(
        "a ClusterDigestPins it did not publish",
        cluster
            .delete(&format!("foreign-{suffix}"), &DeleteParams::default())
            .await,
    )?;
    private
        .delete("published", &DeleteParams::default())
        .await
        .context("the fence refused the delete of a DigestPins the controller published")?;
    cluster
        .delete(&format!("published-{suffix}"), &DeleteParams::default())
        .await
        .context("the fence refused the delete of a ClusterDigestPins the controller published")?;
    Api::<ClusterDigestPins>::all(admin)
        .delete(&format!("foreign-{suffix}"), &DeleteParams::default())
        .await?;
    Ok(())
}

async fn the_fence_lets_the_controllers_token_change_only_fetch_references(env: Arc<Env>) -> Result<()> {
    fenced(&env).await?;
    let admin = env.client().await?;
    let controller = service_account_client(&env, CONTROLLER, &Forbidden::new()).await?;
    let namespace = env.namespace("fence-patches").await?;
    let registry = env.cluster_registry();
    let app = scenarios::create(&admin, &namespace, &tenant_app(registry)).await?;
    let apps = api_for(&controller, &app, Some(&namespace)).await?;
    let params = PatchParams::default();

    // Refused: anything but the fetch references, whatever kind of patch.
    for (what, patch) in [
        (
            "spec.deploy",
            json!({"spec": {"deploy": [{"kapp": {"rawOptions": ["--apply-ignored=true"]}}]}}),
        ),
        (
            "a label",
            json!({"metadata": {"labels": {"holdfast.dev/pin": "disabled"}}}),
        ),
        (
            "another annotation",
            json!({"metadata": {"annotations": {"team.example/owner": "b"}}}),
        ),
        (
            "spec.serviceAccountName",
            json!({"spec": {"serviceAccountName": "cluster-admin"}}),
        ),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/block"]}}),
        ),
    ] {
        refused_by_fence(what, apps.patch("app", &params, &Patch::Merge(&patch)).await)?;
    }
    for (what, ops) in [
        (
            "a git source",
            json!([{"op": "replace", "path": "/spec/fetch/2/git/ref", "value": "evil"}]),
        ),
        (
            "a new fetch entry",
            json!([{"op": "add", "path": "/spec/fetch/-", "value": {"image": {"url": "evil.example/x"}}}]),
        ),
        (
            "a secretRef where there was none",
            json!([{"op": "add", "path": "/spec/fetch/1/imgpkgBundle/secretRef", "value": {"name": "other"}}]),
        ),
    ] {
        let ops: json_patch::Patch = serde_json::from_value(ops)?;
        refused_by_fence(what, apps.patch("app", &params, &Patch::Json::<()>(ops)).await)?;
    }

    // Let through: the controller's own pin patch, here to a mirror copy, which rewrites a
    // reference, the secretRef's name (the mirror's pull Secret), removes the tagSelection, pins
    // the bundle upstream and records holdfast.dev/original-refs.
    let digest = |seed: &str| Digest::sha256_of(seed.as_bytes());
    let mirror = format!(
        "mirror.example/{}",
        holdfast_registry::mirror::MirrorLocation::new("mirror.example", "holdfast")?
            .repository_for(&Reference::parse(&format!("{registry}/team/config"))?)?
    );
    let resolutions = [
        (
            0,
            Resolution {
                digest: digest("config"),
                selected_tag: Some("1.2.0".into()),
                mirror: Some(mirror.clone()),
                pull_secret: Some("mirror-pull".into()),
            },
        ),
        (
            1,
            Resolution {
                digest: digest("bundle"),
                selected_tag: None,
                mirror: None,
                pull_secret: None,
            },
        ),
    ];
    let pinned = pin_as_the_controller(
        &api_for(&admin, &app, Some(&namespace)).await?,
        &apps,
        PinnedKind::App,
        "app",
        &resolutions,
    )
    .await?;
    let image = &pinned.data["spec"]["fetch"][0]["image"];
    ensure!(
        image["url"] == json!(format!("{mirror}@{}", digest("config")))
            && image["secretRef"]["name"] == "mirror-pull"
            && image.get("tagSelection").is_none(),
        "not pinned to {mirror}@{}: {image}",
        digest("config")
    );
    ensure!(
        pinned
            .annotations()
            .contains_key(holdfast_pins::ORIGINAL_REFS_ANNOTATION),
        "no {} annotation",
        holdfast_pins::ORIGINAL_REFS_ANNOTATION
    );

    // A PackageRepository: its one fetch entry, pinned; its syncPeriod, refused.
    let repository = scenarios::create(
        &admin,
        &namespace,
        &format!(
            "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageRepository\nmetadata: {{name: repo}}\nspec:\n  syncPeriod: 10m\n  fetch: {{imgpkgBundle: {{image: '{registry}/team/repo:1.0.0'}}}}\n"
        ),
    )
    .await?;
    let repositories = api_for(&controller, &repository, Some(&namespace)).await?;
    refused_by_fence(
        "a PackageRepository's syncPeriod",
        repositories
            .patch(
                "repo",
                &params,
                &Patch::Merge(json!({"spec": {"syncPeriod": "1s"}})),
            )
            .await,
    )?;
    let resolution = [(
        0,
        Resolution {
            digest: digest("repo"),
            selected_tag: None,
            mirror: None,
            pull_secret: None,
        },
    )];
    let pinned = pin_as_the_controller(
        &api_for(&admin, &repository, Some(&namespace)).await?,
        &repositories,
        PinnedKind::PackageRepository,
        "repo",
        &resolution,
    )
    .await?;
    ensure!(
        pinned.data["spec"]["fetch"]["imgpkgBundle"]["image"]
            == json!(format!("{registry}/team/repo@{}", digest("repo"))),
        "not pinned: {}",
        pinned.data["spec"]["fetch"]
    );
    Ok(())
}

/// kube-apiserver proxies `data.packaging.carvel.dev` to kapp-controller's aggregated API server
/// without admission, and that server stores each Package as an InternalPackage with its own
/// credentials (and runs no policies: its k8s.io/apiserver v0.27 has the plugin gated off): no
/// ValidatingAdmissionPolicy sees who changed a Package. The controller's token changes a
/// Package's `spec.template.spec.deploy`, which the fence refuses on an App. SECURITY.md states
/// this gap; this test fails when it closes.
async fn packages_are_out_of_the_fences_sight(env: Arc<Env>) -> Result<()> {
    env.kapp_controller().await?;
    fenced(&env).await?;
    let admin = env.client().await?;
    let controller = service_account_client(&env, CONTROLLER, &Forbidden::new()).await?;
    let namespace = env.namespace("fence-packages").await?;
    let package = scenarios::create(
        &admin,
        &namespace,
        &format!(
            "apiVersion: data.packaging.carvel.dev/v1alpha1\nkind: Package\nmetadata: {{name: pkg.example.com.1.0.0}}\nspec:\n  refName: pkg.example.com\n  version: 1.0.0\n  template:\n    spec:\n      fetch: [{{imgpkgBundle: {{image: '{}/team/pkg:1.0.0'}}}}]\n      template: [{{ytt: {{}}}}]\n      deploy: [{{kapp: {{}}}}]\n",
            env.cluster_registry()
        ),
    )
    .await?;
    let packages = api_for(&controller, &package, Some(&namespace)).await?;
    let deploy = json!([{"kapp": {"rawOptions": ["--apply-ignored=true"]}}]);
    let patched = packages
        .patch(
            &package.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"deploy": deploy}}}})),
        )
        .await
        .context("the controller's token could not change a Package's deploy: is the fence seeing Packages now? Update SECURITY.md")?;
    ensure!(
        patched.data["spec"]["template"]["spec"]["deploy"] == deploy,
        "{:?}",
        patched.data["spec"]
    );
    Ok(())
}

/// `components/fast-org-deletion`'s fence (the base's with the CFSpace row) and its RBAC, as
/// kustomize renders the base with it, each as YAML for `kubectl apply`.
fn fast_org_deletion() -> Result<(String, String)> {
    let scratch = tempfile::tempdir()?;
    let copy = std::process::Command::new("cp")
        .arg("-r")
        .arg(manifests())
        .arg(scratch.path().join("manifests"))
        .status()?;
    ensure!(copy.success(), "copying manifests/");
    std::fs::write(
        scratch.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [manifests/base]\ncomponents: [manifests/components/fast-org-deletion]\n",
    )?;
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(scratch.path())
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl kustomize: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut fence, mut rbac) = (Vec::new(), Vec::new());
    for object in holdfast_e2e::objects::parse_documents(&String::from_utf8(out.stdout)?)? {
        let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        if kind.starts_with("ValidatingAdmissionPolicy") && object.name_any() == FENCE {
            fence.push(serde_yaml::to_string(&object)?);
        } else if kind.starts_with("ClusterRole") && object.name_any() == "holdfast-controller-cfspaces" {
            rbac.push(serde_yaml::to_string(&object)?);
        }
    }
    ensure!(
        fence.len() == 2 && rbac.len() == 2,
        "the component renders {fence:?} and {rbac:?}"
    );
    Ok((fence.join("---\n"), rbac.join("---\n")))
}

/// Deletes `namespace` and waits until the API server shows it being deleted.
async fn start_deleting(namespaces: &Api<Namespace>, namespace: &str) -> Result<()> {
    namespaces.delete(namespace, &DeleteParams::default()).await?;
    wait::until(namespaces, namespace, |n: Option<&Namespace>| {
        n.is_some_and(|n| n.metadata.deletion_timestamp.is_some())
    })
    .await
    .map(drop)
}

/// The base's fence refuses every CFSpace delete, even in a namespace being deleted and with the
/// component's RBAC granted; with the component's fence, the controller's token may delete the
/// CFSpace of a namespace being deleted and still not one of a live namespace.
async fn with_fast_org_deletion_the_fence_lets_cfspaces_go_only_from_namespaces_being_deleted(
    env: Arc<Env>,
) -> Result<()> {
    fenced(&env).await?;
    let (fence, rbac) = fast_org_deletion()?;
    let admin = env.client().await?;
    let controller = service_account_client(&env, CONTROLLER, &Forbidden::new()).await?;
    let (live, org_before, org_after) = (
        env.namespace("fence-org-live").await?,
        env.namespace("fence-org-base").await?,
        env.namespace("fence-org").await?,
    );
    let mut spaces = Vec::new();
    for namespace in [&live, &org_before, &org_after] {
        spaces.push((
            namespace.clone(),
            scenarios::create(&admin, namespace, &scenarios::cfspace("space")).await?,
        ));
    }
    env.kubectl_apply_with(&[], &rbac)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !rbac_allows(&admin, "delete", ("korifi.cloudfoundry.org", "cfspaces"), &live).await? {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "RBAC still refuses the controller's CFSpace deletes"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dry_run = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    let namespaces = Api::<Namespace>::all(admin.clone());
    let cfspaces = kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "korifi.cloudfoundry.org",
        "v1alpha1",
        "CFSpace",
    ));
    let spaces_in =
        |namespace: &str| Api::<DynamicObject>::namespaced_with(controller.clone(), namespace, &cfspaces);

    start_deleting(&namespaces, &org_before).await?;
    let base_refusal = refused_by_fence(
        "a CFSpace of a namespace being deleted, behind the base's fence",
        spaces_in(&org_before).delete("space", &dry_run).await,
    );

    env.kubectl_apply_with(&[], &fence)?;
    start_deleting(&namespaces, &org_after).await?;
    // The API server loads the changed policy and the namespace's deletion through its own
    // watches: a bounded poll of dry runs until the org's space may go.
    let held = api_for(&admin, &spaces[2].1, Some(&org_after)).await?;
    let in_org = spaces_in(&org_after);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let allowed = loop {
        // An object already being deleted is deleted again without admission (see above).
        ensure!(
            held.get("space").await?.metadata.deletion_timestamp.is_none(),
            "the namespace controller deleted the CFSpace before the fence was asked"
        );
        match in_org.delete("space", &dry_run).await {
            Ok(_) => break Ok(()),
            Err(kube::Error::Api(e))
                if e.code == 403 && e.message.contains(FENCE) && tokio::time::Instant::now() < deadline => {}
            Err(e) => {
                break Err(e)
                    .context("the CFSpace of a namespace being deleted, behind the component's fence");
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let live_refusal = refused_by_fence(
        "a CFSpace of a live namespace, behind the component's fence",
        spaces_in(&live).delete("space", &dry_run).await,
    );

    // Back to the base: its fence for the other tests, without the component's RBAC.
    env.kubectl_apply_with(
        &[],
        &std::fs::read_to_string(manifests().join("base/controller/fence.yaml"))?,
    )?;
    let out = env
        .kubectl()
        .args([
            "delete",
            "clusterrole,clusterrolebinding",
            "holdfast-controller-cfspaces",
        ])
        .output()?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for (namespace, space) in &spaces {
        scenarios::release(&admin, namespace, space).await?;
    }
    base_refusal?;
    allowed?;
    live_refusal.map(drop)
}

// ---------------------------------------------------------------------------------------------
// The controller's term fence

/// What the soak found (issue 33): a lost leader's digest cache apply, held by a stalled link,
/// reached the API server after its successor had taken the lease, and was written. The term
/// fence admits a write of a holdfast-controller pod only while that pod holds the
/// ControllerLease. Two placeholder pods' tokens stand for two replicas' projected tokens.
/// Without a lease everything passes, an admin's writes included. A takes the lease (the
/// election's own writes pass); B's apply of a cache entry (a dry run) is refused, naming both,
/// and A's passes; B takes over, and from then on A's is refused and B's passes. A token bound
/// to no pod is not a replica's: the term fence leaves it alone. Then an uninstall and reinstall
/// of the fence, with the lease changing hands while no binding names its kind (what froze the
/// API server's informer behind a built-in parameter kind, kubernetes/kubernetes#130887): the
/// reinstalled fence judges against the lease as it is now.
async fn the_term_fence_admits_a_controller_pods_writes_only_while_it_holds_the_lease(
    env: Arc<Env>,
) -> Result<()> {
    fenced(&env).await?;
    let lifetime = Duration::from_secs(600);
    let replica = |pod: &'static str| {
        let env = env.clone();
        async move {
            let token = pod_token(&env, CONTROLLER, pod, lifetime).await?;
            client_with_token(&env, &token, &Forbidden::new()).await
        }
    };
    let (a, b) = ("term-replica-a", "term-replica-b");
    // No lease yet: the admin's pod creates for the tokens pass (the API server resolves the
    // binding's parameter for every write before any condition: a fence that refused without
    // it refused these too).
    let (client_a, client_b) = (replica(a).await?, replica(b).await?);

    let reference = Reference::parse(&format!("{}/term/app:1", env.registry()))?;
    let now = SystemTime::now();
    let entry = CacheEntry {
        key: CacheKey::tag(&reference, Scope::Anonymous),
        digest: Digest::sha256_of(b"term"),
        tag: None,
        resolved_at: now,
        checked_at: now,
        error: None,
        secret_uid: None,
    };
    let object = cluster_store::to_object(&entry);
    let name = cluster_store::object_name(&entry.key);
    // The digest cache's own write, as the controller's sink sends it, as a dry run.
    let apply = |client: &Client| {
        let (entries, object, name) = (
            cluster_store::api(client.clone(), NAMESPACE),
            object.clone(),
            name.clone(),
        );
        async move {
            let params = PatchParams::apply(cluster_store::FIELD_MANAGER).force().dry_run();
            entries.patch(&name, &params, &Patch::Apply(&object)).await
        }
    };
    // Takes the lease for `holder` with `client`, as the election writes it.
    let take = |client: &Client, holder: &'static str| {
        let leases = Api::<ControllerLease>::namespaced(client.clone(), NAMESPACE);
        async move {
            let mut lease = leases
                .get_opt(LEASE)
                .await?
                .unwrap_or_else(|| ControllerLease::new(LEASE, ControllerLeaseSpec::default()));
            lease.spec.holder_identity = Some(holder.into());
            lease.spec.lease_duration_seconds = Some(15);
            match lease.metadata.resource_version {
                Some(_) => leases.replace(LEASE, &PostParams::default(), &lease).await,
                None => leases.create(&PostParams::default(), &lease).await,
            }
            .with_context(|| format!("{holder} taking the lease"))?;
            anyhow::Ok(())
        }
    };

    apply(&client_b)
        .await
        .context("with no lease, a replica's write was refused: nobody leads, nothing is judged")?;
    // A holds the lease: B's apply is refused, naming both, and A's passes. The API server reads
    // the lease through its own watch: a bounded poll until it sees A's.
    let a_is_the_one_judged_holder = |when: &'static str| {
        let (apply, client_a, client_b) = (&apply, &client_a, &client_b);
        async move {
            let refused = until_refused(TERM_FENCE, || apply(client_b)).await?;
            ensure!(
                refused.contains(&format!("{b} does not ({a} does)")),
                "{when}: the refusal does not name the writer and the holder: {refused}"
            );
            apply(client_a)
                .await
                .with_context(|| format!("{when}: A holds the lease, yet its apply was refused"))?;
            anyhow::Ok(())
        }
    };
    take(&client_a, a).await?;
    a_is_the_one_judged_holder("A took the lease").await?;

    take(&client_b, b).await?;
    until_refused(TERM_FENCE, || apply(&client_a)).await?;
    apply(&client_b)
        .await
        .context("B holds the lease, yet its apply was refused")?;
    let unbound = service_account_client(&env, CONTROLLER, &Forbidden::new()).await?;
    apply(&unbound)
        .await
        .context("a token bound to no pod was refused: the term fence judges replicas only")?;

    // Uninstalled: A's writes pass (a bounded poll: the API server drops the policy through its
    // own watch), and the lease changes hands while no binding names its kind.
    let term_fence = manifests().join("base/controller/term-fence.yaml");
    let term_fence = term_fence.display().to_string();
    kubectl_ok(&env, &["delete", "-f", &term_fence])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Err(error) = apply(&client_a).await {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "30 s after the term fence was deleted, A's apply is still refused: {error}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the API server's refresh of its parameter informers (a tick of about a second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    take(&client_a, a).await?;
    kubectl_ok(&env, &["apply", "-f", &term_fence])?;
    // Judged against the lease as it is now, not as it was when the fence went.
    a_is_the_one_judged_holder("the term fence reinstalled after A took the lease back").await?;
    Api::<ControllerLease>::namespaced(env.client().await?, NAMESPACE)
        .delete(LEASE, &DeleteParams::default())
        .await?;
    // The audit log names the policy in each refusal, which is how the soak counts the late
    // writes the fence kept out (`late_writes_refused`).
    if !env.is_existing_cluster() {
        let refusals = env
            .audit_log()?
            .iter()
            .filter(|e| e.refused_by(TERM_FENCE))
            .count();
        ensure!(
            refusals >= 3,
            "the audit log shows {refusals} refusals by {TERM_FENCE}, not the three at least made here"
        );
    }
    Ok(())
}

//! EMULATOR of Korifi (`cloudfoundry/korifi`) — a test fixture reproducing the controllers,
//! admission-webhook effects and API calls that decide how a CF org/space/app deletion unfolds,
//! NOT Korifi. References "ref §N" are to `/work/shared/reference/korifi-kpack.md`.
//!
//! Emulated (controller-runtime semantics: one worker per controller, reads from the informer
//! cache like Korifi's cached client, writes to the API server, `RequeueAfter` as Korifi returns
//! it, errors retried with the default rate limiter):
//! - **CFOrg** (ref §1.4 steps 1–2, §1.3 "Namespaces"): finalizer `cfOrg.korifi.cloudfoundry.org`;
//!   creates the org namespace named after the org GUID; when deleted, the `NamespaceFinalizer`
//!   deletes that namespace and requeues every 1 s until it is NotFound, then removes the
//!   finalizer. (Should the API server answer the repeated delete of a terminating namespace
//!   with 409 Conflict, as some versions do, Korifi returns that as an error and the rate
//!   limiter paces the wait instead; [`KorifiCounts::namespace_delete_conflicts`] tells.)
//! - **CFSpace** (ref §1.4 step 3): finalizer `cfSpace.korifi.cloudfoundry.org`; creates the space
//!   namespace (and the builder service account kpack's pods run as, which Korifi propagates into
//!   space namespaces); when deleted, the `SpaceAppsFinalizer` skips the apps if the namespace is
//!   missing or terminating, otherwise `DeleteAllOf(CFApp, Foreground)` and requeue 500 ms until
//!   no CFApp remains or [`KorifiConfig::space_app_deletion_timeout`] (Korifi's
//!   `spaceFinalizerAppDeletionTimeout`, default 60 s, ref §3) has passed since the CFSpace's
//!   deletionTimestamp; then the `NamespaceFinalizer` as for orgs.
//! - **CFApp** (ref §1.2, §1.4 step 4): finalizer `cfApp.korifi.cloudfoundry.org`, added at
//!   creation (Korifi's finalizer webhook) and removed on deletion (nothing to clean up here: no
//!   routes or service bindings are emulated).
//! - **CFBuild** (ref §1.1): controller-owned by its CFApp; creates the BuildWorkload named like
//!   the CFBuild, controller-owned by it, labelled `app-guid`/`build-guid`, with the
//!   `kpack-image-builder.korifi.cloudfoundry.org/buildworkload` finalizer (the webhook's effect,
//!   ref §1.2); returns early on deletionTimestamp (commit 739b1d8e, ref §1.5).
//! - **BuildWorkload** (kpack-image-builder, ref §1.1, §1.2): only `builderName ==
//!   kpack-image-builder`; `CreateOrPatch`es the app's one kpack Image (name = app GUID) with
//!   labels replaced by `{build-workload-name: <bw>}` and a plain ownerReference per
//!   BuildWorkload, then labels the BuildWorkload `kpack-image-generation=<Image generation>`
//!   and sets `Succeeded=Unknown/BuildRunning`. Its finalizer: if this is the last BuildWorkload
//!   for (app, image generation), `DeleteAllOf` Builds labelled `image.kpack.io/image=<app>` +
//!   `image.kpack.io/imageGeneration=<gen>`, requeue 1 s while the cache still lists any, then
//!   remove the finalizer. Watches: its BuildWorkloads, Images (→ every owning BuildWorkload),
//!   Builds (→ BuildWorkloads with the Build's app and image generation).
//! - **kpack Build finalizer** (ref §1.2): `korifi.cloudfoundry.org/kpackBuild` on Builds with
//!   the `build-workload-name` label, added by Korifi's CREATE webhook
//!   ([`kpack_build_finalizer_webhook`], which the emulated kpack applies to the Builds it
//!   creates, so every such Build is held from its first version); the `KpackBuildController`
//!   removes it on deletion (the registry clean-up it would do for a `status.latestImage` is not
//!   emulated — builds never produce one here).
//! - **The API** ([`KorifiEmulator::create_app_chain`] and friends, ref §1.4): CFOrg in the root
//!   namespace, CFSpace in the org namespace, CFApp + CFBuild in the space namespace, each with
//!   the finalizer Korifi's webhook adds; org deletion is a plain delete, app deletion a
//!   foreground delete.
//!
//! Not emulated: CFPackage, CFProcess/AppWorkload, routes, service bindings, role-binding and
//! secret propagation, build completion (droplets) and `recoverIfBuildCreationHasBeenSkipped`.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{
    Scope, Tasks, add_finalizer, api_code, condition_status, controller_of, guid, has_finalizer, has_labels,
    is_terminating, kpack, label, merge_patch, millis_since_deletion, namespaced, now, owner_reference,
    remove_finalizer, resources,
    runtime::{Action, Change, Informer, ObjectKey, ScopeFilter, WorkQueue, spawn_controller},
    selector,
};
use crate::{control_plane::E2E_LABEL, wait};

pub const ORG_FINALIZER: &str = "cfOrg.korifi.cloudfoundry.org";
pub const SPACE_FINALIZER: &str = "cfSpace.korifi.cloudfoundry.org";
pub const APP_FINALIZER: &str = "cfApp.korifi.cloudfoundry.org";
pub const BUILD_WORKLOAD_FINALIZER: &str = "kpack-image-builder.korifi.cloudfoundry.org/buildworkload";
pub const KPACK_BUILD_FINALIZER: &str = "korifi.cloudfoundry.org/kpackBuild";
pub const APP_GUID_LABEL: &str = "korifi.cloudfoundry.org/app-guid";
pub const BUILD_GUID_LABEL: &str = "korifi.cloudfoundry.org/build-guid";
pub const BUILD_WORKLOAD_LABEL: &str = "korifi.cloudfoundry.org/build-workload-name";
pub const IMAGE_GENERATION_LABEL: &str = "korifi.cloudfoundry.org/kpack-image-generation";
pub const ORG_GUID_LABEL: &str = "korifi.cloudfoundry.org/org-guid";
pub const ORG_NAME_LABEL: &str = "korifi.cloudfoundry.org/org-name";
pub const SPACE_GUID_LABEL: &str = "korifi.cloudfoundry.org/space-guid";
pub const SPACE_NAME_LABEL: &str = "korifi.cloudfoundry.org/space-name";
/// The builder name kpack-image-builder reconciles (`KpackReconcilerName`, ref §1.1).
pub const KPACK_IMAGE_BUILDER: &str = "kpack-image-builder";

/// controller-runtime's default `MaxConcurrentReconciles`.
const WORKERS: usize = 1;
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);
/// Korifi's requeue intervals (ref §3).
const NAMESPACE_REQUEUE: Duration = Duration::from_secs(1);
const SPACE_APPS_REQUEUE: Duration = Duration::from_millis(500);
const BUILD_WORKLOAD_REQUEUE: Duration = Duration::from_secs(1);
/// `k8sns.Reconciler`: namespace not in the cache yet.
const NAMESPACE_CREATED_REQUEUE: Duration = Duration::from_millis(100);

/// Korifi's configuration, as far as the emulation uses it.
#[derive(Clone, Debug)]
pub struct KorifiConfig {
    pub scope: Scope,
    /// `spaceFinalizerAppDeletionTimeout` (default 60 s, ref §3).
    pub space_app_deletion_timeout: Duration,
    /// `builderServiceAccount` (the helm chart hard-codes `kpack-service-account`, ref §1.1).
    pub builder_service_account: String,
    /// `containerRepositoryPrefix`: Image tags are `<prefix><app-guid>-droplets` (ref §1.1).
    pub container_repository_prefix: String,
    /// `clusterBuilderName` (ref §1.1).
    pub cluster_builder_name: String,
    /// `cfStagingResources` (ref §1.1 Image spec `build.resources.requests`).
    pub staging_memory_mb: u64,
    pub staging_disk_mb: u64,
    /// `buildCacheMB` (default 2048, ref §1.1).
    pub build_cache_mb: u64,
}

impl KorifiConfig {
    pub fn new(scope: Scope) -> Self {
        Self {
            scope,
            space_app_deletion_timeout: Duration::from_secs(60),
            builder_service_account: "kpack-service-account".into(),
            container_repository_prefix: "registry.example/korifi/droplets/".into(),
            cluster_builder_name: "cf-kpack-cluster-builder".into(),
            staging_memory_mb: 1024,
            staging_disk_mb: 1024,
            build_cache_mb: 2048,
        }
    }
}

/// Counters since the emulator started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KorifiCounts {
    /// `DeleteAllOf(CFApp, Foreground)` calls by space finalizers.
    pub space_app_deletions: u64,
    /// Space finalizer passes that gave up waiting for CFApps (timeout reached, apps remained).
    pub space_app_timeouts: u64,
    /// `DeleteAllOf(Build)` calls by BuildWorkload finalizers.
    pub build_workload_build_deletions: u64,
    /// BuildWorkload finalizer passes that requeued because Builds remained.
    pub build_workload_requeues: u64,
    /// 409 answers to the namespace finalizer's repeated delete of a terminating namespace.
    pub namespace_delete_conflicts: u64,
}

#[derive(Default)]
struct Stats {
    space_app_deletions: AtomicU64,
    space_app_timeouts: AtomicU64,
    bw_build_deletions: AtomicU64,
    bw_requeues: AtomicU64,
    namespace_conflicts: AtomicU64,
}

/// Korifi's kpack-image-builder finalizer webhook on kpack Build CREATE (ref §1.2,
/// `finalizer_webhook.go`): adds `korifi.cloudfoundry.org/kpackBuild` to a Build that carries the
/// `build-workload-name` label (kpack copies it from the Image).
pub fn kpack_build_finalizer_webhook(build: &mut DynamicObject) {
    if label(build, BUILD_WORKLOAD_LABEL).is_some() && !has_finalizer(build, KPACK_BUILD_FINALIZER) {
        build
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(KPACK_BUILD_FINALIZER.to_string());
    }
}

/// A CF org with one space, one app and one build, as created through [`KorifiEmulator::create_app_chain`].
#[derive(Clone, Debug)]
pub struct AppChain {
    pub root_namespace: String,
    /// Org GUID = CFOrg name = org namespace.
    pub org: String,
    /// Space GUID = CFSpace name = space namespace.
    pub space: String,
    /// App GUID = CFApp name = kpack Image name.
    pub app: String,
    /// Build GUID = CFBuild name = BuildWorkload name.
    pub build: String,
}

/// A running Korifi emulation; stopped by [`KorifiEmulator::stop`], its token, or drop.
pub struct KorifiEmulator {
    client: Client,
    config: KorifiConfig,
    stats: Arc<Stats>,
    tasks: Tasks,
}

struct Korifi {
    client: Client,
    config: KorifiConfig,
    orgs: Arc<Informer>,
    spaces: Arc<Informer>,
    apps: Arc<Informer>,
    cf_builds: Arc<Informer>,
    workloads: Arc<Informer>,
    images: Arc<Informer>,
    builds: Arc<Informer>,
    namespaces: Arc<Informer>,
    stats: Arc<Stats>,
}

fn changed(change: &Change) -> &DynamicObject {
    match change {
        Change::Added(o) | Change::Deleted(o) => o,
        Change::Updated { new, .. } => new,
    }
}

/// `For(...)`: every event enqueues the object.
fn enqueue(queue: Arc<WorkQueue>) -> impl Fn(&Change) + Send + Sync + 'static {
    move |change| queue.add(ObjectKey::of(changed(change)))
}

/// `Owns(...)` / `EnqueueRequestForOwner(..., OnlyControllerOwner)`.
fn enqueue_controller(kind: &'static str, queue: Arc<WorkQueue>) -> impl Fn(&Change) + Send + Sync + 'static {
    move |change| {
        let object = changed(change);
        if let Some(owner) = controller_of(object).filter(|o| o.kind == kind) {
            queue.add(ObjectKey::new(
                object.metadata.namespace.as_deref().unwrap_or_default(),
                &owner.name,
            ));
        }
    }
}

/// `EnqueueRequestForOwner(BuildWorkload)` without `OnlyControllerOwner`: every owning
/// BuildWorkload, of the old and the new object.
fn enqueue_owning_workloads(queue: Arc<WorkQueue>) -> impl Fn(&Change) + Send + Sync + 'static {
    move |change| {
        let objects: Vec<&DynamicObject> = match change {
            Change::Added(o) | Change::Deleted(o) => vec![o],
            Change::Updated { old, new } => vec![old, new],
        };
        for object in objects {
            for owner in object.metadata.owner_references.iter().flatten() {
                if owner.kind == "BuildWorkload" {
                    queue.add(ObjectKey::new(
                        object.metadata.namespace.as_deref().unwrap_or_default(),
                        &owner.name,
                    ));
                }
            }
        }
    }
}

fn sanitized_label_value(value: &str) -> String {
    let cleaned: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

impl KorifiEmulator {
    /// Starts Korifi's controllers for the namespaces in `config.scope`; returns once their
    /// caches are synced. Stops when `cancel` (or the emulator's own stop) fires.
    pub async fn start(client: Client, config: KorifiConfig, cancel: &CancellationToken) -> Result<Self> {
        let mut tasks = Tasks::new(cancel);
        let informer = |r| Informer::new(&client, &r);
        let (orgs, spaces, apps) = (
            informer(resources::cf_org()),
            informer(resources::cf_space()),
            informer(resources::cf_app()),
        );
        let (cf_builds, workloads) = (
            informer(resources::cf_build()),
            informer(resources::build_workload()),
        );
        let (images, builds, namespaces) = (
            informer(resources::image()),
            informer(resources::build()),
            informer(resources::namespace()),
        );
        let queue = || WorkQueue::new(tasks.cancel.clone());
        let (org_q, space_q, app_q, cf_build_q, workload_q, kpack_build_q) =
            (queue(), queue(), queue(), queue(), queue(), queue());

        orgs.on_change(enqueue(org_q.clone()));
        spaces.on_change(enqueue(space_q.clone()));
        apps.on_change(enqueue(app_q.clone()));
        cf_builds.on_change(enqueue(cf_build_q.clone()));
        workloads.on_change(enqueue_controller("CFBuild", cf_build_q.clone()));
        // BuildWorkloadReconciler.SetupWithManager (ref §1.1 "Watches"), with the event filter
        // `filterBuildWorkloads` (builderName) on its own objects.
        let q = workload_q.clone();
        workloads.on_change(move |change| {
            if changed(change).data["spec"]["builderName"] == KPACK_IMAGE_BUILDER {
                q.add(ObjectKey::of(changed(change)));
            }
        });
        images.on_change(enqueue_owning_workloads(workload_q.clone()));
        let (q, bws) = (workload_q.clone(), workloads.clone());
        builds.on_change(move |change| {
            let build = changed(change);
            let wanted = [
                (
                    APP_GUID_LABEL,
                    label(build, kpack::IMAGE_LABEL).unwrap_or_default(),
                ),
                (
                    IMAGE_GENERATION_LABEL,
                    label(build, kpack::IMAGE_GENERATION_LABEL).unwrap_or_default(),
                ),
            ];
            let namespace = build.metadata.namespace.as_deref().unwrap_or_default();
            for bw in bws.list(namespace, |o| has_labels(o, &wanted)) {
                q.add(ObjectKey::of(&bw));
            }
        });
        // KpackBuildController: `LabelSelectorPredicate(build-workload-name exists)`.
        let q = kpack_build_q.clone();
        builds.on_change(move |change| {
            if label(changed(change), BUILD_WORKLOAD_LABEL).is_some() {
                q.add(ObjectKey::of(changed(change)));
            }
        });

        let all = [
            orgs.clone(),
            spaces.clone(),
            apps.clone(),
            cf_builds.clone(),
            workloads.clone(),
            images.clone(),
            builds.clone(),
            namespaces.clone(),
        ];
        for informer in &all {
            tasks.set.spawn(informer.clone().run(tasks.cancel.clone()));
        }

        let stats = Arc::new(Stats::default());
        let korifi = Arc::new(Korifi {
            client: client.clone(),
            config: config.clone(),
            orgs,
            spaces,
            apps,
            cf_builds,
            workloads,
            images,
            builds,
            namespaces: namespaces.clone(),
            stats: stats.clone(),
        });
        let scope = ScopeFilter::new(&client, config.scope.clone(), namespaces);
        let caches = all.to_vec();
        macro_rules! controller {
            ($name:literal, $queue:expr, $method:ident) => {{
                let k = korifi.clone();
                spawn_controller(
                    &mut tasks.set,
                    $name,
                    $queue,
                    WORKERS,
                    scope.clone(),
                    caches.clone(),
                    Arc::new(move |key| Box::pin(k.clone().$method(key))),
                );
            }};
        }
        controller!("korifi-cforg", org_q, reconcile_org);
        controller!("korifi-cfspace", space_q, reconcile_space);
        controller!("korifi-cfapp", app_q, reconcile_app);
        controller!("korifi-cfbuild", cf_build_q, reconcile_cf_build);
        controller!("korifi-buildworkload", workload_q, reconcile_build_workload);
        controller!("korifi-kpackbuild", kpack_build_q, reconcile_kpack_build);

        for informer in &all {
            tokio::time::timeout(SYNC_TIMEOUT, informer.synced())
                .await
                .context("Korifi emulator caches did not sync")?;
        }
        tracing::info!(scope = ?config.scope, "Korifi EMULATOR started");
        Ok(Self {
            client,
            config,
            stats,
            tasks,
        })
    }

    pub fn config(&self) -> &KorifiConfig {
        &self.config
    }

    pub fn counts(&self) -> KorifiCounts {
        let s = &self.stats;
        KorifiCounts {
            space_app_deletions: s.space_app_deletions.load(Ordering::Relaxed),
            space_app_timeouts: s.space_app_timeouts.load(Ordering::Relaxed),
            build_workload_build_deletions: s.bw_build_deletions.load(Ordering::Relaxed),
            build_workload_requeues: s.bw_requeues.load(Ordering::Relaxed),
            namespace_delete_conflicts: s.namespace_conflicts.load(Ordering::Relaxed),
        }
    }

    /// Cancels the controllers and watches and waits for them to end.
    pub async fn stop(mut self) {
        self.tasks.stop().await;
    }

    fn api(&self, resource: &kube::api::ApiResource, namespace: &str) -> Api<DynamicObject> {
        namespaced(&self.client, resource, namespace)
    }

    async fn create(
        &self,
        resource: kube::api::ApiResource,
        namespace: &str,
        object: Value,
    ) -> Result<DynamicObject> {
        let object: DynamicObject = serde_json::from_value(object)?;
        let name = object.metadata.name.clone().unwrap_or_default();
        self.api(&resource, namespace)
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating {} {namespace}/{name}", resource.kind))
    }

    /// Korifi's API `CreateOrg`: a CFOrg (with the finalizer Korifi's webhook adds) in the root
    /// namespace; returns the org GUID once the org namespace exists.
    pub async fn create_org(&self, root_namespace: &str, display_name: &str) -> Result<String> {
        let org = guid();
        self.create(
            resources::cf_org(),
            root_namespace,
            json!({
                "apiVersion": resources::cf_org().api_version, "kind": "CFOrg",
                "metadata": {"name": org, "finalizers": [ORG_FINALIZER]},
                "spec": {"displayName": display_name},
            }),
        )
        .await?;
        wait::until(
            &Api::<Namespace>::all(self.client.clone()),
            &org,
            |ns: Option<&Namespace>| ns.is_some(),
        )
        .await
        .context("org namespace")?;
        Ok(org)
    }

    /// Korifi's API `CreateSpace`: a CFSpace in the org namespace; returns the space GUID once
    /// the space namespace and its builder service account exist.
    pub async fn create_space(&self, org: &str, display_name: &str) -> Result<String> {
        let space = guid();
        self.create(
            resources::cf_space(),
            org,
            json!({
                "apiVersion": resources::cf_space().api_version, "kind": "CFSpace",
                "metadata": {"name": space, "finalizers": [SPACE_FINALIZER]},
                "spec": {"displayName": display_name},
            }),
        )
        .await?;
        let accounts = Api::<ServiceAccount>::namespaced(self.client.clone(), &space);
        wait::until(
            &accounts,
            &self.config.builder_service_account,
            |sa: Option<&ServiceAccount>| sa.is_some(),
        )
        .await
        .context("space namespace and builder service account")?;
        Ok(space)
    }

    /// Korifi's API `CreateApp`: a CFApp (with its finalizer) in the space namespace.
    pub async fn create_app(&self, space: &str, display_name: &str) -> Result<String> {
        let app = guid();
        self.create(
            resources::cf_app(),
            space,
            json!({
                "apiVersion": resources::cf_app().api_version, "kind": "CFApp",
                "metadata": {"name": app, "finalizers": [APP_FINALIZER]},
                "spec": {
                    "displayName": display_name, "desiredState": "STOPPED",
                    "lifecycle": {"type": "buildpack", "data": {"buildpacks": [], "stack": "cflinuxfs3"}},
                },
            }),
        )
        .await?;
        Ok(app)
    }

    /// Korifi's API `CreateBuild` (staging): a CFBuild for `app`.
    pub async fn create_build(&self, space: &str, app: &str) -> Result<String> {
        let build = guid();
        self.create(
            resources::cf_build(),
            space,
            json!({
                "apiVersion": resources::cf_build().api_version, "kind": "CFBuild",
                "metadata": {"name": build, "labels": {APP_GUID_LABEL: app}},
                "spec": {
                    "appRef": {"name": app}, "packageRef": {"name": guid()},
                    "lifecycle": {"type": "buildpack", "data": {"buildpacks": [], "stack": "cflinuxfs3"}},
                    "stagingMemoryMB": self.config.staging_memory_mb, "stagingDiskMB": self.config.staging_disk_mb,
                },
            }),
        )
        .await?;
        Ok(build)
    }

    /// An org, a space in it, an app in the space and a build of the app (`cf push` in short).
    pub async fn create_app_chain(&self, root_namespace: &str, name: &str) -> Result<AppChain> {
        let org = self.create_org(root_namespace, &format!("{name}-org")).await?;
        let space = self.create_space(&org, &format!("{name}-space")).await?;
        let app = self.create_app(&space, name).await?;
        let build = self.create_build(&space, &app).await?;
        Ok(AppChain {
            root_namespace: root_namespace.to_string(),
            org,
            space,
            app,
            build,
        })
    }

    /// Korifi's API `DeleteOrg` (ref §1.4 step 1): a plain delete of the CFOrg.
    pub async fn delete_org(&self, root_namespace: &str, org: &str) -> Result<()> {
        self.api(&resources::cf_org(), root_namespace)
            .delete(org, &DeleteParams::default())
            .await
            .context("deleting CFOrg")?;
        Ok(())
    }

    /// Korifi's API `DeleteSpace`: a plain delete of the CFSpace (its finalizer does the rest).
    pub async fn delete_space(&self, org: &str, space: &str) -> Result<()> {
        self.api(&resources::cf_space(), org)
            .delete(space, &DeleteParams::default())
            .await
            .context("deleting CFSpace")?;
        Ok(())
    }

    /// Korifi's API `DeleteApp` (ref §1.4 step 4): a foreground delete of the CFApp.
    pub async fn delete_app(&self, space: &str, app: &str) -> Result<()> {
        self.api(&resources::cf_app(), space)
            .delete(app, &DeleteParams::foreground())
            .await
            .context("deleting CFApp")?;
        Ok(())
    }
}

impl Korifi {
    fn api(&self, resource: &kube::api::ApiResource, namespace: &str) -> Api<DynamicObject> {
        namespaced(&self.client, resource, namespace)
    }

    fn scope_labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([(E2E_LABEL.to_string(), "true".to_string())]);
        if let Some((k, v)) = self.config.scope.label() {
            labels.insert(k.to_string(), v.to_string());
        }
        labels
    }

    /// `createOrPatchNamespace`: labels are merged into the namespace's (`updateMap`).
    async fn ensure_namespace(&self, name: &str, mut labels: BTreeMap<String, String>) -> Result<()> {
        labels.extend(self.scope_labels());
        labels.insert("pod-security.kubernetes.io/enforce".into(), "restricted".into());
        labels.insert("pod-security.kubernetes.io/audit".into(), "restricted".into());
        let api = Api::<Namespace>::all(self.client.clone());
        match self.namespaces.get(&ObjectKey::new("", name)) {
            None => {
                let ns = Namespace {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        labels: Some(labels),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match api.create(&PostParams::default(), &ns).await {
                    Err(e) if api_code(&e) == Some(409) => Ok(()),
                    other => other.map(drop).context("creating namespace"),
                }
            }
            Some(ns) if labels.iter().all(|(k, v)| label(&ns, k) == Some(v)) => Ok(()),
            Some(_) => api
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": labels}})),
                )
                .await
                .map(drop)
                .context("patching namespace labels"),
        }
    }

    async fn update_namespace_object_status(
        &self,
        resource: &kube::api::ApiResource,
        object: &DynamicObject,
    ) -> Result<()> {
        let name = object.metadata.name.clone().unwrap_or_default();
        let generation = object.metadata.generation.unwrap_or_default();
        let status = &object.data["status"];
        if status["guid"] == name.as_str()
            && status["observedGeneration"] == generation
            && condition_status(object, "Ready") == Some("True")
        {
            return Ok(());
        }
        let status = json!({"status": {
            "guid": name, "observedGeneration": generation,
            "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                            "observedGeneration": generation, "lastTransitionTime": now()}],
        }});
        let api = self.api(resource, object.metadata.namespace.as_deref().unwrap_or_default());
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
        {
            Err(e) if api_code(&e) == Some(404) => Ok(()),
            other => other.map(drop).context("updating status"),
        }
    }

    /// `k8sns.NamespaceFinalizer` (ref §1.4 steps 2–3): the delegate first (space: its apps),
    /// then delete the namespace named like the object, requeue 1 s until it is gone, then
    /// remove the finalizer. Errors (a 409 where the API server refuses the repeated delete) go
    /// to the rate limiter.
    async fn namespace_finalizer(
        &self,
        api: &Api<DynamicObject>,
        object: &DynamicObject,
        finalizer: &str,
    ) -> Result<Action> {
        if !has_finalizer(object, finalizer) {
            return Ok(Action::Done);
        }
        if finalizer == SPACE_FINALIZER {
            let delegated = self.space_apps_finalizer(object).await?;
            if delegated != Action::Done {
                return Ok(delegated);
            }
        }
        let name = object.metadata.name.as_deref().unwrap_or_default();
        match Api::<Namespace>::all(self.client.clone())
            .delete(name, &DeleteParams::default())
            .await
        {
            Err(e) if api_code(&e) == Some(404) => {
                remove_finalizer(api, object, finalizer).await?;
                Ok(Action::Done)
            }
            Err(e) => {
                if api_code(&e) == Some(409) {
                    self.stats.namespace_conflicts.fetch_add(1, Ordering::Relaxed);
                }
                Err(e).context("deleting namespace")
            }
            Ok(_) => Ok(Action::RequeueAfter(NAMESPACE_REQUEUE)),
        }
    }

    /// `SpaceAppsFinalizer.Finalize` (ref §1.4 step 3).
    async fn space_apps_finalizer(&self, space: &DynamicObject) -> Result<Action> {
        let name = space.metadata.name.as_deref().unwrap_or_default();
        let Some(namespace) = self.namespaces.get(&ObjectKey::new("", name)) else {
            return Ok(Action::Done);
        };
        if is_terminating(&namespace) {
            return Ok(Action::Done);
        }
        let timeout = i64::try_from(self.config.space_app_deletion_timeout.as_millis()).unwrap_or(i64::MAX);
        let timed_out = millis_since_deletion(space) >= timeout;
        if self.apps.list(name, |_| true).is_empty() {
            return Ok(Action::Done);
        }
        if timed_out {
            self.stats.space_app_timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::info!(space = name, "Korifi EMULATOR: timed out deleting CFApps");
            return Ok(Action::Done);
        }
        self.stats.space_app_deletions.fetch_add(1, Ordering::Relaxed);
        let deleted = self
            .api(&resources::cf_app(), name)
            .delete_collection(&DeleteParams::foreground(), &ListParams::default())
            .await;
        if let Err(e) = deleted {
            tracing::info!(space = name, error = %e, "Korifi EMULATOR: failed to delete CFApps");
        }
        Ok(Action::RequeueAfter(SPACE_APPS_REQUEUE))
    }

    async fn reconcile_org(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(org) = self.orgs.get(&key) else {
            return Ok(Action::Done);
        };
        let api = self.api(&resources::cf_org(), &key.namespace);
        if is_terminating(&org) {
            return self.namespace_finalizer(&api, &org, ORG_FINALIZER).await;
        }
        add_finalizer(&api, &org, ORG_FINALIZER).await?;
        let display = org.data["spec"]["displayName"].as_str().unwrap_or_default();
        self.ensure_namespace(
            &key.name,
            BTreeMap::from([
                (ORG_GUID_LABEL.to_string(), key.name.clone()),
                (ORG_NAME_LABEL.to_string(), sanitized_label_value(display)),
            ]),
        )
        .await?;
        if self.namespaces.get(&ObjectKey::new("", &key.name)).is_none() {
            return Ok(Action::RequeueAfter(NAMESPACE_CREATED_REQUEUE));
        }
        self.update_namespace_object_status(&resources::cf_org(), &org)
            .await?;
        Ok(Action::Done)
    }

    async fn reconcile_space(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(space) = self.spaces.get(&key) else {
            return Ok(Action::Done);
        };
        let api = self.api(&resources::cf_space(), &key.namespace);
        if is_terminating(&space) {
            return self.namespace_finalizer(&api, &space, SPACE_FINALIZER).await;
        }
        add_finalizer(&api, &space, SPACE_FINALIZER).await?;
        let display = space.data["spec"]["displayName"].as_str().unwrap_or_default();
        self.ensure_namespace(
            &key.name,
            BTreeMap::from([
                (SPACE_GUID_LABEL.to_string(), key.name.clone()),
                (ORG_GUID_LABEL.to_string(), key.namespace.clone()),
                (SPACE_NAME_LABEL.to_string(), sanitized_label_value(display)),
            ]),
        )
        .await?;
        if self.namespaces.get(&ObjectKey::new("", &key.name)).is_none() {
            return Ok(Action::RequeueAfter(NAMESPACE_CREATED_REQUEUE));
        }
        // The builder service account kpack's build pods run as (Korifi propagates it).
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(self.config.builder_service_account.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<ServiceAccount>::namespaced(self.client.clone(), &key.name)
            .create(&PostParams::default(), &account)
            .await
        {
            Err(e) if api_code(&e) != Some(409) => {
                return Err(e).context("creating the builder service account");
            }
            _ => {}
        }
        self.update_namespace_object_status(&resources::cf_space(), &space)
            .await?;
        Ok(Action::Done)
    }

    async fn reconcile_app(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(app) = self.apps.get(&key) else {
            return Ok(Action::Done);
        };
        let api = self.api(&resources::cf_app(), &key.namespace);
        if is_terminating(&app) {
            // Routes and service bindings would be cleaned up here first (not emulated).
            remove_finalizer(&api, &app, APP_FINALIZER).await?;
        } else {
            add_finalizer(&api, &app, APP_FINALIZER).await?;
        }
        Ok(Action::Done)
    }

    /// The CFBuild controller's buildpack path (ref §1.1 "createBuildWorkload").
    async fn reconcile_cf_build(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(cf_build) = self.cf_builds.get(&key) else {
            return Ok(Action::Done);
        };
        if is_terminating(&cf_build) {
            return Ok(Action::Done);
        }
        let app_name = cf_build.data["spec"]["appRef"]["name"]
            .as_str()
            .unwrap_or_default();
        let Some(app) = self.apps.get(&ObjectKey::new(&key.namespace, app_name)) else {
            bail!("CFApp {}/{app_name} of CFBuild {key} not found", key.namespace);
        };
        if controller_of(&cf_build).is_none() {
            let mut owners = cf_build.metadata.owner_references.clone().unwrap_or_default();
            owners.push(owner_reference(&app, &resources::cf_app(), true));
            let patch = json!({"metadata": {"ownerReferences": owners, "resourceVersion": cf_build.metadata.resource_version}});
            self.api(&resources::cf_build(), &key.namespace)
                .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .context("setting the CFApp as controller of the CFBuild")?;
        }
        if self.workloads.get(&key).is_some() {
            return Ok(Action::Done);
        }
        let package = cf_build.data["spec"]["packageRef"]["name"]
            .as_str()
            .unwrap_or_default();
        let workload = json!({
            "apiVersion": resources::build_workload().api_version, "kind": "BuildWorkload",
            "metadata": {
                "name": key.name, "namespace": key.namespace,
                "labels": {BUILD_GUID_LABEL: key.name, APP_GUID_LABEL: app_name},
                "ownerReferences": [owner_reference(&cf_build, &resources::cf_build(), true)],
                // Added by the kpack-image-builder finalizer webhook on CREATE (ref §1.2).
                "finalizers": [BUILD_WORKLOAD_FINALIZER],
            },
            "spec": {
                "buildRef": {"name": key.name},
                "builderName": KPACK_IMAGE_BUILDER,
                "source": {"registry": {
                    "image": format!("{}{app_name}-packages:{package}", self.config.container_repository_prefix),
                    "imagePullSecrets": [],
                }},
                "buildpacks": cf_build.data["spec"]["lifecycle"]["data"]["buildpacks"],
                "env": [],
                "services": [],
            },
        });
        let workload: DynamicObject = serde_json::from_value(workload)?;
        match self
            .api(&resources::build_workload(), &key.namespace)
            .create(&PostParams::default(), &workload)
            .await
        {
            Err(e) if api_code(&e) != Some(409) => Err(e).context("creating BuildWorkload"),
            _ => Ok(Action::Done),
        }
    }

    /// `BuildWorkloadReconciler.ReconcileResource` (ref §1.1).
    async fn reconcile_build_workload(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(workload) = self.workloads.get(&key) else {
            return Ok(Action::Done);
        };
        if workload.data["spec"]["builderName"] != KPACK_IMAGE_BUILDER {
            return Ok(Action::Done);
        }
        if is_terminating(&workload) {
            return self.finalize_build_workload(&workload).await;
        }
        if condition_status(&workload, "Succeeded").is_none() {
            self.reconcile_kpack_image(&workload).await?;
        }
        Ok(Action::Done)
    }

    /// `BuildWorkloadReconciler.finalize` (ref §1.2).
    async fn finalize_build_workload(&self, workload: &DynamicObject) -> Result<Action> {
        if !has_finalizer(workload, BUILD_WORKLOAD_FINALIZER) {
            return Ok(Action::Done);
        }
        let namespace = workload.metadata.namespace.as_deref().unwrap_or_default();
        let app = label(workload, APP_GUID_LABEL).unwrap_or_default();
        let generation = label(workload, IMAGE_GENERATION_LABEL).unwrap_or_default();
        // isLastBuildWorkload, through the cached client.
        let same_image = [(APP_GUID_LABEL, app), (IMAGE_GENERATION_LABEL, generation)];
        let last = self
            .workloads
            .list(namespace, |o| has_labels(o, &same_image))
            .len()
            == 1;
        if last {
            let builds = [
                (kpack::IMAGE_LABEL, app),
                (kpack::IMAGE_GENERATION_LABEL, generation),
            ];
            self.stats.bw_build_deletions.fetch_add(1, Ordering::Relaxed);
            self.api(&resources::build(), namespace)
                .delete_collection(
                    &DeleteParams::default(),
                    &ListParams::default().labels(&selector(&builds)),
                )
                .await
                .context("failed to delete builds")?;
            // hasRemainingBuilds, through the cached client.
            let remaining = self.builds.list(namespace, |b| has_labels(b, &builds)).len();
            tracing::debug!(workload = ?workload.metadata.name, app, generation, remaining, "Korifi EMULATOR: BuildWorkload finalizer deleted Builds");
            if remaining > 0 {
                self.stats.bw_requeues.fetch_add(1, Ordering::Relaxed);
                return Ok(Action::RequeueAfter(BUILD_WORKLOAD_REQUEUE));
            }
        }
        tracing::debug!(workload = ?workload.metadata.name, app, generation, last, "Korifi EMULATOR: BuildWorkload finalizer done");
        let api = self.api(&resources::build_workload(), namespace);
        remove_finalizer(&api, workload, BUILD_WORKLOAD_FINALIZER).await?;
        Ok(Action::Done)
    }

    /// `reconcileKpackImage` (ref §1.1 "How it is written", "After the patch").
    async fn reconcile_kpack_image(&self, workload: &DynamicObject) -> Result<()> {
        let namespace = workload.metadata.namespace.as_deref().unwrap_or_default();
        let workload_name = workload.metadata.name.as_deref().unwrap_or_default();
        let Some(app) = label(workload, APP_GUID_LABEL) else {
            bail!("BuildWorkload {namespace}/{workload_name} has no {APP_GUID_LABEL} label");
        };
        let config = &self.config;
        let source = &workload.data["spec"]["source"]["registry"];
        let mut build = json!({
            "services": workload.data["spec"]["services"],
            "env": workload.data["spec"]["env"],
            "resources": {"requests": {
                "ephemeral-storage": format!("{}M", config.staging_disk_mb),
                "memory": format!("{}M", config.staging_memory_mb),
            }},
        });
        if let Value::Object(fields) = &mut build {
            fields.retain(|_, v| !v.is_null());
        }
        let spec = json!({
            "tag": format!("{}{app}-droplets", config.container_repository_prefix),
            "builder": {"kind": "ClusterBuilder", "apiVersion": "kpack.io/v1alpha2", "name": config.cluster_builder_name},
            "serviceAccountName": config.builder_service_account,
            "source": {"registry": {"image": source["image"], "imagePullSecrets": source["imagePullSecrets"]}},
            "build": build,
            "cache": {"volume": {"size": format!("{}Mi", config.build_cache_mb)}},
        });
        // "Cannot use SetControllerReference here as multiple BuildWorkloads can 'own' the same Image."
        let reference = owner_reference(workload, &resources::build_workload(), false);
        let labels = json!({ BUILD_WORKLOAD_LABEL: workload_name });
        let api = self.api(&resources::image(), namespace);
        let image = match self.images.get(&ObjectKey::new(namespace, app)) {
            None => {
                let image: DynamicObject = serde_json::from_value(json!({
                    "apiVersion": resources::image().api_version, "kind": "Image",
                    "metadata": {"name": app, "namespace": namespace, "labels": labels, "ownerReferences": [reference]},
                    "spec": spec,
                }))?;
                api.create(&PostParams::default(), &image)
                    .await
                    .context("creating kpack Image")?
            }
            Some(existing) => {
                let mut owners = existing.metadata.owner_references.clone().unwrap_or_default();
                match owners
                    .iter_mut()
                    .find(|o| o.kind == reference.kind && o.name == reference.name)
                {
                    Some(o) => *o = reference,
                    None => owners.push(reference),
                }
                let old = json!({
                    "metadata": {"labels": existing.metadata.labels, "ownerReferences": existing.metadata.owner_references},
                    "spec": existing.data["spec"],
                });
                let new = json!({"metadata": {"labels": labels, "ownerReferences": owners}, "spec": spec});
                let patch = merge_patch(&old, &new);
                if patch.as_object().is_some_and(serde_json::Map::is_empty) {
                    (*existing).clone()
                } else {
                    api.patch(app, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .context("patching kpack Image")?
                }
            }
        };
        let generation = image.metadata.generation.unwrap_or_default();
        let workloads = self.api(&resources::build_workload(), namespace);
        let labels = json!({"metadata": {"labels": {IMAGE_GENERATION_LABEL: generation.to_string()}}});
        workloads
            .patch(workload_name, &PatchParams::default(), &Patch::Merge(&labels))
            .await
            .context("labelling BuildWorkload with the image generation")?;
        let observed = workload.metadata.generation.unwrap_or_default();
        let status = json!({"status": {
            "observedGeneration": observed,
            "conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "BuildRunning",
                            "message": "Waiting for image build to complete",
                            "observedGeneration": observed, "lastTransitionTime": now()}],
        }});
        workloads
            .patch_status(workload_name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .context("updating BuildWorkload status")?;
        Ok(())
    }

    /// `KpackBuildController.ReconcileResource` (ref §1.2).
    async fn reconcile_kpack_build(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(build) = self.builds.get(&key) else {
            return Ok(Action::Done);
        };
        if label(&build, BUILD_WORKLOAD_LABEL).is_none() {
            return Ok(Action::Done);
        }
        if is_terminating(&build) {
            // With a status.latestImage Korifi would delete the droplet from the registry here,
            // logging (not returning) errors; emulated builds never produce one.
            let api = self.api(&resources::build(), &key.namespace);
            remove_finalizer(&api, &build, KPACK_BUILD_FINALIZER).await?;
        }
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::sanitized_label_value;

    #[test]
    fn the_finalizer_webhook_holds_only_korifi_builds() {
        let build = |labels: serde_json::Value| -> kube::api::DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kpack.io/v1alpha2", "kind": "Build",
                "metadata": {"name": "b", "labels": labels, "finalizers": ["other"]},
            }))
            .unwrap()
        };
        let mut korifi = build(serde_json::json!({super::BUILD_WORKLOAD_LABEL: "bw"}));
        super::kpack_build_finalizer_webhook(&mut korifi);
        super::kpack_build_finalizer_webhook(&mut korifi);
        assert_eq!(
            korifi.metadata.finalizers.unwrap(),
            ["other", super::KPACK_BUILD_FINALIZER]
        );
        let mut plain = build(serde_json::json!({}));
        super::kpack_build_finalizer_webhook(&mut plain);
        assert_eq!(plain.metadata.finalizers.unwrap(), ["other"]);
    }

    #[test]
    fn display_names_become_valid_label_values() {
        assert_eq!(sanitized_label_value("my org!"), "my-org");
        assert_eq!(sanitized_label_value(&"x".repeat(80)).len(), 63);
    }
}

//! EMULATOR of kpack (`buildpacks-community/kpack`, Go module `github.com/pivotal/kpack`) — a
//! test fixture reproducing how kpack's image and build reconcilers create Builds and build pods,
//! NOT kpack. References "ref §N" are to `/work/shared/reference/korifi-kpack.md`.
//!
//! Emulated:
//! - **Image reconciler** (ref §2.3, `pkg/reconciler/image`): enqueued by its own Image events
//!   and by events of Builds it controls (`FilterControllerGK(Image)` + `EnqueueControllerOf`).
//!   It reads the Image and its Builds from the informer cache (listers); if the last Build
//!   (highest `image.kpack.io/buildNumber` among Builds labelled `image.kpack.io/image=<image>`)
//!   is running it stops; otherwise, if a build is required — no last Build (CONFIG: "the old
//!   config is empty"), a changed config (env, resources, services, cnbBindings, source; every
//!   Image generation Korifi writes changes one of these), or the `additionalBuildNeeded`
//!   annotation (TRIGGER) — it creates Build `<image>-build-<last+1>` (ref §2.2) and records
//!   `latestBuildRef`, `latestBuildImageGeneration`, `buildCounter` in the Image status.
//! - **Build reconciler** (ref §2.3, `pkg/reconciler/build`): enqueued by its own Build events
//!   and by events of Pods it controls; while the Build is not finished and its pod
//!   `<build>-build-pod` is missing from the cache, it creates the pod (ref §2.2).
//! - **Versions** (ref §2.4): [`KpackVersion::V0_16`] hands every event of the primary informers
//!   to the reconcilers, so terminating Images/Builds are reconciled like live ones.
//!   [`KpackVersion::V0_17`] (PR #1820) wraps only the *primary* handlers in
//!   `cache.FilteringResourceEventHandler{FilterFunc: FilterDeletionTimestamp}`; `Reconcile`
//!   itself has no deletionTimestamp check and the secondary handlers (Build → Image,
//!   Pod → Build) are unfiltered, so e.g. a Build deleted under a terminating Image still
//!   re-enqueues that Image, which builds again. Faithful to client-go, the filtered handler
//!   still enqueues once on the transition to terminating (`OnUpdate` calls `OnDelete(old)`).
//! - **Errors**: a failed create (e.g. denied by an admission webhook, or the namespace is
//!   terminating) is counted and returned, so the key is retried with client-go's default
//!   controller backoff, as knative does; a 422 Invalid pod is kpack's permanent error (the Build
//!   is marked failed, no retry).
//! - kpack sets no finalizers of its own (ref §2.4). Other parties' mutating webhooks on Build
//!   CREATE ([`BuildWebhook`], e.g. Korifi's finalizer webhook, ref §1.2) run inside kpack's
//!   create request, so their effect is stored with the Build from its first version.
//!
//! Not emulated (simplifications): SourceResolvers, the cache PVC, builders (every builder is
//! taken as ready, so `isBuildRequired` is never Unknown), registries, history limits
//! (`deleteOldBuilds` never finds finished Builds), and pods never run — so Builds never finish
//! and stay "running" (`Succeeded=Unknown`) until deleted.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use kube::{
    Client,
    api::{DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{
    Scope, Tasks, api_code, child_name, condition_status, controller_of, is_terminating, label, labels,
    namespaced, owner_reference, resources,
    runtime::{Action, Change, Informer, ObjectKey, ScopeFilter, WorkQueue, spawn_controller},
};

pub const IMAGE_LABEL: &str = "image.kpack.io/image";
pub const IMAGE_GENERATION_LABEL: &str = "image.kpack.io/imageGeneration";
pub const BUILD_NUMBER_LABEL: &str = "image.kpack.io/buildNumber";
/// On build pods: the Build's name (ref §2.2).
pub const BUILD_LABEL: &str = "kpack.io/build";
/// On a Build: asks for one more build (TRIGGER, ref §2.3).
pub const BUILD_NEEDED_ANNOTATION: &str = "image.kpack.io/additionalBuildNeeded";
const REASON_ANNOTATION: &str = "image.kpack.io/reason";
const BUILD_CHANGES_ANNOTATION: &str = "image.kpack.io/buildChanges";
const BUILDER_NAME_ANNOTATION: &str = "image.kpack.io/builderName";
const BUILDER_KIND_ANNOTATION: &str = "image.kpack.io/builderKind";

/// knative.dev/pkg/controller's default number of workers per controller.
const WORKERS: usize = 2;
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// Another party's mutating admission webhook on kpack Build CREATE (Korifi's finalizer webhook,
/// ref §1.2): the API server applies it within kpack's create request, so the emulated kpack
/// applies it to each Build before sending it.
pub type BuildWebhook = fn(&mut DynamicObject);

/// Which kpack release's event handling to emulate (ref §2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KpackVersion {
    /// Before PR #1820: terminating Images and Builds are reconciled like live ones.
    V0_16,
    /// PR #1820 (v0.17.0): primary events of terminating objects are filtered out;
    /// secondary events (Build → Image, Pod → Build) still reconcile them.
    V0_17,
}

/// What kpack created.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    Build,
    Pod,
}

/// One successful create by the emulated kpack.
#[derive(Clone, Debug)]
pub struct Creation {
    /// When the create request was sent.
    pub at: Instant,
    pub kind: Created,
    pub namespace: String,
    pub name: String,
    /// The Image the object belongs to (its `image.kpack.io/image` label).
    pub image: String,
    /// Whether the owner (the Image of a Build, the Build of a pod) was terminating as kpack saw it.
    pub owner_terminating: bool,
}

/// One create kpack attempted and the API server refused.
#[derive(Clone, Debug)]
pub struct Denial {
    pub at: Instant,
    pub kind: Created,
    pub namespace: String,
    pub name: String,
    /// HTTP status (0 if no response).
    pub code: u16,
    /// The API server's message (it names who refused and why).
    pub message: String,
}

/// Counters since the emulator started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KpackCounts {
    pub builds_created: u64,
    pub pods_created: u64,
    /// Creates refused by admission or validation (HTTP 400, 403, 422): webhook denials,
    /// NamespaceLifecycle in a terminating namespace, a missing service account.
    pub creations_denied: u64,
    /// Other failed creates (e.g. 409 AlreadyExists from a stale cache, 404, transport errors).
    pub creation_errors: u64,
    /// Reconciles of an Image or Build that had a deletionTimestamp.
    pub terminating_reconciles: u64,
    /// Events of the primary informers (Images, Builds) whose object had a deletionTimestamp.
    pub terminating_primary_events: u64,
    /// Of those, the ones v0.17's `FilterDeletionTimestamp` kept from the work queue.
    pub filtered_primary_events: u64,
}

#[derive(Default)]
struct Stats {
    builds: AtomicU64,
    pods: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
    terminating: AtomicU64,
    terminating_events: AtomicU64,
    filtered_events: AtomicU64,
    creations: Mutex<Vec<Creation>>,
    denials: Mutex<Vec<Denial>>,
}

impl Stats {
    /// `sent`: when the create request went out (what "created after the delete" is judged by:
    /// a create sent just before the delete may return just after it).
    fn created(&self, kind: Created, object: &DynamicObject, owner_terminating: bool, sent: Instant) {
        match kind {
            Created::Build => &self.builds,
            Created::Pod => &self.pods,
        }
        .fetch_add(1, Ordering::Relaxed);
        self.creations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Creation {
                at: sent,
                kind,
                namespace: object.metadata.namespace.clone().unwrap_or_default(),
                name: object.metadata.name.clone().unwrap_or_default(),
                image: label(object, IMAGE_LABEL).unwrap_or_default().to_string(),
                owner_terminating,
            });
    }

    fn failed(&self, kind: Created, namespace: &str, name: &str, error: &kube::Error) {
        let code = api_code(error).unwrap_or(0);
        if matches!(code, 400 | 403 | 422) {
            self.denied.fetch_add(1, Ordering::Relaxed);
            self.denials
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Denial {
                    at: Instant::now(),
                    kind,
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    code,
                    message: match error {
                        kube::Error::Api(status) => status.message.clone(),
                        other => other.to_string(),
                    },
                });
        } else {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A running kpack emulation; stopped by [`KpackEmulator::stop`], its token, or drop.
pub struct KpackEmulator {
    version: KpackVersion,
    stats: Arc<Stats>,
    tasks: Tasks,
}

struct Kpack {
    client: Client,
    images: Arc<Informer>,
    builds: Arc<Informer>,
    pods: Arc<Informer>,
    build_webhooks: Vec<BuildWebhook>,
    stats: Arc<Stats>,
}

impl KpackEmulator {
    /// Starts kpack's image and build reconcilers for the namespaces in `scope`, with the cluster's
    /// `build_webhooks`; returns once their caches are synced. Stops when `cancel` (or the
    /// emulator's own stop) fires.
    pub async fn start(
        client: Client,
        version: KpackVersion,
        scope: Scope,
        build_webhooks: &[BuildWebhook],
        cancel: &CancellationToken,
    ) -> Result<Self> {
        let mut tasks = Tasks::new(cancel);
        let images = Informer::new(&client, &resources::image());
        let builds = Informer::new(&client, &resources::build());
        let pods = Informer::new(&client, &resources::pod());
        let namespaces = Informer::new(&client, &resources::namespace());
        let image_queue = WorkQueue::new(tasks.cancel.clone());
        let build_queue = WorkQueue::new(tasks.cancel.clone());

        // image.NewController (ref §2.3, §2.4): the primary Image handler, and Builds it
        // controls enqueue the Image (unfiltered in both versions).
        let stats = Arc::new(Stats::default());
        images.on_change(primary_handler(version, image_queue.clone(), stats.clone()));
        builds.on_change(enqueue_controller_of("kpack.io", "Image", image_queue.clone()));
        // build.NewController: the primary Build handler, and Pods it controls enqueue the Build.
        builds.on_change(primary_handler(version, build_queue.clone(), stats.clone()));
        pods.on_change(enqueue_controller_of("kpack.io", "Build", build_queue.clone()));

        let informers = [images.clone(), builds.clone(), pods.clone(), namespaces.clone()];
        for informer in &informers {
            tasks.set.spawn(informer.clone().run(tasks.cancel.clone()));
        }

        let kpack = Arc::new(Kpack {
            client: client.clone(),
            images: images.clone(),
            builds: builds.clone(),
            pods: pods.clone(),
            build_webhooks: build_webhooks.to_vec(),
            stats: stats.clone(),
        });
        let scope = ScopeFilter::new(&client, scope, namespaces);
        let caches = informers.to_vec();
        let k = kpack.clone();
        spawn_controller(
            &mut tasks.set,
            "kpack-images",
            image_queue,
            WORKERS,
            scope.clone(),
            caches.clone(),
            Arc::new(move |key| Box::pin(k.clone().reconcile_image(key))),
        );
        let k = kpack;
        spawn_controller(
            &mut tasks.set,
            "kpack-builds",
            build_queue,
            WORKERS,
            scope,
            caches,
            Arc::new(move |key| Box::pin(k.clone().reconcile_build(key))),
        );

        for informer in &informers {
            tokio::time::timeout(SYNC_TIMEOUT, informer.synced())
                .await
                .context("kpack emulator caches did not sync")?;
        }
        tracing::info!(?version, "kpack EMULATOR started");
        Ok(Self {
            version,
            stats,
            tasks,
        })
    }

    pub fn version(&self) -> KpackVersion {
        self.version
    }

    pub fn counts(&self) -> KpackCounts {
        let s = &self.stats;
        KpackCounts {
            builds_created: s.builds.load(Ordering::Relaxed),
            pods_created: s.pods.load(Ordering::Relaxed),
            creations_denied: s.denied.load(Ordering::Relaxed),
            creation_errors: s.errors.load(Ordering::Relaxed),
            terminating_reconciles: s.terminating.load(Ordering::Relaxed),
            terminating_primary_events: s.terminating_events.load(Ordering::Relaxed),
            filtered_primary_events: s.filtered_events.load(Ordering::Relaxed),
        }
    }

    /// Every successful create, in order.
    pub fn creations(&self) -> Vec<Creation> {
        self.stats
            .creations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Creates at or after `since`.
    pub fn creations_since(&self, since: Instant) -> Vec<Creation> {
        self.creations().into_iter().filter(|c| c.at >= since).collect()
    }

    /// Every refused create, in order (the API server's message names who refused and why).
    pub fn denials(&self) -> Vec<Denial> {
        self.stats
            .denials
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Cancels the reconcilers and watches and waits for them to end.
    pub async fn stop(mut self) {
        self.tasks.stop().await;
    }
}

/// The primary informer's handler, per version (ref §2.4). v0.16: `controller.HandleAll(Enqueue)`.
/// v0.17: the same behind client-go's `FilteringResourceEventHandler` with
/// `FilterDeletionTimestamp`: add/delete pass only objects without a deletionTimestamp; an update
/// is forwarded as update (both pass), add (only the new passes), delete of the old object (only
/// the old passes — which, through `HandleAll`, still enqueues the key once), or dropped.
fn primary_handler(
    version: KpackVersion,
    queue: Arc<WorkQueue>,
    stats: Arc<Stats>,
) -> impl Fn(&Change) + Send + Sync + 'static {
    move |change| {
        let enqueue = |object: &DynamicObject| queue.add(ObjectKey::of(object));
        let live = |object: &DynamicObject| !is_terminating(object);
        let current = match change {
            Change::Added(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        };
        if !live(current) {
            stats.terminating_events.fetch_add(1, Ordering::Relaxed);
        }
        let filtered = || {
            stats.filtered_events.fetch_add(1, Ordering::Relaxed);
        };
        match (version, change) {
            (KpackVersion::V0_16, Change::Added(o) | Change::Deleted(o)) => enqueue(o),
            (KpackVersion::V0_16, Change::Updated { new, .. }) => enqueue(new),
            (KpackVersion::V0_17, Change::Added(o) | Change::Deleted(o)) => {
                if live(o) {
                    enqueue(o);
                } else {
                    filtered();
                }
            }
            (KpackVersion::V0_17, Change::Updated { old, new }) => match (live(old), live(new)) {
                (_, true) => enqueue(new),
                (true, false) => enqueue(old),
                (false, false) => filtered(),
            },
        }
    }
}

/// `FilteringResourceEventHandler{FilterControllerGK(gk), HandleAll(EnqueueControllerOf)}`: an
/// event of an object whose controller is of `group`/`kind` enqueues that controller.
fn enqueue_controller_of(
    group: &'static str,
    kind: &'static str,
    queue: Arc<WorkQueue>,
) -> impl Fn(&Change) + Send + Sync + 'static {
    move |change| {
        let object = match change {
            Change::Added(o) | Change::Deleted(o) => o,
            Change::Updated { new, .. } => new,
        };
        if let Some(owner) = controller_of(object)
            && owner.kind == kind
            && owner.api_version.split_once('/').map(|(g, _)| g) == Some(group)
        {
            queue.add(ObjectKey::new(
                object.metadata.namespace.as_deref().unwrap_or_default(),
                &owner.name,
            ));
        }
    }
}

fn build_number(build: &DynamicObject) -> u64 {
    label(build, BUILD_NUMBER_LABEL)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `Build.IsRunning()`: the Succeeded condition is missing or Unknown.
fn is_running(build: &DynamicObject) -> bool {
    matches!(condition_status(build, "Succeeded"), None | Some("Unknown"))
}

/// `Build.Finished()`: Succeeded is True or False.
fn is_finished(build: &DynamicObject) -> bool {
    !is_running(build)
}

/// Empty lists/objects and null compare equal (Go's nil vs empty in kpack's comparisons).
fn normalized(value: &Value) -> Value {
    match value {
        Value::Array(a) if a.is_empty() => Value::Null,
        Value::Object(o) if o.is_empty() => Value::Null,
        other => other.clone(),
    }
}

/// The build configuration an Image asks for, as kpack compares it for CONFIG (ref §2.3).
fn image_config(image: &DynamicObject) -> Value {
    let spec = &image.data["spec"];
    let build = &spec["build"];
    json!({
        "env": normalized(&build["env"]),
        "resources": normalized(&build["resources"]),
        "services": normalized(&build["services"]),
        "cnbBindings": normalized(&build["cnbBindings"]),
        "source": normalized(&spec["source"]),
    })
}

fn build_config(build: &DynamicObject) -> Value {
    let spec = &build.data["spec"];
    json!({
        "env": normalized(&spec["env"]),
        "resources": normalized(&spec["resources"]),
        "services": normalized(&spec["services"]),
        "cnbBindings": normalized(&spec["cnbBindings"]),
        "source": normalized(&spec["source"]),
    })
}

/// `isBuildRequired` (ref §2.3) with builder and source taken as ready: TRIGGER, CONFIG.
fn build_reasons(image: &DynamicObject, last: Option<&DynamicObject>) -> Vec<&'static str> {
    let Some(last) = last else {
        // "With no last Build, the old config is empty, so this always counts as a change."
        return vec!["CONFIG"];
    };
    let mut reasons = Vec::new();
    if last
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(BUILD_NEEDED_ANNOTATION))
    {
        reasons.push("TRIGGER");
    }
    if image_config(image) != build_config(last) {
        reasons.push("CONFIG");
    }
    reasons
}

/// `Image.Build(...)` (ref §2.2): name `<image>-build-<n>`, controller-owned by the Image, the
/// Image's labels and annotations plus kpack's.
fn new_build(image: &DynamicObject, number: u64, reasons: &[&str]) -> Result<DynamicObject> {
    let image_name = image.metadata.name.clone().unwrap_or_default();
    let generation = image.metadata.generation.unwrap_or_default();
    let spec = &image.data["spec"];
    let mut labels = labels(image);
    labels.insert(BUILD_NUMBER_LABEL.into(), number.to_string());
    labels.insert(IMAGE_LABEL.into(), image_name.clone());
    labels.insert(IMAGE_GENERATION_LABEL.into(), generation.to_string());
    let mut annotations: BTreeMap<String, String> = image.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(REASON_ANNOTATION.into(), reasons.join(","));
    annotations.insert(BUILD_CHANGES_ANNOTATION.into(), "[]".into());
    annotations.insert(
        BUILDER_NAME_ANNOTATION.into(),
        spec["builder"]["name"].as_str().unwrap_or_default().into(),
    );
    annotations.insert(
        BUILDER_KIND_ANNOTATION.into(),
        spec["builder"]["kind"].as_str().unwrap_or_default().into(),
    );
    let tag = spec["tag"].as_str().unwrap_or_default();
    let stamp = k8s_openapi::jiff::Timestamp::now().strftime("%Y%m%d.%H%M%S");
    let mut build_spec = json!({
        "tags": [tag, format!("{tag}:b{number}.{stamp}")],
        "builder": {"image": format!("registry.example/kpack/builders/{}", spec["builder"]["name"].as_str().unwrap_or("builder"))},
        "serviceAccountName": spec["serviceAccountName"].as_str().unwrap_or("default"),
        "source": spec["source"],
        "services": spec["build"]["services"],
        "cnbBindings": spec["build"]["cnbBindings"],
        "env": spec["build"]["env"],
        "resources": spec["build"]["resources"],
    });
    if spec["cache"]["volume"].is_object() {
        build_spec["cache"] = json!({"volume": {"persistentVolumeClaimName": format!("{image_name}-cache")}});
    }
    if let Value::Object(fields) = &mut build_spec {
        fields.retain(|_, v| !v.is_null());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": resources::build().api_version,
        "kind": "Build",
        "metadata": {
            "name": child_name(&image_name, &format!("-build-{number}")),
            "namespace": image.metadata.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(image, &resources::image(), true)],
        },
        "spec": build_spec,
    }))?)
}

/// The build pod (ref §2.2): `<build>-build-pod`, controller-owned by the Build, the Build's
/// labels plus `kpack.io/build`, `restartPolicy: Never`, and the `restricted` Pod Security
/// settings kpack's build pods carry (Korifi's namespaces enforce that profile). Otherwise the
/// spec is the smallest the API server accepts.
fn build_pod(build: &DynamicObject, name: &str) -> Result<DynamicObject> {
    static RESTRICTED_CONTAINER: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(
        || json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}),
    );
    let mut labels = labels(build);
    labels.insert(
        BUILD_LABEL.into(),
        build.metadata.name.clone().unwrap_or_default(),
    );
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": build.metadata.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(build, &resources::build(), true)],
        },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": build.data["spec"]["serviceAccountName"].as_str().unwrap_or("default"),
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": [{"name": "prepare", "image": "registry.example/kpack/build-init", "securityContext": RESTRICTED_CONTAINER.clone()}],
            "containers": [{"name": "completion", "image": "registry.example/kpack/completion", "securityContext": RESTRICTED_CONTAINER.clone()}],
        },
    }))?)
}

/// `desired` written into `status` only if it differs from what the cache holds (kpack's
/// `updateStatus` compares with the lister's copy first).
async fn update_status(
    client: &Client,
    resource: &kube::api::ApiResource,
    object: &DynamicObject,
    desired: Value,
) -> Result<()> {
    if object.data.get("status") == Some(&desired) {
        return Ok(());
    }
    let api = namespaced(
        client,
        resource,
        object.metadata.namespace.as_deref().unwrap_or_default(),
    );
    match api
        .patch_status(
            object.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": desired })),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(drop).context("updating status"),
    }
}

fn status_of(object: &DynamicObject) -> Value {
    match object.data.get("status") {
        Some(status @ Value::Object(_)) => status.clone(),
        _ => json!({}),
    }
}

impl Kpack {
    /// `image.Reconciler.Reconcile` / `reconcileImage` (ref §2.3).
    async fn reconcile_image(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(image) = self.images.get(&key) else {
            return Ok(Action::Done);
        };
        if is_terminating(&image) {
            self.stats.terminating.fetch_add(1, Ordering::Relaxed);
        }
        let generation = image.metadata.generation.unwrap_or_default();
        let mut status = status_of(&image);
        status["observedGeneration"] = json!(generation);

        let last = self
            .builds
            .list(&key.namespace, |b| {
                label(b, IMAGE_LABEL) == Some(key.name.as_str())
            })
            .into_iter()
            .max_by_key(|b| build_number(b));
        if last.as_deref().is_some_and(is_running) {
            update_status(&self.client, &resources::image(), &image, status).await?;
            return Ok(Action::Done);
        }
        let reasons = build_reasons(&image, last.as_deref());
        if reasons.is_empty() {
            update_status(&self.client, &resources::image(), &image, status).await?;
            return Ok(Action::Done);
        }

        let number = last.as_deref().map_or(0, build_number) + 1;
        let mut build = new_build(&image, number, &reasons)?;
        for webhook in &self.build_webhooks {
            webhook(&mut build);
        }
        let name = build.metadata.name.clone().unwrap_or_default();
        let api = namespaced(&self.client, &resources::build(), &key.namespace);
        let sent = Instant::now();
        let created = match api.create(&PostParams::default(), &build).await {
            Ok(created) => created,
            Err(e) => {
                self.stats.failed(Created::Build, &key.namespace, &name, &e);
                return Err(e).with_context(|| format!("creating Build {}/{name}", key.namespace));
            }
        };
        self.stats
            .created(Created::Build, &created, is_terminating(&image), sent);
        status["latestBuildRef"] = json!(name);
        status["latestBuildReason"] = json!(reasons.join(","));
        status["latestBuildImageGeneration"] = json!(generation);
        status["buildCounter"] = json!(number);
        status["conditions"] = json!([
            {"type": "Ready", "status": "Unknown"},
            {"type": "BuilderReady", "status": "True"},
        ]);
        update_status(&self.client, &resources::image(), &image, status).await?;
        Ok(Action::Done)
    }

    /// `build.Reconciler.Reconcile` / `reconcileBuildPod` (ref §2.3).
    async fn reconcile_build(self: Arc<Self>, key: ObjectKey) -> Result<Action> {
        let Some(build) = self.builds.get(&key) else {
            return Ok(Action::Done);
        };
        if is_terminating(&build) {
            self.stats.terminating.fetch_add(1, Ordering::Relaxed);
        }
        if is_finished(&build) {
            return Ok(Action::Done);
        }
        let pod_name = child_name(&key.name, "-build-pod");
        let mut status = status_of(&build);
        status["observedGeneration"] = json!(build.metadata.generation.unwrap_or_default());
        if self
            .pods
            .get(&ObjectKey::new(&key.namespace, &pod_name))
            .is_none()
        {
            let pod = build_pod(&build, &pod_name)?;
            let api = namespaced(&self.client, &resources::pod(), &key.namespace);
            let sent = Instant::now();
            match api.create(&PostParams::default(), &pod).await {
                Ok(created) => self
                    .stats
                    .created(Created::Pod, &created, is_terminating(&build), sent),
                Err(e) if api_code(&e) == Some(422) => {
                    // IsInvalid: a permanent error; the Build fails and is not retried.
                    self.stats.failed(Created::Pod, &key.namespace, &pod_name, &e);
                    status["conditions"] =
                        json!([{"type": "Succeeded", "status": "False", "message": e.to_string()}]);
                    update_status(&self.client, &resources::build(), &build, status).await?;
                    return Ok(Action::Done);
                }
                Err(e) => {
                    self.stats.failed(Created::Pod, &key.namespace, &pod_name, &e);
                    return Err(e).with_context(|| format!("creating Pod {}/{pod_name}", key.namespace));
                }
            }
        }
        // conditionForPod: a pending pod leaves the Build running.
        status["podName"] = json!(pod_name);
        status["conditions"] = json!([{"type": "Succeeded", "status": "Unknown"}]);
        status["stepsCompleted"] = json!([]);
        update_status(&self.client, &resources::build(), &build, status).await?;
        Ok(Action::Done)
    }
}

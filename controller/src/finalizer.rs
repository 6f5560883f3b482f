//! The fast finalizer: when an app is on its way out, remove what
//! keeps kpack building for it, at once and event-driven.
//!
//! - A CFApp being deleted, the last BuildWorkload of an app being deleted, or a namespace being
//!   deleted: delete the app's kpack Image (background propagation), so kpack has nothing left
//!   to build for and the garbage collector takes its Builds and pods.
//! - A kpack Build being deleted: delete its build pods with grace period 0.
//! - A namespace being deleted, with `--delete-org-spaces`: also delete the Korifi CFSpaces in it
//!   (an org namespace), which the namespace controller would delete only on its first pass, 5 s
//!   later.
//!
//! Every deletion is one of [`crate::deletable::DELETABLE`] and checked with
//! [`crate::deletable::permits`]: a child goes for an owner only when its ownerReference names
//! that owner's uid, never because of its name or labels. holdfast adds no finalizer and removes
//! nobody's: if it is down, deletion still completes (only slower). Objects that are not being
//! deleted are not touched.

use std::{sync::Arc, time::Duration};

use futures::{StreamExt, future::BoxFuture};
use holdfast_peers::{
    Served,
    korifi::{self, APP_GUID_LABEL},
    kpack,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
        Preconditions, PropagationPolicy,
    },
    runtime::{Controller, WatchStreamExt, controller::Action},
};
use tokio_util::sync::CancellationToken;

use crate::{
    deletable::{
        self, APP_BUILD, APP_BUILD_WORKLOAD, APP_IMAGE, APP_PACKAGE, APP_PROCESS, APP_WORKLOAD, BUILD_POD,
        Deletable, NAMESPACE_IMAGE, NAMESPACE_SPACE, Observed, WORKLOAD_IMAGE,
    },
    metrics::Metrics,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Deadline(#[from] crate::metrics::DeadlineExceeded),
}

/// The fast finalizer's opt-in deletions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Options {
    /// `--delete-org-spaces`: delete the CFSpaces of a terminating org namespace at once.
    pub delete_org_spaces: bool,
}

struct Ctx {
    client: Client,
    image: ApiResource,
    build_workload: Option<ApiResource>,
    /// The leaves of a CFApp's tree and their parents (see [`delete_leaves`]), where served.
    leaves: Leaves,
    namespaces: Terminating,
    /// Only with [`Options::delete_org_spaces`].
    cf_space: Option<ApiResource>,
    metrics: Arc<Metrics>,
}

/// What the finalizer knows of each namespace being deleted (by uid), until it is done with it.
#[derive(Default)]
struct Terminating(std::sync::Mutex<std::collections::HashMap<String, Progress>>);

#[derive(Default, Clone, Copy)]
struct Progress {
    /// Its Images (and with `--delete-org-spaces` its CFSpaces) were deleted.
    cleared: bool,
    /// Running pods were seen in it.
    pods_seen: bool,
}

/// What the pods of a namespace being deleted ask of the finalizer.
#[derive(Debug, PartialEq, Eq)]
enum Pods {
    /// Some run: count again soon.
    Running,
    /// The last running pod went since the last count: nudge the namespace controller.
    LastGone,
    /// None ran since it started deleting (or it was nudged): nothing to do.
    None,
}

impl Terminating {
    fn with<T>(&self, uid: &str, f: impl FnOnce(&mut Progress) -> T) -> T {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(map.entry(uid.to_string()).or_default())
    }

    /// Whether its Images are still to delete.
    fn first_pass(&self, uid: &str) -> bool {
        self.with(uid, |p| !p.cleared)
    }

    fn cleared(&self, uid: &str) {
        self.with(uid, |p| p.cleared = true);
    }

    /// `running` pods were counted in it; once it has none left and none will come (a
    /// terminating namespace admits no new pod), it is forgotten.
    fn pods(&self, uid: &str, running: usize) -> Pods {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let progress = map.entry(uid.to_string()).or_default();
        if running > 0 {
            progress.pods_seen = true;
            return Pods::Running;
        }
        let seen = progress.pods_seen;
        map.remove(uid);
        if seen { Pods::LastGone } else { Pods::None }
    }
}

/// Korifi's kinds below a CFApp that [`delete_leaves`] reads or deletes, where served.
#[derive(Default)]
struct Leaves {
    cf_package: Option<ApiResource>,
    cf_build: Option<ApiResource>,
    cf_process: Option<ApiResource>,
    app_workload: Option<ApiResource>,
}

/// The metrics' name of this controller.
const CONTROLLER: &str = "finalizer";

/// The kinds the fast finalizer reads or deletes with `options`, to be discovered for [`run`].
pub fn kinds(options: Options) -> Vec<GroupVersionKind> {
    let mut kinds = vec![
        kpack::image(),
        kpack::build(),
        korifi::cf_app(),
        korifi::build_workload(),
    ];
    if options.delete_org_spaces {
        kinds.push(korifi::cf_space());
    }
    kinds.extend(
        [
            korifi::CF_PACKAGE,
            korifi::CF_BUILD,
            korifi::CF_PROCESS,
            korifi::APP_WORKLOAD,
        ]
        .map(korifi::kind),
    );
    kinds
}

/// Deletes the object read as `object`, with `params`, only while it is that object: the uid
/// is a precondition, so an object deleted and re-created under its name between the check and
/// the delete (one the check never saw) is left alone. `false` when it was already gone (404)
/// or replaced (409).
async fn delete_present<K>(api: &Api<K>, object: &DynamicObject, params: &DeleteParams) -> Result<bool, Error>
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = object.name_any();
    let params = DeleteParams {
        preconditions: object.uid().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..params.clone()
    };
    match api.delete(&name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            tracing::info!(name, reason = %e.message, "not deleted: replaced since it was checked");
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// [`run`] over the kinds the cluster serves now, as a term would find them (for a finalizer
/// run without one: the e2e suites').
pub async fn discover_and_run(
    client: Client,
    options: Options,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let served = Served::discover(&client, kinds(options), "the fast finalizer skips it").await;
    run(client, served, options, metrics, cancel).await;
}

/// Runs the finalizer's controllers over the kinds `served` of [`kinds`] until `cancel`.
/// Without kpack there is nothing to do.
pub async fn run(
    client: Client,
    served: Served,
    options: Options,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let Some(image) = served.get(&kpack::image()) else {
        return;
    };
    let build = served.get(&kpack::build());
    let cfapp = served.get(&korifi::cf_app());
    let build_workload = served.get(&korifi::build_workload());
    let cf_space = options
        .delete_org_spaces
        .then(|| served.get(&korifi::cf_space()))
        .flatten();
    let leaves = Leaves {
        cf_package: served.get(&korifi::kind(korifi::CF_PACKAGE)),
        cf_build: served.get(&korifi::kind(korifi::CF_BUILD)),
        cf_process: served.get(&korifi::kind(korifi::CF_PROCESS)),
        app_workload: served.get(&korifi::kind(korifi::APP_WORKLOAD)),
    };
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        image,
        build_workload: build_workload.clone(),
        leaves,
        namespaces: Terminating::default(),
        cf_space,
        metrics,
    });

    let mut loops: Vec<BoxFuture<'static, ()>> = Vec::new();
    if let Some(resource) = cfapp {
        loops.push(dynamic(&client, resource, &cancel, &ctx, |o, c| {
            Box::pin(app_deleting(o, c))
        }));
    }
    if let Some(resource) = build_workload {
        loops.push(dynamic(&client, resource, &cancel, &ctx, |o, c| {
            Box::pin(build_workload_deleting(o, c))
        }));
    }
    if let Some(resource) = build {
        loops.push(dynamic(&client, resource, &cancel, &ctx, |o, c| {
            Box::pin(build_deleting(o, c))
        }));
    }
    loops.push(dynamic(
        &client,
        ApiResource::erase::<Namespace>(&()),
        &cancel,
        &ctx,
        |o, c| Box::pin(namespace_deleting(o, c)),
    ));
    futures::future::join_all(loops).await;
}

/// What the fast finalizer keeps of the namespaces, CFApps, BuildWorkloads and Builds it watches:
/// their metadata without `managedFields`. Its reconcilers read names, labels, uids and deletion
/// timestamps only; whole objects (a Build's spec and status, everyone's managedFields) were most
/// of the controller's memory on a large cluster (BENCHMARKS.md, bench-scale).
type Meta = holdfast_peers::Meta;

type Reconcile = fn(Arc<Meta>, Arc<Ctx>) -> BoxFuture<'static, Result<Action, Error>>;

fn dynamic(
    client: &Client,
    resource: ApiResource,
    cancel: &CancellationToken,
    ctx: &Arc<Ctx>,
    reconcile: Reconcile,
) -> BoxFuture<'static, ()> {
    let (reader, events) = holdfast_peers::metadata_reflector(client.clone(), &resource);
    let objects = events.applied_objects();
    // The kinds are the discovered ones of a fixed list: known names for the metrics' label.
    let kind: &'static str = match resource.kind.as_str() {
        "CFApp" => "CFApp",
        "BuildWorkload" => "BuildWorkload",
        "Build" => "Build",
        "Namespace" => "Namespace",
        _ => "other",
    };
    Box::pin(
        Controller::for_stream_with(objects, reader.clone(), resource)
            .graceful_shutdown_on(cancel.clone().cancelled_owned())
            .run(
                move |object, ctx: Arc<Ctx>| async move {
                    let metrics = ctx.metrics.clone();
                    metrics.reconcile(CONTROLLER, kind, reconcile(object, ctx)).await
                },
                error_policy,
                ctx.clone(),
            )
            .take_until(crate::shutdown::never_listed(cancel.clone(), reader))
            .for_each(|_| async {}),
    )
}

fn deleting<K: Resource>(object: &K) -> bool {
    object.meta().deletion_timestamp.is_some()
}

/// Deletes the kpack Image `name` in `namespace` (background), unless it is gone or going, or
/// `rule` does not permit it for the observed `owners`.
async fn delete_image(
    ctx: &Ctx,
    rule: &Deletable,
    owners: &[Observed<'_>],
    namespace: &str,
    name: &str,
    because: &str,
) -> Result<(), Error> {
    let images: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, &ctx.image);
    let Some(image) = images.get_opt(name).await? else {
        return Ok(());
    };
    if deleting(&image) {
        return Ok(());
    }
    let namespace_terminating = rule.condition == deletable::Condition::NamespaceTerminating;
    if !deletable::permits(rule, &image.metadata, owners, namespace_terminating) {
        tracing::info!(%namespace, image = name, because, "not deleting the kpack Image: no ownerReference names the owner being deleted");
        return Ok(());
    }
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    if delete_present(&images, &image, &params).await? {
        tracing::info!(%namespace, image = name, because, "deleted the kpack Image");
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(namespace = app.metadata.namespace.as_deref(), name = %app.name_any()))]
async fn app_deleting(app: Arc<Meta>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if let (true, Some(namespace), Some(uid)) = (deleting(app.as_ref()), app.namespace(), app.uid()) {
        let owner = [Observed {
            uid: &uid,
            terminating: true,
        }];
        // Korifi: one Image per app, named after the app GUID (as Korifi names it).
        delete_image(
            &ctx,
            &APP_IMAGE,
            &owner,
            &namespace,
            &app.name_any(),
            "its CFApp is being deleted",
        )
        .await?;
        delete_leaves(&ctx, &namespace, &app.name_any(), &owner).await?;
    }
    Ok(Action::await_change())
}

/// A terminating CFApp's tree, at once: its CFPackages, CFBuilds and
/// CFProcesses (which it controls), then the BuildWorkloads and AppWorkloads those controlled, all
/// with background propagation. The garbage collector would delete them too, hop by hop through
/// the CFApp's foreground deletion at its own request rate; deleted together, their finalizers
/// run side by side from the start (the AppWorkloads' is what starts the app pods' grace period).
/// Parents first: a live CFProcess re-creates an AppWorkload deleted under it. The app label only
/// finds candidates: each goes only when its chain of controller references names the CFApp's
/// uid ([`deletable::permits`]). Nobody's finalizer is touched: each one still runs.
async fn delete_leaves(ctx: &Ctx, namespace: &str, app: &str, owner: &[Observed<'_>]) -> Result<(), Error> {
    let selector = format!("{APP_GUID_LABEL}={app}");
    if let Some(packages) = &ctx.leaves.cf_package {
        delete_children(ctx, packages, &APP_PACKAGE, namespace, &selector, owner).await?;
    }
    let chains = [
        (
            &ctx.leaves.cf_build,
            &APP_BUILD,
            &ctx.build_workload,
            &APP_BUILD_WORKLOAD,
        ),
        (
            &ctx.leaves.cf_process,
            &APP_PROCESS,
            &ctx.leaves.app_workload,
            &APP_WORKLOAD,
        ),
    ];
    for (parent, parent_rule, leaf, leaf_rule) in chains {
        let Some(parent) = parent else {
            continue;
        };
        let parents: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, parent);
        let parents = parents
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        let uids: Vec<(String, &DynamicObject)> =
            parents.iter().filter_map(|p| Some((p.uid()?, p))).collect();
        let observed: Vec<Observed<'_>> = uids
            .iter()
            .map(|(uid, p)| deletable::through(leaf_rule, uid, &p.metadata, owner))
            .collect();
        delete_children(ctx, parent, parent_rule, namespace, &selector, owner).await?;
        if let Some(leaf) = leaf {
            delete_children(ctx, leaf, leaf_rule, namespace, &selector, &observed).await?;
        }
    }
    Ok(())
}

/// Deletes the objects of `resource` in `namespace` that `selector` finds and `rule` permits for
/// the observed `owners` (background propagation, the rule's grace period), skipping those
/// already going.
async fn delete_children(
    ctx: &Ctx,
    resource: &ApiResource,
    rule: &Deletable,
    namespace: &str,
    selector: &str,
    owners: &[Observed<'_>],
) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, resource);
    let params = DeleteParams {
        grace_period_seconds: rule.grace_period_seconds.map(|s| s as u32),
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    for child in api.list(&ListParams::default().labels(selector)).await?.items {
        if deleting(&child) {
            continue;
        }
        if !deletable::permits(rule, &child.metadata, owners, false) {
            tracing::info!(%namespace, kind = rule.kind, name = %child.name_any(), selector, "not deleting: no controller reference names the owner being deleted");
            continue;
        }
        if delete_present(&api, &child, &params).await? {
            tracing::info!(%namespace, kind = rule.kind, name = %child.name_any(), "deleted a leaf of a terminating owner");
        }
    }
    Ok(())
}

#[tracing::instrument(skip_all, fields(namespace = workload.metadata.namespace.as_deref(), name = %workload.name_any()))]
async fn build_workload_deleting(workload: Arc<Meta>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (true, Some(namespace), Some(app)) = (
        deleting(workload.as_ref()),
        workload.namespace(),
        workload.labels().get(APP_GUID_LABEL).cloned(),
    ) else {
        return Ok(Action::await_change());
    };
    let Some(resource) = &ctx.build_workload else {
        return Ok(Action::await_change());
    };
    let workloads: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, resource);
    let others = workloads
        .list(&ListParams::default().labels(&format!("{APP_GUID_LABEL}={app}")))
        .await?;
    // Only the app's last BuildWorkload: the Image is shared by all of them.
    if others.items.iter().all(deleting) {
        let uids: Vec<(String, bool)> = others
            .items
            .iter()
            .filter_map(|w| Some((w.uid()?, deleting(w))))
            .collect();
        let owners: Vec<Observed<'_>> = uids
            .iter()
            .map(|(uid, terminating)| Observed {
                uid,
                terminating: *terminating,
            })
            .collect();
        delete_image(
            &ctx,
            &WORKLOAD_IMAGE,
            &owners,
            &namespace,
            &app,
            "the app's last BuildWorkload is being deleted",
        )
        .await?;
    }
    Ok(Action::await_change())
}

#[tracing::instrument(skip_all, fields(namespace = build.metadata.namespace.as_deref(), name = %build.name_any()))]
async fn build_deleting(build: Arc<Meta>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (true, Some(namespace), Some(uid)) = (deleting(build.as_ref()), build.namespace(), build.uid())
    else {
        return Ok(Action::await_change());
    };
    let owner = [Observed {
        uid: &uid,
        terminating: true,
    }];
    let label = BUILD_POD.label.unwrap_or_default();
    let selector = format!("{label}={}", build.name_any());
    let pods = ApiResource::erase::<Pod>(&());
    delete_children(&ctx, &pods, &BUILD_POD, &namespace, &selector, &owner).await?;
    Ok(Action::await_change())
}

#[tracing::instrument(skip_all, fields(namespace = %namespace.name_any()))]
async fn namespace_deleting(namespace: Arc<Meta>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let (true, Some(uid)) = (deleting(namespace.as_ref()), namespace.uid()) else {
        return Ok(Action::await_change());
    };
    let name = namespace.name_any();
    if ctx.namespaces.first_pass(&uid) {
        let images: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &name, &ctx.image);
        for image in images.list(&ListParams::default()).await?.items {
            delete_image(
                &ctx,
                &NAMESPACE_IMAGE,
                &[],
                &name,
                &image.name_any(),
                "its namespace is being deleted",
            )
            .await?;
        }
        if let Some(resource) = &ctx.cf_space {
            delete_spaces(&ctx, &name, resource).await?;
        }
        ctx.namespaces.cleared(&uid);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &name);
    let running = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .count();
    match ctx.namespaces.pods(&uid, running) {
        Pods::Running => Ok(Action::requeue(POD_POLL)),
        Pods::LastGone => {
            nudge(&ctx, &name).await?;
            Ok(Action::await_change())
        }
        Pods::None => Ok(Action::await_change()),
    }
}

/// How often the pods of a namespace being deleted are counted while some run.
const POD_POLL: Duration = Duration::from_secs(1);

/// The annotation [`nudge`] writes on a namespace being deleted (the fence lets the controller
/// change it, and only it, only there).
pub const NUDGE_ANNOTATION: &str = "holdfast.dev/deletion-nudged";

/// Tells the namespace controller that a namespace being deleted holds no running pod any more.
/// While pods run in it, the namespace controller passes over it again only `grace/2 + 1` s later
/// (its estimate is the pods' whole grace period, not what is left of it: 16 s for the default
/// 30 s), but 5 s after any update of the namespace: an annotation is that update, so the
/// namespace is finished up to 11 s sooner. Nothing else of the namespace changes.
async fn nudge(ctx: &Ctx, namespace: &str) -> Result<(), Error> {
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"metadata": {"annotations": {NUDGE_ANNOTATION: now}}});
    match namespaces
        .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            tracing::info!(%namespace, "the last running pod of a namespace being deleted went: nudged the namespace controller");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the CFSpaces of a terminating (org) namespace (opt-in). The namespace controller
/// would delete them on its first pass, which comes 5 s after the namespace started terminating
/// (its grace period); deleting them now starts the spaces' own finalizers (their apps, then
/// their namespaces) that much earlier. A plain delete, as the namespace controller's.
async fn delete_spaces(ctx: &Ctx, namespace: &str, resource: &ApiResource) -> Result<(), Error> {
    let spaces: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), namespace, resource);
    for space in spaces.list(&ListParams::default()).await?.items {
        if deleting(&space) || !deletable::permits(&NAMESPACE_SPACE, &space.metadata, &[], true) {
            continue;
        }
        if delete_present(&spaces, &space, &DeleteParams::default()).await? {
            tracing::info!(%namespace, space = %space.name_any(), "deleted the CFSpace of a terminating namespace");
        }
    }
    Ok(())
}

fn error_policy<K>(object: Arc<K>, error: &Error, _: Arc<Ctx>) -> Action
where
    K: Resource,
{
    tracing::warn!(name = %object.meta().name.clone().unwrap_or_default(), %error, "fast finalizer: retrying");
    Action::requeue(Duration::from_secs(2))
}

/// The exact requests the fast finalizer sends, against a mocked API server.
#[cfg(test)]
mod tests {
    use http::{Method, StatusCode};
    use serde_json::{Value, json};

    use super::*;
    use crate::fixtures::{self, ApiServer};

    const NAMESPACE: &str = "cf-space";

    fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    fn context() -> (Arc<Ctx>, ApiServer) {
        let (client, server) = fixtures::mock();
        let ctx = Ctx {
            client,
            image: resource("kpack.io", "v1alpha2", "Image", "images"),
            build_workload: Some(resource(
                "korifi.cloudfoundry.org",
                "v1alpha1",
                "BuildWorkload",
                "buildworkloads",
            )),
            cf_space: None,
            leaves: Leaves::default(),
            namespaces: Terminating::default(),
            metrics: Arc::default(),
        };
        (Arc::new(ctx), server)
    }

    /// An object of `api_version`/`kind` in the test namespace, being deleted.
    fn terminating(api_version: &str, kind: &str, name: &str, uid: &str) -> Arc<Meta> {
        let object = json!({
            "apiVersion": api_version,
            "kind": kind,
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": uid,
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["example.com/keep"],
            },
        });
        match serde_json::from_value(object) {
            Ok(object) => Arc::new(object),
            Err(error) => panic!("test object: {error}"),
        }
    }

    fn owner(api_version: &str, kind: &str, uid: &str, controller: bool) -> Value {
        json!({"apiVersion": api_version, "kind": kind, "name": "owner", "uid": uid, "controller": controller})
    }

    fn image(name: &str, owners: &[Value]) -> Value {
        json!({
            "apiVersion": "kpack.io/v1alpha2",
            "kind": "Image",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("image-{name}"), "ownerReferences": owners},
            "spec": {"tag": "registry.example/app"},
        })
    }

    fn pod(name: &str, owners: &[Value]) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": format!("pod-{name}"),
                "labels": {"kpack.io/build": "build-1"},
                "ownerReferences": owners,
            },
            "spec": {"containers": [{"name": "step", "image": "lifecycle"}]},
        })
    }

    async fn finish(reconciled: Result<Action, Error>, server: ApiServer) {
        match reconciled {
            Ok(action) => assert_eq!(action, Action::await_change()),
            Err(error) => panic!("reconcile failed: {error}"),
        }
        server.done().await;
    }

    /// Runs `app_deleting` for the terminating CFApp `app-guid` (uid `app-1`) while `api` answers
    /// what it sends, given the path of the app's Image; then checks that it sent nothing more.
    async fn app_image_deleting<F, Fut>(api: F)
    where
        F: FnOnce(ApiServer, String) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ApiServer> + Send + 'static,
    {
        let (ctx, server) = context();
        let app = terminating("korifi.cloudfoundry.org/v1alpha1", "CFApp", "app-guid", "app-1");
        let path = format!("/apis/kpack.io/v1alpha2/namespaces/{NAMESPACE}/images/app-guid");
        let api = tokio::spawn(api(server, path));
        let reconciled = app_deleting(app, ctx).await;
        let server = api.await.unwrap_or_else(|e| panic!("mock API server: {e}"));
        finish(reconciled, server).await;
    }

    /// A terminating CFApp: its Image, whose ownerReference names the CFApp's uid, is deleted
    /// with background propagation and no grace period of holdfast's choosing (APP_IMAGE).
    #[tokio::test]
    async fn a_terminating_cfapp_has_the_image_that_names_its_uid_deleted_in_the_background() {
        app_image_deleting(|mut server, path| async move {
            let (_, answer) = server.expect(Method::GET, &path).await;
            let owned = image(
                "app-guid",
                &[owner("korifi.cloudfoundry.org/v1alpha1", "CFApp", "app-1", false)],
            );
            answer.ok(&owned);
            let (body, answer) = server.expect(Method::DELETE, &format!("{path}?")).await;
            assert_eq!(
                body,
                json!({"propagationPolicy": "Background", "preconditions": {"uid": "image-app-guid"}})
            );
            assert_eq!(APP_IMAGE.grace_period_seconds, None);
            answer.ok(&owned);
            server
        })
        .await;
    }

    /// An Image named like the terminating CFApp but owned by another uid is left alone.
    #[tokio::test]
    async fn an_image_whose_owner_reference_names_another_uid_is_not_deleted() {
        app_image_deleting(|mut server, path| async move {
            let (_, answer) = server.expect(Method::GET, &path).await;
            answer.ok(&image(
                "app-guid",
                &[owner("korifi.cloudfoundry.org/v1alpha1", "CFApp", "app-2", false)],
            ));
            server
        })
        .await;
    }

    /// An Image already gone: nothing to delete, no error.
    #[tokio::test]
    async fn an_image_already_gone_is_not_an_error() {
        app_image_deleting(|mut server, path| async move {
            let (_, answer) = server.expect(Method::GET, &path).await;
            answer.json(
                StatusCode::NOT_FOUND,
                &fixtures::status(404, "NotFound", "images.kpack.io \"app-guid\" not found"),
            );
            server
        })
        .await;
    }

    /// Issue 35: an Image deleted and re-created under the app's name between the check and the
    /// delete is another object, one no check saw: the delete carries the checked uid, the API
    /// server refuses it (409), and the reconcile ends without deleting or failing.
    #[tokio::test]
    async fn an_image_replaced_between_the_check_and_the_delete_is_left_alone() {
        app_image_deleting(|mut server, path| async move {
            let (_, answer) = server.expect(Method::GET, &path).await;
            answer.ok(&image(
                "app-guid",
                &[owner("korifi.cloudfoundry.org/v1alpha1", "CFApp", "app-1", false)],
            ));
            let (body, answer) = server.expect(Method::DELETE, &format!("{path}?")).await;
            assert_eq!(body["preconditions"], json!({"uid": "image-app-guid"}));
            answer.json(
                StatusCode::CONFLICT,
                &fixtures::status(
                    409,
                    "Conflict",
                    "Precondition failed: UID in precondition: image-app-guid, UID in object meta: other",
                ),
            );
            server
        })
        .await;
    }

    /// A terminating Build: of the pods its label finds, only the one it controls (by uid) is
    /// deleted, with the grace period DELETABLE gives build pods (0).
    #[tokio::test]
    async fn a_terminating_build_has_only_the_pod_it_controls_deleted_without_grace() {
        let (ctx, mut server) = context();
        let build = terminating("kpack.io/v1alpha2", "Build", "build-1", "build-uid-1");
        let api = tokio::spawn(async move {
            let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
            let (_, answer) = server
                .expect(
                    Method::GET,
                    &format!("{pods}?&labelSelector=kpack.io%2Fbuild%3Dbuild-1"),
                )
                .await;
            let controlled = pod(
                "controlled",
                &[owner("kpack.io/v1alpha2", "Build", "build-uid-1", true)],
            );
            answer.ok(&json!({
                "apiVersion": "v1",
                "kind": "PodList",
                "metadata": {"resourceVersion": "10"},
                "items": [
                    controlled,
                    pod("another-build", &[owner("kpack.io/v1alpha2", "Build", "build-uid-2", true)]),
                    pod("not-controller", &[owner("kpack.io/v1alpha2", "Build", "build-uid-1", false)]),
                    pod("labelled-only", &[]),
                ],
            }));
            let (body, answer) = server
                .expect(Method::DELETE, &format!("{pods}/controlled?"))
                .await;
            assert_eq!(BUILD_POD.grace_period_seconds, Some(0));
            assert_eq!(
                body,
                json!({"gracePeriodSeconds": 0, "propagationPolicy": "Background", "preconditions": {"uid": "pod-controlled"}})
            );
            answer.ok(&controlled);
            server
        });
        let reconciled = build_deleting(build, ctx).await;
        let server = api.await.unwrap_or_else(|e| panic!("mock API server: {e}"));
        finish(reconciled, server).await;
    }

    fn namespace_being_deleted() -> Arc<Meta> {
        let namespace = json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "uid": "ns-1", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        });
        Arc::new(serde_json::from_value(namespace).unwrap_or_else(|e| panic!("{e}")))
    }

    fn pod_list(phases: &[&str]) -> Value {
        let items: Vec<Value> = phases
            .iter()
            .enumerate()
            .map(|(i, phase)| {
                let mut pod = pod(&format!("pod-{i}"), &[]);
                pod["status"] = json!({"phase": phase});
                pod
            })
            .collect();
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})
    }

    /// A namespace being deleted: its Images are deleted once; while a pod runs in it, the pods
    /// are counted again every second; when the last running one is gone (a succeeded build pod
    /// does not count), the namespace gets the nudge annotation — one merge patch, nothing else.
    #[tokio::test]
    async fn the_namespace_controller_is_nudged_when_the_last_running_pod_of_a_terminating_namespace_goes() {
        let (ctx, mut server) = context();
        let namespace = namespace_being_deleted();
        let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods?");
        let api = tokio::spawn({
            let pods = pods.clone();
            async move {
                let images = format!("/apis/kpack.io/v1alpha2/namespaces/{NAMESPACE}/images?");
                let (_, answer) = server.expect(Method::GET, &images).await;
                answer.ok(&json!({"apiVersion": "kpack.io/v1alpha2", "kind": "ImageList", "metadata": {}, "items": []}));
                let (_, answer) = server.expect(Method::GET, &pods).await;
                answer.ok(&pod_list(&["Running", "Succeeded"]));
                server
            }
        });
        let first = namespace_deleting(namespace.clone(), ctx.clone()).await;
        let server = api.await.unwrap_or_else(|e| panic!("mock API server: {e}"));
        match first {
            Ok(action) => assert_eq!(action, Action::requeue(POD_POLL)),
            Err(error) => panic!("reconcile failed: {error}"),
        }
        // The same finalizer state, a fresh mock: the first one's client goes with its context.
        let (client, next) = fixtures::mock();
        let ctx = Arc::new(Ctx {
            client,
            ..Arc::try_unwrap(ctx).unwrap_or_else(|_| panic!("the context is shared"))
        });
        server.done().await;
        let mut server = next;
        let api = tokio::spawn(async move {
            let (_, answer) = server.expect(Method::GET, &pods).await;
            answer.ok(&pod_list(&["Succeeded"]));
            let (body, answer) = server
                .expect(Method::PATCH, &format!("/api/v1/namespaces/{NAMESPACE}?"))
                .await;
            let annotations = body["metadata"]["annotations"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            assert_eq!(annotations.keys().collect::<Vec<_>>(), [NUDGE_ANNOTATION]);
            assert_eq!(body.as_object().map(|b| b.len()), Some(1), "{body}");
            answer.ok(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}));
            server
        });
        let reconciled = namespace_deleting(namespace, ctx).await;
        let server = api.await.unwrap_or_else(|e| panic!("mock API server: {e}"));
        finish(reconciled, server).await;
    }

    /// A namespace being deleted in which no pod ever ran is not nudged.
    #[tokio::test]
    async fn a_terminating_namespace_without_pods_is_not_nudged() {
        let (ctx, mut server) = context();
        let api = tokio::spawn(async move {
            let images = format!("/apis/kpack.io/v1alpha2/namespaces/{NAMESPACE}/images?");
            let (_, answer) = server.expect(Method::GET, &images).await;
            answer.ok(
                &json!({"apiVersion": "kpack.io/v1alpha2", "kind": "ImageList", "metadata": {}, "items": []}),
            );
            let (_, answer) = server
                .expect(Method::GET, &format!("/api/v1/namespaces/{NAMESPACE}/pods?"))
                .await;
            answer.ok(&pod_list(&[]));
            server
        });
        let reconciled = namespace_deleting(namespace_being_deleted(), ctx).await;
        let server = api.await.unwrap_or_else(|e| panic!("mock API server: {e}"));
        finish(reconciled, server).await;
    }

    /// Objects that are not being deleted are not touched: no request at all.
    #[tokio::test]
    async fn a_live_cfapp_sends_nothing() {
        let (ctx, server) = context();
        let live = json!({
            "apiVersion": "korifi.cloudfoundry.org/v1alpha1",
            "kind": "CFApp",
            "metadata": {"name": "app-guid", "namespace": NAMESPACE, "uid": "app-1"},
        });
        let app: Meta = serde_json::from_value(live).unwrap_or_else(|e| panic!("{e}"));
        let reconciled = app_deleting(Arc::new(app), ctx).await;
        finish(reconciled, server).await;
    }
}

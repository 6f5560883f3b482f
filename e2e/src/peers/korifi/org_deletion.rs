//! The Korifi/kpack part of the org-deletion scenario (issue 14), on the real controllers: an org
//! with one space and N apps, each staged (a succeeded kpack Build, its cache volume bound by the
//! real provisioner) and running (its app pod on a kwok node); then `cf delete-org`, timed on
//! watches until everything it owned is gone — the CFOrg, both namespaces (so every object in
//! them), and the cache volumes (cluster-scoped, deleted by the provisioner once released).
//!
//! Measured here with 3 apps (2 shared cores, kpack v0.17.1): deleted in ~60 s — CFApps gone
//! after ~11 s, the space's namespace after ~53 s (its app pods end 30 s after the StatefulSets
//! go, then the namespace controller passes again), the org's after ~60 s, the CFOrg with it;
//! meanwhile kpack created ~6–7 Builds and ~5 build pods for Images whose Builds Korifi's
//! finalizer had deleted.
//!
//! What runs differently from a cluster (see also the peers' module docs): kwok ends a deleted
//! pod exactly when its grace period ends (app pods: 30 s; a kubelet whose container exits on
//! SIGTERM is faster, one whose container ignores it is as slow); build pods have already
//! succeeded, so their deletion is immediate, as on a cluster.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::future::try_join_all;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Pod};
use kube::{
    Api, Client, ResourceExt,
    runtime::wait::{await_condition, conditions::is_deleted},
};

use super::{Korifi, ROOT_NAMESPACE, cf, resource};
use crate::wait::until_listed;

/// An org made by [`populate`].
#[derive(Debug, Clone)]
pub struct PopulatedOrg {
    pub org: String,
    pub space: String,
    pub apps: Vec<cf::App>,
}

/// Creates the org, its space and `apps` apps (pushed concurrently, as several `cf push` would
/// be), and waits until every app has a succeeded build and a running pod.
pub async fn populate(client: &Client, registry: &str, korifi: &Korifi, apps: usize) -> Result<PopulatedOrg> {
    let org = cf::create_org(client, &crate::control_plane::unique_name("org")).await?;
    let space = cf::create_space(client, &org, "space").await?;
    let pushes = (0..apps).map(|i| {
        let space = space.clone();
        async move {
            let app = cf::push_app(
                client,
                registry,
                korifi.repository_prefix(),
                &space,
                &format!("app-{i}"),
            )
            .await?;
            cf::until_running(client, &app, 1).await?;
            Ok::<_, anyhow::Error>(app)
        }
    });
    let apps = try_join_all(pushes).await?;
    Ok(PopulatedOrg { org, space, apps })
}

/// How long each part of an org's deletion took, from the delete request.
#[derive(Debug, Clone, Copy)]
pub struct Deletion {
    /// The CFOrg is gone (Korifi's finalizer saw its namespace go).
    pub org: Duration,
    /// The space's CFApps are gone (the CFSpace finalizer deletes them, foreground, and waits
    /// for them up to `spaceFinalizerAppDeletionTimeout`, 60 s, before deleting the namespace).
    pub apps: Duration,
    /// The space's namespace is gone, with everything in it (then the CFSpace finalizer lets
    /// the CFSpace go, and the org's namespace can end).
    pub space_namespace: Duration,
    /// The org's namespace is gone, with everything in it.
    pub org_namespace: Duration,
    /// The apps' cache volumes are deleted too.
    pub volumes: Duration,
    /// kpack Builds, and build pods, created in the space while it was being deleted (kpack
    /// building again for Images whose Builds Korifi's finalizer deleted: korifi#3687).
    pub builds_created: usize,
    pub build_pods_created: usize,
}

impl Deletion {
    /// When the last part was done.
    pub fn total(&self) -> Duration {
        [
            self.org,
            self.apps,
            self.space_namespace,
            self.org_namespace,
            self.volumes,
        ]
        .into_iter()
        .max()
        .unwrap_or_default()
    }
}

/// `cf delete-org`, then waits (each part on a watch, at most `timeout`) until everything is gone.
pub async fn delete(client: &Client, org: &PopulatedOrg, timeout: Duration) -> Result<Deletion> {
    let orgs = kube::Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        ROOT_NAMESPACE,
        &resource("CFOrg"),
    );
    let org_uid = orgs.get(&org.org).await?.uid().context("CFOrg without uid")?;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let uid_of = |name: String| {
        let namespaces = namespaces.clone();
        async move {
            namespaces
                .get(&name)
                .await?
                .uid()
                .context("namespace without uid")
        }
    };
    let space_uid = uid_of(org.space.clone()).await?;
    let org_ns_uid = uid_of(org.org.clone()).await?;
    let space = org.space.clone();

    let builds = NewObjects::watch(Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        &org.space,
        &crate::peers::kpack::resource("Build"),
    ))
    .await?;
    let build_pods = NewObjects::watch(Api::<Pod>::namespaced(client.clone(), &org.space)).await?;

    let started = Instant::now();
    cf::delete_org(client, &org.org).await?;
    let org_gone = gone(
        format!("CFOrg {}", org.org),
        started,
        timeout,
        await_condition(orgs, &org.org, is_deleted(&org_uid)),
    );
    let space_namespace_gone = gone(
        format!("namespace {}", org.space),
        started,
        timeout,
        await_condition(namespaces.clone(), &org.space, is_deleted(&space_uid)),
    );
    let org_namespace_gone = gone(
        format!("namespace {}", org.org),
        started,
        timeout,
        await_condition(namespaces.clone(), &org.org, is_deleted(&org_ns_uid)),
    );
    let volumes_gone = async {
        let of_space = |pvs: &[PersistentVolume]| {
            !pvs.iter().any(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.claim_ref.as_ref())
                    .and_then(|c| c.namespace.as_deref())
                    == Some(space.as_str())
            })
        };
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        until_listed(pvs, Default::default(), of_space, timeout)
            .await
            .context("the apps' cache volumes")?;
        Ok::<_, anyhow::Error>(started.elapsed())
    };
    let apps_gone = async {
        let apps =
            Api::<kube::api::DynamicObject>::namespaced_with(client.clone(), &org.space, &resource("CFApp"));
        until_listed(apps, Default::default(), |apps| apps.is_empty(), timeout)
            .await
            .context("the space's CFApps")?;
        Ok::<_, anyhow::Error>(started.elapsed())
    };
    let (org, apps, space_namespace, org_namespace, volumes) = futures::try_join!(
        org_gone,
        apps_gone,
        space_namespace_gone,
        org_namespace_gone,
        volumes_gone
    )?;
    Ok(Deletion {
        org,
        apps,
        space_namespace,
        org_namespace,
        volumes,
        builds_created: builds.count(|_| true),
        build_pods_created: build_pods.count(|p: &Pod| p.labels().contains_key("kpack.io/build")),
    })
}

/// When, since `started`, `wait` (a deletion watch) resolved.
async fn gone<T, E>(
    what: String,
    started: Instant,
    timeout: Duration,
    wait: impl std::future::Future<Output = Result<T, E>>,
) -> Result<Duration>
where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::time::timeout(timeout, wait)
        .await
        .with_context(|| format!("{what} not gone after {timeout:?}"))?
        .with_context(|| format!("watching {what}"))?;
    Ok(started.elapsed())
}

/// Objects created after it started watching (new UIDs), until dropped.
struct NewObjects<K> {
    seen: std::sync::Arc<std::sync::Mutex<Vec<K>>>,
    before: std::collections::HashSet<String>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> NewObjects<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    async fn watch(api: Api<K>) -> Result<Self> {
        use futures::StreamExt as _;
        use kube::runtime::WatchStreamExt as _;
        let before = api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter_map(|o| o.meta().uid.clone())
            .collect();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let mut events =
                std::pin::pin!(kube::runtime::watcher(api, Default::default()).applied_objects());
            while let Some(event) = events.next().await {
                if let (Ok(object), Ok(mut sink)) = (event, sink.lock()) {
                    sink.push(object);
                }
            }
        });
        Ok(Self { seen, before, task })
    }

    /// How many distinct new objects matching `filter` were seen.
    fn count(&self, filter: impl Fn(&K) -> bool) -> usize {
        let seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let new: std::collections::HashSet<String> = seen
            .iter()
            .filter(|o| filter(o))
            .filter_map(|o| o.meta().uid.clone())
            .filter(|uid| !self.before.contains(uid))
            .collect();
        new.len()
    }
}

impl<K> Drop for NewObjects<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

//! The Korifi/kpack part of the org-deletion scenario (issue 14), on the real controllers: an org
//! with one space and N apps, each staged (a succeeded kpack Build, its cache volume bound by the
//! real provisioner) and running (its app pod on a kwok node); then `cf delete-org`, timed on
//! watches until the CFOrg and both namespaces (so every object that was in them) are gone, with
//! a [`Timeline`] of every object of the org: when it was created, started terminating and went.
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

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use futures::{StreamExt as _, future::try_join_all};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject},
    runtime::{WatchStreamExt as _, watcher},
};
use tokio::task::JoinSet;

use tokio_util::sync::CancellationToken;

use super::{ROOT_NAMESPACE, cf, resource};
use crate::{
    Env,
    wait::{self, until_listed},
    webhook::{LocalWebhook, Registration},
};

/// An org made by [`populate`].
#[derive(Debug, Clone)]
pub struct PopulatedOrg {
    pub org: String,
    pub space: String,
    pub apps: Vec<cf::App>,
}

/// Creates the org, its space and `apps` apps (pushed concurrently, as several `cf push` would
/// be), and waits until every app has a succeeded build and a running pod.
pub async fn populate(
    client: &Client,
    registry: &str,
    repository_prefix: &str,
    apps: usize,
) -> Result<PopulatedOrg> {
    let org = cf::create_org(client, &crate::control_plane::unique_name("org")).await?;
    let space = cf::create_space(client, &org, "space").await?;
    let pushes = (0..apps).map(|i| {
        let space = space.clone();
        async move {
            let app = cf::push_app(client, registry, repository_prefix, &space, &format!("app-{i}")).await?;
            cf::until_running(client, &app, 1).await?;
            Ok::<_, anyhow::Error>(app)
        }
    });
    let apps = try_join_all(pushes).await?;
    Ok(PopulatedOrg { org, space, apps })
}

/// holdfast as installed, in-process: the webhook with the shipped configurations (owner stamping
/// on kpack Images, the terminating guard; failure policy Ignore) serving Korifi's namespaces
/// ([`super::SCOPE`]), and the fast finalizer as `holdfast-controller` runs it.
pub struct Holdfast {
    webhook: LocalWebhook,
    cancel: CancellationToken,
    finalizer: Option<tokio::task::JoinHandle<()>>,
}

impl Holdfast {
    /// `delete_org_spaces`: `--delete-org-spaces` (`components/fast-org-deletion`).
    pub async fn start(env: &Arc<Env>, delete_org_spaces: bool) -> Result<Self> {
        let registration = Registration {
            scope: Some(super::SCOPE.into()),
            ..Registration::shipped()
        };
        let webhook = LocalWebhook::start(env.clone(), registration).await?;
        let options = holdfast_controller::finalizer::Options { delete_org_spaces };
        let cancel = CancellationToken::new();
        let finalizer = tokio::spawn(holdfast_controller::finalizer::discover_and_run(
            env.client().await?,
            options,
            Default::default(),
            cancel.clone(),
        ));
        Ok(Self {
            webhook,
            cancel,
            finalizer: Some(finalizer),
        })
    }

    /// Both die at once, as killed pods would: the webhook stops answering (its configurations
    /// stay, naming a closed port) and the fast finalizer stops mid-work.
    pub async fn kill(&mut self) {
        if let Some(running) = self.webhook.running.take() {
            running.shutdown(Duration::ZERO, Duration::ZERO).await;
        }
        self.cancel.cancel();
        if let Some(finalizer) = self.finalizer.take() {
            finalizer.abort();
            let _ = finalizer.await;
        }
    }

    /// Stops both and removes the webhook configurations.
    pub async fn stop(mut self) -> Result<()> {
        self.cancel.cancel();
        if let Some(finalizer) = self.finalizer.take() {
            let _ = finalizer.await;
        }
        self.webhook.stop().await
    }
}

/// How long each part of an org's deletion took, from the delete request.
#[derive(Debug, Clone)]
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
    /// The apps' cache volumes (cluster-scoped) are deleted too, by the provisioner.
    pub volumes: Duration,
    /// Every object of the org, created, terminating and gone.
    pub timeline: Timeline,
}

impl Deletion {
    /// The deletion time: the CFOrg and both namespaces are gone (so is everything in them).
    pub fn total(&self) -> Duration {
        [self.org, self.space_namespace, self.org_namespace]
            .into_iter()
            .max()
            .unwrap_or_default()
    }

    /// kpack Builds created in the space after the delete (kpack building again for Images whose
    /// Builds Korifi's finalizer deleted: korifi#3687).
    pub fn builds_created(&self) -> usize {
        self.timeline.created_after(|o| o.kind == "Build")
    }

    /// Build pods created in the space after the delete.
    pub fn build_pods_created(&self) -> usize {
        self.timeline.created_after(Observed::is_build_pod)
    }
}

/// When `org`'s namespace is gone but its CFSpace is still stored in it, never marked for
/// deletion: what the namespace controller leaves when it empties a namespace while a restarted
/// kube-apiserver does not serve the custom resources yet (a list or deletecollection answered
/// 404 reads as "none there", kubernetes/kubernetes#104342 and #93790 are of that class). Nobody
/// deletes such a CFSpace, so its space and apps stay. Returns what was found, for the log; none
/// when the org's deletion stopped short for any other reason.
pub async fn orphaned_space(client: &Client, org: &PopulatedOrg) -> Result<Option<String>> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt(&org.org).await?.is_some() {
        return Ok(None);
    }
    let spaces = Api::<DynamicObject>::namespaced_with(client.clone(), &org.org, &resource("CFSpace"));
    Ok(spaces
        .get_opt(&org.space)
        .await?
        .filter(|space| space.metadata.deletion_timestamp.is_none())
        .map(|space| {
            format!(
                "the org's namespace {} is gone, but its CFSpace {} (uid {}) is still stored there, never marked for deletion",
                org.org,
                org.space,
                space.metadata.uid.as_deref().unwrap_or("?")
            )
        }))
}

/// `cf delete-org`, then waits (each part on a watch, at most `timeout`) until everything is gone.
pub async fn delete(client: &Client, org: &PopulatedOrg, timeout: Duration) -> Result<Deletion> {
    let orgs = Api::<DynamicObject>::namespaced_with(client.clone(), ROOT_NAMESPACE, &resource("CFOrg"));
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

    let recorder = Recorder::start(client, &org.org, &org.space).await?;
    let started = Instant::now();
    cf::delete_org(client, &org.org).await?;
    let since_started = |gone: Result<()>| gone.map(|()| started.elapsed());
    let org_gone = async {
        since_started(
            wait::gone(orgs, &org.org, &org_uid, timeout)
                .await
                .context("the CFOrg"),
        )
    };
    let space_namespace_gone =
        async { since_started(wait::gone(namespaces.clone(), &org.space, &space_uid, timeout).await) };
    let org_namespace_gone =
        async { since_started(wait::gone(namespaces.clone(), &org.org, &org_ns_uid, timeout).await) };
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
        let apps = Api::<DynamicObject>::namespaced_with(client.clone(), &org.space, &resource("CFApp"));
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
        timeline: recorder.finish(started).await,
    })
}

/// One object of the org as the timeline's watches saw it; times in seconds after the delete
/// request (negative: before it).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub kind: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// First seen after the watches had listed what existed: created during the deletion.
    pub created: Option<f64>,
    pub terminating: Option<f64>,
    pub gone: Option<f64>,
}

impl Observed {
    pub fn is_build_pod(&self) -> bool {
        self.kind == "Pod" && self.labels.contains_key(holdfast_peers::kpack::BUILD_POD_LABEL)
    }

    pub fn is_app_pod(&self) -> bool {
        self.kind == "Pod" && !self.is_build_pod()
    }

    /// From its deletionTimestamp to gone: how long its deletion took.
    pub fn termination(&self) -> Option<f64> {
        Some(self.gone? - self.terminating?)
    }
}

/// Every object of an org's deletion, by uid, and each namespace's conditions as the namespace
/// controller reported them (what it found left), in order.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub objects: Vec<Observed>,
    pub namespace_conditions: Vec<(f64, String, String)>,
}

impl Timeline {
    fn created_after(&self, filter: impl Fn(&Observed) -> bool) -> usize {
        self.objects
            .iter()
            .filter(|o| filter(o) && o.created.is_some_and(|t| t >= 0.0))
            .count()
    }

    /// The latest termination (deletionTimestamp to gone) of the objects `filter` selects.
    pub fn longest_termination(&self, filter: impl Fn(&Observed) -> bool) -> Option<f64> {
        self.objects
            .iter()
            .filter(|o| filter(o))
            .filter_map(Observed::termination)
            .reduce(f64::max)
    }

    /// How many of the objects `filter` selects existed `t` seconds after the delete request:
    /// there before it or created by then, and not gone yet.
    pub fn alive_at(&self, t: f64, filter: impl Fn(&Observed) -> bool) -> usize {
        self.objects
            .iter()
            .filter(|o| filter(o))
            .filter(|o| o.created.is_none_or(|c| c <= t) && o.gone.is_none_or(|g| g > t))
            .count()
    }

    /// When the last of the objects `filter` selects went.
    pub fn last_gone(&self, filter: impl Fn(&Observed) -> bool) -> Option<f64> {
        self.objects
            .iter()
            .filter(|o| filter(o))
            .filter_map(|o| o.gone)
            .reduce(f64::max)
    }

    /// Per kind: how many were created during the deletion, seen terminating and gone, the first
    /// and last of each; then the namespaces' conditions in order.
    pub fn render(&self) -> String {
        #[derive(Default)]
        struct Kind {
            created: Vec<f64>,
            terminating: Vec<f64>,
            gone: Vec<f64>,
        }
        let mut kinds: BTreeMap<String, Kind> = BTreeMap::new();
        for o in &self.objects {
            let kind = match o.kind.as_str() {
                "Pod" if o.is_build_pod() => "Pod (build)".to_string(),
                "Pod" => "Pod (app)".to_string(),
                other => other.to_string(),
            };
            let entry = kinds.entry(kind).or_default();
            entry.created.extend(o.created.filter(|t| *t >= 0.0));
            entry.terminating.extend(o.terminating);
            entry.gone.extend(o.gone);
        }
        let span = |times: &[f64]| match (
            times.iter().copied().reduce(f64::min),
            times.iter().copied().reduce(f64::max),
        ) {
            (Some(first), Some(last)) => format!("{:>3} {first:>6.1}–{last:<6.1}", times.len()),
            _ => format!("{:>3} {:>13}", 0, "-"),
        };
        let mut out = vec![format!(
            "  {:<14} {:>20} {:>20} {:>20}",
            "kind", "created: n first–last", "terminating", "gone"
        )];
        for (kind, k) in &kinds {
            out.push(format!(
                "  {kind:<14} {:>20} {:>20} {:>20}",
                span(&k.created),
                span(&k.terminating),
                span(&k.gone)
            ));
        }
        for (at, namespace, conditions) in &self.namespace_conditions {
            out.push(format!("  {at:>7.1}s  namespace {namespace}: {conditions}"));
        }
        out.join("\n")
    }
}

/// The kinds a timeline watches in the org's and the space's namespaces.
fn watched_kinds() -> Vec<ApiResource> {
    let korifi = [
        "CFSpace",
        "CFApp",
        "CFBuild",
        "CFProcess",
        "CFPackage",
        "BuildWorkload",
        "AppWorkload",
    ]
    .map(resource);
    let kpack = ["Image", "Build"].map(crate::peers::kpack::resource);
    let core = [
        ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
        ApiResource::erase::<k8s_openapi::api::apps::v1::StatefulSet>(&()),
        ApiResource::erase::<k8s_openapi::api::core::v1::PersistentVolumeClaim>(&()),
    ];
    korifi.into_iter().chain(kpack).chain(core).collect()
}

/// One object as the watches saw it, at the instants they saw it.
struct Seen {
    kind: String,
    name: String,
    labels: BTreeMap<String, String>,
    created: Option<Instant>,
    terminating: Option<Instant>,
    gone: Option<Instant>,
}

#[derive(Default)]
struct Marks {
    objects: HashMap<String, Seen>,
    namespace_conditions: Vec<(Instant, String, String)>,
}

impl Marks {
    fn record(&mut self, kind: &str, object: &DynamicObject, event: Event, now: Instant) {
        let Some(uid) = object.uid() else { return };
        let fresh = !self.objects.contains_key(&uid);
        let entry = self.objects.entry(uid).or_insert_with(|| Seen {
            kind: kind.to_string(),
            name: object.name_any(),
            labels: object.labels().clone(),
            created: None,
            terminating: None,
            gone: None,
        });
        if fresh {
            entry.created = match event {
                Event::Listed => None,
                Event::Relisted => created_at(object, now),
                Event::Applied | Event::Deleted => Some(now),
            };
        }
        if entry.terminating.is_none() && object.metadata.deletion_timestamp.is_some() {
            entry.terminating = Some(now);
        }
        if event == Event::Deleted {
            entry.gone = Some(now);
        }
        if kind == "Namespace" {
            let conditions = namespace_conditions(object);
            let changed = self
                .namespace_conditions
                .iter()
                .rev()
                .find(|(_, n, _)| *n == object.name_any())
                .map_or(!conditions.is_empty(), |(_, _, c)| *c != conditions);
            if changed {
                self.namespace_conditions
                    .push((now, object.name_any(), conditions));
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// In the watch's first list: existed before.
    Listed,
    /// In a later list (the watch failed, e.g. the API server restarted, and listed again): an
    /// object not seen before was created while the watch was down.
    Relisted,
    Applied,
    Deleted,
}

/// When `object` was created by its `creationTimestamp` (whole seconds), as an instant of this
/// process's clock (`now` is now).
fn created_at(object: &DynamicObject, now: Instant) -> Option<Instant> {
    let created = std::time::SystemTime::from(object.metadata.creation_timestamp.as_ref()?.0);
    let age = std::time::SystemTime::now()
        .duration_since(created)
        .unwrap_or_default();
    now.checked_sub(age)
}

/// The watches behind a [`Timeline`], from before the delete until [`Recorder::finish`].
struct Recorder {
    marks: Arc<Mutex<Marks>>,
    tasks: JoinSet<()>,
}

impl Recorder {
    /// Starts watching the CFOrg, the two Namespaces and the kinds of [`watched_kinds`] in both;
    /// returns once every watch has listed what exists.
    async fn start(client: &Client, org: &str, space: &str) -> Result<Self> {
        let marks = Arc::new(Mutex::new(Marks::default()));
        let mut tasks = JoinSet::new();
        let mut synced = Vec::new();
        let mut watch = |api: Api<DynamicObject>, kind: String, only: Option<String>| {
            let marks = marks.clone();
            let (ready, listed) = tokio::sync::oneshot::channel::<()>();
            synced.push(listed);
            tasks.spawn(async move {
                let mut ready = Some(ready);
                let config = match &only {
                    Some(name) => watcher::Config::default().fields(&format!("metadata.name={name}")),
                    None => watcher::Config::default(),
                };
                // A failed watch lists again after a backoff (an API server restart is waited out).
                let mut events = std::pin::pin!(watcher(api, config).default_backoff());
                while let Some(event) = events.next().await {
                    let (object, event) = match event {
                        Ok(watcher::Event::Apply(o)) => (o, Event::Applied),
                        Ok(watcher::Event::Delete(o)) => (o, Event::Deleted),
                        Ok(watcher::Event::InitApply(o)) if ready.is_some() => (o, Event::Listed),
                        Ok(watcher::Event::InitApply(o)) => (o, Event::Relisted),
                        Ok(watcher::Event::InitDone) => {
                            if let Some(ready) = ready.take() {
                                let _ = ready.send(());
                            }
                            continue;
                        }
                        Ok(watcher::Event::Init) | Err(_) => continue,
                    };
                    let now = Instant::now();
                    marks
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .record(&kind, &object, event, now);
                }
            });
        };
        watch(
            Api::namespaced_with(client.clone(), ROOT_NAMESPACE, &resource("CFOrg")),
            "CFOrg".into(),
            Some(org.to_string()),
        );
        for name in [org, space] {
            watch(
                Api::all_with(client.clone(), &ApiResource::erase::<Namespace>(&())),
                "Namespace".into(),
                Some(name.to_string()),
            );
        }
        for kind in watched_kinds() {
            for namespace in [org, space] {
                watch(
                    Api::namespaced_with(client.clone(), namespace, &kind),
                    kind.kind.clone(),
                    None,
                );
            }
        }
        tokio::time::timeout(Duration::from_secs(60), try_join_all(synced))
            .await
            .context("the timeline's watches did not list within 60 s")?
            .context("a timeline watch ended")?;
        Ok(Self { marks, tasks })
    }

    /// Stops watching; the timeline in seconds after `started` (when the delete was sent).
    async fn finish(mut self, started: Instant) -> Timeline {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        let marks = std::mem::take(&mut *self.marks.lock().unwrap_or_else(PoisonError::into_inner));
        let secs = |at: Instant| match at.checked_duration_since(started) {
            Some(d) => d.as_secs_f64(),
            None => -started.duration_since(at).as_secs_f64(),
        };
        Timeline {
            objects: marks
                .objects
                .into_values()
                .map(|s| Observed {
                    kind: s.kind,
                    name: s.name,
                    labels: s.labels,
                    created: s.created.map(secs),
                    terminating: s.terminating.map(secs),
                    gone: s.gone.map(secs),
                })
                .collect(),
            namespace_conditions: marks
                .namespace_conditions
                .into_iter()
                .map(|(at, namespace, conditions)| (secs(at), namespace, conditions))
                .collect(),
        }
    }
}

/// The True conditions of a namespace, as `type: message`.
fn namespace_conditions(namespace: &DynamicObject) -> String {
    namespace.data["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "True")
        .map(|c| {
            format!(
                "{}: {}",
                c["type"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(name: &str, uid: &str, created_secs_ago: i64) -> DynamicObject {
        use k8s_openapi::jiff::{SignedDuration, Timestamp};
        let created = Timestamp::now() - SignedDuration::from_secs(created_secs_ago);
        let mut object = DynamicObject::new(name, &crate::peers::kpack::resource("Build"));
        object.metadata.uid = Some(uid.into());
        object.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created));
        object
    }

    /// An object first seen in a list after the watch failed (an API server restart) was created
    /// while the watch was down: it counts as created when its creationTimestamp says, so a Build
    /// made during the outage, after the delete, is not missed; one listed first existed before.
    #[test]
    fn an_object_first_seen_in_a_relist_is_created_by_its_timestamp() {
        let now = Instant::now();
        let mut marks = Marks::default();
        marks.record("Build", &build("before", "a", 3600), Event::Listed, now);
        marks.record("Build", &build("during", "b", 10), Event::Relisted, now);
        marks.record("Build", &build("after", "c", 0), Event::Applied, now);
        let created = |uid: &str| marks.objects[uid].created;
        assert_eq!(created("a"), None, "existed before the watch");
        let during = created("b").expect("a relisted object has a creation time");
        let age = now.duration_since(during).as_secs_f64();
        assert!((9.0..=12.0).contains(&age), "created {age} s ago, not 10");
        assert_eq!(created("c"), Some(now));
    }
}

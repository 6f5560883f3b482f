//! The peer EMULATORS (test fixtures for kpack and Korifi, `holdfast_e2e::emulators`) against the
//! real control plane and its garbage collector, without holdfast: they reproduce the deletion
//! loop holdfast fixes, and the figures they print are the baseline for holdfast's fast-deletion
//! scenarios. References "ref §N" are to `/work/shared/reference/korifi-kpack.md`.
//!
//! What they showed (see each test): when an app is deleted, kpack re-creates a Build for every
//! app after Korifi's BuildWorkload finalizer (or the garbage collector) deleted the running one,
//! and the build reconciler re-creates build pods the garbage collector deletes under a Build in
//! foreground deletion. Korifi's side converges within seconds, long before the 60 s space
//! timeout: the BuildWorkload finalizer's cached "remaining Builds" check passes in the moment
//! between a delete and kpack's next create, and the Builds kpack creates once the Image itself
//! is marked for deletion carry the Image's bumped generation, which that finalizer does not
//! select. What kpack keeps re-creating under the terminating Image then ends only when the
//! garbage collector wins a race against kpack or, at the latest, when the namespace is deleted
//! (a terminating namespace refuses creates) — without a namespace deletion it can go on for
//! minutes. Which race wins, and so how many Builds and pods appear, varies from run to run; the
//! assertions keep to what holds in every run and the figures are printed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use futures::TryStreamExt;
use holdfast_e2e::{
    Env, e2e_main,
    emulators::{
        Scope,
        korifi::{self, KorifiCounts},
        kpack::{self, Created, KpackCounts, KpackVersion},
        resources,
        runtime::{Change, Informer},
        scenario::{FastDeletion, Peers, until, until_gone},
    },
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

// Serial: holdfast's fast finalizer acts cluster-wide and would shorten the other scenarios.
e2e_main!(serial:
    korifi_holds_every_build_from_its_creation,
    v016_rebuilds_while_apps_are_deleted,
    v017_filters_its_own_events_but_still_rebuilds,
    org_deletion_completes_and_removes_namespaces,
    space_finalizer_gives_up_on_apps_after_its_timeout,
    holdfast_ends_the_build_loop,
    a_deletion_completes_when_holdfast_is_killed_midway,
);

/// Apps per scenario.
const APPS: usize = 3;
/// Upper bound for any deletion to finish (well above Korifi's 60 s space timeout).
const DELETION_LIMIT: Duration = Duration::from_secs(240);
/// How long to watch for kpack still building once Korifi is done with the deleted apps.
const LOOP_WINDOW: Duration = Duration::from_secs(15);
/// Korifi's default `spaceFinalizerAppDeletionTimeout` (ref §3).
const SPACE_TIMEOUT: Duration = Duration::from_secs(60);

fn api(client: &Client, resource: &kube::api::ApiResource, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, resource)
}

fn namespaces(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resources::namespace())
}

/// Waits, on a watch, for a build pod of `apps` in `namespace` that did not exist when the wait
/// began; `None` if none appeared within `window`.
async fn next_build_pod(
    client: &Client,
    namespace: &str,
    apps: &[String],
    window: Duration,
) -> Result<Option<Duration>> {
    let selector = format!("{} in ({})", kpack::IMAGE_LABEL, apps.join(","));
    let pods = api(client, &resources::pod(), namespace);
    let began = Instant::now();
    let wait = async {
        let stream = watcher(pods, watcher::Config::default().labels(&selector)).default_backoff();
        futures::pin_mut!(stream);
        let (mut known, mut listed) = (HashSet::new(), false);
        while let Some(event) = stream.try_next().await? {
            match event {
                watcher::Event::InitApply(o) => drop(known.insert(o.uid())),
                watcher::Event::InitDone => listed = true,
                watcher::Event::Apply(o) if listed && !known.contains(&o.uid()) => {
                    return Ok(began.elapsed());
                }
                _ => {}
            }
        }
        anyhow::bail!("watch ended")
    };
    match tokio::time::timeout(window, wait).await {
        Ok(found) => found.map(Some),
        Err(_) => Ok(None),
    }
}

/// Prints what is left in `namespace` (diagnostics for a deletion that did not complete).
async fn dump(client: &Client, namespace: &str) {
    for resource in resources::app_chain() {
        let list = match api(client, &resource, namespace).list(&Default::default()).await {
            Ok(list) => list,
            Err(e) => {
                eprintln!("left: cannot list {}: {e}", resource.plural);
                continue;
            }
        };
        for o in list {
            eprintln!(
                "left: {} {} generation={:?} deleting={} finalizers={:?} labels={:?}",
                resource.kind,
                o.name_any(),
                o.metadata.generation,
                o.metadata.deletion_timestamp.is_some(),
                o.finalizers(),
                o.labels(),
            );
        }
    }
}

/// What happened after a deletion started.
#[derive(Debug)]
struct Figures {
    version: KpackVersion,
    builds_after: usize,
    pods_after: usize,
    /// Builds created after the start, per app.
    builds_per_app: Vec<usize>,
    /// Of `builds_after`, created while kpack saw their Image terminating.
    builds_for_terminating_images: usize,
    /// Of `pods_after`, created while kpack saw their Build terminating.
    pods_for_terminating_builds: usize,
    /// Delete → the deleted Korifi objects (the CFApps, or the CFOrg) are gone.
    korifi_done: Duration,
    /// How long after `korifi_done` kpack created yet another build pod, if it did within
    /// `LOOP_WINDOW` (app deletion only).
    kpack_still_building: Option<Duration>,
    /// Delete → nothing of the apps is left, their namespace included.
    completed: Duration,
    kpack: KpackCounts,
    korifi: KorifiCounts,
    /// What the API server answered the first create it refused, if any.
    first_denial: Option<String>,
}

impl Figures {
    fn measure(peers: &Peers, apps: &[String], since: Instant, korifi_done: Duration) -> Self {
        let after: Vec<_> = peers
            .kpack
            .creations_since(since)
            .into_iter()
            .filter(|c| apps.contains(&c.image))
            .collect();
        let builds: Vec<_> = after.iter().filter(|c| c.kind == Created::Build).collect();
        let pods: Vec<_> = after.iter().filter(|c| c.kind == Created::Pod).collect();
        Self {
            version: peers.kpack.version(),
            builds_after: builds.len(),
            pods_after: pods.len(),
            builds_per_app: apps
                .iter()
                .map(|a| builds.iter().filter(|b| &b.image == a).count())
                .collect(),
            builds_for_terminating_images: builds.iter().filter(|b| b.owner_terminating).count(),
            pods_for_terminating_builds: pods.iter().filter(|p| p.owner_terminating).count(),
            korifi_done,
            kpack_still_building: None,
            completed: since.elapsed(),
            kpack: peers.kpack.counts(),
            korifi: peers.korifi.counts(),
            first_denial: peers.kpack.denials().first().map(|d| d.message.clone()),
        }
    }

    fn print(&self, what: &str) {
        let still = self.kpack_still_building.map_or("no".to_string(), |d| {
            format!("yes (a new build pod {:.1} s later)", d.as_secs_f64())
        });
        eprintln!(
            "emulators: {what}, kpack {:?}, {APPS} apps: after the deletion started kpack created {} Builds \
             ({} for terminating Images; per app {:?}) and {} build pods ({} for terminating Builds); \
             Korifi objects gone after {:.1} s; kpack still building then: {still}; all gone after {:.1} s; \
             kpack {:?}; korifi {:?}; first refused create: {:?}",
            self.version,
            self.builds_after,
            self.builds_for_terminating_images,
            self.builds_per_app,
            self.pods_after,
            self.pods_for_terminating_builds,
            self.korifi_done.as_secs_f64(),
            self.completed.as_secs_f64(),
            self.kpack,
            self.korifi,
            self.first_denial,
        );
    }

    /// What holds in every run: every app got at least one new Build after its deletion
    /// started, and the space timeout did not end anything.
    fn ensure_every_app_rebuilt(&self) -> Result<()> {
        ensure!(
            self.builds_per_app.iter().all(|n| *n >= 1),
            "an app was not rebuilt after the deletion started: {self:?}"
        );
        ensure!(
            self.korifi.space_app_timeouts == 0 && self.korifi_done < SPACE_TIMEOUT,
            "Korifi's side did not converge before the space timeout: {self:?}"
        );
        Ok(())
    }
}

/// Korifi's finalizer webhook runs inside kpack's create request (ref §1.2): every Build kpack
/// creates for a Korifi app is stored with `korifi.cloudfoundry.org/kpackBuild` from its first
/// version, so whoever deletes it, it is held until Korifi lets it go.
async fn korifi_holds_every_build_from_its_creation(env: Arc<Env>) -> Result<()> {
    let peers = Peers::start(&env, KpackVersion::V0_16, SPACE_TIMEOUT).await?;
    let created = Arc::new(Mutex::new(Vec::new()));
    let builds = Informer::new(&peers.client, &resources::build());
    let sink = created.clone();
    builds.on_change(move |change| {
        if let Change::Added(build) = change {
            sink.lock().unwrap().push(build.clone());
        }
    });
    let cancel = CancellationToken::new();
    let watch = tokio::spawn(builds.clone().run(cancel.clone()));
    builds.synced().await;
    let (_, space, apps) = peers.org_with_apps(APPS).await?;
    cancel.cancel();
    watch.await?;
    let first_versions: Vec<_> = created
        .lock()
        .unwrap()
        .iter()
        .filter(|b| b.namespace().as_deref() == Some(space.as_str()))
        .map(|b| (b.name_any(), b.finalizers().to_vec()))
        .collect();
    eprintln!("emulators: Builds as created: {first_versions:?}");
    ensure!(
        first_versions.len() >= apps.len(),
        "fewer Builds than apps seen created: {first_versions:?}"
    );
    ensure!(
        first_versions
            .iter()
            .all(|(_, finalizers)| finalizers.iter().any(|f| f == korifi::KPACK_BUILD_FINALIZER)),
        "a Build was created without Korifi's finalizer: {first_versions:?}"
    );
    peers.stop().await;
    Ok(())
}

/// `APPS` staged apps in one space, deleted in the foreground one by one as Korifi's API
/// `DeleteApp` does (ref §1.4 step 4); once the CFApps are gone, a window to see whether kpack
/// still builds; then the space is deleted, which ends whatever is left.
async fn app_deletion(env: &Env, version: KpackVersion) -> Result<Figures> {
    app_deletion_in(env, version, Scope::unique()).await
}

async fn app_deletion_in(env: &Env, version: KpackVersion, scope: Scope) -> Result<Figures> {
    let peers = Peers::start_in(env, version, SPACE_TIMEOUT, scope).await?;
    let (org, space, apps) = peers.org_with_apps(APPS).await?;

    let started = Instant::now();
    for app in &apps {
        peers.korifi.delete_app(&space, app).await?;
    }
    let cf_apps = api(&peers.client, &resources::cf_app(), &space);
    for app in &apps {
        if let Err(e) = until_gone(&cf_apps, app, DELETION_LIMIT).await {
            dump(&peers.client, &space).await;
            return Err(e);
        }
    }
    let korifi_done = started.elapsed();
    let still_building = next_build_pod(&peers.client, &space, &apps, LOOP_WINDOW).await?;

    peers.korifi.delete_space(&org, &space).await?;
    let spaces = api(&peers.client, &resources::cf_space(), &org);
    if let Err(e) = until_gone(&spaces, &space, DELETION_LIMIT).await {
        dump(&peers.client, &space).await;
        return Err(e);
    }
    until_gone(&namespaces(&peers.client), &space, DELETION_LIMIT).await?;
    let mut figures = Figures::measure(&peers, &apps, started, korifi_done);
    figures.kpack_still_building = still_building;
    peers.stop().await;
    Ok(figures)
}

/// (a) kpack v0.16 keeps creating Builds and build pods while the apps are deleted; the deletion
/// still completes, because Korifi's finalizers converge and the space's namespace deletion ends
/// kpack's part — not because of the space timeout.
async fn v016_rebuilds_while_apps_are_deleted(env: Arc<Env>) -> Result<()> {
    let figures = app_deletion(&env, KpackVersion::V0_16).await?;
    figures.print("app deletion");
    figures.ensure_every_app_rebuilt()?;
    ensure!(
        figures.builds_after + figures.pods_after > APPS,
        "no more than one new object per app: {figures:?}"
    );
    ensure!(
        figures.kpack.filtered_primary_events == 0 && figures.kpack.terminating_primary_events > 0,
        "v0.16 must hand every event of terminating objects to its reconcilers: {figures:?}"
    );
    Ok(())
}

/// (b) kpack v0.17 (PR #1820) keeps the events of terminating Images and Builds from its own
/// informers out of its work queues, yet rebuilds every app all the same: the Build-deleted and
/// Pod-deleted events that drive the loop come through the unfiltered secondary handlers
/// (ref §2.4 "Remaining gap"). Both versions run side by side and their figures are printed.
async fn v017_filters_its_own_events_but_still_rebuilds(env: Arc<Env>) -> Result<()> {
    // Side by side, so that both see the same load on the API server and garbage collector.
    let (old, new) = tokio::join!(
        app_deletion(&env, KpackVersion::V0_16),
        app_deletion(&env, KpackVersion::V0_17)
    );
    let (old, new) = (old?, new?);
    old.print("app deletion (baseline)");
    new.print("app deletion");
    new.ensure_every_app_rebuilt()?;
    ensure!(
        new.kpack.filtered_primary_events > 0,
        "v0.17 filtered no event of a terminating object: {new:?}"
    );
    eprintln!(
        "emulators: Builds created after the deletion started: v0.16 {} ({} pods), v0.17 {} ({} pods); \
         v0.17 kept {} events of terminating objects from its queues",
        old.builds_after, old.pods_after, new.builds_after, new.pods_after, new.kpack.filtered_primary_events
    );
    Ok(())
}

/// (c) Deleting an org (a plain delete, as Korifi's API does) with staged apps completes, and
/// the org and space namespaces are gone.
async fn org_deletion_completes_and_removes_namespaces(env: Arc<Env>) -> Result<()> {
    let peers = Peers::start(&env, KpackVersion::V0_16, SPACE_TIMEOUT).await?;
    let (org, space, apps) = peers.org_with_apps(APPS).await?;

    let started = Instant::now();
    peers.korifi.delete_org(&peers.root, &org).await?;
    let orgs = api(&peers.client, &resources::cf_org(), &peers.root);
    if let Err(e) = until_gone(&orgs, &org, DELETION_LIMIT).await {
        dump(&peers.client, &space).await;
        return Err(e);
    }
    let figures = Figures::measure(&peers, &apps, started, started.elapsed());
    figures.print("org deletion");
    for ns in [&org, &space] {
        ensure!(
            namespaces(&peers.client).get_opt(ns).await?.is_none(),
            "namespace {ns} still exists"
        );
    }
    figures.ensure_every_app_rebuilt()?;
    ensure!(
        figures.korifi.space_app_deletions > 0,
        "the space finalizer never deleted the apps"
    );
    peers.stop().await;
    Ok(())
}

/// The space finalizer stops waiting for CFApps after its (configurable) timeout and deletes the
/// space namespace anyway (ref §1.4 step 3, §3): an app held by a foreign finalizer keeps the
/// namespace terminating until that finalizer goes.
async fn space_finalizer_gives_up_on_apps_after_its_timeout(env: Arc<Env>) -> Result<()> {
    const TIMEOUT: Duration = Duration::from_secs(3);
    const HOLD: &str = "test.holdfast.dev/hold";
    let peers = Peers::start(&env, KpackVersion::V0_17, TIMEOUT).await?;
    let (org, space, apps) = peers.org_with_apps(1).await?;
    let cf_apps = api(&peers.client, &resources::cf_app(), &space);
    let mut finalizers = cf_apps.get(&apps[0]).await?.finalizers().to_vec();
    finalizers.push(HOLD.to_string());
    cf_apps
        .patch(
            &apps[0],
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": finalizers}})),
        )
        .await?;

    let started = Instant::now();
    peers.korifi.delete_space(&org, &space).await?;
    until(&namespaces(&peers.client), &space, DELETION_LIMIT, |ns| {
        ns.is_some_and(|ns| ns.metadata.deletion_timestamp.is_some())
    })
    .await?;
    let gave_up = started.elapsed();
    let app = cf_apps.get(&apps[0]).await?;
    eprintln!(
        "emulators: space finalizer deleted the space namespace {:.1} s after the CFSpace deletion with a CFApp left \
         (timeout {TIMEOUT:?}); korifi {:?}",
        gave_up.as_secs_f64(),
        peers.korifi.counts()
    );
    ensure!(
        app.metadata.deletion_timestamp.is_some(),
        "the held app was not deleted"
    );
    ensure!(peers.korifi.counts().space_app_timeouts > 0, "no timeout counted");
    // deletionTimestamp has whole seconds: the finalizer may see up to 1 s more than elapsed here.
    ensure!(
        gave_up + Duration::from_secs(1) >= TIMEOUT,
        "gave up after {gave_up:?}, before the {TIMEOUT:?} timeout"
    );

    // Release the app: drop only our finalizer, with an optimistic lock (the garbage collector
    // edits the same list), retrying on conflicts.
    let mut released = false;
    for _ in 0..10 {
        let app = cf_apps.get(&apps[0]).await?;
        let finalizers: Vec<_> = app.finalizers().iter().filter(|f| *f != HOLD).cloned().collect();
        let patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": app.resource_version()}});
        match cf_apps
            .patch(&apps[0], &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                released = true;
                break;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    ensure!(released, "could not remove {HOLD} from the app");
    until_gone(
        &api(&peers.client, &resources::cf_space(), &org),
        &space,
        DELETION_LIMIT,
    )
    .await?;
    until_gone(&namespaces(&peers.client), &space, DELETION_LIMIT).await?;
    peers.stop().await;
    Ok(())
}

/// The same app deletion with kpack v0.16, first as it is and then with holdfast (its webhook
/// stamping owners and guarding Builds and build pods, its fast finalizer deleting the apps'
/// Images), then with kpack v0.17 and holdfast: with holdfast, kpack creates no Build and no
/// build pod after the deletion started, in either version.
async fn holdfast_ends_the_build_loop(env: Arc<Env>) -> Result<()> {
    let baseline = app_deletion(&env, KpackVersion::V0_16).await?;
    baseline.print("app deletion without holdfast");
    let created = |f: &Figures| f.builds_after + f.pods_after;
    for version in [KpackVersion::V0_16, KpackVersion::V0_17] {
        let holdfast = FastDeletion::start(env.clone()).await?;
        let with = app_deletion_in(&env, version, holdfast.scope()).await;
        holdfast.stop().await?;
        let with = with?;
        with.print("app deletion with holdfast");
        // (The "all gone" figures are not compared: they include a window that waits for kpack's
        // next build pod, which with holdfast never comes.)
        eprintln!(
            "holdfast, kpack {version:?}: objects created after the deletion started {} (v0.16 without holdfast: {}); CFApps gone {:.1} s (without: {:.1} s)",
            created(&with),
            created(&baseline),
            with.korifi_done.as_secs_f64(),
            baseline.korifi_done.as_secs_f64(),
        );
        ensure!(
            created(&with) == 0,
            "kpack {version:?} created Builds or build pods after the deletion started: {with:?}"
        );
        ensure!(
            with.kpack_still_building.is_none(),
            "kpack still built after the apps were gone: {with:?}"
        );
    }
    ensure!(
        created(&baseline) > 0,
        "the baseline did not reproduce the loop: {baseline:?}"
    );
    Ok(())
}

/// holdfast (webhook and controller) dies while an org is being deleted: the deletion completes
/// all the same — nothing of holdfast's can hold it up (its webhooks fail open, it adds no
/// finalizers).
async fn a_deletion_completes_when_holdfast_is_killed_midway(env: Arc<Env>) -> Result<()> {
    let mut holdfast = FastDeletion::start(env.clone()).await?;
    let peers = Peers::start_in(&env, KpackVersion::V0_16, SPACE_TIMEOUT, holdfast.scope()).await?;
    let (org, space, apps) = peers.org_with_apps(APPS).await?;

    let started = Instant::now();
    peers.korifi.delete_org(&peers.root, &org).await?;
    // Mid-deletion: once holdfast's fast finalizer has deleted an app's Image.
    let images = api(&peers.client, &resources::image(), &space);
    let first = apps.first().context("no apps")?;
    until(&images, first, DELETION_LIMIT, |i| {
        i.is_none_or(|i| i.metadata.deletion_timestamp.is_some())
    })
    .await?;
    holdfast.kill().await;
    let killed = started.elapsed();

    let orgs = api(&peers.client, &resources::cf_org(), &peers.root);
    if let Err(e) = until_gone(&orgs, &org, DELETION_LIMIT).await {
        dump(&peers.client, &space).await;
        return Err(e);
    }
    for ns in [&org, &space] {
        until_gone(&namespaces(&peers.client), ns, DELETION_LIMIT).await?;
    }
    eprintln!(
        "emulators: holdfast killed {:.1} s into the org deletion; the org and its namespaces were gone after {:.1} s",
        killed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    peers.stop().await;
    holdfast.stop().await
}

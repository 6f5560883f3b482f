//! The soak (issue 33): holdfast under continuous churn while a fault injector cycles through
//! the failures it knows, one at a time with recovery between, and invariants checked all along.
//!
//! The control plane is the host-process one of `make up` and the e2e suites ([`Env`]): the
//! real kube-apiserver, etcd, kube-controller-manager, kube-scheduler and kwok, the real
//! kapp-controller, so that the soak can stop and kill them. holdfast is placed as
//! [`Placement`] says ([`replicas`]): the chart's release on `make cluster`'s real node around
//! that control plane (two pods of each Deployment, behind their Service; kills and cut links
//! in the pods), or its binaries as host processes (two webhooks behind a front that balances
//! connections, two controllers electing a leader, each through a link of its own). The
//! upstream registry is a registry of the soak's own behind a front that can answer 503 or 429,
//! slowly, or with digests nothing serves ([`faults::RegistryFront`]); the objects name the
//! front. A mirror registry (`--mirror-registry`) behind a front of its own, which can refuse
//! writes (full, read-only), holds the copies the objects of one namespace are pinned to. At
//! the end the API server's audit log judges every controller write against the Lease's terms
//! ([`leadership`]), and the mirror must serve every copy a pin named. The real Korifi on the
//! real kpack has its orgs created and deleted throughout ([`orgs`]): every deletion completes,
//! with no Build after it.

pub mod faults;
pub mod invariants;
pub mod leadership;
pub mod load;
pub mod orgs;
pub mod private;
pub mod replicas;
pub mod report;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use holdfast_pins::PinnedKind;
use kube::Api;
use tokio_util::sync::CancellationToken;

use self::{
    faults::{Fault, Injector, RegistryFront, Timeline},
    invariants::{Mirrored, Sample, Shared, Violations},
    load::{Load, Outcome, Shape},
    orgs::Orgs,
    replicas::Holdfast,
    report::{Report, Resources},
};
use crate::{Env, cluster::Node, installed::NAMESPACE};

/// How long after a fault's recovery a client's failure (or an admission let through unpinned)
/// is still the fault's: clients reconnect, and the API server's own clients resync.
const GRACE: Duration = Duration::from_secs(15);

/// Where holdfast runs in the soak ([`replicas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// As `make up` runs it: host processes.
    Processes,
    /// As `make cluster` runs it: the chart's pods on the real node.
    Node,
}

impl Placement {
    /// `SOAK_ON`: `node` (the default, as users run holdfast) or `processes`.
    pub fn from_env() -> Result<Self> {
        match std::env::var("SOAK_ON").as_deref() {
            Ok("node") | Err(_) => Ok(Placement::Node),
            Ok("processes") => Ok(Placement::Processes),
            Ok(other) => anyhow::bail!("SOAK_ON={other}: `node` (the default) or `processes`"),
        }
    }
}

/// How the soak runs.
#[derive(Debug, Clone)]
pub struct Config {
    pub placement: Placement,
    /// Faults are injected until then (and each at least once).
    pub duration: Duration,
    pub shape: Shape,
    /// The controllers' refresh interval: a moved tag's pins follow within two of them.
    pub refresh: Duration,
    /// How long each fault is held.
    pub hold: Duration,
    /// The quiet spell before each fault.
    pub quiet: Duration,
    /// How the resource samples are judged; its warm-up is also the wait before the first fault.
    pub judging: report::Judging,
    /// Where the resource samples are written as CSV ([`invariants::write_samples`]), if anywhere.
    pub samples_to: Option<std::path::PathBuf>,
    pub sample_every: Duration,
    /// Added to two refresh intervals before a moved tag's pins are checked (a loaded machine).
    pub follow_slack: Duration,
    /// The apps of each Korifi org the soak creates and deletes.
    pub org_apps: usize,
    /// When set, the resource bounds are violations: the steepest RSS slope of a role (MiB/h),
    /// and the growth of its open file descriptors and threads. A short run's slope says
    /// nothing about an hour, so only a long one enforces them.
    pub bounds: Option<Bounds>,
}

#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub rss_slope_mib_per_h: f64,
    pub fd_growth: i64,
    pub thread_growth: i64,
}

impl Config {
    /// `make soak`: `minutes` of faults (`SOAK_MINUTES`) over 200 objects and 30 tags, each tag
    /// moved every 5 minutes, on the real node; the resource bounds enforced from an hour on.
    pub fn long(minutes: u64) -> Self {
        let duration = Duration::from_secs(minutes * 60);
        Self {
            placement: Placement::Node,
            duration,
            shape: Shape {
                namespaces: 5,
                tags: 30,
                objects: 200,
                churn_every: Duration::from_millis(500),
                move_every: Duration::from_secs(10),
                sync_period: Duration::from_secs(120),
            },
            refresh: Duration::from_secs(60),
            hold: Duration::from_secs(20),
            quiet: Duration::from_secs(60),
            judging: report::Judging {
                warm_up: (duration / 10).clamp(Duration::from_secs(60), Duration::from_secs(600)),
                settle: Duration::from_secs(180),
                long_life: Duration::from_secs(30 * 60),
            },
            samples_to: None,
            sample_every: Duration::from_secs(15),
            follow_slack: Duration::from_secs(60),
            org_apps: 3,
            bounds: (minutes >= 60).then_some(Bounds {
                rss_slope_mib_per_h: 5.0,
                fd_growth: 50,
                thread_growth: 10,
            }),
        }
    }

    /// The short soak of `make test`: each fault once, 24 objects over 6 tags, a tag moved
    /// every 15 s, refreshes every 15 s; about five minutes.
    pub fn short() -> Self {
        Self {
            placement: Placement::Processes,
            duration: Duration::ZERO,
            shape: Shape {
                namespaces: 2,
                tags: 6,
                objects: 24,
                churn_every: Duration::from_millis(700),
                move_every: Duration::from_secs(15),
                sync_period: Duration::from_secs(120),
            },
            refresh: Duration::from_secs(15),
            hold: Duration::from_secs(5),
            quiet: Duration::from_secs(5),
            judging: report::Judging {
                warm_up: Duration::from_secs(20),
                settle: Duration::from_secs(30),
                long_life: Duration::from_secs(120),
            },
            samples_to: None,
            sample_every: Duration::from_secs(5),
            follow_slack: Duration::from_secs(30),
            org_apps: 1,
            bounds: None,
        }
    }
}

/// The webhooks' and the controllers' resource figures from `samples`, each logged.
pub fn judge(samples: &[Sample], started: Instant, judging: report::Judging) -> (Resources, Resources) {
    let judged = |name, component| {
        let r = report::resources(samples, component, started, judging);
        eprintln!(
            "soak: {name}: RSS slope {:?} MiB/h across {} lives, {:?} MiB/h within long lives; {:.0} judged minutes in {} stretches",
            r.rss_slope_across_lives,
            r.lives,
            r.rss_slope_within_long_lives,
            r.judged_minutes,
            r.stretches.len()
        );
        r
    };
    (
        judged("webhook", "holdfast-webhook"),
        judged("controller", "holdfast-controller"),
    )
}

/// Runs the soak in an environment of its own; its report (the violations counted, not
/// raised). Fails only when the environment itself does (a component that does not recover).
pub async fn run(config: Config) -> Result<Report> {
    let started = Instant::now();
    let mut env = Env::start().await?;
    ensure!(
        !env.is_existing_cluster(),
        "the soak runs only on the local control plane"
    );
    // On the real node, what its pods call listens on the node's address (the host reaches it
    // too); as host processes, on loopback.
    let node = match config.placement {
        Placement::Processes => None,
        Placement::Node => Some(blocking(Node::around(&env)?, Node::up).await?),
    };
    let host = match &node {
        Some(node) => node.var("HOLDFAST_NODE_IP")?.to_owned(),
        None => "127.0.0.1".to_owned(),
    };
    let registry = env.spare_registry().await?;
    let (pushes, front) = (
        registry.addr.clone(),
        Arc::new(RegistryFront::start(&host, &registry.addr).await?),
    );
    let registry = Arc::new(tokio::sync::Mutex::new(registry));
    let mirror_registry = env.spare_registry().await?;
    let mirror = Arc::new(RegistryFront::start(&host, &mirror_registry.addr).await?);
    let private = private::Private::start(&env, &host).await?;
    let registries = [front.addr.as_str(), private.addr.as_str()];
    // Before holdfast: its controller looks for kpack's and Korifi's kinds as a term starts.
    let repository_prefix = env.korifi().await?.repository_prefix().to_owned();
    let holdfast = match node {
        None => {
            let holdfast = Holdfast::processes(
                &mut env,
                &registries,
                &mirror.addr,
                config.refresh,
                config.duration + Duration::from_secs(3600),
            )
            .await?;
            env.kapp_controller().await?;
            holdfast
        }
        Some(node) => {
            let values = replicas::release_values(&node, &registries, &mirror.addr, config.refresh)?;
            let node = blocking(node, move |node| node.install(&values)).await?;
            Holdfast::pods(node, env.client().await?).await?
        }
    };
    let holdfast = Arc::new(holdfast);
    let client = env.client().await?;
    let shared = Shared {
        history: Arc::default(),
        live: Arc::default(),
        violations: Violations::default(),
        timeline: Timeline::default(),
        mirrored: Mirrored::new(&mirror.addr, &front.addr),
    };
    let mut load = Load::prepare(
        &env,
        &pushes,
        &front.addr,
        private,
        config.shape.clone(),
        shared.clone(),
    )
    .await?;

    let stop_checks = CancellationToken::new();
    let kinds = [PinnedKind::App, PinnedKind::PackageRepository];
    let mut watches = Vec::new();
    for kind in kinds {
        let api = load::api_all(&client, kind);
        watches.push(tokio::spawn(invariants::watch_pins(
            api,
            kind,
            shared.clone(),
            stop_checks.clone(),
        )));
    }
    watches.push(tokio::spawn(invariants::watch_entries(
        Api::namespaced(client.clone(), NAMESPACE),
        shared.clone(),
        stop_checks.clone(),
    )));
    let private_pins = tokio::spawn(private::watch(
        load::api_all(&client, PinnedKind::App),
        shared.violations.clone(),
        stop_checks.clone(),
    ));
    load.fill().await?;
    eprintln!(
        "soak: ready in {:.1} s: {} objects over {} tags, 2 webhook and 2 controller replicas, kapp-controller, Korifi on kpack; faults after a {:?} warm-up",
        started.elapsed().as_secs_f64(),
        config.shape.objects,
        config.shape.tags,
        config.judging.warm_up
    );

    let env = Arc::new(tokio::sync::Mutex::new(env));
    let stop_monitor = CancellationToken::new();
    let monitor = tokio::spawn(invariants::monitor(
        env.clone(),
        holdfast.clone(),
        config.sample_every,
        started,
        stop_monitor.clone(),
    ));
    let stop_load = CancellationToken::new();
    let churn = tokio::spawn(load.churn(stop_load.clone()));
    let orgs = Orgs {
        client: client.clone(),
        registry: env.lock().await.registry().to_owned(),
        repository_prefix,
        apps: config.org_apps,
        timeline: shared.timeline.clone(),
        violations: shared.violations.clone(),
    };
    let orgs = tokio::spawn(orgs.churn(stop_load.clone()));
    let (moved, mut moves) = tokio::sync::mpsc::unbounded_channel();
    let mover = tokio::spawn(load::move_tags(
        pushes,
        shared.clone(),
        config.shape.tags,
        config.shape.move_every,
        moved,
        stop_load.clone(),
    ));
    let follows = {
        let apis: Vec<_> = kinds.iter().map(|k| (*k, load::api_all(&client, *k))).collect();
        let (shared, refresh, slack) = (shared.clone(), config.refresh, config.follow_slack);
        tokio::spawn(async move {
            let mut checks = tokio::task::JoinSet::new();
            while let Some(m) = moves.recv().await {
                checks.spawn(invariants::follow(
                    apis.clone(),
                    m,
                    refresh,
                    slack,
                    shared.clone(),
                ));
            }
            let mut checked = 0;
            while let Some(done) = checks.join_next().await {
                checked += usize::from(matches!(done, Ok(true)));
            }
            checked
        })
    };

    tokio::time::sleep(config.judging.warm_up).await;
    let injector = Injector {
        env: env.clone(),
        registry: registry.clone(),
        front: front.clone(),
        mirror: mirror.clone(),
        holdfast: holdfast.clone(),
        client: client.clone(),
        timeline: shared.timeline.clone(),
        hold: config.hold,
        refresh: config.refresh,
        quiet: config.quiet,
        started,
    };
    let faults = tokio::spawn(injector.run(started + config.duration)).await??;

    // The load stops; the last moves' pins get their two refresh intervals.
    eprintln!(
        "soak: {faults} faults injected by +{:.1}s; the load stops, the last org deletion and follow checks end",
        started.elapsed().as_secs_f64()
    );
    stop_load.cancel();
    let load = churn.await?;
    let tag_moves = mover.await?;
    let orgs = orgs.await?;
    let follows_checked = follows.await?;
    eprintln!(
        "soak: the load ended at +{:.1}s; judging",
        started.elapsed().as_secs_f64()
    );
    stop_monitor.cancel();
    let (samples, restarts) = monitor.await??;
    stop_checks.cancel();
    for watch in watches {
        watch.await?;
    }
    let private_pins = private_pins.await?;

    let violations = &shared.violations;
    for panic in holdfast.panics(&*env.lock().await) {
        violations.record("panic", panic);
    }
    let audit = env.lock().await.audit_log()?;
    let leadership = leadership::judge(&audit, NAMESPACE, replicas::LEASE, &shared.timeline.cuts());
    for write in leadership.outside {
        violations.record("write-outside-leadership", write);
    }
    let mirror_pins = shared.mirrored.seen();
    for pin in &mirror_pins {
        if !mirror_serves(&mirror_registry.addr, pin).await {
            violations.record(
                "mirror-pin-not-served",
                format!("an object was stored pinned to {pin}, which the mirror does not serve"),
            );
        }
    }
    let timeline = &shared.timeline;
    let excused =
        |a: &load::Admission, which: fn(Fault) -> bool| timeline.overlaps(a.start, a.end, GRACE, which);
    let of = |outcome: Outcome| load.admissions.iter().filter(move |a| a.outcome == outcome);
    // A private App outside the Secret's namespace is never pinned; the owner's first neither,
    // until the controller reads the Secret. The private watch judges them.
    let public = |outcome: Outcome| of(outcome).filter(|a| !a.private);
    let (mut failed_outside, mut unpinned_outside) = (0, 0);
    for admission in of(Outcome::Failed).filter(|a| !excused(a, Fault::apiserver_down)) {
        failed_outside += 1;
        violations.record("admission-failed", admission.detail.clone());
    }
    let down = |f: Fault| f.apiserver_down() || f.webhook_down();
    for admission in public(Outcome::Unpinned).filter(|a| !excused(a, down)) {
        unpinned_outside += 1;
        violations.record("admitted-unpinned", admission.detail.clone());
    }
    if let Some(path) = &config.samples_to {
        invariants::write_samples(path, &samples, started)?;
        eprintln!(
            "soak: {} resource samples written to {}",
            samples.len(),
            path.display()
        );
    }
    let (webhook, controller) = judge(&samples, started, config.judging);
    for (name, r) in [("webhook", &webhook), ("controller", &controller)] {
        let Some(bounds) = config.bounds else {
            continue;
        };
        // The stretch that grew most names where to look.
        let steepest = r
            .stretches
            .iter()
            .max_by(|a, b| a.rss_slope_mib_per_h.total_cmp(&b.rss_slope_mib_per_h))
            .map_or_else(|| "none".into(), ToString::to_string);
        if r.rss_slope_mib_per_h
            .is_some_and(|s| s > bounds.rss_slope_mib_per_h)
        {
            violations.record(
                "rss-slope",
                format!(
                    "{name}: {:?} MiB/h across {} lives, {:?} MiB/h within long lives; the steepest stretch {steepest}",
                    r.rss_slope_across_lives, r.lives, r.rss_slope_within_long_lives
                ),
            );
        }
        if r.fd_growth > bounds.fd_growth || r.thread_growth > bounds.thread_growth {
            violations.record(
                "resource-growth",
                format!(
                    "{name}: {} more fds, {} more threads within one stretch",
                    r.fd_growth, r.thread_growth
                ),
            );
        }
    }
    let count = |outcome: Outcome| of(outcome).count();
    let report = Report {
        minutes: started.elapsed().as_secs_f64() / 60.0,
        faults,
        violations: violations.all().len(),
        webhook,
        controller,
        admissions: load.admissions.len(),
        failed_admissions: count(Outcome::Failed),
        failed_admissions_outside_apiserver_down: failed_outside,
        unpinned_admissions: public(Outcome::Unpinned).count(),
        unpinned_outside_webhook_or_apiserver_down: unpinned_outside,
        tag_moves,
        follows_checked,
        restarts: restarts.len(),
        panics: violations.all().iter().filter(|v| v.invariant == "panic").count(),
        controller_writes_judged: leadership.writes,
        late_writes_delivered: leadership.delivered_late.len(),
        late_writes_refused: leadership.refused_by_term_fence,
        private_pins_in_owner_namespace: private_pins,
        mirror_pins: mirror_pins.len(),
        org_deletions: orgs.deletions,
        builds_after_org_delete: orgs.builds_after_delete,
        orgs_not_staged: orgs.not_populated,
        orgs_orphaned_by_apiserver_restart: orgs.orphaned_by_apiserver_restart,
    };
    // The node (if any) before the control plane it registered with; the environment's
    // processes stop with it, here, on the runtime that started them.
    drop(holdfast);
    drop(env);
    Ok(report)
}

/// The short soak of `make test` with holdfast placed as `placement`: each fault once, and
/// no invariant broken; fails too when a part of the load did not run (an invariant checked
/// over nothing holds vacuously) or a role's memory was judged over nothing.
pub async fn short(placement: Placement) -> Result<Report> {
    let config = Config {
        placement,
        samples_to: std::env::var_os("SOAK_SAMPLES").map(Into::into),
        ..Config::short()
    };
    // On a runtime worker: the environment's processes die with the thread that forked them.
    let report = tokio::spawn(run(config)).await.context("the soak panicked")??;
    eprintln!("{report}");
    ensure!(
        report.violations == 0,
        "{} violations (listed above): {report}",
        report.violations
    );
    ensure!(
        report.faults >= Fault::ALL.len(),
        "{} faults injected, not each of the {} once",
        report.faults,
        Fault::ALL.len()
    );
    ensure!(
        report.admissions > 0
            && report.tag_moves > 0
            && report.follows_checked > 0
            && report.controller_writes_judged > 0
            && report.private_pins_in_owner_namespace > 0
            && report.mirror_pins > 0
            && report.org_deletions > 0,
        "the load did not run: {report}"
    );
    // Every process was sampled, the controllers in both roles (standing by at the start).
    let roles: std::collections::BTreeSet<_> = report.controller.stretches.iter().map(|s| s.role).collect();
    ensure!(
        report.webhook.judged_minutes > 0.0 && roles.len() == 2,
        "the resource samples judged nothing of a role: webhook {:?}, controller {:?}",
        report.webhook.stretches,
        report.controller.stretches
    );
    Ok(report)
}

/// `step` (a script's run) on the node, on the blocking pool: `block_in_place` would turn the
/// worker that forked the control plane into a pool thread, whose exit when idle kills its
/// children ([`crate::process`]).
async fn blocking(
    mut node: Node,
    step: impl FnOnce(&mut Node) -> Result<()> + Send + 'static,
) -> Result<Node> {
    tokio::task::spawn_blocking(move || step(&mut node).map(|()| node))
        .await
        .context("a step on the node panicked")?
}

/// Whether the mirror registry (`addr`, behind its front) serves the pin `mirror/repository@digest`.
async fn mirror_serves(addr: &str, pin: &str) -> bool {
    let Some((repository, digest)) = pin.split_once('@') else {
        return false;
    };
    let Some((_, repository)) = repository.split_once('/') else {
        return false;
    };
    crate::images::head_digest(addr, repository, digest)
        .await
        .is_ok_and(|served| served.as_deref() == Some(digest))
}

//! `make bench-deletion`: Korifi org deletion on the local control plane (etcd, kube-apiserver,
//! kube-controller-manager with its garbage collector), driven by the kpack and Korifi EMULATORS
//! (`holdfast_e2e::emulators`, test fixtures — not the real peers). For N apps (env
//! `BENCH_DELETION_APPS`, default `1,10,50`), kpack v0.16 and v0.17 emulation, without and with
//! holdfast (an in-process webhook with the Image owner-stamping rule and the terminating guard,
//! plus the controller's fast finalizer), it stages an org with N apps, deletes the CFOrg and
//! measures (a) the time from the delete until the CFOrg and its org and space namespaces are
//! gone and (b) the Builds and build pods kpack created after the delete started.
//!
//! Cells run one after another: the fast finalizer acts cluster-wide. The last line is
//! `speedup_n10_v016=<without/with seconds at N=10, v0.16> created_after_delete_with=<builds+pods
//! created after the delete, summed over every with-holdfast cell>`.
//!
//! `BENCH_DELETION_TIMELINE=1` also prints, per cell, when each kind of object in the org was
//! first seen terminating and when it went, and what the namespace controller reported left in
//! each namespace (its status conditions) — where the deletion time goes.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use holdfast_e2e::{
    Env,
    emulators::{
        Scope,
        kpack::{Created, KpackVersion},
        resources,
        runtime::{Change, Informer},
        scenario::{FastDeletion, Peers, until_gone},
    },
};
use kube::{Api, Client, api::DynamicObject};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Korifi's default `spaceFinalizerAppDeletionTimeout` (ref §3).
const SPACE_TIMEOUT: Duration = Duration::from_secs(60);
/// Upper bound for one org deletion.
const DELETION_LIMIT: Duration = Duration::from_secs(600);

struct Cell {
    apps: usize,
    version: KpackVersion,
    holdfast: bool,
    staging: Duration,
    deletion: Duration,
    builds: usize,
    pods: usize,
    /// What was created after the delete: name, seconds after it, whether kpack saw the owner
    /// terminating.
    created_after: Vec<String>,
    /// With `BENCH_DELETION_TIMELINE`: the deletion's timeline, printed.
    timeline: Option<String>,
}

/// What a [`Timeline`] saw happen to one object.
enum What {
    Terminating,
    Gone,
    /// A namespace's status conditions changed: what the namespace controller found left.
    Conditions(String),
}

struct Mark {
    at: Instant,
    kind: String,
    name: String,
    what: What,
}

/// Watches every object of one org (the CFOrg, its namespaces and what is in them) and marks
/// when each was first seen terminating and when it went: the evidence of where a deletion's
/// time goes.
struct Timeline {
    marks: Arc<Mutex<Vec<Mark>>>,
    cancel: CancellationToken,
    tasks: JoinSet<()>,
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

impl Timeline {
    /// Starts watching; returns once every watch has listed what exists.
    async fn start(client: &Client, root: &str, org: &str, space: &str) -> Result<Self> {
        let marks = Arc::new(Mutex::new(Vec::new()));
        let cancel = CancellationToken::new();
        let mut tasks = JoinSet::new();
        let namespaces: Arc<[String]> = Arc::from([org.to_string(), space.to_string()]);
        let org_and_spaces = [resources::cf_org(), resources::namespace(), resources::cf_space()];
        for resource in org_and_spaces.into_iter().chain(resources::app_chain()) {
            let informer = Informer::new(client, &resource);
            let (marks, namespaces, kind) = (marks.clone(), namespaces.clone(), resource.kind.clone());
            let (root, org) = (root.to_string(), org.to_string());
            informer.on_change(move |change| {
                let (old, object) = match change {
                    Change::Added(o) => (None, o),
                    Change::Updated { old, new } => (Some(old), new),
                    Change::Deleted(o) => (None, o),
                };
                let name = object.metadata.name.clone().unwrap_or_default();
                let namespace = object.metadata.namespace.as_deref().unwrap_or_default();
                let ours = match kind.as_str() {
                    "Namespace" => namespaces.contains(&name),
                    "CFOrg" => namespace == root && name == org,
                    _ => namespaces.iter().any(|n| n == namespace),
                };
                if !ours {
                    return;
                }
                let terminating = |o: &DynamicObject| o.metadata.deletion_timestamp.is_some();
                let mut what = Vec::new();
                if matches!(change, Change::Deleted(_)) {
                    what.push(What::Gone);
                } else {
                    if terminating(object) && !old.is_some_and(|o| terminating(o)) {
                        what.push(What::Terminating);
                    }
                    let conditions = namespace_conditions(object);
                    if kind == "Namespace"
                        && !conditions.is_empty()
                        && old.is_none_or(|o| namespace_conditions(o) != conditions)
                    {
                        what.push(What::Conditions(conditions));
                    }
                }
                let at = Instant::now();
                let mut marks = marks.lock().unwrap_or_else(PoisonError::into_inner);
                for what in what {
                    marks.push(Mark {
                        at,
                        kind: kind.clone(),
                        name: name.clone(),
                        what,
                    });
                }
            });
            tasks.spawn(informer.clone().run(cancel.clone()));
            tokio::time::timeout(Duration::from_secs(60), informer.synced())
                .await
                .context("timeline watch did not sync")?;
        }
        Ok(Self { marks, cancel, tasks })
    }

    /// Stops watching; per kind, how many objects were seen terminating and going, the first and
    /// last of each (seconds after `started`), and every namespace condition change in order.
    async fn finish(mut self, started: Instant) -> String {
        self.cancel.cancel();
        while self.tasks.join_next().await.is_some() {}
        let marks = std::mem::take(&mut *self.marks.lock().unwrap_or_else(PoisonError::into_inner));
        let secs = |at: Instant| {
            if at >= started {
                at.duration_since(started).as_secs_f64()
            } else {
                -started.duration_since(at).as_secs_f64()
            }
        };
        // kind -> (terminating times, gone times)
        let mut kinds: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        let mut lines = Vec::new();
        for mark in &marks {
            let entry = kinds.entry(&mark.kind).or_default();
            match &mark.what {
                What::Terminating => entry.0.push(secs(mark.at)),
                What::Gone => entry.1.push(secs(mark.at)),
                What::Conditions(text) => {
                    lines.push(format!(
                        "  {:>7.2}s  namespace {}: {text}",
                        secs(mark.at),
                        mark.name
                    ));
                }
            }
        }
        let span = |times: &[f64]| match (
            times.iter().copied().reduce(f64::min),
            times.iter().copied().reduce(f64::max),
        ) {
            (Some(first), Some(last)) => format!("{:>3} {first:>6.2}–{last:<6.2}", times.len()),
            _ => format!("{:>3} {:>13}", 0, "-"),
        };
        let mut out = vec![format!(
            "  {:<14} {:>24} {:>24}",
            "kind", "terminating: n first–last", "gone: n first–last"
        )];
        for (kind, (terminating, gone)) in &kinds {
            out.push(format!(
                "  {kind:<14} {:>24} {:>24}",
                span(terminating),
                span(gone)
            ));
        }
        out.extend(lines);
        out.join("\n")
    }
}

impl Cell {
    fn created(&self) -> usize {
        self.builds + self.pods
    }
}

fn version_name(version: KpackVersion) -> &'static str {
    match version {
        KpackVersion::V0_16 => "v0.16",
        KpackVersion::V0_17 => "v0.17",
    }
}

fn app_counts() -> Result<Vec<usize>> {
    let list = std::env::var("BENCH_DELETION_APPS").unwrap_or_else(|_| "1,10,50".into());
    let counts = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("BENCH_DELETION_APPS: {s:?} is not a positive number"))
        })
        .collect::<Result<Vec<_>>>()?;
    if counts.is_empty() {
        bail!("BENCH_DELETION_APPS is empty");
    }
    Ok(counts)
}

/// One org deletion: stage `apps` apps, delete the CFOrg, wait for it and its namespaces to go.
async fn deletion(env: &Env, apps: usize, version: KpackVersion, scope: Scope) -> Result<Cell> {
    let peers = Peers::start_in(env, version, SPACE_TIMEOUT, scope).await?;
    let staged = Instant::now();
    let (org, space, names) = peers.org_with_apps(apps).await?;
    let staging = staged.elapsed();

    let timeline = if std::env::var_os("BENCH_DELETION_TIMELINE").is_some() {
        Some(Timeline::start(&peers.client, &peers.root, &org, &space).await?)
    } else {
        None
    };
    let started = Instant::now();
    peers.korifi.delete_org(&peers.root, &org).await?;
    let orgs = Api::namespaced_with(peers.client.clone(), &peers.root, &resources::cf_org());
    until_gone(&orgs, &org, DELETION_LIMIT).await?;
    let namespaces = Api::all_with(peers.client.clone(), &resources::namespace());
    for ns in [&org, &space] {
        until_gone(&namespaces, ns, DELETION_LIMIT).await?;
    }
    let deletion = started.elapsed();
    let timeline = match timeline {
        Some(timeline) => Some(timeline.finish(started).await),
        None => None,
    };

    let after: Vec<_> = peers
        .kpack
        .creations_since(started)
        .into_iter()
        .filter(|c| names.contains(&c.image))
        .collect();
    let cell = Cell {
        apps,
        version,
        holdfast: false,
        staging,
        deletion,
        builds: after.iter().filter(|c| c.kind == Created::Build).count(),
        pods: after.iter().filter(|c| c.kind == Created::Pod).count(),
        created_after: after
            .iter()
            .map(|c| {
                format!(
                    "{} +{:.2}s{}",
                    c.name,
                    c.at.duration_since(started).as_secs_f64(),
                    if c.owner_terminating {
                        " (owner terminating)"
                    } else {
                        ""
                    }
                )
            })
            .collect(),
        timeline,
    };
    peers.stop().await;
    Ok(cell)
}

/// The same deletion with holdfast: its webhook (owner stamping on Images, the terminating guard
/// on Builds, Images and build pods) serving the cell's namespaces and its fast finalizer running.
async fn with_holdfast(env: &Arc<Env>, apps: usize, version: KpackVersion) -> Result<Cell> {
    let holdfast = FastDeletion::start(env.clone()).await?;
    let cell = deletion(env, apps, version, holdfast.scope()).await;
    holdfast.stop().await?;
    let mut cell = cell?;
    cell.holdfast = true;
    Ok(cell)
}

fn ratio(without: f64, with: f64) -> String {
    if with > 0.0 {
        format!("{:.1}", without / with)
    } else {
        "inf".into()
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    holdfast_e2e::init();
    let counts = app_counts()?;
    let env = Arc::new(Env::start().await?);
    eprintln!(
        "bench-deletion: control plane and registry ready in {:.1} s; apps {counts:?}",
        env.boot_time().as_secs_f64()
    );
    let mut rows = Vec::new();
    let mut result = Ok(());
    'cells: for &apps in &counts {
        for version in [KpackVersion::V0_16, KpackVersion::V0_17] {
            let mut pair = Vec::new();
            for holdfast in [false, true] {
                let began = Instant::now();
                let cell = if holdfast {
                    with_holdfast(&env, apps, version).await
                } else {
                    deletion(&env, apps, version, Scope::unique()).await
                };
                match cell {
                    Ok(cell) => {
                        eprintln!(
                            "bench-deletion: N={apps} {} {}: staged in {:.1} s, deleted in {:.1} s, \
                             {} Builds + {} pods created after the delete (cell {:.1} s)",
                            version_name(version),
                            if holdfast { "with holdfast" } else { "without" },
                            cell.staging.as_secs_f64(),
                            cell.deletion.as_secs_f64(),
                            cell.builds,
                            cell.pods,
                            began.elapsed().as_secs_f64()
                        );
                        if let Some(timeline) = &cell.timeline {
                            eprintln!("bench-deletion:   timeline (s after the CFOrg delete):\n{timeline}");
                        }
                        if holdfast && !cell.created_after.is_empty() {
                            eprintln!(
                                "bench-deletion:   created with holdfast: {}",
                                cell.created_after.join(", ")
                            );
                        }
                        pair.push(cell);
                    }
                    Err(e) => {
                        result = Err(e.context(format!(
                            "N={apps} {} {}",
                            version_name(version),
                            if holdfast { "with holdfast" } else { "without" }
                        )));
                        break 'cells;
                    }
                }
            }
            rows.push(pair);
        }
    }
    drop(env);

    println!(
        "{:>4}  {:<6} | {:>12} {:>14} | {:>12} {:>14} | {:>7} {:>13}",
        "N", "kpack", "without s", "without b+p", "with s", "with b+p", "speedup", "created w/o:w"
    );
    let mut speedup = None;
    let mut created_with = 0;
    for pair in &rows {
        let [without, with] = pair.as_slice() else {
            continue;
        };
        debug_assert!(!without.holdfast && with.holdfast);
        let (a, b) = (without.deletion.as_secs_f64(), with.deletion.as_secs_f64());
        println!(
            "{:>4}  {:<6} | {:>12.2} {:>14} | {:>12.2} {:>14} | {:>6}x {:>13}",
            without.apps,
            version_name(without.version),
            a,
            format!("{}+{}", without.builds, without.pods),
            b,
            format!("{}+{}", with.builds, with.pods),
            ratio(a, b),
            format!("{}:{}", without.created(), with.created()),
        );
        created_with += with.created();
        if without.apps == 10 && without.version == KpackVersion::V0_16 {
            speedup = Some(ratio(a, b));
        }
    }
    // A failed cell: the table of the cells that completed, no summary line.
    result?;
    println!(
        "speedup_n10_v016={} created_after_delete_with={created_with}",
        speedup.unwrap_or_else(|| "n/a".into())
    );
    Ok(())
}

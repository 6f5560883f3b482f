//! `make bench-deletion`: Korifi org deletion on the real stack — the real Korifi v0.18.0
//! controllers on the real kpack (v0.16.1, before kpack#1820, and v0.17.1, the release Korifi
//! v0.18.0 is built against), kwok nodes that honour grace periods, the real garbage collector
//! and namespace controller (`holdfast_e2e::peers::korifi::org_deletion`). Korifi v0.14.0, the
//! release of the seed bug (korifi#3687), cannot be built here: the Go module proxy refuses every
//! Korifi version but v0.18.0 (403), so both pairs run Korifi v0.18.0.
//!
//! Per pair (one control plane each), per repetition (`BENCH_DELETION_REPEATS`, default 3), per
//! app count (`BENCH_DELETION_APPS`, default `1,10,50`), the arms, in an order rotated each
//! repetition:
//! - `without`: the org deleted as Korifi and kpack do it;
//! - `with`: holdfast in the chain — its webhook with the shipped configurations (owner stamping
//!   on Images, the terminating guard) serving Korifi's namespaces and its fast finalizer, as
//!   `holdfast-controller` runs it with its defaults;
//! - `with-spaces`: the same with `--delete-org-spaces` (`components/fast-org-deletion`);
//! - `nochurn`: the no-churn floor — the same org, deleted without holdfast after kpack's
//!   controller was stopped (nothing can rebuild): the garbage collector's walk, the app pods'
//!   grace periods and the namespace controller, with no build loop;
//! - `empty` (once per repetition): the empty-org floor, an org with one space and no apps, what
//!   nothing above the namespace controller can beat without removing finalizers.
//!
//! `BENCH_DELETION_ARMS` (e.g. `without,with`), `BENCH_DELETION_PAIRS` (`v0.16,v0.17`) and
//! `BENCH_DELETION_V016_APPS` (the v0.16 pair's app counts) narrow the run.
//!
//! *Deletion s*: from the CFOrg delete request until the CFOrg and both namespaces are gone, on
//! watches. The table gives medians [min–max]; the last line is `speedup_n10_v016=… (without /
//! with at N=10, v0.16) created_after_delete_with=… (Builds + build pods created after the delete,
//! summed over every run with holdfast) with_over_nochurn_n10=… with_over_nochurn_n50=…
//! with_over_empty_n10=…` (the `with_over_*` fields for v0.17).
//! `BENCH_DELETION_TIMELINE=1` prints each run's timeline (per kind: created, terminating, gone;
//! the namespace controller's conditions). Every run's figures go to
//! `docs/benchmarks/data/deletion.csv`, and the objects alive over time (every second, the first
//! repetition of each cell) to `deletion-timeline.csv` (`holdfast_e2e::bench_data`).

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use holdfast_e2e::{
    Env, bench_data,
    peers::{korifi::org_deletion, kpack},
};
use serde::Serialize;

/// Upper bound for one org deletion (the space finalizer alone may wait 60 s for apps).
const DELETION_LIMIT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Arm {
    Empty,
    Without,
    NoChurn,
    With,
    WithSpaces,
}

impl Arm {
    const ALL: [Arm; 5] = [Arm::Empty, Arm::Without, Arm::NoChurn, Arm::With, Arm::WithSpaces];

    fn name(self) -> &'static str {
        match self {
            Arm::Empty => "empty",
            Arm::Without => "without",
            Arm::NoChurn => "nochurn",
            Arm::With => "with",
            Arm::WithSpaces => "with-spaces",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pair {
    name: &'static str,
    kpack: kpack::Release,
}

const PAIRS: [Pair; 2] = [
    Pair {
        name: "v0.16",
        kpack: kpack::V0_16_1,
    },
    Pair {
        name: "v0.17",
        kpack: kpack::V0_17_1,
    },
];

/// One org deletion.
struct Run {
    pair: &'static str,
    arm: Arm,
    apps: usize,
    repetition: usize,
    deletion: f64,
    created: usize,
    /// The longest deletionTimestamp-to-gone of the app pods and of the build pods.
    app_pods: Option<f64>,
    build_pods: Option<f64>,
    /// The objects alive every second from the delete request (first repetitions only).
    alive: Vec<Alive>,
}

/// A run's figures, one row of `deletion.csv`.
#[derive(Serialize)]
struct RunRow {
    pair: &'static str,
    arm: &'static str,
    apps: usize,
    repetition: usize,
    deletion_s: f64,
    created_after_delete: usize,
    app_pods_termination_s: Option<f64>,
    build_pods_termination_s: Option<f64>,
}

impl From<&Run> for RunRow {
    fn from(run: &Run) -> Self {
        RunRow {
            pair: run.pair,
            arm: run.arm.name(),
            apps: run.apps,
            repetition: run.repetition,
            deletion_s: run.deletion,
            created_after_delete: run.created,
            app_pods_termination_s: run.app_pods,
            build_pods_termination_s: run.build_pods,
        }
    }
}

/// The org's objects alive at `t_s` after the delete request, one row of `deletion-timeline.csv`.
#[derive(Serialize)]
struct Alive {
    pair: &'static str,
    arm: &'static str,
    apps: usize,
    t_s: f64,
    objects: usize,
    /// Of them, kpack Builds and build pods.
    builds_and_build_pods: usize,
}

/// Every second from the delete request to the last object gone.
fn alive(
    pair: &'static str,
    arm: Arm,
    apps: usize,
    timeline: &org_deletion::Timeline,
    end: f64,
) -> Vec<Alive> {
    let build = |o: &org_deletion::Observed| o.kind == "Build" || o.is_build_pod();
    (0..=end.ceil() as usize)
        .map(|t| {
            let t_s = t as f64;
            Alive {
                pair,
                arm: arm.name(),
                apps,
                t_s,
                objects: timeline.alive_at(t_s, |_| true),
                builds_and_build_pods: timeline.alive_at(t_s, build),
            }
        })
        .collect()
}

fn list(var: &str, default: &str) -> Vec<String> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn counts(var: &str, default: &str) -> Result<Vec<usize>> {
    list(var, default)
        .iter()
        .map(|s| {
            s.parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .with_context(|| format!("{var}: {s:?} is not a positive number"))
        })
        .collect()
}

/// What a run covers (the environment's `BENCH_DELETION_*`).
struct Settings {
    pairs: Vec<Pair>,
    counts: Vec<usize>,
    /// The v0.16 pair's app counts.
    v016_counts: Vec<usize>,
    arms: Vec<Arm>,
    repeats: usize,
}

impl Settings {
    fn counts(&self, pair: Pair) -> &[usize] {
        match pair.name {
            "v0.16" => &self.v016_counts,
            _ => &self.counts,
        }
    }
}

fn settings() -> Result<Settings> {
    let pairs = list("BENCH_DELETION_PAIRS", "v0.16,v0.17")
        .iter()
        .map(|p| {
            PAIRS
                .iter()
                .find(|pair| pair.name == p)
                .copied()
                .with_context(|| format!("BENCH_DELETION_PAIRS: {p:?} is not v0.16 or v0.17"))
        })
        .collect::<Result<Vec<_>>>()?;
    let counts = counts("BENCH_DELETION_APPS", "1,10,50")?;
    let arms = list("BENCH_DELETION_ARMS", "empty,without,nochurn,with,with-spaces")
        .iter()
        .map(|a| {
            Arm::ALL.into_iter().find(|arm| arm.name() == a).with_context(|| {
                format!("BENCH_DELETION_ARMS: {a:?} is not empty, without, nochurn, with or with-spaces")
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let repeats = std::env::var("BENCH_DELETION_REPEATS")
        .ok()
        .map(|r| {
            r.parse::<usize>()
                .ok()
                .filter(|r| *r > 0)
                .context("BENCH_DELETION_REPEATS")
        })
        .transpose()?
        .unwrap_or(3);
    if pairs.is_empty() || counts.is_empty() || arms.is_empty() {
        bail!("nothing to run: BENCH_DELETION_PAIRS, _APPS and _ARMS must each name something");
    }
    let all = counts.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let v016_counts = self::counts("BENCH_DELETION_V016_APPS", &all)?;
    Ok(Settings {
        pairs,
        counts,
        v016_counts,
        arms,
        repeats,
    })
}

/// One org with `apps` apps staged and running, deleted in `arm`'s conditions.
async fn run(env: &Arc<Env>, pair: Pair, arm: Arm, apps: usize, repetition: usize) -> Result<Run> {
    let client = env.client().await?;
    let korifi = env.korifi_on(pair.kpack).await?;
    let kpack = env.kpack().await?;
    let holdfast = match arm {
        Arm::With => Some(org_deletion::Holdfast::start(env, false).await?),
        Arm::WithSpaces => Some(org_deletion::Holdfast::start(env, true).await?),
        _ => None,
    };
    let staged = Instant::now();
    let org = org_deletion::populate(&client, env.registry(), korifi.repository_prefix(), apps)
        .await
        .with_context(|| env.korifi_log(20))?;
    let staging = staged.elapsed();
    if arm == Arm::NoChurn {
        kpack.stop_controller();
    }
    let deletion = org_deletion::delete(&client, &org, DELETION_LIMIT).await;
    if arm == Arm::NoChurn {
        kpack.start_controller()?;
    }
    if let Some(holdfast) = holdfast {
        holdfast.stop().await?;
    }
    let deletion = deletion.with_context(|| env.korifi_log(20))?;
    let timeline = &deletion.timeline;
    let total = deletion.total().as_secs_f64();
    let run = Run {
        pair: pair.name,
        arm,
        apps,
        repetition,
        alive: if repetition == 0 {
            alive(pair.name, arm, apps, timeline, total)
        } else {
            Vec::new()
        },
        deletion: total,
        created: deletion.builds_created() + deletion.build_pods_created(),
        app_pods: timeline.longest_termination(org_deletion::Observed::is_app_pod),
        build_pods: timeline.longest_termination(org_deletion::Observed::is_build_pod),
    };
    eprintln!(
        "bench-deletion: {} N={apps} {}: staged in {:.1} s, deleted in {:.1} s (CFApps gone {:.1} s, space namespace {:.1} s, org namespace {:.1} s, CFOrg {:.1} s, volumes {:.1} s); {} Builds + {} build pods created after the delete; app pods' termination {}, build pods' {}",
        pair.name,
        arm.name(),
        staging.as_secs_f64(),
        run.deletion,
        deletion.apps.as_secs_f64(),
        deletion.space_namespace.as_secs_f64(),
        deletion.org_namespace.as_secs_f64(),
        deletion.org.as_secs_f64(),
        deletion.volumes.as_secs_f64(),
        deletion.builds_created(),
        deletion.build_pods_created(),
        seconds(run.app_pods),
        seconds(run.build_pods),
    );
    if std::env::var_os("BENCH_DELETION_TIMELINE").is_some() {
        eprintln!(
            "bench-deletion:   timeline (s after the CFOrg delete):\n{}",
            timeline.render()
        );
    }
    Ok(run)
}

fn seconds(s: Option<f64>) -> String {
    s.map_or_else(|| "-".into(), |s| format!("{s:.1} s"))
}

/// Median, min and max.
fn stats(mut values: Vec<f64>) -> Option<(f64, f64, f64)> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = match n {
        0 => return None,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    };
    Some((median, values[0], values[n - 1]))
}

fn spread(values: Vec<f64>) -> String {
    match stats(values) {
        Some((median, min, max)) => format!("{median:.1} [{min:.1}–{max:.1}]"),
        None => "-".into(),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    holdfast_e2e::init();
    let settings = settings()?;
    let (arms, repeats) = (&settings.arms, settings.repeats);
    let mut runs: Vec<Run> = Vec::new();
    let mut result = Ok(());
    'pairs: for &pair in &settings.pairs {
        let counts = settings.counts(pair);
        let env = Arc::new(Env::start().await?);
        let started = Instant::now();
        env.korifi_on(pair.kpack).await?;
        eprintln!(
            "bench-deletion: {}: control plane ready in {:.1} s, kpack {} and Korifi v0.18.0 in {:.1} s; apps {counts:?}, arms {:?}, {repeats} repetitions",
            pair.name,
            env.boot_time().as_secs_f64(),
            pair.kpack.version,
            started.elapsed().as_secs_f64(),
            arms.iter().map(|a| a.name()).collect::<Vec<_>>(),
        );
        for repetition in 0..repeats {
            let mut cells: Vec<(Arm, usize)> = Vec::new();
            if arms.contains(&Arm::Empty) {
                cells.push((Arm::Empty, 0));
            }
            for &apps in counts {
                let mut ordered: Vec<Arm> = arms.iter().copied().filter(|a| *a != Arm::Empty).collect();
                let len = ordered.len().max(1);
                ordered.rotate_left(repetition % len);
                cells.extend(ordered.into_iter().map(|arm| (arm, apps)));
            }
            for (arm, apps) in cells {
                match run(&env, pair, arm, apps, repetition).await {
                    Ok(run) => runs.push(run),
                    Err(e) => {
                        result = Err(e.context(format!("{} N={apps} {}", pair.name, arm.name())));
                        break 'pairs;
                    }
                }
            }
        }
    }

    // (pair, apps, arm) -> runs
    let mut cells: BTreeMap<(&str, usize, Arm), Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        cells.entry((run.pair, run.apps, run.arm)).or_default().push(run);
    }
    let median = |pair: &str, apps: usize, arm: Arm| {
        cells
            .get(&(pair, apps, arm))
            .and_then(|runs| stats(runs.iter().map(|r| r.deletion).collect()))
            .map(|(median, _, _)| median)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "n/a".into(),
    };
    println!(
        "{:<6} {:>3} {:<8} | {:>20} | {:>16} | {:>18} | {:>18} | {:>10} | {:>10}",
        "kpack",
        "N",
        "arm",
        "deletion s",
        "created b+p",
        "app pods' term. s",
        "build pods' term.",
        "/ nochurn",
        "/ empty"
    );
    for ((pair, apps, arm), runs) in &cells {
        let deletion = median(pair, *apps, *arm);
        println!(
            "{pair:<6} {apps:>3} {:<8} | {:>20} | {:>16} | {:>18} | {:>18} | {:>10} | {:>10}",
            arm.name(),
            spread(runs.iter().map(|r| r.deletion).collect()),
            spread(runs.iter().map(|r| r.created as f64).collect()),
            spread(runs.iter().filter_map(|r| r.app_pods).collect()),
            spread(runs.iter().filter_map(|r| r.build_pods).collect()),
            ratio(deletion, median(pair, *apps, Arm::NoChurn)),
            ratio(deletion, median(pair, 0, Arm::Empty)),
        );
    }
    // A failed run: the table of the runs that completed, no data, no summary line.
    result?;
    bench_data::write("deletion", &runs.iter().map(RunRow::from).collect::<Vec<_>>())?;
    bench_data::write(
        "deletion-timeline",
        &runs.iter().flat_map(|r| &r.alive).collect::<Vec<_>>(),
    )?;
    let created_with: usize = runs
        .iter()
        .filter(|r| matches!(r.arm, Arm::With | Arm::WithSpaces))
        .map(|r| r.created)
        .sum();
    println!(
        "speedup_n10_v016={} created_after_delete_with={created_with} with_over_nochurn_n10={} with_over_nochurn_n50={} with_over_empty_n10={}",
        ratio(median("v0.16", 10, Arm::Without), median("v0.16", 10, Arm::With)),
        ratio(median("v0.17", 10, Arm::With), median("v0.17", 10, Arm::NoChurn)),
        ratio(median("v0.17", 50, Arm::With), median("v0.17", 50, Arm::NoChurn)),
        ratio(median("v0.17", 10, Arm::With), median("v0.17", 0, Arm::Empty)),
    );
    Ok(())
}

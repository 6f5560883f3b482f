//! The soak's figures and its last line: faults, violations, the memory slope of each holdfast
//! component after warm-up, admissions and the failed ones outside the API server's downtime.

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, Instant},
};

use super::invariants::{Role, Sample};

/// The least-squares slope of `points` (x, y), none with fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let mut fit = Fit::default();
    fit.add(points);
    fit.slope()
}

/// The sums of `points`' centred products: Σ(x − x̄)(y − ȳ) and Σ(x − x̄)²; none when empty.
fn centred(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    if points.is_empty() {
        return None;
    }
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    Some(points.iter().fold((0.0, 0.0), |(sxy, sxx), (x, y)| {
        (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx))
    }))
}

/// How a component's resource samples are judged.
#[derive(Debug, Clone, Copy)]
pub struct Judging {
    /// No sample taken before this long after the soak started is judged.
    pub warm_up: Duration,
    /// Left out at the start of each stretch for its descriptors and threads (connections
    /// opened, tasks started), and the least span a stretch must have after it to be judged.
    pub settle: Duration,
    /// The least judged span of a stretch whose own RSS growth counts: in a shorter life a
    /// fill-up (caches, allocator arenas) cannot be told from a leak.
    pub long_life: Duration,
}

/// The resource figures of one component (the processes whose names start with `component`),
/// each process judged in stretches: one per pid and role (a controller standing by, then
/// leading, is two). The RSS slope of a role is the steeper of two fits:
/// - **across lives**: its stretches compared at the same age (an intercept per minute of age),
///   against the soak's time. A fill-up is the same in every life and fits flat; memory that
///   builds up over the run, in one process or in what every new life loads, rises.
/// - **within long lives**: the growth within each stretch judged for at least
///   [`Judging::long_life`] after its settle, with an intercept per stretch (a step between
///   roles or restarts is not growth). A leak keeps growing after any fill-up.
///
/// Descriptors and threads are judged within each stretch from `settle` on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resources {
    /// The steepest RSS slope of the roles, either fit, MiB per hour; none when no fit had
    /// samples enough.
    pub rss_slope_mib_per_h: Option<f64>,
    /// The steepest slope across lives, and within long lives, MiB per hour.
    pub rss_slope_across_lives: Option<f64>,
    pub rss_slope_within_long_lives: Option<f64>,
    /// The lives compared across (stretches with a sample after warm-up).
    pub lives: usize,
    /// The largest RSS seen, MiB.
    pub rss_max_mib: f64,
    /// The largest growth of open file descriptors and of threads within one judged stretch,
    /// from its first judged sample to its last.
    pub fd_growth: i64,
    pub thread_growth: i64,
    /// The minutes of judged samples, all stretches together.
    pub judged_minutes: f64,
    /// The judged stretches, for the report of a broken bound.
    pub stretches: Vec<Stretch>,
}

/// One judged stretch: one process in one role.
#[derive(Debug, Clone, PartialEq)]
pub struct Stretch {
    pub name: String,
    pub pid: u32,
    pub role: Role,
    /// Its judged samples' first and last, in minutes since the soak started.
    pub from_minute: f64,
    pub to_minute: f64,
    pub first_rss_mib: f64,
    pub last_rss_mib: f64,
    /// Its own RSS slope, MiB per hour.
    pub rss_slope_mib_per_h: f64,
}

impl fmt::Display for Stretch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (pid {}, {}) +{:.1}..+{:.1} min: {:.1} -> {:.1} MiB ({:.1} MiB/h)",
            self.name,
            self.pid,
            self.role.as_str(),
            self.from_minute,
            self.to_minute,
            self.first_rss_mib,
            self.last_rss_mib,
            self.rss_slope_mib_per_h
        )
    }
}

/// Sums of centred products from groups of points, each group with an intercept of its own:
/// their ratio is the slope common to the groups.
#[derive(Debug, Clone, Copy, Default)]
struct Fit {
    sxy: f64,
    sxx: f64,
}

impl Fit {
    fn add(&mut self, group: &[(f64, f64)]) {
        if let Some((sxy, sxx)) = centred(group) {
            self.sxy += sxy;
            self.sxx += sxx;
        }
    }

    fn slope(self) -> Option<f64> {
        (self.sxx > 0.0).then(|| self.sxy / self.sxx)
    }
}

/// The steepest of the roles' slopes.
fn steepest(fits: &BTreeMap<Role, Fit>) -> Option<f64> {
    fits.values().filter_map(|fit| fit.slope()).reduce(f64::max)
}

/// Judges `component`'s samples as [`Resources`] says.
pub fn resources(samples: &[Sample], component: &str, started: Instant, judging: Judging) -> Resources {
    // Each process's samples in time order, cut where its role changes.
    let mut per_process: BTreeMap<(&str, u32), Vec<&Sample>> = BTreeMap::new();
    for sample in samples.iter().filter(|s| s.name.starts_with(component)) {
        per_process
            .entry((sample.name.as_str(), sample.pid))
            .or_default()
            .push(sample);
    }
    let hours = |s: &Sample| s.at.duration_since(started).as_secs_f64() / 3600.0;
    let mut out = Resources::default();
    let mut within: BTreeMap<Role, Fit> = BTreeMap::new();
    // Per role and minute of age: each life's mean (soak time, RSS) at that age.
    let mut by_age: BTreeMap<(Role, u64), Vec<(f64, f64)>> = BTreeMap::new();
    for process in per_process.values() {
        out.rss_max_mib = process
            .iter()
            .map(|s| s.usage.rss_mib())
            .fold(out.rss_max_mib, f64::max);
        for stretch in process.chunk_by(|a, b| a.role == b.role) {
            let begun = stretch[0].at;
            let role = stretch[0].role;
            let after_warm_up: Vec<&Sample> = stretch
                .iter()
                .copied()
                .filter(|s| s.at >= started + judging.warm_up)
                .collect();
            if !after_warm_up.is_empty() {
                out.lives += 1;
            }
            let minute_of_age = |s: &Sample| s.at.duration_since(begun).as_secs() / 60;
            for age in after_warm_up.chunk_by(|a, b| minute_of_age(a) == minute_of_age(b)) {
                let n = age.len() as f64;
                let (x, y) = age
                    .iter()
                    .fold((0.0, 0.0), |(x, y), s| (x + hours(s), y + s.usage.rss_mib()));
                by_age
                    .entry((role, minute_of_age(age[0])))
                    .or_default()
                    .push((x / n, y / n));
            }
            let judged: Vec<&Sample> = after_warm_up
                .into_iter()
                .filter(|s| s.at >= begun + judging.settle)
                .collect();
            let (Some(a), Some(b)) = (judged.first(), judged.last()) else {
                continue;
            };
            let span = b.at.duration_since(a.at);
            if span < judging.settle {
                continue;
            }
            let points: Vec<(f64, f64)> = judged.iter().map(|s| (hours(s), s.usage.rss_mib())).collect();
            let Some(own) = slope(&points) else {
                continue;
            };
            if span >= judging.long_life {
                within.entry(role).or_default().add(&points);
            }
            out.fd_growth = out
                .fd_growth
                .max(b.usage.open_fds as i64 - a.usage.open_fds as i64);
            out.thread_growth = out
                .thread_growth
                .max(b.usage.threads as i64 - a.usage.threads as i64);
            out.judged_minutes += span.as_secs_f64() / 60.0;
            out.stretches.push(Stretch {
                name: a.name.clone(),
                pid: a.pid,
                role,
                from_minute: hours(a) * 60.0,
                to_minute: hours(b) * 60.0,
                first_rss_mib: a.usage.rss_mib(),
                last_rss_mib: b.usage.rss_mib(),
                rss_slope_mib_per_h: own,
            });
        }
    }
    let mut across: BTreeMap<Role, Fit> = BTreeMap::new();
    for ((role, _), lives) in &by_age {
        across.entry(*role).or_default().add(lives);
    }
    out.rss_slope_across_lives = steepest(&across);
    out.rss_slope_within_long_lives = steepest(&within);
    out.rss_slope_mib_per_h = [out.rss_slope_across_lives, out.rss_slope_within_long_lives]
        .into_iter()
        .flatten()
        .reduce(f64::max);
    out
}

/// The soak's result.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub minutes: f64,
    pub faults: usize,
    pub violations: usize,
    pub webhook: Resources,
    pub controller: Resources,
    pub admissions: usize,
    pub failed_admissions: usize,
    pub failed_admissions_outside_apiserver_down: usize,
    pub unpinned_admissions: usize,
    pub unpinned_outside_webhook_or_apiserver_down: usize,
    pub tag_moves: usize,
    pub follows_checked: usize,
    pub restarts: usize,
    pub panics: usize,
    /// The controllers' writes the audit log showed, each judged against the Lease's terms.
    pub controller_writes_judged: usize,
    /// Of the writes outside a term (violations), those a cut link held and delivered after the
    /// takeover, which the API server completed: what the term fence should have refused.
    pub late_writes_delivered: usize,
    /// The controllers' writes the term fence refused: late writes of a replica that had lost
    /// the lease, kept out by the API server.
    pub late_writes_refused: usize,
    /// Private Apps of the Secret's own namespace seen pinned (the scope check is not vacuous).
    pub private_pins_in_owner_namespace: usize,
    /// The distinct pins to the mirror's copies seen (each one checked served by the mirror).
    pub mirror_pins: usize,
    /// Korifi orgs deleted to the end, and the Builds and build pods created after their deletes
    /// (excused ones included: while a webhook replica or the API server was down).
    pub org_deletions: usize,
    pub builds_after_org_delete: usize,
    /// Orgs Korifi or kpack did not stage in time: not deleted, not judged.
    pub orgs_not_staged: usize,
    /// Org deletions the namespace controller cut short across a kube-apiserver restart (the
    /// org's CFSpace left stored in its deleted namespace): not judged.
    pub orgs_orphaned_by_apiserver_restart: usize,
}

/// The figure of an optional slope: `n/a` when no process had samples enough.
fn figure(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.1}"))
}

/// The resource figures of a run's samples judged again, in the last line's names.
pub fn resource_figures(webhook: &Resources, controller: &Resources) -> String {
    format!(
        "rss_slope_mib_per_h_webhook={} rss_slope_mib_per_h_controller={} rss_slope_across_lives_webhook={} rss_slope_across_lives_controller={} rss_slope_within_long_lives_webhook={} rss_slope_within_long_lives_controller={} rss_max_mib_webhook={:.1} rss_max_mib_controller={:.1} fd_growth_max={} thread_growth_max={}",
        figure(webhook.rss_slope_mib_per_h),
        figure(controller.rss_slope_mib_per_h),
        figure(webhook.rss_slope_across_lives),
        figure(controller.rss_slope_across_lives),
        figure(webhook.rss_slope_within_long_lives),
        figure(controller.rss_slope_within_long_lives),
        webhook.rss_max_mib,
        controller.rss_max_mib,
        webhook.fd_growth.max(controller.fd_growth),
        webhook.thread_growth.max(controller.thread_growth),
    )
}

/// The last line: the fields the issue asks for, first and in its order, then the others.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "minutes={:.1} faults={} violations={} rss_slope_mib_per_h_webhook={} rss_slope_mib_per_h_controller={} admissions={} failed_admissions_outside_apiserver_down={} failed_admissions={} unpinned_admissions={} unpinned_outside_webhook_or_apiserver_down={} tag_moves={} follows_checked={} restarts={} panics={} rss_max_mib_webhook={:.1} rss_max_mib_controller={:.1} fd_growth_max={} thread_growth_max={} controller_writes_judged={} private_pins_in_owner_namespace={} mirror_pins={} org_deletions={} builds_after_org_delete={} orgs_not_staged={} late_writes_delivered={} late_writes_refused={} rss_judged_minutes_webhook={:.0} rss_judged_minutes_controller={:.0} orgs_orphaned_by_apiserver_restart={} rss_slope_across_lives_webhook={} rss_slope_across_lives_controller={} rss_slope_within_long_lives_webhook={} rss_slope_within_long_lives_controller={}",
            self.minutes,
            self.faults,
            self.violations,
            figure(self.webhook.rss_slope_mib_per_h),
            figure(self.controller.rss_slope_mib_per_h),
            self.admissions,
            self.failed_admissions_outside_apiserver_down,
            self.failed_admissions,
            self.unpinned_admissions,
            self.unpinned_outside_webhook_or_apiserver_down,
            self.tag_moves,
            self.follows_checked,
            self.restarts,
            self.panics,
            self.webhook.rss_max_mib,
            self.controller.rss_max_mib,
            self.webhook.fd_growth.max(self.controller.fd_growth),
            self.webhook.thread_growth.max(self.controller.thread_growth),
            self.controller_writes_judged,
            self.private_pins_in_owner_namespace,
            self.mirror_pins,
            self.org_deletions,
            self.builds_after_org_delete,
            self.orgs_not_staged,
            self.late_writes_delivered,
            self.late_writes_refused,
            self.webhook.judged_minutes,
            self.controller.judged_minutes,
            self.orgs_orphaned_by_apiserver_restart,
            figure(self.webhook.rss_slope_across_lives),
            figure(self.controller.rss_slope_across_lives),
            figure(self.webhook.rss_slope_within_long_lives),
            figure(self.controller.rss_slope_within_long_lives),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::Usage;

    #[test]
    fn the_slope_of_a_line_is_its_gradient() {
        let line: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 3.0 * x as f64 + 7.0)).collect();
        assert!((slope(&line).unwrap() - 3.0).abs() < 1e-9);
        assert_eq!(slope(&[(1.0, 2.0), (1.0, 5.0)]), None, "one x has no slope");
    }

    /// Samples of `name` (pid `pid`, `role`) every minute from `from` to `to` minutes, RSS
    /// `rss(minute)` MiB, `fds(minute)` descriptors.
    fn stretch(
        started: Instant,
        (name, pid, role): (&'static str, u32, Role),
        (from, to): (u64, u64),
        rss: impl Fn(u64) -> f64,
        fds: impl Fn(u64) -> u64,
    ) -> Vec<Sample> {
        (from..=to)
            .map(|minute| Sample {
                name: name.into(),
                pid,
                role,
                at: started + Duration::from_secs(minute * 60),
                usage: Usage {
                    rss_kib: (rss(minute) * 1024.0) as u64,
                    open_fds: fds(minute),
                    threads: 4,
                    ..Default::default()
                },
            })
            .collect()
    }

    const MINUTE: Duration = Duration::from_secs(60);

    /// Judging with these minutes of warm-up, settle and long life.
    fn judging(warm_up: u32, settle: u32, long_life: u32) -> Judging {
        Judging {
            warm_up: warm_up * MINUTE,
            settle: settle * MINUTE,
            long_life: long_life * MINUTE,
        }
    }

    #[test]
    fn a_standby_that_starts_leading_steps_but_does_not_grow() {
        let started = Instant::now();
        let a = ("holdfast-controller-a", 7, Role::StandingBy);
        let mut samples = stretch(started, a, (0, 40), |_| 20.0, |_| 12);
        // The same process leads from minute 41: twice the memory, five times the descriptors,
        // flat after its first two minutes.
        samples.extend(stretch(
            started,
            ("holdfast-controller-a", 7, Role::Leading),
            (41, 80),
            |m| if m < 43 { 30.0 } else { 40.0 },
            |_| 60,
        ));
        let judged = resources(&samples, "holdfast-controller", started, judging(10, 3, 20));
        let slope = judged.rss_slope_mib_per_h.expect("two long stretches judged");
        assert!(slope.abs() < 1e-9, "{slope}");
        assert_eq!(judged.rss_slope_within_long_lives, Some(slope));
        assert_eq!(
            judged.rss_slope_across_lives, None,
            "one life per role: nothing to compare"
        );
        assert_eq!(judged.fd_growth, 0, "the step in descriptors is the new role's");
        assert_eq!(judged.stretches.len(), 2);
        assert_eq!(judged.rss_max_mib, 40.0);
        // Judged as one stretch, the step reads as steep growth.
        let unsplit: Vec<Sample> = samples
            .iter()
            .map(|s| Sample {
                role: Role::Leading,
                ..s.clone()
            })
            .collect();
        let whole = resources(&unsplit, "holdfast-controller", started, judging(10, 3, 20));
        assert!(whole.rss_slope_mib_per_h.unwrap() > 10.0, "{whole:?}");
    }

    /// Leaders of 13-minute lives, one after another for two hours (a fault ends each, as on
    /// the node): each life's RSS fills from 30 MiB by 1 MiB a minute for 10 minutes and stays,
    /// plus `per_hour` × the soak's time when the life began.
    fn short_leader_lives(started: Instant, per_hour: f64) -> Vec<Sample> {
        (0..9u32)
            .flat_map(|life| {
                let from = u64::from(life) * 13;
                let name = if life % 2 == 0 {
                    "holdfast-controller-a"
                } else {
                    "holdfast-controller-b"
                };
                stretch(
                    started,
                    (name, 100 + life, Role::Leading),
                    (from, from + 12),
                    move |m| 30.0 + (m - from).min(10) as f64 + per_hour * from as f64 / 60.0,
                    |_| 40,
                )
            })
            .collect()
    }

    #[test]
    fn a_fill_up_in_every_short_life_is_not_growth() {
        let started = Instant::now();
        let samples = short_leader_lives(started, 0.0);
        let judged = resources(&samples, "holdfast-controller", started, judging(13, 3, 30));
        let across = judged.rss_slope_across_lives.expect("lives compared");
        assert!(across.abs() < 1e-9, "{across}");
        assert_eq!(judged.rss_slope_within_long_lives, None, "no life is long");
        assert_eq!(judged.rss_slope_mib_per_h, Some(across));
        assert_eq!(
            judged.lives,
            9 - 1,
            "the first life is over before the warm-up is"
        );
        // Within each short life, the fill-up reads as steep growth (the first node run's
        // violation): what a life too short to pass its fill-up cannot tell from a leak.
        let within_short = resources(&samples, "holdfast-controller", started, judging(10, 3, 3));
        assert!(
            within_short.rss_slope_within_long_lives.unwrap() > 5.0,
            "{within_short:?}"
        );
    }

    #[test]
    fn memory_that_builds_up_across_short_lives_is_growth() {
        let started = Instant::now();
        let samples = short_leader_lives(started, 10.0);
        let judged = resources(&samples, "holdfast-controller", started, judging(10, 3, 30));
        let slope = judged.rss_slope_mib_per_h.expect("lives compared");
        assert!((slope - 10.0).abs() < 1e-2, "{slope}"); // RSS is kept in KiB
    }

    #[test]
    fn growth_within_long_lives_is_caught_across_restarts() {
        let started = Instant::now();
        // Three lives of a webhook, each starting at 30 MiB and growing 10 MiB/h: each restart
        // drops the memory back, so only growth within a life shows it.
        let mut samples = Vec::new();
        for (pid, from) in [(1, 0), (2, 40), (3, 80)] {
            samples.extend(stretch(
                started,
                ("holdfast-webhook-b", pid, Role::Serving),
                (from, from + 39),
                move |m| 30.0 + (m - from) as f64 * 10.0 / 60.0,
                move |m| 20 + (m - from),
            ));
        }
        let judged = resources(&samples, "holdfast-webhook", started, judging(5, 3, 30));
        let slope = judged.rss_slope_mib_per_h.expect("judged");
        assert!((slope - 10.0).abs() < 1e-3, "{slope}");
        let across = judged.rss_slope_across_lives.expect("lives compared");
        assert!(across.abs() < 1e-3, "the same at the same age: {across}");
        // Each life's descriptors grow by one a minute: 36 from its first judged sample to its last.
        assert_eq!(judged.fd_growth, 36);
        // The first life's first 5 minutes are the soak's warm-up; the others lose 3 each.
        let spans: Vec<(f64, f64)> = judged
            .stretches
            .iter()
            .map(|s| (s.from_minute, s.to_minute))
            .collect();
        assert_eq!(spans, [(5.0, 39.0), (43.0, 79.0), (83.0, 119.0)]);
        assert!((judged.judged_minutes - 106.0).abs() < 1e-9);
        // Lives shorter than a long one are not judged within.
        let short = resources(&samples, "holdfast-webhook", started, judging(5, 3, 40));
        assert_eq!(short.rss_slope_within_long_lives, None);
    }

    #[test]
    fn a_stretch_shorter_than_the_least_span_is_not_judged() {
        let started = Instant::now();
        let webhook = ("holdfast-webhook-b", 9, Role::Serving);
        // Four minutes of life: one after settling, less than the three a judgement needs.
        let samples = stretch(started, webhook, (20, 24), |m| m as f64, |_| 10);
        let judged = resources(&samples, "holdfast-webhook", started, judging(10, 3, 3));
        assert_eq!(judged.rss_slope_mib_per_h, None);
        assert!(judged.stretches.is_empty());
        assert_eq!(
            judged.rss_max_mib, 24.0,
            "its memory still counts towards the largest"
        );
        let other = resources(&samples, "holdfast-controller", started, judging(1, 1, 1));
        assert_eq!(
            other.rss_max_mib, 0.0,
            "another component's samples are not judged"
        );
    }
}

//! The soak's figures and its last line: faults, violations, the memory slope of each holdfast
//! component after warm-up, admissions and the failed ones outside the API server's downtime.

use std::{
    collections::BTreeMap,
    fmt,
    time::{Duration, Instant},
};

use super::invariants::Sample;

/// The least-squares slope of `points` (x, y), none with fewer than two distinct x.
pub fn slope(points: &[(f64, f64)]) -> Option<f64> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let (sxy, sxx) = points.iter().fold((0.0, 0.0), |(sxy, sxx), (x, y)| {
        (sxy + (x - mx) * (y - my), sxx + (x - mx) * (x - mx))
    });
    (sxx > 0.0).then(|| sxy / sxx)
}

/// What the samples of one component (the processes whose names start with `component`) show
/// after warm-up: each process (one pid) judged on its samples taken `warm_up` after both the
/// soak's start and its own first sample, when they span at least `min_span`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Resources {
    /// The steepest RSS slope of any process, MiB per hour; none when no process had samples
    /// enough.
    pub rss_slope_mib_per_h: Option<f64>,
    /// The largest RSS seen, MiB.
    pub rss_max_mib: f64,
    /// The largest growth of open file descriptors and of threads within one process, from its
    /// first judged sample to its last.
    pub fd_growth: i64,
    pub thread_growth: i64,
}

pub fn resources(
    samples: &[Sample],
    component: &str,
    started: Instant,
    warm_up: Duration,
    min_span: Duration,
) -> Resources {
    let mut per_process: BTreeMap<(&str, u32), Vec<&Sample>> = BTreeMap::new();
    for sample in samples.iter().filter(|s| s.name.starts_with(component)) {
        per_process
            .entry((sample.name, sample.pid))
            .or_default()
            .push(sample);
    }
    let mut out = Resources::default();
    for process in per_process.values() {
        out.rss_max_mib = process
            .iter()
            .map(|s| s.usage.rss_mib())
            .fold(out.rss_max_mib, f64::max);
        let first = process[0].at;
        let judged: Vec<&&Sample> = process
            .iter()
            .filter(|s| s.at >= started + warm_up && s.at >= first + warm_up)
            .collect();
        let (Some(a), Some(b)) = (judged.first(), judged.last()) else {
            continue;
        };
        if b.at.duration_since(a.at) < min_span {
            continue;
        }
        let points: Vec<(f64, f64)> = judged
            .iter()
            .map(|s| {
                (
                    s.at.duration_since(started).as_secs_f64() / 3600.0,
                    s.usage.rss_mib(),
                )
            })
            .collect();
        if let Some(slope) = slope(&points) {
            out.rss_slope_mib_per_h = Some(out.rss_slope_mib_per_h.map_or(slope, |s: f64| s.max(slope)));
        }
        out.fd_growth = out
            .fd_growth
            .max(b.usage.open_fds as i64 - a.usage.open_fds as i64);
        out.thread_growth = out
            .thread_growth
            .max(b.usage.threads as i64 - a.usage.threads as i64);
    }
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
}

/// The figure of an optional slope: `n/a` when no process had samples enough.
fn figure(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.1}"))
}

/// The last line: the fields the issue asks for, first and in its order, then the others.
impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "minutes={:.1} faults={} violations={} rss_slope_mib_per_h_webhook={} rss_slope_mib_per_h_controller={} admissions={} failed_admissions_outside_apiserver_down={} failed_admissions={} unpinned_admissions={} unpinned_outside_webhook_or_apiserver_down={} tag_moves={} follows_checked={} restarts={} panics={} rss_max_mib_webhook={:.1} rss_max_mib_controller={:.1} fd_growth_max={} thread_growth_max={} controller_writes_judged={} private_pins_in_owner_namespace={} mirror_pins={} org_deletions={} builds_after_org_delete={} orgs_not_staged={} late_writes_delivered={} late_writes_refused={}",
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

    #[test]
    fn resources_judge_each_process_after_warm_up_and_take_the_steepest() {
        let started = Instant::now();
        let at = |s: u64| started + Duration::from_secs(s);
        let sample = |name, pid, s, rss_mib: u64, fds| Sample {
            name,
            pid,
            at: at(s),
            usage: Usage {
                rss_kib: rss_mib * 1024,
                open_fds: fds,
                threads: 4,
                ..Default::default()
            },
        };
        let samples = vec![
            // Warm-up: not judged (else the slope would be steep).
            sample("holdfast-webhook-a", 1, 0, 1, 10),
            sample("holdfast-webhook-a", 1, 600, 20, 10),
            sample("holdfast-webhook-a", 1, 2400, 21, 12),
            sample("holdfast-webhook-a", 1, 4200, 22, 11),
            // Flat, another process.
            sample("holdfast-webhook-b", 2, 600, 30, 10),
            sample("holdfast-webhook-b", 2, 3600, 30, 10),
            sample("holdfast-controller-a", 3, 600, 99, 10),
        ];
        let webhook = resources(
            &samples,
            "holdfast-webhook",
            started,
            Duration::from_secs(300),
            Duration::from_secs(60),
        );
        let slope = webhook.rss_slope_mib_per_h.unwrap();
        assert!((slope - 2.0).abs() < 1e-9, "{slope}");
        assert_eq!(webhook.rss_max_mib, 30.0);
        assert_eq!(webhook.fd_growth, 1);
        let controller = resources(
            &samples,
            "holdfast-controller",
            started,
            Duration::from_secs(300),
            Duration::from_secs(60),
        );
        assert_eq!(controller.rss_slope_mib_per_h, None, "one sample spans nothing");
    }
}

//! The mirror's state, owned and updated by the single task that runs it (`super::run`): the
//! copies and deletions running, both backoffs and their retry times, retention's clocks, and
//! whether every pinned kind has been listed. [`MirrorState::plan`] decides, from a
//! [`Snapshot`] of what the task read, what to start and when to look again, without I/O or a
//! clock of its own; the task reports what it started and what finished through the other
//! methods.

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, SystemTime},
};

use holdfast_cache::CacheKey;
use holdfast_registry::mirror::{CopyError, CopyReport, MirrorLocation};
use tokio::time::Instant;

use super::{
    CopyJob, MirrorSettings,
    retention::{Expired, Outcome, Retention},
};
use crate::backoff::{Backoff, FIRST_RETRY, RETRY_CEILING};

/// What the mirror's task read before planning.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// The copies the cache's entries need (`super::wanted`).
    pub wanted: Vec<CopyJob>,
    /// The targets among them that the shared `Copying` gave up on.
    pub given_up: HashSet<String>,
    /// The copies recorded on the cache's entries (`DigestCache::recorded_copies`).
    pub records: Vec<(CacheKey, String)>,
    /// The copies objects reference (`super::references`).
    pub referenced: HashSet<String>,
}

/// What to start now, and when to plan again unless something changes first.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub copies: Vec<CopyJob>,
    pub deletions: Vec<Expired>,
    /// The next retry or retention deadline that is not waiting for something else (a copy or
    /// a deletion running, a free deletion slot): `None` waits for a change or a join.
    pub wake_at: Option<Instant>,
}

/// How a copy ended, for the task to report.
#[derive(Debug)]
pub enum Copied {
    Copied(CopyReport),
    /// A permanent failure ([`CopyError::is_permanent`]): not retried.
    GivenUp(CopyError),
    /// Retried after `retry_in` (the first failure of a streak waits [`FIRST_RETRY`]).
    Failed {
        error: CopyError,
        retry_in: Duration,
    },
}

#[derive(Debug)]
pub struct MirrorState {
    location: MirrorLocation,
    grace: Duration,
    /// Copies at a time, and deletions at a time (each lists every pinned object afresh).
    limit: usize,
    /// Every pinned kind has been listed: retention's clocks run.
    listed: bool,
    running: HashSet<String>,
    retries: Backoff<String>,
    retry_at: HashMap<String, Instant>,
    retention: Retention,
    deleting: HashSet<String>,
    delete_retries: Backoff<String>,
    delete_retry_at: HashMap<String, Instant>,
}

impl MirrorState {
    pub fn new(settings: &MirrorSettings) -> Self {
        Self {
            location: settings.location.clone(),
            grace: settings.retention,
            limit: settings.concurrency.max(1),
            listed: false,
            running: HashSet::new(),
            retries: Backoff::new(FIRST_RETRY, RETRY_CEILING),
            retry_at: HashMap::new(),
            retention: Retention::default(),
            deleting: HashSet::new(),
            delete_retries: Backoff::new(FIRST_RETRY, RETRY_CEILING),
            delete_retry_at: HashMap::new(),
        }
    }

    /// Every pinned kind has been listed: from now on a copy no object references is known to
    /// be unreferenced, and retention's clocks run.
    pub fn all_listed(&mut self) {
        self.listed = true;
    }

    pub fn is_listed(&self) -> bool {
        self.listed
    }

    /// Starts and stops retention's clocks for `snapshot` at `wall` (none before every kind is
    /// listed). A copy being deleted keeps its clock although its records are gone meanwhile.
    pub fn observe(&mut self, wall: SystemTime, snapshot: &Snapshot) {
        if !self.listed {
            return;
        }
        let deleting = &self.deleting;
        self.retention.observe(
            &snapshot.records,
            &self.location,
            &snapshot.referenced,
            wall,
            |location| deleting.contains(location),
        );
    }

    /// The copies and deletions to start at `now` (`wall` for retention's clocks), at most
    /// `limit` of each running, and when to plan again once they have started.
    pub fn plan(&self, now: Instant, wall: SystemTime, snapshot: &Snapshot) -> Plan {
        let copies: Vec<CopyJob> = snapshot
            .wanted
            .iter()
            .filter(|job| {
                !self.running.contains(&job.target)
                    && !self.deleting.contains(&job.target)
                    && !snapshot.given_up.contains(&job.target)
            })
            .filter(|job| self.retry_at.get(&job.target).is_none_or(|at| *at <= now))
            .take(self.limit.saturating_sub(self.running.len()))
            .cloned()
            .collect();
        // No clock runs before every kind is listed ([`MirrorState::observe`]): nothing is due.
        let deletions: Vec<Expired> = self
            .retention
            .due(
                &snapshot.records,
                &self.location,
                &snapshot.referenced,
                wall,
                self.grace,
            )
            .into_iter()
            .filter(|e| !self.deleting.contains(&e.location) && !self.running.contains(&e.location))
            .filter(|e| self.delete_retry_at.get(&e.location).is_none_or(|at| *at <= now))
            .take(self.limit.saturating_sub(self.deleting.len()))
            .collect();
        let starting: HashSet<&str> = copies.iter().map(|job| job.target.as_str()).collect();
        let deleted: HashSet<&str> = deletions.iter().map(|e| e.location.as_str()).collect();
        let wake_at = self.wake(
            now,
            wall,
            |target| starting.contains(target),
            |location| deleted.contains(location),
            deletions.len(),
        );
        Plan {
            copies,
            deletions,
            wake_at,
        }
    }

    /// When to plan again with what runs now (after a planned start failed).
    pub fn wake_at(&self, now: Instant, wall: SystemTime) -> Option<Instant> {
        self.wake(now, wall, |_| false, |_| false, 0)
    }

    /// The next retry, or retention deadline, of a copy that waits for nothing else: a copy
    /// being copied or deleted, waiting for a retry or for a free deletion slot wakes the loop
    /// through those (a join or its retry), not through its past deadline.
    fn wake(
        &self,
        now: Instant,
        wall: SystemTime,
        starting: impl Fn(&str) -> bool,
        deletion_starting: impl Fn(&str) -> bool,
        deletions_starting: usize,
    ) -> Option<Instant> {
        let running = |target: &str| self.running.contains(target) || starting(target);
        let deleting = |location: &str| self.deleting.contains(location) || deletion_starting(location);
        // A retry that is due but not started waits for something else (a free slot, its
        // deletion, being wanted again): its past time would wake the loop at once, forever.
        let next_retry = self
            .retry_at
            .iter()
            .filter(|(target, _)| !running(target))
            .chain(
                self.delete_retry_at
                    .iter()
                    .filter(|(location, _)| !deleting(location)),
            )
            .map(|(_, at)| *at)
            .filter(|at| *at > now)
            .min();
        let full = self.deleting.len() + deletions_starting >= self.limit;
        let next_due = self
            .retention
            .next_due(self.grace, |location| {
                full || deleting(location)
                    || running(location)
                    || self.delete_retry_at.get(location).is_some_and(|at| *at > now)
            })
            .map(|due| now + due.duration_since(wall).unwrap_or_default());
        next_retry.into_iter().chain(next_due).min()
    }

    pub fn copy_started(&mut self, target: &str) {
        self.running.insert(target.to_owned());
    }

    pub fn deletion_started(&mut self, location: &str) {
        self.deleting.insert(location.to_owned());
    }

    /// A copy of `target` failed (or could not start): retried with backoff from `now`.
    pub fn retry_copy(&mut self, target: &str, now: Instant) -> Duration {
        let delay = self.retries.failed(target.to_owned());
        self.retry_at.insert(target.to_owned(), now + delay);
        delay
    }

    /// A deletion of `location` failed (or could not start): retried with backoff from `now`.
    pub fn retry_deletion(&mut self, location: &str, now: Instant) -> Duration {
        let delay = self.delete_retries.failed(location.to_owned());
        self.delete_retry_at.insert(location.to_owned(), now + delay);
        delay
    }

    pub fn copy_finished(
        &mut self,
        target: &str,
        result: Result<CopyReport, CopyError>,
        now: Instant,
    ) -> Copied {
        self.running.remove(target);
        match result {
            Ok(report) => {
                self.copy_succeeded(target);
                Copied::Copied(report)
            }
            Err(error) if error.is_permanent() => {
                self.copy_succeeded(target);
                Copied::GivenUp(error)
            }
            Err(error) => Copied::Failed {
                error,
                retry_in: self.retry_copy(target, now),
            },
        }
    }

    fn copy_succeeded(&mut self, target: &str) {
        self.retries.succeeded(&target.to_owned());
        self.retry_at.remove(target);
    }

    /// The deletion of `location` ended with `outcome`; for a failed one, when it is retried
    /// (its clock kept: it is due again once the backoff has passed).
    pub fn deletion_finished(&mut self, location: &str, outcome: &Outcome, now: Instant) -> Option<Duration> {
        self.deleting.remove(location);
        match outcome {
            Outcome::Deleted(_) | Outcome::Held { .. } => {
                self.retention.forget(location);
                self.delete_retries.succeeded(&location.to_owned());
                self.delete_retry_at.remove(location);
                None
            }
            Outcome::Referenced => {
                self.retention.forget(location);
                None
            }
            Outcome::Failed(_) => Some(self.retry_deletion(location, now)),
        }
    }
}

#[cfg(test)]
mod tests {
    use holdfast_cache::Scope;
    use holdfast_registry::{
        Digest, Reference,
        mirror::{CopyReport, DeleteError},
    };

    use super::*;
    use crate::mirror::retention::DeleteFailure;

    const GRACE: Duration = Duration::from_secs(60);

    fn settings(concurrency: usize, retention: Duration) -> MirrorSettings {
        MirrorSettings {
            location: MirrorLocation::new("cache.corp.com:5000", "m").unwrap(),
            namespaces: Default::default(),
            pull_secret: None,
            registries: Vec::new(),
            secret: None,
            concurrency,
            retention,
        }
    }

    fn key(tag: &str) -> CacheKey {
        CacheKey::tag(
            &Reference::parse(&format!("registry.corp.com/team/app:{tag}")).unwrap(),
            Scope::Anonymous,
        )
    }

    fn copy(seed: &str) -> String {
        let digest = Digest::sha256_of(seed.as_bytes());
        format!("cache.corp.com:5000/m/registry.corp.com/team/app@{digest}")
    }

    fn job(seed: &str) -> CopyJob {
        let digest = Digest::sha256_of(seed.as_bytes());
        CopyJob {
            source: Reference::parse(&format!("registry.corp.com/team/app@{digest}")).unwrap(),
            target: copy(seed),
            mirror: MirrorLocation::new("cache.corp.com:5000", "m").unwrap(),
            scope: Scope::Anonymous,
            secret_uid: None,
            keys: vec![key(seed)],
        }
    }

    /// Entries recording the copies of `seeds`, none referenced.
    fn unreferenced(seeds: &[&str]) -> Snapshot {
        Snapshot {
            records: seeds.iter().map(|seed| (key(seed), copy(seed))).collect(),
            ..Snapshot::default()
        }
    }

    fn locations(plan: &Plan) -> Vec<&str> {
        plan.deletions.iter().map(|e| e.location.as_str()).collect()
    }

    /// A listed state whose clocks for `snapshot` started at `wall`.
    fn timed(settings: &MirrorSettings, wall: SystemTime, snapshot: &Snapshot) -> MirrorState {
        let mut state = MirrorState::new(settings);
        state.all_listed();
        state.observe(wall, snapshot);
        state
    }

    fn failed() -> Outcome {
        Outcome::Failed(DeleteFailure::Mirror(DeleteError::NotInMirror("x".into())))
    }

    #[test]
    fn a_copy_past_its_grace_waiting_for_its_deletion_or_copy_or_retry_sets_no_deadline() {
        let (now, t0) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let snapshot = unreferenced(&["a"]);
        let mut state = timed(&settings(2, GRACE), t0, &snapshot);
        let later = t0 + GRACE + Duration::from_secs(5);
        // Its deletion runs: nothing to start, no deadline (it was past: the loop spun).
        state.deletion_started(&copy("a"));
        let plan = state.plan(now, later, &snapshot);
        assert_eq!(plan, Plan::default());
        // Being copied (referenced again and wanted meanwhile): the same.
        let mut state = timed(&settings(2, GRACE), t0, &snapshot);
        state.copy_started(&copy("a"));
        assert_eq!(state.plan(now, later, &snapshot), Plan::default());
        // Its deletion waiting for a retry: the retry is the deadline, not the past grace.
        let mut state = timed(&settings(2, GRACE), t0, &snapshot);
        state.deletion_started(&copy("a"));
        let retry_in = state.deletion_finished(&copy("a"), &failed(), now).unwrap();
        let plan = state.plan(now, later, &snapshot);
        assert!(plan.deletions.is_empty(), "{plan:?}");
        assert_eq!(plan.wake_at, Some(now + retry_in));
    }

    #[test]
    fn at_most_concurrency_deletions_and_due_copies_waiting_for_a_slot_set_no_deadline() {
        let (now, t0) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let snapshot = unreferenced(&["a", "b", "c"]);
        let mut state = timed(&settings(2, GRACE), t0, &snapshot);
        let plan = state.plan(now, t0 + GRACE, &snapshot);
        assert_eq!(plan.deletions.len(), 2, "{plan:?}");
        assert_eq!(
            plan.wake_at, None,
            "the third waits for a slot, not for its past deadline"
        );
        for expired in &plan.deletions {
            state.deletion_started(&expired.location);
        }
        let plan_while_full = state.plan(now, t0 + GRACE, &snapshot);
        assert_eq!(plan_while_full, Plan::default());
        // A slot frees: the third is deleted.
        let first = plan.deletions[0].location.clone();
        state.deletion_finished(&first, &Outcome::Referenced, now);
        let rest = Snapshot {
            records: snapshot
                .records
                .iter()
                .filter(|(_, l)| *l != first)
                .cloned()
                .collect(),
            ..Snapshot::default()
        };
        let third: Vec<String> = ["a", "b", "c"]
            .map(copy)
            .into_iter()
            .filter(|l| !locations(&plan).contains(&l.as_str()))
            .collect();
        assert_eq!(locations(&state.plan(now, t0 + GRACE, &rest)), third);
    }

    #[test]
    fn a_failed_deletion_keeps_its_clock_and_is_retried_after_the_backoff_not_a_new_grace() {
        let (now, t0) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let snapshot = unreferenced(&["a"]);
        let mut state = timed(&settings(2, GRACE), t0, &snapshot);
        let due = t0 + GRACE;
        assert_eq!(locations(&state.plan(now, due, &snapshot)), [copy("a")]);
        state.deletion_started(&copy("a"));
        // The deletion drops the entries' records first.
        state.observe(due, &Snapshot::default());
        // It fails and restores them.
        let retry_in = state.deletion_finished(&copy("a"), &failed(), now).unwrap();
        assert_eq!(retry_in, FIRST_RETRY);
        state.observe(due, &snapshot);
        let plan = state.plan(now, due, &snapshot);
        assert!(plan.deletions.is_empty(), "{plan:?}");
        assert_eq!(plan.wake_at, Some(now + FIRST_RETRY));
        let retried = state.plan(now + FIRST_RETRY, due + FIRST_RETRY, &snapshot);
        assert_eq!(
            locations(&retried),
            [copy("a")],
            "due after the backoff, not after a new grace"
        );
        // A second failure waits twice as long.
        state.deletion_started(&copy("a"));
        assert_eq!(
            state.deletion_finished(&copy("a"), &failed(), now),
            Some(2 * FIRST_RETRY)
        );
    }

    #[test]
    fn a_retry_that_is_due_but_not_started_sets_no_deadline() {
        let (now, t0) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let wanted = Snapshot {
            wanted: vec![job("a")],
            ..Snapshot::default()
        };
        let mut state = MirrorState::new(&settings(2, GRACE));
        state.copy_started(&copy("a"));
        let error = CopyError::Credentials("down".into());
        state.copy_finished(&copy("a"), Err(error), now);
        // No object references it any more: nothing to copy, and its past retry no deadline.
        let later = now + FIRST_RETRY;
        assert_eq!(state.plan(later, t0, &Snapshot::default()), Plan::default());
        // Wanted again: copied at once.
        assert_eq!(state.plan(later, t0, &wanted).copies, [job("a")]);
        // A failed deletion of a copy referenced again meanwhile: the same.
        let mut state = timed(&settings(2, GRACE), t0, &unreferenced(&["b"]));
        state.deletion_started(&copy("b"));
        state.deletion_finished(&copy("b"), &failed(), now);
        let referenced = Snapshot {
            referenced: [copy("b")].into(),
            ..unreferenced(&["b"])
        };
        state.observe(t0 + GRACE, &referenced);
        assert_eq!(state.plan(later, t0 + GRACE, &referenced), Plan::default());
    }

    #[test]
    fn copies_start_before_every_kind_is_listed_and_only_deletions_wait() {
        let (now, t0) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let snapshot = Snapshot {
            wanted: vec![job("a")],
            ..unreferenced(&["old"])
        };
        let mut state = MirrorState::new(&settings(2, Duration::ZERO));
        state.observe(t0, &snapshot);
        let plan = state.plan(now, t0, &snapshot);
        assert_eq!(plan.copies, [job("a")]);
        assert!(
            plan.deletions.is_empty(),
            "no clock runs before every kind is listed"
        );
        assert_eq!(plan.wake_at, None);
        state.all_listed();
        state.observe(t0, &snapshot);
        assert_eq!(locations(&state.plan(now, t0, &snapshot)), [copy("old")]);
    }

    #[test]
    fn a_failed_copy_is_planned_again_after_its_backoff_and_a_permanent_failure_is_not_retried() {
        let (now, t0) = (Instant::now(), SystemTime::UNIX_EPOCH);
        let snapshot = Snapshot {
            wanted: vec![job("a"), job("b")],
            ..Snapshot::default()
        };
        let mut state = MirrorState::new(&settings(1, GRACE));
        let plan = state.plan(now, t0, &snapshot);
        assert_eq!(plan.copies, [job("a")], "one slot");
        state.copy_started(&copy("a"));
        assert_eq!(state.plan(now, t0, &snapshot), Plan::default());
        let error = CopyError::Credentials("down".into());
        let Copied::Failed { retry_in, .. } = state.copy_finished(&copy("a"), Err(error), now) else {
            panic!("a transient failure is retried");
        };
        assert_eq!(retry_in, FIRST_RETRY);
        let plan = state.plan(now, t0, &snapshot);
        assert_eq!(plan.copies, [job("b")]);
        assert_eq!(plan.wake_at, Some(now + FIRST_RETRY));
        state.copy_started(&copy("b"));
        let report = CopyReport::default();
        assert!(matches!(
            state.copy_finished(&copy("b"), Ok(report), now),
            Copied::Copied(_)
        ));
        assert_eq!(state.plan(now + FIRST_RETRY, t0, &snapshot).copies, [job("a")]);
        // A permanent failure resets the backoff: nothing to retry, no deadline.
        state.copy_started(&copy("a"));
        let permanent = CopyError::NotPinned("no digest".into());
        assert!(matches!(
            state.copy_finished(&copy("a"), Err(permanent), now),
            Copied::GivenUp(_)
        ));
        assert_eq!(state.wake_at(now, t0), None);
    }
}

//! Leader election on a [`crd::ControllerLease`] (a `coordination.k8s.io/v1` Lease's fields in
//! holdfast's own kind, which the term fence can take as its parameter: [`crd`]), so the
//! controller can run with several replicas and only one reconciles. Timing follows client-go's
//! leaderelection, not the lease's timestamps: a candidate measures a holder's lease from when
//! *it* last saw the lease's record change (observed time, local monotonic clock), so clock skew
//! between replicas cannot make two leaders; the leader gives every renewal a deadline
//! (`renew_deadline` after the start of its last successful one, well inside the lease) and stops
//! its work the moment that passes, even while a renewal request hangs: its work is dropped at
//! once, requests in flight included (on shutdown it may wind down until that deadline). A lost
//! leader then exits and restarts as a candidate; on shutdown it releases the lease so a standby
//! takes over without waiting for the expiry.
//!
//! Why not a crate: both elect on `coordination.k8s.io` Leases only, which the term fence cannot
//! take as its parameter ([`crd`] says why); besides, `kube-leader-election` 0.44 needs kube 4
//! (holdfast is on kube 5), and `kube-lease-manager` 0.13 computes expiry as the Lease's
//! `renewTime` plus its duration against the local wall clock (the skew this module avoids),
//! renews without a deadline, and needs `patch`. The timing below is pure functions, unit-tested.

pub mod crd;

use std::time::{Duration, Instant, SystemTime};

use kube::{Api, Client, api::PostParams};
use tokio_util::sync::CancellationToken;

use crd::{ControllerLease, ControllerLeaseSpec, Timestamp};

/// The lease's name unless `--lease-name` says otherwise; the term fence's binding names it
/// (`manifests/base/controller/term-fence.yaml`, held to it by the manifests test).
pub const LEASE: &str = "holdfast-controller";

#[derive(Debug, Clone)]
pub struct Election {
    pub namespace: String,
    pub lease: String,
    /// This replica's name (the pod name).
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// How often the leader renews, and a candidate looks (well under `duration`).
    pub renew_every: Duration,
    /// The leader stops leading when no renewal succeeded for this long (under `duration`).
    pub renew_deadline: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("lost the lease {0} to another replica or could not renew it in time")]
    Lost(String),
}

/// What a Lease says about who holds it. Two reads with the same record mean nobody renewed
/// in between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub holder: Option<String>,
    pub renew_time: Option<Timestamp>,
    pub acquire_time: Option<Timestamp>,
    pub transitions: i32,
    pub duration: Option<Duration>,
}

impl Record {
    fn of(spec: &ControllerLeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time,
            acquire_time: spec.acquire_time,
            transitions: spec.lease_transitions.unwrap_or(0),
            duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
        }
    }
}

/// A record, and when this replica first saw it (its clock, not the Lease's timestamps).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub record: Record,
    pub since: Instant,
}

/// The observation after reading `record` at `now`: the same record keeps the time it was first
/// seen; any change (a renewal) starts the holder's lease again from `now`.
pub fn observe(previous: Option<Observation>, record: Record, now: Instant) -> Observation {
    match previous {
        Some(previous) if previous.record == record => previous,
        _ => Observation { record, since: now },
    }
}

/// Whether `identity` may write the Lease at `now`: it is free, ours, or its holder has not
/// renewed for the lease's duration as this replica observed it (`fallback` when the record
/// names none).
pub fn may_take(observed: &Observation, identity: &str, fallback: Duration, now: Instant) -> bool {
    match &observed.record.holder {
        None => true,
        Some(holder) if holder == identity => true,
        Some(_) => {
            let duration = observed
                .record
                .duration
                .filter(|d| !d.is_zero())
                .unwrap_or(fallback);
            now.saturating_duration_since(observed.since) >= duration
        }
    }
}

/// The instant leadership ends unless a renewal succeeds first: `renew_deadline` after the
/// start of the last successful write (a candidate's lease clock starts no earlier than that).
pub fn leading_until(last_success_started: Instant, renew_deadline: Duration) -> Instant {
    last_success_started + renew_deadline
}

/// How long a write started at `now` may take: until the deadline, at least nothing.
pub fn request_budget(deadline: Instant, now: Instant) -> Duration {
    deadline.saturating_duration_since(now)
}

/// Where this replica stands in the election, for its readiness ([`crate::admin`]) and the
/// leader metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not in the election yet (the digest cache is syncing).
    Starting,
    /// Standing by; `healthy` when its last read of the Lease succeeded.
    Candidate { healthy: bool },
    /// Holding the Lease: a renewal is late from `late_at` on (two renewal periods after the
    /// last successful one started, at most the renewal deadline); `failing` when an attempt
    /// since failed.
    Leading { late_at: Instant, failing: bool },
    /// Left the election: the Lease was lost, or handed back on shutdown.
    Stopped,
}

/// Whether `role` is a healthy one at `now`: a candidate that reads the Lease, or a leader
/// whose renewals are current. The error says why not.
pub fn healthy(role: Role, now: Instant) -> Result<&'static str, &'static str> {
    match role {
        Role::Starting => Err("not in the leader election yet"),
        Role::Candidate { healthy: true } => Ok("standing by"),
        Role::Candidate { healthy: false } => Err("standing by, but reading the Lease failed"),
        Role::Leading { failing: true, .. } => Err("leading, but renewing the Lease failed"),
        Role::Leading { late_at, .. } if now >= late_at => Err("leading, but the Lease renewal is late"),
        Role::Leading { .. } => Ok("leading"),
        Role::Stopped => Err("left the leader election (Lease lost or handed back)"),
    }
}

/// When a renewal counts as late: two renewal periods after the last successful one started
/// (one period to wait, one for the request), never later than the renewal deadline.
pub fn late_at(last_success_started: Instant, renew_every: Duration, renew_deadline: Duration) -> Instant {
    last_success_started + (renew_every * 2).min(renew_deadline)
}

/// The replica's [`Role`], as [`Election::lead_reporting`] keeps it; watchable.
#[derive(Debug)]
pub struct Status(tokio::sync::watch::Sender<Role>);

impl Default for Status {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(Role::Starting))
    }
}

impl Status {
    pub fn role(&self) -> Role {
        *self.0.borrow()
    }

    pub fn leading(&self) -> bool {
        matches!(self.role(), Role::Leading { .. })
    }

    /// Every change of role, from the current one.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Role> {
        self.0.subscribe()
    }

    fn set(&self, role: Role) {
        self.0.send_if_modified(|current| {
            let changed = *current != role;
            *current = role;
            changed
        });
    }
}

impl Election {
    /// Waits until this replica holds the Lease, then runs `work` with a token that is cancelled
    /// when leadership is lost or `cancel` fires. Returns `Err(Lost)` if leadership was lost.
    pub async fn lead<F, Fut>(&self, client: Client, cancel: CancellationToken, work: F) -> Result<(), Error>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.lead_reporting(client, cancel, &Status::default(), work)
            .await
    }

    /// [`Election::lead`], keeping `status` current: each read of the Lease as a candidate,
    /// each renewal as the leader, and the end.
    pub async fn lead_reporting<F, Fut>(
        &self,
        client: Client,
        cancel: CancellationToken,
        status: &Status,
        work: F,
    ) -> Result<(), Error>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let result = self.run_election(client, cancel, status, work).await;
        status.set(Role::Stopped);
        result
    }

    async fn run_election<F, Fut>(
        &self,
        client: Client,
        cancel: CancellationToken,
        status: &Status,
        work: F,
    ) -> Result<(), Error>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let leases: Api<ControllerLease> = Api::namespaced(client, &self.namespace);
        let leading_since = |started: Instant| Role::Leading {
            late_at: late_at(started, self.renew_every, self.renew_deadline),
            failing: false,
        };
        let mut observed = None;
        let mut last_success = loop {
            if cancel.is_cancelled() {
                return Ok(());
            }
            let started = Instant::now();
            let attempt = self.try_acquire(&leases, &mut observed, started);
            // A candidate's write gets the same bound as a renewal.
            match tokio::time::timeout(self.renew_deadline, attempt).await {
                Ok(Ok(true)) => {
                    status.set(leading_since(started));
                    break started;
                }
                Ok(Ok(false)) => status.set(Role::Candidate { healthy: true }),
                Ok(Err(error)) => {
                    status.set(Role::Candidate { healthy: false });
                    tracing::warn!(%error, "reading or taking the lease failed; retrying")
                }
                Err(_) => {
                    status.set(Role::Candidate { healthy: false });
                    tracing::warn!(deadline = ?self.renew_deadline, "taking the lease timed out; retrying")
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(self.renew_every) => {}
            }
        };
        tracing::info!(lease = %self.lease, identity = %self.identity, "became leader");
        let leading = cancel.child_token();
        let mut task = tokio::spawn(work(leading.clone()));
        let result = loop {
            let deadline = leading_until(last_success, self.renew_deadline);
            tokio::select! {
                _ = cancel.cancelled() => break Ok(()),
                _ = tokio::time::sleep_until(deadline.into()) => {
                    tracing::warn!(lease = %self.lease, deadline = ?self.renew_deadline, "no renewal succeeded in time; stopping");
                    break Err(Error::Lost(self.lease.clone()));
                }
                _ = tokio::time::sleep(self.renew_every) => {
                    let started = Instant::now();
                    let renewal = self.try_acquire(&leases, &mut observed, started);
                    // The renewal may not outlive leadership: the deadline bounds it too.
                    match tokio::time::timeout(request_budget(deadline, started), renewal).await {
                        Ok(Ok(true)) => {
                            last_success = started;
                            status.set(leading_since(started));
                        }
                        Ok(Ok(false)) => break Err(Error::Lost(self.lease.clone())),
                        Ok(Err(error)) => {
                            status.set(Role::Leading {
                                late_at: late_at(last_success, self.renew_every, self.renew_deadline),
                                failing: true,
                            });
                            tracing::warn!(%error, "renewing the lease failed; retrying until the deadline")
                        }
                        Err(_) => {
                            tracing::warn!(lease = %self.lease, "renewing the lease did not finish before the deadline; stopping");
                            break Err(Error::Lost(self.lease.clone()));
                        }
                    }
                }
            }
        };
        status.set(Role::Stopped);
        leading.cancel();
        let finished = match &result {
            // Lost: nothing more goes to the API server for this term. The work is dropped where
            // it stands, its requests in flight with it (a request already on the wire cannot be
            // recalled: SECURITY.md). A graceful end would let a reconcile that waits on a hung
            // connection carry on, and write, once the connection comes back.
            Err(_) => false,
            // Shutting down: the work winds down, but not past the lease this replica still holds.
            Ok(()) => {
                let until = leading_until(last_success, self.renew_deadline);
                let finished = tokio::time::timeout_at(until.into(), &mut task).await.is_ok();
                if !finished {
                    tracing::warn!(lease = %self.lease, "the work did not stop before the renewal deadline; dropped");
                }
                finished
            }
        };
        if !finished {
            task.abort();
            let _ = task.await;
        }
        if result.is_ok() {
            self.release(&leases).await;
        }
        result
    }

    /// Takes or renews the Lease; `false` when another replica holds an unexpired one (as this
    /// replica observed it, `observed` updated) or won the write.
    async fn try_acquire(
        &self,
        leases: &Api<ControllerLease>,
        observed: &mut Option<Observation>,
        now: Instant,
    ) -> Result<bool, Error> {
        let wall = Timestamp(SystemTime::now());
        let Some(mut lease) = leases.get_opt(&self.lease).await? else {
            let lease = ControllerLease::new(&self.lease, self.spec(wall, wall, 0));
            return match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = &lease.spec;
        let current = observe(observed.take(), Record::of(spec), now);
        let may = may_take(&current, &self.identity, self.duration, now);
        let mine = current.record.holder.as_deref() == Some(self.identity.as_str());
        *observed = Some(current);
        if !may {
            return Ok(false);
        }
        let acquired = if mine {
            spec.acquire_time.unwrap_or(wall)
        } else {
            wall
        };
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        lease.spec = self.spec(acquired, wall, transitions);
        match leases.replace(&self.lease, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Hands the Lease back so a standby need not wait for it to expire.
    async fn release(&self, leases: &Api<ControllerLease>) {
        let release = async {
            if let Ok(Some(mut lease)) = leases.get_opt(&self.lease).await
                && lease.spec.holder_identity.as_deref() == Some(self.identity.as_str())
            {
                lease.spec.holder_identity = None;
                lease.spec.renew_time = None;
                let _ = leases.replace(&self.lease, &PostParams::default(), &lease).await;
                tracing::info!(lease = %self.lease, "released the lease");
            }
        };
        if tokio::time::timeout(self.renew_deadline, release).await.is_err() {
            tracing::warn!(lease = %self.lease, "releasing the lease timed out; it expires instead");
        }
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> ControllerLeaseSpec {
        ControllerLeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: Some(acquired),
            renew_time: Some(renewed),
            lease_transitions: Some(transitions),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    fn held_by(holder: &str, renewed_seconds: i64) -> Record {
        Record {
            holder: Some(holder.into()),
            renew_time: Some(Timestamp(
                SystemTime::UNIX_EPOCH + Duration::from_secs(renewed_seconds.unsigned_abs()),
            )),
            acquire_time: Some(Timestamp(SystemTime::UNIX_EPOCH)),
            transitions: 1,
            duration: Some(LEASE),
        }
    }

    /// Issue 15, item 4: expiry compared the Lease's renewTime with the local clock, so a
    /// candidate whose clock ran ahead (or a holder whose clock ran behind) took a Lease that
    /// was being renewed. A record that keeps changing is never expired, whatever it says.
    #[test]
    fn a_lease_renewed_with_a_skewed_clock_is_not_taken() {
        let t0 = Instant::now();
        // renewTime is the epoch (the holder's clock is far behind ours), renewed every 5 s.
        let mut observed = observe(None, held_by("other", 1), t0);
        for step in 1..10u32 {
            let now = t0 + Duration::from_secs(5) * step;
            observed = observe(Some(observed), held_by("other", 1 + i64::from(step)), now);
            assert!(!may_take(&observed, "me", LEASE, now), "taken at step {step}");
        }
    }

    #[test]
    fn a_lease_not_renewed_for_its_duration_as_observed_here_is_taken() {
        let t0 = Instant::now();
        // renewTime far in the future (the holder's clock is ahead): irrelevant too.
        let record = held_by("other", 4_000_000_000);
        let observed = observe(None, record.clone(), t0);
        let observed = observe(Some(observed), record.clone(), t0 + Duration::from_secs(10));
        assert_eq!(observed.since, t0, "an unchanged record keeps its first sighting");
        assert!(!may_take(&observed, "me", LEASE, t0 + Duration::from_secs(14)));
        assert!(may_take(&observed, "me", LEASE, t0 + LEASE));
        // A candidate that only just started watching waits a whole lease.
        let late = observe(None, record, t0 + LEASE);
        assert!(!may_take(&late, "me", LEASE, t0 + LEASE));
    }

    #[test]
    fn a_free_or_own_lease_is_taken_at_once() {
        let now = Instant::now();
        let free = Record {
            holder: None,
            ..held_by("x", 0)
        };
        assert!(may_take(&observe(None, free, now), "me", LEASE, now));
        assert!(may_take(&observe(None, held_by("me", 0), now), "me", LEASE, now));
    }

    #[test]
    fn a_record_without_a_duration_uses_ours() {
        let t0 = Instant::now();
        let record = Record {
            duration: None,
            ..held_by("other", 0)
        };
        let observed = observe(None, record, t0);
        assert!(!may_take(&observed, "me", Duration::from_secs(30), t0 + LEASE));
        assert!(may_take(&observed, "me", Duration::from_secs(30), t0 + LEASE * 2));
    }

    #[test]
    fn a_candidate_reading_the_lease_and_a_leader_renewing_in_time_are_healthy() {
        let t0 = Instant::now();
        let (every, deadline) = (Duration::from_secs(5), Duration::from_secs(10));
        assert!(healthy(Role::Starting, t0).is_err());
        assert!(healthy(Role::Candidate { healthy: true }, t0).is_ok());
        assert!(healthy(Role::Candidate { healthy: false }, t0).is_err());
        let late = late_at(t0, every, deadline);
        assert_eq!(late, t0 + deadline, "two periods, at most the deadline");
        assert_eq!(
            late_at(t0, Duration::from_secs(1), deadline),
            t0 + Duration::from_secs(2)
        );
        let leading = Role::Leading {
            late_at: late,
            failing: false,
        };
        assert!(healthy(leading, t0 + every).is_ok());
        assert!(
            healthy(leading, late).is_err(),
            "a renewal two periods overdue is late"
        );
        let failing = Role::Leading {
            late_at: late,
            failing: true,
        };
        assert!(healthy(failing, t0).is_err());
        assert!(healthy(Role::Stopped, t0).is_err());
    }

    /// The leader stops `renew_deadline` after its last successful renewal started, before any
    /// candidate (whose clock starts at or after that write) may take the Lease; a renewal
    /// request never runs past that instant.
    #[test]
    fn leadership_ends_at_the_renewal_deadline_before_any_candidate_may_take_over() {
        let renew_deadline = Duration::from_secs(10);
        let started = Instant::now();
        let until = leading_until(started, renew_deadline);
        assert_eq!(until, started + renew_deadline);
        // A candidate that saw the write at the earliest possible moment.
        let candidate = observe(None, held_by("leader", 0), started);
        assert!(!may_take(&candidate, "candidate", LEASE, until));
        // A renewal begun 8 s in may take 2 s; one begun at or after the deadline, nothing.
        assert_eq!(
            request_budget(until, started + Duration::from_secs(8)),
            Duration::from_secs(2)
        );
        assert_eq!(
            request_budget(until, until + Duration::from_secs(1)),
            Duration::ZERO
        );
    }
}

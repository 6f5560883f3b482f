//! Per-host budgets: a concurrency limit so one slow registry cannot take every connection, and
//! a "do not call before" instant set by `429 Too Many Requests` so calls inside the window fail
//! fast without touching the registry (and without making its rate limit worse).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{sync::Semaphore, time::Instant};

struct HostState {
    permits: Arc<Semaphore>,
    not_before: Option<Instant>,
}

/// Hosts held before idle ones are dropped: a tenant can name any number of registries.
const MAX_HOSTS: usize = 1024;

/// Gates keyed by request authority (`host[:port]`), created on first use; at [`MAX_HOSTS`],
/// the hosts with no request in flight and no open rate-limit window are dropped.
pub(crate) struct HostGates {
    max_concurrent: usize,
    hosts: Mutex<HashMap<String, HostState>>,
}

impl HostGates {
    pub(crate) fn new(max_concurrent: usize) -> Self {
        Self {
            max_concurrent: max_concurrent.max(1),
            hosts: Mutex::new(HashMap::new()),
        }
    }

    fn with_host<T>(&self, host: &str, f: impl FnOnce(&mut HostState) -> T) -> T {
        let mut hosts = self.hosts.lock().unwrap_or_else(PoisonError::into_inner);
        if hosts.len() >= MAX_HOSTS && !hosts.contains_key(host) {
            let now = Instant::now();
            hosts.retain(|_, state| {
                Arc::strong_count(&state.permits) > 1
                    || state.permits.available_permits() < self.max_concurrent
                    || state.not_before.is_some_and(|t| t > now)
            });
        }
        let state = hosts.entry(host.to_owned()).or_insert_with(|| HostState {
            permits: Arc::new(Semaphore::new(self.max_concurrent)),
            not_before: None,
        });
        f(state)
    }

    /// How long calls to `host` must still wait, if a rate limit window is open.
    pub(crate) fn blocked_for(&self, host: &str) -> Option<Duration> {
        let now = Instant::now();
        self.with_host(host, |state| match state.not_before {
            Some(t) if t > now => Some(t - now),
            Some(_) => {
                state.not_before = None;
                None
            }
            None => None,
        })
    }

    /// Opens (or extends, never shortens) the window in which `host` is not called.
    pub(crate) fn block(&self, host: &str, duration: Duration) {
        let until = Instant::now() + duration;
        self.with_host(host, |state| {
            state.not_before = Some(state.not_before.map_or(until, |t| t.max(until)));
        });
    }

    /// The semaphore bounding concurrent requests to `host`.
    pub(crate) fn permits(&self, host: &str) -> Arc<Semaphore> {
        self.with_host(host, |state| state.permits.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn block_window_opens_extends_and_closes() {
        let gates = HostGates::new(2);
        assert_eq!(gates.blocked_for("r.io"), None);
        gates.block("r.io", Duration::from_secs(10));
        assert_eq!(gates.blocked_for("r.io"), Some(Duration::from_secs(10)));
        assert_eq!(gates.blocked_for("other.io"), None, "per host");
        gates.block("r.io", Duration::from_secs(1));
        assert_eq!(
            gates.blocked_for("r.io"),
            Some(Duration::from_secs(10)),
            "never shortened"
        );
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(gates.blocked_for("r.io"), Some(Duration::from_secs(6)));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(gates.blocked_for("r.io"), None);
    }

    #[tokio::test]
    async fn idle_hosts_are_dropped_past_the_bound_and_busy_ones_kept() {
        let gates = HostGates::new(1);
        let busy = gates.permits("busy.io");
        let _held = busy.clone().try_acquire_owned().unwrap();
        drop(busy);
        gates.block("limited.io", Duration::from_secs(60));
        for i in 0..MAX_HOSTS {
            let _ = gates.permits(&format!("h{i}.io"));
        }
        let hosts = gates.hosts.lock().unwrap();
        assert!(hosts.len() <= MAX_HOSTS, "{} hosts held", hosts.len());
        assert!(
            hosts.contains_key("busy.io"),
            "a host with a request in flight is kept"
        );
        assert!(
            hosts.contains_key("limited.io"),
            "an open rate-limit window is kept"
        );
    }

    #[test]
    fn permits_are_per_host_and_shared() {
        let gates = HostGates::new(2);
        let a = gates.permits("a.io");
        assert!(Arc::ptr_eq(&a, &gates.permits("a.io")));
        assert!(!Arc::ptr_eq(&a, &gates.permits("b.io")));
        assert_eq!(a.available_permits(), 2);
        assert_eq!(
            HostGates::new(0).permits("x").available_permits(),
            1,
            "at least one"
        );
    }
}

//! Per-object retry delays for references that could not be pinned: soon after the first
//! failure (a registry blip), doubling up to a ceiling (a registry that stays down is asked
//! rarely), and back to the start once the object pins.

use std::{collections::HashMap, hash::Hash, sync::Mutex, time::Duration};

/// The first retry of an object that could not be pinned and of a failed copy (doubling with
/// each failure up to the ceiling): a registry blip is over in seconds.
pub const FIRST_RETRY: Duration = Duration::from_secs(2);
/// Their longest wait: a registry that stays down is asked every five minutes.
pub const RETRY_CEILING: Duration = Duration::from_secs(300);

#[derive(Debug)]
pub struct Backoff<K> {
    first: Duration,
    ceiling: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash> Backoff<K> {
    pub fn new(first: Duration, ceiling: Duration) -> Self {
        Self {
            first,
            ceiling,
            failures: Mutex::default(),
        }
    }

    /// Records one more failure for `key` and returns how long to wait before trying again.
    pub fn failed(&self, key: K) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(key).or_insert(0);
        let delay = self
            .first
            .saturating_mul(2u32.saturating_pow(*count))
            .min(self.ceiling);
        *count = count.saturating_add(1);
        delay
    }

    /// Forgets `key`'s failures.
    pub fn succeeded(&self, key: &K) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_ceiling_and_reset_on_success() {
        let backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
        let delays: Vec<u64> = (0..7).map(|_| backoff.failed("a").as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(
            backoff.failed("b"),
            Duration::from_secs(2),
            "keys are independent"
        );
        backoff.succeeded(&"a");
        assert_eq!(backoff.failed("a"), Duration::from_secs(2));
    }

    #[test]
    fn many_failures_do_not_overflow() {
        let backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(300));
        for _ in 0..100 {
            assert!(backoff.failed(1) <= Duration::from_secs(300));
        }
    }
}

//! Latency percentiles, as the benchmarks report them.

use std::time::Duration;

/// The p50 and p99 of `latencies`, in milliseconds (nearest rank; 0 for none).
pub fn p50_p99_ms(mut latencies: Vec<Duration>) -> (f64, f64) {
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3
    };
    (at(0.5), at(0.99))
}

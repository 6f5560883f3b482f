//! The refresher: one registry check per unique cache key per round, never one per object.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use holdfast_pins::{Pinner, resolve::RefreshReport};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Rounds start `interval` apart, each shifted by up to a tenth of it so that replicas and
/// restarts do not synchronise on the registry.
pub async fn run(pinner: &Pinner, interval: Duration, rounds: watch::Sender<u64>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval + jitter(interval / 10)) => {}
        }
        // A round asks the registry once per key, each ask bounded by the resolver's timeout:
        // with many keys and a registry down it can last minutes, so it must not hold up a
        // shutdown or a lost Lease. Dropping it part-way loses nothing: the next round starts over.
        let report = tokio::select! {
            _ = cancel.cancelled() => return,
            report = round(pinner) => report,
        };
        rounds.send_modify(|n| *n += 1);
        tracing::info!(
            checked = report.checked,
            moved = report.moved,
            failed = report.failed,
            "refresh round"
        );
    }
}

/// One round: refresh every cache key.
pub async fn round(pinner: &Pinner) -> RefreshReport {
    pinner.refresh_all().await
}

fn jitter(max: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    max.mul_f64(f64::from(nanos) / 1e9)
}

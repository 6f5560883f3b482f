//! The admin port: plain HTTP, separate from the TLS admission port, for probes and scrapes
//! (served by `holdfast_runtime::admin`); here what its readiness waits for and what a scrape
//! reads.

use std::{
    borrow::Cow,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use holdfast_certs::SwappableCert;
use holdfast_runtime::admin::Probes;

use crate::metrics::Metrics;

/// What readiness waits for. The server starts unready and turns unready first on shutdown.
#[derive(Debug, Default)]
pub struct Readiness {
    pub caches_synced: AtomicBool,
    pub serving: AtomicBool,
    pub shutting_down: AtomicBool,
}

impl Readiness {
    /// Why the server is not ready, if it is not.
    pub fn blockers(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if !self.caches_synced.load(Ordering::Acquire) {
            out.push("caches not synced");
        }
        if !self.serving.load(Ordering::Acquire) {
            out.push("TLS listener not bound");
        }
        if self.shutting_down.load(Ordering::Acquire) {
            out.push("shutting down");
        }
        out
    }
}

pub struct AdminState {
    pub readiness: Arc<Readiness>,
    pub metrics: Arc<Metrics>,
    pub certificate: Arc<SwappableCert>,
}

impl Probes for AdminState {
    fn readiness(&self) -> Result<Cow<'static, str>, Cow<'static, str>> {
        match self.readiness.blockers() {
            blockers if blockers.is_empty() => Ok("ok".into()),
            blockers => Err(blockers.join(", ").into()),
        }
    }

    fn metrics(&self) -> Result<String, std::fmt::Error> {
        let expiry = self.certificate.not_after() - time::OffsetDateTime::now_utc();
        self.metrics.set_certificate_expiry(expiry.as_seconds_f64());
        self.metrics.encode()
    }
}

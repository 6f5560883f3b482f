//! Prometheus metrics of the admission server, served on the admin port.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::decision::Outcome;

// The label space is fixed (rule names, operations and outcomes are constants), so the labels are
// `&'static str`: recording a request allocates nothing.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub rule: &'static str,
    pub operation: &'static str,
    pub result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

type HistogramFamily = Family<AdmissionLabels, Histogram, fn() -> Histogram>;

pub struct Metrics {
    registry: Registry,
    duration: HistogramFamily,
    requests: Family<OutcomeLabels, Counter>,
    certificate_expiry: Gauge<f64, AtomicU64>,
}

/// 100 µs to ~3 s: in-memory rules answer in microseconds, the deadline is seconds.
fn duration_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0001, 2.5, 12,
    ))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("holdfast_webhook");
        let duration: HistogramFamily = Family::new_with_constructor(duration_histogram);
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission request, by rule, operation and result",
            duration.clone(),
        );
        // No `_total` suffix: the encoder adds it (and prometheus-client panics if it is given).
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "admission_requests",
            "Admission requests by outcome: allowed, patched, denied, error",
            requests.clone(),
        );
        let certificate_expiry = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "serving_certificate_expiry_seconds",
            "Seconds until the serving certificate expires",
            certificate_expiry.clone(),
        );
        Self {
            registry,
            duration,
            requests,
            certificate_expiry,
        }
    }
}

impl Metrics {
    pub fn observe(&self, rule: &'static str, operation: &'static str, outcome: Outcome, seconds: f64) {
        let labels = AdmissionLabels {
            rule,
            operation,
            result: outcome.as_str(),
        };
        self.duration.get_or_create(&labels).observe(seconds);
        self.count(outcome);
    }

    pub fn count(&self, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }

    pub fn set_certificate_expiry(&self, seconds: f64) {
        self.certificate_expiry.set(seconds);
    }

    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

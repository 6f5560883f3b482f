//! Prometheus metrics of the admission server, served on the admin port.

use std::sync::{Arc, atomic::AtomicU64};

use holdfast_cache::{DigestCache, metrics::CacheCollector};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
    },
    registry::Registry,
};

use crate::{
    cluster::{ClusterView, Peer},
    decision::Outcome,
};

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
    shed: Counter,
    certificate_expiry: Gauge<f64, AtomicU64>,
}

/// 100 µs to 5 s: in-memory rules answer in microseconds, the deadline is seconds. 1 ms and
/// 2 ms are bounds, so the hot-path objective (p99 of a cached pin ≤ 2 ms) reads off directly.
const DURATION_BUCKETS: [f64; 15] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Metrics {
    /// The admission metrics, and the digest cache's figures when there is a cache.
    pub fn new(cache: Option<Arc<DigestCache>>) -> Self {
        let mut registry = Registry::with_prefix("holdfast_webhook");
        if let Some(cache) = cache {
            registry.register_collector(Box::new(CacheCollector(cache)));
        }
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
        // Every outcome at 0 from the start: a family without samples is not exported, and a
        // series that first appears at 1 shows no `increase()`.
        for outcome in [
            Outcome::Allowed,
            Outcome::Patched,
            Outcome::Denied,
            Outcome::Error,
        ] {
            drop(requests.get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            }));
        }
        let shed = Counter::default();
        registry.register(
            "admission_shed",
            "Admission requests answered 503 because the bodies in flight were at --in-flight-bytes for the whole deadline",
            shed.clone(),
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
            shed,
            certificate_expiry,
        }
    }

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

    /// A request refused at the in-flight budget.
    pub fn shed(&self) {
        self.shed.inc();
    }

    pub fn set_certificate_expiry(&self, seconds: f64) {
        self.certificate_expiry.set(seconds);
    }

    /// Also exports which peers' APIs `cluster` serves (`peer_api_served`).
    pub fn with_peers(mut self, cluster: Arc<dyn ClusterView>) -> Self {
        self.registry
            .register_collector(Box::new(PeersCollector(cluster)));
        self
    }

    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        holdfast_runtime::admin::encode(&self.registry)
    }
}

/// Which peers' APIs the webhook's view serves, read at scrape time: a peer installed after the
/// webhook shows here once its store starts (within the look-again interval).
struct PeersCollector(Arc<dyn ClusterView>);

impl std::fmt::Debug for PeersCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeersCollector")
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    group: String,
    kind: String,
}

impl Collector for PeersCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "peer_api_served",
            "1 when the webhook serves the peer's kind (its API was discovered and its watch started), 0 while not: the rules that read it find no such objects",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for peer in Peer::ALL {
            let gvk = peer.gvk();
            let labels = PeerLabels {
                group: gvk.group,
                kind: gvk.kind,
            };
            ConstGauge::new(i64::from(self.0.serves(peer))).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

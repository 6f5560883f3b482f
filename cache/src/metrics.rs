//! The digest cache's figures as Prometheus metrics, for the webhook's and the controller's
//! `/metrics`: a collector registered in the component's registry (whose prefix names it).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::SystemTime,
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};

use crate::DigestCache;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LookupLabels {
    result: &'static str,
}

/// The digest cache's counters, read at scrape time (the cache counts with plain atomics, so
/// the lookup path pays nothing for the metrics).
pub struct CacheCollector(pub Arc<DigestCache>);

impl std::fmt::Debug for CacheCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheCollector")
    }
}

impl Collector for CacheCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.0.stats;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);

        let lookups = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "digest_cache_lookups",
            "Digest cache lookups by result: hit (fresh entry), miss (asked the registry), stale (registry failed, now or within the negative TTL, answered from an older entry), negative (a recent failure remembered)",
            None,
            lookups.metric_type(),
        )?;
        for (result, value) in [
            ("hit", read(&stats.hits)),
            ("miss", read(&stats.misses)),
            ("stale", read(&stats.stale_answers)),
            ("negative", read(&stats.negative_hits)),
        ] {
            ConstCounter::new(value).encode(family.encode_family(&LookupLabels { result })?)?;
        }

        for (name, help, value) in [
            (
                "registry_lookups",
                "Registry resolutions started (one per single-flight, however many callers joined it)",
                &stats.registry_lookups,
            ),
            (
                "registry_backoffs",
                "Stale answers given without asking the registry, which failed the entry's last check within the negative TTL (one attempt per key per TTL while a registry is down)",
                &stats.registry_backoffs,
            ),
            (
                "registry_errors",
                "Registry resolutions that failed (timeouts, refused connections, 429s, 5xx, auth)",
                &stats.registry_errors,
            ),
            (
                "registry_certificate_errors",
                "Registry resolutions that failed because the registry's TLS certificate did not verify (a private CA needs --registry-ca-file)",
                &stats.registry_certificate_errors,
            ),
            (
                "digest_cache_refused",
                "New references answered but not cached: the cache held --cache-max-entries, or this minute's --cache-new-entries-per-minute were used",
                &stats.refused,
            ),
        ] {
            let counter = ConstCounter::new(read(value));
            counter.encode(encoder.encode_descriptor(name, help, None, counter.metric_type())?)?;
        }
        for (name, help, value) in [
            (
                "digest_cache_entries",
                "Entries in the digest cache (one per reference, tag selection and credential scope)",
                self.0.entry_count(),
            ),
            (
                "registry_lookups_in_flight",
                "Registry lookups under way (one per key, however many callers wait; a caller that gives up leaves its lookup to finish)",
                self.0.flights_in_flight(),
            ),
            (
                "digest_cache_failures_remembered",
                "Failed lookups of uncached references remembered for --cache-negative-ttl (at most --cache-max-entries)",
                self.0.negative_count(),
            ),
        ] {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }

        let staleness = self.0.staleness(SystemTime::now());
        let mut family = encoder.encode_descriptor(
            "digest_cache_entries_stale",
            "Entries whose last registry check failed, answering with an older digest until --cache-max-staleness, by registry host",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (registry, count) in &staleness.by_registry {
            ConstGauge::new(i64::try_from(*count).unwrap_or(i64::MAX))
                .encode(family.encode_family(&[("registry", registry.as_str())])?)?;
        }
        for (name, help, value) in [
            (
                "digest_cache_stale_age_max_seconds",
                "Age of the oldest digest served stale (0: none); past --cache-max-staleness its references fail",
                staleness.oldest,
            ),
            (
                "digest_cache_max_staleness_seconds",
                "--cache-max-staleness: how old a digest may get while it is served stale",
                self.0.max_staleness(),
            ),
        ] {
            let gauge = ConstGauge::new(value.as_secs_f64());
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

//! The digest cache over a real [`Resolver`], against registry/tests/support's in-process fake
//! registry (see its module doc for why a fake): what the cache's single-flight does to the
//! resolver's per-host connection budget.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests

#[path = "../../registry/tests/support/mod.rs"]
mod support;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use holdfast_cache::{CacheConfig, CacheKey, DigestCache, Loaded, Scope};
use support::{FakeRegistry, expected_digest, reference, resolver_for};

/// Admissions cut off by their deadline while a registry hangs (the webhook drops the lookup)
/// must not strand the registry's connection budget: once it answers, the next new tag is
/// resolved at once, and every single-flight slot is gone.
#[tokio::test]
async fn lookups_cut_off_while_a_registry_hangs_release_its_budget() {
    let registry = FakeRegistry::start().await;
    let resolver = resolver_for(&registry, |c| {
        c.max_concurrent_per_host = 2;
        c.request_timeout = Duration::from_secs(5);
    });
    let cache = DigestCache::new(Arc::new(resolver), CacheConfig::default(), None);
    let lookup = |path: &str| {
        let target = reference(&registry, path);
        cache.lookup(CacheKey::tag(&target, Scope::Anonymous), target, None, || {
            futures::future::ready(Ok(Loaded::anonymous())).boxed()
        })
    };
    // Two hanging tags take both of the host's slots; their callers give up.
    for tag in ["gated/app:v1", "gated/app:v2"] {
        let cut = tokio::time::timeout(Duration::from_millis(100), lookup(tag)).await;
        assert!(cut.is_err(), "{tag} answered while the registry hangs");
    }
    assert_eq!(cache.flights_in_flight(), 2);
    registry.release();
    let started = Instant::now();
    let answer = lookup("plain/app:v1").await.unwrap();
    assert_eq!(answer.digest, expected_digest("plain/app"));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "waited {:?} for a slot",
        started.elapsed()
    );
    tokio::time::timeout(Duration::from_secs(5), async {
        while cache.flights_in_flight() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the cut-off flights landed");
    assert_eq!(registry.count("/v2/gated/app/manifests/v1"), 1, "asked once");
}

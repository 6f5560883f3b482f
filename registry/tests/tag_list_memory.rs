//! A registry answering maximal tag lists, forever, to many listings at once: the resolver's
//! memory stays within its bounds (one page per listing in flight, at most
//! `max_concurrent_tag_lists` of them, nothing kept of tags that are not versions) and digest
//! lookups of other registries go on. In a test binary of its own, so that its peak RSS is its
//! own.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests

mod support;

use std::{collections::BTreeSet, time::Duration};

use holdfast_registry::{Credentials, Reference, ResolveError, Resolver, ResolverConfig};
use support::FakeRegistry;

fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maximal_tag_lists_from_many_registries_stay_within_the_bounds() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Eight hostile registries (a host each) and one ordinary one.
    let mut hostile = Vec::new();
    for _ in 0..8 {
        hostile.push(FakeRegistry::start().await);
    }
    let ordinary = FakeRegistry::start().await;
    let config = ResolverConfig {
        insecure_registries: hostile
            .iter()
            .chain([&ordinary])
            .map(FakeRegistry::host)
            .collect::<BTreeSet<_>>(),
        // Listings wait for the gate within it: debug builds parse a page in about a second.
        request_timeout: Duration::from_secs(120),
        ..ResolverConfig::default()
    };
    let (page_bytes, total_bytes) = (config.max_tag_list_bytes, config.max_tag_list_total_bytes);
    let resolver = Resolver::new(config).unwrap();
    // The fakes build their one shared page on first use: before the baseline.
    let _ = reqwest::get(format!("http://{}/v2/maximal/app/tags/list", hostile[0].host())).await;
    let baseline = peak_rss_mib();

    let anonymous = Credentials::anonymous();
    let listings = hostile.iter().flat_map(|registry| {
        let resolver = &resolver;
        let anonymous = &anonymous;
        (0..1).map(move |_| async move {
            let repository = Reference::parse(&format!("{}/maximal/app", registry.host())).unwrap();
            resolver.list_tags(&repository, anonymous).await
        })
    });
    let storm = futures::future::join_all(listings);
    let lookups = async {
        let plain = Reference::parse(&format!("{}/plain/app:v1", ordinary.host())).unwrap();
        for _ in 0..20 {
            resolver.resolve_digest(&plain, &anonymous).await.unwrap();
        }
    };
    let (results, ()) = tokio::join!(storm, lookups);

    assert_eq!(results.len(), 8);
    for result in &results {
        assert!(
            matches!(result, Err(ResolveError::Protocol { detail, .. }) if detail.contains("bytes in all")),
            "{result:?}"
        );
    }
    let pages: usize = hostile.iter().map(|r| r.count("/v2/maximal/app/tags/list")).sum();
    assert!(
        // Each listing reads whole pages up to the total, then fails on the one past it; one more
        // request warmed the fakes up.
        pages <= 8 * (total_bytes.div_ceil(page_bytes) + 1) + 1,
        "{pages} pages read: the total bound did not stop the listings"
    );
    let grown = peak_rss_mib() - baseline;
    // Four listings in flight, each holding one 4 MiB page and the buffer it is read into.
    assert!(grown < 96.0, "peak RSS grew by {grown:.1} MiB over {baseline:.1}");
    eprintln!("maximal tag lists: {pages} pages read, peak RSS +{grown:.1} MiB over {baseline:.1} MiB");
}

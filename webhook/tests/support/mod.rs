//! Shared fixtures of the webhook's integration tests.

use std::sync::Arc;

use holdfast_cache::{CacheConfig, DigestCache, testing::FakeSource};
use holdfast_webhook::{cluster::ClusterView, rules::RuleContext};

pub fn context(cluster: impl ClusterView + 'static, registry: FakeSource) -> RuleContext {
    let cache = DigestCache::new(Arc::new(registry), CacheConfig::default(), None);
    RuleContext::new(Arc::new(cluster), Arc::new(cache), Default::default(), None)
}

//! Shared fixtures of the webhook's integration tests.

use std::{collections::HashMap, sync::Arc};

use futures::{FutureExt, future::BoxFuture};
use holdfast_registry::{
    Credentials, Digest, Reference, ResolveError,
    cache::{CacheConfig, DigestCache, Source},
};
use holdfast_webhook::{cluster::ClusterView, rules::RuleContext};

/// A registry stand-in answering fixed digests by normalised reference; unknown tags time out.
#[derive(Default)]
pub struct FixedRegistry {
    pub digests: HashMap<String, Digest>,
    pub tags: Vec<String>,
    /// A slow registry: each digest lookup takes this long.
    pub latency: std::time::Duration,
    /// Notified when a digest lookup starts (a request is in flight).
    pub asked: Option<Arc<tokio::sync::Notify>>,
}

impl Source for FixedRegistry {
    fn digest<'a>(
        &'a self,
        reference: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Digest, ResolveError>> {
        let found = self
            .digests
            .get(&reference.normalized())
            .cloned()
            .ok_or_else(|| ResolveError::Timeout {
                registry: reference.registry().into(),
                repository: reference.repository(),
                after: std::time::Duration::from_secs(2),
            });
        if let Some(asked) = &self.asked {
            asked.notify_one();
        }
        let latency = self.latency;
        async move {
            tokio::time::sleep(latency).await;
            found
        }
        .boxed()
    }

    fn tags<'a>(
        &'a self,
        _: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Vec<String>, ResolveError>> {
        futures::future::ready(Ok(self.tags.clone())).boxed()
    }
}

pub fn context(cluster: impl ClusterView + 'static, registry: FixedRegistry) -> RuleContext {
    let cache = DigestCache::new(Arc::new(registry), CacheConfig::default(), None);
    RuleContext::new(Arc::new(cluster), Arc::new(cache), Default::default(), None)
}

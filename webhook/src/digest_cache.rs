//! The webhook's digest cache: the entries the controller persisted, followed from holdfast's
//! namespace, plus what this replica resolved itself, in memory only. The webhook writes no
//! `DigestCacheEntry`: anyone who reaches its port can send a review, so nothing a review names
//! may become an object in etcd, nor an entry whose Secret the controller would then read. Dry
//! runs therefore write nothing either, as every other review.

use std::sync::Arc;

use holdfast_cache::{CacheConfig, DigestCache, cluster_store};
use holdfast_registry::Resolver;
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The cache, and a receiver that turns `true` once the persisted entries are loaded.
pub fn follow(
    client: Client,
    namespace: &str,
    resolver: Resolver,
    config: CacheConfig,
    cancel: CancellationToken,
) -> (Arc<DigestCache>, watch::Receiver<bool>) {
    let cache = Arc::new(DigestCache::new(Arc::new(resolver), config, None));
    let synced = cluster_store::follow(cluster_store::api(client, namespace), cache.clone(), cancel);
    (cache, synced)
}

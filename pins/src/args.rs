//! Registry and digest-cache flags, shared by `holdfast-webhook` and `holdfast-controller`.

use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// Registries reached over plain HTTP (host[:port]); every other registry is HTTPS only.
    #[arg(
        long = "insecure-registry",
        env = "HOLDFAST_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    pub insecure_registries: Vec<String>,
    /// Per-request registry timeout.
    #[arg(long, env = "HOLDFAST_REGISTRY_TIMEOUT_MS", default_value_t = 2000)]
    pub registry_timeout_ms: u64,
    /// Answer from the digest cache without asking the registry while an entry is younger than this.
    #[arg(long, env = "HOLDFAST_CACHE_MAX_AGE_SECONDS", default_value_t = 600)]
    pub cache_max_age_seconds: u64,
    /// When the registry fails, keep pinning from a cache entry up to this old.
    #[arg(long, env = "HOLDFAST_CACHE_MAX_STALENESS_SECONDS", default_value_t = 7 * 24 * 3600)]
    pub cache_max_staleness_seconds: u64,
    /// How long a failed lookup of an uncached reference is remembered.
    #[arg(long, env = "HOLDFAST_CACHE_NEGATIVE_TTL_SECONDS", default_value_t = 10)]
    pub cache_negative_ttl_seconds: u64,
}

impl RegistryArgs {
    pub fn cache_config(&self) -> holdfast_registry::cache::CacheConfig {
        holdfast_registry::cache::CacheConfig {
            max_age: Duration::from_secs(self.cache_max_age_seconds),
            max_staleness: Duration::from_secs(self.cache_max_staleness_seconds),
            negative_ttl: Duration::from_secs(self.cache_negative_ttl_seconds),
        }
    }

    pub fn resolver_config(&self) -> holdfast_registry::ResolverConfig {
        holdfast_registry::ResolverConfig {
            request_timeout: Duration::from_millis(self.registry_timeout_ms),
            insecure_registries: self.insecure_registries.iter().cloned().collect(),
            ..Default::default()
        }
    }
}

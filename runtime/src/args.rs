//! Registry and digest-cache flags, shared by `holdfast-webhook` and `holdfast-controller`.

use std::{path::PathBuf, time::Duration};

use holdfast_registry::mirror::{MirrorLocation, NamingError};

use holdfast_pins::mirror_scope::{MirrorPins, NamespaceSelector, SelectorError};
use tokio_util::sync::CancellationToken;

use crate::registry_ca::{self, RegistryCaError};

#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// Registries reached over plain HTTP (host[:port]); every other registry is HTTPS only.
    #[arg(
        long = "insecure-registry",
        env = "HOLDFAST_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    pub insecure_registries: Vec<String>,
    /// PEM file of CA certificates to trust for registries besides the system's (a private CA,
    /// e.g. a mounted ConfigMap); re-read when its contents change. Proxies come from
    /// HTTPS_PROXY / HTTP_PROXY / NO_PROXY in the environment.
    #[arg(long, env = "HOLDFAST_REGISTRY_CA_FILE")]
    pub registry_ca_file: Option<PathBuf>,
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
    /// At most this many digest cache entries are held; a new reference past it is pinned but
    /// not cached (memory in the webhook, etcd objects in the controller).
    #[arg(long, env = "HOLDFAST_CACHE_MAX_ENTRIES", default_value_t = 10_000)]
    pub cache_max_entries: usize,
    /// At most this many new digest cache entries per minute (past it, as past the cap).
    #[arg(long, env = "HOLDFAST_CACHE_NEW_ENTRIES_PER_MINUTE", default_value_t = 600)]
    pub cache_new_entries_per_minute: u32,
    /// The cache registry (a host, or host:port) that content is mirrored into; mirroring is off
    /// without one. Set the same value on the webhook and the controller: references whose
    /// content the controller copied are pinned to the mirror. Plain HTTP only if also an
    /// --insecure-registry.
    #[arg(long, env = "HOLDFAST_MIRROR_REGISTRY")]
    pub mirror_registry: Option<String>,
    /// Repository prefix in the mirror: content goes to
    /// MIRROR/PREFIX/SOURCE-HOST/SOURCE-REPOSITORY.
    #[arg(long, env = "HOLDFAST_MIRROR_PREFIX", default_value = "holdfast")]
    pub mirror_prefix: String,
    /// Pin to the mirror only objects in namespaces whose labels match this selector
    /// (kubectl's -l syntax, e.g. holdfast.dev/mirror=true); empty: every namespace. Objects
    /// elsewhere stay pinned upstream.
    #[arg(long, env = "HOLDFAST_MIRROR_NAMESPACE_SELECTOR", default_value = "")]
    pub mirror_namespace_selector: String,
    /// Secret, in every selected namespace, with credentials that pull from the mirror. With it,
    /// references with a secretRef are mirrored too (into the namespace's own mirror path) and
    /// their secretRef is rewritten to name this Secret; without it they stay pinned upstream.
    #[arg(long, env = "HOLDFAST_MIRROR_PULL_SECRET")]
    pub mirror_pull_secret: Option<String>,
}

/// Why the mirror flags are not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MirrorArgsError {
    #[error("--mirror-registry / --mirror-prefix: {0}")]
    Location(#[from] NamingError),
    #[error("--mirror-namespace-selector: {0}")]
    Selector(#[from] SelectorError),
}

impl RegistryArgs {
    /// The mirror, when one is configured.
    pub fn mirror(&self) -> Result<Option<MirrorPins>, MirrorArgsError> {
        let Some(registry) = self.mirror_registry.as_deref() else {
            return Ok(None);
        };
        Ok(Some(MirrorPins {
            location: MirrorLocation::new(registry, &self.mirror_prefix)?,
            namespaces: self.mirror_namespace_selector.parse::<NamespaceSelector>()?,
            pull_secret: self.mirror_pull_secret.clone().filter(|s| !s.is_empty()),
        }))
    }

    pub fn cache_config(&self) -> holdfast_cache::CacheConfig {
        holdfast_cache::CacheConfig {
            max_age: Duration::from_secs(self.cache_max_age_seconds),
            max_staleness: Duration::from_secs(self.cache_max_staleness_seconds),
            negative_ttl: Duration::from_secs(self.cache_negative_ttl_seconds),
            max_entries: self.cache_max_entries,
            new_entries_per_minute: self.cache_new_entries_per_minute,
        }
    }

    /// The resolver's settings, with the roots of `--registry-ca-file`, whose changes are
    /// followed until `cancel`.
    pub fn resolver_config(
        &self,
        cancel: &CancellationToken,
    ) -> Result<holdfast_registry::ResolverConfig, RegistryCaError> {
        let mut config = holdfast_registry::ResolverConfig {
            request_timeout: Duration::from_millis(self.registry_timeout_ms),
            insecure_registries: self.insecure_registries.iter().cloned().collect(),
            ..Default::default()
        };
        if let Some(path) = &self.registry_ca_file {
            let (roots, loaded) = registry_ca::load(path)?;
            tracing::info!(path = %path.display(), "trusting the registry CA bundle");
            registry_ca::watch(
                path.clone(),
                roots.clone(),
                loaded,
                registry_ca::POLL_INTERVAL,
                cancel.clone(),
            );
            config.extra_roots = roots;
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        registry: RegistryArgs,
    }

    #[test]
    fn the_mirror_is_off_by_default_and_checked_when_set() {
        let off = Flags::try_parse_from(["x"]).unwrap();
        assert_eq!(off.registry.mirror().unwrap(), None);
        let on = Flags::try_parse_from([
            "x",
            "--mirror-registry",
            "cache.corp.com:5000",
            "--mirror-prefix",
            "/m/",
        ])
        .unwrap();
        let mirror = on.registry.mirror().unwrap().unwrap();
        let location = &mirror.location;
        assert_eq!(
            (location.registry(), location.prefix()),
            ("cache.corp.com:5000", "m")
        );
        assert!(mirror.namespaces.selects_all() && mirror.pull_secret.is_none());
        let bad = Flags::try_parse_from(["x", "--mirror-registry", "no-dot-or-port"]).unwrap();
        assert!(matches!(bad.registry.mirror(), Err(MirrorArgsError::Location(_))));
    }

    #[test]
    fn namespaces_and_the_pull_secret_are_read_with_the_mirror() {
        let on = Flags::try_parse_from([
            "x",
            "--mirror-registry",
            "cache.corp.com",
            "--mirror-namespace-selector",
            "holdfast.dev/mirror=true",
            "--mirror-pull-secret",
            "mirror-pull",
        ])
        .unwrap();
        let mirror = on.registry.mirror().unwrap().unwrap();
        assert_eq!(mirror.namespaces.to_string(), "holdfast.dev/mirror=true");
        assert!(!mirror.selects(&Default::default()));
        assert_eq!(mirror.pull_secret.as_deref(), Some("mirror-pull"));
        let bad = Flags::try_parse_from([
            "x",
            "--mirror-registry",
            "cache.corp.com",
            "--mirror-namespace-selector",
            "tier in prod",
        ])
        .unwrap();
        assert!(matches!(bad.registry.mirror(), Err(MirrorArgsError::Selector(_))));
    }
}

//! `kubectl holdfast pin -f FILE`: the file, printed with the Carvel fetch references of its
//! Apps, PackageRepositories and Packages resolved to digests, as the webhook would pin them
//! (with `holdfast.dev/original-refs`). From the cluster's digest cache when a kubeconfig is
//! found (nothing reaches a registry), from the registries otherwise (anonymously: a reference
//! that needs its `secretRef` is left as it is, with a warning). Other documents pass through.
//! Exits 1 when a reference was left unpinned.

use std::{collections::BTreeMap, io::Read as _, sync::Arc, time::Duration};

use anyhow::{Context, Result, bail};
use futures::future::BoxFuture;
use holdfast_cache::{CacheConfig, DigestCache, Source, cluster_store};
use holdfast_pins::{PinnedKind, Pinner, SecretScoped};
use holdfast_registry::{Credentials, Digest, Reference, ResolveError, Resolver, ResolverConfig};
use serde::Deserialize as _;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::{
    Outcome,
    args::{Global, Pin},
    cluster::Cluster,
};

/// How long the cluster's entries answer, whatever their age: the controller keeps them fresh.
const FROM_CLUSTER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

pub async fn run(global: &Global, args: &Pin) -> Result<Outcome> {
    let text = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        text
    } else {
        std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).context("the file is not YAML")?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    let cluster = match (args.registry, Cluster::connect(global).await) {
        (true, _) => None,
        (false, Ok(cluster)) => Some(cluster),
        (false, Err(error)) if args.cluster => return Err(error),
        (false, Err(_)) => None,
    };
    let cache = match &cluster {
        Some(cluster) => from_cluster(cluster).await?,
        None => {
            let mut config = ResolverConfig::default();
            config
                .insecure_registries
                .extend(args.insecure_registries.iter().cloned());
            Arc::new(DigestCache::new(
                Arc::new(Resolver::new(config)?),
                CacheConfig::default(),
                None,
            ))
        }
    };
    let pinner = Pinner::new(cache, None);
    let mut unpinned = 0;
    let mut out = Vec::new();
    for mut document in documents {
        if let Some(kind) = pinned_kind(&document) {
            let namespace = document
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or(&args.namespace)
                .to_owned();
            let outcome = pinner
                .pin(
                    kind,
                    &namespace,
                    &BTreeMap::new(),
                    SecretScoped::Any,
                    &document,
                    None,
                )
                .await;
            json_patch::patch(&mut document, &outcome.ops).context("applying the pins")?;
            let name = document
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            for warning in &outcome.warnings {
                eprintln!("warning: {} {name}: {warning}", kind.kind());
            }
            unpinned += outcome.unresolved;
        }
        out.push(serde_yaml::to_string(&document)?);
    }
    print!("{}", out.join("---\n"));
    Ok(if unpinned > 0 {
        Outcome::NeedsAttention
    } else {
        Outcome::Fine
    })
}

/// The kind of a document holdfast pins, by its apiVersion and kind.
fn pinned_kind(document: &Value) -> Option<PinnedKind> {
    let api_version = document.get("apiVersion")?.as_str()?;
    let kind = document.get("kind")?.as_str()?;
    PinnedKind::ALL
        .into_iter()
        .find(|k| k.kind() == kind && api_version.split('/').next() == Some(k.group()))
}

/// A cache of the cluster's entries only: a reference it does not hold is not resolved.
async fn from_cluster(cluster: &Cluster) -> Result<Arc<DigestCache>> {
    let config = CacheConfig {
        max_age: FROM_CLUSTER,
        ..CacheConfig::default()
    };
    let cache = Arc::new(DigestCache::new(Arc::new(NotCached), config, None));
    let cancel = CancellationToken::new();
    let mut synced = cluster_store::follow(cluster.entries_api(), cache.clone(), cancel.clone());
    let loaded = tokio::time::timeout(Duration::from_secs(30), synced.wait_for(|s| *s)).await;
    cancel.cancel();
    match loaded {
        Ok(Ok(_)) => Ok(cache),
        _ => bail!(
            "could not read the DigestCacheEntry objects in {} (use --registry to resolve through the registries)",
            cluster.holdfast_namespace
        ),
    }
}

/// The source behind the cluster's entries: never a registry.
struct NotCached;

impl NotCached {
    fn error(reference: &Reference) -> ResolveError {
        ResolveError::Transport {
            registry: reference.registry().to_owned(),
            repository: reference.repository(),
            detail: "not in the cluster's digest cache (no object there names it); use --registry to ask the registry".to_owned(),
        }
    }
}

impl Source for NotCached {
    fn digest<'a>(
        &'a self,
        reference: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Digest, ResolveError>> {
        Box::pin(async move { Err(Self::error(reference)) })
    }

    fn tags<'a>(
        &'a self,
        repository: &'a Reference,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<Vec<String>, ResolveError>> {
        Box::pin(async move { Err(Self::error(repository)) })
    }

    fn confirm<'a>(
        &'a self,
        reference: &'a Reference,
        _: &'a Digest,
        _: &'a Credentials,
    ) -> BoxFuture<'a, Result<(), ResolveError>> {
        Box::pin(async move { Err(Self::error(reference)) })
    }
}

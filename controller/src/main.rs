//! `holdfast-controller`: wiring only — flags, logs, the digest cache, the reconcilers, signals.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use holdfast_pins::{Pinner, args::RegistryArgs};
use holdfast_registry::{
    Resolver,
    cache::DigestCache,
    cluster_store::{self, ClusterSink},
};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(name = "holdfast-controller", version, about = "holdfast's reconcilers")]
struct Args {
    /// holdfast's own namespace (where the digest cache lives).
    #[arg(long, env = "POD_NAMESPACE", default_value = "holdfast-system")]
    namespace: String,
    /// Seconds between refresh rounds (one registry check per unique tag per round).
    #[arg(long, env = "HOLDFAST_REFRESH_SECONDS", default_value_t = 300)]
    refresh_seconds: u64,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[tokio::main]
async fn main() -> Result<()> {
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow!("a rustls crypto provider was already installed"))?;
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let mut terminate = signal(SignalKind::terminate())?;
    let cancel = CancellationToken::new();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;

    let resolver = Resolver::new(args.registry.resolver_config()).context("building the registry client")?;
    let entries = cluster_store::api(client.clone(), &args.namespace);
    let sink = ClusterSink::start(entries.clone(), cancel.clone());
    let cache = Arc::new(DigestCache::new(
        Arc::new(resolver),
        args.registry.cache_config(),
        Some(sink),
    ));
    let mut synced = cluster_store::follow(entries, cache.clone(), cancel.clone());
    let _ = synced.wait_for(|s| *s).await;
    let secrets = args.registry.read_secrets.then(|| client.clone());
    let pinner = Arc::new(Pinner::new(cache, secrets));

    let (rounds_tx, rounds) = tokio::sync::watch::channel(0);
    let refresher = {
        let (pinner, cancel) = (pinner.clone(), cancel.clone());
        let interval = Duration::from_secs(args.refresh_seconds);
        tokio::spawn(async move {
            holdfast_controller::refresher::run(&pinner, interval, rounds_tx, cancel).await
        })
    };
    let controllers = tokio::spawn(holdfast_controller::pinning::run(
        client.clone(),
        pinner,
        rounds,
        cancel.clone(),
    ));
    let finalizer = tokio::spawn(holdfast_controller::finalizer::run(client, cancel.clone()));

    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    cancel.cancel();
    let _ = tokio::join!(refresher, controllers, finalizer);
    Ok(())
}

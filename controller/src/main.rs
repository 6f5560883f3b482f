//! `holdfast-controller`: wiring only — flags, logs, the digest cache, the reconcilers, signals.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, anyhow};
use clap::Parser;
use holdfast_controller::leader::Election;
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
    /// The Lease replicas compete for; only its holder reconciles.
    #[arg(long, env = "HOLDFAST_LEASE_NAME", default_value = "holdfast-controller")]
    lease_name: String,
    /// This replica's identity in the Lease (the pod name).
    #[arg(long, env = "POD_NAME", default_value = "holdfast-controller")]
    identity: String,
    /// Read the Secret an object's `secretRef` names (on a cache miss or refresh only) to resolve
    /// private references. Only the controller does: it reads objects from the API server,
    /// while the webhook's callers are not authenticated (SECURITY.md).
    #[arg(long, env = "HOLDFAST_READ_SECRETS", default_value_t = true, action = clap::ArgAction::Set)]
    read_secrets: bool,
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
    let secrets = args.read_secrets.then(|| client.clone());
    let pinner = Arc::new(Pinner::new(cache, secrets));

    let interval = Duration::from_secs(args.refresh_seconds);
    let namespace = args.namespace.clone();
    // Everything that writes runs only on the leader.
    let work = move |leading: CancellationToken| async move {
        let (rounds_tx, rounds) = tokio::sync::watch::channel(0);
        let refresher = {
            let (pinner, leading) = (pinner.clone(), leading.clone());
            async move { holdfast_controller::refresher::run(&pinner, interval, rounds_tx, leading).await }
        };
        let pinning =
            holdfast_controller::pinning::run(client.clone(), namespace, pinner, rounds, leading.clone());
        let finalizer = holdfast_controller::finalizer::run(client, leading);
        tokio::join!(refresher, pinning, finalizer);
    };
    let election = Election {
        namespace: args.namespace.clone(),
        lease: args.lease_name.clone(),
        identity: args.identity.clone(),
        duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(5),
    };
    let election_client = kube::Client::try_default().await?;
    let stop = cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        stop.cancel();
    });
    election
        .lead(election_client, cancel, work)
        .await
        .context("leader election")?;
    Ok(())
}

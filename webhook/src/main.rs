//! `holdfast-webhook`: wiring only — flags, logs, certificates, cluster view, server, signals.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result};
use holdfast_certs::{
    CaOptions, FileWatcher, ServingOptions, SwappableCert,
    kube_store::{KubeCertStore, StoreConfig},
    load_pair,
};
use holdfast_registry::Resolver;
use holdfast_webhook::{
    cli::Args,
    cluster::Cluster,
    digest_cache,
    rules::{RuleContext, policy::Policy},
    server::{self, Settings},
};
use tokio_util::sync::CancellationToken;

/// mimalloc, not the system allocator: glibc's per-thread arenas kept what a cluster-wide list
/// allocated (BENCHMARKS.md, bench-scale), and the image's musl malloc is slow under threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> Result<()> {
    let args = holdfast_runtime::start(|args: &Args| args.log_format)?;
    // Pins to the mirror's copies the controller recorded (the controller does the copying).
    let mirror = args.registry.mirror()?;
    let terminated = holdfast_runtime::terminated()?;
    let cancel = CancellationToken::new();
    let client = holdfast_runtime::kube_client("holdfast-webhook", None)
        .await
        .context("connecting to the Kubernetes API")?;
    if args.remove_webhook_configurations {
        let tls = &args.tls;
        let deleted = holdfast_webhook::uninstall::remove_configurations(
            client,
            &tls.mutating_webhook_configurations,
            &tls.validating_webhook_configurations,
        )
        .await
        .context("deleting the webhook configurations")?;
        tracing::info!(deleted, "webhook configurations removed");
        return Ok(());
    }

    let certificate = certificate(&args, client.clone(), cancel.clone()).await?;
    let cluster = Cluster::start(client.clone(), holdfast_peers::LOOK_AGAIN_EVERY, cancel.clone()).await;
    let resolver =
        Resolver::new(args.registry.resolver_config(&cancel)?).context("building the registry client")?;
    let (cache, mut cache_synced) = digest_cache::follow(
        client.clone(),
        &args.tls.namespace,
        resolver,
        args.registry.cache_config(),
        cancel.clone(),
    );
    let policy = match &args.policy_file {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            Policy::from_yaml(&text).with_context(|| format!("parsing the policy file {}", path.display()))?
        }
        None => Policy::default(),
    };
    let context = RuleContext::new(Arc::new(cluster.clone()), cache, policy, mirror);
    let synced = async move {
        cluster.synced().await;
        let _ = cache_synced.wait_for(|synced| *synced).await;
    };
    let settings = Settings {
        addr: args.addr,
        admin_addr: args.admin_addr,
        deadline: args.deadline(),
        limits: holdfast_webhook::handler::Limits {
            body_bytes: args.body_limit_bytes,
            in_flight_bytes: args.in_flight_bytes,
        },
        handshake_timeout: Duration::from_secs(5),
    };
    let running = server::start(settings, context, synced, certificate).await?;

    let signal = terminated.await;
    tracing::info!("{signal}: draining");
    running
        .shutdown(
            Duration::from_secs(args.shutdown_delay_seconds),
            Duration::from_secs(args.drain_seconds),
        )
        .await;
    cancel.cancel();
    Ok(())
}

/// File mode when certificate files are given, else the self-managed Secret.
async fn certificate(
    args: &Args,
    client: kube::Client,
    cancel: CancellationToken,
) -> Result<Arc<SwappableCert>> {
    let tls = &args.tls;
    if let (Some(cert), Some(key)) = (&tls.tls_cert_file, &tls.tls_key_file) {
        let pair = load_pair(cert, key)
            .await
            .context("loading the serving certificate")?;
        let resolver = Arc::new(SwappableCert::new(&pair)?);
        FileWatcher::new(cert, key)
            .with_interval(Duration::from_secs(tls.tls_poll_seconds))
            .spawn(resolver.clone(), cancel);
        return Ok(resolver);
    }
    let serving = tls.tls_ips.iter().fold(
        ServingOptions::for_service(&tls.service_name, &tls.namespace),
        |opts, ip| opts.with_ip(*ip),
    );
    let config = StoreConfig {
        namespace: tls.namespace.clone(),
        secret: tls.tls_secret.clone(),
        ca: CaOptions::default(),
        serving,
        renew_at_fraction: holdfast_certs::DEFAULT_RENEW_AT_FRACTION,
        ca_overlap: Duration::from_secs(tls.ca_overlap_seconds),
        mutating_webhook_configurations: tls.mutating_webhook_configurations.clone(),
        validating_webhook_configurations: tls.validating_webhook_configurations.clone(),
    };
    let store = Arc::new(
        KubeCertStore::bootstrap(client, config)
            .await
            .context("setting up certificates")?,
    );
    let resolver = store.resolver();
    tokio::spawn(store.run(Duration::from_secs(tls.cert_recheck_seconds), cancel));
    Ok(resolver)
}

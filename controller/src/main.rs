//! `holdfast-controller`: wiring only — flags, logs, the digest cache, the reconcilers, signals.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use clap::Parser;
use holdfast_controller::{admin, metrics::Metrics, mirror::MirrorSettings, run::Settings};
use holdfast_runtime::{args::RegistryArgs, logs::LogFormat};
use tokio_util::sync::CancellationToken;

/// mimalloc, not the system allocator: glibc's per-thread arenas kept what a cluster-wide list
/// allocated (BENCHMARKS.md, bench-scale), and the image's musl malloc is slow under threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(name = "holdfast-controller", version, about = "holdfast's reconcilers")]
struct Args {
    /// holdfast's own namespace (where the digest cache lives).
    #[arg(long, env = "POD_NAMESPACE", default_value = "holdfast-system")]
    namespace: String,
    /// Seconds between refresh rounds (one registry check per unique tag per round).
    #[arg(long, env = "HOLDFAST_REFRESH_SECONDS", default_value_t = 600)]
    refresh_seconds: u64,
    /// The ControllerLease replicas compete for; only its holder reconciles. The term fence's
    /// binding (`manifests/base/controller/term-fence.yaml`) names it too: change both together.
    #[arg(long, env = "HOLDFAST_LEASE_NAME", default_value = holdfast_controller::leader::LEASE)]
    lease_name: String,
    /// This replica's identity in the ControllerLease (the pod name).
    #[arg(long, env = "POD_NAME", default_value = "holdfast-controller")]
    identity: String,
    /// Read the Secret an object's `secretRef` names (on a cache miss or refresh only) to resolve
    /// private references. Only the controller does: it reads objects from the API server,
    /// while the webhook's callers are not authenticated (SECURITY.md).
    #[arg(long, env = "HOLDFAST_READ_SECRETS", default_value_t = true, action = clap::ArgAction::Set)]
    read_secrets: bool,
    /// Seconds a digest cache entry that no App, PackageRepository or Package names is kept
    /// before the refresher deletes it.
    #[arg(long, env = "HOLDFAST_CACHE_GC_GRACE_SECONDS", default_value_t = 3600)]
    cache_gc_grace_seconds: u64,
    /// When an org namespace starts deleting, delete the Korifi CFSpaces in it at once instead of
    /// at the namespace controller's first pass (5 s later). Needs the `delete cfspaces` RBAC of
    /// components/fast-org-deletion.
    #[arg(long, env = "HOLDFAST_DELETE_ORG_SPACES", default_value_t = false, action = clap::ArgAction::Set)]
    delete_org_spaces: bool,
    /// Secret in holdfast's namespace with the credentials for the mirror (--mirror-registry):
    /// kubernetes.io/dockerconfigjson, or username/password. Without one the mirror is used
    /// anonymously.
    #[arg(long, env = "HOLDFAST_MIRROR_SECRET")]
    mirror_secret: Option<String>,
    /// Source registries (a host, or host:port) whose content is mirrored; all when none is given.
    #[arg(
        long = "mirror-source-registry",
        env = "HOLDFAST_MIRROR_SOURCE_REGISTRIES",
        value_delimiter = ','
    )]
    mirror_source_registries: Vec<String>,
    /// Copies into the mirror running at the same time.
    #[arg(long, env = "HOLDFAST_MIRROR_CONCURRENCY", default_value_t = 2)]
    mirror_concurrency: usize,
    /// Seconds a mirror copy that no App, PackageRepository or Package references stays in the
    /// mirror before the controller deletes it (the mirror must allow deletes).
    #[arg(long, env = "HOLDFAST_MIRROR_RETENTION_SECONDS", default_value_t = 86_400)]
    mirror_retention_seconds: u64,
    /// Publish the digest cache as the parameters of the pinning policies (ClusterDigestPins,
    /// DigestPins), so the API server pins cached tags without calling the webhook.
    #[arg(long, env = "HOLDFAST_PUBLISH_PINS", default_value_t = true, action = clap::ArgAction::Set)]
    publish_pins: bool,
    /// Address of the plain-HTTP admin port (/healthz, /readyz, /metrics).
    #[arg(long, env = "HOLDFAST_ADMIN_ADDR", default_value = "0.0.0.0:8081")]
    admin_addr: SocketAddr,
    /// Log lines: plain text, or one JSON object per line (as the webhook's).
    #[arg(long, env = "HOLDFAST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    log_format: LogFormat,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = holdfast_runtime::start(|args: &Args| args.log_format)?;
    let terminated = holdfast_runtime::terminated()?;
    let cancel = CancellationToken::new();
    let client = holdfast_runtime::kube_client("holdfast-controller", Some(&args.identity))
        .await
        .context("connecting to the Kubernetes API")?;

    let mirror = args.registry.mirror()?.map(|pins| MirrorSettings {
        location: pins.location,
        namespaces: pins.namespaces,
        pull_secret: pins.pull_secret,
        registries: args.mirror_source_registries.clone(),
        secret: args.mirror_secret.clone(),
        concurrency: args.mirror_concurrency,
        retention: Duration::from_secs(args.mirror_retention_seconds),
    });
    if let Some(mirror) = &mirror {
        tracing::info!(
            mirror = mirror.location.registry(),
            prefix = mirror.location.prefix(),
            sources = ?mirror.registries,
            namespaces = %mirror.namespaces,
            pull_secret = ?mirror.pull_secret,
            retention = ?mirror.retention,
            "mirroring pinned content"
        );
    }
    let settings = Settings {
        namespace: args.namespace,
        refresh: Duration::from_secs(args.refresh_seconds),
        lease: args.lease_name,
        identity: args.identity,
        lease_duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(5),
        renew_deadline: Duration::from_secs(10),
        read_secrets: args.read_secrets,
        cache_gc_grace: Duration::from_secs(args.cache_gc_grace_seconds),
        finalizer: holdfast_controller::finalizer::Options {
            delete_org_spaces: args.delete_org_spaces,
        },
        resolver: args.registry.resolver_config(&cancel)?,
        cache: args.registry.cache_config(),
        publish_pins: args.publish_pins,
        look_again_every: holdfast_peers::LOOK_AGAIN_EVERY,
    };
    let stop = cancel.clone();
    tokio::spawn(async move {
        let signal = terminated.await;
        tracing::info!("{signal}: stopping");
        stop.cancel();
    });
    let (metrics, health) = (Arc::new(Metrics::new()), Arc::new(admin::Health::default()));
    let admin_cancel = CancellationToken::new();
    let (_, admin) = admin::serve(
        args.admin_addr,
        health.clone(),
        metrics.clone(),
        admin_cancel.clone(),
    )
    .await?;
    let result =
        holdfast_controller::run::run_observed(client, settings, mirror, metrics, health, cancel).await;
    admin_cancel.cancel();
    let _ = admin.await;
    result?;
    Ok(())
}

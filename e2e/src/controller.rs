//! holdfast's pinning controller run in-process against the local control plane, as
//! `holdfast-controller` wires it: a resolver for the test registries, the digest cache persisted
//! in its own namespace, Secrets read for `secretRef`s; optionally the mirror copier.

use std::{sync::Arc, time::Duration};

use anyhow::Result;
use holdfast_controller::{mirror::MirrorSettings, refresher::Refresher, watched::Watched};
use holdfast_pins::Pinner;
use holdfast_registry::{
    Resolver, ResolverConfig,
    cache::{CacheConfig, DigestCache},
    cluster_store::{self, ClusterSink},
};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::{sync::watch, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::{Env, control_plane::unique_name};

/// The whole controller's settings as the e2e suites run it in `namespace`: a lease of 15 s
/// renewed every second (deadline 10 s) under a unique identity starting with `identity`, no
/// refresh round within a test, Secrets read, plain HTTP to the shared registry.
pub fn settings(env: &Env, namespace: &str, identity: &str) -> holdfast_controller::run::Settings {
    holdfast_controller::run::Settings {
        namespace: namespace.into(),
        refresh: Duration::from_secs(3600),
        lease: "holdfast-controller".into(),
        identity: unique_name(identity),
        lease_duration: Duration::from_secs(15),
        renew_every: Duration::from_secs(1),
        renew_deadline: Duration::from_secs(10),
        read_secrets: true,
        cache_gc_grace: Duration::from_secs(3600),
        finalizer: Default::default(),
        resolver: ResolverConfig {
            insecure_registries: [env.registry().to_string()].into(),
            ..Default::default()
        },
        cache: CacheConfig::default(),
    }
}

pub struct LocalController {
    /// Where its digest cache entries live.
    pub namespace: String,
    pub pinner: Arc<Pinner>,
    refresher: tokio::sync::Mutex<Refresher>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl LocalController {
    /// Starts the pinning reconcilers with `client`'s identity (the admin's unless the caller
    /// built another), trusting plain HTTP to the shared registry and `insecure_registries`,
    /// with a digest cache of its own.
    pub async fn start(env: &Env, client: Client, insecure_registries: &[String]) -> Result<Self> {
        let namespace = unique_name("holdfast-system");
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await?;
        Self::start_in(env, client, namespace, insecure_registries).await
    }

    /// [`start`](Self::start) sharing the digest cache kept in `namespace` (e.g. a
    /// [`LocalWebhook`](crate::webhook::LocalWebhook)'s), as the deployed components do.
    pub async fn start_in(
        env: &Env,
        client: Client,
        namespace: String,
        insecure_registries: &[String],
    ) -> Result<Self> {
        Self::start_mirroring(env, client, namespace, insecure_registries, None).await
    }

    /// [`start_in`](Self::start_in), with the mirror copier when `mirror` is set (as
    /// `holdfast-controller --mirror-registry` runs it): copies recorded on the cache entries,
    /// every object reconciled after each copy, pins to the copies.
    pub async fn start_mirroring(
        env: &Env,
        client: Client,
        namespace: String,
        insecure_registries: &[String],
        mirror: Option<MirrorSettings>,
    ) -> Result<Self> {
        let cancel = CancellationToken::new();
        let resolver_config = ResolverConfig {
            insecure_registries: insecure_registries
                .iter()
                .cloned()
                .chain([env.registry().to_string()])
                .collect(),
            ..Default::default()
        };
        let resolver = Resolver::new(resolver_config.clone())?;
        let entries = cluster_store::api(client.clone(), &namespace);
        let sink = ClusterSink::start(entries.clone(), cancel.clone());
        let cache = Arc::new(DigestCache::new(
            Arc::new(resolver),
            CacheConfig::default(),
            Some(sink),
        ));
        let mut synced = cluster_store::follow(entries, cache.clone(), cancel.clone());
        let _ = synced.wait_for(|s| *s).await;
        let mut pinner = Pinner::new(cache, Some(Arc::new(client.clone())))
            .with_mirror(mirror.as_ref().map(MirrorSettings::pins));
        if let Some(mirror) = &mirror {
            pinner = pinner.with_copying(Arc::new(mirror.copying()));
        }
        let pinner = Arc::new(pinner);
        let kinds = holdfast_controller::pinning::installed_kinds(&client).await;
        // The e2e suites collect nothing behind a test's back: an hour's grace, as deployed.
        let watched = Arc::new(Watched::start(&client, kinds, &cancel));
        let refresher = Refresher::new(watched.clone(), pinner.cache(), Duration::from_secs(3600)).into();
        // Bumped by the mirror after each copy: every object reconciled.
        let (reconcile_all, reconcile_all_rx) = watch::channel(0u64);
        let pinning = holdfast_controller::pinning::run(
            client.clone(),
            namespace.clone(),
            pinner.clone(),
            watched.clone(),
            reconcile_all_rx,
            Default::default(),
            cancel.clone(),
        );
        let copies = {
            let (namespace, reconcile, cancel, pinner) =
                (namespace.clone(), reconcile_all, cancel.clone(), pinner.clone());
            async move {
                if let Some(mirror) = mirror {
                    holdfast_controller::mirror::Mirror {
                        client,
                        namespace,
                        pinner,
                        watched,
                        settings: mirror,
                        resolver: resolver_config,
                        reconcile,
                        metrics: Default::default(),
                    }
                    .run(cancel)
                    .await;
                }
            }
        };
        let task = tokio::spawn(async move {
            tokio::join!(pinning, copies);
        });
        Ok(Self {
            namespace,
            pinner,
            refresher,
            cancel,
            task,
        })
    }

    /// One refresh round once the watches have listed every kind, as the controller's refresher
    /// runs it on its interval: the objects naming a tag that moved are reconciled from the
    /// refreshed cache.
    pub async fn refresh(&self) -> Result<holdfast_controller::refresher::RefreshReport> {
        let mut refresher = self.refresher.lock().await;
        refresher.ready().await;
        let report = refresher.round(&self.pinner).await?;
        Ok(report.refresh)
    }

    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

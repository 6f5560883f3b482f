//! holdfast's pinning controller run in-process against the local control plane: the
//! controller's own [`Term`] over a digest cache persisted in its own namespace (a resolver for
//! the test registries, Secrets read for `secretRef`s), running its pinning reconcilers and,
//! optionally, the mirror copier or the publisher of the pinning policy's parameters; refresh
//! rounds one at a time, when a test asks.

use std::{sync::Arc, time::Duration};

use anyhow::Result;
use holdfast_cache::CacheConfig;
use holdfast_controller::{
    mirror::MirrorSettings,
    refresher::Refresher,
    term::{Term, follow_cache},
};
use holdfast_pins::Pinner;
use holdfast_registry::ResolverConfig;
use kube::Client;
use tokio::task::JoinHandle;
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
        // The parameters are cluster-scoped: only the suites of the pinning policy publish them.
        publish_pins: false,
        look_again_every: holdfast_peers::LOOK_AGAIN_EVERY,
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
        Self::start_with_cache(env, client, insecure_registries, CacheConfig::default()).await
    }

    /// [`start`](Self::start) with a digest cache configured as `cache` says (its caps).
    pub async fn start_with_cache(
        env: &Env,
        client: Client,
        insecure_registries: &[String],
        cache: CacheConfig,
    ) -> Result<Self> {
        let namespace = unique_name("holdfast-system");
        crate::objects::create_namespace(&client, &namespace).await?;
        Self::launch(env, client, namespace, insecure_registries, None, cache, false).await
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
        Self::launch(
            env,
            client,
            namespace,
            insecure_registries,
            mirror,
            CacheConfig::default(),
            false,
        )
        .await
    }

    /// [`start_in`](Self::start_in), also publishing the digest cache as the pinning policy's
    /// parameters (`--publish-pins`): they are cluster-scoped, so one such controller at a time
    /// per environment.
    pub async fn start_publishing(env: &Env, client: Client, namespace: String) -> Result<Self> {
        Self::launch(env, client, namespace, &[], None, CacheConfig::default(), true).await
    }

    async fn launch(
        env: &Env,
        client: Client,
        namespace: String,
        insecure_registries: &[String],
        mirror: Option<MirrorSettings>,
        cache: CacheConfig,
        publish: bool,
    ) -> Result<Self> {
        let cancel = CancellationToken::new();
        let mut settings = settings(env, &namespace, "local-controller").term();
        settings
            .resolver
            .insecure_registries
            .extend(insecure_registries.iter().cloned());
        let (cache, mut synced) = follow_cache(
            &client,
            &namespace,
            settings.resolver.clone(),
            cache,
            cancel.clone(),
            &cancel,
        )?;
        let _ = synced.wait_for(|s| *s).await;
        let term = Arc::new(
            Term::start(
                client,
                cache,
                settings,
                mirror,
                Default::default(),
                cancel.clone(),
            )
            .await,
        );
        let (pinner, refresher) = (term.pinner().clone(), term.refresher().into());
        let publisher = publish.then(|| term.publisher());
        let leading = cancel.clone();
        let task = tokio::spawn(async move {
            let publishing = async move {
                if let Some(publisher) = publisher {
                    publisher.run(leading).await;
                }
            };
            tokio::join!(term.pinning(), term.mirror(), publishing);
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

//! Scenarios built from the EMULATORS (test fixtures, not the peers): both emulators scoped to a
//! fresh root namespace, and an org with staged apps. Shared by the `emulators` e2e suite and
//! `make bench-deletion`.

use std::time::Duration;

use anyhow::{Context, Result};
use kube::{Api, Client, ResourceExt, api::DynamicObject, runtime::wait::await_condition};
use tokio_util::sync::CancellationToken;

use super::{
    Scope,
    korifi::{self, KorifiConfig, KorifiEmulator},
    kpack::{KpackEmulator, KpackVersion},
    resources,
};
use crate::Env;

/// Upper bound for staging one app (Korifi and kpack creating Image, Build and build pod).
pub const STAGING_LIMIT: Duration = Duration::from_secs(60);

/// Waits, on a watch, until `name` satisfies `condition`.
async fn until(
    api: &Api<DynamicObject>,
    name: &str,
    limit: Duration,
    condition: impl Fn(Option<&DynamicObject>) -> bool,
) -> Result<()> {
    tokio::time::timeout(limit, await_condition(api.clone(), name, condition))
        .await
        .with_context(|| format!("timed out after {limit:?} waiting for {name}"))??;
    Ok(())
}

/// Both emulators, scoped to a fresh root namespace and the org/space namespaces Korifi makes.
pub struct Peers {
    pub client: Client,
    pub root: String,
    pub korifi: KorifiEmulator,
    pub kpack: KpackEmulator,
    _cancel: CancellationToken,
}

impl Peers {
    pub async fn start(env: &Env, version: KpackVersion, space_timeout: Duration) -> Result<Self> {
        Self::start_in(env, version, space_timeout, Scope::unique()).await
    }

    pub async fn start_in(
        env: &Env,
        version: KpackVersion,
        space_timeout: Duration,
        scope: Scope,
    ) -> Result<Self> {
        let client = env.client().await?;
        let (key, value) = scope.label().context("scoped")?;
        let root = env.namespace_with_labels("cf", &[(key, value)]).await?;
        let cancel = CancellationToken::new();
        let mut config = KorifiConfig::new(scope.clone());
        config.space_app_deletion_timeout = space_timeout;
        let korifi = KorifiEmulator::start(client.clone(), config, &cancel).await?;
        let kpack = KpackEmulator::start(client.clone(), version, scope, &cancel).await?;
        Ok(Self {
            client,
            root,
            korifi,
            kpack,
            _cancel: cancel,
        })
    }

    /// An org with one space, `n` apps pushed to it, each staged to the point where kpack's first
    /// Build runs in its pod and the Korifi finalizers that act on deletion are in place.
    /// Returns `(org, space, apps)`.
    pub async fn org_with_apps(&self, n: usize) -> Result<(String, String, Vec<String>)> {
        let org = self.korifi.create_org(&self.root, "org").await?;
        let space = self.korifi.create_space(&org, "space").await?;
        let mut apps = Vec::new();
        for i in 0..n {
            let app = self.korifi.create_app(&space, &format!("app-{i}")).await?;
            let build = self.korifi.create_build(&space, &app).await?;
            apps.push((app, build));
        }
        let api = |resource| Api::<DynamicObject>::namespaced_with(self.client.clone(), &space, &resource);
        let workloads = api(resources::build_workload());
        let builds = api(resources::build());
        let pods = api(resources::pod());
        for (app, build) in &apps {
            until(&workloads, build, STAGING_LIMIT, |w| {
                w.is_some_and(|w| {
                    w.labels().contains_key(korifi::IMAGE_GENERATION_LABEL)
                        && w.finalizers()
                            .iter()
                            .any(|f| f == korifi::BUILD_WORKLOAD_FINALIZER)
                })
            })
            .await?;
            let first = format!("{app}-build-1");
            until(&builds, &first, STAGING_LIMIT, |b| {
                b.is_some_and(|b| b.finalizers().iter().any(|f| f == korifi::KPACK_BUILD_FINALIZER))
            })
            .await?;
            until(&pods, &format!("{first}-build-pod"), STAGING_LIMIT, |p| {
                p.is_some()
            })
            .await?;
        }
        Ok((org, space, apps.into_iter().map(|(app, _)| app).collect()))
    }

    pub async fn stop(self) {
        self.kpack.stop().await;
        self.korifi.stop().await;
    }
}

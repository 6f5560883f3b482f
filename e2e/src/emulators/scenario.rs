//! Scenarios built from the EMULATORS (test fixtures, not the peers): both emulators scoped to a
//! fresh root namespace, an org with staged apps, and holdfast's fast-deletion parts serving
//! them. Shared by the `emulators` e2e suite and `make bench-deletion`.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, Patch, PatchParams},
    runtime::wait::{await_condition, conditions},
};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{
    Scope,
    korifi::{self, KorifiConfig, KorifiEmulator},
    kpack::{self, KpackEmulator, KpackVersion},
    resources,
};
use crate::{
    Env,
    webhook::{LocalWebhook, Registration, rule},
};

/// Upper bound for staging one app (Korifi and kpack creating Image, Build and build pod).
pub const STAGING_LIMIT: Duration = Duration::from_secs(60);

/// Waits, on a watch, until `name` satisfies `condition`.
pub async fn until(
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

/// Waits, on a watch, until `name` is gone (at once if it already is).
pub async fn until_gone(api: &Api<DynamicObject>, name: &str, limit: Duration) -> Result<()> {
    let Some(object) = api.get_opt(name).await? else {
        return Ok(());
    };
    let uid = object.uid().context("no uid")?;
    tokio::time::timeout(
        limit,
        await_condition(api.clone(), name, conditions::is_deleted(&uid)),
    )
    .await
    .with_context(|| format!("timed out after {limit:?} waiting for {name} to be deleted"))??;
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
        let webhooks = [korifi::kpack_build_finalizer_webhook as kpack::BuildWebhook];
        let kpack = KpackEmulator::start(client.clone(), version, scope, &webhooks, &cancel).await?;
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

/// holdfast's fast-deletion parts, in-process: the webhook with the owner-stamping rule and the
/// terminating guard, registered with the failure policies `manifests/` installs (Ignore: a dead
/// webhook must not hold anything up), and the controller's fast finalizer.
pub struct FastDeletion {
    pub webhook: LocalWebhook,
    cancel: CancellationToken,
    finalizer: Option<JoinHandle<()>>,
}

impl FastDeletion {
    pub async fn start(env: Arc<Env>) -> Result<Self> {
        let mut registration = Registration::rules(vec![rule(
            "kpack.io",
            "v1alpha2",
            &["images"],
            &["CREATE", "UPDATE"],
        )]);
        registration.validating_rules = vec![
            rule("kpack.io", "v1alpha2", &["builds"], &["CREATE"]),
            rule("kpack.io", "v1alpha2", &["images"], &["UPDATE"]),
            rule("", "v1", &["pods"], &["CREATE"]),
        ];
        let client = env.client().await?;
        let webhook = LocalWebhook::start(env, registration).await?;
        let ignore = json!([{"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Ignore"}]);
        let patch = Patch::Json::<()>(serde_json::from_value(ignore)?);
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .patch(&webhook.configuration, &PatchParams::default(), &patch)
            .await?;
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .patch(&webhook.configuration, &PatchParams::default(), &patch)
            .await?;
        let cancel = CancellationToken::new();
        // The benchmark measures the opt-in space deletion too (BENCHMARKS.md's CFSpace lever).
        let options = holdfast_controller::finalizer::Options {
            delete_org_spaces: true,
        };
        let finalizer = tokio::spawn(holdfast_controller::finalizer::run(
            client,
            options,
            Default::default(),
            cancel.clone(),
        ));
        Ok(Self {
            webhook,
            cancel,
            finalizer: Some(finalizer),
        })
    }

    /// The emulators' scope for the namespaces this webhook serves.
    pub fn scope(&self) -> Scope {
        Scope::e2e(&self.webhook.scope)
    }

    /// Both components die: the webhook stops answering (its configurations stay, pointing at a
    /// closed port) and the fast finalizer stops.
    pub async fn kill(&mut self) {
        if let Some(running) = self.webhook.running.take() {
            running.shutdown(Duration::ZERO).await;
        }
        self.cancel.cancel();
        if let Some(finalizer) = self.finalizer.take() {
            let _ = finalizer.await;
        }
    }

    /// Stops both and removes the webhook configurations.
    pub async fn stop(mut self) -> Result<()> {
        self.kill().await;
        self.webhook.stop().await
    }
}

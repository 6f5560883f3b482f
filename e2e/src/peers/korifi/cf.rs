//! What the Korifi API writes for `cf create-org`, `cf create-space`, `cf push` (a buildpack app)
//! and `cf delete-org`, as the custom resources it creates (the API server itself does not run
//! here: it needs a user's client certificate or token and a gateway; the objects it writes are
//! what the controllers act on). Nothing here writes a status: each step waits, on a watch, for
//! the controllers' answer.
//!
//! `cf push` is: a CFApp (STOPPED); the source bits uploaded as an image to
//! `<containerRepositoryPrefix><app>-packages` and a CFPackage naming it by digest; a CFBuild;
//! once it has succeeded, the CFApp's `currentDropletRef` set to it and `desiredState: STARTED`.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::{REGISTRY_SECRET, ROOT_NAMESPACE, resource};
use crate::{
    control_plane::unique_name,
    images,
    peers::{condition, until_condition},
};

/// How long a staging step may take on a loaded 2-core machine.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);
/// The label Korifi puts on everything of an app (its GUID).
pub const APP_GUID_LABEL: &str = "korifi.cloudfoundry.org/app-guid";

fn api(client: &Client, namespace: &str, kind: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource(kind))
}

async fn create(client: &Client, namespace: &str, kind: &str, object: serde_json::Value) -> Result<String> {
    let object: DynamicObject = serde_json::from_value(object)?;
    let name = object.metadata.name.clone().context("object without a name")?;
    api(client, namespace, kind)
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {kind} {namespace}/{name}"))?;
    Ok(name)
}

/// A CFOrg in the root namespace, once Ready (its namespace exists, secrets propagated); returns
/// its GUID, the name of the org's namespace.
pub async fn create_org(client: &Client, display_name: &str) -> Result<String> {
    let guid = unique_name("cf-org");
    let org = json!({
        "apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "CFOrg",
        "metadata": {"name": guid, "namespace": ROOT_NAMESPACE},
        "spec": {"displayName": display_name},
    });
    create(client, ROOT_NAMESPACE, "CFOrg", org).await?;
    until_condition(
        &api(client, ROOT_NAMESPACE, "CFOrg"),
        &guid,
        "Ready",
        false,
        STEP_TIMEOUT,
    )
    .await?;
    Ok(guid)
}

/// A CFSpace in the org's namespace, once Ready; returns its GUID (its namespace's name).
pub async fn create_space(client: &Client, org: &str, display_name: &str) -> Result<String> {
    let guid = unique_name("cf-space");
    let space = json!({
        "apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "CFSpace",
        "metadata": {"name": guid, "namespace": org},
        "spec": {"displayName": display_name},
    });
    create(client, org, "CFSpace", space).await?;
    until_condition(&api(client, org, "CFSpace"), &guid, "Ready", false, STEP_TIMEOUT).await?;
    Ok(guid)
}

/// An app pushed and started: its GUID and the CFBuild whose droplet it runs.
#[derive(Debug, Clone)]
pub struct App {
    pub guid: String,
    pub build: String,
    pub space: String,
}

/// `cf push` of a buildpack app into `space`: staged by Korifi's kpack-image-builder through kpack,
/// then started. `registry` is the registry's host address (to upload the package);
/// `repository_prefix` Korifi's `containerRepositoryPrefix`.
pub async fn push_app(
    client: &Client,
    registry: &str,
    repository_prefix: &str,
    space: &str,
    display_name: &str,
) -> Result<App> {
    let guid = unique_name("cf-app");
    let lifecycle = json!({"type": "buildpack", "data": {"buildpacks": [], "stack": "cflinuxfs3"}});
    let app = json!({
        "apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "CFApp",
        "metadata": {"name": guid, "namespace": space},
        "spec": {"displayName": display_name, "desiredState": "STOPPED", "lifecycle": lifecycle},
    });
    create(client, space, "CFApp", app).await?;

    let package = unique_name("cf-package");
    let repository = format!("{repository_prefix}{guid}-packages");
    let repository_path = repository
        .split_once('/')
        .map(|(_, path)| path)
        .context("prefix without a registry")?;
    let bits = images::Image::with_files(&[("app/index.txt", format!("{display_name}\n").as_bytes())])?;
    let digest = images::push(registry, repository_path, &package, &bits).await?;
    let cf_package = json!({
        "apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "CFPackage",
        "metadata": {"name": package, "namespace": space},
        "spec": {
            "type": "bits",
            "appRef": {"name": guid},
            "source": {"registry": {"image": format!("{repository}@{digest}"), "imagePullSecrets": [{"name": REGISTRY_SECRET}]}},
        },
    });
    create(client, space, "CFPackage", cf_package).await?;

    let build = unique_name("cf-build");
    let cf_build = json!({
        "apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "CFBuild",
        "metadata": {"name": build, "namespace": space},
        "spec": {
            "packageRef": {"name": package},
            "appRef": {"name": guid},
            "stagingMemoryMB": 1024,
            "stagingDiskMB": 1024,
            "lifecycle": lifecycle,
        },
    });
    create(client, space, "CFBuild", cf_build).await?;
    until_condition(
        &api(client, space, "CFBuild"),
        &build,
        "Succeeded",
        true,
        STEP_TIMEOUT,
    )
    .await
    .context("staging")?;

    let start = json!({"spec": {"currentDropletRef": {"name": build}, "desiredState": "STARTED"}});
    api(client, space, "CFApp")
        .patch(&guid, &PatchParams::default(), &Patch::Merge(&start))
        .await
        .context("starting the app")?;
    Ok(App {
        guid,
        build,
        space: space.to_string(),
    })
}

/// Waits, on a watch, until `instances` pods of the app run (Running and Ready).
pub async fn until_running(client: &Client, app: &App, instances: usize) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &app.space);
    let selector = format!("{APP_GUID_LABEL}={}", app.guid);
    let running = |pods: &[Pod]| {
        pods.iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count()
            >= instances
    };
    let config = kube::runtime::watcher::Config::default().labels(&selector);
    let store = crate::wait::until_listed(pods.clone(), config, running, STEP_TIMEOUT)
        .await
        .with_context(|| format!("{instances} running pod(s) of app {}", app.guid))?;
    Ok(store)
}

/// `cf delete-org`: a plain delete of the CFOrg (default propagation), as the API's OrgRepo does.
pub async fn delete_org(client: &Client, org: &str) -> Result<()> {
    api(client, ROOT_NAMESPACE, "CFOrg")
        .delete(org, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting CFOrg {org}"))?;
    Ok(())
}

/// Whether the app's CFProcess reports the instances running (for messages).
pub async fn process_summary(client: &Client, app: &App) -> String {
    let processes = api(client, &app.space, "CFProcess");
    match processes
        .list(&ListParams::default().labels(&format!("{APP_GUID_LABEL}={}", app.guid)))
        .await
    {
        Ok(list) => list
            .items
            .iter()
            .map(|p| {
                format!(
                    "{}: ready={:?} {}",
                    p.metadata.name.as_deref().unwrap_or("?"),
                    condition(p, "Ready"),
                    p.data["status"]
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => e.to_string(),
    }
}

//! kpack and Korifi installed after holdfast, as one `kapp deploy` or Argo CD sync that brings
//! them all may order it: the real `holdfast-webhook` and `holdfast-controller` start on a
//! cluster without kpack's and Korifi's APIs; once their CRDs are created, both take them up
//! within the look-again interval (`holdfast_peers::LOOK_AGAIN_EVERY`, the shipped 30 s), without
//! a restart: `peer_api_served` turns 1 on both admin ports, the fast deletion scenario passes
//! (stamped owners, the terminating guard, the fast finalizer), and the controller's new term
//! still pins.
//!
//! An environment of its own (its CRDs are removed and created again; the processes are its
//! children): `harness = false` with a single trial.

use std::{process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use holdfast_e2e::{
    Env,
    control_plane::{install_crds, unique_name},
    images,
    installed::{self, Options},
    objects::api_for,
    scenarios, tools, wait,
    webhook::SCOPE_LABEL,
};
use holdfast_peers::{korifi, kpack};
use k8s_openapi::{
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams},
};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone(
        "kpack_and_korifi_installed_after_holdfast_are_followed_without_a_restart",
        kpack_and_korifi_installed_after_holdfast_are_followed_without_a_restart,
    )
}

/// The namespaces the webhook serves carry `SCOPE_LABEL=SCOPE`; others are the controller's alone.
const SCOPE: &str = "late-peers";

/// The peers' API groups removed before holdfast starts.
const GROUPS: [&str; 2] = [kpack::GROUP, korifi::GROUP];

/// Two looks of the shipped interval, and the time to list what was found.
const FOLLOWED_WITHIN: Duration = Duration::from_secs(75);

async fn kpack_and_korifi_installed_after_holdfast_are_followed_without_a_restart() -> Result<()> {
    let mut env = Env::start().await?;
    if env.is_existing_cluster() {
        eprintln!("skipped: the processes run only beside the local control plane");
        return Ok(());
    }
    let client = env.client().await?;
    remove_peer_apis(&client).await?;

    let holdfast = installed::start(
        &mut env,
        Options {
            scope: Some(LabelSelectorRequirement {
                key: SCOPE_LABEL.into(),
                operator: "In".into(),
                values: Some(vec![SCOPE.into()]),
            }),
            controller: Some(Vec::new()),
            webhook: Vec::new(),
        },
    )
    .await?;
    holdfast.controller_ready().await?;
    let controller_admin = holdfast.controller_admin.clone().context("no controller")?;
    // The leader's term discovered the peers' kinds without them (the series appears only then).
    poll(
        Duration::from_secs(60),
        "the controller's term to start",
        || async {
            Ok(peer_api_served(&controller_admin, "controller", kpack::IMAGE)
                .await
                .is_ok())
        },
    )
    .await?;
    for (admin, component) in [
        (holdfast.admin.as_str(), "webhook"),
        (controller_admin.as_str(), "controller"),
    ] {
        let before = peer_api_served(admin, component, kpack::IMAGE).await?;
        ensure!(
            before == 0.0,
            "holdfast-{component} served kpack Images before they were installed"
        );
    }

    let installed_at = tokio::time::Instant::now();
    let dirs = [
        tools::peer_dir("kpack")?.join("crds"),
        tools::peer_dir("korifi")?.join("crds"),
    ];
    install_crds(&client, &dirs).await?;
    for (admin, component) in [
        (holdfast.admin.as_str(), "webhook"),
        (controller_admin.as_str(), "controller"),
    ] {
        for kind in [kpack::IMAGE, kpack::BUILD, korifi::CF_APP, korifi::BUILD_WORKLOAD] {
            let what = format!("holdfast-{component} to follow {kind} (peer_api_served 1)");
            poll(
                FOLLOWED_WITHIN.saturating_sub(installed_at.elapsed()),
                &what,
                || async {
                    Ok(peer_api_served(admin, component, kind)
                        .await
                        .is_ok_and(|v| v == 1.0))
                },
            )
            .await?;
        }
    }
    eprintln!(
        "webhook and controller followed kpack and Korifi {:.1} s after their CRDs were created",
        installed_at.elapsed().as_secs_f64()
    );

    // Both components at work on the kinds installed late.
    let guarded = env
        .namespace_with_labels("late-korifi", &[(SCOPE_LABEL, SCOPE)])
        .await?;
    scenarios::fast_deletion(&client, &guarded).await?;

    // The controller's new term still pins (the webhook does not serve this namespace).
    let repository = unique_name("late/config");
    let image = images::Image::with_files(&[("config.yml", repository.as_bytes())])?;
    let digest = images::push(env.registry(), &repository, "1.0.0", &image).await?;
    let tagged = format!("{}/{repository}:1.0.0", env.registry());
    let pinned = format!("{}/{repository}@{digest}", env.registry());
    let unserved = env.namespace("late-pinning").await?;
    let app = scenarios::create(&client, &unserved, &scenarios::app("app", &tagged, None)).await?;
    let apps = api_for(&client, &app, Some(&unserved)).await?;
    wait::until(&apps, "app", |a: Option<&DynamicObject>| {
        a.and_then(|a| a.data.pointer("/spec/fetch/0/image/url"))
            .and_then(|u| u.as_str())
            == Some(pinned.as_str())
    })
    .await
    .context("the controller's new term did not pin an App")?;
    Ok(())
}

/// Deletes the CRDs of [`GROUPS`] and waits until discovery no longer serves them.
async fn remove_peer_apis(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds.list(&ListParams::default()).await? {
        if !GROUPS.contains(&crd.spec.group.as_str()) {
            continue;
        }
        let name = crd.name_any();
        crds.delete(&name, &DeleteParams::default()).await?;
        wait::gone(
            crds.clone(),
            &name,
            &crd.uid().context("no uid")?,
            wait::DEFAULT_TIMEOUT,
        )
        .await?;
    }
    // Discovery follows the CRDs a moment later; it cannot be watched.
    poll(
        Duration::from_secs(30),
        "discovery to drop kpack and Korifi",
        || async {
            let image = holdfast_peers::served(client, &kpack::image()).await?;
            let app = holdfast_peers::served(client, &korifi::cf_app()).await?;
            Ok(image.is_none() && app.is_none())
        },
    )
    .await
}

/// `holdfast_{component}_peer_api_served` for `kind`, from the admin port `admin`; an error
/// while the series is absent.
async fn peer_api_served(admin: &str, component: &str, kind: &str) -> Result<f64> {
    let text = holdfast_e2e::metrics::scrape(admin).await?;
    let prefix = format!("holdfast_{component}_peer_api_served{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&format!("kind=\"{kind}\"")))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .with_context(|| format!("no {prefix}kind=\"{kind}\"}} on {admin}"))
}

/// Asks `done` every 100 ms (a metric or discovery: nothing to watch) until it answers true,
/// failing after `limit` or on its error.
async fn poll<F, Fut>(limit: Duration, what: &str, mut done: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    while !done().await.with_context(|| format!("waiting for {what}"))? {
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

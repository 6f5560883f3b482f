//! Issue 29, part 3: a registry behind a private CA. The real `holdfast-webhook` and
//! `holdfast-controller` binaries, started with `--registry-ca-file` naming one CA, against the
//! environment's real registry behind two TLS fronts (`holdfast_e2e::tls_front`), one with that
//! CA and one with another: an App fetching through the first is stored pinned; one fetching
//! through the second is admitted as written, the controller's `PinFailed` Event says the
//! certificate is not trusted and why, and both processes count it in
//! `registry_certificate_errors_total`.
//!
//! An environment of its own (the processes are the environment's children): `harness = false`
//! with a single trial.

use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, images,
    installed::{self, Options},
    metrics,
    objects::create_all,
    scenarios,
    tls_front::TlsFront,
};
use k8s_openapi::api::events::v1::Event;
use kube::{Api, ResourceExt};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone(
        "a_registry_behind_a_private_ca_pins_with_the_bundle_and_fails_clearly_without",
        a_registry_behind_a_private_ca_pins_with_the_bundle_and_fails_clearly_without,
    )
}

async fn a_registry_behind_a_private_ca_pins_with_the_bundle_and_fails_clearly_without() -> Result<()> {
    let mut env = Env::start().await?;
    if env.is_existing_cluster() {
        eprintln!("skipped: the processes run only beside the local control plane");
        return Ok(());
    }
    let digest = images::LayeredImage::new()
        .layer(&[("config.yml", b"corp: true\n")])?
        .push(env.registry(), "corp/app", "1.0.0")
        .await?;
    let trusted = TlsFront::start(env.registry(), "corp registry CA").await?;
    let untrusted = TlsFront::start(env.registry(), "someone else's CA").await?;
    let bundle = tempfile::NamedTempFile::new()?;
    std::fs::write(bundle.path(), &trusted.ca_pem)?;
    let flag = format!("--registry-ca-file={}", bundle.path().display());
    let holdfast = installed::start(
        &mut env,
        Options {
            scope: None,
            controller: Some(vec![flag.clone()]),
            webhook: vec![flag],
        },
    )
    .await?;
    holdfast.controller_ready().await?;

    let client = env.client().await?;
    let namespace = "private-ca";
    create_all(
        &client,
        "default",
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n"),
    )
    .await?;

    let pinned = scenarios::create(
        &client,
        namespace,
        &scenarios::app("trusted", &format!("{}/corp/app:1.0.0", trusted.addr), None),
    )
    .await?;
    let url = pinned
        .data
        .pointer("/spec/fetch/0/image/url")
        .and_then(|u| u.as_str());
    ensure!(
        url == Some(format!("{}/corp/app@{digest}", trusted.addr).as_str()),
        "the App through the trusted CA was stored as {url:?}"
    );

    let written = format!("{}/corp/app:1.0.0", untrusted.addr);
    let unpinned =
        scenarios::create(&client, namespace, &scenarios::app("untrusted", &written, None)).await?;
    let url = unpinned
        .data
        .pointer("/spec/fetch/0/image/url")
        .and_then(|u| u.as_str());
    ensure!(
        url == Some(written.as_str()),
        "the App through the untrusted CA was stored as {url:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let failed = scenarios::until_any(&events, "a PinFailed Event on App untrusted", |e: &Event| {
        e.reason.as_deref() == Some("PinFailed")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("untrusted")
    })
    .await?;
    let note = failed.note.clone().unwrap_or_default();
    for expected in [
        "certificate is not trusted",
        "UnknownIssuer",
        "--registry-ca-file",
    ] {
        ensure!(
            note.contains(expected),
            "PinFailed says {note:?}, without {expected:?}"
        );
    }
    eprintln!("PinFailed on {}: {note}", failed.name_any());

    for (component, admin) in [
        ("webhook", Some(holdfast.admin.clone())),
        ("controller", holdfast.controller_admin.clone()),
    ] {
        let admin = admin.context("no admin address")?;
        let count = certificate_errors(&admin, component).await?;
        ensure!(
            count >= 1.0,
            "holdfast-{component} counted {count} certificate errors"
        );
    }
    // Nothing of the trusted App's was lost meanwhile: still pinned.
    let apps = Api::<kube::api::DynamicObject>::namespaced_with(
        client.clone(),
        namespace,
        &kube::api::ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("kappctrl.k14s.io", "v1alpha1", "App"),
            "apps",
        ),
    );
    let names: Vec<String> = apps
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|a| {
            a.data
                .pointer("/spec/fetch/0/image/url")
                .and_then(|u| u.as_str())
                .is_some_and(|u| u.contains("@sha256:"))
        })
        .map(ResourceExt::name_any)
        .collect();
    ensure!(names == ["trusted"], "pinned Apps: {names:?}");
    Ok(())
}

/// `holdfast_<component>_registry_certificate_errors_total` on the admin port at `admin`. The
/// webhook counts before it answers the admission, the controller before it records PinFailed.
async fn certificate_errors(admin: &str, component: &str) -> Result<f64> {
    let metric = format!("holdfast_{component}_registry_certificate_errors_total");
    let text = metrics::scrape(admin).await?;
    metrics::value(&text, &metric).with_context(|| format!("no {metric} on {admin}"))
}

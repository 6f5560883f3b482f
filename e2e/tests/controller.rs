//! The pinning controller on the real kube-apiserver with a real registry: it pins objects that
//! were admitted unpinned (no webhook here at all), and after a tag moves, one registry check
//! re-pins every `follow` object using it — never a `freeze` object, never one being deleted.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env,
    controller::LocalController,
    e2e_main, images,
    objects::{api_for, parse_documents},
    wait,
};
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

e2e_main!(
    catch_up_and_follow_a_moved_tag,
    one_replica_leads_and_a_standby_takes_over
);

fn app(name: &str, url: &str, extra_metadata: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata:\n  name: {name}\n{extra_metadata}spec:\n  serviceAccountName: default\n  fetch:\n  - image: {{url: {url}}}\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

fn url_of(app: Option<&DynamicObject>) -> Option<String> {
    app.and_then(|a| a.data.pointer("/spec/fetch/0/image/url"))
        .and_then(|u| u.as_str())
        .map(str::to_owned)
}

async fn catch_up_and_follow_a_moved_tag(env: Arc<Env>) -> Result<()> {
    let mut upstream = env.spare_registry().await?;
    let v1 = images::Image::with_files(&[("config.yml", b"version: 1\n")])?;
    let v2 = images::Image::with_files(&[("config.yml", b"version: 2\n")])?;
    let d1 = images::push(&upstream.addr, "team/app", "1.0.0", &v1).await?;
    let client = env.client().await?;

    // The controller, in-process, with its cache persisted in its own namespace.
    let controller =
        LocalController::start(&env, client.clone(), std::slice::from_ref(&upstream.addr)).await?;

    let ns = env.namespace("controller").await?;
    let url = format!("{}/team/app:1.0.0", upstream.addr);
    let manifests = [
        app("follow-1", &url, ""),
        app("follow-2", &url, ""),
        app("follow-3", &url, ""),
        app("frozen", &url, "  labels: {holdfast.dev/pin: freeze}\n"),
        app("leaving", &url, "  finalizers: [e2e.holdfast.dev/hold]\n"),
    ];
    let mut apis = Vec::new();
    for manifest in &manifests {
        let object = parse_documents(manifest)?.remove(0);
        let api = api_for(&client, &object, Some(&ns)).await?;
        let created = api.create(&PostParams::default(), &object).await?;
        ensure!(
            url_of(Some(&created)).as_deref() == Some(url.as_str()),
            "admitted pinned: no webhook runs here"
        );
        apis.push((created.metadata.name.clone().context("no name")?, api));
    }

    // Catch-up: every object gets pinned to what the tag holds.
    let pinned_v1 = format!("{}/team/app@{d1}", upstream.addr);
    for (name, api) in &apis {
        let expected = pinned_v1.clone();
        wait::until(api, name, move |a: Option<&DynamicObject>| {
            url_of(a).as_deref() == Some(expected.as_str())
        })
        .await?;
    }

    let (_, leaving) = &apis[4];
    leaving.delete("leaving", &DeleteParams::default()).await?;

    // The tag moves; one refresh round asks the registry once for all five objects.
    let d2 = images::retag(&upstream.addr, "team/app", "1.0.0", &v2).await?;
    let heads = "HEAD /v2/team/app/manifests/1.0.0";
    let before = upstream.requests_matching(heads);
    let report = controller.refresh().await?;
    let checks = upstream.requests_matching(heads) - before;
    ensure!(
        report.moved == 1 && report.checked == 1,
        "refresh round: {report:?}"
    );
    ensure!(
        checks == 1,
        "{checks} registry checks for one tag used by five objects"
    );

    let pinned_v2 = format!("{}/team/app@{d2}", upstream.addr);
    for (name, api) in &apis[..3] {
        let expected = pinned_v2.clone();
        wait::until(api, name, move |a: Option<&DynamicObject>| {
            url_of(a).as_deref() == Some(expected.as_str())
        })
        .await?;
    }
    // Checked once the follow Apps moved: the frozen and the leaving App kept their digest.
    for (name, api) in &apis[3..] {
        let current = url_of(Some(&api.get(name).await?));
        ensure!(
            current.as_deref() == Some(pinned_v1.as_str()),
            "{name} moved to {current:?}"
        );
    }
    eprintln!("catch-up pinned 5 Apps; a moved tag cost 1 registry check and re-pinned the 3 follow Apps");

    leaving
        .patch(
            "leaving",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    controller.stop().await;
    upstream.stop();
    Ok(())
}

async fn one_replica_leads_and_a_standby_takes_over(env: Arc<Env>) -> Result<()> {
    use holdfast_controller::leader::Election;
    use std::time::Duration;

    let ns = env.namespace("lease").await?;
    let election = |identity: &str| Election {
        namespace: ns.clone(),
        lease: "holdfast-controller".into(),
        identity: identity.into(),
        duration: Duration::from_secs(15),
        renew_every: Duration::from_millis(200),
        renew_deadline: Duration::from_secs(10),
    };
    let (a_cancel, b_cancel) = (CancellationToken::new(), CancellationToken::new());
    let (a_leads, mut a_led) = tokio::sync::watch::channel(false);
    let (b_leads, mut b_led) = tokio::sync::watch::channel(false);
    let a = {
        let (election, client, cancel) = (election("replica-a"), env.client().await?, a_cancel.clone());
        tokio::spawn(async move {
            election
                .lead(client, cancel, move |leading| async move {
                    a_leads.send_replace(true);
                    leading.cancelled().await;
                })
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(30), a_led.wait_for(|l| *l)).await??;
    let b = {
        let (election, client, cancel) = (election("replica-b"), env.client().await?, b_cancel.clone());
        tokio::spawn(async move {
            election
                .lead(client, cancel, move |leading| async move {
                    b_leads.send_replace(true);
                    leading.cancelled().await;
                })
                .await
        })
    };
    // While A renews, B stays a candidate through several of its retries.
    let early = tokio::time::timeout(Duration::from_secs(2), b_led.wait_for(|l| *l))
        .await
        .is_err();
    ensure!(early, "the standby led while the leader held the lease");

    // A stops and hands the lease back: B leads well before the 15 s expiry.
    a_cancel.cancel();
    a.await??;
    tokio::time::timeout(Duration::from_secs(10), b_led.wait_for(|l| *l)).await??;
    b_cancel.cancel();
    b.await??;
    Ok(())
}

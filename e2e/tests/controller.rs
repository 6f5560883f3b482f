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

// Serial: the admin port test runs the whole controller (leader election, every reconciler,
// watching every namespace), which must not reconcile the other tests' objects as they run.
e2e_main!(
    serial: catch_up_and_follow_a_moved_tag,
    one_replica_leads_and_a_standby_takes_over,
    the_admin_port_reports_readiness_and_metrics_as_work_happens
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

/// The value of the sample `series` (name and labels exactly as exposed) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|value| value.parse().ok())
}

async fn scrape(http: &reqwest::Client, admin: std::net::SocketAddr) -> Result<String> {
    let response = http.get(format!("http://{admin}/metrics")).send().await?;
    ensure!(response.status().is_success(), "/metrics: {}", response.status());
    Ok(response.text().await?)
}

async fn readyz(http: &reqwest::Client, admin: std::net::SocketAddr) -> Result<(u16, String)> {
    let response = http.get(format!("http://{admin}/readyz")).send().await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// Scrapes until `done` holds of the exposition (a counter is bumped just after the write it
/// counts returns, which a watch may show first); bounded like every wait.
async fn scrape_until(
    http: &reqwest::Client,
    admin: std::net::SocketAddr,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Result<String> {
    let deadline = tokio::time::Instant::now() + wait::DEFAULT_TIMEOUT;
    loop {
        let text = scrape(http, admin).await?;
        if done(&text) {
            return Ok(text);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{what}: not seen within {:?}; last scrape:\n{text}",
            wait::DEFAULT_TIMEOUT
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The controller as the binary runs it (digest cache, leader election, every reconciler) with
/// its admin port: /readyz is 503 until the cache synced and the replica leads, then 200; the
/// leader gauge is 1; pinning an App counts a reconcile of kind App and a registry lookup; after
/// the controller stops (the Lease handed back) /readyz is 503 again.
async fn the_admin_port_reports_readiness_and_metrics_as_work_happens(env: Arc<Env>) -> Result<()> {
    use holdfast_controller::{admin, leader::Role, metrics::Metrics, run};
    use holdfast_registry::{ResolverConfig, cache::CacheConfig};
    use std::time::Duration;

    let client = env.client().await?;
    let own = env.namespace("holdfast-obs").await?;
    let (metrics, health) = (Arc::new(Metrics::new()), Arc::new(admin::Health::default()));
    let admin_cancel = CancellationToken::new();
    let (addr, admin_task) = admin::serve(
        "127.0.0.1:0".parse()?,
        health.clone(),
        metrics.clone(),
        admin_cancel.clone(),
    )
    .await?;
    let http = reqwest::Client::new();
    let healthz = http.get(format!("http://{addr}/healthz")).send().await?;
    ensure!(healthz.status().is_success(), "/healthz: {}", healthz.status());
    let (status, why) = readyz(&http, addr).await?;
    ensure!(
        status == 503,
        "/readyz before the controller started: {status} {why}"
    );

    let settings = run::Settings {
        namespace: own.clone(),
        refresh: Duration::from_secs(3600),
        lease: "holdfast-controller".into(),
        identity: holdfast_e2e::control_plane::unique_name("obs"),
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
    };
    let cancel = CancellationToken::new();
    let controller = tokio::spawn(run::run_observed(
        client.clone(),
        settings,
        None,
        metrics.clone(),
        health.clone(),
        cancel.clone(),
    ));
    let mut role = health.election.watch();
    tokio::time::timeout(
        wait::DEFAULT_TIMEOUT,
        role.wait_for(|r| matches!(r, Role::Leading { .. })),
    )
    .await
    .context("the controller did not lead")??;
    let (status, how) = readyz(&http, addr).await?;
    ensure!(
        status == 200 && how == "leading",
        "/readyz while leading: {status} {how}"
    );
    let app_ok = "holdfast_controller_reconciles_total{controller=\"pinning\",kind=\"App\",result=\"ok\"}";
    let lookups = "holdfast_controller_registry_lookups_total";
    let before = scrape(&http, addr).await?;
    ensure!(
        sample(&before, "holdfast_controller_leader") == Some(1.0),
        "leader gauge while leading:\n{before}"
    );
    let (reconciled_before, lookups_before) = (
        sample(&before, app_ok).unwrap_or(0.0),
        sample(&before, lookups).unwrap_or(0.0),
    );

    // An App admitted with a tag (no webhook here): the controller pins it.
    let repository = holdfast_e2e::control_plane::unique_name("obs/app");
    let image = images::Image::with_files(&[("config.yml", b"observed: true\n")])?;
    let digest = images::push(env.registry(), &repository, "1.0.0", &image).await?;
    let ns = env.namespace("obs").await?;
    let tagged = format!("{}/{repository}:1.0.0", env.registry());
    let object = parse_documents(&app("observed", &tagged, ""))?.remove(0);
    let api = api_for(&client, &object, Some(&ns)).await?;
    api.create(&PostParams::default(), &object).await?;
    let pinned = format!("{}/{repository}@{digest}", env.registry());
    wait::until(&api, "observed", move |a: Option<&DynamicObject>| {
        url_of(a).as_deref() == Some(pinned.as_str())
    })
    .await?;
    let after = scrape_until(&http, addr, "a counted App reconcile", |text| {
        sample(text, app_ok).unwrap_or(0.0) > reconciled_before
    })
    .await?;
    ensure!(
        sample(&after, lookups).unwrap_or(0.0) > lookups_before,
        "pinning a new tag made no registry lookup:\n{after}"
    );
    ensure!(
        sample(
            &after,
            "holdfast_controller_reconcile_duration_seconds_count{controller=\"pinning\",kind=\"App\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "no App reconcile timed:\n{after}"
    );
    ensure!(
        sample(&after, "holdfast_controller_digest_cache_entries").unwrap_or(0.0) >= 1.0,
        "the resolved tag is not in the cache:\n{after}"
    );

    // Stopped: the Lease handed back, no longer leading, no longer ready.
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(20), controller)
        .await
        .context("the controller did not stop within 20 s")???;
    let (status, why) = readyz(&http, addr).await?;
    ensure!(status == 503, "/readyz after stopping: {status} {why}");
    let stopped = scrape(&http, addr).await?;
    ensure!(
        sample(&stopped, "holdfast_controller_leader") == Some(0.0),
        "leader gauge after stopping:\n{stopped}"
    );
    eprintln!(
        "admin port: ready while leading, App reconciles {reconciled_before} -> {}, registry lookups {lookups_before} -> {}",
        sample(&after, app_ok).unwrap_or(0.0),
        sample(&after, lookups).unwrap_or(0.0)
    );
    admin_cancel.cancel();
    admin_task.await?;
    Ok(())
}

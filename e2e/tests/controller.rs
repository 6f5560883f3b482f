//! The pinning controller on the real kube-apiserver with a real registry: it pins objects that
//! were admitted unpinned (no webhook here at all), and after a tag moves, one registry check
//! re-pins every `follow` object using it — never a `freeze` object, never one being deleted.

use std::sync::Arc;

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env,
    controller::LocalController,
    e2e_main, images, metrics,
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
    a_leader_cut_off_from_the_api_server_never_writes_alongside_its_successor,
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

async fn readyz(http: &reqwest::Client, admin: std::net::SocketAddr) -> Result<(u16, String)> {
    let response = http.get(format!("http://{admin}/readyz")).send().await?;
    Ok((response.status().as_u16(), response.text().await?))
}

/// Scrapes until `done` holds of the exposition (a counter is bumped just after the write it
/// counts returns, which a watch may show first); bounded like every wait.
async fn scrape_until(
    admin: std::net::SocketAddr,
    what: &str,
    done: impl Fn(&str) -> bool,
) -> Result<String> {
    let deadline = tokio::time::Instant::now() + wait::DEFAULT_TIMEOUT;
    loop {
        let text = metrics::scrape(&admin.to_string()).await?;
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

    let settings = holdfast_e2e::controller::settings(&env, &own, "obs");
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
    let before = metrics::scrape(&addr.to_string()).await?;
    ensure!(
        metrics::value(&before, "holdfast_controller_leader") == Some(1.0),
        "leader gauge while leading:\n{before}"
    );
    let (reconciled_before, lookups_before) = (
        metrics::value(&before, app_ok).unwrap_or(0.0),
        metrics::value(&before, lookups).unwrap_or(0.0),
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
    let after = scrape_until(addr, "a counted App reconcile", |text| {
        metrics::value(text, app_ok).unwrap_or(0.0) > reconciled_before
    })
    .await?;
    ensure!(
        metrics::value(&after, lookups).unwrap_or(0.0) > lookups_before,
        "pinning a new tag made no registry lookup:\n{after}"
    );
    ensure!(
        metrics::value(
            &after,
            "holdfast_controller_reconcile_duration_seconds_count{controller=\"pinning\",kind=\"App\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "no App reconcile timed:\n{after}"
    );
    ensure!(
        metrics::value(&after, "holdfast_controller_digest_cache_entries").unwrap_or(0.0) >= 1.0,
        "the resolved tag is not in the cache:\n{after}"
    );

    // Stopped: the Lease handed back, no longer leading, no longer ready.
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(20), controller)
        .await
        .context("the controller did not stop within 20 s")???;
    let (status, why) = readyz(&http, addr).await?;
    ensure!(status == 503, "/readyz after stopping: {status} {why}");
    let stopped = metrics::scrape(&addr.to_string()).await?;
    ensure!(
        metrics::value(&stopped, "holdfast_controller_leader") == Some(0.0),
        "leader gauge after stopping:\n{stopped}"
    );
    eprintln!(
        "admin port: ready while leading, App reconciles {reconciled_before} -> {}, registry lookups {lookups_before} -> {}",
        metrics::value(&after, app_ok).unwrap_or(0.0),
        metrics::value(&after, lookups).unwrap_or(0.0)
    );
    admin_cancel.cancel();
    admin_task.await?;
    Ok(())
}

/// A client of the local control plane sending `user_agent` (what the audit log records of it),
/// through `via` (`host:port` of a relay to the API server) when given.
async fn client_as(env: &Env, user_agent: &str, via: Option<&str>) -> Result<kube::Client> {
    let mut config = env.config().await?;
    if let Some(addr) = via {
        config.cluster_url = format!("https://{addr}").parse()?;
    }
    config
        .headers
        .push((http::header::USER_AGENT, http::HeaderValue::from_str(user_agent)?));
    Ok(kube::Client::try_from(config)?)
}

/// One controller replica, in-process, as the binary runs it.
struct Replica {
    health: Arc<holdfast_controller::admin::Health>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), holdfast_controller::run::Error>>,
}

impl Replica {
    fn start(client: kube::Client, settings: holdfast_controller::run::Settings) -> Self {
        let health = Arc::new(holdfast_controller::admin::Health::default());
        let cancel = CancellationToken::new();
        let task = tokio::spawn(holdfast_controller::run::run_observed(
            client,
            settings,
            None,
            Arc::new(holdfast_controller::metrics::Metrics::new()),
            health.clone(),
            cancel.clone(),
        ));
        Self { health, cancel, task }
    }

    /// Waits, on its status, until its role satisfies `done`.
    async fn until(
        &self,
        what: &str,
        timeout: std::time::Duration,
        done: impl FnMut(&holdfast_controller::leader::Role) -> bool,
    ) -> Result<()> {
        let mut role = self.health.election.watch();
        tokio::time::timeout(timeout, role.wait_for(done))
            .await
            .with_context(|| format!("{what}: not within {timeout:?}"))?
            .context("status gone")?;
        Ok(())
    }

    async fn stop(self) -> Result<()> {
        self.cancel.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(20), self.task)
            .await
            .context("a replica did not stop within 20 s")???;
        Ok(())
    }
}

/// Issue 15, item 4: two replicas of the whole controller, lease 4 s, renewed every 500 ms,
/// renewal deadline 2.5 s, while Apps are created every 300 ms (each pinned with a patch and an
/// Event by whoever leads). Replica A reaches the API server through a relay that then hangs
/// (bytes accepted, none forwarded, either way, on the open HTTP/2 connections too); B takes the
/// Lease once it expired as B observed it and writes; the link comes back (everything it held
/// delivered) and A, restarted as its pod would be, finds the Lease held and stands by. The API
/// server's audit log, split by User-Agent, must show no two leaders' writes overlapping: every
/// write of A that the server completed (2xx), Lease aside, completed before B's acquiring write
/// was received; B wrote only after it; A never wrote the Lease again.
///
/// Before the fix A's run did not end while its link hung: a lost leader let its work wind down
/// gracefully, so a reconcile waiting on the hung connection would carry on, and write, once the
/// link came back. Now the work is dropped at the renewal deadline, requests in flight with it.
///
/// What no client can prevent: a request already handed to the network. The hang usually catches
/// one of A's writes (an Event right after a pin patch); the relay delivers it after B took over,
/// with the HTTP/2 reset its client sent when it gave up right behind it, and the API server has
/// so far answered it 504 (context canceled) — a race inside the API server, not a guarantee
/// (SECURITY.md). The test then measures that race: writes sent into a hung link, given up by
/// their client, delivered on resume; how many the server completed is printed.
async fn a_leader_cut_off_from_the_api_server_never_writes_alongside_its_successor(
    env: Arc<Env>,
) -> Result<()> {
    use holdfast_controller::{leader::Role, run};
    use holdfast_e2e::{audit, control_plane::unique_name, slow_link::Relay};
    use k8s_openapi::{api::core::v1::Event as CoreEvent, jiff::Timestamp};
    use std::time::{Duration, Instant};

    if env.is_existing_cluster() {
        eprintln!("skipped: the audit log and the relay need the local control plane");
        return Ok(());
    }
    use holdfast_controller::leader::LEASE;
    let (ua_a, ua_b) = ("holdfast-e2e/replica-a", "holdfast-e2e/replica-b");
    let (lease_duration, renew_deadline) = (Duration::from_secs(4), Duration::from_millis(2500));
    let own = env.namespace("holdfast-fence").await?;
    let settings = |identity: &str| run::Settings {
        lease: LEASE.into(),
        identity: identity.into(),
        lease_duration,
        renew_every: Duration::from_millis(500),
        renew_deadline,
        ..holdfast_e2e::controller::settings(&env, &own, identity)
    };
    let apiserver = format!("127.0.0.1:{}", env.apiserver_port());
    let relay = Relay::start(&apiserver).await?;
    let client_a = client_as(&env, ua_a, Some(&relay.addr)).await?;
    let client_b = client_as(&env, ua_b, None).await?;
    let admin = client_as(&env, "holdfast-e2e/test", None).await?;

    let repository = unique_name("fence/app");
    let image = images::Image::with_files(&[("config.yml", b"fenced: true\n")])?;
    let digest = images::push(env.registry(), &repository, "1.0.0", &image).await?;
    let tagged = format!("{}/{repository}:1.0.0", env.registry());
    let pinned = format!("{}/{repository}@{digest}", env.registry());
    let ns = env.namespace("fence").await?;
    let template = parse_documents(&app("app", &tagged, ""))?.remove(0);
    let apps = api_for(&admin, &template, Some(&ns)).await?;

    // Writes all along: an App every 300 ms; `created` counts them.
    let (created_tx, created) = tokio::sync::watch::channel(0usize);
    let stop_creating = CancellationToken::new();
    let creator = {
        let (apps, stop) = (apps.clone(), stop_creating.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(300));
            for i in 0usize.. {
                tokio::select! {
                    _ = stop.cancelled() => return Ok::<_, anyhow::Error>(i),
                    _ = tick.tick() => {}
                }
                let mut object = template.clone();
                object.metadata.name = Some(format!("app-{i}"));
                apps.create(&PostParams::default(), &object).await?;
                created_tx.send_replace(i + 1);
            }
            unreachable!()
        })
    };
    // Waits until an App created from now on is pinned (by whoever leads).
    let next_pinned = |what: &'static str| {
        let (apps, pinned, mut created) = (apps.clone(), pinned.clone(), created.clone());
        async move {
            let seen = *created.borrow_and_update();
            let n = *created.wait_for(|n| *n > seen).await?;
            let name = format!("app-{}", n - 1);
            wait::until(&apps, &name, move |a: Option<&DynamicObject>| {
                url_of(a).as_deref() == Some(pinned.as_str())
            })
            .await
            .with_context(|| format!("{what}: {name} not pinned"))?;
            anyhow::Ok(())
        }
    };

    // A leads and writes; B stands by, reading the Lease.
    let a = Replica::start(client_a.clone(), settings("replica-a"));
    a.until("A leading", wait::DEFAULT_TIMEOUT, |r| {
        matches!(r, Role::Leading { .. })
    })
    .await?;
    next_pinned("A leading").await?;
    let b = Replica::start(client_b, settings("replica-b"));
    b.until("B standing by", wait::DEFAULT_TIMEOUT, |r| {
        matches!(r, Role::Candidate { healthy: true })
    })
    .await?;
    next_pinned("A leading, B standing by").await?;

    // A's API server stops answering it.
    relay.hang();
    let (hung_at, hung) = (Timestamp::now(), Instant::now());
    a.until("A stopping once a renewal is late", renew_deadline * 2, |r| {
        !matches!(r, Role::Leading { .. })
    })
    .await?;
    let a_stopped = hung.elapsed();
    // It gives up without waiting for the network: its run ends while the link is still hung
    // (checked last, so that the audit log shows what happens when it does not).
    let mut a_run = a.task;
    let ended_while_hung = tokio::time::timeout(Duration::from_secs(5), &mut a_run)
        .await
        .ok();
    let a_ended_while_hung = ended_while_hung.is_some();
    // As its process would exit: the old run's cache follower and writer stop with it.
    if a_ended_while_hung {
        a.cancel.cancel();
    }
    b.until("B leading", Duration::from_secs(30), |r| {
        matches!(r, Role::Leading { .. })
    })
    .await?;
    let b_leads = hung.elapsed();
    next_pinned("B leading, A cut off").await?;

    // The link comes back, delivering whatever it held; A restarts, as its pod would, and must
    // stand by for at least a lease while B renews, B still writing.
    relay.resume();
    let resumed_at = Timestamp::now();
    let ended = match ended_while_hung {
        Some(ended) => ended,
        None => tokio::time::timeout(Duration::from_secs(30), a_run)
            .await
            .context("A's run did not end within 30 s of its link resuming")?,
    }?;
    a.cancel.cancel();
    ensure!(
        matches!(
            ended,
            Err(run::Error::Election(holdfast_controller::leader::Error::Lost(_)))
        ),
        "A's run ended with {ended:?}, not a lost Lease"
    );
    let a = Replica::start(client_a, settings("replica-a"));
    a.until("A standing by again", wait::DEFAULT_TIMEOUT, |r| {
        matches!(r, Role::Candidate { healthy: true })
    })
    .await?;
    let standby = async {
        let mut role = a.health.election.watch();
        let led = tokio::time::timeout(
            lease_duration,
            role.wait_for(|r| matches!(r, Role::Leading { .. })),
        )
        .await
        .is_ok();
        ensure!(!led, "A led again while B held the Lease");
        anyhow::Ok(())
    };
    let (standby, b_wrote) = tokio::join!(standby, next_pinned("B leading, A back"));
    standby?;
    b_wrote?;
    stop_creating.cancel();
    let created_total = creator.await??;
    a.stop().await?;
    let stopped_at = Timestamp::now();
    b.stop().await?;

    // B's hand-back is its last write: once it is logged, everything before it is.
    let lease = |e: &audit::Event| e.is_lease(&own, LEASE);
    let deadline = Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events = env.audit_log()?;
        if events
            .iter()
            .any(|e| e.user_agent == ua_b && lease(e) && e.request_received_timestamp > stopped_at)
        {
            break events;
        }
        ensure!(
            Instant::now() < deadline,
            "B's release of the Lease not in the audit log within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let of = |ua: &'static str| {
        events
            .iter()
            .filter(move |e| e.user_agent == ua && e.stage == "ResponseComplete")
    };
    let writes = |ua| of(ua).filter(|e| !lease(e) && e.succeeded()).collect::<Vec<_>>();
    let (a_writes, b_writes) = (writes(ua_a), writes(ua_b));
    let list = |events: &[&audit::Event]| {
        events
            .iter()
            .map(|e| format!("\n  {}", e.describe()))
            .collect::<String>()
    };
    ensure!(!a_writes.is_empty(), "no write of A in the audit log");
    ensure!(!b_writes.is_empty(), "no write of B in the audit log");
    let b_acquired = of(ua_b)
        .filter(|e| lease(e) && e.succeeded())
        .min_by_key(|e| e.stage_timestamp)
        .context("B's acquiring Lease write not in the audit log")?;
    let a_late: Vec<_> = a_writes
        .iter()
        .copied()
        .filter(|e| e.stage_timestamp >= b_acquired.request_received_timestamp)
        .collect();
    ensure!(
        a_late.is_empty(),
        "A's writes completed after B's acquiring write ({}) was received:{}",
        b_acquired.describe(),
        list(&a_late)
    );
    let b_early: Vec<_> = b_writes
        .iter()
        .copied()
        .filter(|e| e.request_received_timestamp < b_acquired.stage_timestamp)
        .collect();
    ensure!(
        b_early.is_empty(),
        "B wrote before it held the Lease ({}):{}",
        b_acquired.describe(),
        list(&b_early)
    );
    let term = |writes: &[&audit::Event]| {
        (
            writes.iter().map(|e| e.request_received_timestamp).min(),
            writes.iter().map(|e| e.stage_timestamp).max(),
        )
    };
    let ((a_first, a_last), (b_first, b_last)) = (term(&a_writes), term(&b_writes));
    ensure!(
        a_last < b_first,
        "the leaders' writes overlap: A {a_first:?}..{a_last:?}, B {b_first:?}..{b_last:?}"
    );
    let a_retook: Vec<_> = of(ua_a)
        .filter(|e| lease(e) && e.succeeded() && e.request_received_timestamp > b_acquired.stage_timestamp)
        .collect();
    ensure!(
        a_retook.is_empty(),
        "A wrote the Lease while B held it:{}",
        list(&a_retook)
    );
    let a_after_hang: Vec<_> = of(ua_a)
        .filter(|e| e.request_received_timestamp >= hung_at)
        .collect();
    let delivered_late = a_after_hang
        .iter()
        .filter(|e| e.request_received_timestamp >= resumed_at && e.request_received_timestamp < stopped_at)
        .count();
    eprintln!(
        "fencing: {created_total} Apps created; A stopped leading {:.1} s after its link hung, B led {:.1} s after; A wrote {} times ({:?}..{:?}), B {} times ({:?}..{:?}); A's writes received after the hang: {} ({delivered_late} after the link resumed):{}",
        a_stopped.as_secs_f64(),
        b_leads.as_secs_f64(),
        a_writes.len(),
        a_first,
        a_last,
        b_writes.len(),
        b_first,
        b_last,
        a_after_hang.len(),
        list(&a_after_hang)
    );
    ensure!(
        a_ended_while_hung,
        "A's run did not end within 5 s of losing the lead while its link hung (it waited for its work's requests)"
    );

    // What a client cannot recall: a write sent into the hung link and dropped by its client,
    // as a leader past its deadline drops its work. An Event, so the audit log records it.
    const HELD: usize = 20;
    let probe_ua = "holdfast-e2e/probe";
    let probe_relay = Relay::start(&apiserver).await?;
    let probe = client_as(&env, probe_ua, Some(&probe_relay.addr)).await?;
    let probes: kube::Api<CoreEvent> = kube::Api::namespaced(probe, &ns);
    probes.list(&Default::default()).await?;
    for i in 0..HELD {
        probe_relay.hang();
        let held = CoreEvent {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("held-{i}")),
                ..Default::default()
            },
            involved_object: k8s_openapi::api::core::v1::ObjectReference {
                kind: Some("Namespace".into()),
                name: Some(ns.clone()),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            reason: Some("Held".into()),
            ..Default::default()
        };
        let answered = tokio::time::timeout(
            Duration::from_millis(300),
            probes.create(&PostParams::default(), &held),
        )
        .await;
        ensure!(
            answered.is_err(),
            "a create was answered through the hung link: {answered:?}"
        );
        probe_relay.resume();
        // Through the same connection: once answered, the held frames were delivered.
        probes.list(&Default::default()).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let received = loop {
        let received: Vec<_> = env
            .audit_log()?
            .into_iter()
            .filter(|e| e.user_agent == probe_ua && e.verb == "create")
            .collect();
        if received.len() >= HELD || Instant::now() >= deadline {
            break received;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    ensure!(
        received.len() == HELD,
        "{} of {HELD} held creates reached the API server once the link resumed",
        received.len()
    );
    let landed: Vec<_> = received.iter().filter(|e| e.succeeded()).collect();
    let codes: std::collections::BTreeSet<_> = received.iter().map(|e| e.code()).collect();
    eprintln!(
        "fencing: {HELD} creates sent into a hung link and given up by their client all reached the API server when it resumed (codes {codes:?}); {} completed:{}",
        landed.len(),
        list(&landed)
    );
    // Its Apps would be reconciled by every controller the next tests start.
    kube::Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client().await?)
        .delete(&ns, &DeleteParams::default())
        .await?;
    Ok(())
}

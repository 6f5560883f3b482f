//! Issue 35, "must show": with a registry answering maximal tag lists, both processes stay under
//! their memory requests and keep serving other registries.
//!
//! The real `holdfast-webhook` and `holdfast-controller` binaries (as `make up` runs them, built
//! by `cargo build -p holdfast-webhook -p holdfast-controller --bins` with the test's profile)
//! against the local control plane, and a hostile registry in this process that answers every
//! tag listing with pages just under the page bound (4 MiB of one-letter tags, none a version)
//! and a `Link` to another such page, forever. Apps with `tagSelection`s naming it are created and
//! updated again and again (each write is an admission that lists, each App a reconcile of the
//! controller that lists); meanwhile an App with a tag on the environment's real registry must be
//! pinned. Both processes' resident set (VmRSS sampled, and VmHWM at the end, from
//! `/proc/PID/status`) must stay under the memory request the shipped manifests give them.
//!
//! An environment of its own (the processes are the environment's children), so no shared
//! control plane: `harness = false` with a single trial.

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use axum::{
    Router,
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use holdfast_e2e::{
    Env, images,
    installed::{self, CONTROLLER, WEBHOOK},
    objects::create_all,
    process::Usage,
};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
};
use serde_json::json;

/// The page bound of a tag listing (`ResolverConfig::max_tag_list_bytes`, 4 MiB): the hostile
/// pages are just under it, so every page is read.
const PAGE_BYTES: usize = 4 * 1024 * 1024 - 4096;

/// Apps naming the hostile registry, each its own repository (a listing each).
const HOSTILE_APPS: usize = 6;

/// How long the storm lasts.
const STORM: Duration = Duration::from_secs(45);

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone(
        "both_processes_stay_under_their_memory_requests_while_a_registry_answers_maximal_tag_lists",
        both_processes_stay_under_their_memory_requests,
    )
}

/// The hostile registry's state: its one page, and how many were served.
struct Hostile {
    page: String,
    pages_served: AtomicUsize,
}

async fn v2() -> impl IntoResponse {
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], "{}")
}

/// `GET /v2/<repository>/tags/list`: a maximal page and a `Link` to the next, forever;
/// anything else (a manifest) is unknown.
async fn serve(State(hostile): State<Arc<Hostile>>, Path(rest): Path<String>) -> Response {
    let Some(repository) = rest.strip_suffix("/tags/list") else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let n = hostile.pages_served.fetch_add(1, Ordering::Relaxed);
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(link) = HeaderValue::from_str(&format!(
        "</v2/{repository}/tags/list?n=1000000&last=p{n}>; rel=\"next\""
    )) {
        headers.insert(header::LINK, link);
    }
    (StatusCode::OK, headers, hostile.page.clone()).into_response()
}

/// One page of one-letter tags (none parses as a version), just under [`PAGE_BYTES`].
fn maximal_page() -> String {
    let mut page = String::with_capacity(PAGE_BYTES);
    page.push_str(r#"{"name":"maximal","tags":["#);
    let letters = b"abcdefghijklmnopqrstuvwxyz";
    let mut i = 0usize;
    while page.len() + 8 < PAGE_BYTES {
        if i > 0 {
            page.push(',');
        }
        page.push('"');
        page.push(letters[i % letters.len()] as char);
        page.push('"');
        i += 1;
    }
    page.push_str("]}");
    page
}

/// Starts the hostile registry on loopback; returns its `host:port`.
async fn start_hostile() -> Result<(String, Arc<Hostile>)> {
    let hostile = Arc::new(Hostile {
        page: maximal_page(),
        pages_served: AtomicUsize::new(0),
    });
    let app = Router::new()
        .route("/v2/", get(v2))
        .route("/v2/{*rest}", get(serve).head(serve))
        .with_state(hostile.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let host = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((host, hostile))
}

/// The memory request (MiB) `manifests/base/<component>/deployment.yaml` gives its container.
fn memory_request_mib(component: &str) -> Result<f64> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("../manifests/base/{component}/deployment.yaml"));
    let deployment: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    let request = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
        .as_str()
        .with_context(|| format!("{}: no memory request", path.display()))?;
    match request.strip_suffix("Mi") {
        Some(mib) => Ok(mib.parse()?),
        None => match request.strip_suffix("Gi") {
            Some(gib) => Ok(gib.parse::<f64>()? * 1024.0),
            None => bail!(
                "{}: memory request {request:?} is not in Mi or Gi",
                path.display()
            ),
        },
    }
}

/// The last lines of a process's log in the environment.
fn log_tail(env: &Env, name: &str) -> String {
    let text = env
        .log_path(name)
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    // Without the frames of a backtrace.
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.starts_with("at ") && l.split_once(": ").is_none_or(|(n, _)| n.parse::<u32>().is_err())
        })
        .collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}

fn app_yaml(name: &str, fetch: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: default\n  fetch: [{fetch}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

async fn both_processes_stay_under_their_memory_requests() -> Result<()> {
    let (webhook_request, controller_request) =
        (memory_request_mib("webhook")?, memory_request_mib("controller")?);
    let (hostile_host, hostile) = start_hostile().await?;
    let mut env = Env::start().await?;
    if env.is_existing_cluster() {
        eprintln!("skipped: the processes run only beside the local control plane");
        return Ok(());
    }
    let plain_digest = images::LayeredImage::new()
        .layer(&[("config.yml", b"plain: true\n")])?
        .push(env.registry(), "plain/app", "1.0.0")
        .await?;
    let holdfast = installed::start_with_registry(&mut env, &hostile_host).await?;
    let pids = [
        (
            WEBHOOK,
            env.pid_of(WEBHOOK).context("no webhook process")?,
            webhook_request,
        ),
        (
            CONTROLLER,
            env.pid_of(CONTROLLER).context("no controller process")?,
            controller_request,
        ),
    ];
    let client = env.client().await?;
    let namespace = "hostile-tags";
    create_all(
        &client,
        "default",
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {namespace}}}\n"),
    )
    .await?;
    let before: Vec<Usage> = pids
        .iter()
        .map(|(_, pid, _)| Usage::of(Some(*pid)))
        .collect::<Result<_>>()?;

    // Sample both processes' resident sets through the storm.
    let stop = tokio_util::sync::CancellationToken::new();
    let sampler = {
        let stop = stop.clone();
        let pids: Vec<u32> = pids.iter().map(|(_, pid, _)| *pid).collect();
        tokio::spawn(async move {
            let mut peaks = vec![0u64; pids.len()];
            while !stop.is_cancelled() {
                for (peak, pid) in peaks.iter_mut().zip(&pids) {
                    if let Ok(usage) = Usage::of(Some(*pid)) {
                        *peak = (*peak).max(usage.rss_kib);
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            peaks
        })
    };

    // The storm: Apps naming the hostile registry, created, then rewritten over and over.
    let apps_resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kappctrl.k14s.io", "v1alpha1", "App"),
        "apps",
    );
    let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &apps_resource);
    let hostile_fetch = |i: usize, round: usize| {
        format!(
            "{{image: {{url: {hostile_host}/maximal/app-{i}, tagSelection: {{semver: {{constraints: '>={round}.0.0'}}}}}}}}"
        )
    };
    for i in 0..HOSTILE_APPS {
        create_all(
            &client,
            namespace,
            &app_yaml(&format!("hostile-{i}"), &hostile_fetch(i, 1)),
        )
        .await?;
    }
    let pinned = format!("{}/plain/app@{plain_digest}", env.registry());
    let url_of = |app: &DynamicObject| {
        app.data
            .pointer("/spec/fetch/0/image/url")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    let started = Instant::now();
    let (mut created_at, mut pinned_after) = (None, None);
    let mut round = 2;
    while started.elapsed() < STORM {
        // An App on the real registry, created while the listings run (the third round of
        // rewrites): pinned as ever.
        if round == 4 {
            let yaml = app_yaml(
                "plain",
                &format!("{{image: {{url: {}/plain/app:1.0.0}}}}", env.registry()),
            );
            let plain = create_all(&client, namespace, &yaml).await?;
            created_at = Some(started.elapsed());
            if url_of(&plain[0]).as_deref() == Some(pinned.as_str()) {
                pinned_after = Some(Duration::ZERO);
            }
        }
        let writes = (0..HOSTILE_APPS).map(|i| {
            let apps = apps.clone();
            let fetch: serde_json::Value = serde_yaml::from_str(&hostile_fetch(i, round)).unwrap_or_default();
            async move {
                let patch = json!({"spec": {"fetch": [fetch]}});
                apps.patch(
                    &format!("hostile-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            }
        });
        for result in futures::future::join_all(writes).await {
            result.context("rewriting a hostile App")?;
        }
        round += 1;
        if let (Some(created), None) = (created_at, pinned_after) {
            let stored = apps.get("plain").await?;
            if url_of(&stored).as_deref() == Some(pinned.as_str()) {
                pinned_after = Some(started.elapsed() - created);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.cancel();
    let sampled = sampler.await?;
    let pages = hostile.pages_served.load(Ordering::Relaxed);

    let mut report = Vec::new();
    let mut over = Vec::new();
    for (((name, pid, request), sampled_kib), before) in pids.iter().zip(&sampled).zip(&before) {
        let after = Usage::of(Some(*pid))
            .with_context(|| format!("{name} is gone; its log ends:\n{}", log_tail(&env, name)))?;
        let (peak, sampled) = (after.peak_rss_mib(), *sampled_kib as f64 / 1024.0);
        report.push(format!(
            "{name}: RSS {:.1} MiB before, peak sampled {sampled:.1} MiB, VmHWM {peak:.1} MiB (request {request} MiB)",
            before.rss_mib()
        ));
        if peak >= *request {
            over.push(format!(
                "{name} peaked at {peak:.1} MiB, over its memory request of {request} MiB"
            ));
        }
    }
    eprintln!(
        "hostile registry: {pages} pages of {:.1} MiB served in {:.0} s, {} rounds of {HOSTILE_APPS} App writes; {}",
        PAGE_BYTES as f64 / 1024.0 / 1024.0,
        started.elapsed().as_secs_f64(),
        round - 1,
        report.join("; ")
    );
    ensure!(
        pages >= HOSTILE_APPS,
        "the hostile registry served only {pages} pages: the storm did not reach it"
    );
    ensure!(over.is_empty(), "{}", over.join("; "));
    let pinned_after = match pinned_after {
        Some(after) => after,
        None => {
            let stored = apps.get("plain").await?;
            bail!(
                "the App on the real registry was not pinned during the storm: {:?}",
                url_of(&stored)
            )
        }
    };
    eprintln!(
        "the App on the real registry, created {:.1} s into the storm, was pinned {:.1} s after its creation (0: at admission)",
        created_at.unwrap_or_default().as_secs_f64(),
        pinned_after.as_secs_f64()
    );
    let _ = holdfast;
    Ok(())
}

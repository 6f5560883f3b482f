//! The dashboard's and the alerts' queries (manifests/components/monitoring) name only metrics
//! the binaries export: the real `holdfast-webhook` and `holdfast-controller` run against the
//! local control plane as `make up` runs them, both admin ports are scraped, and every
//! `holdfast_…` name in a query must be a sample name of a metric family one of them declares
//! (a family is declared, with `# TYPE`, before it has samples: a counter of mirror copies
//! given up is named before any copy was given up).
//!
//! Meanwhile the real kapp-controller syncs an App holdfast pinned, and the controller's count
//! of fetches avoided must see it.
//!
//! An environment of its own (the processes are the environment's children): `harness = false`
//! with a single trial.

use std::{collections::BTreeSet, path::PathBuf, process::ExitCode, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use holdfast_e2e::{
    Env, images, installed, metrics,
    objects::{api_for, create_all},
    peers::kapp_controller,
    wait,
};
use kube::{Api, api::DynamicObject};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone(
        "the_dashboard_and_the_alerts_name_only_metrics_the_binaries_export",
        queries_name_exported_metrics,
    )
}

async fn queries_name_exported_metrics() -> Result<()> {
    names_are_read_off_queries()?;
    let mut env = Env::start().await?;
    if env.is_existing_cluster() {
        eprintln!("skipped: the processes run only beside the local control plane");
        return Ok(());
    }
    let holdfast = installed::start(
        &mut env,
        installed::Options {
            scope: None,
            controller: Some(Vec::new()),
            webhook: Vec::new(),
        },
    )
    .await?;
    // Ready: the controller's digest cache is built, so its figures are declared too.
    holdfast.controller_ready().await?;
    let controller_admin = holdfast
        .controller_admin
        .as_deref()
        .context("no controller admin address")?;
    // An App pinned at admission (so the admission histogram has its series: a histogram's
    // label sets are too many to declare at 0 ahead) and synced by the real kapp-controller.
    env.kapp_controller().await?;
    let config = b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: monitored}\ndata: {k: v}\n";
    let digest = images::LayeredImage::new()
        .layer(&[("config.yml", config)])?
        .push(env.registry(), "monitored/app", "1.0.0")
        .await?;
    let client = env.client().await?;
    create_all(
        &client,
        "default",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitored}\n",
    )
    .await?;
    kapp_controller::add_deployer(&env, "monitored")?;
    let app = format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: monitored}}\nspec:\n  serviceAccountName: {}\n  syncPeriod: 10s\n  fetch: [{{image: {{url: {}/monitored/app:1.0.0}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n",
        kapp_controller::DEPLOYER,
        env.registry()
    );
    let created = create_all(&client, "monitored", &app).await?;
    let app = created.first().context("no App created")?;
    let url = app.data["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        url == format!("{}/monitored/app@{digest}", env.registry()),
        "the App was stored with {url:?}, not pinned"
    );
    let apps = api_for(&client, app, Some("monitored")).await?;
    fetches_avoided_count_the_syncs(&env, &apps, controller_admin).await?;
    let webhook = exported(&metrics::scrape(&holdfast.admin).await?)?;
    let controller = exported(&metrics::scrape(controller_admin).await?)?;
    for (component, names, expected) in [
        ("webhook", &webhook, "holdfast_webhook_digest_cache_entries_stale"),
        (
            "controller",
            &controller,
            "holdfast_controller_digest_cache_entries_stale",
        ),
        (
            "controller",
            &controller,
            "holdfast_controller_fetches_avoided_total",
        ),
    ] {
        ensure!(
            names.contains(expected),
            "{component} does not declare {expected}: {names:?}"
        );
    }
    let exported: BTreeSet<String> = webhook.union(&controller).cloned().collect();

    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/components/monitoring");
    let rule: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("prometheusrule.yaml"))?)?;
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("dashboard.json"))?)?;
    let mut queries: Vec<(String, String)> = Vec::new();
    for group in rule["spec"]["groups"].as_sequence().into_iter().flatten() {
        for r in group["rules"].as_sequence().into_iter().flatten() {
            let name = r["alert"].as_str().unwrap_or("a rule");
            queries.push((
                name.to_string(),
                r["expr"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let title = panel["title"].as_str().unwrap_or("a panel");
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                queries.push((title.to_string(), expr.to_string()));
            }
        }
    }
    let mut named = BTreeSet::new();
    let mut missing = Vec::new();
    for (what, expr) in &queries {
        for name in metric_names(expr) {
            if !exported.contains(&name) {
                missing.push(format!("{what}: {name}"));
            }
            named.insert(name);
        }
    }
    ensure!(
        missing.is_empty(),
        "queries naming metrics neither binary exports:\n  {}",
        missing.join("\n  ")
    );
    // The dashboard covers both components and the cache: something to compare.
    ensure!(
        named.len() >= 25,
        "the queries name only {} metrics: {named:?}",
        named.len()
    );
    Ok(())
}

/// The pinned App's second sync by kapp-controller (its `status.fetch.startedAt` moved after the
/// first) is counted in `holdfast_controller_fetches_avoided_total{kind="App"}`: one pin.
async fn fetches_avoided_count_the_syncs(env: &Env, apps: &Api<DynamicObject>, admin: &str) -> Result<()> {
    let started = |app: &DynamicObject| {
        app.data["status"]["fetch"]["startedAt"]
            .as_str()
            .map(String::from)
    };
    let first = kapp_controller::until_reconciled(env, apps, "monitored").await?;
    let first = started(&first).context("the reconciled App has no status.fetch.startedAt")?;
    wait::until(apps, "monitored", move |app: Option<&DynamicObject>| {
        app.and_then(started).is_some_and(|at| at != first)
    })
    .await?;
    // The controller reads the same change off its own watch: its count follows within moments.
    // A metric has no watch; it is read until it counts or the limit passes.
    let series = "holdfast_controller_fetches_avoided_total{kind=\"App\"}";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let text = metrics::scrape(admin).await?;
        let count = metrics::value(&text, series).context("no fetches_avoided series for Apps")?;
        if count >= 1.0 {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "kapp-controller synced the pinned App again, but fetches_avoided stayed at {count}"
        );
    }
}

/// The sample names of every metric family the OpenMetrics text declares (`# TYPE NAME TYPE`).
fn exported(text: &str) -> Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(declared) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = declared
            .split_once(' ')
            .with_context(|| format!("a TYPE line without a type: {line}"))?;
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            "gauge" | "unknown" | "info" => &[""],
            other => bail!("{name}: a metric type this test does not know: {other}"),
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    Ok(names)
}

/// The `holdfast_…` metric names in a PromQL expression (label names and values hold none:
/// holdfast's labels are plain words).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("holdfast_") {
        let starts_a_word = rest[..at].chars().next_back().is_none_or(|c| !word(c));
        let end = rest[at..].find(|c: char| !word(c)).map_or(rest.len(), |e| at + e);
        if starts_a_word {
            names.insert(rest[at..end].to_string());
        }
        rest = &rest[end..];
    }
    names
}

/// Names are whole words starting `holdfast_`, label values aside.
fn names_are_read_off_queries() -> Result<()> {
    let names = metric_names(
        "sum(rate(holdfast_webhook_admission_duration_seconds_bucket{rule=\"pin-fetch-refs\"}[5m])) / max(xholdfast_no)",
    );
    ensure!(
        names.into_iter().collect::<Vec<_>>() == ["holdfast_webhook_admission_duration_seconds_bucket"],
        "names read wrongly"
    );
    Ok(())
}

//! The dashboard's and the alerts' queries (manifests/components/monitoring) name only metrics
//! the binaries export: the real `holdfast-webhook` and `holdfast-controller` run against the
//! local control plane as `make up` runs them, both admin ports are scraped, and every
//! `holdfast_…` name in a query must be a sample name of a metric family one of them declares
//! (a family is declared, with `# TYPE`, before it has samples: a counter of mirror copies
//! given up is named before any copy was given up).
//!
//! An environment of its own (the processes are the environment's children): `harness = false`
//! with a single trial.

use std::{collections::BTreeSet, path::PathBuf, process::ExitCode};

use anyhow::{Context, Result, bail, ensure};
use holdfast_e2e::{Env, images, installed, objects::create_all};

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
    // One admission pinned, so the admission histogram has its series (a histogram's label
    // sets are too many to declare at 0 ahead).
    let digest = images::LayeredImage::new()
        .layer(&[("config.yml", b"monitored: true\n")])?
        .push(env.registry(), "monitored/app", "1.0.0")
        .await?;
    let client = env.client().await?;
    create_all(
        &client,
        "default",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitored}\n",
    )
    .await?;
    let app = format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: monitored}}\nspec:\n  serviceAccountName: default\n  fetch: [{{image: {{url: {}/monitored/app:1.0.0}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n",
        env.registry()
    );
    let created = create_all(&client, "monitored", &app).await?;
    let url = created
        .first()
        .and_then(|app| app.data["spec"]["fetch"][0]["image"]["url"].as_str())
        .unwrap_or_default();
    ensure!(
        url == format!("{}/monitored/app@{digest}", env.registry()),
        "the App was stored with {url:?}, not pinned"
    );
    let controller_admin = holdfast
        .controller_admin
        .as_deref()
        .context("no controller admin address")?;
    let webhook = exported(&scrape(&holdfast.admin).await?)?;
    let controller = exported(&scrape(controller_admin).await?)?;
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

async fn scrape(admin: &str) -> Result<String> {
    let response = reqwest::get(format!("http://{admin}/metrics")).await?;
    if !response.status().is_success() {
        bail!("{admin}/metrics answered {}", response.status());
    }
    Ok(response.text().await?)
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

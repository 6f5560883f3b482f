//! components/monitoring and the chart's `monitoring.*` values: the PrometheusRule passes
//! `promtool check rules`, each alert fires on its condition in `promtool test rules`
//! (tests/promtool/alerts.yaml), the chart renders each part on its own value with the labels
//! given, and the monitors carry no credentials (the check catches one added).

use std::{collections::BTreeSet, path::Path, process::Command};

use anyhow::{Context, Result, bail, ensure};
use holdfast_manifest_checks::{
    chart::{helm, helm_template},
    checks::check_monitoring,
    load::{kubectl, manifests, read, render_with_components},
    report::{assert_clean, expect_caught},
    yaml::{at_mut, find_mut, kind},
};
use serde_json::json;
use serde_yaml::Value;

/// The PrometheusRule as the component ships it.
fn rule() -> Result<Value> {
    let path = manifests().join("components/monitoring/prometheusrule.yaml");
    Ok(serde_yaml::from_str(&read(&path)?)?)
}

/// `promtool` from the PATH (Debian's `prometheus` package: scripts/install-deps.sh --packages).
fn promtool(args: &[&str], dir: &Path) -> Result<String> {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .context("promtool is not on PATH: run scripts/install-deps.sh --packages")?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        bail!("promtool {}: {text}", args.join(" "));
    }
    Ok(text)
}

fn alerts(groups: &Value) -> BTreeSet<String> {
    groups["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(String::from))
        .collect()
}

#[test]
fn promtool_checks_the_rules() -> Result<()> {
    let spec = rule()?["spec"].clone();
    let count = alerts(&spec).len();
    ensure!(count >= 7, "only {count} alerts");
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("rules.yaml"), serde_yaml::to_string(&spec)?)?;
    let out = promtool(&["check", "rules", "rules.yaml"], dir.path())?;
    ensure!(out.contains(&format!("SUCCESS: {count} rules found")), "{out}");
    Ok(())
}

/// Every alert is tested, and fires when (and only when) alerts.yaml says. The annotations are
/// left out of the rules tested (promtool would compare their rendered text too); `promtool
/// check rules` above parses their templates.
#[test]
fn each_alert_fires_on_its_condition() -> Result<()> {
    let mut spec = rule()?["spec"].clone();
    for group in spec["groups"].as_sequence_mut().into_iter().flatten() {
        for rule in group["rules"].as_sequence_mut().into_iter().flatten() {
            if let Some(rule) = rule.as_mapping_mut() {
                rule.remove("annotations");
            }
        }
    }
    let tests_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/promtool/alerts.yaml");
    let tests = read(&tests_path)?;
    let tested: BTreeSet<String> = serde_yaml::from_str::<Value>(&tests)?["tests"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|t| t["alert_rule_test"].as_sequence().into_iter().flatten())
        .filter_map(|a| a["alertname"].as_str().map(String::from))
        .collect();
    let untested: Vec<_> = alerts(&spec).difference(&tested).cloned().collect();
    ensure!(
        untested.is_empty(),
        "alerts without a test in alerts.yaml: {untested:?}"
    );
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("rules.yaml"), serde_yaml::to_string(&spec)?)?;
    std::fs::write(dir.path().join("alerts.yaml"), tests)?;
    let out = promtool(&["test", "rules", "alerts.yaml"], dir.path())?;
    ensure!(out.contains("SUCCESS"), "{out}");
    Ok(())
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_with_a_query_in_every_panel() -> Result<()> {
    let path = manifests().join("components/monitoring/dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&read(&path)?)?;
    ensure!(dashboard["uid"] == "holdfast", "uid {}", dashboard["uid"]);
    let panels = dashboard["panels"].as_array().context("no panels")?;
    let mut queried = 0;
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let exprs: Vec<_> = panel["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["expr"].as_str())
            .collect();
        ensure!(!exprs.is_empty(), "panel {} has no query", panel["title"]);
        ensure!(
            panel["datasource"]["uid"] == "${datasource}",
            "panel {} does not use the datasource variable",
            panel["title"]
        );
        queried += 1;
    }
    ensure!(queried >= 15, "only {queried} panels");
    Ok(())
}

#[test]
fn each_monitoring_value_renders_its_part_with_the_labels_given() -> Result<()> {
    let helm = helm()?;
    let off = helm_template(&helm, &json!({}))?;
    let monitoring_kinds = ["PodMonitor", "PrometheusRule"];
    ensure!(
        !off.iter().any(
            |o| monitoring_kinds.contains(&o["kind"].as_str().unwrap_or_default())
                || o["metadata"]["name"] == "holdfast-dashboard"
        ),
        "monitoring objects rendered by default"
    );
    for (value, expected) in [
        (
            "podMonitors",
            vec!["PodMonitor/holdfast-webhook", "PodMonitor/holdfast-controller"],
        ),
        ("prometheusRule", vec!["PrometheusRule/holdfast"]),
        ("dashboard", vec!["ConfigMap/holdfast-dashboard"]),
    ] {
        let values = json!({"monitoring": {value: true, "labels": {"release": "kube-prometheus-stack"}}});
        let rendered = helm_template(&helm, &values)?;
        let added: Vec<_> = rendered
            .iter()
            .filter(|o| !off.contains(o))
            .map(|o| {
                let id = format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                );
                (id, o["metadata"]["labels"]["release"].clone())
            })
            .collect();
        let ids: Vec<_> = added.iter().map(|(id, _)| id.as_str()).collect();
        ensure!(ids == expected, "monitoring.{value}: rendered {ids:?}");
        for (id, release) in &added {
            ensure!(
                release == "kube-prometheus-stack",
                "{id}: release label {release}"
            );
        }
    }
    Ok(())
}

/// A monitor handed credentials, pointed at another port or scheme, or at other namespaces'
/// pods is caught.
#[test]
fn a_monitor_with_credentials_or_a_wider_scrape_is_caught() -> Result<()> {
    let kubectl = kubectl().context("kubectl is not on PATH")?;
    let rendered = render_with_components(&kubectl, &["monitoring"])?;
    ensure!(
        rendered.iter().filter(|o| kind(o) == "PodMonitor").count() == 2,
        "the component renders no two PodMonitors"
    );
    assert_clean("components/monitoring", &check_monitoring(&rendered));
    let mutations: [(&str, &str, &str, &str); 6] = [
        (
            "spec.podMetricsEndpoints.0",
            "basicAuth",
            "{username: {name: s, key: u}}",
            "credential",
        ),
        (
            "spec.podMetricsEndpoints.0",
            "bearerTokenSecret",
            "{name: s, key: t}",
            "credential",
        ),
        ("spec.podMetricsEndpoints.0", "port", "https", "admin port"),
        ("spec.podMetricsEndpoints.0", "scheme", "https", "admin port"),
        ("spec", "namespaceSelector", "{any: true}", "other than"),
        (
            "spec",
            "namespaceSelector",
            "{matchNames: [default]}",
            "other than",
        ),
    ];
    for (path, key, value, needle) in mutations {
        let mut objects = rendered.clone();
        let monitor = find_mut(&mut objects, "PodMonitor", "holdfast-controller")?;
        let target = at_mut(monitor, path)?
            .as_mapping_mut()
            .with_context(|| format!("{path} is no mapping"))?;
        target.insert(Value::from(key), serde_yaml::from_str(value)?);
        expect_caught(
            &format!("{path}.{key}: {value}"),
            check_monitoring(&objects),
            needle,
        );
    }
    let mut objects = rendered.clone();
    let monitor = find_mut(&mut objects, "PodMonitor", "holdfast-webhook")?;
    *at_mut(monitor, "spec.selector.matchLabels")? = serde_yaml::from_str("{app: anything}")?;
    expect_caught("a foreign selector", check_monitoring(&objects), "not holdfast's");
    Ok(())
}

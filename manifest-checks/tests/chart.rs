//! The Helm chart (charts/holdfast) renders exactly what kustomize renders of manifests/ for the
//! same settings — the chart's defaults are `manifests/overlays/recommended` — and every
//! rendering keeps SECURITY.md's promises. No differences are allowed: `helm template` adds no
//! label or annotation (what `helm install` and kapp add to installed objects is listed in
//! `chart::HELM_ADDS` and `chart::KAPP_ADDS`, and checked by the e2e suites `chart` and
//! `package`).

use anyhow::{Context, Result, ensure};
use holdfast_manifest_checks::{
    chart::{Settings, differences, helm, helm_template},
    check_all,
    load::kubectl,
    report::assert_clean,
};
use serde_json::json;

fn same_as_kustomize(what: &str, settings: &Settings) -> Result<Vec<serde_json::Value>> {
    let kubectl = kubectl().context("kubectl is not on PATH")?;
    let rendered = helm_template(&helm()?, &settings.values())?;
    let expected = settings.kustomize(&kubectl)?;
    ensure!(
        expected.len() > 20,
        "kustomize rendered only {} objects",
        expected.len()
    );
    assert_clean(
        &format!("helm template vs kustomize ({what})"),
        &differences(&expected, &rendered),
    );
    Ok(rendered)
}

fn keeps_the_promises(what: &str, rendered: &[serde_json::Value]) -> Result<()> {
    let objects: Vec<serde_yaml::Value> = rendered
        .iter()
        .map(serde_yaml::to_value)
        .collect::<Result<_, _>>()?;
    assert_clean(&format!("SECURITY.md promises ({what})"), &check_all(&objects));
    Ok(())
}

#[test]
fn the_charts_defaults_are_the_recommended_overlay() -> Result<()> {
    let rendered = same_as_kustomize("defaults", &Settings::recommended())?;
    keeps_the_promises("defaults", &rendered)?;
    // The defaults are the chart's own: no values at all render the same.
    let bare = helm_template(&helm()?, &json!({}))?;
    assert_clean("helm template without values", &differences(&rendered, &bare));
    Ok(())
}

#[test]
fn without_match_conditions_the_chart_is_the_base() -> Result<()> {
    same_as_kustomize("matchConditions=false", &Settings::default()).map(drop)
}

#[test]
fn cert_manager_mode_is_the_cert_manager_component() -> Result<()> {
    let settings = Settings {
        cert_manager: true,
        ..Settings::recommended()
    };
    let rendered = same_as_kustomize("certMode=cert-manager", &settings)?;
    keeps_the_promises("certMode=cert-manager", &rendered)
}

#[test]
fn every_value_changes_what_the_same_kustomize_overlay_changes() -> Result<()> {
    let settings = Settings::everything_changed();
    let rendered = same_as_kustomize("every value changed", &settings)?;
    keeps_the_promises("every value changed", &rendered)?;
    // And the values did change something: the overlay is not the recommended one.
    let recommended = helm_template(&helm()?, &Settings::recommended().values())?;
    let changed = differences(&recommended, &rendered);
    for expected in [
        "holdfast-webhook: /spec/replicas",
        "holdfast-controller: /spec/template/spec/containers/0/args",
        "/spec/template/spec/imagePullSecrets",
        "namespaceSelector/matchExpressions",
        "ConfigMap holdfast-system/holdfast-policy-",
    ] {
        ensure!(
            changed.iter().any(|d| d.contains(expected)),
            "no change at {expected}: {changed:#?}"
        );
    }
    Ok(())
}

/// helm refuses values the schema does not describe (the schema is also the Carvel Package's
/// valuesSchema): a misspelt key fails instead of being ignored.
#[test]
fn the_values_schema_refuses_unknown_values() -> Result<()> {
    for values in [
        json!({"replica": 3}),
        json!({"webhook": {"replica": 3}}),
        json!({"certMode": "vault"}),
        json!({"image": {"digest": "latest"}}),
    ] {
        ensure!(
            helm_template(&helm()?, &values).is_err(),
            "helm template accepted {values}"
        );
    }
    Ok(())
}

/// `helm lint` finds nothing wrong with the chart (errors fail it; the chart has no icon, which
/// helm only notes as INFO).
#[test]
fn helm_lint_passes() -> Result<()> {
    let out = std::process::Command::new(helm()?)
        .arg("lint")
        .arg(holdfast_manifest_checks::chart::chart())
        .arg("--strict")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.contains("0 chart(s) failed"),
        "helm lint --strict: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The chart is released with holdfast: its version, appVersion and default image tag are the
/// workspace's version (the tag the base's `images:` names too).
#[test]
fn the_chart_is_versioned_with_holdfast() -> Result<()> {
    let dir = holdfast_manifest_checks::chart::chart();
    let chart: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(dir.join("Chart.yaml"))?)?;
    let values: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(dir.join("values.yaml"))?)?;
    let version = env!("CARGO_PKG_VERSION");
    for (what, found) in [
        ("Chart.yaml version", &chart["version"]),
        ("Chart.yaml appVersion", &chart["appVersion"]),
        ("values.yaml image.tag", &values["image"]["tag"]),
    ] {
        ensure!(
            found.as_str() == Some(version),
            "{what} is {found:?}, holdfast is {version}"
        );
    }
    Ok(())
}

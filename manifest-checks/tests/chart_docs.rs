//! The chart's README is generated from its values.yaml (every key documented, helm-docs' `# --`
//! form), and values.yaml and values.schema.json describe the same keys with the same defaults.

use anyhow::{Context, Result, ensure};
use holdfast_manifest_checks::{
    chart::chart,
    chart_docs::{REGENERATE, readme, rows, schema_differences},
    load::{read, repo},
    report::assert_clean,
};

#[test]
fn the_committed_chart_readme_is_the_generated_one() -> Result<()> {
    let committed = read(&chart().join("README.md"))?;
    let generated = readme()?;
    let first_difference = committed
        .lines()
        .zip(generated.lines())
        .position(|(c, g)| c != g)
        .unwrap_or(committed.lines().count().min(generated.lines().count()));
    assert!(
        committed == generated,
        "charts/holdfast/README.md is not the one generated from values.yaml (first difference on \
         line {}): regenerate it from the workspace with\n    {REGENERATE}",
        first_difference + 1
    );
    Ok(())
}

#[test]
fn every_value_is_documented_and_in_the_schema() -> Result<()> {
    let rows = rows(&read(&chart().join("values.yaml"))?)?;
    assert!(rows.len() > 40, "only {} documented values", rows.len());
    let schema: serde_json::Value = serde_json::from_str(&read(&chart().join("values.schema.json"))?)?;
    assert_clean(
        "values.yaml against values.schema.json",
        &schema_differences(&rows, &schema),
    );
    Ok(())
}

/// The parser refuses a key without a description, and a documented map's keys are its default.
#[test]
fn an_undocumented_key_is_refused() -> Result<()> {
    let documented = rows("# -- the map\nm:\n  a: 1\n# section\ns:\n  # -- a leaf\n  b: [x]\n")?;
    let keys: Vec<&str> = documented.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["m", "s.b"]);
    assert!(rows("s:\n  # -- a leaf\n  b: 1\n  c: 2\n").is_err());
    Ok(())
}

/// Chart.yaml's Artifact Hub metadata says what the chart holds: the default image, the CRDs of
/// files/crds (the CRD templates), the workspace's license, and this version's CHANGELOG.md entries.
#[test]
fn the_artifact_hub_metadata_is_the_charts() -> Result<()> {
    let dir = chart();
    let chart: serde_yaml::Value = serde_yaml::from_str(&read(&dir.join("Chart.yaml"))?)?;
    let values: serde_yaml::Value = serde_yaml::from_str(&read(&dir.join("values.yaml"))?)?;
    let annotation = |key: &str| -> Result<serde_yaml::Value> {
        let text = chart["annotations"][key]
            .as_str()
            .with_context(|| format!("Chart.yaml has no annotation {key}"))?;
        Ok(serde_yaml::from_str(text)?)
    };
    for key in ["sources", "keywords"] {
        ensure!(
            chart[key].as_sequence().is_some_and(|s| !s.is_empty()),
            "Chart.yaml has no {key}"
        );
    }
    ensure!(
        chart["annotations"]["artifacthub.io/license"].as_str() == Some("Apache-2.0"),
        "artifacthub.io/license is not the workspace's Apache-2.0"
    );
    let image = format!(
        "{}:{}",
        values["image"]["repository"].as_str().unwrap_or_default(),
        values["image"]["tag"].as_str().unwrap_or_default()
    );
    let images = annotation("artifacthub.io/images")?;
    ensure!(
        images[0]["image"].as_str() == Some(image.as_str()),
        "artifacthub.io/images names {:?}, the values {image}",
        images[0]["image"]
    );
    let crds = annotation("artifacthub.io/crds")?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir.join("files/crds"))? {
        let crd: serde_yaml::Value = serde_yaml::from_str(&read(&entry?.path())?)?;
        files.push((
            crd["metadata"]["name"].as_str().unwrap_or_default().to_string(),
            crd["spec"]["names"]["kind"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ));
    }
    let listed: Vec<(String, String)> = crds
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["kind"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    files.sort();
    ensure!(
        listed == files,
        "artifacthub.io/crds lists {listed:?}, files/crds holds {files:?}"
    );

    // The changes: entries of CHANGELOG.md's section for this version (Unreleased until it has one).
    let changelog = read(&repo().join("CHANGELOG.md"))?;
    let version = chart["version"].as_str().unwrap_or_default();
    let heading = if changelog.contains(&format!("## [{version}]")) {
        format!("## [{version}]")
    } else {
        "## [Unreleased]".to_string()
    };
    let section: String = changelog
        .split("\n## ")
        .find(|s| format!("## {s}").starts_with(&heading))
        .with_context(|| format!("CHANGELOG.md has no {heading}"))?
        .to_string();
    let changes = annotation("artifacthub.io/changes")?;
    for change in changes.as_sequence().into_iter().flatten() {
        let kind = change["kind"].as_str().unwrap_or_default();
        let description = change["description"].as_str().unwrap_or_default();
        let mut title = kind.to_string();
        title[..1].make_ascii_uppercase();
        let under = section
            .split("\n### ")
            .find(|s| s.starts_with(&title))
            .with_context(|| format!("CHANGELOG.md's {heading} has no ### {title}"))?;
        ensure!(
            under.contains(&format!("- {description}\n")),
            "CHANGELOG.md's {heading}, {title}, lacks the chart's change {description:?}"
        );
    }
    Ok(())
}

/// LICENSE is the Apache License 2.0 the workspace declares, and the READMEs link it and the
/// changelog.
#[test]
fn the_project_files_are_there_and_linked() -> Result<()> {
    let license = read(&repo().join("LICENSE"))?;
    ensure!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
            && license.contains("END OF TERMS AND CONDITIONS")
            && license.lines().count() == 202,
        "LICENSE is not the Apache License 2.0 text"
    );
    ensure!(read(&repo().join("CHANGELOG.md"))?.contains("Keep a Changelog"));
    for (readme, prefix) in [
        (repo().join("README.md"), ""),
        (chart().join("README.md"), "../../"),
    ] {
        let text = read(&readme)?;
        for target in ["LICENSE", "CHANGELOG.md"] {
            ensure!(
                text.contains(&format!("]({prefix}{target})")),
                "{} does not link {target}",
                readme.display()
            );
        }
    }
    let security = read(&repo().join("SECURITY.md"))?;
    let reporting = security.find("## Reporting a vulnerability");
    ensure!(
        reporting.is_some() && reporting < security.find("## What is installed"),
        "SECURITY.md does not open with how to report a vulnerability"
    );
    Ok(())
}

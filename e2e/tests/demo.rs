//! `make demo` as a user runs it, so the README's first command stays true: `scripts/up.sh`
//! starts the local environment in a state directory of its own, `scripts/demo.sh` pushes the
//! demo images, applies `examples/` with kubectl and prints what holdfast did, and
//! `scripts/down.sh` stops it whatever happened. The output must show every example reference
//! pinned to a digest with its original recorded, the kpack Image owned by its BuildWorkload and
//! CFApp, and the pinned App reconciled by the real kapp-controller.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context, Result, ensure};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone("make_demo_shows_what_holdfast_did", || async {
        tokio::task::spawn_blocking(demo).await?
    })
}

fn demo() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let state = tempfile::tempdir()?;
    let up = script(&repo, "up.sh", state.path())?;
    let shown = up.and_then(|_| script(&repo, "demo.sh", state.path())?);
    let down = script(&repo, "down.sh", state.path())?;
    let shown = shown?;
    down?;
    check(&shown)
}

/// Runs `scripts/NAME STATE` from the repository; `Err` (inside) with its output when it fails.
fn script(repo: &Path, name: &str, state: &Path) -> Result<Result<String>> {
    let out = Command::new(repo.join("scripts").join(name))
        .arg(state)
        .current_dir(repo)
        .output()
        .with_context(|| format!("running scripts/{name}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("$ scripts/{name}\n{text}{}", String::from_utf8_lossy(&out.stderr));
    Ok(if out.status.success() {
        Ok(text)
    } else {
        Err(anyhow::anyhow!("scripts/{name} failed ({})", out.status))
    })
}

/// The demo's output, as the README shows it.
fn check(shown: &str) -> Result<()> {
    let sections = sections(shown);
    for object in [
        "App demo-app",
        "App demo-deployed",
        "PackageRepository demo-repo",
        "Package app.demo.holdfast.dev.1.0.0",
    ] {
        let lines = sections
            .get(object)
            .with_context(|| format!("{object} is not shown"))?;
        ensure!(
            lines
                .iter()
                .any(|l| l.trim_start().starts_with("-> ") && l.contains("@sha256:")),
            "{object}: no reference pinned to a digest: {lines:?}"
        );
        ensure!(
            lines
                .iter()
                .any(|l| l.trim_start().starts_with("holdfast.dev/original-refs: {")),
            "{object}: no original-refs: {lines:?}"
        );
    }
    let image = sections
        .get("Image 5b2f6c1e-3d4a-4e8b-9f70-1a2b3c4d5e6f")
        .context("the kpack Image is not shown")?;
    ensure!(
        image.iter().any(|l| l.trim()
            == "ownerReferences: BuildWorkload/0c9d8e7f-6a5b-4c3d-8e2f-1a0b9c8d7e6f, CFApp/5b2f6c1e-3d4a-4e8b-9f70-1a2b3c4d5e6f"),
        "the Image's owners: {image:?}"
    );
    ensure!(
        shown
            .lines()
            .any(|l| l.contains("/demo/app-config@sha256:") && l.ends_with("->  Reconcile succeeded")),
        "demo-deployed is not shown pinned and reconciled"
    );
    ensure!(
        shown.lines().any(|l| l.starts_with("deployed: ConfigMap demo ")),
        "the deployed ConfigMap is not shown"
    );
    Ok(())
}

/// The lines under each object's header (`Kind name`, unindented) in `demo.sh`'s listing.
fn sections(shown: &str) -> BTreeMap<String, Vec<String>> {
    let mut sections = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in shown.lines() {
        if line.starts_with("  ") {
            if let Some(object) = &current {
                sections
                    .entry(object.clone())
                    .or_insert_with(Vec::new)
                    .push(line.to_owned());
            }
        } else {
            current = Some(line.to_owned());
            sections.entry(line.to_owned()).or_insert_with(Vec::new);
        }
    }
    sections
}

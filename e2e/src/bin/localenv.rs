//! `make up`/`make demo` for people: the harness's control plane, registry and the real
//! kapp-controller as a long-running local environment, plus the demo's images.
//!
//! `holdfast-localenv up --state-dir .holdfast` boots, writes `<state>/kubeconfig` and
//! `<state>/env` (shell exports, written last: its presence means ready) and runs until SIGTERM or
//! SIGINT, then stops everything it started. `holdfast-localenv seed --registry HOST:PORT`
//! pushes the images the examples refer to; `holdfast-localenv show FILE...` prints, for each
//! object in the files, its fetch references, owners and annotations as written and as stored.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use holdfast_e2e::{Env, images, installed, objects};
use kube::ResourceExt;
use serde_json::Value;
use tokio::signal::unix::{SignalKind, signal};

#[tokio::main]
async fn main() -> Result<()> {
    holdfast_e2e::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("up") => {
            up(
                &state_dir(&args)?,
                !args.iter().any(|a| a == "--without-holdfast"),
                !args.iter().any(|a| a == "--without-kapp-controller"),
            )
            .await
        }
        Some("show") => show(&args[1..]).await,
        Some("seed") => seed(&flag(&args, "--registry").context("seed needs --registry HOST:PORT")?).await,
        _ => {
            bail!(
                "usage: holdfast-localenv up [--state-dir DIR] [--without-holdfast] [--without-kapp-controller] | seed --registry HOST:PORT | show FILE..."
            )
        }
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn state_dir(args: &[String]) -> Result<PathBuf> {
    let dir = PathBuf::from(flag(args, "--state-dir").unwrap_or_else(|| ".holdfast".into()));
    std::fs::create_dir_all(&dir)?;
    Ok(std::fs::canonicalize(dir)?)
}

/// `holdfast`: run holdfast-webhook and holdfast-controller as host processes (`make up`); without
/// them, `make cluster` installs holdfast onto its real node from the chart (scripts/install.sh),
/// which adds the admin addresses to `<state>/env`. `kapp_controller`: run the real kapp-controller
/// as host processes; without them, `make cluster` runs it as a pod on its real node
/// (scripts/kapp-controller.sh), as a cluster does.
async fn up(state: &Path, holdfast: bool, kapp_controller: bool) -> Result<()> {
    let env_file = state.join("env");
    let _ = std::fs::remove_file(&env_file);
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;

    let mut env = Env::start_local().await?;
    // The controller catches up on objects admitted unpinned and follows moved tags.
    let webhook = if holdfast {
        Some(
            installed::start(
                &mut env,
                installed::Options {
                    scope: None,
                    controller: Some(vec!["--refresh-seconds=30".into()]),
                    webhook: Vec::new(),
                },
            )
            .await?,
        )
    } else {
        None
    };
    // The real kapp-controller (and its packaging API) reconciles what the demo applies.
    if kapp_controller {
        env.kapp_controller().await?;
    }
    let kubeconfig = state.join("kubeconfig");
    std::fs::copy(env.kubeconfig(), &kubeconfig)?;
    let pids: Vec<String> = env
        .pids()
        .iter()
        .map(|(name, pid)| format!("{name}={pid}"))
        .collect();
    std::fs::write(state.join("pids"), pids.join("\n") + "\n")?;
    let mut exports = holdfast_e2e::cluster::state_exports(&env, &kubeconfig);
    if let Some(webhook) = &webhook {
        exports.push_str(&format!(
            "export HOLDFAST_WEBHOOK_ADMIN=http://{}\nexport HOLDFAST_CONTROLLER_ADMIN=http://{}\n",
            webhook.admin,
            webhook.controller_admin.as_deref().unwrap_or_default(),
        ));
    }
    let partial = state.join("env.partial");
    std::fs::write(&partial, exports)?;
    std::fs::rename(&partial, &env_file)?;
    match &webhook {
        Some(webhook) => println!(
            "holdfast local environment ready in {:.1} s: kube-apiserver via {}, registry at {}, holdfast-webhook at {} (admin {})",
            env.boot_time().as_secs_f64(),
            kubeconfig.display(),
            env.registry(),
            webhook.addr,
            webhook.admin
        ),
        None => println!(
            "holdfast local environment ready in {:.1} s: kube-apiserver via {}, registry at {}, holdfast not started (make cluster installs it)",
            env.boot_time().as_secs_f64(),
            kubeconfig.display(),
            env.registry(),
        ),
    }

    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    let _ = std::fs::remove_file(&env_file);
    drop(env);
    let _ = std::fs::remove_file(state.join("pids"));
    println!("holdfast local environment stopped");
    Ok(())
}

/// The tags the examples use: `demo/app-config:1.0.0`, `demo/app-bundle` at several semver tags
/// (so `tagSelection` has something to choose from) and `demo/repo-bundle:1.0.0`.
async fn seed(registry: &str) -> Result<()> {
    let config = images::Image::with_files(&[(
        "config/app.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: demo}\n",
    )])?;
    let digest = images::push(registry, "demo/app-config", "1.0.0", &config).await?;
    println!("pushed {registry}/demo/app-config:1.0.0 {digest}");
    let locked = [format!("{registry}/demo/app-config@{digest}")];
    for version in ["0.9.0", "1.0.0", "1.1.0", "1.2.0-rc.1", "2.0.0"] {
        let bundle = images::Image::bundle(
            &[("config/version.yml", format!("version: {version}\n").as_bytes())],
            &locked,
        )?;
        let digest = images::push(registry, "demo/app-bundle", version, &bundle).await?;
        println!("pushed {registry}/demo/app-bundle:{version} {digest}");
    }
    let repo = images::Image::bundle(&[("packages/app.yml", b"# package manifests\n")], &locked)?;
    let digest = images::push(registry, "demo/repo-bundle", "1.0.0", &repo).await?;
    println!("pushed {registry}/demo/repo-bundle:1.0.0 {digest}");
    Ok(())
}

/// Fetch references as written (the file) and as stored (the cluster, after admission).
async fn show(files: &[String]) -> Result<()> {
    let client = kube::Client::try_default().await?;
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        for written in objects::parse_documents(&text)? {
            let kind = written.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
            if kind == "Namespace" {
                continue;
            }
            let api = objects::api_for(&client, &written, None).await?;
            let stored = api.get(&written.name_any()).await?;
            println!("{kind} {}", written.name_any());
            let (before, after) = (fetch_refs(&written.data), fetch_refs(&stored.data));
            for (path, was) in &before {
                match after.iter().find(|(p, _)| p == path) {
                    Some((_, now)) if now == was => println!("  {path}: {was}  (unchanged)"),
                    Some((_, now)) => println!("  {path}: {was}\n      -> {now}"),
                    None => println!("  {path}: {was}\n      -> (removed)"),
                }
            }
            let owners: Vec<String> = stored
                .owner_references()
                .iter()
                .map(|o| format!("{}/{}", o.kind, o.name))
                .collect();
            if !owners.is_empty() {
                println!("  ownerReferences: {}", owners.join(", "));
            }
            if let Some(original) = stored.annotations().get("holdfast.dev/original-refs") {
                println!("  holdfast.dev/original-refs: {original}");
            }
        }
    }
    Ok(())
}

/// `(json pointer, value)` of every OCI reference and tagSelection in a fetch spec, in document order.
fn fetch_refs(data: &Value) -> Vec<(String, String)> {
    fn walk(value: &Value, path: &str, parent: &str, out: &mut Vec<(String, String)>) {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    let here = format!("{path}/{key}");
                    match (parent, key.as_str(), child) {
                        ("image", "url", Value::String(s)) | ("imgpkgBundle", "image", Value::String(s)) => {
                            out.push((here, s.clone()))
                        }
                        (_, "tagSelection", sel) => out.push((here, sel.to_string())),
                        _ => walk(child, &here, key, out),
                    }
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, &format!("{path}/{i}"), parent, out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Some(spec) = data.get("spec") {
        walk(spec, "/spec", "", &mut out);
    }
    out
}

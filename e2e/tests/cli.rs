//! `kubectl holdfast`, run as kubectl runs a plugin (`kubectl holdfast …`, found on `PATH`),
//! against the real `holdfast-webhook` and `holdfast-controller` beside the local control plane:
//! each subcommand's output and exit status.
//!
//! - `explain` of a pinned App prints its digest and its cache entry (with the status the
//!   controller wrote); of an App in an ignored namespace, says so;
//! - `kubectl get digestcacheentries -o yaml` shows `status.conditions`;
//! - `refresh` goes through the controller: Checked, then Moved (the App is re-pinned), then,
//!   with the registry down, Failed; `status` then exits 1 with the entry serving stale;
//! - `unpin` restores the tag as written and opts the App out;
//! - `pin -f` prints a file pinned from the cluster's cache, or from the registry;
//! - `completion` prints a script.
//!
//! An environment of its own (the processes are the environment's children).

use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use holdfast_cache::{CacheKey, Scope, cluster_store};
use holdfast_e2e::{
    Env, images,
    installed::{self, KUBECTL_PLUGIN},
    objects::{api_for, create_all},
    wait,
};
use holdfast_registry::Reference;
use kube::api::DynamicObject;
use serde_json::Value;

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone("kubectl_holdfast_answers_an_operator", kubectl_holdfast)
}

/// `kubectl holdfast ARGS`: exit status and standard output (standard error appended).
fn plugin(env: &Env, args: &[&str]) -> Result<(i32, String)> {
    let binary = installed::binary(KUBECTL_PLUGIN)?;
    let dir = binary.parent().context("the plugin has no directory")?;
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let out = env
        .kubectl()
        .arg("holdfast")
        .args(args)
        .env("PATH", path)
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // What an operator would see (the completion script only in part).
    let shown: String = text.lines().take(40).collect::<Vec<_>>().join("\n");
    eprintln!(
        "$ kubectl holdfast {}  (exit {:?})\n{shown}",
        args.join(" "),
        out.status.code()
    );
    Ok((out.status.code().unwrap_or(-1), text))
}

fn app_yaml(name: &str, url: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: none\n  fetch: [{{image: {{url: {url}}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

fn fetch_url(app: &DynamicObject) -> String {
    app.data["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The entry of an anonymous tag, once the controller wrote its status with `condition`.
async fn entry_with(
    env: &Env,
    url: &str,
    condition: &'static str,
    status: &'static str,
) -> Result<DynamicObject> {
    let key = CacheKey::tag(&Reference::parse(url)?, Scope::Anonymous);
    let api = cluster_store::api(env.client().await?, installed::NAMESPACE);
    let name = cluster_store::object_name(&key);
    wait::until(&api, &name, move |o: Option<&DynamicObject>| {
        o.and_then(|o| o.data["status"]["conditions"].as_array().cloned())
            .is_some_and(|c| c.iter().any(|c| c["type"] == condition && c["status"] == status))
    })
    .await?
    .with_context(|| format!("no entry {name} for {url}"))
}

async fn kubectl_holdfast() -> Result<()> {
    let mut env = Env::start().await?;
    if env.is_existing_cluster() {
        eprintln!("skipped: the processes run only beside the local control plane");
        return Ok(());
    }
    // Started: a registry the test stops for an outage.
    let mut flaky = env.spare_registry().await?;
    let holdfast = installed::start_with_registry(&mut env, &flaky.addr).await?;
    let client = env.client().await?;
    let registry = env.registry().to_owned();
    let image = images::LayeredImage::new().layer(&[(
        "config.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cli}\n",
    )])?;
    let first = image.push(&registry, "cli/app", "1.0.0").await?;
    create_all(
        &client,
        "default",
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: cli-team}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: cli-ignored, labels: {holdfast.dev/ignore: \"true\"}}\n",
    )
    .await?;
    let url = format!("{registry}/cli/app:1.0.0");
    let created = create_all(&client, "cli-team", &app_yaml("pinned", &url)).await?;
    let app = created.first().context("no App created")?;
    ensure!(
        fetch_url(app) == format!("{registry}/cli/app@{first}"),
        "not pinned at admission: {}",
        fetch_url(app)
    );
    let apps = api_for(&client, app, Some("cli-team")).await?;
    entry_with(&env, &url, "Resolved", "True").await?;

    // explain: the digest and the entry; exit 0.
    let (code, out) = plugin(&env, &["explain", "app/pinned", "-n", "cli-team"])?;
    ensure!(code == 0, "explain of a pinned App exited {code}");
    let entry = cluster_store::object_name(&CacheKey::tag(&Reference::parse(&url)?, Scope::Anonymous));
    for wanted in [
        "app/pinned -n cli-team: pinned".to_owned(),
        format!("written:  {url}"),
        format!("pinned:   {first}, by holdfast"),
        format!("entry:    holdfast-system/{entry}"),
        "state: fresh".to_owned(),
    ] {
        ensure!(out.contains(&wanted), "explain does not say {wanted:?}");
    }
    // kubectl get shows the status the controller wrote.
    let yaml = env
        .kubectl()
        .args([
            "get",
            "digestcacheentries",
            "-n",
            installed::NAMESPACE,
            "-o",
            "yaml",
        ])
        .output()?;
    let yaml = String::from_utf8(yaml.stdout)?;
    for wanted in [
        "conditions:",
        "type: Resolved",
        "type: Stale",
        "type: Mirrored",
        "usedBy: 1",
        "observedDigest:",
    ] {
        ensure!(
            yaml.contains(wanted),
            "kubectl get digestcacheentries -o yaml shows no {wanted:?}:\n{yaml}"
        );
    }

    // An App in an ignored namespace: not pinned, and explain says why; nothing to attend to.
    create_all(&client, "cli-ignored", &app_yaml("ignored", &url)).await?;
    let (code, out) = plugin(&env, &["explain", "app/ignored", "-n", "cli-ignored"])?;
    ensure!(code == 0, "explain of an ignored App exited {code}");
    ensure!(
        out.contains("in a namespace holdfast ignores") && out.contains("holdfast.dev/ignore"),
        "explain does not say the namespace is ignored"
    );
    ensure!(
        out.contains(&format!("stored:   {url}")),
        "the ignored App was pinned"
    );

    // status: one pinned; exit 0.
    let (code, out) = plugin(&env, &["status", "-n", "cli-team"])?;
    ensure!(code == 0, "status exited {code} with everything pinned");
    ensure!(
        out.lines()
            .any(|l| l.split_whitespace().take(2).eq(["cli-team", "1"])),
        "status does not count the pinned App"
    );

    // refresh through the controller: the tag has not moved, then it has.
    let (code, out) = plugin(&env, &["refresh", "app/pinned", "-n", "cli-team"])?;
    ensure!(
        code == 0 && out.contains(&format!("checked: the tag still holds {first}")),
        "refresh did not check ({code})"
    );
    let moved = images::LayeredImage::new()
        .layer(&[(
            "config.yml",
            b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cli-2}\n",
        )])?
        .push(&registry, "cli/app", "1.0.0")
        .await?;
    let (code, out) = plugin(&env, &["refresh", &url])?;
    ensure!(
        code == 0 && out.contains(&format!("moved: now {moved}")),
        "refresh did not see the tag move ({code})"
    );
    let repinned = format!("{registry}/cli/app@{moved}");
    wait::until(&apps, "pinned", |o: Option<&DynamicObject>| {
        o.is_some_and(|o| fetch_url(o) == repinned)
    })
    .await?;

    // The registry goes down: the refresh fails, the entry serves stale, status exits 1.
    let flaky_url = format!("{}/cli/flaky:1.0.0", flaky.addr);
    let flaky_digest = image.push(&flaky.addr, "cli/flaky", "1.0.0").await?;
    let created = create_all(&client, "cli-team", &app_yaml("flaky", &flaky_url)).await?;
    ensure!(
        created.first().map(fetch_url) == Some(format!("{}/cli/flaky@{flaky_digest}", flaky.addr)),
        "the flaky App was not pinned at admission"
    );
    entry_with(&env, &flaky_url, "Resolved", "True").await?;
    flaky.stop();
    let (code, out) = plugin(&env, &["refresh", "app/flaky", "-n", "cli-team"])?;
    ensure!(
        code == 1 && out.contains("failed: the registry did not answer"),
        "refresh with the registry down exited {code}"
    );
    entry_with(&env, &flaky_url, "Stale", "True").await?;
    let (code, out) = plugin(&env, &["status", "-n", "cli-team"])?;
    ensure!(code == 1, "status exited {code} while an entry serves stale");
    ensure!(
        out.contains("Entries serving stale: 1") && out.contains("served until"),
        "status does not show the stale entry and its limit"
    );
    let (code, out) = plugin(&env, &["explain", "app/flaky", "-n", "cli-team"])?;
    ensure!(
        code == 1 && out.contains("pinned from a stale entry"),
        "explain of the stale App exited {code}"
    );

    // unpin: the tag as written, the record gone, opted out; a second unpin changes nothing.
    let (code, _) = plugin(&env, &["unpin", "app/pinned", "-n", "cli-team"])?;
    ensure!(code == 0, "unpin exited {code}");
    let unpinned = apps.get("pinned").await?;
    ensure!(fetch_url(&unpinned) == url, "unpin left {}", fetch_url(&unpinned));
    ensure!(
        unpinned
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("holdfast.dev/pin"))
            .map(String::as_str)
            == Some("disabled"),
        "unpin did not opt the App out"
    );
    ensure!(
        unpinned
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("holdfast.dev/original-refs")),
        "unpin left holdfast.dev/original-refs"
    );
    let (_, out) = plugin(&env, &["unpin", "app/pinned", "-n", "cli-team"])?;
    ensure!(
        out.contains("already unpinned and opted out"),
        "a second unpin changed something"
    );

    // pin -f: from the cluster's cache, then from the registry; a tag the cache lacks exits 1.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("app.yaml");
    let fresh_url = format!("{registry}/cli/ci:2.0.0");
    let ci = image.push(&registry, "cli/ci", "2.0.0").await?;
    std::fs::write(
        &file,
        format!(
            "{}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: passes}}\n",
            app_yaml("ci", &url)
        ),
    )?;
    let (code, out) = plugin(&env, &["pin", "-f", &file.to_string_lossy()])?;
    ensure!(code == 0, "pin -f from the cluster's cache exited {code}");
    let pinned_docs = documents(&out)?;
    ensure!(
        pinned_docs[0]["spec"]["fetch"][0]["image"]["url"] == format!("{registry}/cli/app@{moved}")
            && pinned_docs[0]["metadata"]["annotations"]["holdfast.dev/original-refs"].is_string()
            && pinned_docs[1]["metadata"]["name"] == "passes",
        "pin -f from the cluster did not pin the App to the cached digest"
    );
    std::fs::write(&file, app_yaml("ci", &fresh_url))?;
    let (code, out) = plugin(&env, &["pin", "-f", &file.to_string_lossy()])?;
    ensure!(
        code == 1 && out.contains("not in the cluster's digest cache"),
        "pin -f of an uncached tag exited {code}"
    );
    let (code, out) = plugin(
        &env,
        &[
            "pin",
            "-f",
            &file.to_string_lossy(),
            "--registry",
            &format!("--insecure-registry={registry}"),
        ],
    )?;
    ensure!(
        code == 0 && out.contains(&format!("{registry}/cli/ci@{ci}")),
        "pin -f --registry exited {code}"
    );

    let (code, out) = plugin(&env, &["completion", "bash"])?;
    ensure!(
        code == 0 && out.contains("complete"),
        "completion bash exited {code}"
    );
    let (code, _) = plugin(&env, &["explain", "deployment/x"])?;
    ensure!(code == 2, "a kind holdfast does not pin exited {code}, not 2");
    drop(holdfast);
    Ok(())
}

fn documents(text: &str) -> Result<Vec<Value>> {
    use serde::Deserialize as _;
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).map_err(Into::into))
        .collect()
}

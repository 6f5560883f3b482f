//! EMULATOR of a kpack build pod's containers — the CNB lifecycle's steps and kpack's completion
//! step — because no container runs here (kwok runs pods without them). Everything around them is
//! real: kpack generates the pod, kube-scheduler places it, kwok runs it as a kubelet would, and
//! kpack's own build reconciler reads the result and marks the Build succeeded.
//!
//! For each running build pod (label `kpack.io/build`), it does what those containers leave
//! behind, reading only the pod as they would (their env and args):
//! - export: pushes an app image to the build's tags (`IMAGE_TAG` of the `prepare` step, the
//!   `-tag=` args of `analyze`) with the labels the lifecycle writes and kpack and Korifi read
//!   (`io.buildpacks.build.metadata` with a `web` process, `io.buildpacks.lifecycle.metadata`,
//!   `io.buildpacks.stack.id`), read from the builder image (`analyze`'s image) and the run image
//!   (`RUN_IMAGE`); its one layer names the source it was built from;
//! - completion: writes kpack's build metadata (gzip, base64: `cnb.CompressBuildMetadata`) as the
//!   `completion` container's termination message. Here it goes to the pod annotation
//!   [`TERMINATION_MESSAGE`], which kwok's `pod-complete-with-message` stage
//!   (`e2e/kwok/pod-stages.yaml`) copies into that container's terminated state when it completes
//!   the pod, as a kubelet copies a container's termination-message file.
//!
//! Not emulated: a run-image-based app image (it has one layer, not the run image's), caches,
//! failures (a pod it cannot serve stays Running; [`BuildSteps::errors`] says why).

use std::{
    collections::HashSet,
    io::Write as _,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use futures::StreamExt as _;
use holdfast_registry::Reference;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{WatchStreamExt as _, watcher},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::images::{LayeredImage, fetch_config, fetch_raw};

/// The pod annotation that carries the completion step's termination message to kwok.
pub const TERMINATION_MESSAGE: &str = "e2e.holdfast.dev/termination-message";
/// The label kpack puts on build pods.
const BUILD_POD_LABEL: &str = "kpack.io/build";
const BUILDER_METADATA: &str = "io.buildpacks.builder.metadata";
const STACK_ID: &str = "io.buildpacks.stack.id";

/// The emulated containers of every build pod, until stopped.
#[derive(Debug)]
pub struct BuildSteps {
    cancel: CancellationToken,
    errors: Arc<Mutex<Vec<String>>>,
}

impl BuildSteps {
    pub fn start(client: Client) -> Self {
        let cancel = CancellationToken::new();
        let errors = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(run(client, cancel.clone(), errors.clone()));
        Self { cancel, errors }
    }

    /// Why pods were left without a result, newest last.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().map(|e| e.clone()).unwrap_or_default()
    }

    pub fn stop(&mut self) {
        self.cancel.cancel();
    }
}

impl Drop for BuildSteps {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn run(client: Client, cancel: CancellationToken, errors: Arc<Mutex<Vec<String>>>) {
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default().labels(BUILD_POD_LABEL);
    let mut events = std::pin::pin!(watcher(pods, config).default_backoff().applied_objects());
    let mut done = HashSet::new();
    loop {
        let pod = tokio::select! {
            () = cancel.cancelled() => return,
            next = events.next() => match next {
                Some(Ok(pod)) => pod,
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "build-pod watch (retried)");
                    continue;
                }
                None => return,
            },
        };
        let uid = pod.uid().unwrap_or_default();
        if !wants_steps(&pod) || done.contains(&uid) {
            continue;
        }
        let name = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
        match run_steps(&client, &pod).await {
            Ok(()) => {
                done.insert(uid);
            }
            Err(e) => {
                tracing::warn!(pod = %name, error = %format!("{e:#}"), "build steps failed");
                if let Ok(mut errors) = errors.lock() {
                    errors.push(format!("{name}: {e:#}"));
                }
            }
        }
    }
}

/// A running build pod its steps have not finished yet (its containers "run" now).
fn wants_steps(pod: &Pod) -> bool {
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    running
        && pod.metadata.deletion_timestamp.is_none()
        && !pod.annotations().contains_key(TERMINATION_MESSAGE)
}

async fn run_steps(client: &Client, pod: &Pod) -> Result<()> {
    let spec = pod.spec.as_ref().context("pod without spec")?;
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let step = |name: &str| {
        init.iter()
            .find(|c| c.name == name)
            .with_context(|| format!("no {name} step"))
    };
    let prepare = step("prepare")?;
    let analyze = step("analyze")?;
    let tag = env(prepare, "IMAGE_TAG")?;
    let run_image = Reference::parse(&env(prepare, "RUN_IMAGE")?)?;
    let builder = Reference::parse(analyze.image.as_deref().context("analyze step without image")?)?;
    let source = ["REGISTRY_IMAGE", "GIT_URL", "BLOB_URL"]
        .iter()
        .find_map(|n| env(prepare, n).ok())
        .unwrap_or_default();

    let builder_config =
        fetch_config(builder.registry(), &builder.repository(), builder.identifier()).await?;
    let labels = &builder_config["config"]["Labels"];
    let stack_id = labels[STACK_ID].as_str().context("builder without a stack id")?;
    let builder_md: Value = serde_json::from_str(
        labels[BUILDER_METADATA]
            .as_str()
            .context("builder without metadata")?,
    )?;
    let buildpacks: Vec<Value> = builder_md["buildpacks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| json!({"id": b["id"], "version": b["version"], "homepage": b["homepage"]}))
        .collect();
    let lifecycle_version = builder_md["lifecycle"]["version"].as_str().unwrap_or_default();
    let (_, run_manifest) = fetch_raw(
        run_image.registry(),
        &run_image.repository(),
        "manifests",
        run_image.identifier(),
    )
    .await?;
    let run_manifest: Value = serde_json::from_slice(&run_manifest)?;
    let top_layer = run_manifest["layers"]
        .as_array()
        .and_then(|l| l.last())
        .and_then(|l| l["digest"].as_str())
        .unwrap_or_default();

    let app = LayeredImage::new()
        .layer(&[("workspace/built-from", format!("{source}\n").as_bytes())])?
        .label(STACK_ID, stack_id)
        .json_label(
            "io.buildpacks.build.metadata",
            &json!({
                "processes": [{"type": "web", "command": "/workspace/start", "args": [], "direct": false, "buildpackID": buildpacks.first().map(|b| b["id"].clone())}],
                "buildpacks": buildpacks,
                "launcher": {"version": lifecycle_version, "source": {}},
            }),
        )?
        .json_label(
            "io.buildpacks.lifecycle.metadata",
            &json!({
                "runImage": {"topLayer": top_layer, "reference": run_image.normalized()},
                "stack": {"runImage": {"image": run_image.name()}},
            }),
        )?;
    let mut tags = vec![tag];
    tags.extend(
        analyze
            .args
            .iter()
            .flatten()
            .filter_map(|a| a.strip_prefix("-tag=").map(String::from)),
    );
    let mut latest = String::new();
    for tag in &tags {
        let reference = Reference::parse(tag)?;
        let digest = app
            .push(
                reference.registry(),
                &reference.repository(),
                reference.identifier(),
            )
            .await
            .with_context(|| format!("exporting to {tag}"))?;
        if latest.is_empty() {
            latest = format!("{}@{digest}", reference.name());
        }
    }

    let metadata = json!({
        "buildpackMetadata": buildpacks,
        "latestCacheImage": "",
        "latestImage": latest,
        "stackID": stack_id,
        "stackRunImage": format!("{}@{}", run_image.name(), run_image.identifier()),
        "lifecycleVersion": lifecycle_version,
    });
    let message = compress(&metadata)?;
    let patch = json!({"metadata": {"annotations": {TERMINATION_MESSAGE: message}}});
    let pods: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    pods.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("annotating the pod with the termination message")?;
    Ok(())
}

fn env(container: &Container, name: &str) -> Result<String> {
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.clone())
        .with_context(|| format!("step {} has no {name}", container.name))
}

/// kpack's `CompressBuildMetadata`: gzip, then base64; at most 4096 bytes (a termination
/// message's limit).
fn compress(metadata: &Value) -> Result<String> {
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gzip.write_all(&serde_json::to_vec(metadata)?)?;
    let encoded = base64::engine::general_purpose::STANDARD.encode(gzip.finish()?);
    if encoded.len() > 4096 {
        bail!(
            "build metadata too large for a termination message ({} bytes)",
            encoded.len()
        );
    }
    Ok(encoded)
}

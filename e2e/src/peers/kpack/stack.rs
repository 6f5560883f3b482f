//! The smallest images kpack builds a builder from, pushed to the local registry (no buildpack,
//! stack or lifecycle image can be pulled here), and the cluster objects naming them: a
//! ClusterLifecycle, ClusterStack, ClusterStore and the ClusterBuilder every test Image (and
//! Korifi) builds with. Each image carries exactly the labels, environment and layers kpack reads
//! (`pkg/cnb`: remote_lifecycle_reader.go, remote_stack_reader.go, remote_store_reader.go,
//! builder_builder.go; `pkg/buildpod/generator.go`); their files are stand-ins, since no
//! container runs them.

use anyhow::{Context, Result};
use serde_json::json;

use crate::images::LayeredImage;

/// The stack id Korifi's default ClusterStack uses.
pub const STACK_ID: &str = "io.buildpacks.stacks.jammy";
pub const BUILDPACK_ID: &str = "holdfast-e2e/static";
pub const BUILDPACK_VERSION: &str = "0.1.0";
/// A lifecycle release whose platform APIs kpack 0.17 can drive (0.7–0.9).
pub const LIFECYCLE_VERSION: &str = "0.20.5";
/// kpack's default ClusterLifecycle name (`DefaultLifecycleName`).
pub const LIFECYCLE: &str = "default-lifecycle";
pub const CLUSTER_STACK: &str = "e2e-stack";
pub const CLUSTER_STORE: &str = "e2e-store";
pub const CLUSTER_BUILDER: &str = "e2e-cluster-builder";
/// The builds' user and group (paketo's jammy stacks use the same).
const CNB_USER_ID: &str = "1002";
const CNB_GROUP_ID: &str = "1000";
const REPOSITORY: &str = "peers/kpack";

const STAND_IN: &[u8] = b"#!/bin/sh\n# holdfast e2e: a stand-in, never run (no container runs here)\n";

/// Pushes the images to `registry` and returns the cluster objects (YAML) that name them, as
/// `cluster_registry` (the registry's address for the cluster) spells it. The ClusterBuilder
/// pushes its builder image with the credentials of `service_account` (`namespace/name`).
/// `lifecycle_config_map`: also the ConfigMap `kpack/lifecycle-image` naming the lifecycle, where
/// kpack before v0.17 reads it (`pkg/config/lifecycle_provider.go`; v0.17 reads the
/// ClusterLifecycle).
pub async fn push(
    registry: &str,
    cluster_registry: &str,
    service_account: (&str, &str),
    lifecycle_config_map: bool,
) -> Result<String> {
    let lifecycle = lifecycle_image()?
        .push(registry, &format!("{REPOSITORY}/lifecycle"), LIFECYCLE_VERSION)
        .await?;
    let build = stack_image("build")?
        .env("CNB_USER_ID", CNB_USER_ID)
        .env("CNB_GROUP_ID", CNB_GROUP_ID)
        .push(registry, &format!("{REPOSITORY}/build-jammy"), "1")
        .await?;
    let run = stack_image("run")?
        .push(registry, &format!("{REPOSITORY}/run-jammy"), "1")
        .await?;
    let buildpackage = buildpackage()?
        .push(registry, &format!("{REPOSITORY}/buildpackage"), BUILDPACK_VERSION)
        .await?;
    let at = |repo: &str, digest: &str| format!("{cluster_registry}/{REPOSITORY}/{repo}@{digest}");
    let (sa_namespace, sa_name) = service_account;
    let config_map = if lifecycle_config_map {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: lifecycle-image, namespace: {}}}\ndata: {{image: {}}}\n---\n",
            super::NAMESPACE,
            at("lifecycle", &lifecycle)
        )
    } else {
        String::new()
    };
    Ok(config_map
        + &format!(
            "apiVersion: kpack.io/v1alpha2
kind: ClusterLifecycle
metadata: {{name: {LIFECYCLE}}}
spec: {{image: {lifecycle}}}
---
apiVersion: kpack.io/v1alpha2
kind: ClusterStack
metadata: {{name: {CLUSTER_STACK}}}
spec:
  id: {STACK_ID}
  buildImage: {{image: {build}}}
  runImage: {{image: {run}}}
---
apiVersion: kpack.io/v1alpha2
kind: ClusterStore
metadata: {{name: {CLUSTER_STORE}}}
spec:
  sources: [{{image: {buildpackage}}}]
---
apiVersion: kpack.io/v1alpha2
kind: ClusterBuilder
metadata: {{name: {CLUSTER_BUILDER}}}
spec:
  tag: {cluster_registry}/{REPOSITORY}/builder
  serviceAccountRef: {{name: {sa_name}, namespace: {sa_namespace}}}
  stack: {{name: {CLUSTER_STACK}, kind: ClusterStack}}
  store: {{name: {CLUSTER_STORE}, kind: ClusterStore}}
  order: [{{group: [{{id: {BUILDPACK_ID}}}]}}]
",
            lifecycle = at("lifecycle", &lifecycle),
            build = at("build-jammy", &build),
            run = at("run-jammy", &run),
            buildpackage = at("buildpackage", &buildpackage),
        ))
}

/// kpack reads the lifecycle's version and APIs from two labels and copies its last layer into
/// the builder; kpack before v0.17 reads them from `io.buildpacks.lifecycle.metadata` and the
/// layer of each OS from the labels `linux` and `windows` (their diff IDs).
fn lifecycle_image() -> Result<LayeredImage> {
    let files: Vec<(String, &[u8])> = [
        "analyzer", "detector", "restorer", "builder", "exporter", "launcher",
    ]
    .iter()
    .map(|f| (format!("cnb/lifecycle/{f}"), STAND_IN))
    .collect();
    let files: Vec<(&str, &[u8])> = files.iter().map(|(p, c)| (p.as_str(), *c)).collect();
    let apis = |supported: &[&str]| json!({"deprecated": [], "supported": supported});
    let lifecycle_apis = json!({
        "buildpack": apis(&["0.7", "0.8", "0.9", "0.10"]),
        "platform": apis(&["0.7", "0.8", "0.9"]),
    });
    let image = LayeredImage::new().layer(&files)?;
    let layer = image.last_diff_id().unwrap_or_default().to_string();
    image
        .label("linux", layer.clone())
        .label("windows", layer)
        .json_label(
            "io.buildpacks.lifecycle.metadata",
            &json!({"version": LIFECYCLE_VERSION, "apis": lifecycle_apis}),
        )?
        .json_label(
            "io.buildpacks.builder.metadata",
            &json!({"lifecycle": {"version": LIFECYCLE_VERSION}, "api": {"buildpack": "0.10", "platform": "0.9"}}),
        )?
        .json_label("io.buildpacks.lifecycle.apis", &lifecycle_apis)
}

/// Build and run images name their stack; the build image also the builds' user and group.
fn stack_image(kind: &str) -> Result<LayeredImage> {
    let os_release = format!("NAME=holdfast-e2e-jammy-{kind}\nID=ubuntu\n");
    Ok(LayeredImage::new()
        .layer(&[("etc/os-release", os_release.as_bytes())])?
        .label("io.buildpacks.stack.id", STACK_ID))
}

/// A buildpackage of one buildpack: its layer, and the labels naming the layer by diff ID.
fn buildpackage() -> Result<LayeredImage> {
    let dir = format!(
        "cnb/buildpacks/{}/{BUILDPACK_VERSION}",
        BUILDPACK_ID.replace('/', "_")
    );
    let toml =
        format!("api = \"0.10\"\n[buildpack]\nid = \"{BUILDPACK_ID}\"\nversion = \"{BUILDPACK_VERSION}\"\n");
    let image = LayeredImage::new().layer(&[
        (&format!("{dir}/buildpack.toml"), toml.as_bytes()),
        (&format!("{dir}/bin/detect"), STAND_IN),
        (&format!("{dir}/bin/build"), STAND_IN),
    ])?;
    let diff_id = image
        .last_diff_id()
        .context("buildpackage without a layer")?
        .to_string();
    image
        .json_label(
            "io.buildpacks.buildpackage.metadata",
            &json!({"id": BUILDPACK_ID, "version": BUILDPACK_VERSION, "homepage": "https://holdfast.dev/e2e"}),
        )?
        .json_label(
            "io.buildpacks.buildpack.layers",
            &json!({BUILDPACK_ID: {BUILDPACK_VERSION: {
                "api": "0.10",
                "layerDiffID": diff_id,
                "stacks": [{"id": STACK_ID}],
            }}}),
        )
}

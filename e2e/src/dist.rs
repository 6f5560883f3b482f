//! holdfast as its users install it: the image `make image` builds (scripts/image.sh), the
//! Carvel bundles and the OCI chart `make package` pushes (scripts/package.sh), pushed to the
//! environment's registry; and the objects an installer created, read back for comparison with
//! what was rendered (`holdfast_manifest_checks::chart`).

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
};

use anyhow::{Context, Result, ensure};
use serde_json::Value;

use crate::Env;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where the scripts leave what they build (`$CARGO_TARGET_DIR`, else target/).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
}

/// Runs one of scripts/ and returns its standard output; fails with its standard error.
pub fn script(name: &str, args: &[&str]) -> Result<String> {
    script_with_env(name, args, &[])
}

/// [`script`] with the variables `vars` set.
pub fn script_with_env(name: &str, args: &[&str], vars: &[(&str, &str)]) -> Result<String> {
    let mut command = Command::new(repo().join("scripts").join(name));
    command.envs(vars.iter().copied());
    run_script(command, name, args)
}

/// [`script`] for what it pushes to `env`'s registry, which speaks plain HTTP wherever it listens:
/// on loopback (`make up`) or at the address `make cluster`'s node gives it, which the scripts
/// take as plain HTTP when `HOLDFAST_CLUSTER_REGISTRY` names it (scripts/image.sh,
/// scripts/package.sh).
fn script_for(env: &Env, name: &str, args: &[&str]) -> Result<String> {
    let mut command = Command::new(repo().join("scripts").join(name));
    command.env("HOLDFAST_CLUSTER_REGISTRY", env.registry());
    run_script(command, name, args)
}

fn run_script(mut command: Command, name: &str, args: &[&str]) -> Result<String> {
    let out = command
        .args(args)
        .output()
        .with_context(|| format!("running scripts/{name}"))?;
    ensure!(
        out.status.success(),
        "scripts/{name} {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The image `make image` builds, pushed to the environment's registry.
#[derive(Debug, Clone)]
pub struct Image {
    /// `<registry>/holdfast`.
    pub repository: String,
    /// The image index's digest (`sha256:…`; linux/amd64 and linux/arm64), the same in the
    /// layout and in the registry.
    pub digest: String,
    /// The OCI layout scripts/image.sh wrote.
    pub layout: PathBuf,
}

impl Image {
    /// `repository@digest`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.repository, self.digest)
    }
}

/// Builds the image (incremental: cargo and umoci redo only what changed) and pushes it; once
/// per test binary (its tests share the build directory and the registry).
pub fn build_and_push_image(env: &Env) -> Result<Image> {
    static BUILT: Mutex<Option<(String, Image)>> = Mutex::new(None);
    once_per_registry(&BUILT, env, build_and_push)
}

/// `make(env)` once per registry in this process, its result kept in `done`.
fn once_per_registry<T: Clone>(
    done: &Mutex<Option<(String, T)>>,
    env: &Env,
    make: impl FnOnce(&Env) -> Result<T>,
) -> Result<T> {
    let mut done = done
        .lock()
        .map_err(|_| anyhow::anyhow!("an earlier build panicked"))?;
    if let Some((_, value)) = done.as_ref().filter(|(registry, _)| registry == env.registry()) {
        return Ok(value.clone());
    }
    let value = make(env)?;
    *done = Some((env.registry().to_string(), value.clone()));
    Ok(value)
}

fn build_and_push(env: &Env) -> Result<Image> {
    script("image.sh", &["build"])?;
    let repository = format!("{}/holdfast", env.registry());
    let pushed = script_for(env, "image.sh", &["push", &repository])?;
    let digest = pushed
        .trim()
        .strip_prefix(&format!("{repository}@"))
        .with_context(|| format!("scripts/image.sh push printed {pushed:?}"))?
        .to_string();
    Ok(Image {
        repository,
        digest,
        layout: target_dir().join("image/oci"),
    })
}

/// What `make package` pushed.
#[derive(Debug, Clone)]
pub struct Packaged {
    pub image: Image,
    /// The package's imgpkg bundle, by digest.
    pub bundle: String,
    /// The PackageRepository bundle, by digest.
    pub repository: String,
    /// `<prefix>/holdfast-repo:<version>`: what a user's PackageRepository names.
    pub repository_tag: String,
    /// The chart as an OCI artefact, by digest.
    pub chart: String,
}

/// Builds and pushes the image, then the Carvel bundles and the OCI chart, under
/// `<registry>/holdfast`.
pub fn package(env: &Env) -> Result<Packaged> {
    static PACKAGED: Mutex<Option<(String, Packaged)>> = Mutex::new(None);
    once_per_registry(&PACKAGED, env, package_once)
}

fn package_once(env: &Env) -> Result<Packaged> {
    let image = build_and_push_image(env)?;
    let prefix = format!("{}/holdfast", env.registry());
    let out = script_for(env, "package.sh", &[&prefix])?;
    let lines: Vec<&str> = out.lines().collect();
    ensure!(lines.len() == 3, "scripts/package.sh printed {out:?}");
    Ok(Packaged {
        image,
        bundle: lines[0].into(),
        repository: lines[1].into(),
        repository_tag: format!("{prefix}/holdfast-repo:{}", env!("CARGO_PKG_VERSION")),
        chart: lines[2].into(),
    })
}

/// The refName of holdfast's Package (scripts/package.sh).
pub const PACKAGE_NAME: &str = "holdfast.holdfast.dev";
/// The name of what [`package_repository`] and [`package_install`] create: the
/// PackageRepository, the PackageInstall (and the App kapp-controller makes of it).
pub const PACKAGE_INSTALL: &str = "holdfast";
/// The ServiceAccount a PackageInstall of holdfast deploys with ([`package_install`]).
pub const INSTALLER: &str = "holdfast-installer";

/// A PackageRepository [`PACKAGE_INSTALL`] fetching the repository bundle `bundle` (as users write
/// it: `<prefix>/holdfast-repo:<version>`, or a copy's).
pub fn package_repository(bundle: &str) -> String {
    format!(
        "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageRepository\nmetadata: {{name: {PACKAGE_INSTALL}}}\nspec:\n  fetch: {{imgpkgBundle: {{image: {bundle}}}}}\n"
    )
}

/// What a user creates in `namespace` to install holdfast's package at `version` with `values`:
/// the ServiceAccount [`INSTALLER`], bound to `cluster-admin` (holdfast installs cluster-wide
/// objects: its CRDs, webhook configurations, ClusterRoles), the values in a Secret, and last the
/// PackageInstall [`PACKAGE_INSTALL`]. The binding is named by [`installer_binding`].
pub fn package_install(namespace: &str, version: &str, values: &Value) -> Result<String> {
    // A JSON string is a YAML scalar.
    let values = serde_json::to_string(&values.to_string())?;
    let binding = installer_binding(namespace);
    Ok(format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {binding}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\nsubjects: [{{kind: ServiceAccount, name: {INSTALLER}, namespace: {namespace}}}]\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {INSTALLER}}}\n---\napiVersion: v1\nkind: Secret\nmetadata: {{name: holdfast-values}}\nstringData:\n  values.yaml: {values}\n---\napiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageInstall\nmetadata: {{name: {PACKAGE_INSTALL}}}\nspec:\n  serviceAccountName: {INSTALLER}\n  packageRef: {{refName: {PACKAGE_NAME}, versionSelection: {{constraints: {version}}}}}\n  values: [{{secretRef: {{name: holdfast-values}}}}]\n"
    ))
}

/// The ClusterRoleBinding of [`package_install`]'s installer in `namespace`.
pub fn installer_binding(namespace: &str) -> String {
    format!("{namespace}-{INSTALLER}")
}

/// Each rendered object as the cluster holds it (`kubectl get -o json`), in order.
pub fn installed(env: &Env, rendered: &[Value]) -> Result<Vec<Value>> {
    rendered
        .iter()
        .map(|object| {
            let api_version = object["apiVersion"].as_str().unwrap_or_default();
            let group = api_version.rsplit_once('/').map(|(g, _)| g);
            let kind = object["kind"].as_str().unwrap_or_default();
            let resource = match group {
                Some(group) => format!(
                    "{kind}.{}.{group}",
                    api_version.rsplit('/').next().unwrap_or_default()
                ),
                None => kind.to_string(),
            };
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            let mut get = env.kubectl();
            get.args(["get", &resource, name, "-o", "json"]);
            if let Some(ns) = object["metadata"]["namespace"].as_str() {
                get.args(["-n", ns]);
            }
            let out = get.output()?;
            ensure!(
                out.status.success(),
                "{kind} {name} is not installed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(serde_json::from_slice(&out.stdout)?)
        })
        .collect()
}

/// Every difference between what was rendered and what is installed, beyond what `added` lists.
pub fn installed_differences(
    env: &Env,
    rendered: &[Value],
    added: holdfast_manifest_checks::chart::Added,
) -> Result<Vec<String>> {
    let live = installed(env, rendered)?;
    Ok(rendered
        .iter()
        .zip(&live)
        .flat_map(|(r, l)| holdfast_manifest_checks::chart::installed_differences(r, l, added))
        .collect())
}

/// The webhook configurations call the installed Service: `holdfast-webhook` in holdfast's
/// namespace, port 443, on the shipped paths.
pub fn webhooks_call_the_service(installed: &[Value]) -> Result<usize> {
    let service = installed
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "holdfast-webhook")
        .context("no Service holdfast-webhook installed")?;
    let namespace = service["metadata"]["namespace"].as_str().unwrap_or_default();
    let port = service["spec"]["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["name"] == "https"))
        .context("the Service has no https port")?;
    let mut checked = 0;
    for configuration in installed.iter().filter(|o| {
        o["kind"] == "MutatingWebhookConfiguration" || o["kind"] == "ValidatingWebhookConfiguration"
    }) {
        for webhook in configuration["webhooks"].as_array().into_iter().flatten() {
            let called = &webhook["clientConfig"]["service"];
            ensure!(
                called["name"] == "holdfast-webhook"
                    && called["namespace"] == namespace
                    && called["port"] == port["port"]
                    && called["path"]
                        .as_str()
                        .is_some_and(|p| ["/mutate", "/validate"].contains(&p)),
                "webhook {} calls {called}, not the installed Service {namespace}/holdfast-webhook:{}",
                webhook["name"],
                port["port"]
            );
            checked += 1;
        }
    }
    Ok(checked)
}

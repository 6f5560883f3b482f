//! Loading the manifests: the base as written (its kustomizations' `resources:`, no tool
//! needed) and renderings by `kubectl kustomize` (overlays, components), parsed into YAML values.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;
use serde_yaml::Value;

use crate::yaml::strings;

/// The repository root (this crate's parent directory).
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `manifests/`: the kustomization `kubectl apply -k manifests/` installs.
pub fn manifests() -> PathBuf {
    repo().join("manifests")
}

/// Every non-empty document of a multi-document YAML text.
pub fn parse_documents(text: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(document)?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// A file's text, with its path in the error.
pub fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The kustomization file of a directory, by any name kustomize accepts.
fn kustomization_file(dir: &Path) -> Option<PathBuf> {
    ["kustomization.yaml", "kustomization.yml", "Kustomization"]
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
}

/// The objects a kustomization lists under `resources:`, following directories recursively.
/// Generators, patches and components are kustomize's business (see [`render`]).
pub fn load_kustomization(dir: &Path) -> Result<Vec<Value>> {
    let file = kustomization_file(dir).with_context(|| format!("no kustomization in {}", dir.display()))?;
    let kustomization = serde_yaml::from_str::<Value>(&read(&file)?)?;
    let mut objects = Vec::new();
    for resource in strings(kustomization.get("resources")) {
        let path = dir.join(&resource);
        if path.is_dir() {
            objects.extend(load_kustomization(&path)?);
        } else {
            let docs =
                parse_documents(&read(&path)?).with_context(|| format!("parsing {}", path.display()))?;
            objects.extend(docs);
        }
    }
    Ok(objects)
}

/// The base as written (manifests/ → base/ → ../crds and the files).
pub fn base() -> Result<Vec<Value>> {
    let objects = load_kustomization(&manifests())?;
    ensure!(
        objects.len() > 20,
        "the base holds only {} objects",
        objects.len()
    );
    Ok(objects)
}

/// A Go build `make deps` (scripts/install-deps.sh) cached: `$HOLDFAST_CACHE/peers/<name>`, the
/// cache defaulting as the e2e harness's does (`holdfast_e2e::tools::cache_dir`:
/// `$XDG_CACHE_HOME/holdfast`, then `~/.cache/holdfast`). Read here, not through the harness, so
/// that these checks build without it.
pub fn peer_dir(name: &str) -> Option<PathBuf> {
    let cache = match (
        std::env::var_os("HOLDFAST_CACHE"),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    ) {
        (Some(cache), _, _) => PathBuf::from(cache),
        (None, Some(xdg), _) => Path::new(&xdg).join("holdfast"),
        (None, None, Some(home)) => Path::new(&home).join(".cache/holdfast"),
        (None, None, None) => PathBuf::from("/root/.cache/holdfast"),
    };
    Some(cache.join("peers").join(name)).filter(|dir| dir.exists())
}

/// `kubectl` on the PATH, if any: the renderings are checked only with it.
pub fn kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

/// `kubectl kustomize DIR`, parsed.
pub fn render(kubectl: &Path, dir: &Path) -> Result<Vec<Value>> {
    let output = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| format!("running kubectl kustomize {}", dir.display()))?;
    if !output.status.success() {
        bail!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    parse_documents(&String::from_utf8(output.stdout)?)
}

/// Renders the base with `components` (by name, under `manifests/components/`). Components need
/// a kustomization that uses them: it is written beside a copy of manifests/ in a scratch
/// directory (kustomize allows no absolute paths).
pub fn render_with_components(kubectl: &Path, components: &[impl AsRef<str>]) -> Result<Vec<Value>> {
    let scratch = tempfile::tempdir()?;
    copy_dir(&manifests(), &scratch.path().join("manifests"))?;
    let listed: String = components
        .iter()
        .map(|c| format!("  - manifests/components/{}\n", c.as_ref()))
        .collect();
    std::fs::write(
        scratch.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - manifests/base\ncomponents:\n{listed}"
        ),
    )?;
    render(kubectl, scratch.path())
}

/// A recursive copy of a directory.
pub fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The names of `dir`'s subdirectories, sorted (the overlays, the components).
pub fn subdirectories(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

//! Where the harness finds its server binaries (installed by `scripts/install-deps.sh`).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The Kubernetes version the harness runs; the install script builds and caches it.
pub const KUBERNETES_VERSION: &str = "1.20.2";

#[derive(Debug, Clone)]
pub struct Tools {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub registry: PathBuf,
}

impl Tools {
    /// Looks in `HOLDFAST_K8S_BIN` (or the install script's cache) and `PATH`.
    pub fn locate() -> Result<Self> {
        let k8s = k8s_bin_dir();
        let tools = Self {
            etcd: on_path("etcd")?,
            kube_apiserver: k8s.join("kube-apiserver"),
            kube_controller_manager: k8s.join("kube-controller-manager"),
            registry: on_path("docker-registry")?,
        };
        for bin in [&tools.kube_apiserver, &tools.kube_controller_manager] {
            if !bin.is_file() {
                bail!(
                    "{} is missing: run `make deps` (scripts/install-deps.sh) first",
                    bin.display()
                );
            }
        }
        Ok(tools)
    }
}

fn k8s_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HOLDFAST_K8S_BIN") {
        return dir.into();
    }
    let cache = std::env::var_os("HOLDFAST_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| Path::new(&d).join("holdfast")))
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/holdfast")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/holdfast"));
    cache.join("k8s").join(KUBERNETES_VERSION)
}

fn on_path(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    bail!("`{name}` is not on PATH: run `make deps` (scripts/install-deps.sh) first")
}

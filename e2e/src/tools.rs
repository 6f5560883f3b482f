//! Where the harness finds its programs: the Go builds `scripts/install-deps.sh` caches under
//! `$HOLDFAST_CACHE/peers/<name>/` (one per module under `e2e/peers/`), and the registry on `PATH`.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The Kubernetes release the harness runs (`e2e/peers/kubernetes/go.mod`).
pub const KUBERNETES_VERSION: &str = "1.37.2";

/// The control plane's programs.
#[derive(Debug, Clone)]
pub struct Tools {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
    /// What pods need; none in a local environment where they are not built yet
    /// ([`Tools::locate_for`]).
    pub pods: Option<PodTools>,
    pub registry: PathBuf,
}

/// The control plane's programs for pods: the scheduler and kwok, whose nodes run them.
#[derive(Debug, Clone)]
pub struct PodTools {
    pub kube_scheduler: PathBuf,
    pub kwok: PathBuf,
    /// kwok's own node and pod-ready stages, collected from its module by the install script.
    pub kwok_stages: PathBuf,
}

/// Whether a control plane may start without [`PodTools`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pods {
    /// The suites: pods are scheduled and run.
    Required,
    /// `make up`: scheduled and run once built (`make deps`); until then it runs without
    /// (`install-deps.sh --demo` builds neither: the demo runs no pod).
    IfBuilt,
}

impl Tools {
    pub fn locate() -> Result<Self> {
        Self::locate_for(Pods::Required)
    }

    pub fn locate_for(pods: Pods) -> Result<Self> {
        let k8s = peer_dir("kubernetes")?;
        let pod_tools = || -> Result<PodTools> {
            Ok(PodTools {
                kube_scheduler: existing(k8s.join("bin/kube-scheduler"))?,
                kwok: peer_bin("kwok", "kwok")?,
                kwok_stages: existing(peer_dir("kwok")?.join("kwok-stages.yaml"))?,
            })
        };
        Ok(Self {
            etcd: peer_bin("etcd", "etcd")?,
            kube_apiserver: existing(k8s.join("bin/kube-apiserver"))?,
            kube_controller_manager: existing(k8s.join("bin/kube-controller-manager"))?,
            pods: match (pod_tools(), pods) {
                (Ok(tools), _) => Some(tools),
                (Err(_), Pods::IfBuilt) => None,
                (Err(missing), Pods::Required) => return Err(missing),
            },
            registry: registry()?,
        })
    }
}

/// The cached build of one peer (`$HOLDFAST_CACHE/peers/<name>`, a link to the build of the
/// current `e2e/peers/<name>/go.mod`).
pub fn peer_dir(name: &str) -> Result<PathBuf> {
    existing(cache_dir().join("peers").join(name))
}

/// A program of a peer's build.
pub fn peer_bin(peer: &str, program: &str) -> Result<PathBuf> {
    existing(peer_dir(peer)?.join("bin").join(program))
}

fn existing(path: PathBuf) -> Result<PathBuf> {
    if !path.exists() {
        bail!(
            "{} is missing: run `make deps` (scripts/install-deps.sh) first",
            path.display()
        );
    }
    Ok(path)
}

/// `HOLDFAST_CACHE`, else `$XDG_CACHE_HOME/holdfast`, else `~/.cache/holdfast`.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("HOLDFAST_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| Path::new(&d).join("holdfast")))
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/holdfast")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/holdfast"))
}

/// The OCI registry: Debian's Distribution (`docker-registry`).
pub fn registry() -> Result<PathBuf> {
    on_path("docker-registry")
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

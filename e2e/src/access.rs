//! How a test environment's cluster is reached: its kubeconfig (clients, `kubectl`), its
//! API server's port, CA and admin token, and its registry. [`crate::Env`] holds one (and
//! derefs to it) beside the processes it runs; the peers it starts are given only this, so the
//! peers' modules do not depend on the control plane's.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

/// The way to a running cluster and its registry (see the module doc).
#[derive(Debug, Clone)]
pub struct Access {
    pub(crate) kubeconfig: PathBuf,
    pub(crate) registry: String,
    /// The registry's address inside the cluster, when it differs
    /// ([`crate::control_plane::CLUSTER_REGISTRY_ENV`]).
    pub(crate) cluster_registry: Option<String>,
    pub(crate) apiserver_port: u16,
    pub(crate) apiserver_ca: PathBuf,
    pub(crate) admin_token: String,
}

impl Access {
    /// The cluster of `kubeconfig` and the registry at `registry` (`host:port`), reached the same
    /// way from the cluster; the API server's port, CA and token unknown until set.
    pub(crate) fn new(kubeconfig: PathBuf, registry: String) -> Self {
        Self {
            kubeconfig,
            registry,
            cluster_registry: None,
            apiserver_port: 0,
            apiserver_ca: PathBuf::new(),
            admin_token: String::new(),
        }
    }

    /// A fresh client: kube clients keep connections on the runtime that made them.
    pub async fn client(&self) -> Result<Client> {
        Ok(Client::try_from(self.config().await?)?)
    }

    /// The kubeconfig's client configuration, to build a client that differs (another address,
    /// a `User-Agent` of its own, timeouts).
    pub async fn config(&self) -> Result<Config> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)?;
        Ok(Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?)
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// `host:port` of the plain-HTTP registry.
    pub fn registry(&self) -> &str {
        &self.registry
    }

    /// `host:port` of that registry as holdfast, in the cluster, reaches it: what objects name.
    pub fn cluster_registry(&self) -> &str {
        self.cluster_registry.as_deref().unwrap_or(&self.registry)
    }

    pub fn apiserver_port(&self) -> u16 {
        self.apiserver_port
    }

    /// The API server's self-signed serving certificate (its CA for clients).
    pub fn apiserver_ca(&self) -> &Path {
        &self.apiserver_ca
    }

    /// The bearer token of the `system:masters` user the kubeconfig holds.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// `kubectl` pointed at this control plane, to drive it as a user would.
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new("kubectl");
        cmd.env("KUBECONFIG", &self.kubeconfig);
        cmd
    }

    /// `kubectl apply -n <namespace> -f -` with `yaml` on stdin, as a user would.
    pub fn kubectl_apply(&self, namespace: &str, yaml: &str) -> Result<()> {
        self.kubectl_apply_with(&["-n", namespace], yaml)
    }

    /// `kubectl apply <args> -f -` with `yaml` on stdin (e.g. `--server-side`, or no namespace
    /// for documents that name their own).
    pub fn kubectl_apply_with(&self, args: &[&str], yaml: &str) -> Result<()> {
        self.kubectl_apply_out(args, yaml).map(drop)
    }

    /// `kubectl apply -n <namespace> -o json -f -`: the object as the API server stored it, out
    /// of the request itself (what admission made of it, before any controller).
    pub fn kubectl_apply_stored(&self, namespace: &str, yaml: &str) -> Result<serde_json::Value> {
        let out = self.kubectl_apply_out(&["-n", namespace, "-o", "json"], yaml)?;
        Ok(serde_json::from_slice(&out)?)
    }

    /// `kubectl apply <args> -f -` with `yaml` on stdin; its standard output.
    fn kubectl_apply_out(&self, args: &[&str], yaml: &str) -> Result<Vec<u8>> {
        use std::io::Write as _;
        let mut child = self
            .kubectl()
            .arg("apply")
            .args(args)
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(yaml.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(out.stdout)
    }

    /// `kubectl get <resource> <name> -n <namespace> -o json`.
    pub fn kubectl_get(&self, resource: &str, name: &str, namespace: &str) -> Result<serde_json::Value> {
        let out = self
            .kubectl()
            .args(["get", resource, name, "-n", namespace, "-o", "json"])
            .output()?;
        if !out.status.success() {
            bail!(
                "kubectl get {resource} {name} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }
}

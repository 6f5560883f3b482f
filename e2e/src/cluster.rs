//! `make cluster` for a test binary: the local control plane without holdfast's and kapp-controller's
//! host processes (`holdfast-localenv up --without-holdfast --without-kapp-controller`), one real
//! node (scripts/node.sh: containerd, runc, kubelet, kube-proxy, kube-router), kapp-controller as a
//! pod there from an image built here and its own release config (scripts/kapp-controller.sh), and
//! holdfast installed onto it from its image and chart (scripts/install.sh), all in a state
//! directory of the fixture's own. Dropping it stops the node
//! (through its script, which removes what it made) and then the control plane.
//!
//! The node is one per machine (its bridge, pod range and kube-proxy's nftables table are fixed):
//! starting one fails while another runs (`make down` stops make cluster's). The control plane is
//! stopped with the test binary (parent-death signal) however that ends; the node ([`Node`]) runs
//! in sessions of its own and outlives a test binary that is killed: `scripts/node.sh down DIR`
//! then stops it (DIR is logged at start). [`Node::around`] makes the same node, kapp-controller
//! and release around a control plane the caller started (the soak's).

use std::{collections::BTreeMap, path::Path, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use tempfile::TempDir;

use crate::{Env, dist, process::ServerProcess, suite::Fixture};

/// The node's name and taint (scripts/node.sh).
pub const NODE: &str = "holdfast-node";
/// The node's CNI bridge: there while a node runs on this machine.
const BRIDGE: &str = "hf-br0";
/// Where scripts/install.sh installs the release.
pub const NAMESPACE: &str = "holdfast-system";
pub const RELEASE: &str = "holdfast";

/// A running `make cluster`.
pub struct Cluster {
    pub env: Env,
    /// The node, kapp-controller on it and holdfast's release, in the state directory
    /// `holdfast-localenv` writes the control plane's `env` into.
    pub node: Node,
    localenv: Option<ServerProcess>,
}

impl Fixture for Cluster {
    async fn start() -> Result<Self> {
        // Forked from a runtime worker, which lives as long as the runtime: the control plane's
        // parent-death signal follows the forking thread (a blocking-pool thread exits when idle).
        let mut cluster = tokio::spawn(async { Self::control_plane() })
            .await
            .context("the control plane's start panicked")??;
        let node = tokio::task::spawn_blocking(move || {
            cluster.until_control_plane()?;
            cluster.node.up()?;
            cluster.node.install(&serde_json::json!({}))?;
            let kubeconfig = cluster.node.var("KUBECONFIG")?.into();
            let registry = cluster.node.var("HOLDFAST_REGISTRY")?.to_string();
            cluster.env = Env::attached(kubeconfig, registry, None);
            Ok::<_, anyhow::Error>(cluster)
        });
        node.await.context("the cluster's start panicked")?
    }

    fn ready(&self) -> String {
        format!(
            "harness: make cluster (control plane, the real node {NODE}, holdfast from its chart) ready in {}",
            self.node.dir()
        )
    }
}

impl Cluster {
    /// `holdfast-localenv up --without-holdfast --without-kapp-controller` in a new state directory
    /// (not waited for).
    fn control_plane() -> Result<Self> {
        let node = Node::new()?;
        let dir = node.dir().to_string();
        // The test binary is target/<profile>/deps/NAME-HASH; cargo builds the package's binaries
        // beside deps/ for its integration tests.
        let exe = std::env::current_exe()?;
        let localenv = exe
            .parent()
            .and_then(Path::parent)
            .map(|p| p.join("holdfast-localenv"))
            .filter(|p| p.is_file())
            .context("holdfast-localenv is not built beside the test binary")?;
        let localenv = ServerProcess::spawn(
            "holdfast-localenv",
            &localenv,
            &[
                "up".into(),
                "--state-dir".into(),
                dir,
                "--without-holdfast".into(),
                "--without-kapp-controller".into(),
            ],
            &[],
            node.state.path().join("localenv.log"),
        )?;
        Ok(Cluster {
            env: Env::attached(Default::default(), String::new(), None),
            node,
            localenv: Some(localenv),
        })
    }

    /// Waits for the control plane's `STATE/env` (its presence means ready).
    fn until_control_plane(&mut self) -> Result<()> {
        let env_file = self.node.state.path().join("env");
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while !env_file.exists() {
            if let Some(process) = self.localenv.as_mut() {
                process.check_running()?;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "the control plane was not ready in 300 s"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// The process id of the control plane's `holdfast-localenv` (what runs the host processes).
    pub fn localenv_pid(&self) -> Option<u32> {
        self.localenv.as_ref().map(ServerProcess::pid)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The node before the control plane it registered with.
        self.node.stop();
        if let Some(mut localenv) = self.localenv.take() {
            localenv.stop(Duration::from_secs(30));
        }
    }
}

/// What `STATE/env` exports for a control plane (`holdfast-localenv up` writes it, and
/// [`Node::around`]): the kubeconfig at `kubeconfig`, the registry, and for `make cluster`'s
/// kubelet its client CA and the API server's address, where the node's forwarder sends pods'
/// calls to the `kubernetes` Service.
pub fn state_exports(env: &Env, kubeconfig: &Path) -> String {
    format!(
        "export KUBECONFIG={}\nexport HOLDFAST_REGISTRY={}\nexport HOLDFAST_KUBELET_CLIENT_CA={}\nexport HOLDFAST_APISERVER=127.0.0.1:{}\n",
        kubeconfig.display(),
        env.registry(),
        env.kubelet_client_ca().display(),
        env.apiserver_port(),
    )
}

/// `make cluster`'s real node (scripts/node.sh), kapp-controller as a pod there
/// (scripts/kapp-controller.sh) and holdfast installed onto it from its image and chart
/// (scripts/install.sh), in a state directory of its own. Dropping it stops the node (through
/// its script, which removes what it made).
///
/// The node is one per machine (its bridge, pod range and kube-proxy's nftables table are fixed):
/// starting fails while another runs (`make cluster`'s: `make down` stops it). The node's
/// processes run in sessions of their own and outlive a test binary that is killed:
/// `scripts/node.sh down DIR` then stops them (DIR is logged at start).
pub struct Node {
    state: TempDir,
    /// What `STATE/env` and `STATE/node/env` export.
    vars: BTreeMap<String, String>,
    started: bool,
}

impl Node {
    /// A new state directory, when no other node runs on this machine.
    fn new() -> Result<Self> {
        if Path::new("/sys/class/net").join(BRIDGE).exists() {
            bail!(
                "a real node already runs on this machine (its bridge {BRIDGE} exists): `make down` stops make cluster's"
            );
        }
        let state = tempfile::Builder::new().prefix("holdfast-cluster-").tempdir()?;
        eprintln!("harness: make cluster in {}", state.path().display());
        Ok(Node {
            state,
            vars: BTreeMap::new(),
            started: false,
        })
    }

    /// The node and kapp-controller around `env`, a control plane this process started: what
    /// `make cluster` makes around `holdfast-localenv`'s, with the control plane's processes left
    /// in `env`'s hands (the soak restarts them); holdfast's release follows with
    /// [`Node::install`]. Writes its state directory only: [`Node::up`] starts it.
    pub fn around(env: &Env) -> Result<Self> {
        let node = Node::new()?;
        let kubeconfig = node.state.path().join("kubeconfig");
        std::fs::copy(env.kubeconfig(), &kubeconfig)?;
        std::fs::write(node.state.path().join("env"), state_exports(env, &kubeconfig))?;
        Ok(node)
    }

    /// Once the control plane's `STATE/env` is written: the node, then kapp-controller on it.
    /// Blocking: on the blocking pool, never `block_in_place` on a worker that forked the
    /// control plane (its processes die with that thread, [`crate::process`]).
    pub fn up(&mut self) -> Result<()> {
        let dir = self.dir().to_string();
        self.started = true;
        dist::script("node.sh", &["up", &dir])?;
        dist::script("kapp-controller.sh", &["up", &dir])?;
        self.read_vars()
    }

    /// holdfast's release, from its image and chart (scripts/install.sh), with `values` (a
    /// values file's content, JSON) over the script's.
    pub fn install(&mut self, values: &serde_json::Value) -> Result<()> {
        let file = self.state.path().join("soak-values.json");
        std::fs::write(&file, serde_json::to_vec(values)?)?;
        let args = format!("--values={}", file.display());
        let dir = self.dir().to_string();
        dist::script_with_env("install.sh", &[&dir], &[("HOLDFAST_HELM_ARGS", &args)])?;
        self.read_vars()
    }

    /// Stops the node (once).
    fn stop(&mut self) {
        if std::mem::take(&mut self.started) {
            let dir = self.dir().to_string();
            if let Err(e) = dist::script("node.sh", &["down", &dir]) {
                eprintln!("harness: stopping the node failed: {e:#}");
            }
        }
    }

    /// The node's state directory (`STATE` of the scripts).
    pub fn dir(&self) -> &str {
        self.state.path().to_str().unwrap_or_default()
    }

    fn read_vars(&mut self) -> Result<()> {
        self.vars.clear();
        for file in ["env", "node/env"] {
            let path = self.state.path().join(file);
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            for line in text.lines() {
                if let Some((name, value)) = line.strip_prefix("export ").and_then(|l| l.split_once('=')) {
                    self.vars.insert(name.to_string(), value.to_string());
                }
            }
        }
        Ok(())
    }

    /// A variable `STATE/env` or `STATE/node/env` exports.
    pub fn var(&self, name: &str) -> Result<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .with_context(|| format!("{name} is not in the cluster's env files"))
    }

    /// Runs one of scripts/ against this cluster: `ARGS... STATE`.
    pub fn script(&self, name: &str, args: &[&str]) -> Result<String> {
        let mut all = args.to_vec();
        all.push(self.dir());
        dist::script(name, &all)
    }

    /// A command with the cluster's kubeconfig and the node's crictl configuration.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> std::process::Command {
        let mut command = std::process::Command::new(program);
        for name in ["KUBECONFIG", "CRI_CONFIG_FILE"] {
            if let Ok(value) = self.var(name) {
                command.env(name, value);
            }
        }
        if let Ok(path) = self.var("PATH") {
            // node/env prepends crictl's directory to $PATH.
            let system = std::env::var("PATH").unwrap_or_default();
            command.env("PATH", path.replace("$PATH", &system));
        }
        command
    }

    /// Runs `program args` (see [`Cluster::command`]); its standard output, or an error with its
    /// standard error.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<String> {
        let out = self
            .command(program)
            .args(args)
            .output()
            .with_context(|| format!("running {program}"))?;
        ensure!(
            out.status.success(),
            "{program} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// helm of `make deps`, against this cluster.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        let helm = holdfast_manifest_checks::chart::helm()?;
        self.run(&helm.to_string_lossy(), args)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

//! A real local control plane and OCI registry on loopback: etcd, kube-apiserver,
//! kube-controller-manager (garbage collector, namespace controller, service accounts),
//! kube-scheduler, kwok with a few fake nodes (pods are scheduled, run and terminate with their
//! grace periods) and a Distribution registry, each on a free port in a temporary directory.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::{
    api::core::v1::{Namespace, Node, ServiceAccount},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ObjectMeta, PostParams},
    runtime::wait::{await_condition, conditions},
};
use serde::Deserialize as _;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use crate::{
    access::Access,
    peers::{KappController, Korifi, Kpack, kpack},
    pki::Pki,
    process::{ServerProcess, Stop, free_port},
    tools::{PodTools, Pods, Tools},
};

/// How long any one component may take to become ready before the boot fails.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// The API server's audit log, in the environment's directory.
const AUDIT_LOG: &str = "audit.log";
/// Label on every namespace the harness creates, so leftovers can be found on a shared cluster.
pub const E2E_LABEL: &str = "holdfast.dev/e2e";
/// The name kube-apiserver's process is started under ([`Env::pid_of`] finds it by it).
pub const KUBE_APISERVER: &str = "kube-apiserver";
/// The name etcd's process is started under.
pub const ETCD: &str = "etcd";
/// Set to a kubeconfig file: the suites run against that cluster (e.g. kind with holdfast
/// installed, `e2e/kind/`) instead of booting the local control plane.
pub const KUBECONFIG_ENV: &str = "HOLDFAST_E2E_KUBECONFIG";
/// With [`KUBECONFIG_ENV`]: `host:port` of a plain-HTTP registry the tests push to.
pub const REGISTRY_ENV: &str = "HOLDFAST_E2E_REGISTRY";
/// With [`KUBECONFIG_ENV`]: the same registry as the cluster's pods reach it (default: the same).
pub const CLUSTER_REGISTRY_ENV: &str = "HOLDFAST_E2E_CLUSTER_REGISTRY";

/// A running control plane and registry. Dropping it stops every process and removes its directory
/// (kept, with the logs, when `HOLDFAST_KEEP_ENV=1`).
#[derive(Debug)]
pub struct Env {
    /// How the cluster is reached: [`Env`] derefs to it.
    access: Access,
    boot_time: Duration,
    /// The CA a real kubelet authenticates kube-apiserver's client certificate by.
    kubelet_client_ca: PathBuf,
    /// In start order; stopped in reverse.
    processes: Vec<ServerProcess>,
    /// Started by the first test that asks for it; stopped before the control plane.
    kapp_controller: tokio::sync::OnceCell<Result<KappController, String>>,
    /// Likewise (with the volume provisioner it needs).
    kpack: tokio::sync::OnceCell<Result<Kpack, String>>,
    /// Likewise (on top of kpack); stopped before it.
    korifi: tokio::sync::OnceCell<Result<Korifi, String>>,
    dir: Option<TempDir>,
}

impl Env {
    /// Boots everything and installs the peers' CRDs (and holdfast's own) before the controller
    /// manager starts, so its garbage collector discovers them on its first sync.
    pub async fn start() -> Result<Self> {
        Self::start_with(Pods::Required).await
    }

    /// [`Env::start`] for `make up`: without kube-scheduler and kwok while they are not built
    /// (`install-deps.sh --demo`), saying so on standard error.
    pub async fn start_local() -> Result<Self> {
        Self::start_with(Pods::IfBuilt).await
    }

    async fn start_with(pods: Pods) -> Result<Self> {
        if let Some(kubeconfig) = std::env::var_os(KUBECONFIG_ENV) {
            return Self::existing(kubeconfig.into());
        }
        // Children are forked from a runtime worker thread: PR_SET_PDEATHSIG follows the forking
        // thread, and workers live as long as the runtime, unlike a short-lived test thread.
        match tokio::spawn(Self::boot(pods))
            .await
            .context("boot task panicked")?
        {
            // A port free when picked can be taken before its server binds it (another suite's
            // process): boot once more on fresh ports. The failed attempt stopped everything.
            Err(e) if format!("{e:#}").contains("address already in use") => {
                tracing::warn!(error = %format!("{e:#}"), "a port was taken while booting; booting again");
                tokio::spawn(Self::boot(pods))
                    .await
                    .context("boot task panicked")?
            }
            booted => booted,
        }
    }

    /// An existing cluster ([`KUBECONFIG_ENV`]): nothing is started, and nothing is stopped.
    fn existing(kubeconfig: PathBuf) -> Result<Self> {
        let registry = std::env::var(REGISTRY_ENV).with_context(|| {
            format!("{KUBECONFIG_ENV} is set: {REGISTRY_ENV} must name the test registry")
        })?;
        Ok(Self::attached(
            kubeconfig,
            registry,
            std::env::var(CLUSTER_REGISTRY_ENV).ok(),
        ))
    }

    /// A cluster started by something else (`make cluster`'s scripts, [`crate::cluster`]):
    /// nothing is started, and nothing is stopped.
    pub fn attached(kubeconfig: PathBuf, registry: String, cluster_registry: Option<String>) -> Self {
        let mut access = Access::new(kubeconfig, registry);
        access.cluster_registry = cluster_registry;
        Env::of(access, None)
    }

    /// An environment reached through `access`, with nothing started yet; its processes run in
    /// `dir` (none: an existing cluster).
    fn of(access: Access, dir: Option<TempDir>) -> Self {
        Env {
            access,
            boot_time: Duration::ZERO,
            kubelet_client_ca: PathBuf::new(),
            processes: Vec::new(),
            kapp_controller: tokio::sync::OnceCell::new(),
            kpack: tokio::sync::OnceCell::new(),
            korifi: tokio::sync::OnceCell::new(),
            dir,
        }
    }

    /// Whether this is a cluster the harness did not start ([`KUBECONFIG_ENV`]).
    pub fn is_existing_cluster(&self) -> bool {
        self.dir.is_none()
    }

    async fn boot(pods: Pods) -> Result<Self> {
        let started = Instant::now();
        let tools = Tools::locate_for(pods)?;
        let dir = tempfile::Builder::new().prefix("holdfast-env-").tempdir()?;
        let root = dir.path().to_path_buf();
        let mut env = Env::of(Access::new(root.join("kubeconfig"), String::new()), Some(dir));

        let etcd_port = free_port()?;
        let etcd_peer_port = free_port()?;
        let apiserver_port = free_port()?;
        let registry_port = free_port()?;
        env.access.registry = format!("127.0.0.1:{registry_port}");

        let pki = Pki::write(&root.join("pki"), random_token())?;

        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        env.spawn(
            ETCD,
            &tools.etcd,
            &[
                "--name=default".into(),
                format!("--data-dir={}", root.join("etcd").display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                // Metrics on a port of its own would be one more port to find free: none.
                "--listen-metrics-urls=".into(),
            ],
        )?;

        let registry_config = root.join("registry.yml");
        std::fs::write(
            &registry_config,
            registry_config_yaml(&root.join("registry"), &env.access.registry),
        )?;
        env.spawn(
            "docker-registry",
            &tools.registry,
            &["serve".into(), registry_config.display().to_string()],
        )?;

        let cert_dir = root.join("apiserver");
        let ca_file = cert_dir.join("apiserver.crt");
        env.access.apiserver_port = apiserver_port;
        env.access.apiserver_ca = ca_file.clone();
        env.kubelet_client_ca = pki.kubelet_client_ca.clone();
        env.access.admin_token = pki.token.clone();
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={apiserver_port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", cert_dir.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-cluster-ip-range=10.96.0.0/24".into(),
            // Endpoints may not hold a loopback address: the `kubernetes` Service gets none, and
            // programs that run "in cluster" here are given KUBERNETES_SERVICE_HOST=127.0.0.1.
            "--endpoint-reconciler-type=none".into(),
            // A real kubelet (`make cluster`) is reached at its InternalIP: its Hostname resolves
            // nowhere, and looking it up would ask the machine's DNS server.
            "--kubelet-preferred-address-types=InternalIP".into(),
        ];
        apiserver_args.extend(pki.apiserver_flags());
        // Writes to what the controller writes, at Metadata level ([`crate::audit`]).
        let audit_policy = root.join("audit-policy.yaml");
        std::fs::write(&audit_policy, crate::audit::POLICY)?;
        apiserver_args.extend([
            format!("--audit-policy-file={}", audit_policy.display()),
            format!("--audit-log-path={}", root.join(AUDIT_LOG).display()),
            // Bounded: one file of at most 200 MB, never rotated away mid-suite in practice.
            "--audit-log-maxsize=200".into(),
            "--audit-log-maxbackup=1".into(),
        ]);
        env.spawn(KUBE_APISERVER, &tools.kube_apiserver, &apiserver_args)?;

        env.wait_for_registry().await?;
        let client = env
            .wait_for_apiserver(apiserver_port, &ca_file, &pki.token, None)
            .await?;
        install_crds(&client, &crd_dirs()?).await?;

        let kubeconfig = format!("--kubeconfig={}", env.access.kubeconfig.display());
        env.spawn(
            "kube-controller-manager",
            &tools.kube_controller_manager,
            &[
                kubeconfig.clone(),
                "--leader-elect=false".into(),
                format!("--service-account-private-key-file={}", pki.sa_key.display()),
                format!("--root-ca-file={}", ca_file.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()?),
            ],
        )?;
        match &tools.pods {
            Some(pods) => env.start_pods(&client, pods, &kubeconfig).await?,
            None => eprintln!(
                "kube-scheduler and kwok are not built yet (make deps builds them): pods stay Pending"
            ),
        }
        env.wait_for_service_account(&client, "default").await?;

        env.boot_time = started.elapsed();
        tracing::info!(boot_seconds = env.boot_time.as_secs_f64(), dir = %root.display(), "local control plane ready");
        Ok(env)
    }

    /// kube-scheduler and kwok with [`KWOK_NODES`] nodes; returns once the nodes are Ready.
    async fn start_pods(&mut self, client: &Client, tools: &PodTools, kubeconfig: &str) -> Result<()> {
        self.spawn(
            "kube-scheduler",
            &tools.kube_scheduler,
            &[
                kubeconfig.to_owned(),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()?),
            ],
        )?;
        let pod_stages = Path::new(env!("CARGO_MANIFEST_DIR")).join("kwok/pod-stages.yaml");
        self.spawn(
            "kwok",
            &tools.kwok,
            &[
                kubeconfig.to_owned(),
                format!("--config={}", tools.kwok_stages.display()),
                format!("--config={}", pod_stages.display()),
                "--manage-all-nodes=false".into(),
                format!("--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake"),
                format!("--server-address=127.0.0.1:{}", free_port()?),
            ],
        )?;
        create_kwok_nodes(client, KWOK_NODES).await?;
        self.wait_for_nodes_ready(client, KWOK_NODES).await
    }

    fn spawn(&mut self, name: &'static str, program: &Path, args: &[String]) -> Result<()> {
        self.spawn_with_env(name, program, args, &[])
    }

    /// Starts a process the environment stops with the rest (e.g. holdfast's own binaries for
    /// `make up`), logging to `<name>.log` in the environment's directory.
    pub fn spawn_with_env(
        &mut self,
        name: &'static str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &Path)],
    ) -> Result<()> {
        let root = self.dir()?.to_path_buf();
        let process = ServerProcess::spawn(name, program, args, envs, root.join(format!("{name}.log")))?;
        self.processes.push(process);
        Ok(())
    }

    /// Stops the process started as `name` (SIGTERM, then SIGKILL after `grace`), e.g. to start
    /// it again with [`Env::spawn_with_env`].
    pub fn stop_process(&mut self, name: &str, grace: Duration) -> Result<()> {
        let index = self
            .processes
            .iter()
            .position(|p| p.name() == name)
            .with_context(|| format!("no process {name} in this environment"))?;
        self.processes.remove(index).stop(grace);
        Ok(())
    }

    /// Stops the process started as `name` as `how` says and starts it again with the same
    /// arguments (a server restarted, or SIGKILLed and brought back), its log appended to.
    pub fn respawn_process(&mut self, name: &str, how: Stop) -> Result<()> {
        self.processes
            .iter_mut()
            .find(|p| p.name() == name)
            .with_context(|| format!("no process {name} in this environment"))?
            .respawn(how)
    }

    /// How the process started as `name` exited, if it has (a kubelet would restart it).
    pub fn exited(&mut self, name: &str) -> Result<Option<std::process::ExitStatus>> {
        self.processes
            .iter_mut()
            .find(|p| p.name() == name)
            .with_context(|| format!("no process {name} in this environment"))?
            .exited()
    }

    /// Returns once kube-apiserver answers `/readyz` again (after [`Env::respawn_process`] of
    /// it or of etcd), failing at once if either exited (others may come and go meanwhile: a
    /// controller that lost its Lease exits).
    pub async fn until_apiserver_ready(&mut self) -> Result<()> {
        let (port, ca, token) = (
            self.access.apiserver_port,
            self.access.apiserver_ca.clone(),
            self.access.admin_token.clone(),
        );
        self.wait_for_apiserver(port, &ca, &token, Some(&[ETCD, KUBE_APISERVER]))
            .await
            .map(drop)
    }

    /// The log file of the process started as `name`.
    pub fn log_path(&self, name: &str) -> Option<&Path> {
        self.processes
            .iter()
            .find(|p| p.name() == name)
            .map(ServerProcess::log_path)
    }

    /// The process id of the process started as `name`.
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        self.processes
            .iter()
            .find(|p| p.name() == name)
            .map(ServerProcess::pid)
    }

    fn dir(&self) -> Result<&Path> {
        self.dir
            .as_ref()
            .map(TempDir::path)
            .context("environment already torn down")
    }

    /// Fails fast, with the log, if any process died while we wait for another.
    fn check_processes(&mut self) -> Result<()> {
        self.check_processes_of(None)
    }

    /// [`Env::check_processes`] of the processes `names` names (none: all of them).
    fn check_processes_of(&mut self, names: Option<&[&str]>) -> Result<()> {
        self.processes
            .iter_mut()
            .filter(|p| names.is_none_or(|names| names.contains(&p.name())))
            .try_for_each(ServerProcess::check_running)
    }

    async fn wait_for_registry(&mut self) -> Result<()> {
        let registry = self.access.registry.clone();
        wait_for_registry(&registry, || self.check_processes()).await
    }

    /// A second registry, separate from the shared one, that a test may stop and restart (an
    /// upstream outage) without disturbing other tests. Its content survives a restart.
    pub async fn spare_registry(&self) -> Result<SpareRegistry> {
        self.spare_registry_with_users(&[]).await
    }

    /// A spare registry that answers only the given `(user, password)`s, with basic auth from an
    /// htpasswd file (bcrypt, as distribution requires), when there are any.
    pub async fn spare_registry_with_users(&self, users: &[(&str, &str)]) -> Result<SpareRegistry> {
        let root = self.dir()?.join(unique_name("registry"));
        std::fs::create_dir_all(&root)?;
        let addr = format!("127.0.0.1:{}", free_port()?);
        let config = root.join("registry.yml");
        let mut yaml = registry_config_yaml(&root.join("storage"), &addr);
        if !users.is_empty() {
            let htpasswd = root.join("htpasswd");
            let mut lines = String::new();
            for (user, password) in users {
                // Cost 4, the least bcrypt allows: these are throwaway test passwords.
                lines.push_str(&format!("{user}:{}\n", bcrypt::hash(password, 4)?));
            }
            std::fs::write(&htpasswd, lines)?;
            yaml.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: holdfast-e2e\n    path: {}\n",
                htpasswd.display()
            ));
        }
        std::fs::write(&config, yaml)?;
        let mut spare = SpareRegistry {
            addr,
            config,
            log: root.join("registry.log"),
            process: None,
        };
        spare.start().await?;
        Ok(spare)
    }

    /// Polls `/readyz` (there is nothing to watch before the apiserver is up), failing at once
    /// when one of `watched` exits (none: any process), then writes the kubeconfig and returns a
    /// client.
    async fn wait_for_apiserver(
        &mut self,
        port: u16,
        ca_file: &Path,
        token: &str,
        watched: Option<&[&str]>,
    ) -> Result<Client> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let url = format!("https://127.0.0.1:{port}/readyz");
        let mut http = None;
        let mut last_error = String::from("serving certificate not written yet");
        loop {
            self.check_processes_of(watched)?;
            if http.is_none() && ca_file.is_file() {
                let ca = reqwest::Certificate::from_pem_bundle(&std::fs::read(ca_file)?)?;
                http = Some(
                    reqwest::Client::builder()
                        .tls_certs_only(ca)
                        .timeout(Duration::from_secs(2))
                        .build()?,
                );
            }
            if let Some(client) = &http {
                match client.get(&url).bearer_auth(token).send().await {
                    Ok(rsp) if rsp.status().is_success() => break,
                    Ok(rsp) => last_error = format!("/readyz answered {}", rsp.status()),
                    // With its causes: reqwest's own text says only "error sending request".
                    Err(e) => {
                        last_error = format!("{:#}", anyhow::Error::from(e));
                        // kube-apiserver writes its self-signed certificate as it starts: one
                        // read mid-write trusts nothing, so read it again (a fixture once failed
                        // 90 s of UnknownIssuer against a server serving that very file).
                        http = None;
                    }
                }
            }
            if Instant::now() > deadline {
                let log = self
                    .processes
                    .iter()
                    .find(|p| p.name() == KUBE_APISERVER)
                    .map(|p| p.log_tail(30))
                    .unwrap_or_default();
                bail!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?}: {last_error}; last log lines:\n{log}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::fs::write(&self.access.kubeconfig, kubeconfig_yaml(port, ca_file, token))?;
        self.client().await
    }

    /// The controller manager is useful once its service-account controller runs (Kubernetes
    /// >= 1.24 issues tokens on request, not as Secrets).
    async fn wait_for_service_account(&mut self, client: &Client, namespace: &str) -> Result<()> {
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        let wait = await_condition(api, "default", |sa: Option<&ServiceAccount>| sa.is_some());
        self.until_ready("the default service account (kube-controller-manager)", wait)
            .await
    }

    /// Pods are scheduled once kwok reports the nodes Ready.
    async fn wait_for_nodes_ready(&mut self, client: &Client, count: usize) -> Result<()> {
        let api: Api<Node> = Api::all(client.clone());
        for i in 0..count {
            let name = kwok_node_name(i);
            let wait = await_condition(api.clone(), &name, node_is_ready);
            self.until_ready("the kwok nodes to become Ready", wait).await?;
        }
        Ok(())
    }

    /// Waits for `wait` up to [`READY_TIMEOUT`], failing at once (with its log) if a server exits.
    async fn until_ready<T>(
        &mut self,
        what: &str,
        wait: impl std::future::Future<Output = Result<T, kube::runtime::wait::Error>>,
    ) -> Result<()> {
        tokio::select! {
            done = tokio::time::timeout(READY_TIMEOUT, wait) => {
                done.with_context(|| format!("timed out waiting for {what}"))?
                    .with_context(|| format!("watching for {what}"))?;
                Ok(())
            }
            err = self.watch_for_exit() => Err(err),
        }
    }

    /// Resolves only when a server process has exited, with its log.
    async fn watch_for_exit(&mut self) -> anyhow::Error {
        loop {
            if let Err(e) = self.check_processes() {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Every event of the API server's audit log so far ([`crate::audit`]); only on the local
    /// control plane.
    pub fn audit_log(&self) -> Result<Vec<crate::audit::Event>> {
        if self.is_existing_cluster() {
            bail!("the audit log is kept only on the local control plane");
        }
        let path = self.dir()?.join(AUDIT_LOG);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        crate::audit::parse(&text)
    }

    pub fn boot_time(&self) -> Duration {
        self.boot_time
    }

    /// The real kapp-controller with its packaging API, started on first use and kept for the
    /// rest of the environment's life. On an existing cluster it is assumed installed.
    pub async fn kapp_controller(&self) -> Result<()> {
        if self.is_existing_cluster() {
            return Ok(());
        }
        let started = self
            .kapp_controller
            .get_or_init(|| async {
                let dir = self.dir().map_err(|e| e.to_string())?.join("kapp-controller");
                // Spawned from a runtime worker, like the control plane (see `Env::start`).
                KappController::start(self, &dir)
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
            .await;
        started
            .as_ref()
            .map(drop)
            .map_err(|e| anyhow::anyhow!("kapp-controller failed to start: {e}"))
    }

    /// The end of kapp-controller's logs, when it runs (for a failing test's message).
    pub fn kapp_controller_log(&self, lines: usize) -> String {
        match self.kapp_controller.get() {
            Some(Ok(k)) => k.log_tail(lines),
            _ => String::from("(kapp-controller not running)"),
        }
    }

    /// The real kpack (controller, webhook) with the local-path-provisioner and its stack and
    /// ClusterBuilder ([`crate::peers::kpack`]), started on first use — at v0.17.2, unless
    /// [`Env::korifi`] started it first (at the release Korifi needs) — and kept for the rest of
    /// the environment's life. Only on the local control plane.
    pub async fn kpack(&self) -> Result<&Kpack> {
        self.kpack_at(kpack::V0_17_2).await
    }

    async fn kpack_at(&self, release: kpack::Release) -> Result<&Kpack> {
        if self.is_existing_cluster() {
            bail!("the kpack peer runs only on the local control plane");
        }
        let started = self
            .kpack
            .get_or_init(|| async {
                let dir = self.dir().map_err(|e| e.to_string())?.join("kpack");
                Kpack::start(self, &dir, release)
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
            .await;
        started
            .as_ref()
            .map_err(|e| anyhow::anyhow!("kpack failed to start: {e}"))
    }

    /// The real Korifi controllers with their webhooks ([`crate::peers::korifi`]), on top of
    /// kpack at the release Korifi is built against ([`kpack::V0_17_1`]: an environment where a
    /// test already started kpack v0.17.2 cannot run Korifi), started on first use and kept for
    /// the rest of the environment's life. Only on the local control plane.
    pub async fn korifi(&self) -> Result<&Korifi> {
        self.korifi_on(Korifi::KPACK).await
    }

    /// [`Env::korifi`] on another kpack release (the org-deletion benchmark's v0.16 pair runs
    /// it on [`kpack::V0_16_1`]); the first call decides.
    pub async fn korifi_on(&self, release: kpack::Release) -> Result<&Korifi> {
        if self.is_existing_cluster() {
            bail!("the Korifi peer runs only on the local control plane");
        }
        let kpack = self.kpack_at(release).await?;
        if kpack.release() != release {
            bail!(
                "Korifi was asked to run on kpack {}, but this environment already runs kpack {} (v0.17.2 denies the Images Korifi writes): give Korifi's tests an environment of their own",
                release.version,
                kpack.release().version
            );
        }
        let started = self
            .korifi
            .get_or_init(|| async {
                let dir = self.dir().map_err(|e| e.to_string())?.join("korifi");
                Korifi::start(self, kpack, &dir)
                    .await
                    .map_err(|e| format!("{e:#}"))
            })
            .await;
        started
            .as_ref()
            .map_err(|e| anyhow::anyhow!("Korifi failed to start: {e}"))
    }

    /// The ends of Korifi's and kpack's logs, when they run (for a failing test's message).
    pub fn korifi_log(&self, lines: usize) -> String {
        let korifi = match self.korifi.get() {
            Some(Ok(k)) => k.log_tail(lines),
            _ => String::from("(Korifi not running)"),
        };
        format!("{korifi}\n{}", self.kpack_log(lines))
    }

    /// The end of kpack's logs, when it runs (for a failing test's message).
    pub fn kpack_log(&self, lines: usize) -> String {
        match self.kpack.get() {
            Some(Ok(k)) => k.log_tail(lines),
            _ => String::from("(kpack not running)"),
        }
    }

    /// The CA of kube-apiserver's kubelet client certificate, for a real kubelet's
    /// `authentication.x509.clientCAFile` (`scripts/node.sh`).
    pub fn kubelet_client_ca(&self) -> &Path {
        &self.kubelet_client_ca
    }

    /// PIDs of the servers, in start order (for `make up`'s state file).
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        self.processes.iter().map(|p| (p.name(), p.pid())).collect()
    }

    /// Creates a uniquely named, labelled namespace whose default service account is ready
    /// (pods are rejected by the ServiceAccount admission plugin before that).
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        self.namespace_with_labels(prefix, &[]).await
    }

    /// [`Env::namespace`] with extra labels (e.g. to match a webhook's namespaceSelector).
    pub async fn namespace_with_labels(&self, prefix: &str, labels: &[(&str, &str)]) -> Result<String> {
        let client = self.client().await?;
        let name = unique_name(prefix);
        let mut all = std::collections::BTreeMap::from([(E2E_LABEL.to_string(), "true".to_string())]);
        all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(all),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        let api: Api<ServiceAccount> = Api::namespaced(client, &name);
        let exists = |sa: Option<&ServiceAccount>| sa.is_some();
        tokio::time::timeout(READY_TIMEOUT, await_condition(api, "default", exists))
            .await
            .with_context(|| format!("default service account in {name} never created"))??;
        Ok(name)
    }
}

/// An environment is first of all a way to reach its cluster: `env.client()`, `env.kubectl()`,
/// `env.registry()` are its [`Access`]'s, and the peers (which [`Env`] starts and owns) are
/// started with only that.
impl std::ops::Deref for Env {
    type Target = Access;

    fn deref(&self) -> &Access {
        &self.access
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(Ok(mut korifi)) = self.korifi.take() {
            korifi.stop();
        }
        if let Some(Ok(mut kpack)) = self.kpack.take() {
            kpack.stop();
        }
        if let Some(Ok(mut kapp_controller)) = self.kapp_controller.take() {
            kapp_controller.stop();
        }
        while let Some(mut process) = self.processes.pop() {
            process.stop(Duration::from_secs(5));
        }
        if std::env::var_os("HOLDFAST_KEEP_ENV").is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!("harness: kept {} (HOLDFAST_KEEP_ENV)", dir.keep().display());
        }
    }
}

/// A registry a test can stop and start; see [`Env::spare_registry`].
#[derive(Debug)]
pub struct SpareRegistry {
    pub addr: String,
    config: PathBuf,
    log: PathBuf,
    process: Option<ServerProcess>,
}

impl SpareRegistry {
    pub async fn start(&mut self) -> Result<()> {
        let registry = crate::tools::registry()?;
        let args = ["serve".to_string(), self.config.display().to_string()];
        let mut process = ServerProcess::spawn("docker-registry", &registry, &args, &[], self.log.clone())?;
        wait_for_registry(&self.addr, || process.check_running()).await?;
        self.process = Some(process);
        Ok(())
    }

    /// Stops it (its port then refuses connections); `start` brings it back with its content.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.stop(Duration::from_secs(5));
        }
    }

    /// How many requests in its access log contain `pattern` (e.g. `HEAD /v2/repo/manifests/1.0`).
    pub fn requests_matching(&self, pattern: &str) -> usize {
        self.access_log().matching(pattern)
    }

    /// Its access log, to count requests from another task while the registry stops and starts.
    pub fn access_log(&self) -> AccessLog {
        AccessLog(self.log.clone())
    }
}

/// A spare registry's access log.
#[derive(Debug, Clone)]
pub struct AccessLog(PathBuf);

impl AccessLog {
    /// How many requests in it contain `pattern`.
    pub fn matching(&self, pattern: &str) -> usize {
        let [count] = self.matching_each([pattern]);
        count
    }

    /// How many requests in it contain each of `patterns`, from one read of the log.
    pub fn matching_each<const N: usize>(&self, patterns: [&str; N]) -> [usize; N] {
        let log = self.read();
        patterns.map(|p| log.lines().filter(|l| l.contains(p)).count())
    }

    /// The whole log, one request a line (the registry's combined log format: the request line,
    /// then the status, the size, the referrer and the `User-Agent`); empty while there is none.
    pub fn read(&self) -> String {
        std::fs::read_to_string(&self.0).unwrap_or_default()
    }
}

async fn wait_for_registry(addr: &str, mut check: impl FnMut() -> Result<()>) -> Result<()> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    let url = format!("http://{addr}/v2/");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        check()?;
        // 401: up, and asking for credentials.
        if let Ok(rsp) = http.get(&url).send().await
            && (rsp.status().is_success() || rsp.status() == reqwest::StatusCode::UNAUTHORIZED)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("registry at {url} not ready after {READY_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The CRDs every control plane gets: the peers' upstream CRDs, collected from their Go modules by
/// the install script (kapp-controller's, kpack's, Korifi's), and holdfast's own
/// (`manifests/crds`). Packages are not among them: kapp-controller's aggregated API serves them
/// ([`crate::peers::KappController`]).
pub fn crd_dirs() -> Result<Vec<PathBuf>> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut dirs = Vec::new();
    for peer in ["kapp-controller", "kpack", "korifi"] {
        dirs.push(crate::tools::peer_dir(peer)?.join("crds"));
    }
    dirs.push(crate_dir.join("../manifests/crds"));
    Ok(dirs)
}

/// Nodes that kwok runs (pods scheduled to them reach Running, finish, and go when deleted,
/// after their grace period: `e2e/kwok/pod-stages.yaml`).
pub const KWOK_NODES: usize = 3;
/// The annotation kwok selects the nodes it manages by.
const KWOK_NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";

fn kwok_node_name(i: usize) -> String {
    format!("kwok-node-{i}")
}

async fn create_kwok_nodes(client: &Client, count: usize) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    for i in 0..count {
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": kwok_node_name(i),
                "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                // As a kubelet registers its node (kpack's build pods select kubernetes.io/os).
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": kwok_node_name(i),
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
            // A kubelet reports its disk as ephemeral-storage (Korifi's app pods request it).
            "status": {
                "allocatable": {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "1Ti", "pods": "1000"},
                "capacity": {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "1Ti", "pods": "1000"},
            },
        }))?;
        api.create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating node {}", kwok_node_name(i)))?;
    }
    Ok(())
}

fn node_is_ready(node: Option<&Node>) -> bool {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Creates every CRD found in `dirs` and waits until each is established.
pub async fn install_crds(client: &Client, dirs: &[PathBuf]) -> Result<Vec<String>> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    for crd in load_crds(dirs)? {
        let name = crd.name_any();
        match api.create(&PostParams::default(), &crd).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("creating CRD {name}")),
        }
        names.push(name);
    }
    for name in &names {
        tokio::time::timeout(
            READY_TIMEOUT,
            await_condition(api.clone(), name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not established"))??;
    }
    Ok(names)
}

fn load_crds(dirs: &[PathBuf]) -> Result<Vec<CustomResourceDefinition>> {
    let mut crds = Vec::new();
    for dir in dirs.iter().filter(|d| d.is_dir()) {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file)?;
            for doc in serde_yaml::Deserializer::from_str(&text) {
                let value = serde_yaml::Value::deserialize(doc)?;
                if value.is_null() {
                    continue;
                }
                let crd: CustomResourceDefinition =
                    serde_yaml::from_value(value).with_context(|| format!("parsing {}", file.display()))?;
                crds.push(crd);
            }
        }
    }
    Ok(crds)
}

fn registry_config_yaml(storage: &Path, addr: &str) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
        storage.display()
    )
}

fn kubeconfig_yaml(port: u16, ca_file: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: holdfast-local\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: holdfast-local\n  context:\n    cluster: holdfast-local\n    user: admin\ncurrent-context: holdfast-local\n",
        ca_file.display()
    )
}

fn random_token() -> String {
    let seed = format!(
        "{:?}{}{:?}",
        SystemTime::now(),
        std::process::id(),
        std::thread::current().id()
    );
    hex::encode(Sha256::digest(seed.as_bytes()))
}

/// `prefix-<8 hex>`: unique within the process and across runs.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let digest = Sha256::digest(format!("{nanos}-{}-{n}", std::process::id()).as_bytes());
    format!("{prefix}-{}", &hex::encode(digest)[..8])
}

//! The real kapp-controller (`e2e/peers/kapp-controller`, with vendir, ytt, kapp and, once built, kbld and helm on its `PATH`)
//! as two processes against the local control plane, the way its Deployment runs it: the
//! controller with its aggregated API server for `data.packaging.carvel.dev` (Package,
//! PackageMetadata), and the sidecar that runs vendir/ytt/kapp/kbld for it.
//!
//! Out of a cluster, three things need a route (facts in `../shared/TESTENV.md`):
//! - the aggregated API server builds its client from the in-cluster configuration and writes its
//!   self-signed certificate to the fixed `/home/kapp-controller`: each process runs in a mount
//!   namespace of its own (`unshare`) where a tmpfs over `/home` and `/run` holds those paths and a
//!   service-account directory with the admin token and the API server's CA; nothing is written
//!   outside the environment's directory;
//! - kube-apiserver reaches the APIService through a Service of type ExternalName naming
//!   127.0.0.1 (the aggregator and the webhook client resolve ExternalName to that host, and the
//!   APIService's `service.port` to the port; Endpoints may not hold loopback addresses, and
//!   cluster IPs are never dialled here);
//! - kapp builds its service-account kubeconfig from `KUBERNETES_SERVICE_HOST`/`_PORT` and
//!   `KAPPCTRL_KUBERNETES_CA_DATA`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::{Api, api::DynamicObject};

use crate::{
    access::Access,
    control_plane::Env,
    process::{ServerProcess, free_port},
    tools::peer_bin,
};

/// kapp-controller's system namespace, as its release manifests name it.
pub const NAMESPACE: &str = "kapp-controller";
/// The namespace whose Packages every namespace sees (its release's default).
pub const GLOBAL_NAMESPACE: &str = "kapp-controller-packaging-global";
const API_SERVICE: &str = "v1alpha1.data.packaging.carvel.dev";

/// A running kapp-controller; stopped when dropped.
#[derive(Debug)]
pub struct KappController {
    processes: Vec<ServerProcess>,
}

impl KappController {
    pub(crate) async fn start(env: &Access, dir: &Path) -> Result<Self> {
        let binary = peer_bin("kapp-controller", "kapp-controller")?;
        let mut tools = vec![
            peer_bin("vendir", "vendir")?,
            peer_bin("ytt", "ytt")?,
            peer_bin("kapp", "kapp")?,
        ];
        // kbld (Apps that resolve images with it) and helm (Packages that template a Helm chart,
        // as holdfast's own does): `make deps` builds them, `make up`'s smaller set does not (no
        // App of the demo runs them), so an App that needs them fails naming the missing tool.
        for tool in ["kbld", "helm"] {
            match peer_bin(tool, tool) {
                Ok(path) => tools.push(path),
                Err(_) => eprintln!(
                    "kapp-controller: {tool} is not built (make deps builds it); Apps that run it fail"
                ),
            }
        }
        let path = tool_path(&tools)?;
        let api_port = free_port()?;
        for ns in [NAMESPACE, GLOBAL_NAMESPACE] {
            env.kubectl_apply(
                "default",
                &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"),
            )?;
        }
        env.kubectl_apply(
            NAMESPACE,
            &format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: packaging-api}}\nspec: {{type: ExternalName, externalName: 127.0.0.1}}\n---\napiVersion: apiregistration.k8s.io/v1\nkind: APIService\nmetadata: {{name: {API_SERVICE}}}\nspec:\n  group: data.packaging.carvel.dev\n  version: v1alpha1\n  groupPriorityMinimum: 100\n  versionPriority: 100\n  service: {{name: packaging-api, namespace: {NAMESPACE}, port: {api_port}}}\n"
            ),
        )?;

        std::fs::create_dir_all(dir.join("home"))?;
        let sa = dir.join("serviceaccount");
        std::fs::create_dir_all(&sa)?;
        std::fs::write(sa.join("token"), env.admin_token())?;
        std::fs::copy(env.apiserver_ca(), sa.join("ca.crt"))?;
        std::fs::write(sa.join("namespace"), NAMESPACE)?;
        let ca_data = std::fs::read_to_string(env.apiserver_ca())?;
        let mem_tmp = dir.join("mem-tmp");
        std::fs::create_dir_all(&mem_tmp)?;
        let socket = mem_tmp.join("sidecarexec.sock");
        let port = env.apiserver_port().to_string();
        let api_port = api_port.to_string();
        let envs: Vec<(&str, &Path)> = vec![
            ("PATH", Path::new(&path)),
            ("KUBECONFIG", env.kubeconfig()),
            ("KUBERNETES_SERVICE_HOST", Path::new("127.0.0.1")),
            ("KUBERNETES_SERVICE_PORT", Path::new(&port)),
            ("KAPPCTRL_KUBERNETES_CA_DATA", Path::new(&ca_data)),
            ("KAPPCTRL_SYSTEM_NAMESPACE", Path::new(NAMESPACE)),
            ("KAPPCTRL_MEM_TMP_DIR", mem_tmp.as_path()),
            ("KAPPCTRL_SIDECAREXEC_SOCK", socket.as_path()),
            ("KAPPCTRL_API_PORT", Path::new(&api_port)),
        ];
        let mut this = Self {
            processes: Vec::new(),
        };
        let sidecar = isolated(dir, &sa, &binary, &["--sidecarexec".into()]);
        this.processes.push(ServerProcess::spawn(
            "kapp-controller-sidecarexec",
            Path::new("unshare"),
            &sidecar,
            &envs,
            dir.join("sidecarexec.log"),
        )?);
        let controller = isolated(
            dir,
            &sa,
            &binary,
            &[
                format!("-packaging-global-namespace={GLOBAL_NAMESPACE}"),
                "-metrics-bind-address=0".into(),
                // Its API server library (k8s.io/apiserver 0.27) watches flowcontrol v1beta3,
                // which Kubernetes 1.32 removed: without this it logs a failed watch every second.
                "-enable-api-priority-and-fairness=false".into(),
            ],
        );
        this.processes.push(ServerProcess::spawn(
            "kapp-controller",
            Path::new("unshare"),
            &controller,
            &envs,
            dir.join("controller.log"),
        )?);
        this.wait_available(env).await?;
        this.wait_discovered(env).await?;
        Ok(this)
    }

    /// Polls kube-apiserver's aggregated discovery (its freshness cannot be watched) until the
    /// packaging group is listed and not stale: while any group's discovery is stale the
    /// namespace controller deletes nothing (NamespaceDeletionDiscoveryFailure). kube-apiserver
    /// marks a group stale when it could not reach its server (kapp-controller needs the
    /// APIService before it serves, so the first fetches fail) and retries with a backoff that
    /// grows to a minute; an update of the APIService has it fetched again at once, so a stale
    /// group gets an annotation bumped every 2 s.
    async fn wait_discovered(&mut self, env: &Access) -> Result<()> {
        let client = env.client().await?;
        let services: Api<APIService> = Api::all(client.clone());
        let deadline = std::time::Instant::now() + crate::wait::DEFAULT_TIMEOUT * 2;
        let mut nudged = std::time::Instant::now();
        for nudge in 0u64.. {
            let request = http::Request::get("/apis")
                .header(
                    http::header::ACCEPT,
                    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
                )
                .body(Vec::new())?;
            let discovery: serde_json::Value = serde_json::from_str(&client.request_text(request).await?)?;
            let fresh = discovery["items"].as_array().is_some_and(|groups| {
                groups.iter().any(|group| {
                    group["metadata"]["name"] == "data.packaging.carvel.dev"
                        && group["versions"].as_array().is_some_and(|versions| {
                            versions
                                .iter()
                                .any(|v| v["version"] == "v1alpha1" && v["freshness"] != "Stale")
                        })
                })
            });
            if fresh {
                return Ok(());
            }
            if nudged.elapsed() >= std::time::Duration::from_secs(2) {
                let bump = serde_json::json!({"metadata": {"annotations": {"e2e.holdfast.dev/discovery-nudge": nudge.to_string()}}});
                services
                    .patch(
                        API_SERVICE,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&bump),
                    )
                    .await?;
                nudged = std::time::Instant::now();
            }
            for p in &mut self.processes {
                p.check_running()?;
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "data.packaging.carvel.dev/v1alpha1 still stale in kube-apiserver's discovery after {:?}",
                    crate::wait::DEFAULT_TIMEOUT * 2
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
        Ok(())
    }

    /// The aggregated API is usable once kube-apiserver's availability check of it passes.
    async fn wait_available(&mut self, env: &Access) -> Result<()> {
        let api: Api<APIService> = Api::all(env.client().await?);
        let deadline = std::time::Instant::now() + crate::wait::DEFAULT_TIMEOUT * 2;
        let available = |s: Option<&APIService>| {
            s.and_then(|s| s.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Available" && c.status == "True"))
        };
        let wait = kube::runtime::wait::await_condition(api, API_SERVICE, available);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                done = &mut wait => {
                    done.context("watching the packaging APIService")?;
                    return Ok(());
                }
                () = tokio::time::sleep(std::time::Duration::from_millis(250)) => {
                    for p in &mut self.processes {
                        p.check_running()?;
                    }
                    if std::time::Instant::now() > deadline {
                        anyhow::bail!(
                            "APIService {API_SERVICE} not Available after {:?}; kapp-controller log:\n{}",
                            crate::wait::DEFAULT_TIMEOUT * 2,
                            self.processes[1].log_tail(30)
                        );
                    }
                }
            }
        }
    }

    /// The end of the controller's log, for a failing test's message.
    pub fn log_tail(&self, lines: usize) -> String {
        self.processes
            .iter()
            .map(|p| format!("== {}\n{}", p.name(), p.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub fn stop(&mut self) {
        while let Some(mut p) = self.processes.pop() {
            p.stop(std::time::Duration::from_secs(5));
        }
    }
}

/// The ServiceAccount kapp deploys with in the examples' Apps (`serviceAccountName: deployer`),
/// bound to the `admin` ClusterRole in `namespace`: what a kapp-controller user creates.
pub const DEPLOYER: &str = "deployer";

pub fn add_deployer(env: &Access, namespace: &str) -> Result<()> {
    env.kubectl_apply(
        namespace,
        &format!("apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: {DEPLOYER}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {DEPLOYER}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}}\nsubjects: [{{kind: ServiceAccount, name: {DEPLOYER}}}]\n"),
    )
}

/// An App fetching `url` as [`DEPLOYER`], re-synced every `sync_period`, that deploys what it
/// fetched under names of its own ([`own_names_template`]): many Apps may fetch the same
/// configuration.
pub fn own_names_app(name: &str, url: &str, sync_period: std::time::Duration) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kappctrl.k14s.io/v1alpha1",
        "kind": "App",
        "metadata": {"name": name},
        "spec": {
            "serviceAccountName": DEPLOYER,
            "syncPeriod": format!("{}s", sync_period.as_secs()),
            "fetch": [{"image": {"url": url}}],
            "template": [own_names_template(name)],
            "deploy": [{"kapp": {}}],
        },
    })
}

/// An App's ytt template step with an inline overlay that prefixes every resource's name with
/// `app` (`config` becomes `app-config`), so Apps fetching the same configuration deploy resources
/// of their own: kapp refuses to deploy a resource another App owns.
pub fn own_names_template(app: &str) -> serde_json::Value {
    let overlay = format!(
        "#@ load(\"@ytt:overlay\", \"overlay\")\n#@overlay/match by=overlay.all, expects=\"1+\"\n---\nmetadata:\n  #@overlay/replace via=lambda left, right: right + \"-\" + left\n  name: {app}\n"
    );
    serde_json::json!({"ytt": {"inline": {"paths": {"own-names.yml": overlay}}}})
}

/// The types of the conditions kapp-controller reports True on an App, PackageRepository or
/// PackageInstall (`Reconciling`, `ReconcileSucceeded`, `ReconcileFailed`, …).
pub fn true_conditions(object: &DynamicObject) -> Vec<String> {
    object.data["status"]["conditions"]
        .as_array()
        .map(|c| {
            c.iter()
                .filter(|c| c["status"] == "True")
                .filter_map(|c| c["type"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

pub fn has_condition(object: &DynamicObject, condition: &str) -> bool {
    true_conditions(object).iter().any(|t| t == condition)
}

/// What kapp-controller v0.53 reports when its sidecar's zombie reaper (`reapZombies`: `wait4(-1)`
/// every second) takes the exit status of the vendir/ytt/kbld it is running before `cmd.Wait`
/// does. An upstream race, fixed by carvel-dev/kapp-controller#1806 in no release the module proxy
/// serves here; kapp-controller retries the reconcile, as in a cluster.
const REAPER_RACE: &str = "waitid: no child processes";

/// Whether `object` reports `ReconcileFailed` because of that race, not because of what it fetched.
pub fn failed_by_reaper_race(object: &DynamicObject) -> bool {
    has_condition(object, "ReconcileFailed")
        && object.data["status"]["usefulErrorMessage"]
            .as_str()
            .is_some_and(|m| m.contains(REAPER_RACE))
}

/// Whether `object` reports `ReconcileFailed` for a reason of its own (see [`failed_by_reaper_race`]).
pub fn reconcile_failed(object: &DynamicObject) -> bool {
    has_condition(object, "ReconcileFailed") && !failed_by_reaper_race(object)
}

/// What a watch of Apps saw, per App name, as `record` kept it ([`watch_apps`]).
pub type SeenApps<T> = std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, T>>>;

/// Watches the Apps of `api` until the task is aborted: every applied version goes to
/// `record` with that App's entry of the shared map.
pub fn watch_apps<T: Default + Send + 'static>(
    api: Api<DynamicObject>,
    record: impl Fn(&mut T, &DynamicObject) + Send + 'static,
) -> (SeenApps<T>, tokio::task::JoinHandle<()>) {
    use futures::TryStreamExt as _;
    use kube::{
        ResourceExt as _,
        runtime::{WatchStreamExt as _, watcher},
    };
    let seen = SeenApps::<T>::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let stream = watcher(api, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Ok(Some(app)) = stream.try_next().await {
            let Ok(mut seen) = out.lock() else { return };
            record(seen.entry(app.name_any()).or_default(), &app);
        }
    });
    (seen, task)
}

/// Waits, on a watch, until kapp-controller reports `name` reconciled at its current generation
/// (so after an update too); fails at once if it reports a failure, with its message, except a
/// failure by its reaper race ([`failed_by_reaper_race`]), which it retries: that one is waited
/// through.
pub async fn until_reconciled(env: &Env, api: &Api<DynamicObject>, name: &str) -> Result<DynamicObject> {
    let limit = crate::wait::DEFAULT_TIMEOUT * 2;
    let raced = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen_race = raced.clone();
    let done = move |o: Option<&DynamicObject>| {
        o.is_some_and(|o| {
            if failed_by_reaper_race(o) {
                seen_race.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            // Of the object's current spec: after an update the last reconcile's condition
            // stays until kapp-controller observes the new generation.
            let current = o.data["status"]["observedGeneration"]
                .as_i64()
                .is_none_or(|observed| Some(observed) == o.metadata.generation);
            current && (has_condition(o, "ReconcileSucceeded") || reconcile_failed(o))
        })
    };
    let object = tokio::time::timeout(
        limit,
        kube::runtime::wait::await_condition(api.clone(), name, done),
    )
    .await
    .with_context(|| {
        format!(
            "{name} not reconciled within {limit:?}; kapp-controller:\n{}",
            env.kapp_controller_log(20)
        )
    })??
    .context("object gone")?;
    if raced.load(std::sync::atomic::Ordering::Relaxed) {
        eprintln!("{name}: kapp-controller's reaper race failed a reconcile ({REAPER_RACE}); it retried");
    }
    if has_condition(&object, "ReconcileFailed") {
        bail!(
            "{name} failed to reconcile: {} {}",
            object.data["status"]["usefulErrorMessage"],
            object.data["status"]["friendlyDescription"]
        );
    }
    Ok(object)
}

/// `unshare` arguments that run `binary args…` in a mount namespace of its own where
/// `/home/kapp-controller` is `dir/home` and `/run/secrets/kubernetes.io/serviceaccount` holds
/// `sa` (see the module docs).
fn isolated(dir: &Path, sa: &Path, binary: &Path, args: &[String]) -> Vec<String> {
    let script = "set -e; home=$1 sa=$2; shift 2; \
        mount -t tmpfs tmpfs /home; mkdir /home/kapp-controller; mount --bind \"$home\" /home/kapp-controller; \
        mount -t tmpfs tmpfs /run; mkdir -p /run/secrets/kubernetes.io; \
        mkdir /run/secrets/kubernetes.io/serviceaccount; mount --bind \"$sa\" /run/secrets/kubernetes.io/serviceaccount; \
        exec \"$@\"";
    let mut out = vec![
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "--".into(),
        "sh".into(),
        "-c".into(),
        script.into(),
        "sh".into(),
        dir.join("home").display().to_string(),
        sa.display().to_string(),
        binary.display().to_string(),
    ];
    out.extend(args.iter().cloned());
    out
}

/// `PATH` with the directories of `tools` first.
fn tool_path(tools: &[PathBuf]) -> Result<String> {
    let mut dirs: Vec<PathBuf> = tools
        .iter()
        .map(|t| {
            t.parent()
                .map(Path::to_path_buf)
                .context("tool without a directory")
        })
        .collect::<Result<_>>()?;
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    Ok(std::env::join_paths(dirs)?.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An App as kapp-controller reports a failed reconcile, with `message`.
    fn failed_app(message: &str) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1",
            "kind": "App",
            "metadata": {"name": "web"},
            "status": {
                "conditions": [{"type": "ReconcileFailed", "status": "True", "message": message}],
                "usefulErrorMessage": message,
            },
        }))
        .expect("an App")
    }

    #[test]
    fn the_reaper_race_is_told_apart_from_a_failure_of_the_app() {
        let raced = failed_app("Fetching resources: waitid: no child processes");
        assert!(failed_by_reaper_race(&raced));
        assert!(!reconcile_failed(&raced));

        let refused = failed_app("Fetching resources: connect: connection refused");
        assert!(!failed_by_reaper_race(&refused));
        assert!(reconcile_failed(&refused));

        let mut succeeded = failed_app("Fetching resources: waitid: no child processes");
        succeeded.data["status"]["conditions"][0]["type"] = "ReconcileSucceeded".into();
        assert!(!failed_by_reaper_race(&succeeded));
        assert!(!reconcile_failed(&succeeded));
    }
}

//! holdfast as real pods: `make cluster` ([`holdfast_e2e::cluster`]) starts the control plane, one
//! real node (containerd, runc, kubelet, kube-proxy, kube-router) and installs holdfast onto it
//! with `helm install` of charts/holdfast and the image `make image` builds. The webhook and the
//! controller run in containers there; kube-apiserver calls the webhook through its Service's
//! ClusterIP (kube-proxy) and the pods call kube-apiserver through the `kubernetes` Service.
//!
//! kapp-controller runs there too, as a pod of its own release configuration from an image built
//! here (scripts/kapp-controller.sh), so an App takes the path it takes in a user's cluster.
//!
//! The tests run in order, on the one release: what it runs as, what it admits, what its
//! NetworkPolicies let in, rolling updates and a helm upgrade and rollback under a steady stream of
//! admissions, the controller killed inside its pod, and `helm uninstall`. Then, with the release
//! gone (the other ways install the same names into the same namespace), holdfast installed and
//! removed as its Carvel package by the in-cluster kapp-controller, and last installed with
//! `kubectl apply -k`.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use futures::TryStreamExt as _;
use holdfast_controller::leader::{LEASE, crd::ControllerLease};
use holdfast_e2e::{
    cluster::{Cluster, NAMESPACE, NODE, RELEASE},
    control_plane::unique_name,
    dist, e2e_main, images,
    objects::{api_for, create_all},
    peers::kapp_controller,
    wait,
    webhook::ca_bundle_injected,
};
use k8s_openapi::api::{
    admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    core::v1::Pod,
};
use kube::{
    Api, ResourceExt,
    api::{DynamicObject, ListParams, PostParams},
    core::GroupVersionKind,
    discovery::ApiResource,
    runtime::{WatchStreamExt as _, watcher},
};
use serde_json::{Value, json};

e2e_main!(serial:
    holdfast_runs_restricted_from_its_chart_on_the_real_node,
    a_tagged_app_applied_with_kubectl_is_stored_pinned_and_reconciled,
    a_registry_outage_keeps_the_app_reconciling_on_the_node,
    network_policies_let_only_scrapers_reach_the_admin_ports,
    rolling_updates_and_a_helm_upgrade_and_rollback_fail_no_admission,
    a_drain_of_the_node_stops_at_the_pod_disruption_budgets,
    the_serving_certificate_rotates_through_the_kubelets_secret_projection,
    the_controller_killed_in_its_pod_restarts_and_loses_nothing,
    egress_is_restricted_to_the_api_server_and_the_registries,
    helm_uninstall_removes_the_webhooks_before_the_pods,
    the_carvel_package_installed_by_the_in_cluster_kapp_controller_runs_on_the_node,
    kubectl_apply_k_of_the_recommended_overlay_runs_on_the_node,
);

const WAIT: Duration = Duration::from_secs(180);

fn kubectl_json(cluster: &Cluster, args: &[&str]) -> Result<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    Ok(serde_json::from_str(&cluster.node.run("kubectl", &all)?)?)
}

fn apps(client: kube::Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("kappctrl.k14s.io", "v1alpha1", "App"));
    Api::namespaced_with(client, namespace, &resource)
}

/// `kubectl rollout status` of one of the release's Deployments (at most 3 minutes).
fn rollout_status(cluster: &Cluster, deployment: &str) -> Result<()> {
    cluster.node.run(
        "kubectl",
        &["rollout", "status", "-n", NAMESPACE, deployment, "--timeout=180s"],
    )?;
    Ok(())
}

/// `helm upgrade` of the release to charts/holdfast with its values and `extra`, waited for.
fn helm_upgrade(cluster: &Cluster, extra: &[&str]) -> Result<()> {
    let chart = dist::repo().join("charts/holdfast");
    let chart = chart.to_string_lossy();
    let mut args = vec!["upgrade", RELEASE, &chart, "-n", NAMESPACE, "--reuse-values"];
    args.extend(extra);
    args.extend(["--wait", "--timeout=180s"]);
    cluster.node.helm(&args)?;
    Ok(())
}

/// The release's pods, by name.
fn release_pods(cluster: &Cluster) -> Result<Vec<Value>> {
    let pods = kubectl_json(
        cluster,
        &[
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/name=holdfast",
        ],
    )?;
    Ok(pods["items"].as_array().cloned().unwrap_or_default())
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// `pod` runs on the real node, Ready, and none of its containers has restarted.
fn ready_on_the_node_without_restarts(pod: &Value) -> Result<()> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    ensure!(
        pod["spec"]["nodeName"] == NODE,
        "{name} is not on {NODE}: {}",
        pod["spec"]["nodeName"]
    );
    ensure!(
        is_ready(pod),
        "{name} is not Ready: {}",
        pod["status"]["conditions"]
    );
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    ensure!(!statuses.is_empty(), "{name} reports no container");
    for status in &statuses {
        ensure!(
            status["restartCount"] == 0,
            "{name}'s {} restarted: {}",
            status["name"],
            status["restartCount"]
        );
    }
    Ok(())
}

/// The host PID of a container (`containerd://ID`), from the CRI.
fn container_pid(cluster: &Cluster, container_id: &str) -> Result<u32> {
    let id = container_id
        .strip_prefix("containerd://")
        .with_context(|| format!("{container_id} is not a containerd container"))?;
    let inspect: Value = serde_json::from_str(&cluster.node.run("crictl", &["inspect", id])?)?;
    let pid = inspect["info"]["pid"]
        .as_u64()
        .context("crictl inspect gave no pid")?;
    Ok(u32::try_from(pid)?)
}

/// An image of one ConfigMap, pushed to the cluster's registry as `repository:tag`; its digest.
async fn push_config(cluster: &Cluster, repository: &str, tag: &str) -> Result<String> {
    let image = images::Image::with_files(&[(
        "config/app.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: node-app}\n",
    )])?;
    images::push(cluster.env.registry(), repository, tag, &image).await
}

fn app_yaml(name: &str, url: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: {}\n  fetch: [{{image: {{url: {url}}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n",
        kapp_controller::DEPLOYER
    )
}

fn fetch_url(app: &DynamicObject) -> String {
    app.data["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The node is real, the release's pods run on it Ready through their probes with no restart,
/// as 65532 on a read-only root file system (read from the running processes), in a namespace
/// that enforces Pod Security `restricted`; the webhook configurations call the Service.
async fn holdfast_runs_restricted_from_its_chart_on_the_real_node(cluster: Arc<Cluster>) -> Result<()> {
    let node = kubectl_json(&cluster, &["get", "node", NODE])?;
    let runtime = node["status"]["nodeInfo"]["containerRuntimeVersion"]
        .as_str()
        .unwrap_or_default();
    ensure!(runtime.starts_with("containerd://"), "{NODE} runs {runtime:?}");
    ensure!(
        node["metadata"]["annotations"]["kwok.x-k8s.io/node"].is_null(),
        "{NODE} is a kwok node"
    );

    let namespace = kubectl_json(&cluster, &["get", "namespace", NAMESPACE])?;
    ensure!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted",
        "{NAMESPACE} does not enforce restricted: {}",
        namespace["metadata"]["labels"]
    );
    // Enforced, not only labelled: a root pod is refused at admission.
    let refused = cluster.node.run(
        "kubectl",
        &[
            "run",
            "-n",
            NAMESPACE,
            "root",
            "--image=x",
            "--restart=Never",
            "--overrides",
            r#"{"spec":{"securityContext":{"runAsUser":0}}}"#,
            "--dry-run=server",
        ],
    );
    ensure!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("violates PodSecurity")),
        "a root pod was not refused by Pod Security admission: {refused:?}"
    );

    let pods = release_pods(&cluster)?;
    let components: Vec<&str> = pods
        .iter()
        .filter_map(|p| p["metadata"]["labels"]["app.kubernetes.io/component"].as_str())
        .collect();
    ensure!(
        components.iter().filter(|c| **c == "webhook").count() == 2
            && components.iter().filter(|c| **c == "controller").count() == 2,
        "expected 2 webhook and 2 controller pods, found {components:?}"
    );
    for pod in &pods {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        ready_on_the_node_without_restarts(pod)?;
        for container in pod["spec"]["containers"].as_array().into_iter().flatten() {
            ensure!(
                container["readinessProbe"]["httpGet"].is_object() && container["livenessProbe"].is_object(),
                "{name}: the container has no HTTP readiness probe or no liveness probe"
            );
        }
        for status in pod["status"]["containerStatuses"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let pid = container_pid(&cluster, status["containerID"].as_str().unwrap_or_default())?;
            let proc_status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
            let uids = proc_status
                .lines()
                .find(|l| l.starts_with("Uid:"))
                .unwrap_or_default();
            ensure!(
                uids.split_whitespace().skip(1).all(|u| u == "65532"),
                "{name} runs as {uids:?}, not 65532"
            );
            let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
            let root = mounts
                .lines()
                .map(|l| l.split(' ').collect::<Vec<_>>())
                .find(|f| f.get(4) == Some(&"/"))
                .with_context(|| format!("{name}: no root mount in its mountinfo"))?;
            ensure!(
                root.get(5).is_some_and(|o| o.split(',').any(|o| o == "ro")),
                "{name}: its root file system is mounted {:?}",
                root.get(5)
            );
        }
    }

    let client = cluster.env.client().await?;
    let selector = ListParams::default().labels("app.kubernetes.io/name=holdfast");
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&selector)
        .await?;
    let validating = Api::<ValidatingWebhookConfiguration>::all(client)
        .list(&selector)
        .await?;
    let configs: Vec<Value> = mutating
        .items
        .iter()
        .flat_map(|c| {
            c.webhooks
                .iter()
                .flatten()
                .map(|w| serde_json::to_value(&w.client_config))
        })
        .chain(validating.items.iter().flat_map(|c| {
            c.webhooks
                .iter()
                .flatten()
                .map(|w| serde_json::to_value(&w.client_config))
        }))
        .collect::<Result<_, _>>()?;
    ensure!(!configs.is_empty(), "the release installed no webhook");
    for config in &configs {
        ensure!(
            config["url"].is_null() && config["service"]["name"] == "holdfast-webhook",
            "a webhook does not call the Service: {config}"
        );
        ensure!(
            config["caBundle"].as_str().is_some_and(|b| !b.is_empty()),
            "a webhook has no caBundle"
        );
    }
    Ok(())
}

/// The parent process id and the name (`comm`) of each process on the machine, from /proc.
fn processes() -> Result<BTreeMap<u32, (u32, String)>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        // Gone since the listing: not an error.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_default();
        out.insert(pid, (ppid, comm));
    }
    Ok(out)
}

/// The processes descending from `root` (not `root` itself), with their names.
fn descendants(root: u32) -> Result<Vec<(u32, String)>> {
    let all = processes()?;
    let mut found = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for (pid, (ppid, comm)) in &all {
            if *ppid == parent {
                found.push((*pid, comm.clone()));
                parents.push(*pid);
            }
        }
    }
    Ok(found)
}

/// kapp-controller as `make cluster` runs it (scripts/kapp-controller.sh): its Deployment's one pod
/// Ready on the real node, both containers (the controller, and the sidecar that runs vendir, ytt,
/// kapp, kbld and helm) running the image built here from the cluster's registry; and no kapp-controller
/// among the control plane's host processes (where `make up` runs it). The pod's name.
fn kapp_controller_pod(cluster: &Cluster) -> Result<String> {
    let pods = kubectl_json(
        cluster,
        &[
            "get",
            "pods",
            "-n",
            kapp_controller::NAMESPACE,
            "-l",
            "app=kapp-controller",
        ],
    )?;
    let pods: Vec<Value> = pods["items"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let [pod] = pods.as_slice() else {
        bail!("{} kapp-controller pods, not one: {pods:?}", pods.len());
    };
    let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_string();
    ensure!(
        pod["spec"]["nodeName"] == NODE,
        "{name} is on {}, not on {NODE}",
        pod["spec"]["nodeName"]
    );
    ensure!(is_ready(pod), "{name} is not Ready: {}", pod["status"]);
    let image = format!(
        "{}/kapp-controller",
        cluster.node.var("HOLDFAST_CLUSTER_REGISTRY")?
    );
    let statuses = pod["status"]["containerStatuses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for container in ["kapp-controller", "kapp-controller-sidecarexec"] {
        let status = statuses
            .iter()
            .find(|s| s["name"] == container)
            .with_context(|| format!("{name} has no container {container}"))?;
        ensure!(
            status["ready"] == true && status["state"]["running"].is_object(),
            "{name}'s {container} is not running and ready: {status}"
        );
        // imageID: the reference pulled (`image` is the config's digest when pulled by digest).
        ensure!(
            status["imageID"].as_str().is_some_and(|i| i.starts_with(&image)),
            "{name}'s {container} runs {}, not {image}",
            status["imageID"]
        );
    }
    let localenv = cluster
        .localenv_pid()
        .context("the control plane's process is gone")?;
    let host: Vec<(u32, String)> = descendants(localenv)?
        .into_iter()
        .filter(|(_, comm)| comm.starts_with("kapp-controller"))
        .collect();
    ensure!(
        host.is_empty(),
        "kapp-controller runs as host processes of the control plane: {host:?}"
    );
    Ok(name)
}

/// The end of the log of kapp-controller's pod `pod` (its controller container).
fn kapp_controller_log(cluster: &Cluster, pod: &str) -> Result<String> {
    cluster.node.run(
        "kubectl",
        &[
            "logs",
            "-n",
            kapp_controller::NAMESPACE,
            pod,
            "-c",
            "kapp-controller",
            "--tail=2000",
        ],
    )
}

/// Through the in-cluster webhook: a tagged App applied with kubectl is stored at the tag's
/// digest, and the in-cluster kapp-controller (its pod on the real node; no host process runs
/// one) reconciles it from that digest, as its log says.
async fn a_tagged_app_applied_with_kubectl_is_stored_pinned_and_reconciled(
    cluster: Arc<Cluster>,
) -> Result<()> {
    let env = &cluster.env;
    let pod = kapp_controller_pod(&cluster)?;
    let registry = env.registry();
    let digest = push_config(&cluster, "node/app", "1.0.0").await?;
    let namespace = env.namespace("node-app").await?;
    kapp_controller::add_deployer(env, &namespace)?;
    env.kubectl_apply(
        &namespace,
        &app_yaml("tagged", &format!("{registry}/node/app:1.0.0")),
    )?;
    let api = apps(env.client().await?, &namespace);
    let stored = api.get("tagged").await?;
    ensure!(
        fetch_url(&stored) == format!("{registry}/node/app@{digest}"),
        "stored as {}, not pinned to {digest}",
        fetch_url(&stored)
    );
    until_reconciled_by_the_pod(&cluster, &api, "tagged", &pod).await?;
    let configmap = kubectl_json(&cluster, &["get", "configmap", "-n", &namespace, "node-app"]);
    ensure!(
        configmap.is_ok(),
        "kapp-controller did not deploy the App's ConfigMap: {configmap:?}"
    );
    // The pod that reconciled it is the one checked above (not replaced since), and says so.
    ensure!(
        kapp_controller_pod(&cluster)? == pod,
        "kapp-controller's pod {pod} was replaced while the App reconciled"
    );
    let log = kapp_controller_log(&cluster, &pod)?;
    ensure!(
        log.lines()
            .any(|l| l.contains("Completed deploy") && l.contains(&namespace) && l.contains("tagged")),
        "kapp-controller's pod {pod} logged no deploy of {namespace}/tagged:\n{log}"
    );
    Ok(())
}

/// The outage test's Apps' sync period: the shortest kapp-controller honours
/// (`AppMinimumSyncPeriod`, 30 s; it requeues a little later, with jitter).
const SYNC_PERIOD: Duration = Duration::from_secs(30);
/// The longest outage the test waits through for its outcome: about five sync periods.
const OUTAGE_LIMIT: Duration = Duration::from_secs(180);

/// An App `name` fetching `url` every [`SYNC_PERIOD`]; `pin: false` opts it out of holdfast
/// (`holdfast.dev/pin: disabled`), so it stays on its tag, as without holdfast.
fn syncing_app_yaml(name: &str, url: &str, pin: bool) -> String {
    let annotations = if pin {
        String::new()
    } else {
        "\n  annotations: {holdfast.dev/pin: disabled}".to_string()
    };
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata:\n  name: {name}{annotations}\nspec:\n  serviceAccountName: {}\n  syncPeriod: {}s\n  fetch: [{{image: {{url: {url}}}}}]\n  template: [{{ytt: {{}}}}, {}]\n  deploy: [{{kapp: {{}}}}]\n",
        kapp_controller::DEPLOYER,
        SYNC_PERIOD.as_secs(),
        kapp_controller::own_names_template(name),
    )
}

/// [`kapp_controller::until_reconciled`], failing with the log of kapp-controller's pod `pod`.
async fn until_reconciled_by_the_pod(
    cluster: &Cluster,
    api: &Api<DynamicObject>,
    name: &str,
    pod: &str,
) -> Result<()> {
    kapp_controller::until_reconciled(&cluster.env, api, name)
        .await
        .with_context(|| {
            format!(
                "kapp-controller's pod {pod}:\n{}",
                kapp_controller_log(cluster, pod).unwrap_or_else(|e| format!("{e:#}"))
            )
        })?;
    Ok(())
}

/// What a watch saw of one App.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// Status versions reporting `ReconcileFailed` for a reason of the App's own.
    failed: usize,
    /// When each successful sync's fetch began (`status.fetch.startedAt` reported with
    /// `ReconcileSucceeded`): one per successful sync.
    succeeded_syncs: std::collections::BTreeSet<k8s_openapi::jiff::Timestamp>,
}

impl Seen {
    /// Successful syncs whose fetch began after `at`.
    fn synced_after(&self, at: k8s_openapi::jiff::Timestamp) -> usize {
        self.succeeded_syncs.iter().filter(|s| **s > at).count()
    }
}

/// Watches the Apps of `api` until aborted; the shared map holds what it saw.
fn watch_apps(api: Api<DynamicObject>) -> (kapp_controller::SeenApps<Seen>, tokio::task::JoinHandle<()>) {
    kapp_controller::watch_apps(api, |entry: &mut Seen, app| {
        if kapp_controller::reconcile_failed(app) {
            entry.failed += 1;
        }
        if kapp_controller::has_condition(app, "ReconcileSucceeded")
            && let Some(at) = app.data["status"]["fetch"]["startedAt"]
                .as_str()
                .and_then(|at| at.parse().ok())
        {
            entry.succeeded_syncs.insert(at);
        }
    })
}

/// The registry made unreachable from the node (`scripts/node.sh registry-outage on`: its address
/// refuses the pods' connections, as a registry that is down): the App holdfast pinned keeps
/// reconciling in the in-cluster kapp-controller, from vendir's cache of what it fetched by digest
/// (successful syncs after the outage began, no failure), while an App opted out of holdfast, on
/// its tag, fails (the outage is real).
async fn a_registry_outage_keeps_the_app_reconciling_on_the_node(cluster: Arc<Cluster>) -> Result<()> {
    let env = &cluster.env;
    let pod = kapp_controller_pod(&cluster)?;
    let registry = env.registry();
    let digest = push_config(&cluster, "node/outage", "1.0.0").await?;
    let url = format!("{registry}/node/outage:1.0.0");
    let namespace = env.namespace("node-outage").await?;
    kapp_controller::add_deployer(env, &namespace)?;
    env.kubectl_apply(&namespace, &syncing_app_yaml("pinned", &url, true))?;
    env.kubectl_apply(&namespace, &syncing_app_yaml("tagged", &url, false))?;
    let api = apps(env.client().await?, &namespace);
    for name in ["pinned", "tagged"] {
        until_reconciled_by_the_pod(&cluster, &api, name, &pod).await?;
    }
    let pinned = api.get("pinned").await?;
    ensure!(
        fetch_url(&pinned) == format!("{registry}/node/outage@{digest}"),
        "pinned stored as {}, not pinned to {digest}",
        fetch_url(&pinned)
    );
    let tagged = api.get("tagged").await?;
    ensure!(
        fetch_url(&tagged) == url,
        "the App opted out of holdfast was changed: {}",
        fetch_url(&tagged)
    );
    cluster.node.script("node.sh", &["registry-outage", "on"])?;
    let started = std::time::Instant::now();
    // Syncs count when their fetch began after this (the status has whole seconds): during the
    // outage.
    let began = k8s_openapi::jiff::Timestamp::now();
    let (seen, watch) = watch_apps(api.clone());
    // Until the pinned App has synced twice since the outage began and the tag App has failed, at
    // most OUTAGE_LIMIT; the outcome is judged below from what the watch saw.
    let done = || {
        seen.lock().is_ok_and(|s| {
            s.get("tagged").is_some_and(|t| t.failed > 0)
                && s.get("pinned").is_some_and(|p| p.synced_after(began) >= 2)
        })
    };
    while !done() && started.elapsed() < OUTAGE_LIMIT {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let outage = started.elapsed();
    watch.abort();
    cluster.node.script("node.sh", &["registry-outage", "off"])?;

    let seen = seen.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.clone();
    let pinned = seen.get("pinned").cloned().unwrap_or_default();
    let tagged = seen.get("tagged").cloned().unwrap_or_default();
    let synced = pinned.synced_after(began);
    ensure!(
        tagged.failed > 0,
        "the tag App never failed in {outage:?} of outage: the registry was not unreachable from the node"
    );
    ensure!(
        pinned.failed == 0,
        "the pinned App failed {} times during the outage",
        pinned.failed
    );
    ensure!(
        synced >= 2,
        "the pinned App did not keep reconciling: {synced} successful syncs in {outage:?} of outage"
    );
    ensure!(
        kapp_controller_pod(&cluster)? == pod,
        "kapp-controller's pod {pod} was replaced during the outage"
    );
    eprintln!(
        "registry outage of {outage:?} on the node: the pinned App synced {synced} times, 0 failures; the tag App failed {} times",
        tagged.failed
    );
    Ok(())
}

/// Whether a pod in `namespace` opens a TCP connection to `target`.
fn connects(cluster: &Cluster, namespace: &str, pod: &str, target: &str) -> bool {
    cluster
        .node
        .run(
            "kubectl",
            &[
                "exec",
                "-n",
                namespace,
                pod,
                "--",
                "/netcheck",
                "connect",
                target,
                "3",
            ],
        )
        .is_ok()
}

fn client_pod(cluster: &Cluster, namespace: &str) -> Result<()> {
    labelled_client_pod(cluster, namespace, "client", &json!({}))
}

/// A netcheck pod (e2e/netcheck/netcheck.c) `name` in `namespace`, labelled `labels`, on the real node (Pod Security
/// `restricted`), Ready.
fn labelled_client_pod(cluster: &Cluster, namespace: &str, name: &str, labels: &Value) -> Result<()> {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "tolerations": [{"key": cluster.node.var("HOLDFAST_NODE_TAINT")?, "operator": "Exists", "effect": "NoSchedule"}],
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": cluster.node.var("HOLDFAST_NETCHECK_IMAGE")?, "args": ["pause"],
                "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
            }]
        }
    });
    cluster.env.kubectl_apply(namespace, &pod.to_string())?;
    cluster.node.run(
        "kubectl",
        &[
            "wait",
            "-n",
            namespace,
            "--for=condition=Ready",
            &format!("pod/{name}"),
            "--timeout=90s",
        ],
    )?;
    Ok(())
}

/// kube-router enforces the chart's NetworkPolicies: the admin ports (metrics, probes' twin) of
/// both Deployments refuse a pod of an unlabelled namespace and let in one of a namespace labelled
/// `holdfast.dev/metrics-scraper=true`; the webhook port stays open (the API server calls it).
async fn network_policies_let_only_scrapers_reach_the_admin_ports(cluster: Arc<Cluster>) -> Result<()> {
    let env = &cluster.env;
    let other = env.namespace("node-other").await?;
    let scraper = env
        .namespace_with_labels("node-scraper", &[("holdfast.dev/metrics-scraper", "true")])
        .await?;
    client_pod(&cluster, &other)?;
    client_pod(&cluster, &scraper)?;
    let pods = release_pods(&cluster)?;
    let address = |component: &str, port: u16| -> Result<String> {
        let pod = pods
            .iter()
            .find(|p| p["metadata"]["labels"]["app.kubernetes.io/component"] == component)
            .with_context(|| format!("no {component} pod"))?;
        Ok(format!(
            "{}:{port}",
            pod["status"]["podIP"].as_str().unwrap_or_default()
        ))
    };
    for target in [address("webhook", 8080)?, address("controller", 8081)?] {
        // The new pods' addresses reach kube-router's sets within seconds: wait for the allowed
        // one, then the other must stay refused.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !connects(&cluster, &scraper, "client", &target) {
            ensure!(
                std::time::Instant::now() < deadline,
                "the scraper's pod never reached {target}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        ensure!(
            !connects(&cluster, &other, "client", &target),
            "a pod of an unlabelled namespace reached the admin port {target}"
        );
    }
    let webhook = address("webhook", 8443)?;
    ensure!(
        connects(&cluster, &other, "client", &webhook),
        "the webhook port {webhook} is closed to pods"
    );
    Ok(())
}

/// `networkPolicy.egress` (`components/restrict-egress`) set to this node's API server endpoint
/// and registry, enforced by kube-router: holdfast keeps working under it (both Deployments roll
/// out Ready and the in-cluster webhook pins a tag it must ask the registry for), and a pod the
/// policy selects reaches the registry but not the kubelet's port on the same address, which an
/// unselected pod reaches. The release gets its egress back afterwards.
async fn egress_is_restricted_to_the_api_server_and_the_registries(cluster: Arc<Cluster>) -> Result<()> {
    let node_ip = cluster.node.var("HOLDFAST_NODE_IP")?.to_owned();
    let registry = cluster.node.var("HOLDFAST_CLUSTER_REGISTRY")?.to_owned();
    let registry_port = registry
        .rsplit_once(':')
        .map(|(_, p)| p.to_owned())
        .context("registry port")?;
    let slices = kubectl_json(
        &cluster,
        &[
            "get",
            "endpointslices",
            "-n",
            "default",
            "-l",
            "kubernetes.io/service-name=kubernetes",
        ],
    )?;
    let api_port = slices["items"][0]["ports"][0]["port"]
        .as_u64()
        .context("the kubernetes Service's endpoint port")?;
    let node = kubectl_json(&cluster, &["get", "node", NODE])?;
    let kubelet_port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .context("the kubelet's port")?;
    // kube-router lets any pod reach a local port in the NodePort range whatever the policies.
    ensure!(
        !(30000..=32767).contains(&kubelet_port),
        "the kubelet listens on {kubelet_port}, in the NodePort range kube-router always allows"
    );
    let cidr = format!("{node_ip}/32");
    let restricted = [
        "--set".to_owned(),
        "networkPolicy.egress.enabled=true".to_owned(),
        "--set".to_owned(),
        format!("networkPolicy.egress.apiServerCIDRs={{{cidr}}}"),
        "--set".to_owned(),
        format!("networkPolicy.egress.apiServerPorts={{{api_port}}}"),
        "--set".to_owned(),
        format!("networkPolicy.egress.registryCIDRs={{{cidr}}}"),
        "--set".to_owned(),
        format!("networkPolicy.egress.registryPorts={{{registry_port}}}"),
    ];
    let restricted: Vec<&str> = restricted.iter().map(String::as_str).collect();
    helm_upgrade(&cluster, &restricted)?;
    let result = under_restricted_egress(&cluster, &format!("{node_ip}:{kubelet_port}"), &registry).await;
    helm_upgrade(&cluster, &["--set", "networkPolicy.egress.enabled=false"])?;
    result
}

async fn under_restricted_egress(cluster: &Cluster, kubelet: &str, registry: &str) -> Result<()> {
    let env = &cluster.env;
    ensure!(
        kubectl_json(
            cluster,
            &["get", "networkpolicy", "-n", NAMESPACE, "holdfast-egress"]
        )
        .is_ok(),
        "the release has no holdfast-egress policy"
    );
    // A tag nothing has resolved yet: the webhook must reach the registry (and the API server).
    let digest = push_config(cluster, "node/egress", "1.0.0").await?;
    let namespace = env.namespace("node-egress").await?;
    env.kubectl_apply(
        &namespace,
        &app_yaml("egress", &format!("{}/node/egress:1.0.0", env.registry())),
    )?;
    let stored = apps(env.client().await?, &namespace).get("egress").await?;
    ensure!(
        fetch_url(&stored) == format!("{}/node/egress@{digest}", env.registry()),
        "under restricted egress, stored as {}",
        fetch_url(&stored)
    );
    // Enforced: a pod the policy selects, beside one it does not.
    let other = env.namespace("node-egress-other").await?;
    client_pod(cluster, &other)?;
    labelled_client_pod(
        cluster,
        NAMESPACE,
        "egress-client",
        &json!({"app.kubernetes.io/name": "holdfast"}),
    )?;
    let result = async {
        ensure!(
            connects(cluster, &other, "client", kubelet),
            "an unselected pod does not reach the kubelet at {kubelet}: nothing to compare with"
        );
        // kube-router takes a new pod into its sets within seconds: until then its traffic is
        // not yet filtered. Wait for the refusal, then the registry must still be reached.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while connects(cluster, NAMESPACE, "egress-client", kubelet) {
            ensure!(
                std::time::Instant::now() < deadline,
                "a pod under the egress policy still reaches the kubelet at {kubelet} after 60 s"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        ensure!(
            connects(cluster, NAMESPACE, "egress-client", registry),
            "a pod under the egress policy does not reach the registry {registry}"
        );
        Ok(())
    }
    .await;
    // Gone before the next test: it carries the release's labels, and the uninstall's watch of
    // the release's pods would see it go.
    cluster.node.run(
        "kubectl",
        &[
            "delete",
            "pod",
            "-n",
            NAMESPACE,
            "egress-client",
            "--grace-period=1",
            "--timeout=180s",
        ],
    )?;
    result
}

/// What a stream of App creations saw.
#[derive(Debug, Default)]
struct Admissions {
    created: usize,
    failed: Vec<String>,
    unpinned: Vec<String>,
}

/// Creates a tagged App every 100 ms until `stop`; each must be admitted and come back pinned. The
/// creations are server-side dry runs: they pass every admission step a stored write passes (the
/// webhook's `sideEffects: None` lets the API server call it), but store nothing, so the thousand
/// Apps of a stream leave no work for the in-cluster kapp-controller (stored, even paused, they
/// queued the package test's App past its deadline).
async fn admit_steadily(api: Api<DynamicObject>, url: String, stop: Arc<AtomicBool>) -> Admissions {
    let mut seen = Admissions::default();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let name = unique_name("steady");
        let app: DynamicObject = match serde_yaml::from_str(&app_yaml(&name, &url)) {
            Ok(app) => app,
            Err(e) => {
                seen.failed.push(format!("{name}: {e}"));
                continue;
            }
        };
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match api.create(&dry_run, &app).await {
            Ok(stored) if fetch_url(&stored).contains("@sha256:") => seen.created += 1,
            Ok(stored) => seen.unpinned.push(format!("{name}: {}", fetch_url(&stored))),
            Err(e) => seen.failed.push(format!("{name}: {e}")),
        }
    }
    seen
}

/// `kubectl rollout restart` of the webhook, then a `helm upgrade` (a changed pod template rolls
/// both Deployments) and a `helm rollback`, with an App created every 100 ms throughout: every one
/// is admitted, and stored pinned.
async fn rolling_updates_and_a_helm_upgrade_and_rollback_fail_no_admission(
    cluster: Arc<Cluster>,
) -> Result<()> {
    let env = &cluster.env;
    let digest = push_config(&cluster, "node/steady", "1.0.0").await?;
    let namespace = env.namespace("node-steady").await?;
    let api = apps(env.client().await?, &namespace);
    let stop = Arc::new(AtomicBool::new(false));
    let stream = tokio::spawn(admit_steadily(
        api,
        format!("{}/node/steady:1.0.0", env.registry()),
        stop.clone(),
    ));
    let rolled = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || -> Result<()> {
            std::thread::sleep(Duration::from_secs(3));
            let deployment = "deployment/holdfast-webhook";
            cluster
                .node
                .run("kubectl", &["rollout", "restart", "-n", NAMESPACE, deployment])?;
            rollout_status(&cluster, deployment)?;
            helm_upgrade(
                &cluster,
                &[
                    "--set",
                    "webhook.podAnnotations.holdfast\\.dev/rolled=upgrade",
                    "--set",
                    "controller.podAnnotations.holdfast\\.dev/rolled=upgrade",
                ],
            )?;
            cluster
                .node
                .helm(&["rollback", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s"])?;
            std::thread::sleep(Duration::from_secs(3));
            Ok(())
        }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let seen = stream.await?;
    rolled??;
    eprintln!(
        "steady admissions through the rollouts: {} pinned, {} failed, {} unpinned (digest {digest})",
        seen.created,
        seen.failed.len(),
        seen.unpinned.len()
    );
    ensure!(
        seen.failed.is_empty() && seen.unpinned.is_empty(),
        "admissions failed or went unpinned during the rollouts: {seen:?}"
    );
    ensure!(
        seen.created >= 50,
        "only {} admissions ran through the rollouts",
        seen.created
    );
    let history = cluster
        .node
        .helm(&["history", RELEASE, "-n", NAMESPACE, "-o", "json"])?;
    let revisions: Vec<Value> = serde_json::from_str(&history)?;
    ensure!(
        revisions.len() >= 3,
        "helm history shows {} revisions",
        revisions.len()
    );
    Ok(())
}

/// `kubectl drain` of the one node: it evicts one pod of each Deployment, and the
/// PodDisruptionBudgets refuse the second eviction (its replacement cannot be scheduled on the
/// cordoned node, and no other node runs containers), so a replica of each keeps serving; once the
/// node is uncordoned both Deployments are whole again.
async fn a_drain_of_the_node_stops_at_the_pod_disruption_budgets(cluster: Arc<Cluster>) -> Result<()> {
    let out = cluster
        .node
        .command("kubectl")
        .args([
            "drain",
            NODE,
            "--pod-selector=app.kubernetes.io/name=holdfast",
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=30s",
        ])
        .output()?;
    let during = release_pods(&cluster)?;
    cluster.node.run("kubectl", &["uncordon", NODE])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the drain went through: {stderr}");
    ensure!(
        stderr.contains("disruption budget"),
        "the drain did not stop at a PodDisruptionBudget: {stderr}"
    );
    for component in ["webhook", "controller"] {
        let serving = during
            .iter()
            .filter(|p| {
                p["metadata"]["labels"]["app.kubernetes.io/component"] == component
                    && p["metadata"]["deletionTimestamp"].is_null()
                    && is_ready(p)
            })
            .count();
        ensure!(serving >= 1, "no {component} pod was left serving by the drain");
    }
    for deployment in ["deployment/holdfast-webhook", "deployment/holdfast-controller"] {
        rollout_status(&cluster, deployment)?;
    }
    Ok(())
}

/// The leaf certificate a webhook pod presents on its TLS port (trusting `ca_pem`), as DER.
async fn served_leaf(address: &str, ca_pem: &str) -> Result<Vec<u8>> {
    let config = holdfast_certs::client_config(ca_pem)?;
    let tcp = tokio::net::TcpStream::connect(address).await?;
    let name = rustls::pki_types::ServerName::try_from(format!("holdfast-webhook.{NAMESPACE}.svc"))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let (_, session) = tls.get_ref();
    let leaf = session
        .peer_certificates()
        .and_then(|c| c.first())
        .context("no certificate served")?;
    Ok(leaf.to_vec())
}

fn der_of(pem: &str) -> Result<Vec<u8>> {
    use rustls::pki_types::{CertificateDer, pem::PemObject as _};
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?.to_vec())
}

/// The webhook's own CA plus `extra`, in every webhook of both configurations (what
/// cert-manager's CA injector does for `certMode: cert-manager`).
async fn add_to_ca_bundles(client: &kube::Client, extra: &str) -> Result<()> {
    extend_bundles(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        extra,
        |c| {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        },
    )
    .await?;
    extend_bundles(
        Api::<ValidatingWebhookConfiguration>::all(client.clone()),
        extra,
        |c| {
            c.webhooks
                .iter_mut()
                .flatten()
                .map(|w| &mut w.client_config)
                .collect()
        },
    )
    .await
}

async fn extend_bundles<K>(
    api: Api<K>,
    extra: &str,
    client_configs: fn(&mut K) -> Vec<&mut WebhookClientConfig>,
) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut config = api.get("holdfast").await?;
    for client_config in client_configs(&mut config) {
        let bundle = client_config.ca_bundle.get_or_insert_with(Default::default);
        bundle.0.extend_from_slice(extra.as_bytes());
    }
    api.replace("holdfast", &PostParams::default(), &config).await?;
    Ok(())
}

/// Certificate files from a Secret the kubelet projects into the pods (how `certMode:
/// cert-manager` serves, here with a CA of the test's and `webhook.extraArgs`/`extraVolumes`, so
/// no cert-manager is needed): the Secret gets a new leaf, the kubelet swaps the mounted files
/// (its atomic `..data` symlink), and each webhook pod serves the new certificate without a
/// restart, while an App created every 100 ms is admitted and pinned throughout.
async fn the_serving_certificate_rotates_through_the_kubelets_secret_projection(
    cluster: Arc<Cluster>,
) -> Result<()> {
    let env = &cluster.env;
    let client = env.client().await?;
    let ca = holdfast_certs::CertificateAuthority::generate(&holdfast_certs::CaOptions::default())?;
    let options = holdfast_certs::ServingOptions::for_service("holdfast-webhook", NAMESPACE);
    let first = ca.issue_serving(&options)?;
    let secret = |leaf: &holdfast_certs::ServingCert| {
        json!({
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "holdfast-file-tls"},
            "stringData": {"tls.crt": leaf.cert_pem, "tls.key": leaf.key_pem},
        })
        .to_string()
    };
    env.kubectl_apply(NAMESPACE, &secret(&first))?;
    // Both CAs are trusted while the pods move from the self-managed certificate to the files.
    add_to_ca_bundles(&client, ca.cert_pem()).await?;
    let values = tempfile::NamedTempFile::new()?;
    std::fs::write(
        values.path(),
        json!({"webhook": {
            "extraArgs": ["--tls-cert-file=/var/run/holdfast/file-tls/tls.crt",
                          "--tls-key-file=/var/run/holdfast/file-tls/tls.key", "--tls-poll-seconds=2"],
            "extraVolumes": [{"name": "file-tls", "secret": {"secretName": "holdfast-file-tls"}}],
            "extraVolumeMounts": [{"name": "file-tls", "mountPath": "/var/run/holdfast/file-tls", "readOnly": true}],
        }})
        .to_string(),
    )?;
    helm_upgrade(&cluster, &["--values", &values.path().to_string_lossy()])?;
    rollout_status(&cluster, "deployment/holdfast-webhook")?;
    let webhooks: Vec<String> = release_pods(&cluster)?
        .iter()
        .filter(|p| {
            p["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
                && p["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|p| format!("{}:8443", p["status"]["podIP"].as_str().unwrap_or_default()))
        .collect();
    ensure!(
        webhooks.len() == 2,
        "expected 2 webhook pods after the upgrade: {webhooks:?}"
    );
    for address in &webhooks {
        ensure!(
            served_leaf(address, ca.cert_pem()).await? == der_of(&first.cert_pem)?,
            "{address} does not serve the file's certificate"
        );
    }

    let digest = push_config(&cluster, "node/rotation", "1.0.0").await?;
    let namespace = env.namespace("node-rotation").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let stream = tokio::spawn(admit_steadily(
        apps(client.clone(), &namespace),
        format!("{}/node/rotation:1.0.0", env.registry()),
        stop.clone(),
    ));
    let second = ca.issue_serving(&options)?;
    env.kubectl_apply(NAMESPACE, &secret(&second))?;
    let rotated_at = std::time::Instant::now();
    let wanted = der_of(&second.cert_pem)?;
    let mut rotated = Ok(());
    for address in &webhooks {
        loop {
            if served_leaf(address, ca.cert_pem())
                .await
                .is_ok_and(|leaf| leaf == wanted)
            {
                break;
            }
            if rotated_at.elapsed() > WAIT {
                rotated = Err(anyhow::anyhow!(
                    "{address} still serves the old certificate after {WAIT:?}"
                ));
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    // A few more admissions on the new certificate.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let seen = stream.await?;
    rotated?;
    eprintln!(
        "rotation through the projection took {:.0} s; admissions meanwhile: {} pinned, {} failed, {} unpinned (digest {digest})",
        rotated_at.elapsed().as_secs_f64(),
        seen.created,
        seen.failed.len(),
        seen.unpinned.len()
    );
    ensure!(
        seen.failed.is_empty() && seen.unpinned.is_empty(),
        "admissions failed during the rotation: {seen:?}"
    );
    for pod in release_pods(&cluster)? {
        if pod["metadata"]["labels"]["app.kubernetes.io/component"] == "webhook"
            && pod["metadata"]["deletionTimestamp"].is_null()
        {
            ensure!(
                pod["status"]["containerStatuses"][0]["restartCount"] == 0,
                "{} restarted during the rotation",
                pod["metadata"]["name"]
            );
        }
    }
    Ok(())
}

/// The controller's leader SIGKILLed inside its container: the kubelet restarts the container, a
/// new leader's term begins, and what the cluster holds is intact (the cache entries, a pinned
/// App), while a new App is still pinned.
async fn the_controller_killed_in_its_pod_restarts_and_loses_nothing(cluster: Arc<Cluster>) -> Result<()> {
    let env = &cluster.env;
    let client = env.client().await?;
    let digest = push_config(&cluster, "node/kill", "1.0.0").await?;
    let namespace = env.namespace("node-kill").await?;
    let api = apps(client.clone(), &namespace);
    let url = format!("{}/node/kill:1.0.0", env.registry());
    env.kubectl_apply(&namespace, &app_yaml("before", &url))?;
    let before = fetch_url(&api.get("before").await?);
    ensure!(before.ends_with(&digest), "not pinned before the kill: {before}");

    let entries = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("holdfast.dev", "v1alpha1", "DigestCacheEntry"),
        "digestcacheentries",
    );
    let entries: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &entries);
    let names = |list: kube::core::ObjectList<DynamicObject>| -> Vec<String> {
        let mut names: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
        names.sort();
        names
    };
    let cached = names(entries.list(&ListParams::default()).await?);
    ensure!(
        !cached.is_empty(),
        "no DigestCacheEntry in {NAMESPACE} before the kill"
    );

    let leases: Api<ControllerLease> = Api::namespaced(client.clone(), NAMESPACE);
    let lease = leases.get(LEASE).await?;
    let leader = lease
        .spec
        .holder_identity
        .clone()
        .context("the controller's ControllerLease has no holder")?;
    let pod = kubectl_json(&cluster, &["get", "pod", "-n", NAMESPACE, &leader])?;
    let container = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .unwrap_or_default();
    let pid = container_pid(&cluster, container)?;
    cluster.node.run("kill", &["-KILL", &pid.to_string()])?;
    let killed_at = std::time::SystemTime::now();
    eprintln!("SIGKILLed the leader {leader} (pid {pid})");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let restarted = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.restart_count >= 1 && c.ready))
    };
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(pods, &leader, restarted),
    )
    .await
    .with_context(|| format!("{leader} was not restarted and Ready within {WAIT:?}"))??;
    // A live process holds the Lease again: the other replica once the dead one's lease ran out,
    // or the restarted container, which holds the pod's identity and renews it (as client-go's
    // leaderelection does).
    let renewed = |l: Option<&ControllerLease>| {
        l.is_some_and(|l| {
            l.spec.holder_identity.is_some() && l.spec.renew_time.is_some_and(|t| t.0 > killed_at)
        })
    };
    let lease = tokio::time::timeout(WAIT, kube::runtime::wait::await_condition(leases, LEASE, renewed))
        .await
        .context("no live leader renewed the Lease after the kill")??;
    let holder = lease.and_then(|l| l.spec.holder_identity).unwrap_or_default();
    eprintln!("leadership after the kill: {leader} -> {holder}");

    ensure!(
        fetch_url(&api.get("before").await?) == before,
        "the pinned App changed"
    );
    let after = names(entries.list(&ListParams::default()).await?);
    let lost: Vec<&String> = cached.iter().filter(|n| !after.contains(n)).collect();
    ensure!(lost.is_empty(), "cache entries lost after the kill: {lost:?}");
    env.kubectl_apply(&namespace, &app_yaml("after", &url))?;
    ensure!(
        fetch_url(&api.get("after").await?).ends_with(&digest),
        "an App created after the kill is not pinned"
    );
    Ok(())
}

/// `helm uninstall` deletes the webhook configurations before any of the release's pods begins to
/// go (compared by the etcd revisions of the watch events), so no admission is left calling a
/// Service without endpoints; afterwards the cluster admits Apps, as written.
async fn helm_uninstall_removes_the_webhooks_before_the_pods(cluster: Arc<Cluster>) -> Result<()> {
    let env = &cluster.env;
    let client = env.client().await?;
    let selector = watcher::Config::default().labels("app.kubernetes.io/name=holdfast");
    let revisions: Arc<std::sync::Mutex<BTreeMap<String, u64>>> = Arc::default();
    let record = |kind: &'static str, revisions: Arc<std::sync::Mutex<BTreeMap<String, u64>>>| {
        move |name: String, revision: Option<String>| {
            let revision = revision.and_then(|r| r.parse().ok()).unwrap_or(u64::MAX);
            if let Ok(mut seen) = revisions.lock() {
                seen.entry(format!("{kind}/{name}")).or_insert(revision);
            }
        }
    };
    let webhooks_gone = {
        let mark = record("webhook-configuration", revisions.clone());
        let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone());
        let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone());
        let (mark_m, mark_v) = (mark.clone(), mark);
        let (sel_m, sel_v) = (selector.clone(), selector.clone());
        tokio::spawn(async move {
            let m = watcher(mutating, sel_m).try_for_each(move |e| {
                if let watcher::Event::Delete(c) = e {
                    mark_m(c.name_any(), c.resource_version());
                }
                std::future::ready(Ok(()))
            });
            let v = watcher(validating, sel_v).try_for_each(move |e| {
                if let watcher::Event::Delete(c) = e {
                    mark_v(c.name_any(), c.resource_version());
                }
                std::future::ready(Ok(()))
            });
            let _ = tokio::join!(m, v);
        })
    };
    let pods_going = {
        let mark = record("pod", revisions.clone());
        let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
        tokio::spawn(async move {
            let _ = watcher(pods, selector)
                .applied_objects()
                .try_for_each(move |p| {
                    if p.metadata.deletion_timestamp.is_some() {
                        mark(p.name_any(), p.resource_version());
                    }
                    std::future::ready(Ok(()))
                })
                .await;
        })
    };
    // The watches are running before anything is deleted.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE);
    let running = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=holdfast"))
        .await?;
    ensure!(
        !running.items.is_empty(),
        "the release has no pods before the uninstall"
    );
    cluster
        .node
        .helm(&["uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=180s"])?;
    // The garbage collector deletes the pods after helm has deleted their Deployments.
    for pod in &running.items {
        wait::deleted(&pods, &pod.name_any(), pod.uid().as_deref().unwrap_or_default()).await?;
    }
    webhooks_gone.abort();
    pods_going.abort();
    let seen = revisions.lock().map(|s| s.clone()).unwrap_or_default();
    let last_webhook = seen
        .iter()
        .filter(|(k, _)| k.starts_with("webhook-configuration/"))
        .map(|(_, r)| *r)
        .max();
    let first_pod = seen
        .iter()
        .filter(|(k, _)| k.starts_with("pod/"))
        .map(|(_, r)| *r)
        .min();
    match (last_webhook, first_pod) {
        (Some(webhook), Some(pod)) => ensure!(
            webhook < pod,
            "a pod began to go (revision {pod}) before the last webhook configuration was deleted (revision {webhook}): {seen:?}"
        ),
        _ => bail!("the watches did not see both the webhook configurations and the pods go: {seen:?}"),
    }
    let left = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&ListParams::default().labels("app.kubernetes.io/name=holdfast"))
        .await?;
    ensure!(
        left.items.is_empty(),
        "webhook configurations left after uninstall"
    );

    admitted_as_written(env, "after-uninstall")
        .await
        .context("after helm uninstall")
}

/// With no holdfast installed, an App applied with kubectl is admitted (no webhook left pointing
/// at a missing Service) and stored as written, on its tag.
async fn admitted_as_written(env: &holdfast_e2e::Env, name: &str) -> Result<()> {
    let namespace = env.namespace("node-after").await?;
    let url = format!("{}/node/app:1.0.0", env.registry());
    env.kubectl_apply(&namespace, &app_yaml(name, &url))?;
    let stored = apps(env.client().await?, &namespace).get(name).await?;
    ensure!(
        fetch_url(&stored) == url,
        "the App was stored as {}, not as written",
        fetch_url(&stored)
    );
    Ok(())
}

/// After the Helm release is gone, holdfast installed as its Carvel package by the in-cluster
/// kapp-controller, as README's "Carvel package" says: a PackageRepository of the repository bundle
/// `make package` pushes (the package suite's release, named by its tag as users name it) and a
/// PackageInstall whose values place the pods on the node and name the plain-HTTP registry. Its
/// `helmTemplate` runs helm in kapp-controller's sidecar (the image's static helm). The
/// PackageInstall reconciles, the webhook and controller pods kapp deployed (its app label on
/// them) run on the node Ready with no restart, and a tagged App is stored pinned through the
/// webhook configuration kapp deployed. Then the PackageInstall is deleted: kapp removes the
/// configurations and the pods, and Apps are still admitted.
async fn the_carvel_package_installed_by_the_in_cluster_kapp_controller_runs_on_the_node(
    cluster: Arc<Cluster>,
) -> Result<()> {
    let env = &cluster.env;
    // The Helm release out of the way (as the test before leaves it; run alone, this one
    // uninstalls it): the package installs the same objects.
    cluster.node.script("install.sh", &["uninstall"])?;
    let kapp_controller_pod = kapp_controller_pod(&cluster)?;
    let packaged = dist::package(env)?;
    let client = env.client().await?;
    let namespace = env.namespace("node-package").await?;
    let created = create_all(
        &client,
        &namespace,
        &dist::package_repository(&packaged.repository_tag),
    )
    .await?;
    let repositories = api_for(&client, &created[0], Some(&namespace)).await?;
    until_reconciled_by_the_pod(
        &cluster,
        &repositories,
        dist::PACKAGE_INSTALL,
        &kapp_controller_pod,
    )
    .await?;

    let placement = json!({
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "tolerations": [{"key": cluster.node.var("HOLDFAST_NODE_TAINT")?, "operator": "Exists", "effect": "NoSchedule"}],
    });
    let values = json!({
        "insecureRegistries": [env.registry()],
        "webhook": placement,
        "controller": placement,
    });
    let created = create_all(
        &client,
        &namespace,
        &dist::package_install(&namespace, env!("CARGO_PKG_VERSION"), &values)?,
    )
    .await?;
    let install = created.last().context("no PackageInstall created")?;
    let installs = api_for(&client, install, Some(&namespace)).await?;
    until_reconciled_by_the_pod(&cluster, &installs, dist::PACKAGE_INSTALL, &kapp_controller_pod).await?;

    // What kapp deployed for the PackageInstall's App carries the App's kapp label.
    let app = kubectl_json(
        &cluster,
        &[
            "get",
            "apps.kappctrl.k14s.io",
            "-n",
            &namespace,
            dist::PACKAGE_INSTALL,
        ],
    )?;
    let label = app["status"]["deploy"]["kapp"]["associatedResources"]["label"]
        .as_str()
        .context("the App reports no kapp app label")?
        .to_string();
    let selector = format!("app.kubernetes.io/name=holdfast,{label}");
    let pods = kubectl_json(&cluster, &["get", "pods", "-n", NAMESPACE, "-l", &selector])?;
    let pods = pods["items"].as_array().cloned().unwrap_or_default();
    let components: Vec<&str> = pods
        .iter()
        .filter_map(|p| p["metadata"]["labels"]["app.kubernetes.io/component"].as_str())
        .collect();
    ensure!(
        components.contains(&"webhook") && components.contains(&"controller"),
        "the package's pods ({selector}) are {components:?}, not webhook and controller ones"
    );
    for pod in &pods {
        ready_on_the_node_without_restarts(pod)?;
    }
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let configuration = mutating.get("holdfast").await?;
    let (key, value) = label.split_once('=').context("a kapp label without value")?;
    ensure!(
        configuration.labels().get(key).is_some_and(|v| v == value),
        "the MutatingWebhookConfiguration holdfast is not the package's: {:?}",
        configuration.labels()
    );
    wait::until(&mutating, "holdfast", ca_bundle_injected).await?;
    stored_pinned_by_a_new_install(&cluster, "packaged")
        .await
        .context("installed as the Carvel package")?;

    cluster.node.run(
        "kubectl",
        &[
            "delete",
            "packageinstall",
            dist::PACKAGE_INSTALL,
            "-n",
            &namespace,
            "--wait",
            "--timeout=180s",
        ],
    )?;
    let by_label = ListParams::default().labels(&label);
    let configurations = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .list(&by_label)
        .await?
        .items
        .len()
        + Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .list(&by_label)
            .await?
            .items
            .len();
    ensure!(
        configurations == 0,
        "{configurations} webhook configurations of the package left after its PackageInstall was deleted"
    );
    // The pods go with their Deployments (the garbage collector, then the kubelet).
    wait::until_listed(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().labels(&label),
        <[Pod]>::is_empty,
        WAIT,
    )
    .await
    .context("the package's pods still there after its PackageInstall was deleted")?;
    cluster.node.run(
        "kubectl",
        &[
            "delete",
            "clusterrolebinding",
            &dist::installer_binding(&namespace),
        ],
    )?;
    admitted_as_written(env, "after-package")
        .await
        .context("after the PackageInstall was deleted")
}

/// After the Helm release is gone, the same image installed the kustomize way, as README says:
/// `kubectl apply -k` of an overlay of `manifests/overlays/recommended` that only points the image
/// at the registry by digest, places the pods on the node and names the plain-HTTP registry. Both
/// Deployments become Ready there, and a tagged App is stored pinned.
async fn kubectl_apply_k_of_the_recommended_overlay_runs_on_the_node(cluster: Arc<Cluster>) -> Result<()> {
    let pushed = std::fs::read_to_string(dist::target_dir().join("image/pushed"))?;
    let (repository, digest) = pushed
        .trim()
        .split_once('@')
        .context("image/pushed names no digest")?;
    let registry = cluster.env.registry().to_string();
    // Beside the overlay it builds on: kustomize takes only relative roots.
    let overlay = tempfile::Builder::new()
        .prefix(".node-overlay-")
        .tempdir_in(dist::repo().join("manifests/overlays"))?;
    let placement = json!([
        {"op": "add", "path": "/spec/template/spec/nodeSelector", "value": {"kubernetes.io/hostname": NODE}},
        {"op": "add", "path": "/spec/template/spec/tolerations",
         "value": [{"key": cluster.node.var("HOLDFAST_NODE_TAINT")?, "operator": "Exists", "effect": "NoSchedule"}]},
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": format!("--insecure-registry={registry}")},
    ]);
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../recommended"],
        "images": [{"name": "holdfast", "newName": repository, "digest": digest}],
        "patches": [{"target": {"kind": "Deployment"}, "patch": placement.to_string()}],
    });
    std::fs::write(
        overlay.path().join("kustomization.yaml"),
        serde_yaml::to_string(&kustomization)?,
    )?;
    cluster
        .node
        .run("kubectl", &["apply", "-k", &overlay.path().to_string_lossy()])?;
    for deployment in ["deployment/holdfast-webhook", "deployment/holdfast-controller"] {
        rollout_status(&cluster, deployment)?;
    }
    for pod in release_pods(&cluster)? {
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        if pod["metadata"]["deletionTimestamp"].is_null() {
            ensure!(pod["spec"]["nodeName"] == NODE, "{name} is not on {NODE}");
        }
    }
    let env = &cluster.env;
    // The webhook injects its caBundle into the configurations kubectl just created.
    let mutating = Api::<MutatingWebhookConfiguration>::all(env.client().await?);
    wait::until(&mutating, "holdfast", ca_bundle_injected).await?;
    stored_pinned_by_a_new_install(&cluster, "kustomized")
        .await
        .context("installed with kubectl apply -k")
}

/// A tagged App `name` applied with kubectl is stored pinned by a webhook installed seconds ago.
/// Its configurations and Service are that new: the API server's informer may not yet hold the
/// injected caBundle, nor kube-proxy the Service's rules, and a fail-open webhook is then
/// skipped. Server dry runs (admitted, stored nowhere) until one comes back pinned, then the
/// App applied.
async fn stored_pinned_by_a_new_install(cluster: &Cluster, name: &str) -> Result<()> {
    let env = &cluster.env;
    let registry = env.registry();
    let repository = format!("node/{name}");
    let pinned = push_config(cluster, &repository, "1.0.0").await?;
    let namespace = env.namespace(&format!("node-{name}")).await?;
    let yaml = app_yaml(name, &format!("{registry}/{repository}:1.0.0"));
    let wanted = format!("{registry}/{repository}@{pinned}");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let object: DynamicObject = serde_yaml::from_str(&yaml)?;
    let app_api = apps(env.client().await?, &namespace);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let admitted = app_api.create(&dry_run, &object).await?;
        if fetch_url(&admitted) == wanted {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "after {WAIT:?} a dry run of the App was still admitted as {}",
            fetch_url(&admitted)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    env.kubectl_apply(&namespace, &yaml)?;
    let stored = app_api.get(name).await?;
    ensure!(
        fetch_url(&stored) == wanted,
        "the webhook stored {}, not {wanted}",
        fetch_url(&stored)
    );
    Ok(())
}

//! holdfast as the soak runs it, in one of two placements.
//!
//! [`Holdfast::processes`], as `make up` runs it: two `holdfast-webhook` processes behind a
//! [`Balancer`] that the shipped webhook configurations call (a Service before a two-replica
//! Deployment), and two `holdfast-controller` processes electing a leader, each reaching the API
//! server through a [`Relay`] of its own so that one replica's link can be cut while the other's
//! stays up. The controllers run as their ServiceAccount, RBAC and fences as `manifests/base`
//! installs them, each with a token bound to a pod of its name, as a replica's projected token is.
//!
//! [`Holdfast::pods`], as `make cluster` runs it: the release scripts/install.sh installs from
//! the chart onto the real node ([`Node`]), two replicas of each Deployment in containers the
//! kubelet restarts, the webhook configurations calling the Service through kube-proxy, the
//! controllers the `kubernetes` Service. A pod's link is cut in its own network namespace
//! (packets to and from the API server's ClusterIP dropped, so TCP holds what was sent and
//! delivers it on resume, as the relay does); a process is SIGKILLed by its host pid.

use std::{collections::BTreeMap, path::Path, sync::Mutex, time::Duration};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{Api, api::ListParams};
use tempfile::TempDir;

use super::{invariants::lock, load::MIRROR_LABEL};
use crate::{
    Env, accounts,
    cluster::{self, Node},
    installed::{self, CONTROLLER, WEBHOOK},
    process::{Stop, free_port},
    slow_link::{Balancer, Relay},
};

/// The webhook replicas' process names in the environment ([`Holdfast::processes`]).
pub const WEBHOOKS: [&str; 2] = ["holdfast-webhook-a", "holdfast-webhook-b"];
/// The controller replicas' process names, also their identities in the Lease.
pub const CONTROLLERS: [&str; 2] = ["holdfast-controller-a", "holdfast-controller-b"];
/// The ControllerLease the controller replicas compete for (the binary's default).
pub const LEASE: &str = holdfast_controller::leader::LEASE;
/// The controller binary's lease duration: a follower takes over this long after the leader's
/// last renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

/// Which of holdfast's programs a replica runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Component {
    Webhook,
    Controller,
}

/// One process of holdfast's.
pub struct Replica {
    /// Its process name in the environment ([`WEBHOOKS`], [`CONTROLLERS`]), or its pod's name;
    /// a controller's identity in the Lease either way.
    pub name: String,
    pub component: Component,
    /// The webhook's TLS address (none for a controller).
    pub addr: Option<String>,
    /// Its admin address (`/readyz`, `/metrics`).
    pub admin: String,
    /// The controller's link to the API server, as a host process (none otherwise).
    link: Option<Relay>,
}

impl Replica {
    /// Returns once it answers `/readyz` (a webhook: caches synced, certificate served; a
    /// controller: its cache synced, and leading with renewals on time or following).
    pub async fn ready(&self) -> Result<()> {
        installed::until_ready(&self.admin, &self.name).await
    }
}

pub struct Holdfast {
    /// Webhooks first.
    replicas: Vec<Replica>,
    placement: Placement,
}

enum Placement {
    /// Host processes; the front is what the webhook configurations call; the directory holds
    /// the controllers' kubeconfigs (through their relays).
    Processes { _front: Balancer, _dir: TempDir },
    /// The release's pods on the real node.
    Pods {
        node: Node,
        client: kube::Client,
        /// The API server's ClusterIP (the `kubernetes` Service): what a cut link drops.
        apiserver: String,
        /// Per pod: the kills not yet seen as restarts, and the restarts seen (`restartCount`).
        restarts: Mutex<BTreeMap<String, (i32, i32)>>,
        /// The panics the logs of containers that exited showed (the kubelet keeps one).
        panics: Mutex<Vec<String>>,
    },
}

impl Holdfast {
    pub async fn processes(
        env: &mut Env,
        registries: &[&str],
        mirror: &str,
        refresh: Duration,
        lifetime: Duration,
    ) -> Result<Self> {
        let mut insecure: Vec<String> = registries
            .iter()
            .chain([&mirror])
            .map(|registry| format!("--insecure-registry={registry}"))
            .collect();
        // Both processes take the same mirror flags: the controller copies, the webhook pins to
        // the copies it recorded.
        insecure.extend([
            format!("--mirror-registry={mirror}"),
            format!("--mirror-namespace-selector={MIRROR_LABEL}=true"),
        ]);
        let ports = [(free_port()?, free_port()?), (free_port()?, free_port()?)];
        let front = Balancer::start(
            ports
                .iter()
                .map(|(port, _)| format!("127.0.0.1:{port}"))
                .collect(),
        )
        .await?;
        installed::create_namespace_and_configurations(env, &format!("https://{}", front.addr), None).await?;
        accounts::install_rbac(env).await?;
        let kubeconfig = env.kubeconfig().to_path_buf();
        let mut webhooks = Vec::new();
        for (name, (port, admin_port)) in WEBHOOKS.into_iter().zip(ports) {
            let mut args = installed::webhook_args(env, port, admin_port);
            args.extend(insecure.iter().cloned());
            spawn(env, name, WEBHOOK, &args, &kubeconfig)?;
            let replica = Replica {
                name: name.into(),
                component: Component::Webhook,
                addr: Some(format!("127.0.0.1:{port}")),
                admin: format!("127.0.0.1:{admin_port}"),
                link: None,
            };
            // One after the other: the first creates the certificate Secret the second reads.
            replica.ready().await?;
            webhooks.push(replica);
        }

        let dir = tempfile::Builder::new().prefix("holdfast-soak-").tempdir()?;
        let apiserver = format!("127.0.0.1:{}", env.apiserver_port());
        let mut controllers = Vec::new();
        for name in CONTROLLERS {
            let link = Relay::start(&apiserver).await?;
            let token = accounts::pod_token(env, accounts::CONTROLLER, name, lifetime).await?;
            let through_link = dir.path().join(format!("{name}.kubeconfig"));
            let kubeconfig = kubeconfig_via(
                &accounts::kubeconfig_with_token(env, &token)?,
                &apiserver,
                &link.addr,
            )?;
            std::fs::write(&through_link, kubeconfig)
                .with_context(|| format!("writing {}", through_link.display()))?;
            let admin = format!("127.0.0.1:{}", free_port()?);
            let mut args = installed::controller_args(env, &admin);
            args.extend(insecure.iter().cloned());
            args.extend([
                format!("--identity={name}"),
                format!("--lease-name={LEASE}"),
                format!("--refresh-seconds={}", refresh.as_secs()),
            ]);
            spawn(env, name, CONTROLLER, &args, &through_link)?;
            controllers.push(Replica {
                name: name.into(),
                component: Component::Controller,
                addr: None,
                admin,
                link: Some(link),
            });
        }
        for controller in &controllers {
            controller.ready().await?;
        }
        webhooks.extend(controllers);
        Ok(Self {
            replicas: webhooks,
            placement: Placement::Processes {
                _front: front,
                _dir: dir,
            },
        })
    }

    /// The release scripts/install.sh installed on `node`: two pods of each Deployment, each
    /// Ready, reached at their pod addresses (the host is on the node's bridge).
    pub async fn pods(node: Node, client: kube::Client) -> Result<Self> {
        let pods: Api<Pod> = Api::namespaced(client.clone(), cluster::NAMESPACE);
        let mut replicas = Vec::new();
        for (component, label) in [
            (Component::Webhook, "webhook"),
            (Component::Controller, "controller"),
        ] {
            let selector = format!("app.kubernetes.io/name=holdfast,app.kubernetes.io/component={label}");
            let mut list = pods.list(&ListParams::default().labels(&selector)).await?.items;
            ensure!(
                list.len() == 2,
                "{} {label} pods in {}, not the soak's two",
                list.len(),
                cluster::NAMESPACE
            );
            list.sort_by_key(|pod| pod.metadata.name.clone());
            for pod in list {
                let name = pod.metadata.name.clone().context("a pod without a name")?;
                let ip = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .with_context(|| format!("{name} has no address"))?;
                let port = |wanted: &str| {
                    pod.spec
                        .iter()
                        .flat_map(|spec| &spec.containers)
                        .flat_map(|c| c.ports.iter().flatten())
                        .find(|p| p.name.as_deref() == Some(wanted))
                        .map(|p| p.container_port)
                        .with_context(|| format!("{name} has no port {wanted}"))
                };
                let addr = match component {
                    Component::Webhook => Some(format!("{ip}:{}", port("https")?)),
                    Component::Controller => None,
                };
                replicas.push(Replica {
                    admin: format!("{ip}:{}", port("admin")?),
                    name,
                    component,
                    addr,
                    link: None,
                });
            }
        }
        let kubernetes: Service = Api::namespaced(client.clone(), "default")
            .get("kubernetes")
            .await?;
        let apiserver = kubernetes
            .spec
            .and_then(|s| s.cluster_ip)
            .context("the kubernetes Service has no ClusterIP")?;
        let mut seen = BTreeMap::new();
        for replica in &replicas {
            replica.ready().await?;
            let (_, count) = container(&client, &replica.name).await?;
            seen.insert(replica.name.clone(), (0, count));
        }
        Ok(Self {
            replicas,
            placement: Placement::Pods {
                node,
                client,
                apiserver,
                restarts: Mutex::new(seen),
                panics: Mutex::default(),
            },
        })
    }

    /// Every replica, webhooks first.
    pub fn replicas(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter()
    }

    pub fn webhooks(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().filter(|r| r.component == Component::Webhook)
    }

    /// The replica whose process or pod is `name`.
    pub fn replica(&self, name: &str) -> Result<&Replica> {
        self.replicas()
            .find(|r| r.name == name)
            .with_context(|| format!("no replica {name}"))
    }

    /// SIGKILLs `name` and returns once it runs again, ready: a host process started again (as
    /// a kubelet would), a container restarted by the kubelet.
    pub async fn kill(&self, env: &tokio::sync::Mutex<Env>, name: &str) -> Result<()> {
        let replica = self.replica(name)?;
        match &self.placement {
            Placement::Processes { .. } => env.lock().await.respawn_process(name, Stop::Kill)?,
            Placement::Pods {
                node,
                client,
                restarts,
                ..
            } => {
                let (before, _) = container(client, name).await?;
                let pid = container_pid(node, &before)?;
                node.run("kill", &["-KILL", &pid.to_string()])?;
                lock(restarts).entry(name.into()).or_default().0 += 1;
                // The kubelet's restart back-off doubles from 10 s to at most 300 s while a
                // container keeps dying; the pod's status says when it started the next one.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(330);
                loop {
                    if container(client, name).await.is_ok_and(|(id, _)| id != before) {
                        break;
                    }
                    ensure!(
                        tokio::time::Instant::now() < deadline,
                        "{name}'s container was not started again within 330 s of its SIGKILL"
                    );
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        }
        replica.ready().await
    }

    /// Cuts `name`'s link to the API server: nothing passes either way until [`Holdfast::resume`],
    /// which delivers what was held.
    pub async fn hang(&self, name: &str) -> Result<()> {
        self.link(name, true).await
    }

    pub async fn resume(&self, name: &str) -> Result<()> {
        self.link(name, false).await
    }

    async fn link(&self, name: &str, cut: bool) -> Result<()> {
        let replica = self.replica(name)?;
        match &self.placement {
            Placement::Processes { .. } => {
                let relay = replica
                    .link
                    .as_ref()
                    .context("the replica has no link of its own")?;
                if cut { relay.hang() } else { relay.resume() }
            }
            Placement::Pods { node, apiserver, .. } => {
                // In the pod's network namespace (the sandbox's, which outlives its containers):
                // the API server's packets dropped both ways, so TCP retransmits them on resume.
                let sandbox = node.run(
                    "crictl",
                    &["pods", "--name", name, "--namespace", cluster::NAMESPACE, "-q"],
                )?;
                let sandbox = sandbox.lines().next().context("no pod sandbox")?;
                let inspect: serde_json::Value =
                    serde_json::from_str(&node.run("crictl", &["inspectp", sandbox])?)?;
                let pid = inspect["info"]["pid"]
                    .as_u64()
                    .context("crictl inspectp gave no pid")?;
                let netns = format!("--net=/proc/{pid}/ns/net");
                let action = if cut { "-I" } else { "-D" };
                for (chain, direction, port) in [("OUTPUT", "-d", "--dport"), ("INPUT", "-s", "--sport")] {
                    node.run(
                        "nsenter",
                        &[
                            &netns, "iptables", action, chain, "-p", "tcp", direction, apiserver, port,
                            "443", "-j", "DROP",
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// The host pid of `replica`'s process now, if it runs.
    pub async fn pid(&self, env: &tokio::sync::Mutex<Env>, replica: &Replica) -> Option<u32> {
        match &self.placement {
            Placement::Processes { .. } => env.lock().await.pid_of(&replica.name),
            Placement::Pods { node, client, .. } => {
                let (id, _) = container(client, &replica.name).await.ok()?;
                container_pid(node, &id).ok()
            }
        }
    }

    /// Starts again the host processes that exited (a controller that lost its Lease exits, and
    /// its pod's container is restarted); of pods, counts the containers the kubelet restarted
    /// beyond those [`Holdfast::kill`] killed, and reads each exited container's log for
    /// panics while the kubelet keeps it. Returns those restarts.
    pub async fn restart_exited(&self, env: &tokio::sync::Mutex<Env>, at: f64) -> Result<Vec<String>> {
        let mut restarted = Vec::new();
        match &self.placement {
            Placement::Processes { .. } => {
                let mut env = env.lock().await;
                for replica in &self.replicas {
                    if let Some(status) = env.exited(&replica.name)? {
                        env.respawn_process(&replica.name, Stop::Kill)?;
                        restarted.push(format!(
                            "{} exited ({status}) at +{at:.0}s, started again",
                            replica.name
                        ));
                    }
                }
            }
            Placement::Pods {
                node,
                client,
                restarts,
                panics,
                ..
            } => {
                for replica in &self.replicas {
                    let Ok((_, count)) = container(client, &replica.name).await else {
                        continue;
                    };
                    // The restarts since the last look, and how many of them kills made.
                    let (new, killed) = {
                        let mut restarts = lock(restarts);
                        let (kills, seen) = restarts.entry(replica.name.clone()).or_default();
                        let new = count - std::mem::replace(seen, count);
                        let killed = (*kills).min(new);
                        *kills -= killed;
                        (new, killed)
                    };
                    if new <= 0 {
                        continue;
                    }
                    let log = node
                        .run(
                            "kubectl",
                            &["logs", "--previous", "-n", cluster::NAMESPACE, &replica.name],
                        )
                        .unwrap_or_default();
                    lock(panics).extend(panicked(&replica.name, &log));
                    if new > killed {
                        restarted.push(format!(
                            "{}'s container exited {} time(s) and was restarted by the kubelet by +{at:.0}s",
                            replica.name,
                            new - killed
                        ));
                    }
                }
            }
        }
        Ok(restarted)
    }

    /// The lines of holdfast's logs that report a panic: every run of each host process; of
    /// pods, the running containers' and those read as they exited.
    pub fn panics(&self, env: &Env) -> Vec<String> {
        match &self.placement {
            Placement::Processes { .. } => self
                .replicas
                .iter()
                .flat_map(|replica| {
                    let log = env
                        .log_path(&replica.name)
                        .and_then(|p| std::fs::read_to_string(p).ok())
                        .unwrap_or_default();
                    panicked(&replica.name, &log)
                })
                .collect(),
            Placement::Pods { node, panics, .. } => {
                let mut all = lock(panics).clone();
                for replica in &self.replicas {
                    let log = node
                        .run("kubectl", &["logs", "-n", cluster::NAMESPACE, &replica.name])
                        .unwrap_or_default();
                    all.extend(panicked(&replica.name, &log));
                }
                all
            }
        }
    }
}

/// The chart values the soak's release adds to scripts/install.sh's: the soak's `registries`
/// and `mirror` (plain HTTP, on the node's address) beside the cluster's registry, the mirror
/// for the namespaces labelled [`MIRROR_LABEL`], the controllers refreshing every `refresh`.
pub fn release_values(
    node: &Node,
    registries: &[&str],
    mirror: &str,
    refresh: Duration,
) -> Result<serde_json::Value> {
    let mut insecure = registries.to_vec();
    insecure.extend([mirror, node.var("HOLDFAST_CLUSTER_REGISTRY")?]);
    Ok(serde_json::json!({
        "insecureRegistries": insecure,
        "mirror": {"registry": mirror, "namespaceSelector": format!("{MIRROR_LABEL}=true")},
        "controller": {"refreshSeconds": refresh.as_secs()},
    }))
}

/// The lines of `log` that report a panic, each named after `replica`.
fn panicked(replica: &str, log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("panicked"))
        .map(|l| format!("{replica}: {l}"))
        .collect()
}

/// The running container of pod `name` (holdfast's one container per pod): its CRI id and the
/// pod's restart count.
async fn container(client: &kube::Client, name: &str) -> Result<(String, i32)> {
    let pod = Api::<Pod>::namespaced(client.clone(), cluster::NAMESPACE)
        .get(name)
        .await?;
    let status = pod
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .with_context(|| format!("{name} reports no container"))?;
    ensure!(
        status.state.as_ref().is_some_and(|s| s.running.is_some()),
        "{name}'s container is not running"
    );
    let id = status
        .container_id
        .with_context(|| format!("{name}'s container has no id"))?;
    Ok((id, status.restart_count))
}

/// The host pid of a container (`containerd://ID`), from the CRI.
fn container_pid(node: &Node, container_id: &str) -> Result<u32> {
    let id = container_id
        .strip_prefix("containerd://")
        .with_context(|| format!("{container_id} is not a containerd container"))?;
    let inspect: serde_json::Value = serde_json::from_str(&node.run("crictl", &["inspect", id])?)?;
    let pid = inspect["info"]["pid"]
        .as_u64()
        .context("crictl inspect gave no pid")?;
    Ok(u32::try_from(pid)?)
}

/// Starts holdfast's `binary` ([`WEBHOOK`], [`CONTROLLER`]) as the environment's process `name`,
/// reaching the API server as `kubeconfig` says.
fn spawn(env: &mut Env, name: &'static str, binary: &str, args: &[String], kubeconfig: &Path) -> Result<()> {
    env.spawn_with_env(
        name,
        &installed::binary(binary)?,
        args,
        &[("KUBECONFIG", kubeconfig)],
    )
}

/// The kubeconfig `text`, reaching the API server at `via` instead of `apiserver` (the API
/// server's certificate names 127.0.0.1, so the relay's address verifies).
fn kubeconfig_via(text: &str, apiserver: &str, via: &str) -> Result<String> {
    let server = format!("https://{apiserver}");
    anyhow::ensure!(text.contains(&server), "the kubeconfig does not name {server}");
    Ok(text.replace(&server, &format!("https://{via}")))
}

//! A network namespace of its own for a peer that listens on ports no flag or variable moves
//! (knative's probe server in kpack's webhook: `:8080`; Korifi's controllers: metrics `:8080`,
//! probes `:8081`, webhooks `:9443`). In a cluster each pod has its own network namespace; here
//! two such peers would collide with each other, or with any program on the machine, so each
//! runs in one, joined to the host by TCP relays on loopback:
//! - the host ports the peer dials (kube-apiserver, the registry) are listened on inside, at the
//!   same `127.0.0.1` ports, and relayed to the host's;
//! - a port the peer serves (its webhook) is published on a free host loopback port.
//!
//! The namespace belongs to a thread of the harness (`unshare(CLONE_NEWNET)` affects the calling
//! thread; processes it forks inherit it), which also makes the sockets inside it. The thread, and
//! with it the namespace, ends when the [`Netns`] is dropped: stop its processes first (they are
//! tied to that thread by `PR_SET_PDEATHSIG`).

use std::{
    net::{Ipv4Addr, TcpListener, TcpStream},
    path::PathBuf,
    sync::mpsc,
};

use anyhow::{Context, Result, anyhow, bail};
use tokio::{sync::oneshot, task::JoinHandle};

use crate::process::ServerProcess;

/// What a process started in the namespace runs.
#[derive(Debug, Clone)]
pub struct Spawn {
    pub name: &'static str,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub envs: Vec<(&'static str, String)>,
    pub log: PathBuf,
}

enum Request {
    Listen(u16, oneshot::Sender<std::io::Result<TcpListener>>),
    Connect(u16, oneshot::Sender<std::io::Result<TcpStream>>),
    Spawn(Spawn, oneshot::Sender<Result<ServerProcess>>),
    /// The [`Netns`] is dropped: the thread ends now. Its published ports' relay tasks hold
    /// senders too, and an aborted task drops its sender only once a runtime worker polls it —
    /// never, when the drop blocks the worker that task waits on (a drop inside async code).
    Close,
}

/// A network namespace with its relays; see the module docs.
#[derive(Debug)]
pub struct Netns {
    requests: Option<mpsc::Sender<Request>>,
    thread: Option<std::thread::JoinHandle<()>>,
    relays: Vec<JoinHandle<()>>,
}

impl Netns {
    /// A new namespace with loopback up, in which the host's loopback ports `dialled` answer.
    pub async fn new(name: &str, dialled: &[u16]) -> Result<Self> {
        let (requests, inbox) = mpsc::channel();
        let (ready_tx, ready) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || serve(inbox, ready_tx))?;
        ready.await.context("network namespace thread died")??;
        let mut this = Self {
            requests: Some(requests),
            thread: Some(thread),
            relays: Vec::new(),
        };
        for port in dialled {
            let inside = this.ask(|reply| Request::Listen(*port, reply)).await?;
            let inside =
                inside.with_context(|| format!("listening on 127.0.0.1:{port} inside the namespace"))?;
            inside.set_nonblocking(true)?;
            let inside = tokio::net::TcpListener::from_std(inside)?;
            let port = *port;
            this.relays.push(tokio::spawn(async move {
                while let Ok((mut inbound, _)) = inside.accept().await {
                    tokio::spawn(async move {
                        match tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await {
                            Ok(mut outbound) => {
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            }
                            Err(error) => tracing::debug!(port, %error, "netns relay: host port refused"),
                        }
                    });
                }
            }));
        }
        Ok(this)
    }

    /// Starts a process inside the namespace.
    pub async fn spawn(&self, spawn: Spawn) -> Result<ServerProcess> {
        self.ask(|reply| Request::Spawn(spawn, reply)).await?
    }

    /// Publishes the namespace's loopback port `inner` on a free host loopback port, returned.
    pub async fn publish(&mut self, inner: u16) -> Result<u16> {
        let outside = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let port = outside.local_addr()?.port();
        let requests = self.requests.clone().context("namespace already closed")?;
        self.relays.push(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = outside.accept().await {
                let (reply, connected) = oneshot::channel();
                if requests.send(Request::Connect(inner, reply)).is_err() {
                    return;
                }
                tokio::spawn(async move {
                    let Ok(Ok(stream)) = connected.await else {
                        tracing::debug!(inner, "netns relay: port refused inside the namespace");
                        return;
                    };
                    let Ok(mut outbound) = stream
                        .set_nonblocking(true)
                        .and_then(|()| tokio::net::TcpStream::from_std(stream))
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        }));
        Ok(port)
    }

    async fn ask<T>(&self, request: impl FnOnce(oneshot::Sender<T>) -> Request) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .as_ref()
            .context("namespace already closed")?
            .send(request(reply))
            .map_err(|_| anyhow!("network namespace thread gone"))?;
        answer.await.context("network namespace thread gone")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.relays.iter().for_each(JoinHandle::abort);
        if let Some(requests) = self.requests.take() {
            let _ = requests.send(Request::Close);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The namespace's thread: enters a new namespace, brings loopback up, then serves requests
/// until the [`Netns`] goes.
fn serve(inbox: mpsc::Receiver<Request>, ready: oneshot::Sender<Result<()>>) {
    let entered = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .context("unshare(CLONE_NEWNET) (needs CAP_SYS_ADMIN: run as root)")
        .and_then(|()| loopback_up());
    let failed = entered.is_err();
    if ready.send(entered).is_err() || failed {
        return;
    }
    for request in inbox {
        match request {
            Request::Listen(port, reply) => {
                let _ = reply.send(TcpListener::bind((Ipv4Addr::LOCALHOST, port)));
            }
            Request::Connect(port, reply) => {
                let _ = reply.send(TcpStream::connect((Ipv4Addr::LOCALHOST, port)));
            }
            Request::Close => return,
            Request::Spawn(s, reply) => {
                let envs: Vec<(&str, &std::path::Path)> = s
                    .envs
                    .iter()
                    .map(|(k, v)| (*k, std::path::Path::new(v.as_str())))
                    .collect();
                let _ = reply.send(ServerProcess::spawn(
                    s.name,
                    &s.program,
                    &s.args,
                    &envs,
                    s.log.clone(),
                ));
            }
        }
    }
}

/// A new network namespace has only `lo`, and it is down.
fn loopback_up() -> Result<()> {
    let out = std::process::Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .output()
        .context("running `ip link set lo up` (iproute2)")?;
    if !out.status.success() {
        bail!("ip link set lo up: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Dropped inside async code (an environment is dropped on the runtime that started it)
    /// while a published port's relay task still holds a request sender: the namespace's thread
    /// ends all the same. With one worker, the aborted relay task waits for the very worker the
    /// drop blocks.
    #[test]
    fn a_namespace_dropped_inside_async_code_ends_its_thread() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime");
            let dropped = runtime.block_on(runtime.spawn(async {
                let mut netns = Netns::new("drop-test", &[]).await?;
                netns.publish(8080).await?;
                drop(netns);
                anyhow::Ok(())
            }));
            let _ = done.send(dropped.map_err(anyhow::Error::from).and_then(|r| r));
        });
        match finished.recv_timeout(Duration::from_secs(20)) {
            Ok(dropped) => dropped.expect("a namespace with a published port"),
            Err(_) => panic!("dropping the namespace inside async code did not return within 20 s"),
        }
    }
}

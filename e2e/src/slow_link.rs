//! TCP relays. [`SlowLink`] holds every new connection for a fixed time before passing bytes
//! through: a slow network path to a real registry, so that many callers are really waiting on
//! the same registry request at once (the single-flight e2e). [`Relay`] can hang (a link cut);
//! [`Balancer`] spreads connections over several upstreams (a Service).

use std::time::Duration;

use anyhow::Result;
use tokio::{net::TcpListener, task::JoinHandle};

pub struct SlowLink {
    /// `host:port` to use instead of the upstream's.
    pub addr: String,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: JoinHandle<()>,
}

impl SlowLink {
    pub async fn start(upstream: &str, delay: Duration) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let upstream = upstream.to_string();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accepted = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    match tokio::net::TcpStream::connect(&upstream).await {
                        Ok(mut outbound) => {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        Err(error) => tracing::warn!(%upstream, %error, "slow link: upstream refused"),
                    }
                });
            }
        });
        Ok(Self {
            addr,
            connections,
            task,
        })
    }

    /// How many connections callers have opened through the link.
    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A TCP relay a test can make hang: [`Relay::hang`] keeps accepting bytes in both directions on
/// every connection, existing and new, and forwards none of them until [`Relay::resume`], which
/// then delivers everything held, in order (as a stalled proxy or network path would; a client
/// that gave up meanwhile cannot recall what it already sent). HTTP/2 keeps one connection
/// alive for many requests, so a hang must stall open connections, not only new ones.
pub struct Relay {
    /// `host:port` to use instead of the upstream's.
    pub addr: String,
    held: tokio::sync::watch::Sender<bool>,
    stop: tokio_util::sync::CancellationToken,
}

impl Relay {
    pub async fn start(upstream: &str) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let upstream = upstream.to_string();
        let held = tokio::sync::watch::Sender::new(false);
        let stop = tokio_util::sync::CancellationToken::new();
        let (flow, accepting) = (held.clone(), stop.clone());
        tokio::spawn(accepting.clone().run_until_cancelled_owned(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (upstream, flow, stop) = (upstream.clone(), flow.clone(), accepting.clone());
                tokio::spawn(stop.run_until_cancelled_owned(async move {
                    let outbound = match tokio::net::TcpStream::connect(&upstream).await {
                        Ok(outbound) => outbound,
                        Err(error) => {
                            tracing::warn!(%upstream, %error, "relay: upstream refused");
                            return;
                        }
                    };
                    let (from_client, to_client) = inbound.into_split();
                    let (from_server, to_server) = outbound.into_split();
                    tokio::join!(
                        pump(from_client, to_server, flow.subscribe()),
                        pump(from_server, to_client, flow.subscribe()),
                    );
                }));
            }
        }));
        Ok(Self { addr, held, stop })
    }

    /// From now on nothing is forwarded, either way, on any connection.
    pub fn hang(&self) {
        self.held.send_replace(true);
    }

    /// Delivers what was held, and everything after it.
    pub fn resume(&self) {
        self.held.send_replace(false);
    }
}

/// Copies `from` to `to`; a chunk read while held waits (and `from`'s further bytes wait in the
/// kernel's buffers) until resumed. An end of stream is passed on as a half close.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut held: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if held.wait_for(|held| !*held).await.is_err() {
            return;
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A TCP front that spreads new connections over its upstreams in turn, skipping one that
/// refuses, as kube-proxy spreads a Service's connections over its ready endpoints: what the
/// webhook configuration calls when several webhook processes serve (the soak's two replicas).
/// Balanced per connection, as a Service is: kube-apiserver keeps its connections to a webhook
/// open, so a replica killed takes the requests in flight on its connections with it, and the
/// next connection goes to a replica that accepts.
pub struct Balancer {
    /// `host:port` to call instead of any one upstream's.
    pub addr: String,
    stop: tokio_util::sync::CancellationToken,
}

impl Balancer {
    pub async fn start(upstreams: Vec<String>) -> Result<Self> {
        anyhow::ensure!(!upstreams.is_empty(), "a balancer needs an upstream");
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let stop = tokio_util::sync::CancellationToken::new();
        let accepting = stop.clone();
        tokio::spawn(accepting.clone().run_until_cancelled_owned(async move {
            let mut next = 0usize;
            while let Ok((mut inbound, _)) = listener.accept().await {
                let order: Vec<String> = (0..upstreams.len())
                    .map(|i| upstreams[(next + i) % upstreams.len()].clone())
                    .collect();
                next = next.wrapping_add(1);
                tokio::spawn(accepting.clone().run_until_cancelled_owned(async move {
                    for upstream in &order {
                        if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                    tracing::warn!(?order, "balancer: every upstream refused");
                }));
            }
        }));
        Ok(Self { addr, stop })
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

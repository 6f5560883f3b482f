//! A TCP relay that holds every new connection for a fixed time before passing bytes through:
//! a slow network path to a real registry, so that many callers are really waiting on the same
//! registry request at once (the single-flight e2e).

use std::time::Duration;

use anyhow::Result;
use tokio::{net::TcpListener, task::JoinHandle};

pub struct SlowLink {
    /// `host:port` to use instead of the upstream's.
    pub addr: String,
    task: JoinHandle<()>,
}

impl SlowLink {
    pub async fn start(upstream: &str, delay: Duration) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let upstream = upstream.to_string();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
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
        Ok(Self { addr, task })
    }
}

impl Drop for SlowLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

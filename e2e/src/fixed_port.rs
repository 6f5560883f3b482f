//! Ports some peers listen on that no flag or variable changes (knative's health-probe server in
//! kpack's webhook: 8080; Korifi's webhook server: 9443). Environments on one machine take turns
//! for such a port through a lock file, so two test runs never collide on it; a port held by a
//! program outside the harness fails the start with a message naming it.

use std::{
    fs::{File, TryLockError},
    net::TcpListener,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

/// How long an environment waits for another one on the machine to give the port up.
const WAIT: Duration = Duration::from_secs(300);

/// The right to listen on a fixed port, held until dropped.
#[derive(Debug)]
pub struct FixedPort {
    port: u16,
    _lock: File,
}

impl FixedPort {
    /// Waits for the port's lock (polled: a lock file cannot be watched), then checks that
    /// nothing else listens on it. `who` names the listener, for the messages.
    pub async fn claim(port: u16, who: &str) -> Result<Self> {
        let path = lock_path(port);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let deadline = Instant::now() + WAIT;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(TryLockError::WouldBlock) => bail!(
                    "port {port} ({who}) has been held by another test environment on this machine for {WAIT:?} ({})",
                    path.display()
                ),
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("locking {}", path.display()));
                }
            }
        }
        // Go's `:port` listens on every address: that is what must be free.
        TcpListener::bind(("0.0.0.0", port)).with_context(|| {
            format!("port {port} is in use by a program outside the harness; {who} listens on it and cannot be moved")
        })?;
        Ok(Self { port, _lock: file })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

fn lock_path(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("holdfast-e2e-port-{port}.lock"))
}

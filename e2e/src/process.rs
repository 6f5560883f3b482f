//! Child processes of the harness: logged to a file, tied to the harness's life, stopped on drop.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

/// A server process started by the harness.
///
/// Spawned through `setpriv --pdeathsig KILL` so that a harness killed outright (SIGKILL, a CI
/// timeout) takes its servers with it; `Drop` is the orderly path (SIGTERM, then SIGKILL).
#[derive(Debug)]
pub struct ServerProcess {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl ServerProcess {
    pub fn spawn(
        name: &'static str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &Path)],
        log: PathBuf,
    ) -> Result<Self> {
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let child = Command::new("setpriv")
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(program)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self { name, child, log })
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Fails with the end of the log if the process has already exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => anyhow::bail!(
                "{} exited early ({status}); last log lines:\n{}",
                self.name,
                self.log_tail(30)
            ),
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; always reaps the child.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// What the kernel counts for a process (`/proc/<pid>/status` and `stat`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Resident set size now.
    pub rss_kib: u64,
    /// The largest resident set size so far (VmHWM).
    pub peak_rss_kib: u64,
    /// User plus system CPU time so far, in clock ticks.
    pub cpu_ticks: u64,
}

/// `/proc/<pid>/stat` counts CPU time in clock ticks of 1/USER_HZ s; USER_HZ is 100 on Linux.
pub const TICKS_PER_SECOND: f64 = 100.0;

impl Usage {
    /// The usage of process `pid` (`None`: this process).
    pub fn of(pid: Option<u32>) -> Result<Self> {
        let dir = match pid {
            Some(pid) => format!("/proc/{pid}"),
            None => "/proc/self".into(),
        };
        let status = std::fs::read_to_string(format!("{dir}/status"))
            .with_context(|| format!("reading {dir}/status"))?;
        let kib = |field: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next())
                .with_context(|| format!("no {field} in {dir}/status"))?
                .parse()
                .map_err(Into::into)
        };
        let stat = std::fs::read_to_string(format!("{dir}/stat"))?;
        // Field 2, the command name, may hold spaces: count the fields after its closing ')',
        // from field 3 on. utime and stime are fields 14 and 15.
        let (_, after) = stat.rsplit_once(')').context("malformed stat")?;
        let mut fields = after.split_whitespace().skip(14 - 3);
        let mut next = || -> Result<u64> { Ok(fields.next().context("short stat")?.parse()?) };
        Ok(Self {
            rss_kib: kib("VmRSS:")?,
            peak_rss_kib: kib("VmHWM:")?,
            cpu_ticks: next()? + next()?,
        })
    }

    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    pub fn peak_rss_mib(&self) -> f64 {
        self.peak_rss_kib as f64 / 1024.0
    }

    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_ticks as f64 / TICKS_PER_SECOND
    }
}

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Polls `url` (a readiness endpoint: a process has nothing to watch) until it answers 2xx, as a
/// kubelet's probe would; `check` runs between attempts (e.g. [`ServerProcess::check_running`],
/// to fail at once when the process died).
pub async fn until_http_ok(
    url: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<()>,
) -> Result<()> {
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(rsp) = http.get(url).send().await
            && rsp.status().is_success()
        {
            return Ok(());
        }
        check()?;
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("{url} did not answer 2xx within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

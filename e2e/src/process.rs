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
    /// What started it, so that [`ServerProcess::respawn`] starts the same process again.
    program: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, PathBuf)>,
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
        let envs: Vec<(String, PathBuf)> = envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_path_buf()))
            .collect();
        let child = Self::start(name, program, args, &envs, out)?;
        Ok(Self {
            name,
            child,
            log,
            program: program.to_path_buf(),
            args: args.to_vec(),
            envs,
        })
    }

    fn start(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, PathBuf)],
        out: File,
    ) -> Result<Child> {
        let err = out.try_clone()?;
        Command::new("setpriv")
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(program)
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))
    }

    /// Stops the process as `how` says and starts it again with the same program, arguments
    /// and environment (a restarted pod, a crashed server brought back), its log appended to
    /// the same file so that nothing either run wrote is lost.
    pub fn respawn(&mut self, how: Stop) -> Result<()> {
        match how {
            Stop::Term(grace) => self.stop(grace),
            Stop::Kill => {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        let out = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .with_context(|| format!("opening {}", self.log.display()))?;
        self.child = Self::start(self.name, &self.program, &self.args, &self.envs, out)?;
        Ok(())
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

    /// How it exited, if it has.
    pub fn exited(&mut self) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
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

/// How [`ServerProcess::respawn`] stops a process before starting it again.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// SIGTERM, then SIGKILL after the grace period: an orderly restart.
    Term(Duration),
    /// SIGKILL at once: a crash, an OOM kill, a node lost.
    Kill,
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
    /// Its threads now (`Threads:`): a task leak shows here.
    pub threads: u64,
    /// Its open file descriptors now (`/proc/<pid>/fd`): a connection or file leak shows here.
    pub open_fds: u64,
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
        let number = |field: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next())
                .with_context(|| format!("no {field} in {dir}/status"))?
                .parse()
                .map_err(Into::into)
        };
        let stat = std::fs::read_to_string(format!("{dir}/stat"))?;
        let open_fds = std::fs::read_dir(format!("{dir}/fd"))
            .with_context(|| format!("listing {dir}/fd"))?
            .count() as u64;
        Ok(Self {
            rss_kib: number("VmRSS:")?,
            peak_rss_kib: number("VmHWM:")?,
            cpu_ticks: stat_cpu_ticks(&stat)?.1,
            threads: number("Threads:")?,
            open_fds,
        })
    }

    /// User plus system CPU time so far of this process's threads named `name` (the name a
    /// runtime gives its threads), in clock ticks: the share of one part of a process.
    pub fn threads_cpu_ticks(name: &str) -> Result<u64> {
        let mut ticks = 0;
        for task in std::fs::read_dir("/proc/self/task")? {
            // A thread may exit between the listing and the read.
            let Ok(stat) = std::fs::read_to_string(task?.path().join("stat")) else {
                continue;
            };
            let (comm, cpu) = stat_cpu_ticks(&stat)?;
            if comm == name {
                ticks += cpu;
            }
        }
        Ok(ticks)
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

/// The command name and utime + stime (clock ticks) of a `/proc/.../stat` line. Field 2, the
/// command name, may hold spaces and parentheses: the fields are counted after its last ')'.
fn stat_cpu_ticks(stat: &str) -> Result<(&str, u64)> {
    let (before, after) = stat.rsplit_once(')').context("malformed stat")?;
    let (_, comm) = before.split_once('(').context("malformed stat")?;
    // utime and stime are fields 14 and 15; `after` starts at field 3.
    let mut fields = after.split_whitespace().skip(14 - 3);
    let mut next = || -> Result<u64> { Ok(fields.next().context("short stat")?.parse()?) };
    Ok((comm, next()? + next()?))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a ')' of its own; utime 17, stime 4.
        let stat = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 17 4 0 0 20 0 2 0 5 1000 10";
        let (comm, ticks) = stat_cpu_ticks(stat).expect("a valid stat line");
        assert_eq!((comm, ticks), ("a) b", 21));
        assert!(stat_cpu_ticks("42 (short) S 1").is_err());
    }
}

//! `holdfast-mirror-copy`: one [`Copier::copy`] in a process of its own, so a test or a
//! benchmark can measure it from outside (wall time, peak memory).
//!
//! ```text
//! holdfast-mirror-copy SOURCE@sha256:… MIRROR_HOST[:PORT] PREFIX [--insecure HOST]… [--concurrency N]
//! ```
//!
//! Prints one line of `key=value` pairs: the [`CopyReport`](holdfast_registry::mirror::CopyReport)
//! fields, `seconds` (the copy alone) and `vmhwm_kib`, this process's peak resident set
//! (`VmHWM` in `/proc/self/status`) read after the copy.

use std::{collections::BTreeSet, process::ExitCode, time::Instant};

use anyhow::{Context, Result, bail};
use holdfast_registry::{
    Credentials, Reference, Resolver, ResolverConfig,
    mirror::{Copier, CopierConfig, MirrorLocation},
};

fn main() -> ExitCode {
    holdfast_e2e::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("holdfast-mirror-copy: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("holdfast-mirror-copy: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<String> {
    let mut positional = Vec::new();
    let mut insecure = BTreeSet::new();
    let mut concurrency = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--insecure" => {
                insecure.insert(args.next().context("--insecure needs a host")?);
            }
            "--concurrency" => {
                let n = args.next().context("--concurrency needs a number")?;
                concurrency = Some(n.parse::<usize>().with_context(|| format!("--concurrency {n}"))?);
            }
            _ => positional.push(arg),
        }
    }
    let [source, mirror, prefix] = positional.as_slice() else {
        bail!("usage: holdfast-mirror-copy SOURCE@DIGEST MIRROR PREFIX [--insecure HOST]… [--concurrency N]");
    };
    let source = Reference::parse(source)?;
    let resolver = Resolver::new(ResolverConfig {
        insecure_registries: insecure,
        ..ResolverConfig::default()
    })?;
    let mut config = CopierConfig::new(MirrorLocation::new(mirror, prefix)?);
    if let Some(n) = concurrency {
        config.blob_concurrency = n;
    }
    let copier = Copier::new(resolver, config, Credentials::anonymous());
    let started = Instant::now();
    let report = copier.copy(&source, &Credentials::anonymous()).await?;
    let seconds = started.elapsed().as_secs_f64();
    let status = std::fs::read_to_string("/proc/self/status")?;
    let vmhwm_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no VmHWM in /proc/self/status")?;
    Ok(format!(
        "target={} manifests_copied={} manifests_present={} blobs_copied={} blobs_present={} blobs_mounted={} bytes_copied={} bundle_images={} seconds={seconds:.3} vmhwm_kib={vmhwm_kib}",
        report.target,
        report.manifests_copied,
        report.manifests_present,
        report.blobs_copied,
        report.blobs_present,
        report.blobs_mounted,
        report.bytes_copied,
        report.bundle_images,
    ))
}

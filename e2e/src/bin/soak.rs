//! `make soak` (issue 33): `SOAK_MINUTES` (120) of Apps and PackageRepositories created,
//! updated and deleted while their tags move upstream, with a fault injector cycling through
//! registry outages and errors, kube-apiserver restarts, etcd SIGKILLs, the leader's link cut,
//! webhook and controller replicas SIGKILLed and the serving certificate rotated, and
//! invariants checked all along ([`holdfast_e2e::soak`]). The last line is the report; the exit
//! status is non-zero when any invariant was broken. `SOAK_SAMPLES` names a CSV file for the
//! resource samples the bounds were judged on. holdfast runs as the chart's pods on `make
//! cluster`'s real node; `SOAK_ON=processes`, as `make up`'s host processes.
//!
//! `holdfast-soak --judge SAMPLES.csv` judges a run's samples again (the judging of a
//! `SOAK_MINUTES` run) and prints the resource figures, with no environment.

use std::process::ExitCode;

use anyhow::{Context, Result};
use holdfast_e2e::soak::{self, Config, Placement};

#[tokio::main]
async fn main() -> Result<ExitCode> {
    holdfast_e2e::init();
    let minutes = match std::env::var("SOAK_MINUTES") {
        Ok(minutes) => minutes
            .parse()
            .with_context(|| format!("SOAK_MINUTES={minutes} is not a number of minutes"))?,
        Err(_) => 120,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {}
        [flag, path] if flag == "--judge" => {
            let csv = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
            let started = std::time::Instant::now();
            let samples = soak::invariants::read_samples(&csv, started)?;
            let (webhook, controller) = soak::judge(&samples, started, Config::long(minutes).judging);
            println!(
                "samples={} {}",
                samples.len(),
                soak::report::resource_figures(&webhook, &controller)
            );
            return Ok(ExitCode::SUCCESS);
        }
        _ => anyhow::bail!("usage: holdfast-soak [--judge SAMPLES.csv] (not {args:?})"),
    }
    let config = Config {
        placement: Placement::from_env()?,
        samples_to: std::env::var_os("SOAK_SAMPLES").map(Into::into),
        ..Config::long(minutes)
    };
    // On a runtime worker: the environment's processes die with the thread that forked them.
    let report = tokio::spawn(soak::run(config))
        .await
        .context("the soak panicked")??;
    println!("{report}");
    Ok(if report.violations == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

//! Issue 33, the short soak: the same code as `make soak` ([`holdfast_e2e::soak`]) with 24
//! objects over 6 tags, Korifi orgs of one app, and each fault injected once, in an environment of its own; no invariant
//! may break. `SOAK_SAMPLES` names a CSV file for the resource samples.

use std::process::ExitCode;

use anyhow::{Context, Result, ensure};
use holdfast_e2e::soak::{self, Config, faults::Fault};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone("the_short_soak_breaks_no_invariant", the_short_soak)
}

async fn the_short_soak() -> Result<()> {
    let config = Config {
        samples_to: std::env::var_os("SOAK_SAMPLES").map(Into::into),
        ..Config::short()
    };
    let report = tokio::spawn(soak::run(config))
        .await
        .context("the soak panicked")??;
    eprintln!("{report}");
    ensure!(
        report.violations == 0,
        "{} violations (listed above): {report}",
        report.violations
    );
    ensure!(
        report.faults >= Fault::ALL.len(),
        "{} faults injected, not each of the {} once",
        report.faults,
        Fault::ALL.len()
    );
    ensure!(
        report.admissions > 0
            && report.tag_moves > 0
            && report.follows_checked > 0
            && report.controller_writes_judged > 0
            && report.private_pins_in_owner_namespace > 0
            && report.mirror_pins > 0
            && report.org_deletions > 0,
        "the load did not run: {report}"
    );
    // Every process was sampled, the controllers in both roles (standing by at the start).
    let roles: std::collections::BTreeSet<_> = report.controller.stretches.iter().map(|s| s.role).collect();
    ensure!(
        report.webhook.judged_minutes > 0.0 && roles.len() == 2,
        "the resource samples judged nothing of a role: webhook {:?}, controller {:?}",
        report.webhook.stretches,
        report.controller.stretches
    );
    Ok(())
}

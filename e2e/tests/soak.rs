//! Issue 33, the short soak: the same code as `make soak` ([`holdfast_e2e::soak`]) with 24
//! objects over 6 tags, Korifi orgs of one app, and each fault injected once, in an environment
//! of its own; no invariant may break. holdfast runs as the chart's release on the real node
//! (two pods of each Deployment, from the image built here), so scripts/test.sh runs this with
//! the image's suites; `SOAK_ON=processes`: as `make up`'s host processes. `SOAK_SAMPLES` names a
//! CSV file for the resource samples.

use std::process::ExitCode;

use holdfast_e2e::soak::{self, Placement};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone("the_short_soak_breaks_no_invariant", || async {
        soak::short(Placement::from_env()?).await.map(drop)
    })
}

//! Issue 33, the short soak: the same code as `make soak` ([`holdfast_e2e::soak`]) with 24
//! objects over 6 tags, Korifi orgs of one app, and each fault injected once, in an environment
//! of its own, holdfast's replicas as host processes (as `make up` runs them); no invariant may
//! break. The same on the real node: `tests/soak_on_node.rs`. `SOAK_SAMPLES` names a CSV file
//! for the resource samples.

use std::process::ExitCode;

use holdfast_e2e::soak::{self, Placement};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone("the_short_soak_breaks_no_invariant", || async {
        soak::short(Placement::Processes).await.map(drop)
    })
}

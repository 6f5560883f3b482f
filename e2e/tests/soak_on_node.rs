//! Issue 33, the short soak on `make cluster`'s real node: as `tests/soak.rs`, with holdfast
//! installed as the chart's release (two pods of each Deployment, from the image built here)
//! on the real node around the soak's own control plane; its pods are killed by the kubelet's
//! rules, their links cut in their own network namespaces. Needs the node's builds and the
//! image's tools (scripts/test.sh runs it with the image's suites).

use std::process::ExitCode;

use holdfast_e2e::soak::{self, Placement};

fn main() -> ExitCode {
    holdfast_e2e::suite::run_alone("the_short_soak_on_the_node_breaks_no_invariant", || async {
        soak::short(Placement::Node).await.map(drop)
    })
}

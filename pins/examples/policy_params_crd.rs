//! Prints one of the pinning policy's parameter CRDs, generated from its type: the content of
//! its file in `manifests/crds/` (`pins/tests/crd.rs` checks it is).
//!
//! From the workspace: `cargo run -q -p holdfast-pins --example policy_params_crd -- cluster|namespaced > manifests/crds/…`

use holdfast_pins::policy_params::crd::{ParamsCrd, manifest};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args().nth(1).unwrap_or_default();
    let crd = ParamsCrd::ALL
        .into_iter()
        .find(|crd| crd.arg() == arg)
        .ok_or_else(|| format!("usage: policy_params_crd cluster|namespaced (not {arg:?})"))?;
    print!("{}", manifest(crd)?);
    Ok(())
}

//! Prints the ControllerLease CRD, generated from its type: the content of
//! `manifests/crds/controllerleases.holdfast.dev.yaml` (`controller/tests/crd.rs` checks it is).
//!
//! From the workspace: `cargo run -q -p holdfast-controller --example controller_lease_crd > manifests/crds/controllerleases.holdfast.dev.yaml`

fn main() -> Result<(), serde_yaml::Error> {
    print!("{}", holdfast_controller::leader::crd::manifest()?);
    Ok(())
}

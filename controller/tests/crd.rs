//! The committed ControllerLease CRD is the one generated from the type
//! (`holdfast_controller::leader::crd`), byte for byte.

use holdfast_controller::leader::crd::{FILE, REGENERATE, manifest};

#[test]
fn the_committed_crd_is_the_generated_one() {
    let path = format!("{}/../manifests/crds/{FILE}", env!("CARGO_MANIFEST_DIR"));
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = manifest().unwrap();
    assert!(
        committed == generated,
        "{path} is not the CRD generated from its type: regenerate it from the workspace with\n    {REGENERATE}"
    );
}

//! The committed parameter CRDs of the pinning policy are the ones generated from their types
//! (`holdfast_pins::policy_params::crd`), byte for byte.

use holdfast_pins::policy_params::crd::{ParamsCrd, manifest};

#[test]
fn the_committed_crds_are_the_generated_ones() {
    for crd in ParamsCrd::ALL {
        let path = format!("{}/../manifests/crds/{}", env!("CARGO_MANIFEST_DIR"), crd.file());
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let generated = manifest(crd).unwrap();
        assert!(
            committed == generated,
            "{path} is not the CRD generated from its type: regenerate it from the workspace with\n    {}",
            crd.regenerate()
        );
    }
}

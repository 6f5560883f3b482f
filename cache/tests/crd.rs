//! The committed DigestCacheEntry CRD is the one generated from the type
//! (`holdfast_cache::cluster_store::crd`), byte for byte.

use holdfast_cache::cluster_store::crd::{REGENERATE, manifest};

#[test]
fn the_committed_crd_is_the_generated_one() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../manifests/crds/digestcacheentries.holdfast.dev.yaml"
    );
    let committed = std::fs::read_to_string(path).unwrap();
    let generated = manifest().unwrap();
    let first_difference = committed
        .lines()
        .zip(generated.lines())
        .position(|(committed, generated)| committed != generated)
        .unwrap_or(committed.lines().count().min(generated.lines().count()));
    assert!(
        committed == generated,
        "manifests/crds/digestcacheentries.holdfast.dev.yaml is not the CRD generated from its type \
         (first difference on line {}): regenerate it from the workspace with\n    {REGENERATE}",
        first_difference + 1
    );
}

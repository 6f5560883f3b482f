//! Prints the DigestCacheEntry CRD, generated from its type: the content of
//! `manifests/crds/digestcacheentries.holdfast.dev.yaml` (`registry/tests/crd.rs` checks it is).
//!
//! From the workspace: `cargo run -q -p holdfast-registry --example crd > manifests/crds/digestcacheentries.holdfast.dev.yaml`

fn main() -> Result<(), serde_yaml::Error> {
    print!("{}", holdfast_registry::cluster_store::crd::manifest()?);
    Ok(())
}

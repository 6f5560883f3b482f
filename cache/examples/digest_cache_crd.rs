//! Prints the DigestCacheEntry CRD, generated from its type: the content of
//! `manifests/crds/digestcacheentries.holdfast.dev.yaml` (`cache/tests/crd.rs` checks it is).
//!
//! From the workspace: `cargo run -q -p holdfast-cache --example digest_cache_crd > manifests/crds/digestcacheentries.holdfast.dev.yaml`

fn main() -> Result<(), serde_yaml::Error> {
    print!("{}", holdfast_cache::cluster_store::crd::manifest()?);
    Ok(())
}

//! What the mirror suites (`tests/mirror.rs`, with the webhook and the controller, and
//! `tests/mirror_copier.rs`, the copier alone) share: the mirror's repository prefix, where a copy
//! of a repository lands, and the byte-for-byte comparison of a copy with its source.

use anyhow::{Context, Result, ensure};
use holdfast_registry::{Reference, mirror::host_component};

use crate::images;

/// The mirror's repository prefix in both suites (`--mirror-prefix mirror`).
pub const PREFIX: &str = "mirror";

/// The mirror repository of `repository` on `upstream`.
pub fn mirrored(upstream: &str, repository: &str) -> String {
    format!("{PREFIX}/{}/{repository}", host_component(upstream))
}

/// `registry/repository@digest`, parsed.
pub fn reference(registry: &str, repository: &str, digest: &str) -> Result<Reference> {
    Ok(Reference::parse(&format!("{registry}/{repository}@{digest}"))?)
}

/// Every manifest and blob of `digest` in `from/from_repo` is in `to/to_repo`, byte for byte
/// (and with the same manifest media types); returns how many manifests and blobs were compared.
pub async fn same_content(
    (from, from_repo): (&str, &str),
    (to, to_repo): (&str, &str),
    digest: &str,
) -> Result<(usize, usize)> {
    let (manifests, blobs) = images::manifest_tree(from, from_repo, digest).await?;
    for (kind, digests) in [("manifests", &manifests), ("blobs", &blobs)] {
        for digest in digests {
            let upstream = images::fetch_raw(from, from_repo, kind, digest).await?;
            let copy = images::fetch_raw(to, to_repo, kind, digest)
                .await
                .with_context(|| format!("{kind} {digest} is not in {to}/{to_repo}"))?;
            ensure!(
                images::sha256_digest(&copy.1) == *digest,
                "{to}/{to_repo} serves {kind} {digest} with other content"
            );
            ensure!(copy.1 == upstream.1, "{kind} {digest} differs from upstream");
            if kind == "manifests" {
                ensure!(
                    copy.0 == upstream.0,
                    "manifest {digest}: media type {:?} in the mirror, {:?} upstream",
                    copy.0,
                    upstream.0
                );
            }
        }
    }
    Ok((manifests.len(), blobs.len()))
}

/// The two images the suites' bundles lock, pushed to `up` in repositories of their own: an
/// image (`images/one`) and a two-platform index (`images/two`); their digests.
pub async fn push_locked_images(up: &str) -> Result<(String, String)> {
    let one = images::Image::with_files(&[("one.yml", b"one: 1\n")])?;
    let one_digest = images::push(up, "images/one", "1", &one).await?;
    let amd64 = images::Image::with_files(&[("two.yml", b"arch: amd64\n")])?;
    let arm64 = images::Image::with_files(&[("two.yml", b"arch: arm64\n")])?;
    let two_digest =
        images::push_index(up, "images/two", "1", &[("amd64", &amd64), ("arm64", &arm64)]).await?;
    Ok((one_digest, two_digest))
}

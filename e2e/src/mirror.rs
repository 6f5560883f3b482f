//! What the mirror suites (`tests/mirror.rs`, with the webhook and the controller, and
//! `tests/mirror_copier.rs`, the copier alone) and `make bench-pinning`'s mirror arm share: the
//! mirror's repository prefix, where a copy of a repository lands, how the webhook and the
//! controller are wired to a mirror, and the byte-for-byte comparison of a copy with its source.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use holdfast_controller::mirror::MirrorSettings;
use holdfast_pins::MirrorPins;
use holdfast_registry::{Reference, mirror::host_component};

use crate::{images, webhook::Registration};

/// The mirror's repository prefix in both suites (`--mirror-prefix mirror`).
pub const PREFIX: &str = "mirror";

/// The mirror repository of `repository` on `upstream`.
pub fn mirrored(upstream: &str, repository: &str) -> String {
    format!("{PREFIX}/{}/{repository}", host_component(upstream))
}

/// holdfast wired to a mirror as `--mirror-registry` and the shipped configurations run it: the
/// webhook's [`Registration`] (the shipped webhook configurations, pinning to the copies the
/// controller recorded as `pins` says, plain HTTP to `up` and the mirror) and the controller's
/// [`MirrorSettings`] (content from `up` copied, two copies at a time as `--mirror-concurrency`
/// ships, the mirror's credentials in the Secret `secret` of holdfast's namespace, copies no
/// object references deleted after `retention`). The controller trusts plain HTTP to both
/// registries too.
pub fn wiring(
    up: &str,
    pins: MirrorPins,
    secret: Option<String>,
    retention: Duration,
) -> (Registration, MirrorSettings) {
    let mut registration = Registration::shipped();
    registration.insecure_registries = vec![up.to_owned(), pins.location.registry().to_owned()];
    registration.mirror = Some(pins.clone());
    let settings = MirrorSettings {
        location: pins.location,
        namespaces: pins.namespaces,
        pull_secret: pins.pull_secret,
        registries: vec![up.to_owned()],
        secret,
        concurrency: 2,
        retention,
    };
    (registration, settings)
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

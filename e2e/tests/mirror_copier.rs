//! The mirror copier (holdfast-registry's `mirror`) alone, between two real registries on
//! loopback, an upstream and a mirror: an image and an imgpkg bundle are copied byte for byte, the
//! bundle with the images of its ImagesLock relocated into its own repository; a copy cut off by a
//! mirror outage completes afterwards without sending again what had arrived; and a 200 MiB bundle
//! is copied by a process whose peak resident memory stays under 64 MiB. The webhook and the
//! controller mirroring through it: `tests/mirror.rs`.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use holdfast_e2e::{
    Env,
    control_plane::SpareRegistry,
    e2e_main,
    images::{self, IMGPKG_BUNDLE_LABEL, Image, OCI_LAYER_TAR},
    mirror::{PREFIX, mirrored, reference, same_content},
};
use holdfast_registry::{
    Credentials, Resolver, ResolverConfig,
    mirror::{Copier, CopierConfig, CopyEvent, MirrorLocation},
};

// Serial: each test moves tens to hundreds of MiB between its own two registries; one at a time
// keeps the outage test's progress deadline and the memory measurement clear of the others' load.
e2e_main!(serial:
    copies_an_image_and_relocates_a_bundle_byte_for_byte,
    an_interrupted_copy_resumes_without_resending_blobs,
    a_200_mib_bundle_is_copied_in_under_64_mib_of_memory,
);

const MIB: u64 = 1024 * 1024;

/// A copier from `upstream` to `mirror` (both plain HTTP) with `concurrency` blobs at a time.
fn copier(upstream: &str, mirror: &str, concurrency: usize) -> Result<Copier> {
    let resolver = Resolver::new(ResolverConfig {
        insecure_registries: [upstream.to_owned(), mirror.to_owned()].into(),
        ..ResolverConfig::default()
    })?;
    let mut config = CopierConfig::new(MirrorLocation::new(mirror, PREFIX)?);
    config.blob_concurrency = concurrency;
    Ok(Copier::new(resolver, config, Credentials::anonymous()))
}

async fn copies_an_image_and_relocates_a_bundle_byte_for_byte(env: Arc<Env>) -> Result<()> {
    let upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.as_str(), mirror.addr.as_str());

    let web = Image::with_files(&[("config/web.yml", b"kind: web\n")])?;
    let web_digest = images::push(up, "apps/web", "1.0", &web).await?;
    // The bundle's images live in other repositories: one image, one two-platform index.
    let (one_digest, two_digest) = holdfast_e2e::mirror::push_locked_images(up).await?;
    let locked = [
        format!("{up}/images/one@{one_digest}"),
        format!("{up}/images/two@{two_digest}"),
    ];
    let bundle = Image::bundle(&[("config/app.yml", b"app: 1\n")], &locked)?;
    let bundle_digest = images::push(up, "bundles/app", "1.0", &bundle).await?;

    let copier = copier(up, m, 2)?;
    let none = Credentials::anonymous();

    // The tagged image, by the digest its tag points at.
    let report = copier
        .copy(&reference(up, "apps/web", &web_digest)?, &none)
        .await?;
    let web_repo = mirrored(up, "apps/web");
    ensure!(
        report.target == format!("{m}/{web_repo}@{web_digest}"),
        "{report:?}"
    );
    ensure!(
        (
            report.manifests_copied,
            report.blobs_copied,
            report.blobs_present,
            report.bundle_images
        ) == (1, 2, 0, 0),
        "{report:?}"
    );
    ensure!(
        report.bytes_copied == (web.config.bytes.len() + web.layer.bytes.len()) as u64,
        "{report:?}"
    );
    let compared = same_content((up, "apps/web"), (m, &web_repo), &web_digest).await?;
    ensure!(compared == (1, 2), "compared {compared:?}");

    // The bundle: it and both locked images (the index with both platforms) in ONE repository.
    let report = copier
        .copy(&reference(up, "bundles/app", &bundle_digest)?, &none)
        .await?;
    let bundle_repo = mirrored(up, "bundles/app");
    ensure!(
        report.target == format!("{m}/{bundle_repo}@{bundle_digest}"),
        "{report:?}"
    );
    ensure!(
        (report.manifests_copied, report.blobs_copied, report.bundle_images) == (5, 8, 2),
        "bundle + image + index + 2 platform manifests, 4 configs and 4 layers: {report:?}"
    );
    ensure!(
        report.colocated_upstream == Some(false),
        "its images are not in its repository upstream: {report:?}"
    );
    same_content((up, "bundles/app"), (m, &bundle_repo), &bundle_digest).await?;
    ensure!(same_content((up, "images/one"), (m, &bundle_repo), &one_digest).await? == (1, 2));
    ensure!(same_content((up, "images/two"), (m, &bundle_repo), &two_digest).await? == (3, 4));
    for (repository, digest) in [("images/one", &one_digest), ("images/two", &two_digest)] {
        ensure!(
            images::head_digest(m, &mirrored(up, repository), digest)
                .await?
                .is_none(),
            "{repository} was copied to its own repository, not (only) into the bundle's"
        );
    }

    // Again: the bundle's manifest is there, so nothing is read or sent.
    let puts_before = mirror.requests_matching("\"PUT ");
    let report = copier
        .copy(&reference(up, "bundles/app", &bundle_digest)?, &none)
        .await?;
    ensure!(
        (
            report.manifests_present,
            report.manifests_copied,
            report.blobs_copied
        ) == (1, 0, 0),
        "{report:?}"
    );
    ensure!(
        report.colocated_upstream.is_none(),
        "no ImagesLock read: {report:?}"
    );
    ensure!(
        mirror.requests_matching("\"PUT ") == puts_before,
        "a second copy wrote to the mirror"
    );

    // A bundle whose images are in its own repository upstream, one locked there by name and
    // one locked elsewhere but present there too (as `imgpkg copy` leaves a bundle).
    let here = Image::with_files(&[("here.yml", b"here: 1\n")])?;
    let here_digest = images::push(up, "bundles/colocated", "here", &here).await?;
    let both = Image::with_files(&[("both.yml", b"both: 1\n")])?;
    let both_digest = images::push(up, "images/both", "1", &both).await?;
    images::push(up, "bundles/colocated", "both", &both).await?;
    let colocated_lock = [
        format!("{up}/bundles/colocated@{here_digest}"),
        format!("{up}/images/both@{both_digest}"),
    ];
    let colocated = Image::bundle(&[("config/app.yml", b"app: 2\n")], &colocated_lock)?;
    let colocated_digest = images::push(up, "bundles/colocated", "1.0", &colocated).await?;
    let report = copier
        .copy(&reference(up, "bundles/colocated", &colocated_digest)?, &none)
        .await?;
    ensure!(report.colocated_upstream == Some(true), "{report:?}");

    // The same image in another upstream repository: its blobs are mounted from the first copy.
    images::push(up, "apps/web-copy", "1.0", &web).await?;
    let report = copier
        .copy(&reference(up, "apps/web-copy", &web_digest)?, &none)
        .await?;
    ensure!(
        (report.blobs_mounted, report.blobs_copied, report.manifests_copied) == (2, 0, 1),
        "{report:?}"
    );
    let copy_repo = mirrored(up, "apps/web-copy");
    let mounts = mirror.requests_matching(&format!("\"POST /v2/{copy_repo}/blobs/uploads/?mount="));
    ensure!(
        mounts == 2,
        "{mounts} mount requests in the mirror's access log, expected 2"
    );
    same_content((up, "apps/web-copy"), (m, &copy_repo), &web_digest).await?;
    Ok(())
}

/// How many times the registry completed an upload (`PUT …&digest=… 201`) of each blob.
fn completed_uploads(registry: &SpareRegistry, blobs: &[String]) -> BTreeMap<String, usize> {
    blobs
        .iter()
        .map(|digest| {
            let hex = digest.trim_start_matches("sha256:");
            let pattern = format!("digest=sha256%3A{hex} HTTP/1.1\" 201 ");
            (digest.clone(), registry.requests_matching(&pattern))
        })
        .collect()
}

fn arrived(uploads: &BTreeMap<String, usize>) -> usize {
    uploads.values().filter(|n| **n > 0).count()
}

async fn an_interrupted_copy_resumes_without_resending_blobs(env: Arc<Env>) -> Result<()> {
    const LAYERS: usize = 8;
    let upstream = env.spare_registry().await?;
    let mut mirror = env.spare_registry().await?;
    let up = upstream.addr.clone();
    let dir = tempfile::tempdir()?;
    let mut layers = Vec::new();
    for i in 0..LAYERS {
        let path = dir.path().join(format!("layer-{i}.tar"));
        images::write_random_tar(&path, 12 * MIB, &[])?;
        layers.push(images::push_blob_file(&up, "apps/big", &path, OCI_LAYER_TAR).await?);
        std::fs::remove_file(&path)?;
    }
    let digest = images::push_image_of_layers(&up, "apps/big", "1.0", &layers, BTreeMap::new()).await?;
    let blobs = LAYERS + 1;
    let repo = mirrored(&up, "apps/big");
    let source = reference(&up, "apps/big", &digest)?;

    // One blob at a time; the mirror goes down once the config and three layers have arrived.
    let (events, mut progress) = tokio::sync::mpsc::unbounded_channel();
    let copier = Arc::new(copier(&up, &mirror.addr, 1)?.with_events(events));
    let mut copy = tokio::spawn({
        let (copier, source) = (copier.clone(), source.clone());
        async move { copier.copy(&source, &Credentials::anonymous()).await }
    });
    let mut copied = 0;
    while copied < 4 {
        tokio::select! {
            event = progress.recv() => {
                let event = event.context("the copier dropped its event channel")?;
                copied += usize::from(matches!(event, CopyEvent::BlobCopied { .. }));
            }
            ended = &mut copy => bail!("the copy ended after {copied} blobs, before the outage: {ended:?}"),
            () = tokio::time::sleep(Duration::from_secs(60)) => bail!("no copy progress within 60 s"),
        }
    }
    mirror.stop();
    let interrupted = copy.await?;
    let Err(error) = interrupted else {
        bail!("the copy finished before the mirror stopped: {interrupted:?}");
    };
    ensure!(
        error.is_transient(),
        "an outage should be a transient error: {error}"
    );
    let (_, all_blobs) = images::manifest_tree(&up, "apps/big", &digest).await?;
    ensure!(all_blobs.len() == blobs, "{all_blobs:?}");
    // The access log starts anew when the registry restarts: count each run on its own.
    let before_outage = completed_uploads(&mirror, &all_blobs);
    let first = arrived(&before_outage);
    ensure!(
        (4..blobs).contains(&first),
        "{first} of {blobs} blobs arrived before the outage"
    );

    mirror.start().await?;
    ensure!(
        images::head_digest(&mirror.addr, &repo, &digest).await?.is_none(),
        "the mirror has the manifest of a half-copied image"
    );
    let report = copier.copy(&source, &Credentials::anonymous()).await?;
    ensure!(
        report.blobs_present == first && report.blobs_copied == blobs - first,
        "resumed with {} present and {} copied, {first} had arrived before: {report:?}",
        report.blobs_present,
        report.blobs_copied,
    );
    ensure!(report.manifests_copied == 1, "{report:?}");
    let after_outage = completed_uploads(&mirror, &all_blobs);
    let uploads: BTreeMap<&String, (usize, usize)> = all_blobs
        .iter()
        .map(|d| (d, (before_outage[d], after_outage[d])))
        .collect();
    ensure!(
        uploads.values().all(|(before, after)| before + after == 1),
        "uploads of each blob (before the outage, after it) must add up to exactly one: {uploads:?}"
    );
    same_content((&up, "apps/big"), (&mirror.addr, &repo), &digest).await?;
    Ok(())
}

fn fields(line: &str) -> BTreeMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

async fn a_200_mib_bundle_is_copied_in_under_64_mib_of_memory(env: Arc<Env>) -> Result<()> {
    const SIZE: u64 = 200 * MIB;
    let dir = tempfile::tempdir()?;
    // The layer, then a copy in each registry.
    let free = images::free_disk_bytes(dir.path())?;
    ensure!(
        free > 4 * SIZE,
        "only {} MiB free for a {} MiB test",
        free / MIB,
        SIZE / MIB
    );
    let upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.as_str(), mirror.addr.as_str());

    let small = Image::with_files(&[("small.yml", b"small: true\n")])?;
    let small_digest = images::push(up, "images/small", "1", &small).await?;
    let lock = images::images_lock_yaml(&[format!("{up}/images/small@{small_digest}")]);
    // The ImagesLock comes after the 200 MiB in the tar: the copier must scan the whole layer.
    let path = dir.path().join("bundle-layer.tar");
    images::write_random_tar(&path, SIZE, &[(".imgpkg/images.yml", lock.as_bytes())])?;
    let layer = images::push_blob_file(up, "bundles/big", &path, OCI_LAYER_TAR).await?;
    drop(dir);
    let labels = [(IMGPKG_BUNDLE_LABEL.to_owned(), "true".to_owned())].into();
    let digest =
        images::push_image_of_layers(up, "bundles/big", "1.0", std::slice::from_ref(&layer), labels).await?;

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_holdfast-mirror-copy"))
        .args([&format!("{up}/bundles/big@{digest}"), m, PREFIX])
        .args(["--insecure", up, "--insecure", m])
        .kill_on_drop(true)
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "holdfast-mirror-copy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = fields(stdout.trim());
    let number = |key: &str| -> Result<u64> {
        report
            .get(key)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no {key} in {stdout:?}"))
    };
    let peak_kib = number("vmhwm_kib")?;
    eprintln!(
        "  200 MiB bundle copied: peak RSS {:.1} MiB; {}",
        peak_kib as f64 / 1024.0,
        stdout.trim()
    );
    ensure!(number("bytes_copied")? >= SIZE, "{stdout}");
    ensure!(
        (number("bundle_images")?, number("manifests_copied")?) == (1, 2),
        "{stdout}"
    );
    ensure!(peak_kib < 64 * 1024, "peak RSS {peak_kib} KiB, limit 64 MiB");
    let repo = mirrored(up, "bundles/big");
    ensure!(same_content((up, "images/small"), (m, &repo), &small_digest).await? == (1, 2));
    let (manifests, blobs) = images::manifest_tree(m, &repo, &digest).await?;
    ensure!(manifests == [digest.clone()], "{manifests:?}");
    ensure!(
        blobs.contains(&layer.digest),
        "the 200 MiB layer is not in the mirrored manifest"
    );
    let present: BTreeSet<String> = [layer.digest.clone()].into();
    for blob in &present {
        let url = format!("http://{m}/v2/{repo}/blobs/{blob}");
        let head = reqwest::Client::new().head(&url).send().await?;
        ensure!(head.status().is_success(), "HEAD {url}: {}", head.status());
        let length = head
            .headers()
            .get(reqwest::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        ensure!(length == Some(layer.size), "{url}: {length:?} bytes");
    }
    Ok(())
}

//! `make bench-mirror`: copy throughput of holdfast's mirror copier against `skopeo copy`, of the
//! same image between the same two real registries (upstream and mirror, Distribution on
//! loopback over plain HTTP), in the same run.
//!
//! - The image: `BENCH_MIRROR_MIB` (default 200) MiB of incompressible random bytes in
//!   `BENCH_MIRROR_LAYERS` (default 4) tar layers, pushed once to the upstream.
//! - `BENCH_MIRROR_ROUNDS` (default 3) rounds; each round copies the image once with each tool,
//!   alternating which goes first, each into a fresh mirror repository. Neither can use the
//!   other's (or an earlier round's) blobs: holdfast runs as a fresh `holdfast-mirror-copy`
//!   process (its mount knowledge is per process), and skopeo runs unprivileged with a fresh
//!   `XDG_DATA_HOME`, so its blob-info cache (which it would use for cross-repository mounts) is
//!   empty every time. The mirror's access log is checked for mounts by either.
//! - Each run is timed as a whole process (start to exit), for both tools; throughput is image
//!   bytes (layers and config) over that time; the ratio is of the medians.
//! - Then the outage check: the mirrored image is fetched by digest from the mirror as
//!   kapp-controller would (manifest, config, layers; each verified), once with the upstream up
//!   and once with it stopped; the upstream's access log counts the requests that reached it.
//!
//! Last line: `copy_ratio=<holdfast/skopeo throughput> upstream_requests_after_outage=<n>`; the
//! rounds go to `docs/benchmarks/data/mirror.csv` (`holdfast_e2e::bench_data`).

use std::{
    collections::BTreeMap,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{ExitCode, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail, ensure};
use holdfast_e2e::{
    Env, bench_data,
    control_plane::SpareRegistry,
    images::{self, OCI_LAYER_TAR},
};
use holdfast_registry::mirror::host_component;
use serde::Serialize;
use sha2::{Digest as _, Sha256};

const MIB: u64 = 1024 * 1024;

fn knob(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(value) => value
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|n| *n > 0)
            .with_context(|| format!("{name}: {value:?} is not a positive number")),
        Err(_) => Ok(default),
    }
}

fn main() -> ExitCode {
    holdfast_e2e::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench-mirror: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-mirror: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One copy, as `mirror.csv` holds it.
#[derive(Serialize)]
struct Run {
    round: u64,
    tool: &'static str,
    seconds: f64,
    mib_per_s: f64,
    peak_rss_mib: Option<f64>,
}

async fn run() -> Result<()> {
    let total_mib = knob("BENCH_MIRROR_MIB", 200)?;
    let layers = knob("BENCH_MIRROR_LAYERS", 4)?;
    let rounds = knob("BENCH_MIRROR_ROUNDS", 3)?;
    let copier_bin = sibling("holdfast-mirror-copy")?;
    let skopeo = on_path("skopeo")?;

    let env = Env::start().await?;
    let mut upstream = env.spare_registry().await?;
    let mirror = env.spare_registry().await?;
    let (up, m) = (upstream.addr.clone(), mirror.addr.clone());

    // The image, generated in a temp dir that is removed as soon as it is pushed.
    let dir = tempfile::tempdir()?;
    let free = images::free_disk_bytes(dir.path())?;
    let needed = 4 * total_mib * MIB;
    ensure!(
        free > needed,
        "{} MiB free, the benchmark needs {} MiB",
        free / MIB,
        needed / MIB
    );
    let mut pushed = Vec::new();
    for i in 0..layers {
        let path = dir.path().join(format!("layer-{i}.tar"));
        images::write_random_tar(&path, total_mib * MIB / layers, &[])?;
        pushed.push(images::push_blob_file(&up, "bench/image", &path, OCI_LAYER_TAR).await?);
        std::fs::remove_file(&path)?;
    }
    let digest = images::push_image_of_layers(&up, "bench/image", "1.0", &pushed, BTreeMap::new()).await?;
    let (_, blobs) = images::manifest_tree(&up, "bench/image", &digest).await?;
    let (_, config) = images::fetch_raw(&up, "bench/image", "blobs", &blobs[0]).await?;
    let bytes: u64 = pushed.iter().map(|b| b.size).sum::<u64>() + config.len() as u64;
    eprintln!(
        "image {up}/bench/image@{digest}: {layers} layers, {:.1} MiB",
        bytes as f64 / MIB as f64
    );

    let source = format!("{up}/bench/image@{digest}");
    let mut runs = Vec::new();
    for round in 0..rounds {
        let order: [&str; 2] = if round % 2 == 0 {
            ["holdfast", "skopeo"]
        } else {
            ["skopeo", "holdfast"]
        };
        for tool in order {
            let prefix = format!("{}-{round}", if tool == "holdfast" { "hf" } else { "sk" });
            let repository = format!("{prefix}/{}/bench/image", host_component(&up));
            let run = match tool {
                "holdfast" => holdfast_copy(&copier_bin, &source, &m, &prefix, &up).await?,
                _ => skopeo_copy(&skopeo, &source, &m, &repository).await?,
            };
            ensure!(
                images::head_digest(&m, &repository, &digest).await?.as_deref() == Some(digest.as_str()),
                "{tool} did not leave {m}/{repository}@{digest}"
            );
            let mounts = mirror.requests_matching(&format!("\"POST /v2/{repository}/blobs/uploads/?mount="));
            ensure!(
                mounts == 0,
                "{tool} mounted {mounts} blobs into {repository}: not a fair run"
            );
            eprintln!("  round {round}: {tool} {:.2} s", run.0);
            runs.push(Run {
                round,
                tool,
                seconds: run.0,
                mib_per_s: bytes as f64 / MIB as f64 / run.0,
                peak_rss_mib: run.1,
            });
        }
    }

    // kapp-controller's fetch of the mirrored image, with the upstream up and then down.
    let mirrored = format!("hf-0/{}/bench/image", host_component(&up));
    let before = upstream_requests(&upstream);
    fetch_verified(&m, &mirrored, &digest).await?;
    upstream.stop();
    fetch_verified(&m, &mirrored, &digest)
        .await
        .context("fetching the mirrored image with the upstream stopped")?;
    let upstream_requests_after_outage = upstream_requests(&upstream) - before;

    let mib = bytes as f64 / MIB as f64;
    println!("| round | tool | seconds | MiB/s | peak RSS MiB |");
    println!("|---|---|---|---|---|");
    for run in &runs {
        println!(
            "| {} | {} | {:.2} | {:.1} | {} |",
            run.round,
            run.tool,
            run.seconds,
            run.mib_per_s,
            run.peak_rss_mib.map_or("-".to_owned(), |r| format!("{r:.1}"))
        );
    }
    let median = |tool: &str| {
        let mut speeds: Vec<f64> = runs
            .iter()
            .filter(|r| r.tool == tool)
            .map(|r| r.mib_per_s)
            .collect();
        speeds.sort_by(f64::total_cmp);
        speeds[speeds.len() / 2]
    };
    let (holdfast, skopeo) = (median("holdfast"), median("skopeo"));
    println!(
        "median MiB/s: holdfast {holdfast:.1}, skopeo {skopeo:.1} ({mib:.1} MiB image, {rounds} rounds)"
    );
    bench_data::write("mirror", &runs)?;
    println!(
        "copy_ratio={:.2} upstream_requests_after_outage={upstream_requests_after_outage}",
        holdfast / skopeo
    );
    Ok(())
}

/// One copy by `holdfast-mirror-copy`: wall seconds of the process and its peak RSS.
async fn holdfast_copy(
    bin: &Path,
    source: &str,
    mirror: &str,
    prefix: &str,
    upstream: &str,
) -> Result<(f64, Option<f64>)> {
    let started = Instant::now();
    let out = tokio::process::Command::new(bin)
        .args([
            source,
            mirror,
            prefix,
            "--insecure",
            upstream,
            "--insecure",
            mirror,
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "holdfast-mirror-copy failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let fields: BTreeMap<&str, &str> = stdout
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    ensure!(
        fields.get("blobs_present") == Some(&"0") && fields.get("blobs_mounted") == Some(&"0"),
        "holdfast reused blobs in a fresh repository: {stdout}"
    );
    let rss = fields
        .get("vmhwm_kib")
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kib| kib / 1024.0);
    Ok((seconds, rss))
}

/// One `skopeo copy`, unprivileged with an empty blob-info cache of its own.
async fn skopeo_copy(
    skopeo: &Path,
    source: &str,
    mirror: &str,
    repository: &str,
) -> Result<(f64, Option<f64>)> {
    let home = tempfile::tempdir()?;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777))?;
    let started = Instant::now();
    let out = tokio::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(skopeo)
        .args([
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            "--preserve-digests",
        ])
        .arg(format!("docker://{source}"))
        .arg(format!("docker://{mirror}/{repository}:copy"))
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env("XDG_RUNTIME_DIR", home.path().join("run"))
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("skopeo copy failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((seconds, None))
}

/// Fetches manifest and blobs by digest from `registry`, streaming and verifying each.
async fn fetch_verified(registry: &str, repository: &str, digest: &str) -> Result<()> {
    let (_, blobs) = images::manifest_tree(registry, repository, digest).await?;
    let http = reqwest::Client::new();
    for blob in blobs {
        let url = format!("http://{registry}/v2/{repository}/blobs/{blob}");
        let mut rsp = http.get(&url).send().await?.error_for_status()?;
        let mut hasher = Sha256::new();
        while let Some(chunk) = rsp.chunk().await? {
            hasher.update(&chunk);
        }
        let got = format!("sha256:{}", hex::encode(hasher.finalize()));
        ensure!(got == blob, "{url} served content hashing to {got}");
    }
    Ok(())
}

fn upstream_requests(registry: &SpareRegistry) -> usize {
    [
        "\"GET /v2/",
        "\"HEAD /v2/",
        "\"POST /v2/",
        "\"PUT /v2/",
        "\"PATCH /v2/",
    ]
    .iter()
    .map(|p| registry.requests_matching(p))
    .sum()
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    ensure!(
        path.is_file(),
        "{} is missing: build it with the benchmark (`make bench-mirror` does)",
        path.display()
    );
    Ok(path)
}

fn on_path(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("`{name}` is not on PATH: run `make deps` (scripts/install-deps.sh)"))
}

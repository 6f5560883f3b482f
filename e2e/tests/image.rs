//! The container image `make image` builds without a Docker engine (scripts/image.sh: static
//! musl binaries, umoci, skopeo), pulled back from the registry it was pushed to: an OCI index of
//! a linux/amd64 and a linux/arm64 image; each image's config is what manifests/ assume (user,
//! entrypoint, the commands the Deployments run), it holds the three binaries and the CA bundle
//! and nothing else, and the binaries taken out of its layers run — `--help` (arm64's under
//! Debian's qemu-user), and the webhook of each platform, on a file system remounted read-only,
//! serving the API server's reviews (an App written with a tag is stored pinned); signed with
//! cosign against a key the test creates, with a CycloneDX SBOM of each binary attested, which
//! verification with another key refuses.

use std::{collections::BTreeMap, io::Read as _, path::Path, sync::Arc};

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, dist, e2e_main, images,
    objects::{api_for, create_all},
    process::{ServerProcess, free_port, until_http_ok},
    wait,
    webhook::{SCOPE_LABEL, ca_bundle_injected, shipped_configurations},
};
use holdfast_manifest_checks::{chart::Settings, load::kubectl};
use k8s_openapi::{
    api::admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement,
};
use kube::api::{Api, PostParams};

e2e_main!(
    the_image_is_what_the_manifests_run,
    the_webhook_binary_from_the_image_pins_an_app,
    the_arm64_webhook_binary_pins_an_app_under_qemu,
    the_image_is_signed_and_carries_an_sbom_of_each_binary,
);

/// The image's platforms (linux/ARCH): the architecture, readelf's machine, and what runs a
/// binary of it here (nothing: natively; Debian's qemu-user-static otherwise).
const PLATFORMS: [(&str, &str, Option<&str>); 2] = [
    ("amd64", "Advanced Micro Devices X86-64", None),
    ("arm64", "AArch64", Some("qemu-aarch64-static")),
];

/// The image manifest of linux/`arch` in the pushed index.
async fn platform_manifest(registry: &str, image: &dist::Image, arch: &str) -> Result<serde_json::Value> {
    let (_, bytes) = images::fetch_raw(registry, "holdfast", "manifests", &image.digest).await?;
    let index: serde_json::Value = serde_json::from_slice(&bytes)?;
    let digest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
        .and_then(|m| m["digest"].as_str())
        .with_context(|| format!("the index has no linux/{arch} image: {index}"))?;
    let (media_type, bytes) = images::fetch_raw(registry, "holdfast", "manifests", digest).await?;
    ensure!(
        media_type == images::OCI_MANIFEST && images::sha256_digest(&bytes) == digest,
        "linux/{arch}: {media_type} under {digest}"
    );
    Ok(serde_json::from_slice(&bytes)?)
}

/// The image's files: path -> (mode, uid, contents).
type Files = BTreeMap<String, (u32, u64, Vec<u8>)>;

/// Every regular file of every layer of the pushed image, and the layers' compressed size.
async fn files(image: &dist::Image, manifest: &serde_json::Value) -> Result<(Files, u64)> {
    let registry = image.repository.split('/').next().unwrap_or_default();
    let mut files = Files::new();
    let mut size = 0;
    for layer in manifest["layers"].as_array().context("no layers")? {
        let digest = layer["digest"].as_str().context("layer without digest")?;
        let (_, bytes) = images::fetch_raw(registry, "holdfast", "blobs", digest).await?;
        size += bytes.len() as u64;
        let gzip = layer["mediaType"].as_str().is_some_and(|m| m.ends_with("+gzip"));
        let reader: Box<dyn std::io::Read> = if gzip {
            // umoci compresses in parallel: several gzip members one after the other.
            Box::new(flate2::read::MultiGzDecoder::new(&bytes[..]))
        } else {
            Box::new(&bytes[..])
        };
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries()? {
            let mut entry = entry?;
            if entry.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let path = format!("/{}", entry.path()?.display());
            let (mode, uid) = (entry.header().mode()?, entry.header().uid()?);
            let mut contents = Vec::new();
            entry.read_to_end(&mut contents)?;
            files.insert(path, (mode, uid, contents));
        }
    }
    Ok((files, size))
}

fn git_head() -> Result<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(dist::repo())
        .args(["rev-parse", "HEAD"])
        .output()?;
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// Writes the image's binary `name` into `dir`, executable; returns its path.
fn extract(files: &Files, name: &str, dir: &Path) -> Result<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let (_, _, contents) = files
        .get(&format!("/usr/local/bin/{name}"))
        .with_context(|| format!("the image has no /usr/local/bin/{name}"))?;
    let path = dir.join(name);
    std::fs::write(&path, contents)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

async fn the_image_is_what_the_manifests_run(env: Arc<Env>) -> Result<()> {
    let image = dist::build_and_push_image(&env)?;
    let registry = env.registry();
    let (media_type, bytes) = images::fetch_raw(registry, "holdfast", "manifests", &image.digest).await?;
    ensure!(
        images::sha256_digest(&bytes) == image.digest,
        "the registry serves other bytes under {}",
        image.digest
    );
    let index: serde_json::Value = serde_json::from_slice(&bytes)?;
    ensure!(
        media_type == images::OCI_INDEX,
        "not an OCI image index: {media_type}"
    );
    let platforms: Vec<String> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            format!(
                "{}/{}",
                m["platform"]["os"].as_str().unwrap_or_default(),
                m["platform"]["architecture"].as_str().unwrap_or_default()
            )
        })
        .collect();
    ensure!(
        platforms == ["linux/amd64", "linux/arm64"],
        "the index holds {platforms:?}"
    );
    for (arch, machine, runner) in PLATFORMS {
        let manifest = platform_manifest(registry, &image, arch).await?;
        for annotations in [&index["annotations"], &manifest["annotations"]] {
            release_annotations(annotations).with_context(|| format!("linux/{arch}"))?;
        }
        platform_is_what_the_manifests_run(registry, &image, &manifest, arch, machine, runner)
            .await
            .with_context(|| format!("linux/{arch}"))?;
    }
    Ok(())
}

/// The release's annotations, on the index and on each image.
fn release_annotations(annotations: &serde_json::Value) -> Result<()> {
    for (key, expected) in [
        ("org.opencontainers.image.revision", git_head()?),
        (
            "org.opencontainers.image.version",
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        ("org.opencontainers.image.licenses", "Apache-2.0".to_string()),
    ] {
        ensure!(
            annotations[key] == expected.as_str(),
            "annotation {key} is {}, expected {expected}",
            annotations[key]
        );
    }
    ensure!(
        annotations["org.opencontainers.image.source"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "no org.opencontainers.image.source annotation"
    );
    Ok(())
}

/// One platform's image: its config and files are what manifests/ run, and its binaries run.
async fn platform_is_what_the_manifests_run(
    registry: &str,
    image: &dist::Image,
    manifest: &serde_json::Value,
    arch: &str,
    machine: &str,
    runner: Option<&str>,
) -> Result<()> {
    let config_digest = manifest["config"]["digest"].as_str().context("no config")?;
    let (_, bytes) = images::fetch_raw(registry, "holdfast", "blobs", config_digest).await?;
    let config: serde_json::Value = serde_json::from_slice(&bytes)?;
    ensure!(
        config["os"] == "linux" && config["architecture"] == arch,
        "platform {} {}",
        config["os"],
        config["architecture"]
    );
    let user = config["config"]["User"].as_str().unwrap_or_default();
    let entrypoint: Vec<&str> = config["config"]["Entrypoint"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    let (files, compressed) = files(image, manifest).await?;
    let paths: Vec<&str> = files.keys().map(String::as_str).collect();
    ensure!(
        paths
            == [
                "/etc/ssl/certs/ca-certificates.crt",
                "/usr/local/bin/holdfast-controller",
                "/usr/local/bin/holdfast-webhook",
                "/usr/local/bin/kubectl-holdfast",
            ],
        "the image holds {paths:?}: a scratch image holds the three binaries and the CA bundle only"
    );
    let ca_env = format!("SSL_CERT_FILE={}", "/etc/ssl/certs/ca-certificates.crt");
    ensure!(
        config["config"]["Env"]
            .as_array()
            .is_some_and(|e| e.iter().any(|v| v == ca_env.as_str())),
        "the image does not set {ca_env}: {}",
        config["config"]["Env"]
    );
    for (path, (mode, uid, _)) in &files {
        // Nothing the user 65532 could change: root's files, not writable by others.
        ensure!(*uid == 0 && mode & 0o022 == 0, "{path}: uid {uid} mode {mode:o}");
    }

    // What the Deployments of manifests/ (the recommended overlay) run: the command is in the
    // image and executable, the pod's user is the image's, the webhook's command is the
    // entrypoint.
    let rendered = Settings::recommended().kustomize(&kubectl().context("kubectl is not on PATH")?)?;
    let deployments: Vec<&serde_json::Value> =
        rendered.iter().filter(|o| o["kind"] == "Deployment").collect();
    ensure!(
        deployments.len() == 2,
        "{} Deployments rendered",
        deployments.len()
    );
    for deployment in deployments {
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let command = container["command"][0].as_str().unwrap_or_default();
        let (mode, _, _) = files.get(command).with_context(|| {
            format!(
                "{} runs {command}, which the image lacks",
                deployment["metadata"]["name"]
            )
        })?;
        ensure!(mode & 0o111 == 0o111, "{command} is not executable: {mode:o}");
        let pod_user = format!(
            "{}:{}",
            pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
        );
        ensure!(
            pod_user == user,
            "the manifests run as {pod_user}, the image as {user:?}"
        );
        ensure!(
            container["securityContext"]["readOnlyRootFilesystem"] == true,
            "{command}: the manifests expect a read-only root"
        );
        if deployment["metadata"]["name"] == "holdfast-webhook" {
            ensure!(
                entrypoint == [command],
                "entrypoint {entrypoint:?}, the webhook runs {command}"
            );
        }
    }

    // The binaries as the image holds them: static, and they run.
    let dir = tempfile::tempdir()?;
    let mut uncompressed = 0;
    for (name, flag) in [
        ("holdfast-webhook", "--policy-file"),
        ("holdfast-controller", "--refresh-seconds"),
        ("kubectl-holdfast", "explain"),
    ] {
        let binary = extract(&files, name, dir.path())?;
        uncompressed += std::fs::metadata(&binary)?.len();
        let headers = std::process::Command::new("readelf")
            .arg("-lW")
            .arg(&binary)
            .output()?;
        let headers = String::from_utf8_lossy(&headers.stdout);
        ensure!(
            headers.contains("LOAD"),
            "readelf read no program headers of {name}"
        );
        ensure!(
            !headers.contains("INTERP"),
            "{name} needs a dynamic loader: the image has none"
        );
        let header = std::process::Command::new("readelf")
            .arg("-h")
            .arg(&binary)
            .output()?;
        let header = String::from_utf8_lossy(&header.stdout);
        ensure!(
            header
                .lines()
                .any(|l| l.trim_start().starts_with("Machine:") && l.contains(machine)),
            "{name} is not a {machine} binary:\n{header}"
        );
        let help = match runner {
            Some(runner) => std::process::Command::new(runner)
                .arg(&binary)
                .arg("--help")
                .output(),
            None => std::process::Command::new(&binary).arg("--help").output(),
        }
        .with_context(|| format!("running {name} --help ({})", runner.unwrap_or("natively")))?;
        let text = String::from_utf8_lossy(&help.stdout);
        ensure!(
            help.status.success() && text.contains(flag),
            "{name} --help: {}\n{text}",
            help.status
        );
    }
    eprintln!(
        "image {} linux/{arch}: {:.1} MiB compressed, binaries {:.1} MiB",
        image.reference(),
        compressed as f64 / (1 << 20) as f64,
        uncompressed as f64 / (1 << 20) as f64
    );
    Ok(())
}

/// `sh -c` script: remounts every mount read-only, fails unless writing `$1` fails, then runs
/// the rest of its arguments.
const READ_ONLY: &str = "set -e; probe=$1; shift; \
    for m in $(awk '{print $2}' /proc/self/mounts | sort -u); do mount -o remount,bind,ro \"$m\" 2>/dev/null || true; done; \
    if touch \"$probe\" 2>/dev/null; then echo \"$probe is still writable\" >&2; exit 97; fi; \
    exec \"$@\"";

/// The webhook binary from the image, as a process on a read-only file system against the local
/// control plane with the shipped webhook configurations (called by URL, scoped to this test's namespace): it issues
/// its certificate, injects the caBundle, and the API server's review of an App with a tag comes
/// back pinned.
async fn the_webhook_binary_from_the_image_pins_an_app(env: Arc<Env>) -> Result<()> {
    webhook_from_the_image_pins_an_app(env, "amd64", None).await
}

/// The same with the linux/arm64 image's webhook, run by Debian's qemu-user: one admission
/// review through the API server, answered by the arm64 binary.
async fn the_arm64_webhook_binary_pins_an_app_under_qemu(env: Arc<Env>) -> Result<()> {
    webhook_from_the_image_pins_an_app(env, "arm64", Some("qemu-aarch64-static")).await
}

async fn webhook_from_the_image_pins_an_app(env: Arc<Env>, arch: &str, runner: Option<&str>) -> Result<()> {
    let image = dist::build_and_push_image(&env)?;
    let manifest = platform_manifest(env.registry(), &image, arch).await?;
    let (files, _) = files(&image, &manifest).await?;
    let dir = tempfile::tempdir()?;
    let binary = extract(&files, "holdfast-webhook", dir.path())?;

    let config = images::Image::with_files(&[(
        "config.yml",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-image}\n",
    )])?;
    let digest = images::push(env.registry(), "image-test/config", "1.0.0", &config).await?;
    let client = env.client().await?;
    let system = env.namespace("image-system").await?;
    let name = holdfast_e2e::control_plane::unique_name(&format!("holdfast-image-{arch}"));
    let (port, admin) = (free_port()?, free_port()?);
    let scope = LabelSelectorRequirement {
        key: SCOPE_LABEL.into(),
        operator: "In".into(),
        values: Some(vec![name.clone()]),
    };
    let (mutating, validating) =
        shipped_configurations(&name, &format!("https://127.0.0.1:{port}"), Some(scope))?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await?;
    // Run as readOnlyRootFilesystem runs it: in a mount namespace of its own where every file
    // system is remounted read-only (checked: writing beside the binary fails), so a webhook
    // that needed to write a file would not get ready.
    let mut args: Vec<String> = [
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        READ_ONLY,
        "sh",
    ]
    .map(String::from)
    .into();
    args.push(dir.path().join("probe").display().to_string());
    args.extend(runner.map(String::from));
    args.push(binary.display().to_string());
    args.extend([
        format!("--addr=127.0.0.1:{port}"),
        format!("--admin-addr=127.0.0.1:{admin}"),
        format!("--namespace={system}"),
        "--tls-ip=127.0.0.1".into(),
        format!("--mutating-webhook-configurations={name}"),
        format!("--validating-webhook-configurations={name}"),
        format!("--insecure-registry={}", env.registry()),
    ]);
    let label = match arch {
        "amd64" => "holdfast-webhook-from-image-amd64",
        _ => "holdfast-webhook-from-image-arm64",
    };
    let mut webhook = ServerProcess::spawn(
        label,
        Path::new("unshare"),
        &args,
        &[("KUBECONFIG", env.kubeconfig())],
        dir.path().join("webhook.log"),
    )?;
    until_http_ok(
        &format!("http://127.0.0.1:{admin}/readyz"),
        wait::DEFAULT_TIMEOUT,
        || webhook.check_running(),
    )
    .await?;
    // The API server calls it once the caBundle it published is in the configuration.
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    wait::until(&configurations, &name, ca_bundle_injected).await?;

    let ns = env
        .namespace_with_labels("image-pinned", &[(SCOPE_LABEL, &name)])
        .await?;
    let app = format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: pinned}}\nspec:\n  serviceAccountName: deployer\n  fetch: [{{image: {{url: {}/image-test/config:1.0.0}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n",
        env.registry()
    );
    let created = create_all(&client, &ns, &app).await?;
    let stored = api_for(&client, &created[0], Some(&ns))
        .await?
        .get("pinned")
        .await?;
    let url = stored.data["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .unwrap_or_default();
    let expected = format!("{}/image-test/config@{digest}", env.registry());
    ensure!(
        url == expected,
        "the App was stored with {url}, not pinned to {expected}; webhook log:\n{}",
        webhook.log_tail(20)
    );
    webhook.stop(std::time::Duration::from_secs(5));
    configurations.delete(&name, &Default::default()).await?;
    Api::<ValidatingWebhookConfiguration>::all(client)
        .delete(&name, &Default::default())
        .await?;
    Ok(())
}

/// `cosign generate-key-pair` in `dir` with `password`; returns (private, public) key paths.
fn key_pair(dir: &Path, password: &str) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let cosign = holdfast_e2e::tools::peer_bin("cosign", "cosign")?;
    let out = std::process::Command::new(cosign)
        .current_dir(dir)
        .env("COSIGN_PASSWORD", password)
        .arg("generate-key-pair")
        .output()?;
    ensure!(
        out.status.success(),
        "cosign generate-key-pair: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((dir.join("cosign.key"), dir.join("cosign.pub")))
}

/// The versions Cargo.lock pins, by crate name.
fn locked_versions() -> Result<BTreeMap<String, std::collections::BTreeSet<String>>> {
    let lock = std::fs::read_to_string(dist::repo().join("Cargo.lock"))?;
    let mut versions: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_string());
        } else if let (Some(v), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            versions
                .entry(n)
                .or_default()
                .insert(v.trim_matches('"').to_string());
        }
    }
    Ok(versions)
}

async fn the_image_is_signed_and_carries_an_sbom_of_each_binary(env: Arc<Env>) -> Result<()> {
    let image = dist::build_and_push_image(&env)?;
    let keys = tempfile::tempdir()?;
    let (other_keys, ours) = (keys.path().join("other"), keys.path().join("ours"));
    std::fs::create_dir_all(&other_keys)?;
    std::fs::create_dir_all(&ours)?;
    let (key, public) = key_pair(&ours, "release-password")?;
    let (_, other) = key_pair(&other_keys, "another")?;
    let sboms = dist::script("sign.sh", &["sbom"])?;
    let signed = std::process::Command::new(dist::repo().join("scripts/sign.sh"))
        .env("COSIGN_PASSWORD", "release-password")
        .arg("sign")
        .arg(image.reference())
        .arg(&key)
        .output()?;
    ensure!(
        signed.status.success(),
        "scripts/sign.sh sign: {}",
        String::from_utf8_lossy(&signed.stderr)
    );

    let reference = image.reference();
    let verified = dist::script("sign.sh", &["verify", &reference, &public.display().to_string()])?;
    let refused = dist::script("sign.sh", &["verify", &reference, &other.display().to_string()]);
    ensure!(
        refused.is_err(),
        "the image verified against a key that never signed it"
    );

    // Each attestation is a DSSE envelope of an in-toto statement about this digest whose
    // predicate is one binary's SBOM, the same file as shipped beside the image.
    let locked = locked_versions()?;
    let mut attested = Vec::new();
    for line in verified.lines().filter(|l| !l.trim().is_empty()) {
        use base64::Engine as _;
        let envelope: serde_json::Value = serde_json::from_str(line)?;
        let payload = base64::engine::general_purpose::STANDARD.decode(
            envelope["payload"]
                .as_str()
                .context("attestation without payload")?,
        )?;
        let statement: serde_json::Value = serde_json::from_slice(&payload)?;
        ensure!(
            statement["predicateType"] == "https://cyclonedx.org/bom",
            "predicate {}",
            statement["predicateType"]
        );
        ensure!(
            statement["subject"][0]["digest"]["sha256"] == image.digest.trim_start_matches("sha256:"),
            "the attestation is about {}, not {}",
            statement["subject"][0],
            image.digest
        );
        let bom = &statement["predicate"];
        let binary = bom["metadata"]["component"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let shipped: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
            sboms
                .lines()
                .find(|p| p.ends_with(&format!("/{binary}.cdx.json")))
                .context("no shipped SBOM")?,
        )?)?;
        ensure!(
            *bom == shipped,
            "the attested SBOM of {binary} is not the one shipped beside the image"
        );
        // Built for the image's target, listing what Cargo.lock pins.
        ensure!(
            bom["metadata"]["properties"]
                .to_string()
                .contains("x86_64-unknown-linux-musl"),
            "{binary}'s SBOM is not of the musl build"
        );
        let components = bom["components"].as_array().context("SBOM without components")?;
        for krate in ["kube", "rustls", "ring", "tokio"] {
            let listed = components.iter().find(|c| c["name"] == krate);
            ensure!(
                listed.is_some_and(|c| locked
                    .get(krate)
                    .is_some_and(|v| v.contains(c["version"].as_str().unwrap_or_default()))),
                "{binary}'s SBOM lists {krate} as {:?}, Cargo.lock pins {:?}",
                listed.map(|c| &c["version"]),
                locked.get(krate)
            );
        }
        attested.push(binary);
    }
    attested.sort();
    ensure!(
        attested == ["holdfast-controller", "holdfast-webhook", "kubectl-holdfast"],
        "attested SBOMs: {attested:?}"
    );
    Ok(())
}

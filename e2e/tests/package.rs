//! The Carvel package with the real kapp-controller: the release `make package` pushed, copied
//! with `imgpkg copy` to another repository (a private registry); a PackageRepository naming the
//! copy's repository bundle (by tag, as users write it) is stored pinned by a running holdfast and
//! reconciles; its Package fetches the copied package bundle by digest; a PackageInstall
//! of holdfast with a user's values reconciles and creates exactly the objects `kubectl
//! kustomize` renders of manifests/ for the same settings — differing only by what
//! `chart::PACKAGE_ADDS` lists (kapp's and kbld's labels and annotations) — with the webhook
//! configurations calling the installed Service and the Deployments running the copied image;
//! upgrading to the next release (a second Package version from the repository's next bundle,
//! its CRD with a new field) keeps every digest cache entry and upgrades the CRD;
//! deleting the PackageInstall deletes the webhook configurations before anything an admission
//! goes through, and keeps the digest cache's CRD.
//! (holdfast's pods run on kwok's nodes, without
//! containers: the objects are what is checked.)

use std::{collections::BTreeSet, sync::Arc};

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, dist, e2e_main,
    objects::{api_for, create_all},
    peers::kapp_controller,
    tools::peer_bin,
    upgrade::{self, CRD, KeptEntry},
    webhook::{LocalWebhook, Registration},
};
use holdfast_manifest_checks::{
    chart::{PACKAGE_ADDS, Settings, object_id},
    load::kubectl,
};
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;

e2e_main!(a_package_install_of_holdfast_is_the_kustomize_rendering);

/// Where the package installs holdfast (it creates the namespace).
const INSTALLED_NAMESPACE: &str = "holdfast-system";

async fn a_package_install_of_holdfast_is_the_kustomize_rendering(env: Arc<Env>) -> Result<()> {
    env.kapp_controller().await?;
    let packaged = dist::package(&env)?;
    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let ns = webhook.namespace("packages").await?;
    let client = env.client().await?;

    // The release copied into a "private registry" (another repository) the way README says:
    // imgpkg copies the repository bundle, the package bundle and the image together, and what
    // gets installed must name the copies only.
    let private = format!("{}/private/holdfast", env.registry());
    imgpkg(&["copy", "-b", &packaged.repository_tag, "--to-repo", &private])?;
    let repository_tag = format!("{private}:{}", env!("CARGO_PKG_VERSION"));

    let created = create_all(&client, &ns, &dist::package_repository(&repository_tag)).await?;
    let stored = &created[0];
    ensure!(
        stored.data["spec"]["fetch"]["imgpkgBundle"]["image"]
            == relocated(&private, &packaged.repository)?.as_str(),
        "the PackageRepository was stored as {}, not pinned to the copy of {}",
        stored.data["spec"]["fetch"]["imgpkgBundle"]["image"],
        packaged.repository
    );
    ensure!(
        stored
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("holdfast.dev/original-refs")),
        "the PackageRepository was not pinned by holdfast"
    );
    let repositories = api_for(&client, stored, Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &repositories, dist::PACKAGE_INSTALL).await?;
    let version = env!("CARGO_PKG_VERSION");
    let package = env.kubectl_get(
        "packages.data.packaging.carvel.dev",
        &format!("{}.{version}", dist::PACKAGE_NAME),
        &ns,
    )?;
    ensure!(
        package["spec"]["template"]["spec"]["fetch"][0]["imgpkgBundle"]["image"]
            == relocated(&private, &packaged.bundle)?.as_str(),
        "the Package fetches {}, not the copy of the bundle by digest {}",
        package["spec"]["template"]["spec"]["fetch"][0],
        packaged.bundle
    );
    for key in [
        "global",
        "carvel",
        "korifi",
        "secrets",
        "networkPolicy",
        "insecureRegistries",
        "webhook",
        "policy",
        "mirror",
        "certMode",
        "namespaceSelector",
    ] {
        ensure!(
            package["spec"]["valuesSchema"]["openAPIv3"]["properties"][key].is_object(),
            "the Package's valuesSchema does not describe {key}"
        );
    }
    env.kubectl_get(
        "packagemetadatas.data.packaging.carvel.dev",
        dist::PACKAGE_NAME,
        &ns,
    )?;

    // What a user sets: their registry over plain HTTP, one webhook replica, a stricter policy.
    let settings = Settings {
        // The package installs into holdfast-system and creates it.
        create_namespace: true,
        // The copy of the image, by the digest the release's ImagesLock names.
        image: Some((private.clone(), packaged.image.digest.clone())),
        insecure_registries: vec![env.registry().to_string()],
        webhook_replicas: Some(1),
        policy: Some(holdfast_manifest_checks::chart::Policy {
            allowed_registries: vec![env.registry().to_string()],
            require_digests_label: "holdfast.dev/require-digests".into(),
            mode: "enforce".into(),
        }),
        ..Settings::recommended()
    };
    let mut values = settings.values();
    // The image comes from the package (its ImagesLock), not from the user.
    values.as_object_mut().context("values")?.remove("image");
    let created = create_all(&client, &ns, &dist::package_install(&ns, version, &values)?).await?;
    let install = created.last().context("no PackageInstall created")?;
    let installs = api_for(&client, install, Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &installs, dist::PACKAGE_INSTALL).await?;

    let expected = settings.kustomize(&kubectl().context("kubectl is not on PATH")?)?;
    let drift = dist::installed_differences(&env, &expected, PACKAGE_ADDS)?;
    ensure!(
        drift.is_empty(),
        "installed objects differ from the rendering:\n{}",
        drift.join("\n")
    );
    let installed = dist::installed(&env, &expected)?;
    let webhooks = dist::webhooks_call_the_service(&installed)?;
    ensure!(webhooks == 5, "{webhooks} webhooks checked, the chart has 5");

    // Exactly those objects: what kapp deployed for the PackageInstall's App (the objects
    // carrying the app label kapp-controller reports).
    let app = env.kubectl_get("apps.kappctrl.k14s.io", dist::PACKAGE_INSTALL, &ns)?;
    let label = app["status"]["deploy"]["kapp"]["associatedResources"]["label"]
        .as_str()
        .context("the App reports no kapp app label")?;
    let kapp = peer_bin("kapp", "kapp")?;
    let out = std::process::Command::new(kapp)
        .env("KUBECONFIG", env.kubeconfig())
        .args([
            "inspect",
            "-a",
            &format!("label:{label}"),
            "--json",
            "--tty=false",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "kapp inspect: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let deployed: BTreeSet<String> = inspected["Tables"][0]["Rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| row["owner"] == "kapp")
        .map(|row| {
            let ns = row["namespace"]
                .as_str()
                .filter(|n| !n.is_empty() && *n != "(cluster)");
            let (kind, name) = (
                row["kind"].as_str().unwrap_or_default(),
                row["name"].as_str().unwrap_or_default(),
            );
            match ns {
                Some(ns) => format!("{kind} {ns}/{name}"),
                None => format!("{kind} {name}"),
            }
        })
        .collect();
    let rendered: BTreeSet<String> = expected.iter().map(object_id).collect();
    ensure!(
        deployed == rendered,
        "kapp deployed other objects than rendered:\nonly deployed: {:?}\nonly rendered: {:?}",
        deployed.difference(&rendered).collect::<Vec<_>>(),
        rendered.difference(&deployed).collect::<Vec<_>>()
    );

    // An upgrade to the next release, as users of the repository get one: the repository's next
    // bundle adds the next Package version, whose chart's CRD has a field this one's has not; the
    // PackageRepository moves to its tag (pinned again), the PackageInstall to that version, and
    // kapp upgrades the CRD and keeps every digest cache entry with its spec and status.
    let kept = KeptEntry::write(&env, INSTALLED_NAMESPACE)?;
    let next = NextRelease::push(&private, &packaged, version)?;
    let merge = kube::api::PatchParams::default();
    repositories
        .patch(
            dist::PACKAGE_INSTALL,
            &merge,
            &kube::api::Patch::Merge(
                serde_json::json!({"spec": {"fetch": {"imgpkgBundle": {"image": next.repository_tag}}}}),
            ),
        )
        .await?;
    let moved = kapp_controller::until_reconciled(&env, &repositories, dist::PACKAGE_INSTALL).await?;
    ensure!(
        moved.data["spec"]["fetch"]["imgpkgBundle"]["image"] == next.repository.as_str(),
        "the PackageRepository moved to {} was stored as {}, not pinned to {}",
        next.repository_tag,
        moved.data["spec"]["fetch"]["imgpkgBundle"]["image"],
        next.repository
    );
    env.kubectl_get(
        "packages.data.packaging.carvel.dev",
        &format!("{}.{}", dist::PACKAGE_NAME, next.version),
        &ns,
    )
    .context("the repository's next bundle did not bring the next Package version")?;
    installs
        .patch(
            dist::PACKAGE_INSTALL,
            &merge,
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"packageRef": {"versionSelection": {"constraints": next.version}}}})),
        )
        .await?;
    let upgraded = kapp_controller::until_reconciled(&env, &installs, dist::PACKAGE_INSTALL).await?;
    ensure!(
        upgraded.data["status"]["version"] == next.version.as_str(),
        "the PackageInstall reconciled at version {}, not {}",
        upgraded.data["status"]["version"],
        next.version
    );
    // The PackageInstall reports the version once it has updated its App; kapp deploys the next
    // release when that App has reconciled its new spec.
    let app: DynamicObject =
        serde_json::from_value(env.kubectl_get("apps.kappctrl.k14s.io", dist::PACKAGE_INSTALL, &ns)?)?;
    let apps = api_for(&client, &app, Some(&ns)).await?;
    kapp_controller::until_reconciled(&env, &apps, dist::PACKAGE_INSTALL).await?;
    kept.check(&env, "the package upgrade")?;
    upgrade::new_field_is_stored(&env, INSTALLED_NAMESPACE)?;

    // Removal: the PackageInstall deleted, kapp deletes both webhook configurations before
    // anything an admission goes through (their change group and rules; the audit log's
    // deletes), and keeps the CRD (its delete strategy orphan).
    let removed_at = Timestamp::now();
    holdfast_e2e::accounts::kubectl_ok(
        &env,
        &[
            "delete",
            "packageinstall",
            dist::PACKAGE_INSTALL,
            "-n",
            &ns,
            "--wait",
            "--timeout=180s",
        ],
    )?;
    let deletes: Vec<_> = env
        .audit_log()?
        .into_iter()
        .filter(|e| e.verb == "delete" && e.succeeded() && e.request_received_timestamp > removed_at)
        .collect();
    let configurations: Vec<_> = deletes
        .iter()
        .filter(|e| {
            e.object_ref.api_group == "admissionregistration.k8s.io" && e.object_ref.name == "holdfast"
        })
        .collect();
    ensure!(
        configurations.len() == 2,
        "deletes of the webhook configurations: {:?}",
        configurations.iter().map(|e| e.describe()).collect::<Vec<_>>()
    );
    let configurations_gone = configurations
        .iter()
        .map(|e| e.stage_timestamp)
        .max()
        .context("no configuration delete")?;
    for (resource, namespace, name) in [
        ("deployments", "holdfast-system", "holdfast-webhook"),
        ("services", "holdfast-system", "holdfast-webhook"),
        ("networkpolicies", "holdfast-system", "holdfast-webhook"),
        ("namespaces", "", "holdfast-system"),
    ] {
        let delete = deletes
            .iter()
            .find(|e| {
                // A namespace's own requests name it as their namespace too.
                e.object_ref.resource == resource
                    && e.object_ref.name == name
                    && (e.object_ref.namespace == namespace || resource == "namespaces")
            })
            .with_context(|| format!("kapp did not delete {resource} {namespace}/{name}"))?;
        ensure!(
            delete.request_received_timestamp >= configurations_gone,
            "kapp deleted {resource} {namespace}/{name} before the webhook configurations were gone: {} vs {:?}",
            delete.describe(),
            configurations.iter().map(|e| e.describe()).collect::<Vec<_>>()
        );
    }
    env.kubectl_get("crd", CRD, "default")
        .context("kapp deleted the CRD (the digest cache) with the package")?;
    webhook.stop().await
}

/// The next release, made from this one as the private registry holds it and pushed there: the
/// package bundle pulled and its chart made the next release's ([`upgrade::make_next_chart`]);
/// the repository bundle pulled, the next Package version (this one's, naming the next bundle)
/// added beside this one, its ImagesLock written again by kbld, as `make package` writes it.
struct NextRelease {
    version: String,
    /// `<private>:<version>`, as imgpkg copy tags the repository bundle: what users name.
    repository_tag: String,
    /// The repository bundle, by digest.
    repository: String,
}

impl NextRelease {
    fn push(private: &str, packaged: &dist::Packaged, version: &str) -> Result<Self> {
        let (major_minor, patch) = version.rsplit_once('.').context("a version without patch")?;
        let next = format!("{major_minor}.{}", patch.parse::<u32>()? + 1);
        let scratch = tempfile::tempdir()?;

        let bundle_dir = scratch.path().join("package");
        imgpkg(&[
            "pull",
            "-b",
            &relocated(private, &packaged.bundle)?,
            "-o",
            &path(&bundle_dir),
        ])?;
        upgrade::make_next_chart(&bundle_dir.join("config/chart"), version, &next)?;
        let bundle = pushed(&format!("{private}:package-{next}"), &bundle_dir, scratch.path())?;

        let repository_dir = scratch.path().join("repository");
        imgpkg(&[
            "pull",
            "-b",
            &relocated(private, &packaged.repository)?,
            "-o",
            &path(&repository_dir),
        ])?;
        let packages = repository_dir.join("packages").join(dist::PACKAGE_NAME);
        let text = std::fs::read_to_string(packages.join(format!("{version}.yml")))?;
        let renamed = [
            (
                format!("name: {}.{version}\n", dist::PACKAGE_NAME),
                format!("name: {}.{next}\n", dist::PACKAGE_NAME),
            ),
            (format!("version: {version}\n"), format!("version: {next}\n")),
            (
                format!("image: {}\n", packaged.bundle),
                format!("image: {bundle}\n"),
            ),
        ];
        let mut next_package = text.clone();
        for (from, to) in &renamed {
            ensure!(
                next_package.contains(from.as_str()),
                "the Package has no {from:?}"
            );
            next_package = next_package.replace(from.as_str(), to);
        }
        std::fs::write(packages.join(format!("{next}.yml")), next_package)?;
        let lock = std::process::Command::new(peer_bin("kbld", "kbld")?)
            .arg("-f")
            .arg(repository_dir.join("packages"))
            .args(["--registry-insecure", "--imgpkg-lock-output"])
            .arg(repository_dir.join(".imgpkg/images.yml"))
            .output()?;
        ensure!(
            lock.status.success(),
            "kbld: {}",
            String::from_utf8_lossy(&lock.stderr)
        );
        let repository_tag = format!("{private}:{next}");
        let repository = pushed(&repository_tag, &repository_dir, scratch.path())?;
        Ok(Self {
            version: next,
            repository_tag,
            repository,
        })
    }
}

/// `reference` as `imgpkg copy` relocated it into the repository `private`: its digest there.
fn relocated(private: &str, reference: &str) -> Result<String> {
    let (_, digest) = reference
        .split_once('@')
        .context("a release reference without digest")?;
    Ok(format!("{private}@{digest}"))
}

fn path(path: &std::path::Path) -> String {
    path.to_string_lossy().into_owned()
}

fn imgpkg(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(peer_bin("imgpkg", "imgpkg")?)
        .args(args)
        .arg("--registry-insecure")
        .output()?;
    ensure!(
        out.status.success(),
        "imgpkg {args:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `imgpkg push` of the bundle in `dir` to `tag`; returns the bundle by digest.
fn pushed(tag: &str, dir: &std::path::Path, scratch: &std::path::Path) -> Result<String> {
    let lock = scratch.join("pushed.lock.yml");
    imgpkg(&["push", "-b", tag, "-f", &path(dir), "--lock-output", &path(&lock)])?;
    let text = std::fs::read_to_string(&lock)?;
    text.lines()
        .find_map(|line| line.trim().strip_prefix("image: "))
        .map(str::to_owned)
        .with_context(|| format!("imgpkg's lock names no image: {text}"))
}

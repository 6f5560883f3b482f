//! The admission server against the real kube-apiserver: called over TLS with the caBundle the
//! certificate store injected, patching objects applied with kubectl, and surviving certificate
//! and CA rotation under load without a failed admission.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, e2e_main, images,
    objects::{api_for, parse_documents},
    webhook::{LocalWebhook, Registration, rule},
};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::{ResourceExt, api::PostParams};

e2e_main!(
    kubectl_apply_comes_back_patched_over_tls,
    rotation_under_load_fails_no_admission,
    the_shipped_configurations_decide_what_reaches_holdfast,
    the_shipped_match_conditions_send_only_what_the_pin_rule_could_change,
);

/// Reviews of `rule` holdfast has answered so far (every operation).
fn rule_calls(webhook: &LocalWebhook, rule: &str) -> Result<u64> {
    let metrics = webhook
        .running
        .as_ref()
        .context("webhook stopped")?
        .metrics
        .encode()?;
    let rule = format!("rule=\"{rule}\"");
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("holdfast_webhook_admission_duration_seconds_count{") && l.contains(&rule))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

/// Pod CREATEs holdfast has answered so far: the terminating guard is the only rule for pods, and
/// these tests create no kpack Builds and no Images, so its count is the pods' count.
fn guard_creates(webhook: &LocalWebhook) -> Result<u64> {
    rule_calls(webhook, "terminating-guard")
}

fn app_yaml(name: &str, source: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: default\n  fetch: [{{{source}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

/// An App of one image source holding `url`, annotated `holdfast.dev/original-refs: refs`, with
/// `extra` appended to its spec.
fn annotated_app_yaml(name: &str, url: &str, refs: &str, extra: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata:\n  name: {name}\n  annotations:\n    holdfast.dev/original-refs: '{refs}'\nspec:\n  serviceAccountName: default\n  fetch: [{{image: {{url: {url}}}}}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]{extra}\n"
    )
}

/// With the shipped configurations (`components/match-conditions`' `something-to-pin`), the API
/// server calls the pinning rule only where it could change something: a tag, a tagSelection, a
/// changed spec or `holdfast.dev/original-refs` annotation, unless every entry of that
/// annotation is in place (what the pinning policy writes) — and not for a metadata-only update
/// of a pinned App, nor for an object that names digests only. Each expectation is a count of
/// the rule's reviews, so a condition that skipped too much (a tag left unpinned) or too little
/// fails here; every branch of the expression (App, PackageRepository; CREATE, UPDATE) is taken.
async fn the_shipped_match_conditions_send_only_what_the_pin_rule_could_change(env: Arc<Env>) -> Result<()> {
    let image = images::Image::with_files(&[("config.yml", b"conditions: true\n")])?;
    let digest = images::push(env.registry(), "conditions/config", "1.0.0", &image).await?;
    let tag = format!("{}/conditions/config:1.0.0", env.registry());
    let pinned = format!("{}/conditions/config@{digest}", env.registry());
    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let ns = webhook.namespace("conditions").await?;
    let calls = || rule_calls(&webhook, "pin-fetch-refs");
    let url = |kind: &str, name: &str| -> Result<String> {
        let object = env.kubectl_get(kind, name, &ns)?;
        let spec = &object["spec"]["fetch"];
        Ok(spec[0]["image"]["url"]
            .as_str()
            .or(spec["imgpkgBundle"]["image"].as_str())
            .unwrap_or_default()
            .to_owned())
    };
    // Each step: what is written (a manifest applied, or a label set with `kubectl label`, a
    // metadata-only write such as kapp-controller's), and how often holdfast must be called.
    // (`kubectl apply` of a CRD sends back every field that differs from the live object, so a
    // re-apply of a tag is a spec change, and is sent.)
    let apply = |yaml: String| {
        vec![
            "apply".to_string(),
            "-n".into(),
            ns.clone(),
            "-f".into(),
            "-".into(),
            yaml,
        ]
    };
    let label = |resource: &str| {
        vec![
            "label".to_string(),
            "-n".into(),
            ns.clone(),
            resource.into(),
            "team=a".into(),
            "--overwrite".into(),
        ]
    };
    // holdfast.dev/original-refs as the webhook and the pinning policy write it, in place; and one
    // whose digest is not the field's.
    let entry = |digest: &str| {
        serde_json::json!({"/spec/fetch/0/image/url": {"digest": digest, "ref": tag}}).to_string()
    };
    let in_place = entry(&digest);
    let not_in_place = entry(&format!("sha256:{}", "b".repeat(64)));
    let repository = format!(
        "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageRepository\nmetadata: {{name: repo}}\nspec:\n  fetch: {{imgpkgBundle: {{image: {tag}}}}}\n"
    );
    let steps: Vec<(&str, Vec<String>, u64)> = vec![
        (
            "a tag is pinned",
            apply(app_yaml("tagged", &format!("image: {{url: {tag}}}"))),
            1,
        ),
        (
            "a metadata-only update of a pinned App is not sent",
            label("apps.kappctrl.k14s.io/tagged"),
            0,
        ),
        (
            "a re-apply of the tag is sent and pins the same digest",
            apply(app_yaml("tagged", &format!("image: {{url: {tag}}}"))),
            1,
        ),
        (
            "a digest-only App is not sent",
            apply(app_yaml("digest", &format!("image: {{url: {pinned}}}"))),
            0,
        ),
        (
            "a spec change to a tag is sent",
            apply(app_yaml("digest", &format!("image: {{url: {tag}}}"))),
            1,
        ),
        (
            "a digest beside a tagSelection is sent (the rule warns)",
            apply(app_yaml(
                "selection",
                &format!("image: {{url: {pinned}, tagSelection: {{semver: {{constraints: '>=1.0.0'}}}}}}"),
            )),
            1,
        ),
        (
            "a CREATE carrying its pins in place (as the pinning policy writes them) is not sent",
            apply(annotated_app_yaml("in-place", &pinned, &in_place, "")),
            0,
        ),
        (
            "a spec change that keeps the pins in place is not sent",
            apply(annotated_app_yaml(
                "in-place",
                &pinned,
                &in_place,
                "\n  syncPeriod: 5m",
            )),
            0,
        ),
        (
            "a CREATE carrying an entry not in place is sent (the rule drops it)",
            apply(annotated_app_yaml("not-in-place", &pinned, &not_in_place, "")),
            1,
        ),
        ("a PackageRepository's tag is pinned", apply(repository), 1),
        (
            "a metadata-only update of a pinned PackageRepository is not sent",
            label("packagerepositories.packaging.carvel.dev/repo"),
            0,
        ),
    ];
    for (step, mut args, sent) in steps {
        let before = calls()?;
        let input = if args[0] == "apply" { args.pop() } else { None };
        let mut kubectl = env.kubectl();
        kubectl
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = kubectl.spawn()?;
        if let Some(input) = input {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .context("kubectl stdin")?
                .write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "{step}: kubectl {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let after = calls()?;
        ensure!(
            after - before == sent,
            "{step}: holdfast was called {} time(s), expected {sent}",
            after - before
        );
    }
    ensure!(
        url("apps.kappctrl.k14s.io", "tagged")? == pinned,
        "the tagged App is not pinned"
    );
    ensure!(
        url("apps.kappctrl.k14s.io", "digest")? == pinned,
        "the re-tagged App is not pinned"
    );
    ensure!(
        url("packagerepositories.packaging.carvel.dev", "repo")? == pinned,
        "the PackageRepository is not pinned"
    );
    webhook.stop().await
}

fn pod_yaml(name: &str, labels: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec:\n  containers: [{{name: main, image: example.invalid/app:1}}]\n"
    )
}

/// With the configurations `manifests/overlays/recommended` ships (only clientConfig pointed at
/// the local URL), an unlabelled pod never reaches holdfast and a build pod does; with the pods
/// webhook's objectSelector removed, the unlabelled pod reaches it: the selector is what the
/// API server obeys.
async fn the_shipped_configurations_decide_what_reaches_holdfast(env: Arc<Env>) -> Result<()> {
    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let ns = webhook.namespace("shipped").await?;
    let before = guard_creates(&webhook)?;
    env.kubectl_apply(&ns, &pod_yaml("plain", ""))?;
    ensure!(
        guard_creates(&webhook)? == before,
        "an unlabelled pod reached holdfast despite the shipped objectSelector"
    );
    env.kubectl_apply(&ns, &pod_yaml("build-pod", "kpack.io/build: some-build"))?;
    ensure!(
        guard_creates(&webhook)? == before + 1,
        "a build pod did not reach holdfast"
    );

    // The same configuration without the pods webhook's objectSelector.
    let client = env.client().await?;
    let configurations: kube::Api<ValidatingWebhookConfiguration> = kube::Api::all(client);
    let mut config = configurations.get(&webhook.configuration).await?;
    let pods_webhook = config
        .webhooks
        .iter_mut()
        .flatten()
        .find(|w| w.name == "terminating-guard-pods.holdfast.dev")
        .context("no pods webhook shipped")?;
    ensure!(
        pods_webhook.object_selector.is_some(),
        "the shipped pods webhook has no objectSelector"
    );
    pods_webhook.object_selector = None;
    configurations
        .replace(&webhook.configuration, &PostParams::default(), &config)
        .await?;
    // The API server applies a configuration change from its own informer, which nothing outside
    // can watch: create unlabelled pods until one reaches holdfast, for at most 10 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut n = 0;
    loop {
        let seen = guard_creates(&webhook)?;
        env.kubectl_apply(&ns, &pod_yaml(&format!("plain-{n}"), ""))?;
        if guard_creates(&webhook)? > seen {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "without its objectSelector the pods webhook still got no unlabelled pod"
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    webhook.stop().await
}

/// A CFApp and the BuildWorkload Korifi's build reconciler makes for it (labelled with the app's
/// GUID): what stamp-owners follows from an Image to its app.
fn cfapp_and_workload(name: &str) -> String {
    format!(
        "apiVersion: korifi.cloudfoundry.org/v1alpha1\nkind: CFApp\nmetadata: {{name: {name}}}\nspec:\n  displayName: {name}\n  desiredState: STOPPED\n  lifecycle: {{type: buildpack, data: {{buildpacks: [], stack: cflinuxfs3}}}}\n---\napiVersion: korifi.cloudfoundry.org/v1alpha1\nkind: BuildWorkload\nmetadata: {{name: {name}-build, labels: {{korifi.cloudfoundry.org/app-guid: {name}}}}}\nspec: {{buildRef: {{name: {name}-build}}, builderName: kpack-image-builder, source: {{registry: {{image: registry.example/{name}-source}}}}}}\n"
    )
}

/// The app's kpack Image as Korifi's kpack-image-builder creates it: named after the app,
/// owned by the BuildWorkload (of uid `workload_uid`).
fn image_of(name: &str, workload_uid: &str) -> String {
    format!(
        "apiVersion: kpack.io/v1alpha2\nkind: Image\nmetadata:\n  name: {name}\n  ownerReferences: [{{apiVersion: korifi.cloudfoundry.org/v1alpha1, kind: BuildWorkload, name: {name}-build, uid: {workload_uid}}}]\nspec: {{tag: registry.example/{name}-droplets}}\n"
    )
}

fn images_registration(ca_overlap: Duration) -> Registration {
    Registration {
        ca_overlap,
        ..Registration::rules(vec![rule(
            "kpack.io",
            "v1alpha2",
            &["images"],
            &["CREATE", "UPDATE"],
        )])
    }
}

async fn kubectl_apply_comes_back_patched_over_tls(env: Arc<Env>) -> Result<()> {
    let webhook = LocalWebhook::start(env.clone(), images_registration(Duration::from_secs(1))).await?;
    let ns = webhook.namespace("tls").await?;
    env.kubectl_apply(&ns, &cfapp_and_workload("app-1"))?;
    let workload = env.kubectl_get("buildworkloads.korifi.cloudfoundry.org", "app-1-build", &ns)?;
    let workload_uid = workload["metadata"]["uid"].as_str().context("no uid")?.to_owned();
    env.kubectl_apply(&ns, &image_of("app-1", &workload_uid))?;
    let image = env.kubectl_get("images.kpack.io", "app-1", &ns)?;
    let owners = &image["metadata"]["ownerReferences"];
    ensure!(
        owners[1]["kind"] == "CFApp" && owners[1]["name"] == "app-1",
        "not stamped: {owners}"
    );

    // Applying the same manifest again changes nothing: same patch, generation unchanged.
    env.kubectl_apply(&ns, &image_of("app-1", &workload_uid))?;
    let again = env.kubectl_get("images.kpack.io", "app-1", &ns)?;
    ensure!(
        again["metadata"]["generation"] == image["metadata"]["generation"],
        "re-apply changed the Image"
    );
    ensure!(
        again["metadata"]["ownerReferences"].as_array().map(Vec::len) == Some(2),
        "owner stamped twice"
    );
    webhook.stop().await
}

/// The fingerprint of the certificate the webhook serves right now, seen by a TLS client that
/// trusts only the published caBundle.
async fn served_fingerprint(webhook: &LocalWebhook) -> Result<String> {
    let bundle = webhook.store.ca_bundle().await?;
    holdfast_e2e::webhook::served_fingerprint(&webhook.addr.to_string(), "127.0.0.1", &bundle).await
}

async fn rotation_under_load_fails_no_admission(env: Arc<Env>) -> Result<()> {
    let webhook = LocalWebhook::start(env.clone(), images_registration(Duration::from_secs(2))).await?;
    let ns = webhook.namespace("rotate").await?;
    let client = env.client().await?;
    let first = served_fingerprint(&webhook).await?;

    // Load: create CFApp + Image pairs back to back until told to stop; every Image must come
    // back stamped, and no request may fail (failurePolicy is Fail, so a TLS failure would).
    let stop = tokio_util::sync::CancellationToken::new();
    let (progress, mut seen) = tokio::sync::watch::channel(0usize);
    let load = {
        let (client, ns, stop) = (client.clone(), ns.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut admitted, mut failures) = (0usize, Vec::new());
            while !stop.is_cancelled() {
                let name = format!("app-{admitted}");
                let mut workload_uid = String::new();
                for object in parse_documents(&cfapp_and_workload(&name))? {
                    let api = api_for(&client, &object, Some(&ns)).await?;
                    match api.create(&PostParams::default(), &object).await {
                        Ok(created) => {
                            if let Some(uid) = created
                                .uid()
                                .filter(|_| object.types.as_ref().is_some_and(|t| t.kind == "BuildWorkload"))
                            {
                                workload_uid = uid;
                            }
                        }
                        Err(e) => failures.push(format!("{name}: {e}")),
                    }
                }
                for object in parse_documents(&image_of(&name, &workload_uid))? {
                    let api = api_for(&client, &object, Some(&ns)).await?;
                    match api.create(&PostParams::default(), &object).await {
                        Ok(created) => {
                            if !created.owner_references().iter().any(|r| r.kind == "CFApp") {
                                failures.push(format!("{name}: admitted without owner"));
                            }
                        }
                        Err(e) => failures.push(format!("{name}: {e}")),
                    }
                }
                admitted += 1;
                progress.send_replace(admitted);
            }
            anyhow::Ok((admitted, failures))
        })
    };

    webhook.store.rotate_leaf().await?;
    let after_leaf = served_fingerprint(&webhook).await?;
    ensure!(
        after_leaf != first,
        "the leaf rotation did not change the served certificate"
    );
    ensure!(
        after_leaf == webhook.store.resolver().fingerprint(),
        "served certificate is not the stored one"
    );

    let bundle_before = webhook.store.ca_bundle().await?;
    webhook.store.rotate_ca().await?;
    let bundle_after = webhook.store.ca_bundle().await?;
    ensure!(
        bundle_after.matches("BEGIN CERTIFICATE").count() == 2,
        "CA overlap must publish both CAs"
    );
    ensure!(
        bundle_after.starts_with(bundle_before.trim_end()),
        "the old CA left the bundle during the overlap"
    );
    let after_ca = served_fingerprint(&webhook).await?;
    ensure!(
        after_ca != after_leaf,
        "the CA rotation did not re-issue the served certificate"
    );

    // Keep the load running across the new certificate for a few more admissions.
    let base = *seen.borrow();
    tokio::time::timeout(Duration::from_secs(60), seen.wait_for(|n| *n >= base + 5)).await??;
    stop.cancel();
    let (admitted, failures) = load.await??;
    ensure!(
        failures.is_empty(),
        "{} failed admissions: {failures:?}",
        failures.len()
    );
    ensure!(admitted >= 5, "the load loop made only {admitted} admissions");
    eprintln!("rotation under load: {admitted} admissions, 0 failures, leaf and CA rotated");
    webhook.stop().await
}

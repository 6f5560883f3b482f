//! The admission server against the real kube-apiserver: called over TLS with the caBundle the
//! certificate store injected, patching objects applied with kubectl, and surviving certificate
//! and CA rotation under load without a failed admission.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env, e2e_main,
    objects::{api_for, parse_documents},
    webhook::{LocalWebhook, Registration, rule},
};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::{ResourceExt, api::PostParams};
use tokio_rustls::TlsConnector;

e2e_main!(
    kubectl_apply_comes_back_patched_over_tls,
    rotation_under_load_fails_no_admission,
    the_shipped_configurations_decide_what_reaches_holdfast,
);

/// Pod CREATEs holdfast has answered so far: the terminating guard is the only rule for pods, and
/// these tests create no kpack Builds, so its CREATE count is the pods' count.
fn guard_creates(webhook: &LocalWebhook) -> Result<u64> {
    let metrics = webhook
        .running
        .as_ref()
        .context("webhook stopped")?
        .metrics
        .encode()?;
    Ok(metrics
        .lines()
        .filter(|l| {
            l.starts_with("holdfast_webhook_admission_duration_seconds_count{")
                && l.contains("rule=\"terminating-guard\"")
                && l.contains("operation=\"CREATE\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
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

fn cfapp_and_image(name: &str) -> String {
    format!(
        "apiVersion: korifi.cloudfoundry.org/v1alpha1\nkind: CFApp\nmetadata: {{name: {name}}}\nspec:\n  displayName: {name}\n  desiredState: STOPPED\n  lifecycle: {{type: buildpack, data: {{buildpacks: [], stack: cflinuxfs3}}}}\n---\napiVersion: kpack.io/v1alpha2\nkind: Image\nmetadata: {{name: {name}}}\nspec: {{tag: registry.example/{name}-droplets}}\n"
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
    env.kubectl_apply(&ns, &cfapp_and_image("app-1"))?;
    let image = env.kubectl_get("images.kpack.io", "app-1", &ns)?;
    let owners = &image["metadata"]["ownerReferences"];
    ensure!(
        owners[0]["kind"] == "CFApp" && owners[0]["name"] == "app-1",
        "not stamped: {owners}"
    );

    // Applying the same manifest again changes nothing: same patch, generation unchanged.
    env.kubectl_apply(&ns, &cfapp_and_image("app-1"))?;
    let again = env.kubectl_get("images.kpack.io", "app-1", &ns)?;
    ensure!(
        again["metadata"]["generation"] == image["metadata"]["generation"],
        "re-apply changed the Image"
    );
    ensure!(
        again["metadata"]["ownerReferences"].as_array().map(Vec::len) == Some(1),
        "owner stamped twice"
    );
    webhook.stop().await
}

/// The fingerprint of the certificate the webhook serves right now, seen by a TLS client that
/// trusts only the published caBundle.
async fn served_fingerprint(webhook: &LocalWebhook) -> Result<String> {
    let bundle = webhook.store.ca_bundle().await?;
    let config = holdfast_certs::client_config(&bundle)?;
    let tcp = tokio::net::TcpStream::connect(webhook.addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1")?;
    let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
    let der = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .context("no peer certificate")?;
    Ok(holdfast_certs::fingerprint(der))
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
                for object in parse_documents(&cfapp_and_image(&name))? {
                    let api = api_for(&client, &object, Some(&ns)).await?;
                    match api.create(&PostParams::default(), &object).await {
                        Ok(created) if object.types.as_ref().is_some_and(|t| t.kind == "Image") => {
                            if created.owner_references().is_empty() {
                                failures.push(format!("{name}: admitted without owner"));
                            }
                        }
                        Ok(_) => {}
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

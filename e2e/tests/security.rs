//! The privilege paths of issue 15 on the real kube-apiserver: what a stolen webhook token and a
//! pod that reaches port 8443 can no longer do.
//!
//! - A `DigestCacheEntry` made by hand (as anyone who could write entries could) that names
//!   `secret:<victim>/db-creds` and a registry of the writer's choice: the controller's refresh
//!   neither reads that Secret nor sends anything to that registry.
//! - Forged AdmissionReviews with fresh tags that a registry answers: no entry is persisted, and
//!   the webhook keeps at most `--cache-max-entries` of them in memory.

use std::{sync::Arc, time::SystemTime};

use anyhow::{Context, Result, ensure};
use holdfast_e2e::{
    Env,
    controller::LocalController,
    e2e_main, images,
    webhook::{LocalWebhook, Registration, rule},
};
use holdfast_registry::{
    Digest, Reference,
    cache::{CacheConfig, CacheEntry, CacheKey, Scope},
    cluster_store,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;

e2e_main!(
    a_hand_made_entry_naming_another_namespaces_secret_sends_nothing,
    forged_reviews_with_fresh_tags_persist_nothing
);

async fn a_hand_made_entry_naming_another_namespaces_secret_sends_nothing(env: Arc<Env>) -> Result<()> {
    let attacker = env.spare_registry().await?;
    let client = env.client().await?;
    let victim = env.namespace("victim").await?;
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "db-creds"},
        "stringData": {"username": "db", "password": "hunter2"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), &victim)
        .create(&PostParams::default(), &secret)
        .await?;
    let controller =
        LocalController::start(&env, client.clone(), std::slice::from_ref(&attacker.addr)).await?;

    // What the webhook's token could create before: an entry for the attacker's registry,
    // resolved "with" the victim's Secret.
    let reference = Reference::parse(&format!("{}/exfil/app:1", attacker.addr))?;
    let now = SystemTime::now();
    let entry = CacheEntry {
        key: CacheKey::tag(
            &reference,
            Scope::Secret {
                namespace: victim.clone(),
                name: "db-creds".into(),
            },
        ),
        digest: Digest::sha256_of(b"planted"),
        tag: None,
        resolved_at: now,
        checked_at: now,
        error: None,
        secret_uid: None,
    };
    let object: DynamicObject = serde_json::from_value(cluster_store::to_object(&entry))?;
    let entries = cluster_store::api(client.clone(), &controller.namespace);
    entries.create(&PostParams::default(), &object).await?;
    holdfast_e2e::wait::until(
        &entries,
        &cluster_store::object_name(&entry.key),
        |e: Option<&DynamicObject>| e.is_some(),
    )
    .await?;
    // The controller's cache has loaded it; a refresh round must leave it alone.
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = attacker.requests_matching("/v2/exfil/");
    let report = controller.refresh().await?;
    let after = attacker.requests_matching("/v2/exfil/");
    ensure!(
        after == before,
        "the controller sent {} request(s) to the entry's registry",
        after - before
    );
    ensure!(report.unnamed >= 1 && report.checked == 0, "{report:?}");
    controller.stop().await;
    Ok(())
}

async fn forged_reviews_with_fresh_tags_persist_nothing(env: Arc<Env>) -> Result<()> {
    const CAP: usize = 3;
    let registry = env.spare_registry().await?;
    let image = images::Image::with_files(&[("config.yml", b"forged: true\n")])?;
    let mut registration = Registration::rules(vec![rule(
        "kappctrl.k14s.io",
        "v1alpha1",
        &["apps"],
        &["CREATE", "UPDATE"],
    )]);
    registration.insecure_registries = vec![registry.addr.clone()];
    registration.cache = CacheConfig {
        max_entries: CAP,
        ..CacheConfig::default()
    };
    let webhook = LocalWebhook::start(env.clone(), registration).await?;
    let http = reqwest::Client::builder()
        // A forged client trusts whatever it reaches; so does this one.
        .danger_accept_invalid_certs(true)
        .build()?;
    for i in 0..10 {
        let tag = format!("fresh-{i}");
        images::push(&registry.addr, "forged/app", &tag, &image).await?;
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": format!("forged-{i}"),
                "kind": {"group": "kappctrl.k14s.io", "version": "v1alpha1", "kind": "App"},
                "resource": {"group": "kappctrl.k14s.io", "version": "v1alpha1", "resource": "apps"},
                "name": "forged", "namespace": "anywhere", "operation": "CREATE",
                "userInfo": {"username": "nobody"},
                "dryRun": i % 2 == 0,
                "object": {
                    "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
                    "metadata": {"name": "forged", "namespace": "anywhere"},
                    "spec": {"fetch": [{"image": {"url": format!("{}/forged/app:{tag}", registry.addr)}}]},
                },
            },
        });
        let answer: serde_json::Value = http
            .post(format!("https://{}/mutate", webhook.addr))
            .json(&review)
            .send()
            .await?
            .json()
            .await?;
        ensure!(answer["response"]["allowed"] == json!(true), "{answer}");
    }
    ensure!(
        webhook.cache.entry_count() <= CAP,
        "the webhook holds {} entries past its cap of {CAP}",
        webhook.cache.entry_count()
    );
    let client = env.client().await?;
    let persisted = cluster_store::api(client, &webhook.system_namespace)
        .list(&ListParams::default())
        .await
        .context("listing digest cache entries")?;
    ensure!(
        persisted.items.is_empty(),
        "forged reviews persisted {} DigestCacheEntry object(s)",
        persisted.items.len()
    );
    webhook.stop().await
}

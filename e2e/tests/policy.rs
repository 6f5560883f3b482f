//! The pinning policy (`manifests/base/policy/pin-cached.yaml`, issue 31) on the real
//! kube-apiserver 1.37: fed by the controller's publisher, it pins cached tags inside the API
//! server — while the webhook is down too — and stores byte for byte the object the webhook
//! stores, for every pinning case it takes; what it leaves, it leaves whole to the webhook. Its
//! parameters are written by the controller alone: a tenant cannot write them.
//!
//! Serial: the policy and its `ClusterDigestPins` are cluster-wide, one publisher at a time.

use std::{sync::Arc, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use holdfast_e2e::{
    Env,
    controller::LocalController,
    e2e_main, images,
    objects::api_for,
    webhook::{LocalWebhook, Registration, shipped_pinning_policy},
};
use holdfast_pins::policy_params::crd::{ClusterDigestPins, DigestPins};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Secret},
    rbac::v1::{RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use serde_json::{Value, json};

e2e_main!(serial:
    a_cached_tag_is_pinned_while_the_webhook_is_down,
    every_pinning_case_stores_the_same_object,
    a_tenant_cannot_write_the_pins,
);

/// The pinning policy as the base ships it: the two policies, and their bindings when
/// `bindings`.
async fn install_policy(env: &Env, bindings: bool) -> Result<()> {
    let client = env.client().await?;
    for object in shipped_pinning_policy()? {
        let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        if kind.ends_with("Binding") && !bindings {
            continue;
        }
        let api = api_for(&client, &object, None).await?;
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error).with_context(|| format!("creating {kind}")),
        }
    }
    Ok(())
}

/// Removes the policy (its bindings first, as `kubectl delete -k` would have it).
async fn remove_policy(env: &Env) -> Result<()> {
    let client = env.client().await?;
    let mut objects = shipped_pinning_policy()?;
    objects.sort_by_key(|o| !o.types.as_ref().is_some_and(|t| t.kind.ends_with("Binding")));
    for object in objects {
        let api = api_for(&client, &object, None).await?;
        let name = object.metadata.name.clone().unwrap_or_default();
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Whether the parameters answer `key`: in a `ClusterDigestPins`, or in a `DigestPins` of
/// `namespace`.
async fn published(client: &Client, namespace: &str, key: &str) -> Result<bool> {
    let cluster = Api::<ClusterDigestPins>::all(client.clone())
        .list(&Default::default())
        .await?;
    let private = Api::<DigestPins>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await?;
    Ok(cluster.items.iter().any(|p| p.spec.pins.contains_key(key))
        || private.items.iter().any(|p| p.spec.pins.contains_key(key)))
}

/// Waits until the publisher has published every key of `keys` (what the policy needs before
/// it can pin them).
async fn until_published(client: &Client, namespace: &str, keys: &[String]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for key in keys {
        while !published(client, namespace, key).await? {
            if tokio::time::Instant::now() > deadline {
                bail!("{key:?} was not published within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Whether `stored` (what an apply returned) came out of admission pinned: no tag left in its
/// OCI sources, and none of it written by the controller (its catch-up writes as
/// `holdfast-controller`).
fn pinned_at_admission(stored: &Value) -> bool {
    let controller_wrote = stored["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|f| f["manager"] == "holdfast-controller");
    !controller_wrote && stored["metadata"]["annotations"]["holdfast.dev/original-refs"].is_string()
}

/// What the two paths must store alike: the spec, the labels, and the annotations but kubectl's
/// copy of what was applied (which names the object).
fn stored_view(stored: &Value) -> Value {
    let mut annotations = stored["metadata"]["annotations"].clone();
    if let Some(map) = annotations.as_object_mut() {
        map.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    json!({
        "spec": stored["spec"],
        "labels": stored["metadata"]["labels"],
        "annotations": annotations,
    })
}

/// Applies `yaml` named `name` until it is pinned at admission (the policy and its parameters
/// reach the API server's informers a moment after they are written), at most 30 s. For a
/// webhook that is down.
async fn until_the_policy_pins(env: &Env, namespace: &str, yaml: impl Fn(&str) -> String) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    for attempt in 0.. {
        let stored = env.kubectl_apply_stored(namespace, &yaml(&format!("probe-{attempt}")))?;
        if pinned_at_admission(&stored) {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the pinning policy pinned nothing within 30 s: {stored}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

fn app(name: &str, fetch: &str, extra_metadata: &str) -> String {
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata:\n  name: {name}{extra_metadata}\nspec:\n  serviceAccountName: default\n  paused: true\n  fetch: [{fetch}]\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

fn repository(name: &str, fetch: &str) -> String {
    format!(
        "apiVersion: packaging.carvel.dev/v1alpha1\nkind: PackageRepository\nmetadata:\n  name: {name}\nspec:\n  syncPeriod: 10m\n  fetch: {fetch}\n"
    )
}

/// The whole stack of the policy: the webhook as shipped, the controller publishing in its
/// namespace, the policy installed (with its bindings when `bindings`).
async fn stack(env: &Arc<Env>, bindings: bool) -> Result<(LocalWebhook, LocalController)> {
    let webhook = LocalWebhook::start(env.clone(), Registration::shipped()).await?;
    let controller =
        LocalController::start_publishing(env, env.client().await?, webhook.system_namespace.clone()).await?;
    install_policy(env, bindings).await?;
    Ok((webhook, controller))
}

/// Issue 31's resilience promise: with every webhook pod gone (the configuration stays, its
/// calls fail, failurePolicy Ignore) and the controller running, an App whose tag the cache
/// holds, created with kubectl, is stored pinned by the API server itself; an App of a tag never
/// resolved is admitted as written and pinned by the controller's catch-up; once the webhook is
/// back, it pins at admission again.
async fn a_cached_tag_is_pinned_while_the_webhook_is_down(env: Arc<Env>) -> Result<()> {
    let reg = env.registry().to_string();
    let image = |body: &'static [u8]| images::Image::with_files(&[("config.yml", body)]);
    images::push(&reg, "down/cached", "1.0.0", &image(b"cached: true\n")?).await?;
    images::push(&reg, "down/uncached", "1.0.0", &image(b"uncached: true\n")?).await?;
    images::push(&reg, "down/later", "1.0.0", &image(b"later: true\n")?).await?;
    let (mut webhook, controller) = stack(&env, true).await?;
    let client = env.client().await?;
    let ns = webhook.namespace("down").await?;
    let cached = format!("{reg}/down/cached:1.0.0");
    let with = |url: &str| {
        let url = url.to_owned();
        move |name: &str| app(name, &format!("{{image: {{url: {url}}}}}"), "")
    };

    // The webhook pins the first App; the controller publishes its tag.
    let first = env.kubectl_apply_stored(&ns, &with(&cached)("first"))?;
    ensure!(pinned_at_admission(&first), "the webhook did not pin: {first}");
    until_published(&client, &ns, std::slice::from_ref(&cached)).await?;

    webhook.stop_serving().await;
    until_the_policy_pins(&env, &ns, with(&cached)).await?;
    let stored = env.kubectl_apply_stored(&ns, &with(&cached)("while-down"))?;
    ensure!(
        pinned_at_admission(&stored),
        "a cached tag was not pinned with the webhook down: {stored}"
    );
    ensure!(
        stored_view(&stored) == stored_view(&first),
        "the policy stored {} where the webhook stored {}",
        stored_view(&stored),
        stored_view(&first)
    );

    let uncached = format!("{reg}/down/uncached:1.0.0");
    let stored = env.kubectl_apply_stored(&ns, &with(&uncached)("uncached"))?;
    ensure!(
        stored["spec"]["fetch"][0]["image"]["url"] == uncached.as_str()
            && stored["metadata"]["annotations"]["holdfast.dev/original-refs"].is_null(),
        "a tag never resolved was not admitted as written: {stored}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = env.kubectl_get("apps.kappctrl.k14s.io", "uncached", &ns)?;
        if now["spec"]["fetch"][0]["image"]["url"] != uncached.as_str() {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the controller did not pin the App admitted unpinned"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    webhook.serve_again().await?;
    let later = format!("{reg}/down/later:1.0.0");
    let stored = env.kubectl_apply_stored(&ns, &with(&later)("after"))?;
    ensure!(
        pinned_at_admission(&stored),
        "the webhook, back, did not pin a new tag at admission: {stored}"
    );

    controller.stop().await;
    webhook.stop().await?;
    remove_policy(&env).await
}

/// One pinning case: the object (named by the caller), the parameter keys it needs, and whether
/// the policy takes it (else the webhook alone does).
struct Case {
    name: &'static str,
    yaml: Box<dyn Fn(&str) -> String + Send + Sync>,
    keys: Vec<String>,
    policy: bool,
}

/// Issue 31's equivalence: for every pinning case of the suites (the examples' shapes, each
/// source, a PackageRepository of each source, more than nine entries, a pin policy label,
/// annotations already there, a digest beside a tag, a source with a Secret, and one with a
/// Secret beside one without), the object the policy stores (webhook down, so nothing else pins
/// it at admission) is the object the webhook stores (policy off). The cases the policy leaves —
/// a tagSelection, an unknown or annotated pin policy, a tag never resolved, a copy that carries
/// the annotation, another namespace naming the same Secret and reference — it stores as
/// written, for the webhook.
async fn every_pinning_case_stores_the_same_object(env: Arc<Env>) -> Result<()> {
    let reg = env.registry().to_string();
    let config = images::Image::with_files(&[("config.yml", b"case: true\n")])?;
    let config_digest = images::push(&reg, "cases/config", "1.0.0", &config).await?;
    images::push(&reg, "cases/config", "latest", &config).await?;
    let bundle = images::Image::bundle(&[("config/v.yml", b"bundle: true\n")], &[])?;
    images::push(&reg, "cases/bundle", "1.0.0", &bundle).await?;
    images::push(&reg, "cases/repo", "1.0.0", &bundle).await?;
    let private = images::Image::with_files(&[("config.yml", b"private: true\n")])?;
    let private_digest = images::push(&reg, "cases/private", "1.0.0", &private).await?;
    let never = images::Image::with_files(&[("config.yml", b"never: true\n")])?;
    images::push(&reg, "cases/never", "1.0.0", &never).await?;

    let (mut webhook, controller) = stack(&env, false).await?;
    let client = env.client().await?;
    let ns = webhook.namespace("cases").await?;
    let other = webhook.namespace("other").await?;
    for namespace in [&ns, &other] {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("creds".into()),
                ..Default::default()
            },
            string_data: Some(
                [
                    ("username".to_string(), "puller".to_string()),
                    ("password".to_string(), "secret".to_string()),
                ]
                .into(),
            ),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), namespace)
            .create(&PostParams::default(), &secret)
            .await?;
    }

    let config_tag = format!("{reg}/cases/config:1.0.0");
    let image = |url: &str| format!("{{image: {{url: {url}}}}}");
    let bundle_of = |url: &str| format!("{{imgpkgBundle: {{image: {url}}}}}");
    let private_url = format!("{reg}/cases/private:1.0.0");
    let private_source = format!("{{image: {{url: {private_url}, secretRef: {{name: creds}}}}}}");
    let private_key = format!("creds {private_url}");
    let case = |name: &'static str,
                yaml: Box<dyn Fn(&str) -> String + Send + Sync>,
                keys: Vec<String>,
                policy: bool| Case {
        name,
        yaml,
        keys,
        policy,
    };
    let many = vec![image(&config_tag); 12].join(", ");
    let pinned_config = format!("{reg}/cases/config@{config_digest}");
    let copied_annotation = format!(
        "\n  annotations:\n    holdfast.dev/original-refs: '{}'",
        json!({"/spec/fetch/1/image/url": {"digest": private_digest, "ref": "elsewhere/app:1"}})
    );
    let cases: Vec<Case> = vec![
        case(
            "one-image",
            {
                let f = image(&config_tag);
                Box::new(move |n| app(n, &f, ""))
            },
            vec![config_tag.clone()],
            true,
        ),
        case(
            "image-bundle-git",
            {
                let f = format!(
                    "{}, {{imgpkgBundle: {{image: {reg}/cases/bundle:1.0.0}}, path: bundle}}, {{git: {{url: 'https://git.example/config', ref: main}}, path: git}}",
                    image(&config_tag)
                );
                Box::new(move |n| app(n, &f, ""))
            },
            vec![config_tag.clone(), format!("{reg}/cases/bundle:1.0.0")],
            true,
        ),
        case(
            "implicit-latest",
            {
                let f = image(&format!("{reg}/cases/config"));
                Box::new(move |n| app(n, &f, ""))
            },
            vec![format!("{reg}/cases/config")],
            true,
        ),
        case(
            "twelve-entries",
            {
                let f = many.clone();
                Box::new(move |n| app(n, &f, ""))
            },
            vec![config_tag.clone()],
            true,
        ),
        case(
            "freeze-label-and-annotations",
            {
                let f = image(&config_tag);
                Box::new(move |n| {
                    app(
                        n,
                        &f,
                        "\n  labels: {holdfast.dev/pin: freeze, team: a}\n  annotations: {note: kept}",
                    )
                })
            },
            vec![config_tag.clone()],
            true,
        ),
        case(
            "digest-beside-tag",
            {
                let f = format!("{}, {}", image(&pinned_config), image(&config_tag));
                Box::new(move |n| app(n, &f, ""))
            },
            vec![config_tag.clone()],
            true,
        ),
        case(
            "repository-bundle",
            {
                let f = bundle_of(&format!("{reg}/cases/repo:1.0.0"));
                Box::new(move |n| repository(n, &f))
            },
            vec![format!("{reg}/cases/repo:1.0.0")],
            true,
        ),
        case(
            "repository-image",
            {
                let f = image(&config_tag);
                Box::new(move |n| repository(n, &f))
            },
            vec![config_tag.clone()],
            true,
        ),
        case(
            "private",
            {
                let f = private_source.clone();
                Box::new(move |n| app(n, &f, ""))
            },
            vec![private_key.clone()],
            true,
        ),
        case(
            "private-and-public",
            {
                let f = format!(
                    "{}, {}",
                    private_source,
                    bundle_of(&format!("{reg}/cases/bundle:1.0.0"))
                );
                Box::new(move |n| app(n, &f, ""))
            },
            vec![private_key.clone(), format!("{reg}/cases/bundle:1.0.0")],
            true,
        ),
        case(
            "tag-selection",
            {
                let f = format!(
                    "{}, {{imgpkgBundle: {{image: {reg}/cases/bundle, tagSelection: {{semver: {{constraints: '>=1.0.0'}}}}}}}}",
                    image(&config_tag)
                );
                Box::new(move |n| app(n, &f, ""))
            },
            vec![config_tag.clone()],
            false,
        ),
        case(
            "unknown-pin-value",
            {
                let f = image(&config_tag);
                Box::new(move |n| app(n, &f, "\n  labels: {holdfast.dev/pin: Freeze}"))
            },
            vec![config_tag.clone()],
            false,
        ),
        case(
            "pin-annotation",
            {
                let f = image(&config_tag);
                Box::new(move |n| app(n, &f, "\n  annotations: {holdfast.dev/pin: follow}"))
            },
            vec![config_tag.clone()],
            false,
        ),
        case(
            "copy-with-annotation",
            {
                let f = format!("{}, {}", image(&config_tag), image(&config_tag));
                let metadata = copied_annotation.clone();
                Box::new(move |n| app(n, &f, &metadata))
            },
            vec![config_tag.clone()],
            false,
        ),
    ];

    // Warm-up: the webhook (and, for a Secret's source, the controller) pins one object of each
    // case, so the cache holds every reference and the publisher publishes it.
    for case in &cases {
        env.kubectl_apply(&ns, &(case.yaml)(&format!("warm-{}", case.name)))?;
    }
    for case in &cases {
        until_published(&client, &ns, &case.keys).await?;
    }

    // The webhook's path: no policy bindings, the webhook serving.
    let mut through_webhook = Vec::new();
    for case in cases.iter().filter(|c| c.policy) {
        let stored = env.kubectl_apply_stored(&ns, &(case.yaml)(&format!("w-{}", case.name)))?;
        ensure!(
            pinned_at_admission(&stored),
            "{}: the webhook did not pin: {stored}",
            case.name
        );
        through_webhook.push(stored);
    }

    // The policy's path: the webhook down, the bindings installed.
    webhook.stop_serving().await;
    install_policy(&env, true).await?;
    until_the_policy_pins(&env, &ns, |n| app(n, &image(&config_tag), "")).await?;
    let mut problems = Vec::new();
    for (case, webhook_stored) in cases.iter().filter(|c| c.policy).zip(&through_webhook) {
        let stored = env.kubectl_apply_stored(&ns, &(case.yaml)(&format!("p-{}", case.name)))?;
        if !pinned_at_admission(&stored) {
            problems.push(format!(
                "{}: the policy did not pin: {}",
                case.name,
                stored_view(&stored)
            ));
        } else if stored_view(&stored) != stored_view(webhook_stored) {
            problems.push(format!(
                "{}: the policy stored {}\n  the webhook stored {}",
                case.name,
                stored_view(&stored),
                stored_view(webhook_stored)
            ));
        }
    }
    for case in cases.iter().filter(|c| !c.policy) {
        let yaml = (case.yaml)(&format!("p-{}", case.name));
        let written: Value = serde_yaml::from_str(&yaml)?;
        let stored = env.kubectl_apply_stored(&ns, &yaml)?;
        if stored["spec"]["fetch"] != written["spec"]["fetch"] {
            problems.push(format!(
                "{}: pinned with the webhook down, though the policy leaves it: {}",
                case.name,
                stored_view(&stored)
            ));
        }
    }
    // Another namespace naming the same Secret and reference: its own parameters hold nothing.
    let stored = env.kubectl_apply_stored(&other, &app("p-private", &private_source, ""))?;
    if stored["spec"]["fetch"][0]["image"]["url"] != private_url.as_str() {
        problems.push(format!(
            "another namespace's object was pinned from a Secret's parameters: {}",
            stored_view(&stored)
        ));
    }
    // Nothing unknown pins either (a tag named by no object).
    let never_url = format!("{reg}/cases/never:1.0.0");
    let stored = env.kubectl_apply_stored(&ns, &app("p-never", &image(&never_url), ""))?;
    if stored["spec"]["fetch"][0]["image"]["url"] != never_url.as_str() {
        problems.push(format!(
            "a tag never published was pinned: {}",
            stored_view(&stored)
        ));
    }
    ensure!(problems.is_empty(), "{}", problems.join("\n"));

    controller.stop().await;
    webhook.stop().await?;
    remove_policy(&env).await
}

/// SECURITY.md, "The pinning policy": only the controller may write the parameters. A tenant
/// given the built-in `admin` role in its namespace (which lets it write its objects there) can create
/// neither a `DigestPins` in its own namespace nor a `ClusterDigestPins`: the API server refuses
/// both (403).
async fn a_tenant_cannot_write_the_pins(env: Arc<Env>) -> Result<()> {
    let admin = env.client().await?;
    let ns = env.namespace("tenant").await?;
    let user = format!("tenant-of-{ns}");
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("tenant-admin".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.clone(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await?;
    let mut config = env.config().await?;
    config.auth_info.impersonate = Some(user.clone());
    config.auth_info.impersonate_groups = Some(vec!["system:authenticated".into()]);
    let tenant = Client::try_from(config)?;

    // The role works: the tenant writes in its namespace what `admin` grants (the RBAC
    // authorizer follows the binding through its own watch, so give it a moment).
    let configmaps = Api::<ConfigMap>::namespaced(tenant.clone(), &ns);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let config_map = ConfigMap {
            metadata: ObjectMeta {
                name: Some("tenant-config".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match configmaps.create(&PostParams::default(), &config_map).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 403 && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(error).context("the tenant cannot write a ConfigMap with admin"),
        }
    }

    let refused = |result: kube::Result<()>, what: &str| -> Result<()> {
        match result {
            Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
            Err(error) => bail!("{what}: {error}, not 403"),
            Ok(()) => bail!("{what}: the tenant could"),
        }
    };
    let pins = [(
        "nginx:1.25".to_string(),
        format!("nginx@sha256:{}", "a".repeat(64)),
    )]
    .into();
    let mut private = DigestPins::new("forged", Default::default());
    private.spec.pins = pins;
    refused(
        Api::<DigestPins>::namespaced(tenant.clone(), &ns)
            .create(&PostParams::default(), &private)
            .await
            .map(drop),
        "create a DigestPins in its own namespace",
    )?;
    let mut cluster = ClusterDigestPins::new("forged", Default::default());
    cluster.spec.pins = private.spec.pins.clone();
    refused(
        Api::<ClusterDigestPins>::all(tenant.clone())
            .create(&PostParams::default(), &cluster)
            .await
            .map(drop),
        "create a ClusterDigestPins",
    )?;
    refused(
        Api::<ClusterDigestPins>::all(tenant)
            .list(&Default::default())
            .await
            .map(drop),
        "list the ClusterDigestPins",
    )?;
    Ok(())
}

//! holdfast's webhook run in-process against the local control plane, registered by URL with the
//! caBundle its certificate store injects: the API server calls it over real TLS.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use holdfast_cache::{CacheConfig, DigestCache};
use holdfast_certs::{
    CaOptions, ServingOptions,
    kube_store::{KubeCertStore, StoreConfig},
};
use holdfast_pins::MirrorPins;
use holdfast_registry::{Resolver, ResolverConfig};
use holdfast_webhook::{
    cluster::Cluster,
    handler::{DEFAULT_DEADLINE, Limits},
    rules::{MUTATE_PATH, RuleContext, VALIDATE_PATH, policy::Policy},
    server::{self, Running, Settings},
};
use k8s_openapi::{
    api::admissionregistration::v1::{
        MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
        ValidatingWebhookConfiguration, WebhookClientConfig,
    },
    apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement},
};
use kube::{
    Api,
    api::{DeleteParams, ObjectMeta, PostParams},
};
use tokio_util::sync::CancellationToken;

use crate::{Env, control_plane::unique_name, process::free_port};

/// Label whose value scopes a test's webhook configuration to that test's namespaces.
pub const SCOPE_LABEL: &str = "holdfast.dev/e2e-scope";

/// A running in-process webhook and the configuration that sends it requests.
pub struct LocalWebhook {
    pub running: Option<Running>,
    pub store: Arc<KubeCertStore>,
    /// The webhook's digest cache (its counters show registry traffic).
    pub cache: Arc<DigestCache>,
    pub configuration: String,
    /// Where its serving certificate and digest cache entries live (holdfast's own namespace).
    pub system_namespace: String,
    /// Namespaces labelled `SCOPE_LABEL=<scope>` are served by this webhook only.
    pub scope: String,
    pub addr: SocketAddr,
    env: Arc<Env>,
    cancel: CancellationToken,
    /// What serving again needs ([`LocalWebhook::serve_again`]).
    serving: Serving,
}

/// How the webhook serves: its client, holdfast's namespace, its port and its rules' settings.
struct Serving {
    client: kube::Client,
    namespace: String,
    port: u16,
    cache: CacheConfig,
    policy: Policy,
    mirror: Option<MirrorPins>,
    insecure_registries: Vec<String>,
    look_again_every: Duration,
}

impl Serving {
    /// The admission server, its digest cache, and what stops the watches they run on; once
    /// its caches are complete, as readiness would gate it in a cluster.
    async fn start(
        &self,
        env: &Env,
        store: &KubeCertStore,
    ) -> Result<(Running, Arc<DigestCache>, CancellationToken)> {
        let cancel = CancellationToken::new();
        let cluster = Cluster::start(self.client.clone(), self.look_again_every, cancel.clone()).await;
        let resolver = Resolver::new(ResolverConfig {
            insecure_registries: self
                .insecure_registries
                .iter()
                .cloned()
                .chain([env.registry().to_string()])
                .collect(),
            ..Default::default()
        })?;
        let (cache, mut cache_synced) = holdfast_webhook::digest_cache::follow(
            self.client.clone(),
            &self.namespace,
            resolver,
            self.cache.clone(),
            cancel.clone(),
        );
        let context = RuleContext::new(
            Arc::new(cluster.clone()),
            cache.clone(),
            self.policy.clone(),
            self.mirror.clone(),
        );
        let synced = {
            let cluster = cluster.clone();
            async move {
                cluster.synced().await;
                let _ = cache_synced.wait_for(|s| *s).await;
            }
        };
        let settings = Settings {
            addr: SocketAddr::from(([127, 0, 0, 1], self.port)),
            admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            deadline: DEFAULT_DEADLINE,
            limits: Limits::default(),
            handshake_timeout: Duration::from_secs(5),
        };
        let running = server::start(settings, context, synced, store.resolver()).await?;
        let readiness = running.readiness.clone();
        tokio::time::timeout(Duration::from_secs(30), async {
            while !readiness.blockers().is_empty() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .context("webhook never became ready")?;
        Ok((running, cache, cancel))
    }
}

/// What the test's webhook configuration routes to holdfast.
pub struct Registration {
    pub rules: Vec<RuleWithOperations>,
    pub ca_overlap: Duration,
    pub cache: CacheConfig,
    /// Plain-HTTP registries besides the environment's own (e.g. a spare registry).
    pub insecure_registries: Vec<String>,
    /// Rules of a ValidatingWebhookConfiguration (none: no validating webhook is registered).
    pub validating_rules: Vec<RuleWithOperations>,
    pub policy: Policy,
    /// Run as installed from `manifests/` instead of as the cluster admin in a namespace of its
    /// own (none: the admin's client, a fresh namespace and configuration name).
    pub installed: Option<Installed>,
    /// `--mirror-*`: pin to the mirror copies the controller recorded.
    pub mirror: Option<MirrorPins>,
    /// Install the webhook configurations `manifests/overlays/recommended` ships (see
    /// [`shipped_configurations`]) instead of `rules`/`validating_rules`.
    pub shipped: bool,
    /// The value of [`SCOPE_LABEL`] on the namespaces it serves (none: a fresh one), e.g.
    /// [`crate::peers::korifi::SCOPE`] for the org and space namespaces Korifi makes.
    pub scope: Option<String>,
    /// How often the peers' APIs not served are looked for again (shipped: every 30 s).
    pub look_again_every: Duration,
}

/// The webhook's identity and names as `manifests/` installs it: its ServiceAccount's client,
/// holdfast's namespace (the TLS Secret `holdfast-webhook-tls` and the digest cache) and the
/// configuration name its RBAC lets it inject the caBundle into.
pub struct Installed {
    pub client: kube::Client,
    pub namespace: String,
    pub configuration: String,
}

impl Registration {
    /// The given rules, with a one-second CA overlap and the default cache.
    pub fn rules(rules: Vec<RuleWithOperations>) -> Self {
        Self {
            rules,
            ca_overlap: Duration::from_secs(1),
            cache: CacheConfig::default(),
            insecure_registries: Vec::new(),
            validating_rules: Vec::new(),
            policy: Policy::default(),
            installed: None,
            mirror: None,
            shipped: false,
            scope: None,
            look_again_every: holdfast_peers::LOOK_AGAIN_EVERY,
        }
    }

    /// The shipped webhook configurations, as a user installs them.
    pub fn shipped() -> Self {
        Self {
            shipped: true,
            ..Self::rules(Vec::new())
        }
    }
}

/// The overlay README recommends on a supported Kubernetes (the base with match-conditions).
pub fn recommended_overlay() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/overlays/recommended")
}

/// The pinning policy as the base ships it (`manifests/base/policy/pin-cached.yaml`): its
/// MutatingAdmissionPolicies and their bindings, in the file's order.
pub fn shipped_pinning_policy() -> Result<Vec<kube::api::DynamicObject>> {
    let path = crate::dist::repo().join("manifests/base/policy/pin-cached.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    crate::objects::parse_documents(&text)
}

/// The MutatingWebhookConfiguration and ValidatingWebhookConfiguration that
/// `kubectl kustomize manifests/overlays/recommended` renders, exactly as shipped (rules,
/// namespace and object selectors, matchConditions, failure policies, timeouts) except for what
/// the local control plane and a shared one need: `clientConfig` calls `base_url` + the shipped
/// path (there is no Service network, and the caBundle is left for holdfast to inject), the
/// configurations are named `name`, and each namespaceSelector also requires `scope` (so
/// concurrent tests' webhooks serve their own namespaces only).
pub fn shipped_configurations(
    name: &str,
    base_url: &str,
    scope: Option<LabelSelectorRequirement>,
) -> Result<(MutatingWebhookConfiguration, ValidatingWebhookConfiguration)> {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(recommended_overlay())
        .output()
        .context("running kubectl kustomize")?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        recommended_overlay().display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let rendered = String::from_utf8(out.stdout)?;
    let mut mutating = None;
    let mut validating = None;
    for doc in serde_yaml::Deserializer::from_str(&rendered) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        match value["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => mutating = Some(serde_json::from_value(value)?),
            Some("ValidatingWebhookConfiguration") => validating = Some(serde_json::from_value(value)?),
            _ => {}
        }
    }
    let mut mutating: MutatingWebhookConfiguration =
        mutating.context("the overlay renders no MutatingWebhookConfiguration")?;
    let mut validating: ValidatingWebhookConfiguration =
        validating.context("the overlay renders no ValidatingWebhookConfiguration")?;
    let local = |client: &mut WebhookClientConfig, selector: &mut Option<LabelSelector>| -> Result<()> {
        let path = client
            .service
            .as_ref()
            .and_then(|s| s.path.clone())
            .context("a shipped webhook without a service path")?;
        *client = WebhookClientConfig {
            url: Some(format!("{base_url}{path}")),
            ..Default::default()
        };
        if let Some(scope) = &scope {
            selector
                .get_or_insert_with(LabelSelector::default)
                .match_expressions
                .get_or_insert_with(Vec::new)
                .push(scope.clone());
        }
        Ok(())
    };
    for w in mutating.webhooks.iter_mut().flatten() {
        local(&mut w.client_config, &mut w.namespace_selector)?;
    }
    for w in validating.webhooks.iter_mut().flatten() {
        local(&mut w.client_config, &mut w.namespace_selector)?;
    }
    for meta in [&mut mutating.metadata, &mut validating.metadata] {
        *meta = ObjectMeta {
            name: Some(name.into()),
            labels: meta.labels.take(),
            ..Default::default()
        };
    }
    Ok((mutating, validating))
}

/// Creates both webhook configurations (the admin's to create).
pub async fn create_configurations(
    client: &kube::Client,
    mutating: &MutatingWebhookConfiguration,
    validating: &ValidatingWebhookConfiguration,
) -> Result<()> {
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), mutating)
        .await?;
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), validating)
        .await?;
    Ok(())
}

pub fn rule(group: &str, version: &str, resources: &[&str], operations: &[&str]) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![group.into()]),
        api_versions: Some(vec![version.into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
        scope: Some("Namespaced".into()),
    }
}

/// A MutatingWebhookConfiguration calling holdfast by URL (the local control plane has no
/// Service network); the caBundle is left for holdfast's certificate store to inject.
pub fn mutating_configuration(
    name: &str,
    url: String,
    namespace_selector: LabelSelector,
    rules: Vec<RuleWithOperations>,
    failure_policy: &str,
) -> MutatingWebhookConfiguration {
    let webhook = MutatingWebhook {
        name: "mutate.holdfast.dev".into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some(failure_policy.into()),
        timeout_seconds: Some(5),
        reinvocation_policy: Some("IfNeeded".into()),
        client_config: WebhookClientConfig {
            url: Some(url),
            ..Default::default()
        },
        namespace_selector: Some(namespace_selector),
        rules: Some(rules),
        ..Default::default()
    };
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        webhooks: Some(vec![webhook]),
    }
}

/// A ValidatingWebhookConfiguration calling holdfast's `/validate` by URL.
pub fn validating_configuration(
    name: &str,
    url: String,
    namespace_selector: LabelSelector,
    rules: Vec<RuleWithOperations>,
    failure_policy: &str,
) -> ValidatingWebhookConfiguration {
    let webhook = ValidatingWebhook {
        name: "validate.holdfast.dev".into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some(failure_policy.into()),
        timeout_seconds: Some(5),
        client_config: WebhookClientConfig {
            url: Some(url),
            ..Default::default()
        },
        namespace_selector: Some(namespace_selector),
        rules: Some(rules),
        ..Default::default()
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        webhooks: Some(vec![webhook]),
    }
}

impl LocalWebhook {
    /// Registers a MutatingWebhookConfiguration pointing at a free loopback port (failurePolicy
    /// Fail, so any TLS or serving failure shows up as a failed request), lets the certificate
    /// store create its Secret and inject the caBundle, and starts serving.
    pub async fn start(env: Arc<Env>, registration: Registration) -> Result<Self> {
        let client = env.client().await?;
        let port = free_port()?;
        let id = unique_name("scope");
        let scope = registration.scope.clone().unwrap_or_else(|| id.clone());
        // The configurations are the admin's to create; everything the webhook does itself
        // (certificates, watches, the digest cache) it does with its own client.
        let (holdfast, configuration, tls_namespace) = match registration.installed {
            Some(installed) => (installed.client, installed.configuration, installed.namespace),
            None => {
                let tls_namespace = format!("{id}-system");
                crate::objects::create_namespace(&client, &tls_namespace).await?;
                (client.clone(), format!("holdfast-{id}"), tls_namespace)
            }
        };
        let selector = LabelSelector {
            match_labels: Some(BTreeMap::from([(SCOPE_LABEL.to_string(), scope.clone())])),
            ..Default::default()
        };
        let url = format!("https://127.0.0.1:{port}{MUTATE_PATH}");
        let validating = registration.shipped || !registration.validating_rules.is_empty();
        let config = if registration.shipped {
            let scope_requirement = LabelSelectorRequirement {
                key: SCOPE_LABEL.into(),
                operator: "In".into(),
                values: Some(vec![scope.clone()]),
            };
            let (mutating, validating) = shipped_configurations(
                &configuration,
                &format!("https://127.0.0.1:{port}"),
                Some(scope_requirement),
            )?;
            Api::<ValidatingWebhookConfiguration>::all(client.clone())
                .create(&PostParams::default(), &validating)
                .await?;
            mutating
        } else {
            mutating_configuration(&configuration, url, selector.clone(), registration.rules, "Fail")
        };
        if validating && !registration.shipped {
            let url = format!("https://127.0.0.1:{port}{VALIDATE_PATH}");
            let config = validating_configuration(
                &configuration,
                url,
                selector,
                registration.validating_rules,
                "Fail",
            );
            Api::<ValidatingWebhookConfiguration>::all(client.clone())
                .create(&PostParams::default(), &config)
                .await?;
        }
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &config)
            .await?;

        let store = KubeCertStore::bootstrap(
            holdfast.clone(),
            StoreConfig {
                namespace: tls_namespace.clone(),
                secret: "holdfast-webhook-tls".into(),
                ca: CaOptions::default(),
                serving: ServingOptions::for_service("holdfast-webhook", "holdfast-system")
                    .with_ip(std::net::Ipv4Addr::LOCALHOST.into()),
                renew_at_fraction: holdfast_certs::DEFAULT_RENEW_AT_FRACTION,
                ca_overlap: registration.ca_overlap,
                mutating_webhook_configurations: vec![configuration.clone()],
                validating_webhook_configurations: if validating {
                    vec![configuration.clone()]
                } else {
                    vec![]
                },
            },
        )
        .await
        .context("bootstrapping the certificate store")?;
        let store = Arc::new(store);
        let serving = Serving {
            client: holdfast,
            namespace: tls_namespace.clone(),
            port,
            cache: registration.cache,
            policy: registration.policy,
            mirror: registration.mirror,
            insecure_registries: registration.insecure_registries,
            look_again_every: registration.look_again_every,
        };
        let (running, cache, cancel) = serving.start(&env, &store).await?;
        let addr = running.addr;
        Ok(Self {
            running: Some(running),
            store,
            cache,
            configuration,
            system_namespace: tls_namespace,
            scope,
            addr,
            env,
            cancel,
            serving,
        })
    }

    /// Stops serving, as a webhook whose pods are all gone: its configurations stay, and the API
    /// server's calls fail (the failure policy applies) until [`LocalWebhook::serve_again`].
    pub async fn stop_serving(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown(Duration::ZERO, Duration::from_secs(5)).await;
        }
        self.cancel.cancel();
    }

    /// Serves again on the same port with the same certificate, as a restarted webhook: a
    /// digest cache followed afresh from holdfast's namespace.
    pub async fn serve_again(&mut self) -> Result<()> {
        self.stop_serving().await;
        let (running, cache, cancel) = self.serving.start(&self.env, &self.store).await?;
        self.running = Some(running);
        self.cache = cache;
        self.cancel = cancel;
        Ok(())
    }

    /// A namespace this webhook serves.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        self.env
            .namespace_with_labels(prefix, &[(SCOPE_LABEL, &self.scope)])
            .await
    }

    /// A namespace this webhook serves, with extra labels.
    pub async fn namespace_labelled(&self, prefix: &str, labels: &[(&str, &str)]) -> Result<String> {
        let mut all = vec![(SCOPE_LABEL, self.scope.as_str())];
        all.extend_from_slice(labels);
        self.env.namespace_with_labels(prefix, &all).await
    }

    /// Stops serving and removes the webhook configurations.
    pub async fn stop(mut self) -> Result<()> {
        let client = self.env.client().await?;
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        if validating.get_opt(&self.configuration).await?.is_some() {
            validating
                .delete(&self.configuration, &DeleteParams::default())
                .await?;
        }
        Api::<MutatingWebhookConfiguration>::all(client)
            .delete(&self.configuration, &DeleteParams::default())
            .await?;
        if let Some(running) = self.running.take() {
            running.shutdown(Duration::ZERO, Duration::from_secs(5)).await;
        }
        self.cancel.cancel();
        Ok(())
    }
}

/// Whether every webhook of a configuration has a caBundle (the webhook injected its CA): until
/// then the API server cannot call it.
pub fn ca_bundle_injected(config: Option<&MutatingWebhookConfiguration>) -> bool {
    config.and_then(|c| c.webhooks.as_ref()).is_some_and(|webhooks| {
        webhooks.iter().all(|w| {
            w.client_config
                .ca_bundle
                .as_ref()
                .is_some_and(|b| !b.0.is_empty())
        })
    })
}

/// The fingerprint of the certificate served at `addr` (a webhook's TLS port) right now, seen
/// by a TLS client that trusts only `bundle` (the published caBundle) and verifies the name
/// `server` (`127.0.0.1` on loopback, the Service's name for a pod), as kube-apiserver does.
pub async fn served_fingerprint(addr: &str, server: &str, bundle: &str) -> Result<String> {
    let config = holdfast_certs::client_config(bundle)?;
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from(server.to_owned())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await?;
    let der = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .context("no peer certificate")?;
    Ok(holdfast_certs::fingerprint(der))
}

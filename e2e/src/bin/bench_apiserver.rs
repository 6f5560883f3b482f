//! `make bench-apiserver`: what a user's writes cost with holdfast in the admission chain, measured
//! where they feel it — requests to the real kube-apiserver of the local control plane (Kubernetes
//! 1.37, etcd, the garbage collector; see `e2e/src/control_plane.rs`).
//!
//! Four arms, each a namespace of its own, in alternating turns of one run (A B C, B C A, …):
//!
//! - `holdfast`: served by holdfast's webhook configurations exactly as
//!   `manifests/overlays/recommended` ships them (rules, selectors, matchConditions; only the
//!   clientConfig points at a loopback URL), answered by the `holdfast-webhook` binary of the same
//!   build running as a process with its defaults (`holdfast_e2e::installed`, as `make up` runs it);
//! - `bare`: the same configurations pointed at a bare axum + rustls handler that allows
//!   everything — what any webhook costs the API server, the floor for holdfast's own kinds;
//! - `patch` (App CREATE only): the same bare handler answering each App CREATE with a constant
//!   JSON patch equal to holdfast's (the digest and the `original-refs` annotation of the pinned
//!   App) — what any webhook that pins costs, the floor for holdfast's App CREATE;
//! - `none`: a namespace no webhook serves;
//! - `policy` (App CREATE only): the shipped configuration with the pinning policy on
//!   (`manifests/base/policy/pin-cached.yaml`, its bindings also scoped to this arm's namespace,
//!   which holdfast's webhooks serve too): the controller published the cached tag as the
//!   policy's parameters during set-up and was then stopped (its catch-up would write to the other
//!   arms' Apps), so the API server pins each CREATE itself and the webhook's `something-to-pin`
//!   matchCondition leaves it uncalled — checked: no webhook call in this arm;
//! - `policy-floor` (App CREATE only): the floor of any admission policy that pins, a
//!   MutatingAdmissionPolicy writing the pinned App's URL and annotations as constants (no
//!   parameters, no conditions), in a namespace holdfast's webhooks serve as they serve the
//!   `policy` arm's: what separates `policy` from it is the pinning policy's own CEL.
//!
//! Four requests, each at concurrency 1, 16 and 64: App CREATE (a tag the digest cache holds:
//! holdfast patches it to the digest), App UPDATE (a label on a pinned App, as kapp-controller's
//! metadata writes are), kpack Build CREATE (the terminating guard: always called) and Pod
//! CREATE with the `kpack.io/build` label (the guard's pod webhook; the pods name a scheduler
//! that does not exist, so they stay unscheduled and cost nothing after the write).
//!
//! The load comes from this process's own kube client on a runtime of its own; the bare handlers
//! run on another runtime of this process (whose threads' CPU is counted as theirs); holdfast,
//! the API server, etcd, the controller manager and the scheduler are separate processes.
//! Everything shares the machine's cores.
//! The last line is `create_p50_overhead_ms=… throughput_ratio_c16=… vs_bare_webhook_c16=…
//! p99_c64_ms=…` (App CREATE against `none` at concurrency 1 and 16; the lowest holdfast/bare
//! throughput ratio of the four requests at 16; holdfast's App CREATE p99 at 64), then more
//! fields: among them App CREATE against `patch` (`vs_patch_floor_*`, `create_p50_over_patch_floor_ms`),
//! and the `policy` arm's (`policy_vs_none_c16`, `policy_vs_patch_floor_c16`,
//! `policy_create_p50_overhead_ms`, `policy_apiserver_cpu_us_c16`) and its floor's
//! (`policy_floor_vs_none_c16`, `policy_vs_policy_floor_c16`, `policy_floor_create_p50_overhead_ms`,
//! `policy_floor_apiserver_cpu_us_c16`).
//! The table's rows go to `docs/benchmarks/data/apiserver.csv` (`holdfast_e2e::bench_data`).

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use axum::{Json, Router, extract::State, routing::post};
use axum_server::tls_rustls::RustlsConfig;
use base64::{Engine, engine::general_purpose::STANDARD as BASE64};
use holdfast_certs::{CaOptions, CertificateAuthority, ServingOptions, SwappableCert, server_config};
use holdfast_e2e::{
    Env, bench_data,
    control_plane::{self, unique_name},
    images::{self, Image},
    installed::{self, Installed},
    latency,
    objects::api_for,
    peers::kpack,
    process::{TICKS_PER_SECOND, Usage},
    webhook::{SCOPE_LABEL, create_configurations, shipped_configurations, shipped_pinning_policy},
};
use holdfast_pins::policy_params::crd::ClusterDigestPins;
use k8s_openapi::{
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement,
};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
};
use serde::Serialize;
use serde_json::{Value, json};

const CONCURRENCY: [usize; 3] = [1, 16, 64];
/// Per arm, request and concurrency, before the measured turns (opens connections, fills caches).
const WARMUP: Duration = Duration::from_millis(700);
/// Per arm, request and concurrency, in [`ROUNDS`] turns (of 1 s: the API server's own bursts
/// move single turns by up to 30 %; more turns average them out).
const MEASURE: Duration = Duration::from_secs(10);
const ROUNDS: u32 = 10;
/// The runtime of the bare handlers: its threads' CPU is theirs.
const SERVERS_THREAD: &str = "servers";
const REQUESTS: [Request; 4] = [
    Request::AppCreate,
    Request::AppUpdate,
    Request::BuildCreate,
    Request::PodCreate,
];
/// Build pods name this scheduler, which nobody runs: they are stored and never scheduled.
const NO_SCHEDULER: &str = "holdfast-bench-unscheduled";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Arm {
    Holdfast,
    Bare,
    Patch,
    None,
    Policy,
    PolicyFloor,
}

impl Arm {
    fn name(self) -> &'static str {
        match self {
            Arm::Holdfast => "holdfast",
            Arm::Bare => "bare",
            Arm::Patch => "patch",
            Arm::None => "none",
            Arm::Policy => "policy",
            Arm::PolicyFloor => "policy-floor",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Request {
    AppCreate,
    AppUpdate,
    BuildCreate,
    PodCreate,
}

impl Request {
    /// The arms a request is measured in: `patch` differs from `bare` only for App CREATE.
    fn arms(self) -> &'static [Arm] {
        match self {
            Request::AppCreate => &[
                Arm::Holdfast,
                Arm::Bare,
                Arm::Patch,
                Arm::None,
                Arm::Policy,
                Arm::PolicyFloor,
            ],
            _ => &[Arm::Holdfast, Arm::Bare, Arm::None],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Request::AppCreate => "App CREATE",
            Request::AppUpdate => "App UPDATE",
            Request::BuildCreate => "Build CREATE",
            Request::PodCreate => "Pod CREATE",
        }
    }
}

struct Figures {
    per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// One row of the table, as `apiserver.csv` holds it.
#[derive(Serialize)]
struct Row {
    request: &'static str,
    concurrency: usize,
    arm: &'static str,
    writes_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    holdfast_cpu_us: f64,
    bare_cpu_us: f64,
    apiserver_cpu_us: f64,
}

fn main() -> Result<()> {
    holdfast_e2e::init();
    // The servers (holdfast, the bare handler) and the load have a runtime each, as they would
    // be separate processes: neither's tasks wait in the other's queues.
    let servers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("servers")
        .enable_all()
        .build()?;
    let load = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("load")
        .enable_all()
        .build()?;
    let mut env = servers.block_on(Env::start())?;
    let scope = unique_name("holdfast");
    let holdfast = servers.block_on(installed::start(
        &mut env,
        installed::Options {
            scope: Some(scope_requirement(&scope)),
            // Publishes the policy's parameters during set-up, then stopped.
            controller: Some(Vec::new()),
            webhook: Vec::new(),
        },
    ))?;
    run(&servers, &load, &mut env, &holdfast, &scope)
}

fn scope_requirement(scope: &str) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: SCOPE_LABEL.into(),
        operator: "In".into(),
        values: Some(vec![scope.into()]),
    }
}

/// What the arms need: the namespaces, the objects the requests refer to, and how to stop.
struct Setup {
    namespaces: BTreeMap<Arm, String>,
    /// Per arm that measures more than App CREATE: the Image the Builds name as owner, the Build
    /// the pods name.
    owners: BTreeMap<Arm, (Value, Value)>,
    /// The App every CREATE sends (a tag holdfast's cache holds).
    app_tag: String,
    /// The pinned App (spec and annotations as holdfast stored it) the UPDATE targets copy.
    pinned: Value,
}

fn run(
    servers: &tokio::runtime::Runtime,
    load: &tokio::runtime::Runtime,
    env: &mut Env,
    holdfast: &Installed,
    scope: &str,
) -> Result<()> {
    // The patch arm's patch is the pinned App's, known once set_up has pinned it.
    let patch = Arc::new(OnceLock::new());
    let mut scopes = BTreeMap::new();
    let mut configs = Vec::new();
    for (arm, answer) in [(Arm::Bare, None), (Arm::Patch, Some(patch.clone()))] {
        let (addr, ca) = servers.block_on(bare_server(answer))?;
        let scope = unique_name(arm.name());
        configs.push(servers.block_on(register_bare(env, &scope, addr, &ca))?);
        scopes.insert(arm, scope);
    }
    let setup = load.block_on(async {
        let client = env.client().await?;
        let setup = set_up(env, &client, scope, &scopes).await?;
        patch
            .set(pin_patch(&setup.pinned)?)
            .map_err(|_| anyhow::anyhow!("the patch arm's patch was set twice"))?;
        until_published(&client, &setup.app_tag).await?;
        anyhow::Ok(setup)
    });
    // Once published, the parameters stay as they are without a controller (README, "The
    // pinning policy"); a running one would pin the `none` arm's Apps behind the load's back.
    let setup = setup.and_then(|setup| {
        env.stop_process(installed::CONTROLLER, Duration::from_secs(30))?;
        Ok(setup)
    });
    let env = &*env;
    let outcome = load.block_on(async {
        let setup = setup?;
        let client = env.client().await?;
        for arm in [Arm::Policy, Arm::PolicyFloor] {
            until_the_policy_pins(&client, holdfast, &setup, arm).await?;
        }
        let pids = Pids {
            holdfast: env
                .pid_of(installed::WEBHOOK)
                .context("holdfast-webhook is not running")?,
            apiserver: env
                .pid_of(control_plane::KUBE_APISERVER)
                .context("kube-apiserver is not running")?,
        };
        measure(&client, holdfast, pids, &setup).await
    });
    servers.block_on(async {
        let client = env.client().await?;
        for config in &configs {
            Api::<MutatingWebhookConfiguration>::all(client.clone())
                .delete(config, &DeleteParams::default())
                .await?;
            Api::<ValidatingWebhookConfiguration>::all(client.clone())
                .delete(config, &DeleteParams::default())
                .await?;
        }
        anyhow::Ok(())
    })?;
    outcome
}

/// The processes whose CPU each turn counts.
#[derive(Clone, Copy)]
struct Pids {
    holdfast: u32,
    apiserver: u32,
}

/// The JSON patch (base64, as a review's response carries it) that turns [`app`] into the
/// App holdfast pinned: its fetch URL and its annotations.
fn pin_patch(pinned: &Value) -> Result<String> {
    let url = &pinned["spec"]["fetch"][0]["image"]["url"];
    let annotations = &pinned["metadata"]["annotations"];
    ensure!(
        url.is_string() && annotations.is_object(),
        "the pinned App has no digest URL or no annotations: {pinned}"
    );
    let patch = json!([
        {"op": "replace", "path": "/spec/fetch/0/image/url", "value": url},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]);
    Ok(BASE64.encode(serde_json::to_vec(&patch)?))
}

/// A handler that allows every review (echoing its uid, as the API server requires) on a TLS
/// server of its own; its address and CA. With `patch`, App CREATEs are answered with that
/// JSON patch once it is set.
async fn bare_server(patch: Option<Arc<OnceLock<String>>>) -> Result<(SocketAddr, String)> {
    let ca = CertificateAuthority::generate(&CaOptions::default())?;
    let leaf =
        ca.issue_serving(&ServingOptions::for_service("bare", "bench").with_ip([127, 0, 0, 1].into()))?;
    let resolver = Arc::new(SwappableCert::new(&leaf)?);
    async fn allow(
        State(patch): State<Option<Arc<OnceLock<String>>>>,
        Json(review): Json<Value>,
    ) -> Json<Value> {
        let request = &review["request"];
        let mut response = json!({"uid": request["uid"], "allowed": true});
        let app_create = request["kind"]["kind"] == "App" && request["operation"] == "CREATE";
        if let Some(patch) = patch.as_deref().and_then(OnceLock::get).filter(|_| app_create) {
            response["patchType"] = "JSONPatch".into();
            response["patch"] = patch.as_str().into();
        }
        Json(json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}))
    }
    let app = Router::new()
        .route("/mutate", post(allow))
        .route("/validate", post(allow))
        .with_state(patch);
    let tls = RustlsConfig::from_config(Arc::new(server_config(resolver)?));
    let handle = axum_server::Handle::<SocketAddr>::new();
    let server = axum_server::bind_rustls(SocketAddr::from(([127, 0, 0, 1], 0)), tls).handle(handle.clone());
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    let addr = handle.listening().await.context("bare server did not bind")?;
    Ok((addr, ca.cert_pem().to_owned()))
}

/// holdfast's shipped configurations, pointed at the bare handler and scoped to `scope`.
async fn register_bare(env: &Env, scope: &str, addr: SocketAddr, ca_pem: &str) -> Result<String> {
    let name = unique_name("bench-bare");
    let (mut mutating, mut validating) = shipped_configurations(
        &name,
        &format!("https://127.0.0.1:{}", addr.port()),
        Some(scope_requirement(scope)),
    )?;
    let bundle = k8s_openapi::ByteString(ca_pem.as_bytes().to_vec());
    for w in mutating.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(bundle.clone());
    }
    for w in validating.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(bundle.clone());
    }
    create_configurations(&env.client().await?, &mutating, &validating).await?;
    Ok(name)
}

fn app_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("kappctrl.k14s.io", "v1alpha1", "App"))
}

fn app(name: &str, url: &str) -> Value {
    json!({
        "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
        "metadata": {"name": name},
        "spec": {"serviceAccountName": "default", "fetch": [{"image": {"url": url}}],
                 "template": [{"ytt": {}}], "deploy": [{"kapp": {}}]}
    })
}

fn owner(object: &Value) -> Value {
    json!({"apiVersion": object["apiVersion"], "kind": object["kind"],
           "name": object["metadata"]["name"], "uid": object["metadata"]["uid"], "controller": true})
}

fn build(name: &str, image: &Value, registry: &str) -> Value {
    json!({
        "apiVersion": "kpack.io/v1alpha2", "kind": "Build",
        "metadata": {"name": name, "labels": {"image.kpack.io/image": image["metadata"]["name"]},
                     "ownerReferences": [owner(image)]},
        "spec": {"tags": [format!("{registry}/bench/droplet")], "builder": {"image": format!("{registry}/bench/builder")},
                 "serviceAccountName": "default", "source": {"registry": {"image": format!("{registry}/bench/source")}}}
    })
}

fn build_pod(name: &str, build: &Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"kpack.io/build": build["metadata"]["name"]},
                     "ownerReferences": [owner(build)]},
        "spec": {"schedulerName": NO_SCHEDULER, "restartPolicy": "Never", "automountServiceAccountToken": false,
                 "containers": [{"name": "build", "image": "example.invalid/builder:1"}]}
    })
}

async fn create(client: &Client, namespace: &str, resource: &ApiResource, object: &Value) -> Result<Value> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, resource);
    let object: DynamicObject = serde_json::from_value(object.clone())?;
    Ok(serde_json::to_value(
        api.create(&PostParams::default(), &object).await?,
    )?)
}

async fn set_up(
    env: &Env,
    client: &Client,
    scope: &str,
    bare_scopes: &BTreeMap<Arm, String>,
) -> Result<Setup> {
    kpack::without_conversion(client).await?;
    let registry = env.registry().to_string();
    images::push(
        &registry,
        "bench/config",
        "v1",
        &Image::with_files(&[("config.yml", b"a: 1\n")])?,
    )
    .await?;
    let app_tag = format!("{registry}/bench/config:v1");
    let mut namespaces = BTreeMap::new();
    namespaces.insert(
        Arm::Holdfast,
        env.namespace_with_labels("bench-holdfast", &[(SCOPE_LABEL, scope)])
            .await?,
    );
    for (arm, bare_scope) in bare_scopes {
        namespaces.insert(
            *arm,
            env.namespace_with_labels(&format!("bench-{}", arm.name()), &[(SCOPE_LABEL, bare_scope)])
                .await?,
        );
    }
    namespaces.insert(Arm::None, env.namespace("bench-none").await?);
    let policy_scope = unique_name("policy");
    namespaces.insert(
        Arm::Policy,
        env.namespace_with_labels(
            "bench-policy",
            &[(SCOPE_LABEL, scope), (POLICY_SCOPE_LABEL, &policy_scope)],
        )
        .await?,
    );
    install_policy(client, &policy_scope).await?;
    // The first App holdfast pins resolves the tag: after it, every CREATE is a cache hit.
    let pinned = create(
        client,
        &namespaces[&Arm::Holdfast],
        &app_resource(),
        &app("pinned", &app_tag),
    )
    .await?;
    let url = pinned["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        url.contains("@sha256:"),
        "holdfast did not pin the first App through the API server: {url}"
    );
    let floor_scope = unique_name("policy-floor");
    namespaces.insert(
        Arm::PolicyFloor,
        env.namespace_with_labels(
            "bench-policy-floor",
            &[(SCOPE_LABEL, scope), (POLICY_SCOPE_LABEL, &floor_scope)],
        )
        .await?,
    );
    install_policy_floor(client, &floor_scope, &pinned).await?;
    // An owner and UPDATE targets only where a request other than App CREATE is measured.
    let measured_beyond_create = |arm: &Arm| {
        [Request::AppUpdate, Request::BuildCreate, Request::PodCreate]
            .iter()
            .any(|request| request.arms().contains(arm))
    };
    let mut owners = BTreeMap::new();
    for (arm, namespace) in namespaces.iter().filter(|(arm, _)| measured_beyond_create(arm)) {
        let image = json!({
            "apiVersion": "kpack.io/v1alpha2", "kind": "Image",
            "metadata": {"name": "bench-app"},
            "spec": {"tag": format!("{registry}/bench/droplet"), "serviceAccountName": "default",
                     "builder": {"kind": "ClusterBuilder", "name": "bench"},
                     "source": {"registry": {"image": format!("{registry}/bench/source")}}}
        });
        let image = create(client, namespace, &kpack::resource("Image"), &image).await?;
        let build = create(
            client,
            namespace,
            &kpack::resource("Build"),
            &build("bench-app-build-1", &image, &registry),
        )
        .await?;
        owners.insert(*arm, (image, build));
        // The UPDATE targets: copies of the pinned App, one per worker.
        for worker in 0..CONCURRENCY[CONCURRENCY.len() - 1] {
            let mut copy = app(&format!("update-{worker}"), url);
            copy["spec"] = pinned["spec"].clone();
            copy["metadata"]["annotations"] = pinned["metadata"]["annotations"].clone();
            create(client, namespace, &app_resource(), &copy).await?;
        }
    }
    Ok(Setup {
        namespaces,
        owners,
        app_tag,
        pinned,
    })
}

/// Labels the `policy` arm's namespace: the pinning policy's bindings require it.
const POLICY_SCOPE_LABEL: &str = "bench.holdfast.dev/policy";

/// The pinning policy as the base ships it, its bindings also requiring `POLICY_SCOPE_LABEL`
/// `scope` of a namespace, so that it pins in the `policy` arm alone.
async fn install_policy(client: &Client, scope: &str) -> Result<()> {
    for mut object in shipped_pinning_policy()? {
        let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        if kind == "MutatingAdmissionPolicyBinding" {
            let expressions = object.data["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
                .as_array_mut()
                .context("a binding of the pinning policy has no namespaceSelector expressions")?;
            expressions.push(json!({"key": POLICY_SCOPE_LABEL, "operator": "In", "values": [scope]}));
        }
        api_for(client, &object, None)
            .await?
            .create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating the pinning policy's {kind}"))?;
    }
    Ok(())
}

/// The floor of any admission policy that pins: a MutatingAdmissionPolicy that writes the
/// `pinned` App's URL and annotations as constants (no parameters, no conditions), bound to the
/// namespaces labelled `POLICY_SCOPE_LABEL` `scope`.
async fn install_policy_floor(client: &Client, scope: &str, pinned: &Value) -> Result<()> {
    let url = pinned["spec"]["fetch"][0]["image"]["url"]
        .as_str()
        .context("the pinned App has no URL")?;
    // A JSON string is a CEL string literal (the same escapes).
    let mut annotations = Vec::new();
    for (key, value) in pinned["metadata"]["annotations"]
        .as_object()
        .context("the pinned App has no annotations")?
    {
        annotations.push(format!(
            "{}: {}",
            serde_json::to_string(key)?,
            serde_json::to_string(value.as_str().context("an annotation is not a string")?)?
        ));
    }
    let expression = format!(
        "[JSONPatch{{op: \"replace\", path: \"/spec/fetch/0/image/url\", value: {}}}, \
         JSONPatch{{op: \"add\", path: \"/metadata/annotations\", value: {{{}}}}}]",
        serde_json::to_string(url)?,
        annotations.join(", ")
    );
    let name = "holdfast-bench-policy-floor";
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["kappctrl.k14s.io"], "apiVersions": ["v1alpha1"],
                                                    "resources": ["apps"], "operations": ["CREATE"]}]},
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}]
        }
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": name,
                 "matchResources": {"namespaceSelector": {"matchLabels": {POLICY_SCOPE_LABEL: scope}}}}
    });
    for object in [policy, binding] {
        let object: DynamicObject = serde_json::from_value(object)?;
        api_for(client, &object, None)
            .await?
            .create(&PostParams::default(), &object)
            .await
            .context("creating the policy floor")?;
    }
    Ok(())
}

/// Returns once the controller published `tag` (what the webhook cached in set-up) as a
/// parameter of the pinning policy, at most 60 s.
async fn until_published(client: &Client, tag: &str) -> Result<()> {
    let pins = Api::<ClusterDigestPins>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pins
        .list(&Default::default())
        .await?
        .items
        .iter()
        .any(|p| p.spec.pins.contains_key(tag))
    {
        ensure!(
            Instant::now() < deadline,
            "the controller did not publish {tag} within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Returns once an App CREATE in `arm` (`policy` or `policy-floor`) is pinned with no webhook
/// call (the API server's informers have the policy, its bindings and parameters), at most 30 s.
async fn until_the_policy_pins(client: &Client, holdfast: &Installed, setup: &Setup, arm: Arm) -> Result<()> {
    let namespace = &setup.namespaces[&arm];
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let before = holdfast_calls(holdfast).await?;
        let stored = create(
            client,
            namespace,
            &app_resource(),
            &app(&format!("probe-{attempt}"), &setup.app_tag),
        )
        .await?;
        let pinned =
            stored["spec"]["fetch"][0]["image"]["url"] == setup.pinned["spec"]["fetch"][0]["image"]["url"];
        if pinned && holdfast_calls(holdfast).await? == before {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the {} arm's policy did not pin an App CREATE by itself within 30 s",
            arm.name()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Calls holdfast has answered so far (every rule and operation), from its own metrics.
async fn holdfast_calls(holdfast: &Installed) -> Result<u64> {
    let metrics = holdfast_e2e::metrics::scrape(&holdfast.admin).await?;
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("holdfast_webhook_admission_duration_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum())
}

/// CPU time per write of the arm's turns: `holdfast_cpu_us` of the holdfast-webhook process,
/// `bare_cpu_us` of the bare handlers' threads, `apiserver_cpu_us` of kube-apiserver.
async fn measure(client: &Client, holdfast: &Installed, pids: Pids, setup: &Setup) -> Result<()> {
    println!(
        "{:<13} {:>4} {:<9} {:>9} {:>9} {:>9} {:>15} {:>16} {:>12} {:>17}",
        "request",
        "conc",
        "arm",
        "writes/s",
        "p50_ms",
        "p99_ms",
        "holdfast_calls",
        "holdfast_cpu_us",
        "bare_cpu_us",
        "apiserver_cpu_us"
    );
    let mut results: BTreeMap<(Request, usize, Arm), Figures> = BTreeMap::new();
    let mut rows = Vec::new();
    let mut sequence = 0u64;
    let cpu_ticks = || -> Result<[u64; 3]> {
        Ok([
            Usage::of(Some(pids.holdfast))?.cpu_ticks,
            Usage::threads_cpu_ticks(SERVERS_THREAD)?,
            Usage::of(Some(pids.apiserver))?.cpu_ticks,
        ])
    };
    for concurrency in CONCURRENCY {
        for request in REQUESTS {
            let arms = request.arms();
            let mut latencies: BTreeMap<Arm, Vec<Duration>> = BTreeMap::new();
            let mut calls: BTreeMap<Arm, u64> = BTreeMap::new();
            let mut ticks: BTreeMap<Arm, [u64; 3]> = BTreeMap::new();
            for &arm in arms {
                drive(client, setup, arm, request, concurrency, WARMUP, &mut sequence).await?;
            }
            for round in 0..ROUNDS as usize {
                // Rotated order: a drift in the machine's load favours no arm.
                for i in 0..arms.len() {
                    let arm = arms[(round + i) % arms.len()];
                    let before = holdfast_calls(holdfast).await?;
                    let cpu = cpu_ticks()?;
                    let turn = drive(
                        client,
                        setup,
                        arm,
                        request,
                        concurrency,
                        MEASURE / ROUNDS,
                        &mut sequence,
                    )
                    .await?;
                    let after = cpu_ticks()?;
                    let sum = ticks.entry(arm).or_default();
                    for (sum, (after, before)) in sum.iter_mut().zip(after.iter().zip(cpu)) {
                        *sum += after - before;
                    }
                    let answered = holdfast_calls(holdfast).await? - before;
                    *calls.entry(arm).or_default() += answered;
                    ensure!(
                        !matches!(arm, Arm::Policy | Arm::PolicyFloor) || answered == 0,
                        "the webhook answered {answered} calls in the {} arm: the policy left them",
                        arm.name()
                    );
                    latencies.entry(arm).or_default().extend(turn);
                }
            }
            for &arm in arms {
                let turns = latencies.remove(&arm).unwrap_or_default();
                let per_write_us = ticks
                    .get(&arm)
                    .copied()
                    .unwrap_or_default()
                    .map(|t| t as f64 / TICKS_PER_SECOND * 1e6 / turns.len().max(1) as f64);
                let figures = figures(turns);
                println!(
                    "{:<13} {concurrency:>4} {:<9} {:>9.0} {:>9.2} {:>9.2} {:>15} {:>16.0} {:>12.0} {:>17.0}",
                    request.name(),
                    arm.name(),
                    figures.per_second,
                    figures.p50_ms,
                    figures.p99_ms,
                    calls.get(&arm).copied().unwrap_or_default(),
                    per_write_us[0],
                    per_write_us[1],
                    per_write_us[2],
                );
                rows.push(Row {
                    request: request.name(),
                    concurrency,
                    arm: arm.name(),
                    writes_per_s: figures.per_second,
                    p50_ms: figures.p50_ms,
                    p99_ms: figures.p99_ms,
                    holdfast_cpu_us: per_write_us[0],
                    bare_cpu_us: per_write_us[1],
                    apiserver_cpu_us: per_write_us[2],
                });
                results.insert((request, concurrency, arm), figures);
            }
        }
    }
    let get = |request, concurrency, arm| {
        results
            .get(&(request, concurrency, arm))
            .context("a cell was not measured")
    };
    let create_p50_overhead_ms =
        get(Request::AppCreate, 1, Arm::Holdfast)?.p50_ms - get(Request::AppCreate, 1, Arm::None)?.p50_ms;
    let throughput_ratio_c16 = get(Request::AppCreate, 16, Arm::Holdfast)?.per_second
        / get(Request::AppCreate, 16, Arm::None)?.per_second;
    let update_throughput_ratio_c16 = get(Request::AppUpdate, 16, Arm::Holdfast)?.per_second
        / get(Request::AppUpdate, 16, Arm::None)?.per_second;
    let mut vs_bare_c16 = f64::INFINITY;
    let mut vs_bare_min = f64::INFINITY;
    let mut p99_vs_bare_max: f64 = 0.0;
    for request in REQUESTS {
        for concurrency in CONCURRENCY {
            let (ours, bare) = (
                get(request, concurrency, Arm::Holdfast)?,
                get(request, concurrency, Arm::Bare)?,
            );
            let ratio = ours.per_second / bare.per_second;
            if concurrency == 16 {
                vs_bare_c16 = vs_bare_c16.min(ratio);
            }
            vs_bare_min = vs_bare_min.min(ratio);
            p99_vs_bare_max = p99_vs_bare_max.max(ours.p99_ms / bare.p99_ms);
        }
    }
    let p99_c64_ms = get(Request::AppCreate, 64, Arm::Holdfast)?.p99_ms;
    // App CREATE against the floor of a webhook that pins (the same patch, nothing else).
    let create_p50_over_patch_floor_ms =
        get(Request::AppCreate, 1, Arm::Holdfast)?.p50_ms - get(Request::AppCreate, 1, Arm::Patch)?.p50_ms;
    let mut vs_patch_floor = BTreeMap::new();
    let mut p99_vs_patch_floor_max: f64 = 0.0;
    for concurrency in CONCURRENCY {
        let (ours, floor) = (
            get(Request::AppCreate, concurrency, Arm::Holdfast)?,
            get(Request::AppCreate, concurrency, Arm::Patch)?,
        );
        vs_patch_floor.insert(concurrency, ours.per_second / floor.per_second);
        p99_vs_patch_floor_max = p99_vs_patch_floor_max.max(ours.p99_ms / floor.p99_ms);
    }
    let vs_patch_floor_min = vs_patch_floor.values().copied().fold(f64::INFINITY, f64::min);
    let patch_floor_vs_bare_c16 = get(Request::AppCreate, 16, Arm::Patch)?.per_second
        / get(Request::AppCreate, 16, Arm::Bare)?.per_second;
    // The pin the CREATEs got is the pinned App's, through holdfast and through the constant
    // patch: both arms measured what they claim.
    for arm in [Arm::Holdfast, Arm::Patch, Arm::Policy, Arm::PolicyFloor] {
        let created =
            Api::<DynamicObject>::namespaced_with(client.clone(), &setup.namespaces[&arm], &app_resource())
                .list(&Default::default())
                .await?;
        let unpinned = created
            .items
            .iter()
            .filter(|a| {
                a.data["spec"]["fetch"][0]["image"]["url"].as_str()
                    != setup.pinned["spec"]["fetch"][0]["image"]["url"].as_str()
            })
            .count();
        ensure!(
            unpinned == 0,
            "{unpinned} of {} Apps created in the {} arm were not pinned to {}'s digest",
            created.items.len(),
            arm.name(),
            setup.app_tag
        );
    }
    // The pinning policy against the no-webhook arm and a webhook that pins (the issue's target:
    // >= 0.9x `none` at 16, <= +0.6 ms p50 at 1).
    let policy_vs_none_c16 = get(Request::AppCreate, 16, Arm::Policy)?.per_second
        / get(Request::AppCreate, 16, Arm::None)?.per_second;
    let policy_vs_patch_floor_c16 = get(Request::AppCreate, 16, Arm::Policy)?.per_second
        / get(Request::AppCreate, 16, Arm::Patch)?.per_second;
    let policy_create_p50_overhead_ms =
        get(Request::AppCreate, 1, Arm::Policy)?.p50_ms - get(Request::AppCreate, 1, Arm::None)?.p50_ms;
    let apiserver_cpu_us = |arm: Arm| {
        rows.iter()
            .find(|r| r.request == Request::AppCreate.name() && r.concurrency == 16 && r.arm == arm.name())
            .map_or(f64::NAN, |r| r.apiserver_cpu_us)
    };
    let (policy_cpu, none_cpu) = (apiserver_cpu_us(Arm::Policy), apiserver_cpu_us(Arm::None));
    // Against the floor of a policy that pins: what the pinning policy's own CEL costs.
    let policy_floor_vs_none_c16 = get(Request::AppCreate, 16, Arm::PolicyFloor)?.per_second
        / get(Request::AppCreate, 16, Arm::None)?.per_second;
    let policy_vs_policy_floor_c16 = get(Request::AppCreate, 16, Arm::Policy)?.per_second
        / get(Request::AppCreate, 16, Arm::PolicyFloor)?.per_second;
    let policy_floor_create_p50_overhead_ms =
        get(Request::AppCreate, 1, Arm::PolicyFloor)?.p50_ms - get(Request::AppCreate, 1, Arm::None)?.p50_ms;
    let floor_cpu = apiserver_cpu_us(Arm::PolicyFloor);
    bench_data::write("apiserver", &rows)?;
    println!(
        "create_p50_overhead_ms={create_p50_overhead_ms:.2} throughput_ratio_c16={throughput_ratio_c16:.2} \
         vs_bare_webhook_c16={vs_bare_c16:.2} p99_c64_ms={p99_c64_ms:.1} update_throughput_ratio_c16={update_throughput_ratio_c16:.2} \
         vs_bare_webhook_min={vs_bare_min:.2} p99_vs_bare_max={p99_vs_bare_max:.2} \
         create_p50_over_patch_floor_ms={create_p50_over_patch_floor_ms:.2} vs_patch_floor_c16={:.2} \
         vs_patch_floor_min={vs_patch_floor_min:.2} p99_vs_patch_floor_max={p99_vs_patch_floor_max:.2} \
         patch_floor_vs_bare_c16={patch_floor_vs_bare_c16:.2} policy_vs_none_c16={policy_vs_none_c16:.2} \
         policy_vs_patch_floor_c16={policy_vs_patch_floor_c16:.2} policy_create_p50_overhead_ms={policy_create_p50_overhead_ms:.2} \
         policy_apiserver_cpu_us_c16={policy_cpu:.0} none_apiserver_cpu_us_c16={none_cpu:.0} \
         policy_floor_vs_none_c16={policy_floor_vs_none_c16:.2} policy_vs_policy_floor_c16={policy_vs_policy_floor_c16:.2} \
         policy_floor_create_p50_overhead_ms={policy_floor_create_p50_overhead_ms:.2} policy_floor_apiserver_cpu_us_c16={floor_cpu:.0}",
        vs_patch_floor[&16]
    );
    Ok(())
}

/// Keeps `concurrency` requests of one kind in flight against one arm for `period`; the
/// latencies of those sent within it. Any failed write fails the benchmark.
async fn drive(
    client: &Client,
    setup: &Setup,
    arm: Arm,
    request: Request,
    concurrency: usize,
    period: Duration,
    sequence: &mut u64,
) -> Result<Vec<Duration>> {
    let namespace = setup.namespaces[&arm].clone();
    // None in an arm where only App CREATE is measured (see `set_up`).
    let owner = setup.owners.get(&arm);
    *sequence += 1;
    let turn = *sequence;
    let end = Instant::now() + period;
    let mut workers = Vec::new();
    for worker in 0..concurrency {
        let client = client.clone();
        let namespace = namespace.clone();
        let (app_tag, owner) = (setup.app_tag.clone(), owner.cloned());
        let no_owner = move || format!("no kpack Image and Build in the {} arm", arm.name());
        workers.push(tokio::spawn(async move {
            let apps: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &app_resource());
            let builds: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &kpack::resource("Build"));
            let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            let mut latencies = Vec::new();
            let mut n = 0u64;
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                n += 1;
                let name = format!("t{turn}-w{worker}-{n}");
                match request {
                    Request::AppCreate => {
                        apps.create(
                            &PostParams::default(),
                            &serde_json::from_value(app(&name, &app_tag))?,
                        )
                        .await
                        .with_context(|| format!("App CREATE in {namespace}"))?;
                    }
                    Request::AppUpdate => {
                        let patch = json!({"metadata": {"labels": {"bench.holdfast.dev/turn": name}}});
                        apps.patch(
                            &format!("update-{worker}"),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await
                        .with_context(|| format!("App UPDATE in {namespace}"))?;
                    }
                    Request::BuildCreate => {
                        let (registry_image, _) = owner.as_ref().with_context(no_owner)?;
                        let registry = app_tag.split('/').next().unwrap_or_default();
                        builds
                            .create(
                                &PostParams::default(),
                                &serde_json::from_value(self::build(&name, registry_image, registry))?,
                            )
                            .await
                            .with_context(|| format!("Build CREATE in {namespace}"))?;
                    }
                    Request::PodCreate => {
                        let (_, build) = owner.as_ref().with_context(no_owner)?;
                        pods.create(
                            &PostParams::default(),
                            &serde_json::from_value(build_pod(&name, build))?,
                        )
                        .await
                        .with_context(|| format!("Pod CREATE in {namespace}"))?;
                    }
                }
                latencies.push(sent.elapsed());
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut all = Vec::new();
    for worker in workers {
        all.extend(worker.await??);
    }
    Ok(all)
}

fn figures(all: Vec<Duration>) -> Figures {
    let per_second = all.len() as f64 / MEASURE.as_secs_f64();
    let (p50_ms, p99_ms) = latency::p50_p99_ms(all);
    Figures {
        per_second,
        p50_ms,
        p99_ms,
    }
}

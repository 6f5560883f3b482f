//! holdfast's ServiceAccounts on the local control plane, as `manifests/base` installs them:
//! their RBAC, the controller's fence (`manifests/base/controller/fence.yaml`), and clients that
//! authenticate with a token the API server issues for them and record every 403 they get.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    task::{Context as TaskContext, Poll},
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use futures::future::BoxFuture;
use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Pod, ServiceAccount},
};
use kube::{
    Api, Client, Config,
    api::{DeleteParams, PostParams},
    client::{Body, ClientBuilder},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;
use tokio::sync::watch;

use crate::Env;

/// holdfast's namespace and ServiceAccounts, as the manifests name them.
pub const NAMESPACE: &str = "holdfast-system";
pub const WEBHOOK: &str = "holdfast-webhook";
pub const CONTROLLER: &str = "holdfast-controller";
/// The controller's fence: the ValidatingAdmissionPolicy and its binding.
pub const FENCE: &str = "holdfast-controller-fence";
/// The controller's term fence: its writes only from the pod that holds the ControllerLease.
pub const TERM_FENCE: &str = "holdfast-controller-term";

pub fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

/// Runs kubectl with the environment's kubeconfig; its stdout, or its stderr as the error.
pub fn kubectl_ok(env: &Env, args: &[&str]) -> Result<String> {
    let out = env.kubectl().args(args).output()?;
    ensure!(
        out.status.success(),
        "kubectl {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The namespace, ServiceAccounts, Roles, ClusterRoles and bindings, the empty TLS Secret and
/// the controller's fences, exactly as `manifests/base` has them; returns once the API server
/// enforces the fence (the term fence is loaded the same way, through the same watch).
pub async fn install_rbac(env: &Env) -> Result<()> {
    let base = manifests().join("base");
    for path in [
        base.join("namespace.yaml"),
        base.join("rbac"),
        base.join("webhook/secret.yaml"),
        base.join("controller/fence.yaml"),
        base.join("controller/term-fence.yaml"),
    ] {
        kubectl_ok(env, &["apply", "-f", &path.display().to_string()])?;
    }
    until_fenced(env).await
}

/// The API server loads policies through its own watch, a moment after they are written: a
/// probe pod in holdfast's namespace, which the controller's RBAC lets it delete and its fence
/// does not (no `kpack.io/build` label), is deleted as a dry run with the controller's token
/// (a bounded poll: nothing to watch) until the fence refuses it.
async fn until_fenced(env: &Env) -> Result<()> {
    const PROBE: &str = "fence-probe";
    placeholder_pod(env, CONTROLLER, PROBE).await?;
    let controller = service_account_client(env, CONTROLLER, &Forbidden::new()).await?;
    let pods = Api::<Pod>::namespaced(controller, NAMESPACE);
    let dry_run = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    until_refused(FENCE, || pods.delete(PROBE, &dry_run)).await?;
    Ok(())
}

/// Polls `probe` until the API server answers it 403 naming `policy` (which it loads, and reads
/// its parameters, through watches of its own: a bounded poll, nothing to watch from here); the
/// refusal's message. Fails on any other error, or when the probe still passes after 30 s.
pub async fn until_refused<T, F>(policy: &str, probe: impl Fn() -> F) -> Result<String>
where
    F: std::future::Future<Output = kube::Result<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match probe().await {
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(policy) => return Ok(e.message),
            Err(e) => return Err(e).with_context(|| format!("probing {policy}")),
            Ok(_) if tokio::time::Instant::now() < deadline => {}
            Ok(_) => bail!("the API server still lets the probe of {policy} through after 30 s"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every request answered 403, as `METHOD path`: the evidence of a missing permission, seen
/// the moment it happens instead of after a timeout.
#[derive(Clone)]
pub struct Forbidden(Arc<watch::Sender<Vec<String>>>);

impl Default for Forbidden {
    fn default() -> Self {
        Self::new()
    }
}

impl Forbidden {
    pub fn new() -> Self {
        Self(Arc::new(watch::channel(Vec::new()).0))
    }

    pub fn requests(&self) -> Vec<String> {
        self.0.borrow().clone()
    }

    /// Resolves with the first forbidden request.
    pub async fn first(&self) -> String {
        let mut seen = self.0.subscribe();
        let first = seen.wait_for(|v| !v.is_empty()).await.map(|v| v[0].clone());
        match first {
            Ok(first) => first,
            Err(_) => std::future::pending().await,
        }
    }
}

/// The tower service between a kube client and the API server that records 403s.
struct Record<S> {
    inner: S,
    forbidden: Forbidden,
}

impl<S, B> tower::Service<http::Request<Body>> for Record<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<B>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<http::Response<B>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let what = format!(
            "{} {}{}",
            request.method(),
            request.uri().path(),
            if request.uri().query().is_some_and(|q| q.contains("watch=true")) {
                " (watch)"
            } else {
                ""
            }
        );
        let forbidden = self.forbidden.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if response.status() == http::StatusCode::FORBIDDEN {
                forbidden.0.send_modify(|v| v.push(what));
            }
            Ok(response)
        })
    }
}

/// A client that authenticates with a token the API server issues for the ServiceAccount
/// `account` of holdfast's namespace, bound to no pod (as an admin mints one by hand).
pub async fn service_account_client(env: &Env, account: &str, forbidden: &Forbidden) -> Result<Client> {
    let token = issue_token(env, account, None, Duration::from_secs(3600)).await?;
    client_with_token(env, &token, forbidden).await
}

/// A client of the environment's API server that authenticates with `token` alone.
pub async fn client_with_token(env: &Env, token: &str, forbidden: &Forbidden) -> Result<Client> {
    let kubeconfig = Kubeconfig::from_yaml(&kubeconfig_with_token(env, token)?)?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let forbidden = forbidden.clone();
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&tower::layer::layer_fn(move |inner| Record {
            inner,
            forbidden: forbidden.clone(),
        }))
        .build())
}

/// A token for the ServiceAccount `account` of holdfast's namespace bound to its pod `pod`, as
/// the kubelet projects one into a replica: the API server then names the pod in the requests'
/// user info (`authentication.kubernetes.io/pod-name`). The pod is a placeholder, created if
/// missing, that selects no node (it never runs, on the real node neither); the token lives
/// `lifetime`.
pub async fn pod_token(env: &Env, account: &str, pod: &str, lifetime: Duration) -> Result<String> {
    let created = placeholder_pod(env, account, pod).await?;
    let uid = created.metadata.uid.context("a pod without a uid")?;
    issue_token(env, account, Some((pod, &uid)), lifetime).await
}

/// The pod `pod` of the ServiceAccount `account` in holdfast's namespace, created if missing: it
/// selects no node, so it never runs (on the real node neither).
async fn placeholder_pod(env: &Env, account: &str, pod: &str) -> Result<Pod> {
    let pods = Api::<Pod>::namespaced(env.client().await?, NAMESPACE);
    let placeholder: Pod = serde_json::from_value(json!({
        "metadata": {"name": pod, "labels": {"app.kubernetes.io/name": "holdfast-placeholder"}},
        "spec": {
            "serviceAccountName": account,
            "automountServiceAccountToken": false,
            "nodeSelector": {"holdfast.dev/placeholder": "no-node-has-this"},
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "replica", "image": "registry.example/placeholder",
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))?;
    match pods.create(&PostParams::default(), &placeholder).await {
        Ok(created) => Ok(created),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(pods.get(pod).await?),
        Err(e) => Err(e).with_context(|| format!("creating the placeholder pod {pod}")),
    }
}

/// A token for the ServiceAccount `account` of holdfast's namespace, bound to the pod
/// `(name, uid)` when given.
async fn issue_token(
    env: &Env,
    account: &str,
    pod: Option<(&str, &str)>,
    lifetime: Duration,
) -> Result<String> {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(i64::try_from(lifetime.as_secs())?),
            bound_object_ref: pod.map(|(name, uid)| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
            }),
        },
        ..Default::default()
    };
    Ok(Api::<ServiceAccount>::namespaced(env.client().await?, NAMESPACE)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("requesting a token for {NAMESPACE}/{account}"))?
        .status
        .context("no token in the TokenRequest")?
        .token)
}

/// The admin's kubeconfig (server, CA) with `token` as the only credential.
pub fn kubeconfig_with_token(env: &Env, token: &str) -> Result<String> {
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(env.kubeconfig())?)?;
    let users = kubeconfig
        .get_mut("users")
        .and_then(serde_yaml::Value::as_sequence_mut)
        .context("kubeconfig without users")?;
    for user in users.iter_mut().filter_map(serde_yaml::Value::as_mapping_mut) {
        user.insert("user".into(), serde_yaml::to_value(json!({ "token": token }))?);
    }
    Ok(serde_yaml::to_string(&kubeconfig)?)
}

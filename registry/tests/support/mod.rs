//! An in-process **fake** OCI registry: a test fixture, not a registry implementation.
//!
//! It exists for the error paths a real registry cannot be made to produce on demand — a 429
//! with `Retry-After`, a manifest without `Docker-Content-Digest`, a HEAD that is not allowed,
//! a response slower than the timeout, Bearer/Basic challenges whose credentials it checks, an
//! identity-token exchange, tiny tag-list pages — and it counts every request so tests can
//! assert that a call made **no** request. The happy path against a real Distribution registry
//! is covered by the e2e suite.
//!
//! Repositories and their behaviour (tag `v1` exists unless noted):
//! - `plain/app`: a multi-arch OCI index with `Docker-Content-Digest`;
//! - `nodigest/app`: no `Docker-Content-Digest` header, on HEAD or GET;
//! - `headless/app`: HEAD answers 405;
//! - `bearer/app`: Bearer challenge; accepts tokens issued for alice's Basic credentials or for
//!   the identity token `refresh-123`;
//! - `anon-bearer/app`: Bearer challenge; also accepts the anonymous token;
//! - `static/app`: accepts the static registry token `static-token` only;
//! - `basic/app`: Basic challenge; accepts alice:secret;
//! - `ratelimited/app`: 429 with `Retry-After: 30`; `ratelimited-date/app`: with an HTTP date;
//! - `slow/app`: answers after 2 s; `concurrent/app`: answers after 200 ms;
//! - `broken/app`: 500 with a distribution error body; `baddigest/app`: a malformed digest;
//! - `moved/app`: a 307 redirect to `plain/app`;
//! - `paged/app`: 5 tags, paginated by `n`/`last` with `Link` headers;
//! - `junk/app`: one page of a million one-letter tags, then `1.0.0` and `2.0.0`;
//! - `endless/app`: pages of 1 MiB of one-letter tags, each linking to the next, forever;
//! - `maximal/app`: pages of 4 MB (a million one-letter tags, one shared buffer), each linking
//!   to the next, forever;
//! - `versions/app`: 20 version tags `1.0.0` … `1.0.19`;
//! - `offsite-I/app`: one page of versions whose `Link` names a next page of another origin,
//!   `OFFSITE_LINKS[I]`;
//! - `gated/app`: holds every manifest request until [`FakeRegistry::release`] (a registry that
//!   hangs, then answers);
//! - `unserved/app`: tag `v1` names [`UNSERVED_DIGEST`], which no manifest has (a proxy's stale
//!   answer).
//!
//! By digest, `plain/app` and `headless/app` serve their index ([`expected_digest`]; HEAD is not
//! allowed for `headless/app`); every other digest is unknown.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)] // test fixture

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{
        Arc, Mutex, Once,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use base64::{Engine as _, engine::general_purpose::STANDARD};
use holdfast_registry::{Digest, Reference, Resolver, ResolverConfig};
use sha2::{Digest as _, Sha256};

pub const ALICE: (&str, &str) = ("alice", "secret");
pub const IDENTITY_TOKEN: &str = "refresh-123";
pub const STATIC_TOKEN: &str = "static-token";
/// The digest `unserved/app:v1` names and nothing serves.
pub const UNSERVED_DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000bad";
pub const PAGED_TAGS: [&str; 5] = ["latest", "v1.0.0", "v1.1.0", "v2.0.0", "v2.0.0-rc.1"];

/// One request as the fake saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    /// The host the request was for: the request target's authority (a proxy's absolute form),
    /// else the `Host` header.
    pub host: Option<String>,
    pub path: String,
    pub query: Option<String>,
    pub authorization: Option<String>,
    pub accept: Option<String>,
    pub body: String,
}

impl Recorded {
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        url::form_urlencoded::parse(self.query.as_deref().unwrap_or_default().as_bytes())
            .into_owned()
            .collect()
    }

    pub fn body_pairs(&self) -> Vec<(String, String)> {
        url::form_urlencoded::parse(self.body.as_bytes())
            .into_owned()
            .collect()
    }
}

pub struct Registry {
    addr: Mutex<Option<SocketAddr>>,
    requests: Mutex<Vec<Recorded>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    token_ttl_secs: AtomicU64,
    /// Open once released: `gated/app` waits for it.
    released: tokio::sync::Semaphore,
}

impl Registry {
    fn new() -> Arc<Self> {
        let state = Arc::new(Registry {
            addr: Mutex::default(),
            requests: Mutex::default(),
            in_flight: AtomicUsize::default(),
            max_in_flight: AtomicUsize::default(),
            token_ttl_secs: AtomicU64::default(),
            released: tokio::sync::Semaphore::new(0),
        });
        state.token_ttl_secs.store(300, Ordering::SeqCst);
        state
    }
}

/// A running fake registry on 127.0.0.1:<random port>.
pub struct FakeRegistry {
    pub addr: SocketAddr,
    pub state: Arc<Registry>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeRegistry {
    pub async fn start() -> Self {
        let state = Registry::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        *state.addr.lock().unwrap() = Some(addr);
        let app = Router::new().fallback(handle).with_state(state.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, state, server }
    }

    /// The same fake over HTTPS, serving the certificate chain and key given (PEM).
    pub async fn start_tls(cert_pem: String, key_pem: String) -> Self {
        let state = Registry::new();
        let config =
            axum_server::tls_rustls::RustlsConfig::from_pem(cert_pem.into_bytes(), key_pem.into_bytes())
                .await
                .unwrap();
        let listening = axum_server::Handle::<SocketAddr>::new();
        let app = Router::new().fallback(handle).with_state(state.clone());
        let server =
            axum_server::bind_rustls(SocketAddr::from(([127, 0, 0, 1], 0)), config).handle(listening.clone());
        let server = tokio::spawn(async move {
            server.serve(app.into_make_service()).await.unwrap();
        });
        let addr = listening.listening().await.unwrap();
        *state.addr.lock().unwrap() = Some(addr);
        Self { addr, state, server }
    }

    /// `127.0.0.1:<port>`, the registry part of references to this fake.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.requests.lock().unwrap().clone()
    }

    pub fn count(&self, path: &str) -> usize {
        self.requests().iter().filter(|r| r.path == path).count()
    }

    pub fn max_in_flight(&self) -> usize {
        self.state.max_in_flight.load(Ordering::SeqCst)
    }

    /// `gated/app` answers from now on, and every request it holds goes on.
    pub fn release(&self) {
        self.state
            .released
            .add_permits(tokio::sync::Semaphore::MAX_PERMITS);
    }

    pub fn set_token_ttl(&self, secs: u64) {
        self.state.token_ttl_secs.store(secs, Ordering::SeqCst);
    }
}

/// The multi-arch index served for tag `v1`; its digest is what must be pinned.
/// Next pages of another origin than the registry's (the first found by the `link_header` fuzz
/// target: a scheme of its own and no host).
pub const OFFSITE_LINKS: [&str; 3] = [
    "htxst:",
    "https://elsewhere.example/v2/offsite/app/tags/list",
    "//elsewhere.example/x",
];

pub fn index_manifest(repository: &str) -> Vec<u8> {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{a}","size":512,"platform":{{"architecture":"amd64","os":"linux"}}}},{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{b}","size":512,"platform":{{"architecture":"arm64","os":"linux"}}}}],"annotations":{{"repo":"{repository}"}}}}"#,
        a = "a".repeat(64),
        b = "b".repeat(64),
    )
    .into_bytes()
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The digest the fake serves for `repository`'s tag `v1` (its [`index_manifest`]).
pub fn expected_digest(repository: &str) -> Digest {
    Digest::parse(&sha256(&index_manifest(repository))).unwrap()
}

fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A resolver that reaches `registry` over plain HTTP with a 1 s request timeout, as `tune`
/// changes it (ring installed as the process's provider first).
pub fn resolver_for(registry: &FakeRegistry, tune: impl FnOnce(&mut ResolverConfig)) -> Resolver {
    install_crypto_provider();
    let mut config = ResolverConfig {
        insecure_registries: BTreeSet::from([registry.host()]),
        request_timeout: Duration::from_secs(1),
        ..ResolverConfig::default()
    };
    tune(&mut config);
    Resolver::new(config).unwrap()
}

/// `path` (`repository[:tag]`) in `registry`.
pub fn reference(registry: &FakeRegistry, path: &str) -> Reference {
    Reference::parse(&format!("{}/{path}", registry.host())).unwrap()
}

struct InFlight<'a>(&'a Registry);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle(
    State(state): State<Arc<Registry>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let text = |name: header::HeaderName| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    state.requests.lock().unwrap().push(Recorded {
        method: method.clone(),
        host: uri
            .authority()
            .map(ToString::to_string)
            .or_else(|| text(header::HOST)),
        path: uri.path().to_owned(),
        query: uri.query().map(str::to_owned),
        authorization: text(header::AUTHORIZATION),
        accept: text(header::ACCEPT),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let _guard = InFlight(&state);

    let addr = state.addr.lock().unwrap().unwrap();
    let authorization = text(header::AUTHORIZATION);
    let path = uri.path();
    if path == "/token" {
        return token(&state, &method, authorization.as_deref(), &body);
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return not_found();
    };
    if let Some((repository, reference)) = rest.split_once("/manifests/") {
        if repository == "gated/app" {
            let _open = state.released.acquire().await;
            return serve_manifest(&method, repository, true);
        }
        manifest(addr, &method, repository, reference, authorization.as_deref()).await
    } else if let Some(repository) = rest.strip_suffix("/tags/list") {
        tags(repository, uri.query())
    } else {
        not_found()
    }
}

fn token(state: &Registry, method: &Method, authorization: Option<&str>, body: &[u8]) -> Response {
    let alice = format!("Basic {}", STANDARD.encode(format!("{}:{}", ALICE.0, ALICE.1)));
    let issued = if *method == Method::POST {
        let form: Vec<(String, String)> = url::form_urlencoded::parse(body).into_owned().collect();
        let has = |k: &str, v: &str| form.iter().any(|(fk, fv)| fk == k && fv == v);
        (has("grant_type", "refresh_token") && has("refresh_token", IDENTITY_TOKEN)).then_some("idt-token")
    } else {
        match authorization {
            None => Some("anon-token"),
            Some(a) if a == alice => Some("alice-token"),
            Some(_) => None,
        }
    };
    match issued {
        Some(token) => {
            let ttl = state.token_ttl_secs.load(Ordering::SeqCst);
            let body =
                format!(r#"{{"token":"{token}","expires_in":{ttl},"issued_at":"2024-01-01T00:00:00Z"}}"#);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        None => (
            StatusCode::UNAUTHORIZED,
            r#"{"details":"incorrect username or password"}"#,
        )
            .into_response(),
    }
}

fn bearer_challenge(addr: SocketAddr, repository: &str) -> Response {
    let challenge = format!(
        r#"Bearer realm="http://{addr}/token",service="fake-registry",scope="repository:{repository}:pull""#
    );
    unauthorized(&challenge)
}

fn unauthorized(challenge: &str) -> Response {
    let mut response = (
        StatusCode::UNAUTHORIZED,
        r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}"#,
    )
        .into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_str(challenge).unwrap(),
    );
    response
}

fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#,
    )
        .into_response()
}

/// The manifest (or its headers, for HEAD) with or without `Docker-Content-Digest`.
fn serve_manifest(method: &Method, repository: &str, with_digest: bool) -> Response {
    let body = index_manifest(repository);
    let mut response = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/vnd.oci.image.index.v1+json")
        .header(header::CONTENT_LENGTH, body.len());
    if with_digest {
        response = response.header("Docker-Content-Digest", sha256(&body));
    }
    let body = if *method == Method::HEAD { Vec::new() } else { body };
    response.body(body.into()).unwrap()
}

async fn manifest(
    addr: SocketAddr,
    method: &Method,
    repository: &str,
    reference: &str,
    authorization: Option<&str>,
) -> Response {
    if reference.starts_with("sha256:") {
        return by_digest(method, repository, reference);
    }
    if reference != "v1" && reference != "v2" {
        return not_found();
    }
    let alice = format!("Basic {}", STANDARD.encode(format!("{}:{}", ALICE.0, ALICE.1)));
    match repository {
        "plain/app" => serve_manifest(method, repository, true),
        "nodigest/app" => serve_manifest(method, repository, false),
        "headless/app" if *method == Method::HEAD => StatusCode::METHOD_NOT_ALLOWED.into_response(),
        "headless/app" => serve_manifest(method, repository, true),
        "bearer/app" => match authorization {
            Some("Bearer alice-token" | "Bearer idt-token") => serve_manifest(method, repository, true),
            _ => bearer_challenge(addr, repository),
        },
        "anon-bearer/app" => match authorization {
            Some("Bearer anon-token" | "Bearer alice-token") => serve_manifest(method, repository, true),
            _ => bearer_challenge(addr, repository),
        },
        "static/app" => match authorization {
            Some(a) if a == format!("Bearer {STATIC_TOKEN}") => serve_manifest(method, repository, true),
            _ => bearer_challenge(addr, repository),
        },
        "basic/app" => match authorization {
            Some(a) if a == alice => serve_manifest(method, repository, true),
            _ => unauthorized(r#"Basic realm="fake-registry""#),
        },
        "ratelimited/app" => (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, "30")],
            "slow down",
        )
            .into_response(),
        "ratelimited-date/app" => {
            let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
            (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, at)],
                "slow down",
            )
                .into_response()
        }
        "slow/app" => {
            tokio::time::sleep(Duration::from_secs(2)).await;
            serve_manifest(method, repository, true)
        }
        "concurrent/app" => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            serve_manifest(method, repository, true)
        }
        "broken/app" => (
            StatusCode::INTERNAL_SERVER_ERROR,
            r#"{"errors":[{"code":"UNKNOWN","message":"storage backend unavailable"}]}"#,
        )
            .into_response(),
        "moved/app" => (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, format!("/v2/plain/app/manifests/{reference}"))],
        )
            .into_response(),
        "baddigest/app" => {
            (StatusCode::OK, [("Docker-Content-Digest", "sha256:not-a-digest")]).into_response()
        }
        "unserved/app" => (StatusCode::OK, [("Docker-Content-Digest", UNSERVED_DIGEST)]).into_response(),
        _ => not_found(),
    }
}

/// A manifest by digest: the index of `plain/app` or `headless/app` under its own digest.
fn by_digest(method: &Method, repository: &str, digest: &str) -> Response {
    match repository {
        "plain/app" | "headless/app" if sha256(&index_manifest(repository)) == digest => {
            if repository == "headless/app" && *method == Method::HEAD {
                return StatusCode::METHOD_NOT_ALLOWED.into_response();
            }
            serve_manifest(method, repository, true)
        }
        _ => not_found(),
    }
}

/// `GET /v2/paged/app/tags/list[?n=N[&last=T]]`, paginated like distribution.
fn tags(repository: &str, query: Option<&str>) -> Response {
    let json = |body: String| ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    let junk = |n: usize| {
        (0..n)
            .map(|i| format!("\"{}\"", char::from(b'a' + (i % 26) as u8)))
            .collect::<Vec<_>>()
    };
    match repository {
        "paged/app" => {}
        "junk/app" => {
            // Built once: a debug build takes a while over a million strings.
            static PAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
            let page = PAGE.get_or_init(|| {
                let mut tags = junk(1_000_000);
                tags.extend(["\"1.0.0\"".to_owned(), "\"2.0.0\"".to_owned()]);
                format!(r#"{{"name":"junk/app","tags":[{}]}}"#, tags.join(","))
            });
            return json(page.clone());
        }
        "endless/app" => {
            let page = junk(256 * 1024).join(",");
            let mut response = json(format!(r#"{{"name":"endless/app","tags":[{page}]}}"#));
            response.headers_mut().insert(
                header::LINK,
                HeaderValue::from_static(r#"</v2/endless/app/tags/list?page=next>; rel="next""#),
            );
            return response;
        }
        "maximal/app" => {
            static PAGE: std::sync::OnceLock<Bytes> = std::sync::OnceLock::new();
            let page = PAGE.get_or_init(|| {
                format!(
                    r#"{{"name":"maximal/app","tags":[{}]}}"#,
                    junk(1_000_000).join(",")
                )
                .into()
            });
            let mut response = ([(header::CONTENT_TYPE, "application/json")], page.clone()).into_response();
            response.headers_mut().insert(
                header::LINK,
                HeaderValue::from_static(r#"</v2/maximal/app/tags/list?page=next>; rel="next""#),
            );
            return response;
        }
        "offsite-0/app" | "offsite-1/app" | "offsite-2/app" => {
            let i = usize::from(repository.as_bytes()[8] - b'0');
            let mut response = json(format!(r#"{{"name":"{repository}","tags":["1.0.0"]}}"#));
            response.headers_mut().insert(
                header::LINK,
                HeaderValue::from_str(&format!("<{}>; rel=\"next\"", OFFSITE_LINKS[i])).unwrap(),
            );
            return response;
        }
        "versions/app" => {
            let tags: Vec<String> = (0..20).map(|i| format!("\"1.0.{i}\"")).collect();
            return json(format!(
                r#"{{"name":"versions/app","tags":[{}]}}"#,
                tags.join(",")
            ));
        }
        _ => return not_found(),
    }
    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .into_owned()
        .collect();
    let param = |k: &str| params.iter().find(|(pk, _)| pk == k).map(|(_, v)| v.clone());
    let start = param("last").map_or(0, |last| PAGED_TAGS.iter().position(|t| *t == last).unwrap() + 1);
    let n = param("n").map_or(PAGED_TAGS.len(), |n| n.parse().unwrap());
    let end = (start + n).min(PAGED_TAGS.len());
    let page = &PAGED_TAGS[start..end];
    let body = serde_json::json!({ "name": repository, "tags": page }).to_string();
    let mut response = ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    if end < PAGED_TAGS.len() {
        let link = format!(
            r#"</v2/{repository}/tags/list?n={n}&last={}>; rel="next""#,
            page[page.len() - 1]
        );
        response
            .headers_mut()
            .insert(header::LINK, HeaderValue::from_str(&link).unwrap());
    }
    response
}

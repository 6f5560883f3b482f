//! Tag → digest resolution and tag listing over the OCI distribution API.
//!
//! One [`Resolver`] (one `reqwest::Client`, cheap to clone) serves the whole process, so the
//! token cache, the per-host concurrency budgets and the rate-limit windows are shared.
//!
//! - `HEAD /v2/<repo>/manifests/<tag>` with an `Accept` listing OCI index, OCI manifest, Docker
//!   manifest list and Docker v2 manifest, and `Docker-Content-Digest` from the answer: for a
//!   multi-arch tag that is the **index** digest, which is what must be pinned. Without the
//!   header (or if HEAD is not allowed) the manifest is fetched and hashed.
//! - `GET /v2/<repo>/tags/list`, following `Link: <…>; rel="next"` pagination on the same host.
//! - Every request has its own timeout (default 3 s: a resolution may take a challenge, a token
//!   request and a retry, and must still fit a webhook's 10 s). Callers with a hard deadline
//!   wrap the call in `tokio::time::timeout` as well.
//! - `429` opens a per-host "do not call before" window (from `Retry-After`, seconds or HTTP
//!   date); calls inside the window fail fast with [`ResolveError::RateLimited`] and send nothing.
//! - A semaphore per host bounds concurrent requests, so one slow registry cannot use up every
//!   connection; waiting for a slot counts against the request timeout.
//! - HTTPS always, except for hosts listed in [`ResolverConfig::insecure_registries`]; a
//!   registry whose certificate does not verify fails with [`ResolveError::Certificate`], which
//!   names the reason. Extra roots (a private CA) come from [`ResolverConfig::extra_roots`] and
//!   can be replaced while running ([`ExtraRoots::replace`]).
//! - Proxies: `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY` and `NO_PROXY` from the environment (reqwest
//!   reads them when the client is built).
//! - Errors carry registry and repository, never credentials; tokens and passwords are only
//!   ever put into `Authorization` headers marked sensitive.
//!
//! TLS uses rustls without a built-in provider: the process must install one
//! (`rustls::crypto::ring::default_provider().install_default()`) before [`Resolver::new`],
//! which reports [`ResolverBuildError::NoCryptoProvider`] otherwise.

use std::{
    collections::BTreeSet,
    error::Error as StdError,
    fmt::Write as _,
    sync::Arc,
    time::{Duration, SystemTime},
};

use arc_swap::ArcSwap;
use base64::{Engine as _, engine::general_purpose::STANDARD};
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde::Deserialize;
use tokio::{sync::OwnedSemaphorePermit, time::Instant};
use tracing::{debug, warn};
use url::Url;

use crate::{
    auth::{AuthCache, AuthKey, CachedAuth, Challenge, Token, TokenResponse, pick_challenge},
    credentials::{AuthConfig, Credentials},
    digest::{Digest, DigestError},
    host_gate::HostGates,
    reference::Reference,
    retry_after::parse_retry_after,
    roots::ExtraRoots,
    tag_list::read_version_tags,
};

/// The manifest media types we accept, most specific multi-platform form first.
pub const MANIFEST_MEDIA_TYPES: [&str; 4] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";
/// OAuth2 `client_id` sent when exchanging an identity token.
const CLIENT_ID: &str = "holdfast";
const MAX_TOKEN_RESPONSE_BYTES: usize = 1024 * 1024;
/// How much of an error response is read for the registry's error code.
const MAX_ERROR_BODY_BYTES: usize = 4096;

/// Resolver settings; [`Default`] suits a webhook.
#[derive(Debug, Clone)]
pub struct ResolverConfig {
    /// Timeout of each HTTP request (connect, headers and body), including the wait for a
    /// per-host slot.
    pub request_timeout: Duration,
    /// Timeout for establishing a connection (within `request_timeout`).
    pub connect_timeout: Duration,
    /// Concurrent requests per host (registry or token service).
    pub max_concurrent_per_host: usize,
    /// Hosts (`host[:port]`, as in the reference, e.g. `127.0.0.1:5000`) spoken to over plain
    /// HTTP. Everything else is HTTPS.
    pub insecure_registries: BTreeSet<String>,
    /// Extra trusted CA certificates, added to the platform's roots; shared by every resolver
    /// built from this configuration, and replaceable while they run.
    pub extra_roots: ExtraRoots,
    /// `n` sent on tag list requests; `None` lets the registry choose its page size.
    pub tag_page_size: Option<u32>,
    /// Stop following tag list pages after this many (protects against link loops).
    pub max_tag_pages: usize,
    /// At most this many bytes of tag list pages are read for one listing, all pages together.
    pub max_tag_list_total_bytes: usize,
    /// At most this many tags that parse as versions are kept from one listing (the others are
    /// dropped as they are parsed); a listing with more fails.
    pub max_version_tags: usize,
    /// Tag listings in flight at once, over all registries (each holds up to one page in
    /// memory), so that many hosts answering maximal pages cannot add up.
    pub max_concurrent_tag_lists: usize,
    /// Window used when a 429 has no (valid) `Retry-After`.
    pub default_retry_after: Duration,
    /// Upper bound on a `Retry-After` window.
    pub max_retry_after: Duration,
    /// Largest manifest read when hashing it (distribution caps manifests at 4 MiB).
    pub max_manifest_bytes: usize,
    /// Largest tag list page read (distribution's own pages are far smaller).
    pub max_tag_list_bytes: usize,
    /// `User-Agent` header.
    pub user_agent: String,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(2),
            max_concurrent_per_host: 8,
            insecure_registries: BTreeSet::new(),
            extra_roots: ExtraRoots::default(),
            tag_page_size: None,
            max_tag_pages: 100,
            max_tag_list_total_bytes: 16 * 1024 * 1024,
            max_version_tags: 10_000,
            max_concurrent_tag_lists: 4,
            default_retry_after: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(15 * 60),
            max_manifest_bytes: 4 * 1024 * 1024,
            max_tag_list_bytes: 4 * 1024 * 1024,
            user_agent: concat!("holdfast/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }
}

/// Why a [`Resolver`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ResolverBuildError {
    #[error(
        "no rustls crypto provider is installed; call \
         rustls::crypto::ring::default_provider().install_default() at startup"
    )]
    NoCryptoProvider,
    #[error("invalid root certificate PEM: {0}")]
    Certificate(String),
    #[error("building the HTTP client: {0}")]
    Client(String),
}

/// Why a resolution failed. Always names the registry and repository; never holds secrets.
/// `Clone` so a single-flight layer can hand one failure to every waiter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("{registry}/{repository}: {reference} not found")]
    NotFound {
        registry: String,
        repository: String,
        reference: String,
    },
    #[error("{registry}/{repository}: unauthorized (HTTP {status}): {detail}")]
    Unauthorized {
        registry: String,
        repository: String,
        status: u16,
        detail: String,
    },
    #[error("{registry}/{repository}: rate limited by the registry; retry in {}s", ceil_secs(*.retry_after))]
    RateLimited {
        registry: String,
        repository: String,
        retry_after: Duration,
    },
    #[error("{registry}/{repository}: no response within {after:?}")]
    Timeout {
        registry: String,
        repository: String,
        after: Duration,
    },
    #[error("{registry}/{repository}: {detail}")]
    Transport {
        registry: String,
        repository: String,
        detail: String,
    },
    /// The TLS handshake failed because the registry's certificate did not verify (an unknown
    /// issuer: a private CA not given with `--registry-ca-file`; expired; another name).
    #[error(
        "{registry}/{repository}: the registry's TLS certificate is not trusted ({detail}); for a private CA, give its certificate with --registry-ca-file"
    )]
    Certificate {
        registry: String,
        repository: String,
        detail: String,
    },
    #[error("{registry}/{repository}: unexpected HTTP {status}{detail}")]
    BadResponse {
        registry: String,
        repository: String,
        status: u16,
        detail: String,
    },
    #[error("{registry}/{repository}: {detail}")]
    Protocol {
        registry: String,
        repository: String,
        detail: String,
    },
    #[error("{registry}/{repository}: the registry returned an invalid digest {value:?}: {source}")]
    InvalidDigest {
        registry: String,
        repository: String,
        value: String,
        #[source]
        source: DigestError,
    },
    /// The registry named a digest for a tag and then did not serve that digest (a proxy or
    /// cache answering a stale or corrupt tag mapping): every fetch of a pin to it would fail.
    #[error("{registry}/{repository}: {tag} resolved to {digest}, which the registry does not serve")]
    DigestNotServed {
        registry: String,
        repository: String,
        tag: String,
        digest: String,
    },
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl ResolveError {
    /// A short, stable label (for metrics and logs).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound { .. } => "not_found",
            Self::Unauthorized { .. } => "unauthorized",
            Self::RateLimited { .. } => "rate_limited",
            Self::Timeout { .. } => "timeout",
            Self::Transport { .. } => "transport",
            Self::Certificate { .. } => "certificate",
            Self::BadResponse { .. } => "bad_response",
            Self::Protocol { .. } => "protocol",
            Self::InvalidDigest { .. } => "invalid_digest",
            Self::DigestNotServed { .. } => "digest_not_served",
        }
    }

    /// The registry host the error is about.
    pub fn registry(&self) -> &str {
        match self {
            Self::NotFound { registry, .. }
            | Self::Unauthorized { registry, .. }
            | Self::RateLimited { registry, .. }
            | Self::Timeout { registry, .. }
            | Self::Transport { registry, .. }
            | Self::Certificate { registry, .. }
            | Self::BadResponse { registry, .. }
            | Self::Protocol { registry, .. }
            | Self::InvalidDigest { registry, .. }
            | Self::DigestNotServed { registry, .. } => registry,
        }
    }

    /// The repository the error is about.
    pub fn repository(&self) -> &str {
        match self {
            Self::NotFound { repository, .. }
            | Self::Unauthorized { repository, .. }
            | Self::RateLimited { repository, .. }
            | Self::Timeout { repository, .. }
            | Self::Transport { repository, .. }
            | Self::Certificate { repository, .. }
            | Self::BadResponse { repository, .. }
            | Self::Protocol { repository, .. }
            | Self::InvalidDigest { repository, .. }
            | Self::DigestNotServed { repository, .. } => repository,
        }
    }

    /// For [`ResolveError::RateLimited`]: how long the registry asked us to wait.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// Whether the registry may answer differently later (outage, overload), as opposed to a
    /// definite answer about this reference (not found, unauthorized, invalid). A cache serves
    /// stale entries on transient errors only. An untrusted certificate is transient: it says
    /// nothing about the reference, and a renewed certificate or a corrected CA bundle fixes it,
    /// so pins already held keep being served meanwhile.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::RateLimited { .. }
            | Self::Timeout { .. }
            | Self::Transport { .. }
            | Self::Certificate { .. }
            | Self::DigestNotServed { .. } => true,
            Self::BadResponse { status, .. } => *status >= 500,
            Self::NotFound { .. }
            | Self::Unauthorized { .. }
            | Self::Protocol { .. }
            | Self::InvalidDigest { .. } => false,
        }
    }
}

/// Resolves tags to digests and lists tags. Clones share one client and all budgets.
#[derive(Clone)]
pub struct Resolver {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    /// The client and the generation of the extra roots it trusts; replaced whole before the
    /// first request after [`ExtraRoots::replace`].
    client: ArcSwap<(u64, reqwest::Client)>,
    config: ResolverConfig,
    gates: HostGates,
    auth: AuthCache,
    /// [`ResolverConfig::max_concurrent_tag_lists`].
    tag_lists: tokio::sync::Semaphore,
}

/// One repository on one registry, with the credential chosen for it.
pub(crate) struct Target<'a> {
    pub(crate) registry: String,
    pub(crate) repository: String,
    scheme: &'static str,
    auth: Option<&'a AuthConfig>,
    key: AuthKey,
}

/// What to do with a response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// Do not read it (HEAD).
    Nothing,
    /// Read at most this many bytes (an error if a successful response has more).
    UpTo(usize),
    /// Hand a successful response's body over unread, as [`Fetched::stream`], holding the host
    /// slot until it is dropped. An error response's body is read (truncated) as usual.
    Stream,
}

/// A request body.
enum Payload {
    Empty,
    Form(String),
    /// Sent as is, with its `Content-Type`.
    Bytes(HeaderValue, Bytes),
    /// Streamed once (never re-sent): `Content-Type`, `Content-Length`, body.
    Stream(HeaderValue, u64, reqwest::Body),
}

/// A request as `execute` sends it.
struct Outgoing<'a> {
    method: Method,
    url: Url,
    accept: &'a str,
    authorization: Option<HeaderValue>,
    payload: Payload,
    read: Read,
    /// Overrides [`ResolverConfig::request_timeout`] for this request (and its slot wait).
    timeout: Option<Duration>,
}

/// A request that [`Resolver::send`] may repeat after answering an auth challenge.
pub(crate) struct Request<'a> {
    pub(crate) method: Method,
    pub(crate) url: &'a Url,
    pub(crate) accept: &'a str,
    /// `Content-Type` and body.
    pub(crate) body: Option<(HeaderValue, Bytes)>,
    pub(crate) read: Read,
    pub(crate) timeout: Option<Duration>,
}

/// A response with its body read (within the request timeout, while holding the host slot).
pub(crate) struct Fetched {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// With [`Read::Stream`] and a successful status: the unread body.
    pub(crate) stream: Option<BodyStream>,
}

/// A response body being streamed; holds the host's connection slot until dropped. The request
/// timeout still bounds it.
pub(crate) struct BodyStream {
    response: reqwest::Response,
    _permit: OwnedSemaphorePermit,
}

impl BodyStream {
    /// The next chunk, `None` at the end.
    pub(crate) async fn chunk(&mut self) -> Result<Option<Bytes>, reqwest::Error> {
        self.response.chunk().await
    }
}

impl Resolver {
    /// Builds the resolver and its HTTP client. Needs an installed rustls crypto provider.
    pub fn new(config: ResolverConfig) -> Result<Self, ResolverBuildError> {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            return Err(ResolverBuildError::NoCryptoProvider);
        }
        let (generation, roots) = config.extra_roots.current();
        let client = http_client(&config, &roots)?;
        Ok(Self {
            inner: Arc::new(Inner {
                client: ArcSwap::from_pointee((generation, client)),
                gates: HostGates::new(config.max_concurrent_per_host),
                auth: AuthCache::default(),
                tag_lists: tokio::sync::Semaphore::new(config.max_concurrent_tag_lists.max(1)),
                config,
            }),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ResolverConfig {
        &self.inner.config
    }

    /// The HTTP client for the next request: a new one when the extra roots changed since the
    /// last was built (requests in flight finish on the old one; the token cache, budgets and
    /// rate-limit windows are the resolver's and carry over).
    fn client(&self) -> Result<reqwest::Client, ResolverBuildError> {
        let held = self.inner.client.load();
        if held.0 == self.inner.config.extra_roots.generation() {
            return Ok(held.1.clone());
        }
        let (generation, roots) = self.inner.config.extra_roots.current();
        let client = http_client(&self.inner.config, &roots)?;
        self.inner.client.store(Arc::new((generation, client.clone())));
        Ok(client)
    }

    /// The digest `reference` currently points at. A reference that already has a digest is
    /// returned as is, without a request (digests are immutable).
    #[tracing::instrument(
        level = "debug",
        skip_all,
        fields(registry = %reference.registry(), repository = %reference.repository(), tag = %reference.identifier())
    )]
    pub async fn resolve_digest(
        &self,
        reference: &Reference,
        credentials: &Credentials,
    ) -> Result<Digest, ResolveError> {
        if let Some(digest) = reference.digest() {
            return Ok(digest.clone());
        }
        let target = self.target(reference, credentials);
        let url = target.url(&format!("manifests/{}", reference.identifier()))?;
        let accept = MANIFEST_MEDIA_TYPES.join(", ");

        let head = self
            .authorized(&target, Method::HEAD, &url, &accept, None)
            .await?;
        match head.status {
            status if status.is_success() => match head.headers.get(DOCKER_CONTENT_DIGEST) {
                Some(value) => return target.parse_digest(value),
                None => debug!("no Docker-Content-Digest on HEAD; hashing the manifest"),
            },
            StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED => {
                debug!(
                    status = head.status.as_u16(),
                    "HEAD not supported; hashing the manifest"
                );
            }
            status => return Err(target.status_error(status, reference.identifier(), &head.body)),
        }

        let limit = Some(self.inner.config.max_manifest_bytes);
        let get = self
            .authorized(&target, Method::GET, &url, &accept, limit)
            .await?;
        if !get.status.is_success() {
            return Err(target.status_error(get.status, reference.identifier(), &get.body));
        }
        let digest = Digest::sha256_of(&get.body);
        if let Some(header) = get.headers.get(DOCKER_CONTENT_DIGEST)
            && header.as_bytes() != digest.as_str().as_bytes()
        {
            warn!(
                computed = %digest,
                header = ?header,
                "Docker-Content-Digest differs from the manifest's sha256; using the computed digest"
            );
        }
        Ok(digest)
    }

    /// Checks that the registry serves `digest`, which it named for the tag `reference`: a HEAD
    /// of the manifest by digest. A tag's digest is taken from `Docker-Content-Digest`, and a proxy
    /// or cache in front of a registry can answer a stale or corrupt mapping; a pin to a digest
    /// that is not served breaks every fetch of it. One request per new digest of a tag (callers
    /// check only a digest they do not hold), none in steady state.
    #[tracing::instrument(
        level = "debug",
        skip_all,
        fields(registry = %reference.registry(), repository = %reference.repository(), tag = %reference.identifier(), %digest)
    )]
    pub async fn confirm_served(
        &self,
        reference: &Reference,
        digest: &Digest,
        credentials: &Credentials,
    ) -> Result<(), ResolveError> {
        let target = self.target(reference, credentials);
        let url = target.url(&format!("manifests/{}", digest.as_str()))?;
        let accept = MANIFEST_MEDIA_TYPES.join(", ");
        let head = self
            .authorized(&target, Method::HEAD, &url, &accept, None)
            .await?;
        let not_served = || ResolveError::DigestNotServed {
            registry: target.registry.clone(),
            repository: target.repository.clone(),
            tag: reference.identifier().to_owned(),
            digest: digest.as_str().to_owned(),
        };
        match head.status {
            status if status.is_success() => return Ok(()),
            StatusCode::NOT_FOUND => return Err(not_served()),
            StatusCode::METHOD_NOT_ALLOWED | StatusCode::NOT_IMPLEMENTED => {
                debug!(
                    status = head.status.as_u16(),
                    "HEAD not supported; fetching the manifest by digest"
                );
            }
            status => return Err(target.status_error(status, digest.as_str(), &head.body)),
        }
        let limit = Some(self.inner.config.max_manifest_bytes);
        let get = self
            .authorized(&target, Method::GET, &url, &accept, limit)
            .await?;
        match get.status {
            status if status.is_success() && Digest::sha256_of(&get.body) == *digest => Ok(()),
            status if status.is_success() || status == StatusCode::NOT_FOUND => Err(not_served()),
            status => Err(target.status_error(status, digest.as_str(), &get.body)),
        }
    }

    /// The tags of the repository of `reference` that parse as versions (all that
    /// `tagSelection.semver` considers), in registry order, following pagination. Bounded:
    /// [`ResolverConfig::max_tag_list_bytes`] per page, [`ResolverConfig::max_tag_list_total_bytes`]
    /// and [`ResolverConfig::max_version_tags`] per listing, and
    /// [`ResolverConfig::max_concurrent_tag_lists`] listings at once.
    #[tracing::instrument(
        level = "debug",
        skip_all,
        fields(registry = %reference.registry(), repository = %reference.repository())
    )]
    pub async fn list_tags(
        &self,
        reference: &Reference,
        credentials: &Credentials,
    ) -> Result<Vec<String>, ResolveError> {
        let config = &self.inner.config;
        let target = self.target(reference, credentials);
        let _listing = tokio::time::timeout(config.request_timeout, self.inner.tag_lists.acquire())
            .await
            .map_err(|_| target.timeout(config.request_timeout))?
            .map_err(|_| target.transport("the resolver is shutting down".into()))?;
        let mut url = target.url("tags/list")?;
        if let Some(n) = config.tag_page_size {
            url.query_pairs_mut().append_pair("n", &n.to_string());
        }
        let mut tags = Vec::new();
        let mut pages = 0;
        let mut bytes = 0;
        loop {
            pages += 1;
            let room = config.max_tag_list_total_bytes.saturating_sub(bytes);
            let page = self
                .authorized(
                    &target,
                    Method::GET,
                    &url,
                    "application/json",
                    Some(config.max_tag_list_bytes.min(room)),
                )
                .await
                .map_err(|e| match e {
                    ResolveError::Protocol { detail, .. }
                        if room < config.max_tag_list_bytes && detail.starts_with("response body larger") =>
                    {
                        target.protocol(format!(
                            "tag list larger than {} bytes in all",
                            config.max_tag_list_total_bytes
                        ))
                    }
                    e => e,
                })?;
            if !page.status.is_success() {
                return Err(target.status_error(page.status, "tag list", &page.body));
            }
            bytes += page.body.len();
            // Parsing a page of up to 4 MiB is CPU work of up to a second in a debug build, and up
            // to `max_concurrent_tag_lists` pages are parsed at once: on the blocking pool, not a
            // runtime worker, so a registry answering maximal pages cannot starve the process's
            // other tasks (the controller's lease renewal missed its deadline and the process
            // exited in e2e `--test hostile_registry` while the parse ran on the workers).
            let (body, max_version_tags) = (page.body.clone(), config.max_version_tags);
            tags = tokio::task::spawn_blocking(move || {
                read_version_tags(&body, &mut tags, max_version_tags).map(|()| tags)
            })
            .await
            .map_err(|e| target.transport(format!("the tag list parser stopped: {e}")))?
            .map_err(|e| target.protocol(e.to_string()))?;
            let Some(next) = next_link(&page.headers, &url) else {
                break;
            };
            if !same_origin(&next, &url) {
                return Err(target.protocol(format!("tag list pagination points to another host: {next}")));
            }
            if pages >= config.max_tag_pages {
                return Err(target.protocol(format!("tag list has more than {} pages", config.max_tag_pages)));
            }
            url = next;
        }
        debug!(tags = tags.len(), pages, bytes, "listed version tags");
        Ok(tags)
    }

    pub(crate) fn target<'a>(&self, reference: &Reference, credentials: &'a Credentials) -> Target<'a> {
        let registry = reference.registry().to_owned();
        let repository = reference.repository();
        let auth = credentials.for_reference(reference).filter(|a| !a.is_anonymous());
        let scheme = if self.is_insecure(&registry) {
            "http"
        } else {
            "https"
        };
        let key = AuthKey {
            registry: registry.clone(),
            repository: repository.clone(),
            credential: auth.map(AuthConfig::fingerprint),
        };
        Target {
            registry,
            repository,
            scheme,
            auth,
            key,
        }
    }

    fn is_insecure(&self, host: &str) -> bool {
        self.inner
            .config
            .insecure_registries
            .iter()
            .any(|h| h.eq_ignore_ascii_case(host))
    }

    /// Sends a request to the registry, answering one auth challenge (Bearer or Basic).
    async fn authorized(
        &self,
        target: &Target<'_>,
        method: Method,
        url: &Url,
        accept: &str,
        body_limit: Option<usize>,
    ) -> Result<Fetched, ResolveError> {
        let read = body_limit.map_or(Read::Nothing, Read::UpTo);
        let request = Request {
            method,
            url,
            accept,
            body: None,
            read,
            timeout: None,
        };
        self.send(target, request).await
    }

    /// The `Authorization` a request to `target` carries before any challenge: a static
    /// registry token, or what the cache holds.
    fn cached_authorization(
        &self,
        target: &Target<'_>,
        cached: Option<&CachedAuth>,
    ) -> Result<Option<HeaderValue>, ResolveError> {
        match (target.auth.and_then(AuthConfig::registry_token_value), cached) {
            (Some(token), _) => Ok(Some(target.bearer_header(token)?)),
            (None, Some(CachedAuth::Bearer(token))) => Ok(Some(target.bearer_header(token.expose())?)),
            (None, Some(CachedAuth::Basic)) => target.basic_header(),
            (None, None) => Ok(None),
        }
    }

    /// Sends a request within the host's budgets, answering one auth challenge (Bearer or
    /// Basic) by sending it again.
    pub(crate) async fn send(
        &self,
        target: &Target<'_>,
        request: Request<'_>,
    ) -> Result<Fetched, ResolveError> {
        let static_token = target.auth.and_then(AuthConfig::registry_token_value);
        let mut cached = if static_token.is_some() {
            None
        } else {
            self.inner.auth.get(&target.key)
        };
        let mut challenged = false;
        loop {
            let authorization = self.cached_authorization(target, cached.as_ref())?;
            let payload = match &request.body {
                Some((content_type, bytes)) => Payload::Bytes(content_type.clone(), bytes.clone()),
                None => Payload::Empty,
            };
            let outgoing = Outgoing {
                method: request.method.clone(),
                url: request.url.clone(),
                accept: request.accept,
                authorization,
                payload,
                read: request.read,
                timeout: request.timeout,
            };
            let response = self.execute(target, outgoing).await?;
            if response.status != StatusCode::UNAUTHORIZED {
                return Ok(response);
            }
            self.inner.auth.invalidate(&target.key);
            if challenged || static_token.is_some() {
                return Err(target.unauthorized(
                    StatusCode::UNAUTHORIZED,
                    target.rejected_detail(),
                    &response.body,
                ));
            }
            challenged = true;
            let values = response.headers.get_all(header::WWW_AUTHENTICATE);
            let challenge = pick_challenge(values.iter().filter_map(|v| v.to_str().ok()));
            cached = Some(match challenge {
                Some(Challenge::Bearer {
                    realm,
                    service,
                    scope,
                }) => {
                    let (token, lifetime) = self
                        .fetch_token(target, &realm, service.as_deref(), scope.as_deref())
                        .await?;
                    self.inner
                        .auth
                        .insert_bearer(target.key.clone(), token.clone(), lifetime);
                    CachedAuth::Bearer(token)
                }
                Some(Challenge::Basic) if target.auth.is_some_and(AuthConfig::has_basic) => {
                    self.inner.auth.insert_basic(target.key.clone());
                    CachedAuth::Basic
                }
                Some(Challenge::Basic) => {
                    let detail = "the registry requires Basic auth and no username/password was given";
                    return Err(target.unauthorized(StatusCode::UNAUTHORIZED, detail, &response.body));
                }
                None => {
                    let detail = "no supported WWW-Authenticate challenge (Bearer or Basic)";
                    return Err(target.unauthorized(StatusCode::UNAUTHORIZED, detail, &response.body));
                }
            });
        }
    }

    /// Sends a streamed body once, with the authorization a previous request to `target` left
    /// in the cache (a stream cannot be sent again after a challenge: make an authorized
    /// request to the same repository first, e.g. the upload's `POST`).
    pub(crate) async fn send_stream(
        &self,
        target: &Target<'_>,
        method: Method,
        url: Url,
        body: (HeaderValue, u64, reqwest::Body),
        timeout: Duration,
    ) -> Result<Fetched, ResolveError> {
        let cached = self.inner.auth.get(&target.key);
        let outgoing = Outgoing {
            method,
            url,
            accept: "*/*",
            authorization: self.cached_authorization(target, cached.as_ref())?,
            payload: Payload::Stream(body.0, body.1, body.2),
            read: Read::UpTo(MAX_ERROR_BODY_BYTES),
            timeout: Some(timeout),
        };
        let response = self.execute(target, outgoing).await?;
        if response.status == StatusCode::UNAUTHORIZED {
            self.inner.auth.invalidate(&target.key);
            return Err(target.unauthorized(
                StatusCode::UNAUTHORIZED,
                target.rejected_detail(),
                &response.body,
            ));
        }
        Ok(response)
    }

    /// Gets a bearer token from the challenge's realm: anonymously, with Basic credentials, or
    /// by exchanging an identity token (OAuth2 refresh-token grant, as go-containerregistry).
    async fn fetch_token(
        &self,
        target: &Target<'_>,
        realm: &str,
        service: Option<&str>,
        scope: Option<&str>,
    ) -> Result<(Token, Duration), ResolveError> {
        let mut url =
            Url::parse(realm).map_err(|e| target.protocol(format!("invalid token realm {realm:?}: {e}")))?;
        let plain_http_allowed = target.scheme == "http" || self.is_insecure(&authority(&url));
        match url.scheme() {
            "https" => {}
            "http" if plain_http_allowed => {}
            _ => {
                return Err(target.protocol(format!(
                    "refusing token realm {realm:?}: credentials are only sent over https \
                     (or http to hosts configured as insecure)"
                )));
            }
        }
        let ours = format!("repository:{}:pull", target.repository);
        let mut scopes = vec![ours.as_str()];
        if let Some(scope) = scope.filter(|s| *s != ours) {
            scopes.push(scope);
        }
        let outgoing = match target.auth.and_then(AuthConfig::identity_token_value) {
            Some(identity_token) => {
                let mut form = url::form_urlencoded::Serializer::new(String::new());
                form.append_pair("grant_type", "refresh_token")
                    .append_pair("refresh_token", identity_token)
                    .append_pair("client_id", CLIENT_ID);
                if let Some(service) = service {
                    form.append_pair("service", service);
                }
                form.append_pair("scope", &scopes.join(" "));
                Outgoing {
                    method: Method::POST,
                    url,
                    accept: "application/json",
                    authorization: None,
                    payload: Payload::Form(form.finish()),
                    read: Read::UpTo(MAX_TOKEN_RESPONSE_BYTES),
                    timeout: None,
                }
            }
            None => {
                {
                    let mut query = url.query_pairs_mut();
                    if let Some(service) = service {
                        query.append_pair("service", service);
                    }
                    for scope in &scopes {
                        query.append_pair("scope", scope);
                    }
                }
                Outgoing {
                    method: Method::GET,
                    url,
                    accept: "application/json",
                    authorization: target.basic_header()?,
                    payload: Payload::Empty,
                    read: Read::UpTo(MAX_TOKEN_RESPONSE_BYTES),
                    timeout: None,
                }
            }
        };
        let response = self.execute(target, outgoing).await?;
        match response.status {
            status if status.is_success() => {}
            status @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) => {
                // The token service's body is not echoed: it is not the registry's error format.
                return Err(target.unauthorized(status, target.rejected_detail(), &Bytes::new()));
            }
            status => {
                return Err(ResolveError::BadResponse {
                    registry: target.registry.clone(),
                    repository: target.repository.clone(),
                    status: status.as_u16(),
                    detail: " from the token service".into(),
                });
            }
        }
        // No serde error text here: it could quote the token.
        let parsed: TokenResponse = serde_json::from_slice(&response.body)
            .map_err(|_| target.protocol("the token service returned invalid JSON".into()))?;
        parsed
            .into_token()
            .ok_or_else(|| target.protocol("the token service returned no token".into()))
    }

    /// Sends one request within the host's budgets and reads the body.
    async fn execute(&self, target: &Target<'_>, outgoing: Outgoing<'_>) -> Result<Fetched, ResolveError> {
        let config = &self.inner.config;
        let host = authority(&outgoing.url);
        if let Some(wait) = self.inner.gates.blocked_for(&host) {
            debug!(
                host,
                wait_ms = wait.as_millis() as u64,
                "inside a rate limit window; not calling the registry"
            );
            return Err(target.rate_limited(wait));
        }
        let timeout = outgoing.timeout.unwrap_or(config.request_timeout);
        let permits = self.inner.gates.permits(&host);
        let started = Instant::now();
        let permit = tokio::time::timeout(timeout, permits.acquire_owned())
            .await
            .map_err(|_| {
                warn!(
                    host,
                    "no free connection slot for this host within the request timeout"
                );
                target.timeout(timeout)
            })?
            .map_err(|_| target.transport("per-host connection budget was closed".into()))?;
        let remaining = timeout.saturating_sub(started.elapsed());
        if remaining.is_zero() {
            return Err(target.timeout(timeout));
        }

        let method = outgoing.method.clone();
        let client = self
            .client()
            .map_err(|e| target.transport(format!("building the HTTP client: {e}")))?;
        let mut request = client
            .request(outgoing.method, outgoing.url)
            .timeout(remaining)
            .header(header::ACCEPT, outgoing.accept);
        if let Some(authorization) = outgoing.authorization {
            request = request.header(header::AUTHORIZATION, authorization);
        }
        request = match outgoing.payload {
            Payload::Empty => request,
            Payload::Form(form) => request
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(form),
            Payload::Bytes(content_type, bytes) => {
                request.header(header::CONTENT_TYPE, content_type).body(bytes)
            }
            Payload::Stream(content_type, length, body) => request
                .header(header::CONTENT_TYPE, content_type)
                .header(header::CONTENT_LENGTH, length)
                .body(body),
        };
        let read = outgoing.read;
        let result = async {
            let response = request.send().await?;
            let status = response.status();
            let headers = response.headers().clone();
            let (body, stream) = match read {
                Read::Nothing => (Ok(Bytes::new()), None),
                Read::Stream if status.is_success() => (Ok(Bytes::new()), Some(response)),
                Read::UpTo(limit) if status.is_success() => (read_body(response, limit, false).await?, None),
                Read::UpTo(limit) => (
                    read_body(response, limit.min(MAX_ERROR_BODY_BYTES), true).await?,
                    None,
                ),
                Read::Stream => (read_body(response, MAX_ERROR_BODY_BYTES, true).await?, None),
            };
            Ok::<_, reqwest::Error>((status, headers, body, stream))
        }
        .await;
        let elapsed_ms = started.elapsed().as_millis() as u64;

        let (status, headers, body, stream) = match result {
            Ok(parts) => parts,
            Err(e) if e.is_timeout() => {
                warn!(host, %method, elapsed_ms, "registry request timed out");
                return Err(target.timeout(timeout));
            }
            Err(e) => {
                if let Some(reason) = untrusted_certificate(&e) {
                    warn!(host, %method, elapsed_ms, %reason, "registry certificate not trusted");
                    return Err(target.certificate(reason));
                }
                let detail = error_chain(&e);
                warn!(host, %method, elapsed_ms, error = %detail, "registry request failed");
                return Err(target.transport(detail));
            }
        };
        debug!(host, %method, status = status.as_u16(), elapsed_ms, "registry request");
        if status == StatusCode::TOO_MANY_REQUESTS {
            let retry_after = headers
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| parse_retry_after(v, SystemTime::now()))
                .unwrap_or(config.default_retry_after)
                .min(config.max_retry_after);
            self.inner.gates.block(&host, retry_after);
            warn!(
                host,
                retry_after_s = retry_after.as_secs(),
                "registry rate limit: no calls to this host until the window closes"
            );
            return Err(target.rate_limited(retry_after));
        }
        let body =
            body.map_err(|limit| target.protocol(format!("response body larger than {limit} bytes")))?;
        Ok(Fetched {
            status,
            headers,
            body,
            stream: stream.map(|response| BodyStream {
                response,
                _permit: permit,
            }),
        })
    }
}

impl Target<'_> {
    pub(crate) fn url(&self, suffix: &str) -> Result<Url, ResolveError> {
        let raw = format!(
            "{}://{}/v2/{}/{suffix}",
            self.scheme, self.registry, self.repository
        );
        Url::parse(&raw).map_err(|e| self.protocol(format!("cannot build a URL from {raw:?}: {e}")))
    }

    fn parse_digest(&self, value: &HeaderValue) -> Result<Digest, ResolveError> {
        let text = String::from_utf8_lossy(value.as_bytes()).into_owned();
        Digest::parse(text.trim()).map_err(|source| ResolveError::InvalidDigest {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            value: text,
            source,
        })
    }

    fn basic_header(&self) -> Result<Option<HeaderValue>, ResolveError> {
        let Some(auth) = self.auth.filter(|a| a.has_basic()) else {
            return Ok(None);
        };
        let encoded = STANDARD.encode(format!("{}:{}", auth.username(), auth.password()));
        self.sensitive_header(format!("Basic {encoded}")).map(Some)
    }

    fn bearer_header(&self, token: &str) -> Result<HeaderValue, ResolveError> {
        self.sensitive_header(format!("Bearer {token}"))
    }

    fn sensitive_header(&self, value: String) -> Result<HeaderValue, ResolveError> {
        let mut value = HeaderValue::try_from(value).map_err(|_| {
            self.protocol("a credential contains characters not allowed in an HTTP header".into())
        })?;
        value.set_sensitive(true);
        Ok(value)
    }

    fn rejected_detail(&self) -> &'static str {
        if self.auth.is_some() {
            "the credentials were rejected"
        } else {
            "anonymous access was denied; a secretRef with credentials for this registry is needed"
        }
    }

    pub(crate) fn status_error(&self, status: StatusCode, reference: &str, body: &Bytes) -> ResolveError {
        match status {
            StatusCode::NOT_FOUND => ResolveError::NotFound {
                registry: self.registry.clone(),
                repository: self.repository.clone(),
                reference: reference.to_owned(),
            },
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                self.unauthorized(status, self.rejected_detail(), body)
            }
            status => ResolveError::BadResponse {
                registry: self.registry.clone(),
                repository: self.repository.clone(),
                status: status.as_u16(),
                detail: registry_error(body).map(|e| format!(": {e}")).unwrap_or_default(),
            },
        }
    }

    fn unauthorized(&self, status: StatusCode, detail: &str, body: &Bytes) -> ResolveError {
        let mut detail = detail.to_owned();
        if let Some(error) = registry_error(body) {
            let _ = write!(detail, " ({error})");
        }
        ResolveError::Unauthorized {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            status: status.as_u16(),
            detail,
        }
    }

    fn rate_limited(&self, retry_after: Duration) -> ResolveError {
        ResolveError::RateLimited {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            retry_after,
        }
    }

    pub(crate) fn timeout(&self, after: Duration) -> ResolveError {
        ResolveError::Timeout {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            after,
        }
    }

    pub(crate) fn transport(&self, detail: String) -> ResolveError {
        ResolveError::Transport {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            detail,
        }
    }

    fn certificate(&self, detail: String) -> ResolveError {
        ResolveError::Certificate {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            detail,
        }
    }

    pub(crate) fn protocol(&self, detail: String) -> ResolveError {
        ResolveError::Protocol {
            registry: self.registry.clone(),
            repository: self.repository.clone(),
            detail,
        }
    }
}

/// Follow a few redirects (reqwest drops `Authorization` when the host changes) but never from
/// https to plain http: that would send the request, and what the registry answers, in clear.
fn redirect_policy() -> reqwest::redirect::Policy {
    const MAX_REDIRECTS: usize = 5;
    reqwest::redirect::Policy::custom(|attempt| {
        let downgrade =
            attempt.url().scheme() == "http" && attempt.previous().iter().any(|url| url.scheme() == "https");
        if downgrade {
            attempt.error("refusing to follow a redirect from https to http")
        } else if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
}

/// Reads at most `limit` bytes; `Err(limit)` if the body is larger, unless `truncate`.
async fn read_body(
    mut response: reqwest::Response,
    limit: usize,
    truncate: bool,
) -> Result<Result<Bytes, usize>, reqwest::Error> {
    if !truncate && response.content_length().is_some_and(|len| len > limit as u64) {
        return Ok(Err(limit));
    }
    // Sized once from the announced length (within the limit): grown by doubling, a 4 MiB tag
    // list page held up to twice its size while the buffer moved.
    let announced = response
        .content_length()
        .map_or(0, |len| usize::try_from(len).unwrap_or(limit).min(limit));
    let mut body = BytesMut::with_capacity(announced);
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            if truncate {
                body.extend_from_slice(&chunk[..room]);
                break;
            }
            return Ok(Err(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Ok(body.freeze()))
}

/// `host[:port]` of a URL: the key of the per-host budgets.
fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

pub(crate) fn same_origin(a: &Url, b: &Url) -> bool {
    a.scheme() == b.scheme()
        && a.host_str() == b.host_str()
        && a.port_or_known_default() == b.port_or_known_default()
}

/// The `rel="next"` target of the `Link` headers, resolved against the current URL.
pub(crate) fn next_link(headers: &HeaderMap, current: &Url) -> Option<Url> {
    for value in headers.get_all(header::LINK) {
        let Ok(value) = value.to_str() else { continue };
        let mut rest = value;
        while let Some(start) = rest.find('<') {
            let after_start = &rest[start + 1..];
            let end = after_start.find('>')?;
            let target = &after_start[..end];
            let params_end = after_start[end + 1..]
                .find('<')
                .map_or(after_start.len(), |i| end + 1 + i);
            let params = &after_start[end + 1..params_end];
            let is_next = params.split(';').any(|p| {
                p.trim().split_once('=').is_some_and(|(k, v)| {
                    k.trim().eq_ignore_ascii_case("rel")
                        && v.trim()
                            .trim_matches('"')
                            .split_whitespace()
                            .any(|r| r.eq_ignore_ascii_case("next"))
                })
            });
            if is_next {
                return current.join(target).ok();
            }
            rest = &after_start[params_end..];
        }
    }
    None
}

/// `CODE: message` of a distribution error body (`{"errors":[{"code":…,"message":…}]}`).
pub(crate) fn registry_error(body: &Bytes) -> Option<String> {
    #[derive(Deserialize)]
    struct Errors {
        errors: Vec<ErrorEntry>,
    }
    #[derive(Deserialize)]
    struct ErrorEntry {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let first = serde_json::from_slice::<Errors>(body)
        .ok()?
        .errors
        .into_iter()
        .next()?;
    let text = match (first.code.is_empty(), first.message.is_empty()) {
        (true, true) => return None,
        (false, true) => first.code,
        (true, false) => first.message,
        (false, false) => format!("{}: {}", first.code, first.message),
    };
    Some(text.chars().take(200).collect())
}

/// The HTTP client of a resolver: its settings, the platform's roots and `extra_roots`.
fn http_client(
    config: &ResolverConfig,
    extra_roots: &[reqwest::Certificate],
) -> Result<reqwest::Client, ResolverBuildError> {
    let mut builder = reqwest::Client::builder()
        .redirect(redirect_policy())
        .user_agent(config.user_agent.clone())
        .connect_timeout(config.connect_timeout)
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(config.max_concurrent_per_host.max(1));
    for certificate in extra_roots {
        builder = builder.add_root_certificate(certificate.clone());
    }
    builder
        .build()
        .map_err(|e| ResolverBuildError::Client(error_chain(&e)))
}

/// rustls's reason when `error` is a TLS handshake that failed on the peer's certificate. The
/// rustls error sits inside `io::Error`s (nested), whose `source()` skips what they wrap, so
/// each is opened with `get_ref`.
fn untrusted_certificate(error: &(dyn StdError + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(e @ rustls::Error::InvalidCertificate(_)) = e.downcast_ref::<rustls::Error>() {
            return Some(e.to_string());
        }
        next = match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner),
            None => e.source(),
        };
    }
    None
}

/// An error and its sources, one line (reqwest's own message omits the cause).
pub(crate) fn error_chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use rstest::rstest;

    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    fn link_headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::LINK, HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    #[rstest]
    #[case(&[r#"</v2/a/tags/list?n=2&last=b>; rel="next""#], Some("http://r.io:5000/v2/a/tags/list?n=2&last=b"))]
    #[case(&[r#"<https://r.io:5000/v2/a/tags/list?last=b>; rel=next"#], Some("https://r.io:5000/v2/a/tags/list?last=b"))]
    #[case(&[r#"</prev>; rel="prev", </next>; rel="next""#], Some("http://r.io:5000/next"))]
    #[case(&[r#"</prev>; rel="prev""#, r#"</n2>; title="x"; rel="next""#], Some("http://r.io:5000/n2"))]
    #[case(&[r#"</x>; rel="prev""#], None)]
    #[case(&[], None)]
    fn follows_next_links(#[case] values: &[&str], #[case] expected: Option<&str>) {
        let current = url("http://r.io:5000/v2/a/tags/list?n=2");
        assert_eq!(
            next_link(&link_headers(values), &current).map(String::from),
            expected.map(str::to_owned)
        );
    }

    #[test]
    fn origins() {
        assert!(same_origin(&url("https://r.io/a"), &url("https://r.io:443/b")));
        assert!(!same_origin(&url("https://r.io/a"), &url("https://evil.io/a")));
        assert!(!same_origin(&url("https://r.io/a"), &url("http://r.io/a")));
        assert_eq!(authority(&url("http://127.0.0.1:5000/v2/")), "127.0.0.1:5000");
        assert_eq!(authority(&url("https://ghcr.io/v2/")), "ghcr.io");
        assert_eq!(authority(&url("http://[::1]:5000/v2/")), "[::1]:5000");
    }

    #[test]
    fn registry_error_bodies() {
        let body = Bytes::from_static(
            br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{}}]}"#,
        );
        assert_eq!(
            registry_error(&body).as_deref(),
            Some("MANIFEST_UNKNOWN: manifest unknown")
        );
        assert_eq!(registry_error(&Bytes::from_static(b"<html>")), None);
        assert_eq!(registry_error(&Bytes::from_static(br#"{"errors":[]}"#)), None);
    }

    #[test]
    fn error_kinds_and_transience() {
        let e = ResolveError::RateLimited {
            registry: "r.io".into(),
            repository: "a".into(),
            retry_after: Duration::from_millis(1500),
        };
        assert_eq!(e.kind(), "rate_limited");
        assert!(e.is_transient());
        assert_eq!(e.retry_after(), Some(Duration::from_millis(1500)));
        assert_eq!(e.to_string(), "r.io/a: rate limited by the registry; retry in 2s");
        let e = ResolveError::BadResponse {
            registry: "r.io".into(),
            repository: "a".into(),
            status: 502,
            detail: String::new(),
        };
        assert!(e.is_transient());
        assert_eq!((e.registry(), e.repository()), ("r.io", "a"));
        let e = ResolveError::NotFound {
            registry: "r.io".into(),
            repository: "a".into(),
            reference: "v1".into(),
        };
        assert!(!e.is_transient());
        assert_eq!(e.to_string(), "r.io/a: v1 not found");
    }

    #[test]
    fn default_config_fits_a_webhook() {
        let config = ResolverConfig::default();
        assert!(config.request_timeout * 3 < Duration::from_secs(10));
        assert!(config.insecure_registries.is_empty());
    }
}

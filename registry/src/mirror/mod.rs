//! Copy digest-pinned content into a cache registry (the mirror), so fetches never need the
//! upstream registry.
//!
//! [`Copier::copy`] copies one `repo@sha256:…` — an image manifest, or an OCI index / Docker
//! manifest list with every platform manifest — and every blob it references into
//! `<mirror>/<prefix>/<source host>/<source repository>` ([`MirrorLocation`]), by digest:
//!
//! - **skip what is there**: `HEAD` on the mirror first, for manifests and blobs;
//! - **mount** a blob with `POST /v2/<repo>/blobs/uploads/?mount=<digest>&from=<repo>` when this
//!   copier has seen it in another repository of the same mirror (the registry answers `201` for
//!   a mount, or `202` with an upload to use instead);
//! - **stream** blobs: the source's `GET` body is the body of the mirror's upload `PUT`, chunk by
//!   chunk, so memory does not grow with the blob (one chunk in flight per blob, a few blobs at a
//!   time: [`CopierConfig::blob_concurrency`]);
//! - **verify**: every manifest and blob is hashed as it passes (sha256 and size); content that
//!   does not match its digest aborts the upload before it completes, so the mirror never
//!   stores it (the registry checks the `digest` of the upload as well);
//! - **resume**: a manifest is pushed only after everything it references is in the mirror, and
//!   an index after its platform manifests, so a copy cut off anywhere leaves no manifest that
//!   references missing content; running it again skips what is present;
//! - **imgpkg bundles** (config label `dev.carvel.imgpkg.bundle`): `.imgpkg/images.yml`
//!   (ImagesLock) is read from the bundle's layer as it streams, and every image it lists is
//!   copied into the **same** mirror repository before the bundle's manifest is pushed, so the
//!   mirrored bundle is fully relocated (imgpkg finds each image in the bundle's repository).
//!
//! All registry traffic goes through [`Resolver`]: its auth challenges and token cache, per-host
//! connection budgets and rate-limit windows, and plain HTTP only for configured hosts. Build
//! the resolver with the mirror (and any plain-HTTP upstream) in
//! [`ResolverConfig::insecure_registries`](crate::ResolverConfig) when they speak plain HTTP;
//! this module sets its own timeouts per request ([`CopierConfig`]).
//!
//! A blob in flight holds one of the resolver's per-host slots on the source (its `GET` body)
//! and one on the mirror (its `PUT`) until it is done. When source and mirror are the same host,
//! or several copies share one resolver, give the resolver at least
//! `2 × blob_concurrency × concurrent copies` slots per host (or the copier a resolver of its
//! own): otherwise a copy waits for a slot until its request timeout and fails (transiently).

mod contents;
mod lock;
mod naming;
mod verify;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use bytes::Bytes;
use futures::{FutureExt as _, StreamExt as _, TryStreamExt as _, future::BoxFuture};
use http::{HeaderValue, Method, StatusCode, header};
use serde::Deserialize;
use tokio::sync::mpsc::UnboundedSender;
use url::Url;

pub use lock::{BUNDLE_LABEL, IMAGES_LOCK_PATH, LockError, LockScanner, is_bundle_config, parse_images_lock};
pub use naming::{MirrorLocation, NamingError, host_component};
pub use verify::{DigestCheck, VerifyError};

use crate::{
    credentials::Credentials,
    digest::Digest,
    reference::Reference,
    resolve::{
        BodyStream, Fetched, MANIFEST_MEDIA_TYPES, Read, Request, ResolveError, Resolver, Target,
        error_chain, same_origin,
    },
};

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_CONTENT_DIGEST: &str = "docker-content-digest";
/// How much of an error answer is read.
const ERROR_BODY_BYTES: usize = 4096;
/// Blob locations remembered for mounts; the map is cleared when it is full.
const MAX_KNOWN_BLOBS: usize = 100_000;

/// Copier settings; [`CopierConfig::new`] has defaults for everything but the mirror.
#[derive(Debug, Clone)]
pub struct CopierConfig {
    /// Where copies go.
    pub mirror: MirrorLocation,
    /// Blobs of one image copied at the same time.
    pub blob_concurrency: usize,
    /// Timeout of each request that moves no blob (HEAD, manifests, upload starts).
    pub request_timeout: Duration,
    /// A blob transfer may take `request_timeout` plus its size at this rate (bytes/s).
    pub min_throughput: u64,
    /// Largest manifest or index copied (distribution caps them at 4 MiB).
    pub max_manifest_bytes: usize,
    /// Largest image config read (to find the bundle label).
    pub max_config_bytes: u64,
    /// Largest `.imgpkg/images.yml` read.
    pub max_lock_bytes: u64,
    /// Nesting limit: index → image, bundle → locked image → …
    pub max_depth: usize,
}

impl CopierConfig {
    pub fn new(mirror: MirrorLocation) -> Self {
        Self {
            mirror,
            blob_concurrency: 4,
            request_timeout: Duration::from_secs(30),
            min_throughput: 1024 * 1024,
            max_manifest_bytes: 4 * 1024 * 1024,
            max_config_bytes: 8 * 1024 * 1024,
            max_lock_bytes: 4 * 1024 * 1024,
            max_depth: 8,
        }
    }
}

/// What one [`Copier::copy`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// The mirrored reference: `<mirror>/<prefix>/<host>/<repository>@<digest>`.
    pub target: String,
    /// Manifests and indexes pushed to the mirror.
    pub manifests_copied: usize,
    /// Manifests the mirror already had (with everything below them).
    pub manifests_present: usize,
    /// Blobs uploaded.
    pub blobs_copied: usize,
    /// Blobs the mirror repository already had.
    pub blobs_present: usize,
    /// Blobs mounted from another repository of the mirror.
    pub blobs_mounted: usize,
    /// Bytes of blobs uploaded (manifests not counted).
    pub bytes_copied: u64,
    /// Images listed in the ImagesLocks of the bundles copied (each now in the same repository).
    pub bundle_images: usize,
    /// For a bundle copied from its ImagesLock: whether every image it locks is in the bundle's
    /// own repository upstream (imgpkg's test of a relocated bundle, as `imgpkg copy` leaves it,
    /// which decides whether vendir caches the bundle and whether its images are read from that
    /// repository). `None`: not a bundle, the mirror had it already (no ImagesLock read), or the
    /// source did not say.
    pub colocated_upstream: Option<bool>,
}

/// Progress of a copy, for metrics or tests ([`Copier::with_events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CopyEvent {
    BlobCopied { digest: Digest, bytes: u64 },
    BlobPresent { digest: Digest },
    BlobMounted { digest: Digest, from: String },
    ManifestPresent { digest: Digest },
    ManifestPushed { digest: Digest },
}

/// Why a copy failed. Registry errors say which side (source or mirror) and name the registry
/// and repository; none holds credentials.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{0} is not pinned to a digest; only digest references are mirrored")]
    NotPinned(String),
    #[error(transparent)]
    Naming(#[from] NamingError),
    // The causes are part of each message (one line for logs and Events), not `source()`s.
    #[error("reading the source: {0}")]
    Source(ResolveError),
    #[error("writing the mirror: {0}")]
    Mirror(ResolveError),
    #[error("{location}: {error}")]
    Verify { location: String, error: VerifyError },
    #[error("{location}: {detail}")]
    Manifest { location: String, detail: String },
    #[error("bundle {location}: {error}")]
    Bundle { location: String, error: LockError },
    #[error("{location}: nested deeper than {max} levels")]
    TooDeep { location: String, max: usize },
    /// The source's credentials (a tenant's `secretRef` Secret) could not be read; the caller's.
    #[error("credentials for the source: {0}")]
    Credentials(String),
}

impl CopyError {
    /// Whether running the copy again later may succeed (an outage, a timeout, a rate limit).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Source(e) | Self::Mirror(e) => e.is_transient(),
            Self::Credentials(_)
            | Self::NotPinned(_)
            | Self::Naming(_)
            | Self::Verify { .. }
            | Self::Manifest { .. }
            | Self::Bundle { .. }
            | Self::TooDeep { .. } => false,
        }
    }

    /// Whether copying the same digest again cannot succeed until the content upstream changes:
    /// the source does not have it (404), it does not match its digest, or it is a manifest,
    /// bundle or nesting the copier cannot copy. Such a copy is not retried while the cache
    /// entry keeps that digest. Everything else (outages, rate limits, credentials, anything the
    /// mirror answered) may pass later and is retried with backoff.
    pub fn is_permanent(&self) -> bool {
        match self {
            Self::Source(e) => matches!(
                e,
                ResolveError::NotFound { .. } | ResolveError::InvalidDigest { .. }
            ),
            Self::Mirror(_) | Self::Credentials(_) => false,
            Self::NotPinned(_)
            | Self::Naming(_)
            | Self::Verify { .. }
            | Self::Manifest { .. }
            | Self::Bundle { .. }
            | Self::TooDeep { .. } => true,
        }
    }
}

/// What [`Copier::delete`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The mirror accepted the deletion (`202`).
    Deleted,
    /// The mirror did not have the manifest (`404`): nothing to delete.
    Absent,
}

/// Why a manifest could not be deleted from the mirror.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    #[error("{0} is not a digest reference in this mirror; only the mirror's own copies are deleted")]
    NotInMirror(String),
    #[error(
        "{location}: the mirror does not allow deletes (HTTP 405); a Distribution registry needs \
         storage.delete.enabled: true (REGISTRY_STORAGE_DELETE_ENABLED=true)"
    )]
    Unsupported { location: String },
    #[error("deleting from the mirror: {0}")]
    Mirror(ResolveError),
}

/// Copies pinned content into one mirror. Cheap to share (`Arc`); copies may run concurrently.
pub struct Copier {
    resolver: Resolver,
    config: CopierConfig,
    mirror_credentials: Credentials,
    /// Digest → a repository of the mirror known to hold that blob (for mounts).
    known: Mutex<HashMap<Digest, String>>,
    events: Option<UnboundedSender<CopyEvent>>,
}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copier")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Copier {
    /// `mirror_credentials`: what the copier presents to the mirror (it needs pull and push).
    pub fn new(resolver: Resolver, config: CopierConfig, mirror_credentials: Credentials) -> Self {
        Self {
            resolver,
            config,
            mirror_credentials,
            known: Mutex::new(HashMap::new()),
            events: None,
        }
    }

    /// Sends a [`CopyEvent`] for every blob and manifest handled.
    pub fn with_events(mut self, events: UnboundedSender<CopyEvent>) -> Self {
        self.events = Some(events);
        self
    }

    pub fn config(&self) -> &CopierConfig {
        &self.config
    }

    /// Where `source` (a digest reference) is, once mirrored.
    pub fn target_for(&self, source: &Reference) -> Result<String, CopyError> {
        let digest = source
            .digest()
            .ok_or_else(|| CopyError::NotPinned(source.to_string()))?;
        Ok(self.config.mirror.pinned_for(source, digest)?)
    }

    /// Copies `source` (`repo@sha256:…`) and everything it references into the mirror;
    /// `credentials` are those for the source registries (a bundle's images may live on others).
    #[tracing::instrument(level = "debug", skip_all, fields(source = %source))]
    pub async fn copy(&self, source: &Reference, credentials: &Credentials) -> Result<CopyReport, CopyError> {
        let digest = source
            .digest()
            .ok_or_else(|| CopyError::NotPinned(source.to_string()))?;
        let target = self.target_for(source)?;
        let job = Job {
            copier: self,
            credentials,
            mirror: self.config.mirror.repository_reference(source)?,
            report: Mutex::default(),
            visited: Mutex::default(),
        };
        job.manifest(source, digest, 0).await?;
        let mut report = job.report.into_inner().unwrap_or_else(PoisonError::into_inner);
        report.target = target;
        tracing::debug!(?report, "copied");
        Ok(report)
    }

    /// Deletes the manifest `location` (`<mirror>/<prefix>/…@sha256:…`, a copy this mirror
    /// holds) with `DELETE /v2/<repository>/manifests/<digest>`. Only that manifest: the
    /// registry's garbage collection frees the blobs no manifest references any more; platform
    /// manifests of an index and the images of a bundle's ImagesLock stay (they may be shared
    /// with other copies in the same repository); the caller checks that no copy in use holds
    /// `location` ([`Copier::contents`]), since this does not.
    pub async fn delete(&self, location: &Reference) -> Result<Deletion, DeleteError> {
        let not_ours = || DeleteError::NotInMirror(location.to_string());
        let digest = location.digest().ok_or_else(not_ours)?;
        if !self.config.mirror.contains(location) {
            return Err(not_ours());
        }
        let target = self.resolver.target(location, &self.mirror_credentials);
        let url = target
            .url(&format!("manifests/{digest}"))
            .map_err(DeleteError::Mirror)?;
        let accept = MANIFEST_MEDIA_TYPES.join(", ");
        let request = Request {
            method: Method::DELETE,
            url: &url,
            accept: &accept,
            body: None,
            read: Read::UpTo(ERROR_BODY_BYTES),
            timeout: Some(self.config.request_timeout),
        };
        let answer = self
            .resolver
            .send(&target, request)
            .await
            .map_err(DeleteError::Mirror)?;
        match answer.status {
            status if status.is_success() => Ok(Deletion::Deleted),
            StatusCode::NOT_FOUND => Ok(Deletion::Absent),
            StatusCode::METHOD_NOT_ALLOWED => Err(DeleteError::Unsupported {
                location: location.to_string(),
            }),
            status => Err(DeleteError::Mirror(target.status_error(
                status,
                digest.as_str(),
                &answer.body,
            ))),
        }
    }

    fn emit(&self, event: CopyEvent) {
        if let Some(events) = &self.events {
            let _ = events.send(event);
        }
    }

    fn remember(&self, digest: &Digest, repository: &str) {
        let mut known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if known.len() >= MAX_KNOWN_BLOBS {
            known.clear();
        }
        known.insert(digest.clone(), repository.to_owned());
    }

    fn known_elsewhere(&self, digest: &Digest, repository: &str) -> Option<String> {
        let known = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        known.get(digest).filter(|r| *r != repository).cloned()
    }

    fn blob_timeout(&self, size: u64) -> Duration {
        let rate = self.config.min_throughput.max(1);
        self.config.request_timeout + Duration::from_secs(size / rate + 1)
    }
}

/// A manifest or index as far as copying needs it.
#[derive(Deserialize)]
pub(crate) struct ManifestDoc {
    #[serde(rename = "schemaVersion", default)]
    schema_version: u32,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

#[derive(Debug, Clone, Deserialize)]
struct Descriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: Digest,
    size: u64,
    #[serde(default)]
    urls: Vec<String>,
}

impl Descriptor {
    /// Foreign (non-distributable) layers are fetched from their `urls`, not from registries.
    fn is_foreign(&self) -> bool {
        !self.urls.is_empty()
            && (self.media_type.contains("foreign") || self.media_type.contains("nondistributable"))
    }
}

/// What a blob copy must also hand back, read as the blob streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Nothing,
    /// The whole blob (an image config; the size was checked against the limit).
    Bytes,
    /// `.imgpkg/images.yml` from a bundle layer.
    Lock,
}

/// One [`Copier::copy`]: the mirror repository everything goes to, and what was done.
struct Job<'a> {
    copier: &'a Copier,
    credentials: &'a Credentials,
    /// The mirror repository (no tag or digest).
    mirror: Reference,
    report: Mutex<CopyReport>,
    visited: Mutex<HashSet<Digest>>,
}

impl Job<'_> {
    fn resolver(&self) -> &Resolver {
        &self.copier.resolver
    }

    fn source<'b>(&'b self, reference: &Reference) -> Target<'b> {
        self.resolver().target(reference, self.credentials)
    }

    fn target(&self) -> Target<'_> {
        self.resolver()
            .target(&self.mirror, &self.copier.mirror_credentials)
    }

    fn count(&self, update: impl FnOnce(&mut CopyReport)) {
        update(&mut self.report.lock().unwrap_or_else(PoisonError::into_inner));
    }

    fn request<'u>(&self, method: Method, url: &'u Url, accept: &'u str, read: Read) -> Request<'u> {
        Request {
            method,
            url,
            accept,
            body: None,
            read,
            timeout: Some(self.copier.config.request_timeout),
        }
    }

    /// Copies the manifest `digest` of `source`'s repository (and all below it), pushing it last.
    fn manifest<'b>(
        &'b self,
        source: &'b Reference,
        digest: &'b Digest,
        depth: usize,
    ) -> BoxFuture<'b, Result<(), CopyError>> {
        async move {
            let location = format!("{}@{digest}", source.name());
            if depth > self.copier.config.max_depth {
                return Err(CopyError::TooDeep {
                    location,
                    max: self.copier.config.max_depth,
                });
            }
            if !self
                .visited
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(digest.clone())
            {
                return Ok(());
            }
            let accept = MANIFEST_MEDIA_TYPES.join(", ");
            let target = self.target();
            let url = target
                .url(&format!("manifests/{digest}"))
                .map_err(CopyError::Mirror)?;
            let head = self
                .resolver()
                .send(&target, self.request(Method::HEAD, &url, &accept, Read::Nothing))
                .await
                .map_err(CopyError::Mirror)?;
            if head.status.is_success() {
                self.count(|r| r.manifests_present += 1);
                self.copier.emit(CopyEvent::ManifestPresent {
                    digest: digest.clone(),
                });
                return Ok(());
            }
            if head.status != StatusCode::NOT_FOUND {
                return Err(CopyError::Mirror(target.status_error(
                    head.status,
                    digest.as_str(),
                    &head.body,
                )));
            }

            let src = self.source(source);
            let src_url = src
                .url(&format!("manifests/{digest}"))
                .map_err(CopyError::Source)?;
            let read = Read::UpTo(self.copier.config.max_manifest_bytes);
            let got = self
                .resolver()
                .send(&src, self.request(Method::GET, &src_url, &accept, read))
                .await
                .map_err(CopyError::Source)?;
            if !got.status.is_success() {
                return Err(CopyError::Source(src.status_error(
                    got.status,
                    digest.as_str(),
                    &got.body,
                )));
            }
            let mut check = DigestCheck::new(digest.clone(), None);
            check
                .update(&got.body)
                .and_then(|()| check.finish())
                .map_err(|error| CopyError::Verify {
                    location: location.clone(),
                    error,
                })?;
            let doc: ManifestDoc = serde_json::from_slice(&got.body).map_err(|e| CopyError::Manifest {
                location: location.clone(),
                detail: format!("not a manifest: {e}"),
            })?;
            let media_type = manifest_media_type(&got, &doc).ok_or_else(|| CopyError::Manifest {
                location: location.clone(),
                detail: "no media type (neither Content-Type nor mediaType names a manifest)".into(),
            })?;
            if doc.schema_version != 2 {
                return Err(CopyError::Manifest {
                    location,
                    detail: format!("schemaVersion {} is not supported (only 2)", doc.schema_version),
                });
            }

            if media_type == OCI_INDEX || media_type == DOCKER_LIST || doc.manifests.is_some() {
                for child in doc.manifests.as_deref().unwrap_or_default() {
                    self.manifest(source, &child.digest, depth + 1).await?;
                }
            } else {
                let config = doc.config.as_ref().ok_or_else(|| CopyError::Manifest {
                    location: location.clone(),
                    detail: "an image manifest without config".into(),
                })?;
                self.image(
                    source,
                    &location,
                    config,
                    doc.layers.as_deref().unwrap_or_default(),
                    depth,
                )
                .await?;
            }

            let content_type = HeaderValue::from_str(&media_type).map_err(|_| CopyError::Manifest {
                location: location.clone(),
                detail: format!("media type {media_type:?} is not a valid header value"),
            })?;
            let mut put = self.request(Method::PUT, &url, "*/*", Read::UpTo(ERROR_BODY_BYTES));
            put.body = Some((content_type, got.body.clone()));
            let pushed = self
                .resolver()
                .send(&target, put)
                .await
                .map_err(CopyError::Mirror)?;
            if pushed.status != StatusCode::CREATED {
                return Err(CopyError::Mirror(target.status_error(
                    pushed.status,
                    digest.as_str(),
                    &pushed.body,
                )));
            }
            check_stored_digest(&target, &pushed, digest)?;
            self.count(|r| r.manifests_copied += 1);
            self.copier.emit(CopyEvent::ManifestPushed {
                digest: digest.clone(),
            });
            Ok(())
        }
        .boxed()
    }

    /// An image's blobs (config first, to know whether it is a bundle) and, for a bundle, the
    /// images of its ImagesLock.
    async fn image(
        &self,
        source: &Reference,
        location: &str,
        config: &Descriptor,
        layers: &[Descriptor],
        depth: usize,
    ) -> Result<(), CopyError> {
        let max_config = self.copier.config.max_config_bytes;
        if config.size > max_config {
            return Err(CopyError::Manifest {
                location: location.to_owned(),
                detail: format!("config of {} bytes is larger than {max_config}", config.size),
            });
        }
        let config_bytes = self.blob(source, config, Want::Bytes).await?.unwrap_or_default();
        let bundle = is_bundle_config(&config_bytes);
        let want = if bundle { Want::Lock } else { Want::Nothing };
        let concurrency = self.copier.config.blob_concurrency.max(1);
        // A plain loop, not iterator adapters: their closures trip the `Send` check of the
        // boxed recursive future.
        let mut copies = Vec::with_capacity(layers.len());
        for layer in layers {
            if !layer.is_foreign() {
                copies.push(self.blob(source, layer, want));
            }
        }
        let found: Vec<Option<Vec<u8>>> = futures::stream::iter(copies)
            .buffered(concurrency)
            .try_collect()
            .await?;
        if !bundle {
            return Ok(());
        }
        let bundle_error = |error| CopyError::Bundle {
            location: location.to_owned(),
            error,
        };
        let lock =
            found.into_iter().flatten().next_back().ok_or_else(|| {
                bundle_error(LockError::Layer(format!("no {IMAGES_LOCK_PATH} in its layers")))
            })?;
        let images = parse_images_lock(&lock).map_err(bundle_error)?;
        self.count(|r| r.bundle_images += images.len());
        for image in &images {
            if let Some(digest) = image.digest() {
                self.manifest(image, digest, depth + 1).await?;
            }
        }
        if depth == 0 {
            let colocated = self.colocated(source, &images).await;
            self.count(|r| r.colocated_upstream = colocated);
        }
        Ok(())
    }

    /// Whether every image of a bundle's ImagesLock (`images`) is in the bundle's repository on
    /// its source registry, as imgpkg checks it: by its digest there (a `HEAD` for each image
    /// locked elsewhere). `None` when the source answers neither found nor not found.
    async fn colocated(&self, bundle: &Reference, images: &[Reference]) -> Option<bool> {
        let accept = MANIFEST_MEDIA_TYPES.join(", ");
        for digest in images.iter().filter_map(Reference::digest) {
            let there = Reference::parse(&format!("{}@{digest}", bundle.name())).ok()?;
            if images.contains(&there) {
                continue;
            }
            let source = self.source(&there);
            let url = source.url(&format!("manifests/{digest}")).ok()?;
            let head = self
                .resolver()
                .send(&source, self.request(Method::HEAD, &url, &accept, Read::Nothing))
                .await
                .ok()?;
            match head.status {
                status if status.is_success() => {}
                StatusCode::NOT_FOUND => return Some(false),
                _ => return None,
            }
        }
        Some(true)
    }

    /// Makes sure the mirror repository has the blob; returns what `want` asks for.
    async fn blob(
        &self,
        source: &Reference,
        blob: &Descriptor,
        want: Want,
    ) -> Result<Option<Vec<u8>>, CopyError> {
        let digest = &blob.digest;
        let target = self.target();
        let repository = target.repository.clone();
        let url = target
            .url(&format!("blobs/{digest}"))
            .map_err(CopyError::Mirror)?;
        let head = self
            .resolver()
            .send(&target, self.request(Method::HEAD, &url, "*/*", Read::Nothing))
            .await
            .map_err(CopyError::Mirror)?;
        if head.status.is_success() {
            self.count(|r| r.blobs_present += 1);
            self.copier.remember(digest, &repository);
            self.copier.emit(CopyEvent::BlobPresent {
                digest: digest.clone(),
            });
            return self.read_back(&target, blob, want).await;
        }
        if head.status != StatusCode::NOT_FOUND {
            return Err(CopyError::Mirror(target.status_error(
                head.status,
                digest.as_str(),
                &head.body,
            )));
        }

        let mut start = target.url("blobs/uploads/").map_err(CopyError::Mirror)?;
        let from = self.copier.known_elsewhere(digest, &repository);
        if let Some(from) = &from {
            start
                .query_pairs_mut()
                .append_pair("mount", digest.as_str())
                .append_pair("from", from);
        }
        let started = self
            .resolver()
            .send(
                &target,
                self.request(Method::POST, &start, "*/*", Read::UpTo(ERROR_BODY_BYTES)),
            )
            .await
            .map_err(CopyError::Mirror)?;
        if started.status == StatusCode::CREATED
            && let Some(from) = from
        {
            self.count(|r| r.blobs_mounted += 1);
            self.copier.remember(digest, &repository);
            self.copier.emit(CopyEvent::BlobMounted {
                digest: digest.clone(),
                from,
            });
            return self.read_back(&target, blob, want).await;
        }
        if started.status != StatusCode::ACCEPTED {
            return Err(CopyError::Mirror(target.status_error(
                started.status,
                "blob upload",
                &started.body,
            )));
        }
        let upload = upload_url(&target, &start, &started, digest)?;

        let src = self.source(source);
        let src_url = src.url(&format!("blobs/{digest}")).map_err(CopyError::Source)?;
        let timeout = self.copier.blob_timeout(blob.size);
        let mut get = self.request(Method::GET, &src_url, "*/*", Read::Stream);
        get.timeout = Some(timeout);
        let got = self.resolver().send(&src, get).await.map_err(CopyError::Source)?;
        let body = match got.stream {
            Some(body) if got.status.is_success() => body,
            _ => {
                return Err(CopyError::Source(src.status_error(
                    got.status,
                    digest.as_str(),
                    &got.body,
                )));
            }
        };
        let tap = Arc::new(Mutex::new(Tap::new(
            blob,
            want,
            self.copier.config.max_lock_bytes,
        )));
        let stream = reqwest::Body::wrap_stream(tapped(body, tap.clone()));
        let octets = HeaderValue::from_static("application/octet-stream");
        let put = self
            .resolver()
            .send_stream(&target, Method::PUT, upload, (octets, blob.size, stream), timeout)
            .await;
        let mut tap = std::mem::replace(
            &mut *tap.lock().unwrap_or_else(PoisonError::into_inner),
            Tap::new(blob, Want::Nothing, 0),
        );
        let location = || format!("{}@{digest}", source.name());
        match tap.failure.take() {
            Some(Failure::Source { timeout: true, .. }) => {
                return Err(CopyError::Source(src.timeout(timeout)));
            }
            Some(Failure::Source { detail, .. }) => return Err(CopyError::Source(src.transport(detail))),
            Some(Failure::Verify(error)) => {
                return Err(CopyError::Verify {
                    location: location(),
                    error,
                });
            }
            None => {}
        }
        let put = put.map_err(CopyError::Mirror)?;
        if put.status != StatusCode::CREATED {
            return Err(CopyError::Mirror(target.status_error(
                put.status,
                digest.as_str(),
                &put.body,
            )));
        }
        if !tap.finished {
            return Err(CopyError::Mirror(target.protocol(format!(
                "the registry accepted {digest} before the whole blob was sent"
            ))));
        }
        check_stored_digest(&target, &put, digest)?;
        self.count(|r| {
            r.blobs_copied += 1;
            r.bytes_copied += blob.size;
        });
        self.copier.remember(digest, &repository);
        self.copier.emit(CopyEvent::BlobCopied {
            digest: digest.clone(),
            bytes: blob.size,
        });
        tap.output().map_err(|error| CopyError::Bundle {
            location: location(),
            error,
        })
    }

    /// For a blob already in the mirror: reads (and verifies) it back if `want` needs it.
    async fn read_back(
        &self,
        target: &Target<'_>,
        blob: &Descriptor,
        want: Want,
    ) -> Result<Option<Vec<u8>>, CopyError> {
        if want == Want::Nothing {
            return Ok(None);
        }
        let digest = &blob.digest;
        let url = target
            .url(&format!("blobs/{digest}"))
            .map_err(CopyError::Mirror)?;
        let timeout = self.copier.blob_timeout(blob.size);
        let mut get = self.request(Method::GET, &url, "*/*", Read::Stream);
        get.timeout = Some(timeout);
        let got = self
            .resolver()
            .send(target, get)
            .await
            .map_err(CopyError::Mirror)?;
        let mut body = match got.stream {
            Some(body) if got.status.is_success() => body,
            _ => {
                return Err(CopyError::Mirror(target.status_error(
                    got.status,
                    digest.as_str(),
                    &got.body,
                )));
            }
        };
        let location = || format!("{}/{}@{digest}", target.registry, target.repository);
        let mut tap = Tap::new(blob, want, self.copier.config.max_lock_bytes);
        loop {
            match body.chunk().await {
                Ok(Some(chunk)) => tap.feed(&chunk),
                Ok(None) => tap.finish(),
                Err(e) if e.is_timeout() => return Err(CopyError::Mirror(target.timeout(timeout))),
                Err(e) => return Err(CopyError::Mirror(target.transport(error_chain(&e)))),
            }
            .map_err(|error| CopyError::Verify {
                location: location(),
                error,
            })?;
            if tap.finished {
                break;
            }
        }
        tap.output().map_err(|error| CopyError::Bundle {
            location: location(),
            error,
        })
    }
}

/// The media type to push a manifest with: the registry's `Content-Type` when it names a
/// manifest, else the document's `mediaType`.
fn manifest_media_type(response: &Fetched, doc: &ManifestDoc) -> Option<String> {
    let header = response
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_owned())
        .filter(|v| MANIFEST_MEDIA_TYPES.contains(&v.as_str()));
    header.or_else(|| doc.media_type.clone())
}

/// The upload URL from a `202`'s `Location`, on the mirror's own origin, with `digest=` added.
fn upload_url(
    target: &Target<'_>,
    start: &Url,
    started: &Fetched,
    digest: &Digest,
) -> Result<Url, CopyError> {
    let location = started
        .headers
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| CopyError::Mirror(target.protocol("blob upload started without a Location".into())))?;
    let mut url = start.join(location).map_err(|e| {
        CopyError::Mirror(target.protocol(format!("invalid upload Location {location:?}: {e}")))
    })?;
    if !same_origin(&url, start) {
        return Err(CopyError::Mirror(target.protocol(format!(
            "the upload Location {url} is on another host; credentials are not sent there"
        ))));
    }
    url.query_pairs_mut().append_pair("digest", digest.as_str());
    Ok(url)
}

/// A registry that names the stored digest must name ours.
fn check_stored_digest(target: &Target<'_>, response: &Fetched, digest: &Digest) -> Result<(), CopyError> {
    match response
        .headers
        .get(DOCKER_CONTENT_DIGEST)
        .and_then(|v| v.to_str().ok())
    {
        Some(stored) if stored.trim() != digest.as_str() => Err(CopyError::Mirror(
            target.protocol(format!("the mirror stored {digest} as {stored}")),
        )),
        _ => Ok(()),
    }
}

/// Why a tapped stream stopped.
enum Failure {
    Source { timeout: bool, detail: String },
    Verify(VerifyError),
}

/// What sees every chunk of a blob on its way: the digest check, and the config bytes or the
/// ImagesLock scanner when wanted.
struct Tap {
    size: u64,
    check: Option<DigestCheck>,
    bytes: Option<Vec<u8>>,
    scanner: Option<LockScanner>,
    failure: Option<Failure>,
    finished: bool,
}

impl Tap {
    fn new(blob: &Descriptor, want: Want, max_lock: u64) -> Self {
        Self {
            size: blob.size,
            check: Some(DigestCheck::new(blob.digest.clone(), Some(blob.size))),
            bytes: (want == Want::Bytes).then(Vec::new),
            scanner: (want == Want::Lock).then(|| LockScanner::new(max_lock)),
            failure: None,
            finished: false,
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<(), VerifyError> {
        if let Some(check) = &mut self.check {
            check.update(chunk)?;
        }
        if let Some(bytes) = &mut self.bytes {
            bytes.extend_from_slice(chunk);
        }
        if let Some(scanner) = &mut self.scanner {
            scanner.feed(chunk);
        }
        Ok(())
    }

    /// Verifies as soon as the declared size has been seen.
    fn finish_if_complete(&mut self) -> Result<(), VerifyError> {
        match &self.check {
            Some(check) if check.seen() == self.size => self.finish(),
            _ => Ok(()),
        }
    }

    fn finish(&mut self) -> Result<(), VerifyError> {
        if let Some(check) = self.check.take() {
            check.finish()?;
        }
        self.finished = true;
        Ok(())
    }

    fn output(self) -> Result<Option<Vec<u8>>, LockError> {
        match (self.bytes, self.scanner) {
            (Some(bytes), _) => Ok(Some(bytes)),
            (None, Some(scanner)) => scanner.finish(),
            (None, None) => Ok(None),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct StreamError(String);

/// The source body as an upload body, every chunk through `tap`; the stream fails (and the
/// upload is aborted, never completed) if the source fails or the content does not verify.
fn tapped(
    body: BodyStream,
    tap: Arc<Mutex<Tap>>,
) -> impl futures::Stream<Item = Result<Bytes, StreamError>> + Send + 'static {
    futures::stream::unfold(Some(body), move |state| {
        let tap = tap.clone();
        async move {
            let mut body = state?;
            let next = body.chunk().await;
            let mut tap = tap.lock().unwrap_or_else(PoisonError::into_inner);
            let failure = match next {
                // The last chunk is verified before it is handed on: content that does not
                // match never completes an upload (the HTTP client stops reading the body
                // once `Content-Length` bytes went out, so this cannot wait for the end).
                Ok(Some(chunk)) => match tap.feed(&chunk).and_then(|()| tap.finish_if_complete()) {
                    Ok(()) => return Some((Ok(chunk), Some(body))),
                    Err(e) => Failure::Verify(e),
                },
                Ok(None) if tap.finished => return None,
                Ok(None) => match tap.finish() {
                    Ok(()) => return None,
                    Err(e) => Failure::Verify(e),
                },
                Err(e) => Failure::Source {
                    timeout: e.is_timeout(),
                    detail: error_chain(&e),
                },
            };
            let message = match &failure {
                Failure::Verify(e) => e.to_string(),
                Failure::Source { detail, .. } => format!("reading the source: {detail}"),
            };
            tap.failure = Some(failure);
            Some((Err(StreamError(message)), None))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn descriptor(content: &[u8]) -> Descriptor {
        Descriptor {
            media_type: "application/vnd.oci.image.layer.v1.tar".into(),
            digest: Digest::sha256_of(content),
            size: content.len() as u64,
            urls: Vec::new(),
        }
    }

    #[test]
    fn tap_verifies_and_captures() {
        let blob = descriptor(br#"{"config":{"Labels":{"dev.carvel.imgpkg.bundle":"true"}}}"#);
        let mut tap = Tap::new(&blob, Want::Bytes, 0);
        let content = br#"{"config":{"Labels":{"dev.carvel.imgpkg.bundle":"true"}}}"#;
        for piece in content.chunks(7) {
            tap.feed(piece).unwrap();
        }
        tap.finish().unwrap();
        assert!(tap.finished);
        let bytes = tap.output().unwrap().unwrap();
        assert!(is_bundle_config(&bytes));

        let mut tap = Tap::new(&blob, Want::Nothing, 0);
        tap.feed(&content[..content.len() - 1]).unwrap();
        tap.feed(b"]").unwrap();
        assert!(matches!(tap.finish(), Err(VerifyError::Digest { .. })));
        assert!(!tap.finished);
    }

    #[test]
    fn tap_verifies_once_the_declared_size_is_seen() {
        let blob = descriptor(b"0123456789");
        let mut tap = Tap::new(&blob, Want::Nothing, 0);
        tap.feed(b"01234").unwrap();
        tap.finish_if_complete().unwrap();
        assert!(!tap.finished, "not all there yet");
        tap.feed(b"56789").unwrap();
        tap.finish_if_complete().unwrap();
        assert!(tap.finished, "verified without waiting for the end of the stream");

        let mut tap = Tap::new(&blob, Want::Nothing, 0);
        tap.feed(b"0123456780").unwrap();
        assert!(matches!(
            tap.finish_if_complete(),
            Err(VerifyError::Digest { .. })
        ));
    }

    #[test]
    fn foreign_layers_are_not_copied() {
        let mut layer = descriptor(b"x");
        assert!(!layer.is_foreign());
        layer.media_type = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip".into();
        assert!(!layer.is_foreign(), "only with urls");
        layer.urls = vec!["https://example.com/layer".into()];
        assert!(layer.is_foreign());
    }

    #[test]
    fn copy_errors_say_whether_to_retry() {
        let outage = ResolveError::Transport {
            registry: "r.io".into(),
            repository: "a".into(),
            detail: "connection refused".into(),
        };
        assert!(CopyError::Mirror(outage.clone()).is_transient());
        assert!(CopyError::Source(outage).is_transient());
        let verify = CopyError::Verify {
            location: "r.io/a@x".into(),
            error: VerifyError::Size {
                expected: Digest::sha256_of(b""),
                size: 1,
                actual: 2,
            },
        };
        assert!(!verify.is_transient());
        assert!(!CopyError::NotPinned("r.io/a:1".into()).is_transient());
    }

    #[test]
    fn content_problems_are_permanent_and_registry_problems_are_not() {
        let (registry, repository) = ("r.io".to_owned(), "a".to_owned());
        let not_found = ResolveError::NotFound {
            registry: registry.clone(),
            repository: repository.clone(),
            reference: "sha256:…".into(),
        };
        let unauthorized = ResolveError::Unauthorized {
            registry: registry.clone(),
            repository: repository.clone(),
            status: 401,
            detail: "denied".into(),
        };
        let outage = ResolveError::Timeout {
            registry: registry.clone(),
            repository: repository.clone(),
            after: Duration::from_secs(30),
        };
        let rejected = ResolveError::BadResponse {
            registry,
            repository,
            status: 400,
            detail: ": MANIFEST_INVALID".into(),
        };
        // Manifest unknown upstream: the digest is gone from the source.
        assert!(CopyError::Source(not_found.clone()).is_permanent());
        // Content that does not match its digest, and manifests the copier cannot copy.
        let mismatch = CopyError::Verify {
            location: "r.io/a@x".into(),
            error: VerifyError::Size {
                expected: Digest::sha256_of(b""),
                size: 1,
                actual: 2,
            },
        };
        assert!(mismatch.is_permanent());
        let unsupported = CopyError::Manifest {
            location: "r.io/a@x".into(),
            detail: "schemaVersion 1 is not supported (only 2)".into(),
        };
        assert!(unsupported.is_permanent());
        assert!(
            CopyError::TooDeep {
                location: "r.io/a@x".into(),
                max: 8
            }
            .is_permanent()
        );
        // An outage, credentials (a Secret may be fixed) and whatever the mirror answers
        // (its configuration or state, not this content) are retried.
        for error in [
            CopyError::Source(outage.clone()),
            CopyError::Source(unauthorized.clone()),
            CopyError::Mirror(outage),
            CopyError::Mirror(unauthorized),
            CopyError::Mirror(not_found),
            CopyError::Mirror(rejected),
        ] {
            assert!(!error.is_permanent(), "{error}");
        }
    }
}

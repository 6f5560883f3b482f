//! EMULATOR of kapp-controller's App fetch behaviour — a test fixture, NOT kapp-controller.
//!
//! Only what decides registry traffic is emulated, from `/work/shared/reference/kapp-controller.md`
//! ("ref §N"), and from the imgpkg and vendir sources it cites:
//!
//! - Every App is reconciled when it appears and then every `syncPeriod` (default 30 s; ref §3.1)
//!   with kapp-controller's timer: `RequeueAfter = syncPeriod − 5 s + Jitter(5 s)`, so Apps
//!   created together stay bunched (ref §3.1, `reconcile_timer.go`). The jitter here is a hash of
//!   the App's uid and sync count: the same run gives the same schedule.
//! - Each reconcile fetches every `spec.fetch[]` entry in order, as vendir does through imgpkg;
//!   any failed request fails the sync (`ReconcileFailed`, ref §3.2):
//!   - `image.url`: the manifest (`GET /v2/<repo>/manifests/<tag or digest>`), then the config
//!     blob and every layer blob.
//!   - `imgpkgBundle.image` (imgpkg `bundle.Pull`, ref §2.3): the manifest, the config (which
//!     must carry the label `dev.carvel.imgpkg.bundle`), every layer, from which
//!     `.imgpkg/images.yml` (the ImagesLock) is read; then the relocation check: the "locations"
//!     image `<bundle repo>:sha256-<hex>.image-locations.imgpkg` that `imgpkg copy` writes
//!     (found: relocated), else a `HEAD <bundle repo>@<digest>` (with imgpkg's fallback `GET`)
//!     per locked image until one is missing (404, 401 or 403). Relocated, the ImagesLock is
//!     rewritten to the bundle's repository — where kbld, and so the deployed workloads, take
//!     the images from ([`FetchStats::images_locks`]); not relocated, it keeps the images' original
//!     locations. imgpkg's pull never fetches the locked images themselves (ref §3.3).
//! - vendir's cache (ref §2.2, §2.4) is **per App** (keyed by the App's uid), per artifact type,
//!   and holds only what imgpkg reports cacheable: an image fetched **by digest**, a bundle
//!   fetched by digest **and** relocated (imgpkg `isCacheable`). A cached entry makes no registry
//!   request at all; a tag reference is fetched on every sync and never cached. The key is the
//!   bare digest (`ref.Identifier()`), not the repository (ref §2.4, kapp-controller #1603).
//! - The whole sync runs on an emulated clock: an hour of syncs takes as long as its real
//!   registry requests do. Time advances only through [`KappController::run_until`].
//!
//! Simplified: no `tagSelection` (never cacheable: a tag list per sync), no nested bundles
//! (vendir pulls them only with `recursive`), the locations image's own content is not parsed
//! (only its presence decides), no imgpkg retries (`RetryCount: 5`) or kapp-controller's 2 s
//! retry sleeps, no template/deploy steps, no `VENDIR_MAX_CACHE_SIZE` limit (the test images are
//! far below its 1 MiB), no pod restarts (a new [`KappController`] is a restarted one: empty
//! caches).

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    io::Read,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{WatchStreamExt, reflector, watcher},
};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::images::sha256_digest;

/// kapp-controller's App default (ref §3.1).
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
/// The part of the sync period replaced by jitter (ref §3.1).
const JITTER: Duration = Duration::from_secs(5);
/// Reconciles running at once (kapp-controller runs several App workers).
const WORKERS: usize = 32;
/// What imgpkg accepts when it pulls an image or a bundle (an index is not pullable).
const IMAGE_MANIFESTS: &str =
    "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";
/// What go-containerregistry's `remote.Head` accepts (the relocation check): the locked images
/// may be indexes.
const ANY_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json, \
     application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, \
     application/vnd.docker.distribution.manifest.list.v2+json";
/// The config label that makes an image a bundle (imgpkg `BundleConfigLabel`, ref §2.3).
const BUNDLE_LABEL: &str = "dev.carvel.imgpkg.bundle";
/// Where a bundle keeps its ImagesLock (ref §2.3).
const IMAGES_LOCK_FILE: &str = ".imgpkg/images.yml";

/// What the emulated reconciles did.
#[derive(Debug, Default)]
pub struct FetchStats {
    pub syncs: AtomicU64,
    pub failed_syncs: AtomicU64,
    /// Requests sent to registries.
    pub registry_requests: AtomicU64,
    /// Fetches answered from an App's vendir cache (no request).
    pub cache_hits: AtomicU64,
    /// Per App (`namespace/name`), the images of its bundles' `.imgpkg/images.yml` as its last
    /// successful sync left them for the template step (kbld): in the bundle's repository when
    /// the bundle was relocated, else where the bundle's author locked them.
    pub images_locks: Mutex<BTreeMap<String, Vec<String>>>,
}

impl FetchStats {
    pub fn snapshot(&self) -> [u64; 4] {
        [
            self.syncs.load(Ordering::Relaxed),
            self.failed_syncs.load(Ordering::Relaxed),
            self.registry_requests.load(Ordering::Relaxed),
            self.cache_hits.load(Ordering::Relaxed),
        ]
    }
}

pub struct KappController {
    apps: reflector::Store<DynamicObject>,
    resource: ApiResource,
    http: reqwest::Client,
    sync_period: Duration,
    /// Emulated milliseconds since start.
    now_ms: u64,
    /// (next sync, App key) for every App seen.
    schedule: BinaryHeap<Reverse<(u64, String)>>,
    scheduled: HashSet<String>,
    syncs_done: HashMap<String, u64>,
    /// vendir's caches, per App uid.
    caches: Arc<Mutex<HashMap<String, AppCache>>>,
    pub stats: Arc<FetchStats>,
    cancel: CancellationToken,
}

impl KappController {
    /// Watches the Apps of `namespace` (kappctrl.k14s.io/v1alpha1); fetches over plain HTTP, as
    /// the test registries serve.
    pub async fn start(client: Client, namespace: &str, sync_period: Duration) -> Result<Self> {
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("kappctrl.k14s.io", "v1alpha1", "App"));
        let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &resource);
        let writer = reflector::store::Writer::new(resource.clone());
        let apps = writer.as_reader();
        let cancel = CancellationToken::new();
        let stream = reflector(writer, watcher(api, watcher::Config::default())).applied_objects();
        let stop = cancel.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream.take_until(stop.cancelled_owned()));
            while stream.next().await.is_some() {}
        });
        apps.wait_until_ready().await.context("App watch")?;
        Ok(Self {
            apps,
            resource,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
            sync_period,
            now_ms: 0,
            schedule: BinaryHeap::new(),
            scheduled: HashSet::new(),
            syncs_done: HashMap::new(),
            caches: Arc::default(),
            stats: Arc::default(),
            cancel,
        })
    }

    /// Waits until the watch has seen `count` Apps.
    pub async fn wait_for_apps(&self, count: usize) -> Result<()> {
        tokio::time::timeout(Duration::from_secs(120), async {
            while self.apps.len() < count {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .with_context(|| format!("the App watch saw {} of {count} Apps", self.apps.len()))
    }

    pub fn now(&self) -> Duration {
        Duration::from_millis(self.now_ms)
    }

    /// Runs every sync due up to emulated time `until`, one emulated second at a time (the
    /// syncs of one second run concurrently). New Apps sync at once, as on creation.
    pub async fn run_until(&mut self, until: Duration) -> Result<()> {
        let until_ms = u64::try_from(until.as_millis()).context("emulated time overflow")?;
        while self.now_ms < until_ms {
            let tick_end = (self.now_ms + 1000).min(until_ms);
            for app in self.apps.state() {
                let key = key_of(&app);
                if self.scheduled.insert(key.clone()) {
                    self.schedule.push(Reverse((self.now_ms, key)));
                }
            }
            let mut due = Vec::new();
            while let Some(Reverse((at, _))) = self.schedule.peek()
                && *at < tick_end
            {
                let Some(Reverse((_, key))) = self.schedule.pop() else {
                    break;
                };
                due.push(key);
            }
            let syncs = due.iter().filter_map(|key| {
                let (namespace, name) = key.split_once('/')?;
                let app = self
                    .apps
                    .get(&reflector::ObjectRef::new_with(name, self.resource.clone()).within(namespace))?;
                Some(self.sync(app))
            });
            futures::stream::iter(syncs)
                .buffer_unordered(WORKERS)
                .collect::<Vec<()>>()
                .await;
            for key in due {
                let count = self.syncs_done.entry(key.clone()).or_insert(0);
                *count += 1;
                let count = *count;
                let next = self.now_ms + self.requeue_after_ms(&key, count);
                self.schedule.push(Reverse((next, key)));
            }
            self.now_ms = tick_end;
        }
        Ok(())
    }

    /// `syncPeriod − 5 s + Jitter(5 s)`, the jitter drawn from the App and its sync count.
    fn requeue_after_ms(&self, key: &str, count: u64) -> u64 {
        let mut hasher = DefaultHasher::new();
        (key, count).hash(&mut hasher);
        let jitter_ms = JITTER.as_millis() as u64;
        let base = self.sync_period.saturating_sub(JITTER).as_millis() as u64;
        base + hasher.finish() % jitter_ms.max(1)
    }

    /// One reconcile's fetch step.
    fn sync(&self, app: Arc<DynamicObject>) -> impl Future<Output = ()> + use<> {
        let (http, caches, stats) = (self.http.clone(), self.caches.clone(), self.stats.clone());
        async move {
            let uid = app.uid().unwrap_or_default();
            let sources: Vec<(Artifact, String)> = app
                .data
                .pointer("/spec/fetch")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|f| {
                    let image = f.pointer("/image/url").map(|u| (Artifact::Image, u));
                    let bundle = f.pointer("/imgpkgBundle/image").map(|u| (Artifact::Bundle, u));
                    let (artifact, url) = image.or(bundle)?;
                    Some((artifact, url.as_str()?.to_owned()))
                })
                .collect();
            let vendir = Vendir {
                registry: Registry {
                    http: &http,
                    stats: &stats,
                },
                caches: &caches,
                uid: &uid,
            };
            let mut locks = Vec::new();
            let mut ok = true;
            for (artifact, url) in sources {
                match vendir.fetch(artifact, &url).await {
                    Ok(lock) => locks.extend(lock),
                    Err(error) => {
                        tracing::debug!(%url, ?artifact, %error, "emulated kapp-controller: fetch failed");
                        ok = false;
                        break;
                    }
                }
            }
            stats.syncs.fetch_add(1, Ordering::Relaxed);
            if !ok {
                stats.failed_syncs.fetch_add(1, Ordering::Relaxed);
            } else if let Ok(mut all) = stats.images_locks.lock() {
                all.insert(key_of(&app), locks);
            }
        }
    }
}

impl Drop for KappController {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn key_of(app: &DynamicObject) -> String {
    format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any())
}

/// vendir's artifact types, part of its cache path (`.vendir-cache/fetcher/<type>/…`, ref §2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Artifact {
    Image,
    Bundle,
}

/// One App's vendir cache: per artifact type and digest identifier, the saved content as far as
/// it matters here — a bundle's ImagesLock images (none for an image).
type AppCache = HashMap<(Artifact, String), Vec<String>>;

/// `host/repository` and the tag or digest of a reference as the test registries spell it.
struct Parsed<'a> {
    host: &'a str,
    repository: &'a str,
    /// `Some` for a digest reference (vendir's cache identifier).
    digest: Option<&'a str>,
    reference: &'a str,
}

impl Parsed<'_> {
    /// `host/repository`: imgpkg's `Repo()`.
    fn repo(&self) -> String {
        format!("{}/{}", self.host, self.repository)
    }

    fn base(&self) -> String {
        format!("http://{}/v2/{}", self.host, self.repository)
    }
}

fn parse(url: &str) -> Result<Parsed<'_>> {
    let (host, path) = url.split_once('/').context("no registry host")?;
    if let Some((repository, digest)) = path.split_once('@') {
        // `repo:tag@sha256:…` keeps only the digest (ggcr NewDigest, ref §1.7).
        let repository = repository.split_once(':').map_or(repository, |(r, _)| r);
        return Ok(Parsed {
            host,
            repository,
            digest: Some(digest),
            reference: digest,
        });
    }
    let (repository, tag) = path.rsplit_once(':').unwrap_or((path, "latest"));
    Ok(Parsed {
        host,
        repository,
        digest: None,
        reference: tag,
    })
}

/// ggcr's digest check (`name.NewDigest`, which imgpkg's ImagesLock validation uses).
fn is_digest_reference(image: &str) -> bool {
    image.split_once('@').is_some_and(|(repository, digest)| {
        !repository.is_empty()
            && digest
                .strip_prefix("sha256:")
                .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    })
}

/// A registry answer the relocation check tells apart.
enum Answer {
    Found(Bytes),
    /// 404, 401 or 403: imgpkg's `imageNotFoundStatusCode`.
    Missing,
}

/// Counted requests to the registries.
struct Registry<'a> {
    http: &'a reqwest::Client,
    stats: &'a FetchStats,
}

impl Registry<'_> {
    async fn request(&self, method: Method, url: String, accept: Option<&str>) -> Result<Answer> {
        self.stats.registry_requests.fetch_add(1, Ordering::Relaxed);
        let mut request = self.http.request(method, &url);
        if let Some(accept) = accept {
            request = request.header(reqwest::header::ACCEPT, accept);
        }
        let response = request.send().await?;
        match response.status() {
            status if status.is_success() => Ok(Answer::Found(response.bytes().await?)),
            StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Ok(Answer::Missing),
            status => bail!("{url}: {status}"),
        }
    }

    async fn get(&self, url: String, accept: Option<&str>) -> Result<Bytes> {
        match self.request(Method::GET, url.clone(), accept).await? {
            Answer::Found(bytes) => Ok(bytes),
            Answer::Missing => bail!("{url}: not found"),
        }
    }

    /// The manifest (verified against a digest reference, as ggcr does) and every blob it
    /// lists, config first: `(manifest, config, layers)`.
    async fn pull(&self, parsed: &Parsed<'_>) -> Result<(Bytes, Bytes, Vec<Bytes>)> {
        let base = parsed.base();
        let manifest = self
            .get(
                format!("{base}/manifests/{}", parsed.reference),
                Some(IMAGE_MANIFESTS),
            )
            .await?;
        if let Some(digest) = parsed.digest {
            ensure!(
                sha256_digest(&manifest) == digest,
                "{base}@{digest}: manifest digest mismatch"
            );
        }
        let doc: Value = serde_json::from_slice(&manifest)?;
        let config = doc["config"]["digest"]
            .as_str()
            .context("manifest without config")?;
        let config = self.get(format!("{base}/blobs/{config}"), None).await?;
        let mut layers = Vec::new();
        for layer in doc["layers"].as_array().into_iter().flatten() {
            let digest = layer["digest"].as_str().context("layer without digest")?;
            layers.push(self.get(format!("{base}/blobs/{digest}"), None).await?);
        }
        Ok((manifest, config, layers))
    }

    /// imgpkg's `Digest` of a relocation candidate: `HEAD`, and on any failure `GET`.
    async fn exists(&self, reference: &str) -> Result<bool> {
        let parsed = parse(reference)?;
        let url = format!("{}/manifests/{}", parsed.base(), parsed.reference);
        if let Ok(Answer::Found(_)) = self.request(Method::HEAD, url.clone(), Some(ANY_MANIFEST)).await {
            return Ok(true);
        }
        Ok(matches!(
            self.request(Method::GET, url, Some(ANY_MANIFEST)).await?,
            Answer::Found(_)
        ))
    }

    /// imgpkg's `UpdateRelativeToRepo` for the bundle `bundle` whose manifest has
    /// `bundle_digest`: whether every locked image is in the bundle's repository — the locations
    /// image says so, or each image is checked until one is missing.
    async fn relocated(&self, bundle: &Parsed<'_>, bundle_digest: &str, lock: &[String]) -> Result<bool> {
        let base = bundle.base();
        let locations = format!("{base}/manifests/{}", locations_tag(bundle_digest)?);
        if let Answer::Found(manifest) = self
            .request(Method::GET, locations, Some(IMAGE_MANIFESTS))
            .await?
        {
            // imgpkg reads its one layer (`locationsSingleLayerReader`).
            let doc: Value = serde_json::from_slice(&manifest)?;
            let layers = doc["layers"].as_array().map_or(0, Vec::len);
            ensure!(layers == 1, "locations image with {layers} layers, expected 1");
            let layer = doc["layers"][0]["digest"]
                .as_str()
                .context("layer without digest")?;
            self.get(format!("{base}/blobs/{layer}"), None).await?;
            return Ok(true);
        }
        for candidate in relocation_candidates(lock, &bundle.repo())? {
            if !self.exists(&candidate).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// vendir's fetch of one App's entry, with that App's cache.
struct Vendir<'a> {
    registry: Registry<'a>,
    caches: &'a Mutex<HashMap<String, AppCache>>,
    uid: &'a str,
}

impl Vendir<'_> {
    /// From the App's cache for a digest it holds, else pulled (and saved when imgpkg says it is
    /// cacheable); returns the ImagesLock images a bundle leaves for the templates.
    async fn fetch(&self, artifact: Artifact, url: &str) -> Result<Vec<String>> {
        let parsed = parse(url)?;
        if let Some(digest) = parsed.digest {
            let cache = self
                .caches
                .lock()
                .map_err(|_| anyhow::anyhow!("cache lock poisoned"))?;
            if let Some(saved) = cache
                .get(self.uid)
                .and_then(|c| c.get(&(artifact, digest.to_owned())))
            {
                self.registry.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(saved.clone());
            }
        }
        let (lock, relocated) = match artifact {
            Artifact::Image => {
                self.registry.pull(&parsed).await?;
                (Vec::new(), true)
            }
            Artifact::Bundle => self.pull_bundle(&parsed).await?,
        };
        // imgpkg `isCacheable`: by digest, and a bundle only relocated.
        if let Some(digest) = parsed.digest.filter(|_| relocated) {
            self.caches
                .lock()
                .map_err(|_| anyhow::anyhow!("cache lock poisoned"))?
                .entry(self.uid.to_owned())
                .or_default()
                .insert((artifact, digest.to_owned()), lock.clone());
        }
        Ok(lock)
    }

    /// imgpkg `bundle.Pull` (not recursive): the ImagesLock as pulled and whether the bundle is
    /// relocated.
    async fn pull_bundle(&self, parsed: &Parsed<'_>) -> Result<(Vec<String>, bool)> {
        let (manifest, config, layers) = self.registry.pull(parsed).await?;
        ensure!(
            is_bundle_config(&config)?,
            "Expected bundle image but found plain image"
        );
        let lock = images_lock_in(&layers)?.context("bundle without .imgpkg/images.yml")?;
        let lock = parse_images_lock(&lock)?;
        let relocated = self
            .registry
            .relocated(parsed, &sha256_digest(&manifest), &lock)
            .await?;
        let lock = if relocated {
            relocation_candidates(&lock, &parsed.repo())?
        } else {
            lock
        };
        Ok((lock, relocated))
    }
}

/// The tag of a bundle's locations image (imgpkg `locationsTagFmt`: `<algorithm>-<hex>.image-locations.imgpkg`).
fn locations_tag(bundle_digest: &str) -> Result<String> {
    let (algorithm, hex) = bundle_digest.split_once(':').context("not a digest")?;
    Ok(format!("{algorithm}-{hex}.image-locations.imgpkg"))
}

/// imgpkg `replaceImageRepo`: each locked image in the bundle's repository, by its digest.
fn relocation_candidates(lock: &[String], bundle_repo: &str) -> Result<Vec<String>> {
    lock.iter()
        .map(|image| {
            let (_, digest) = image
                .split_once('@')
                .with_context(|| format!("{image:?} does not contain a digest"))?;
            Ok(format!("{bundle_repo}@{digest}"))
        })
        .collect()
}

/// Whether an image config carries the bundle label (imgpkg `IsBundle`: present, any value).
fn is_bundle_config(config: &[u8]) -> Result<bool> {
    let config: Value = serde_json::from_slice(config).context("image config")?;
    Ok(config
        .pointer("/config/Labels")
        .and_then(Value::as_object)
        .is_some_and(|labels| labels.contains_key(BUNDLE_LABEL)))
}

/// `.imgpkg/images.yml` as imgpkg's extraction of the layers in order leaves it (a later layer's
/// file wins); layers are tar, gzip-compressed or not (ggcr tells them apart by magic bytes).
fn images_lock_in(layers: &[Bytes]) -> Result<Option<Vec<u8>>> {
    let mut found = None;
    for layer in layers {
        let reader: Box<dyn Read + '_> = if layer.starts_with(&[0x1f, 0x8b]) {
            Box::new(flate2::read::GzDecoder::new(&layer[..]))
        } else {
            Box::new(&layer[..])
        };
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().context("bundle layer")? {
            let mut entry = entry.context("bundle layer")?;
            let path = entry.path()?.to_string_lossy().into_owned();
            let path = path.trim_start_matches("./").trim_start_matches('/');
            if path == IMAGES_LOCK_FILE {
                let mut content = Vec::new();
                entry.read_to_end(&mut content)?;
                found = Some(content);
            }
        }
    }
    Ok(found)
}

/// imgpkg's `lockconfig.ImagesLock`, read strictly (`yaml.UnmarshalStrict`: unknown fields fail).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ImagesLock {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    images: Vec<LockedImage>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LockedImage {
    #[serde(default)]
    image: String,
    /// Read so that the strict parse accepts it; the emulator has no use for it.
    #[serde(default, rename = "annotations")]
    _annotations: BTreeMap<String, String>,
}

/// The images of an ImagesLock, validated as imgpkg does (`NewImagesLockFromBytes`): apiVersion
/// `imgpkg.carvel.dev/v1alpha1`, kind `ImagesLock`, every image a digest reference.
fn parse_images_lock(bytes: &[u8]) -> Result<Vec<String>> {
    let lock: ImagesLock = serde_yaml::from_slice(bytes).context("Unmarshaling images lock")?;
    ensure!(
        lock.api_version == "imgpkg.carvel.dev/v1alpha1",
        "Validating apiVersion: Unknown version {:?}",
        lock.api_version
    );
    ensure!(
        lock.kind == "ImagesLock",
        "Validating kind: Unknown kind {:?}",
        lock.kind
    );
    lock.images
        .into_iter()
        .map(|i| {
            ensure!(
                is_digest_reference(&i.image),
                "Expected ref to be in digest form, got '{}'",
                i.image
            );
            Ok(i.image)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_like_vendir_keys_them() {
        let tag = parse("127.0.0.1:5000/team/cfg:1.0.0").unwrap();
        assert_eq!(
            (tag.host, tag.repository, tag.reference),
            ("127.0.0.1:5000", "team/cfg", "1.0.0")
        );
        assert!(tag.digest.is_none());
        let digest = format!("sha256:{}", "a".repeat(64));
        let url = format!("127.0.0.1:5000/team/cfg:1.0.0@{digest}");
        let pinned = parse(&url).unwrap();
        assert_eq!(pinned.repository, "team/cfg");
        assert_eq!(pinned.digest, Some(digest.as_str()));
        assert_eq!(parse("127.0.0.1:5000/team/cfg").unwrap().reference, "latest");
    }

    fn digest(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    #[test]
    fn images_locks_are_read_as_imgpkg_writes_and_validates_them() {
        // imgpkg's `AsBytes`: a document marker, keys sorted, the kbld annotation.
        let written = format!(
            "---\napiVersion: imgpkg.carvel.dev/v1alpha1\nimages:\n- annotations:\n    \
             kbld.carvel.dev/id: other.io/team/one:1\n  image: other.io/team/one@{}\n- image: \
             127.0.0.1:5000/images/two@{}\nkind: ImagesLock\n",
            digest('a'),
            digest('b')
        );
        assert_eq!(
            parse_images_lock(written.as_bytes()).unwrap(),
            [
                format!("other.io/team/one@{}", digest('a')),
                format!("127.0.0.1:5000/images/two@{}", digest('b'))
            ]
        );
        let empty = "apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\n";
        assert!(parse_images_lock(empty.as_bytes()).unwrap().is_empty());

        let header = "apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\n";
        for (bad, why) in [
            (
                "apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: BundleLock\n".to_owned(),
                "kind",
            ),
            ("apiVersion: v1\nkind: ImagesLock\n".to_owned(), "apiVersion"),
            (format!("{header}extra: 1\n"), "unknown top-level field"),
            (
                format!("{header}images:\n- image: a.io/x@{}\n  url: y\n", digest('a')),
                "unknown image field",
            ),
            (format!("{header}images:\n- image: a.io/x:1.0\n"), "tag"),
            (
                format!("{header}images:\n- image: a.io/x@sha256:abc\n"),
                "short digest",
            ),
        ] {
            assert!(
                parse_images_lock(bad.as_bytes()).is_err(),
                "accepted ({why}): {bad}"
            );
        }
    }

    #[test]
    fn locked_images_relocate_into_the_bundle_repository_by_digest() {
        let lock = [
            format!("up.io/images/one@{}", digest('a')),
            format!("other.io/x/two:1.0@{}", digest('b')),
        ];
        assert_eq!(
            relocation_candidates(&lock, "m.io/mirror/up.io/bundles/app").unwrap(),
            [
                format!("m.io/mirror/up.io/bundles/app@{}", digest('a')),
                format!("m.io/mirror/up.io/bundles/app@{}", digest('b'))
            ]
        );
        assert!(relocation_candidates(&["up.io/images/one:1".into()], "m.io/b").is_err());
        assert_eq!(
            locations_tag(&digest('c')).unwrap(),
            format!("sha256-{}.image-locations.imgpkg", "c".repeat(64))
        );
    }

    #[test]
    fn the_lock_is_found_in_plain_and_gzip_layers_and_the_label_marks_a_bundle() {
        use std::io::Write;

        let lock = crate::images::images_lock_yaml(&[format!("up.io/images/one@{}", digest('a'))]);
        let bundle = crate::images::Image::bundle(&[("config/app.yml", b"app: 1\n")], &[]).unwrap();
        let plain = crate::images::Image::with_files(&[(IMAGES_LOCK_FILE, lock.as_bytes())]).unwrap();
        let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gzip.write_all(&plain.layer.bytes).unwrap();
        let gzip = Bytes::from(gzip.finish().unwrap());
        let other = crate::images::Image::with_files(&[("other.yml", b"x: 1\n")]).unwrap();

        let layer = |image: &crate::images::Image| Bytes::from(image.layer.bytes.clone());
        assert_eq!(
            images_lock_in(&[layer(&plain)]).unwrap().unwrap(),
            lock.as_bytes()
        );
        assert_eq!(images_lock_in(&[gzip]).unwrap().unwrap(), lock.as_bytes());
        assert!(images_lock_in(&[layer(&other)]).unwrap().is_none());
        // Layers are extracted in order: the later file wins.
        let empty = images_lock_in(&[layer(&plain), layer(&bundle)]).unwrap().unwrap();
        assert!(parse_images_lock(&empty).unwrap().is_empty());

        assert!(is_bundle_config(&bundle.config.bytes).unwrap());
        assert!(!is_bundle_config(&plain.config.bytes).unwrap());
        let any_value = serde_json::json!({"config": {"Labels": {BUNDLE_LABEL: ""}}});
        assert!(is_bundle_config(&serde_json::to_vec(&any_value).unwrap()).unwrap());
    }

    /// A registry on loopback that answers 200 for the request paths in `present` and 404 to
    /// anything else; the requests it saw (`METHOD path`).
    async fn fake_registry(present: HashSet<String>) -> (String, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: axum::http::Uri| {
            let (present, log) = (present.clone(), log.clone());
            async move {
                log.lock().unwrap().push(format!("{method} {}", uri.path()));
                if present.contains(uri.path()) {
                    (StatusCode::OK, r#"{"layers":[{"digest":"sha256:1"}]}"#)
                } else {
                    (StatusCode::NOT_FOUND, "")
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (addr, seen)
    }

    #[tokio::test]
    async fn a_bundle_is_relocated_only_when_its_repository_has_every_locked_image() {
        crate::init();
        let (a, b) = (digest('a'), digest('b'));
        let bundle_digest = digest('f');
        let lock = [format!("up.io/images/one@{a}"), format!("up.io/images/two@{b}")];
        let manifest = |d: &str| format!("/v2/m/bundles/app/manifests/{d}");
        let locations = manifest(&locations_tag(&bundle_digest).unwrap());
        let check = |present: Vec<String>| {
            let lock = lock.clone();
            let bundle_digest = bundle_digest.clone();
            async move {
                let (addr, seen) = fake_registry(present.into_iter().collect()).await;
                let http = reqwest::Client::new();
                let stats = FetchStats::default();
                let registry = Registry {
                    http: &http,
                    stats: &stats,
                };
                let url = format!("{addr}/m/bundles/app@{bundle_digest}");
                let relocated = registry
                    .relocated(&parse(&url).unwrap(), &bundle_digest, &lock)
                    .await
                    .unwrap();
                let seen = seen.lock().unwrap().clone();
                assert_eq!(stats.registry_requests.load(Ordering::Relaxed), seen.len() as u64);
                (relocated, seen)
            }
        };

        // Both in the bundle's repository: relocated, after the locations lookup and two HEADs.
        let (relocated, seen) = check(vec![manifest(&a), manifest(&b)]).await;
        assert!(relocated);
        assert_eq!(
            seen,
            [
                format!("GET {locations}"),
                format!("HEAD {}", manifest(&a)),
                format!("HEAD {}", manifest(&b))
            ]
        );
        // The second missing: HEAD then GET (imgpkg's fallback) find nothing — not relocated.
        let (relocated, seen) = check(vec![manifest(&a)]).await;
        assert!(!relocated);
        assert_eq!(
            seen[1..],
            [
                format!("HEAD {}", manifest(&a)),
                format!("HEAD {}", manifest(&b)),
                format!("GET {}", manifest(&b))
            ]
        );
        // The first missing: imgpkg stops there.
        let (relocated, seen) = check(vec![manifest(&b)]).await;
        assert!(!relocated);
        assert_eq!(seen.len(), 3, "{seen:?}");
        // A locations image (`imgpkg copy`): relocated on its word, its one layer read.
        let (relocated, seen) =
            check(vec![locations.clone(), "/v2/m/bundles/app/blobs/sha256:1".into()]).await;
        assert!(relocated);
        assert_eq!(
            seen,
            [
                format!("GET {locations}"),
                "GET /v2/m/bundles/app/blobs/sha256:1".to_owned()
            ]
        );
    }
}

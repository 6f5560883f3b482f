//! EMULATOR of kapp-controller's App fetch behaviour — a test fixture, NOT kapp-controller.
//!
//! Only what decides registry traffic is emulated, from `/work/shared/reference/kapp-controller.md`
//! ("ref §N"):
//!
//! - Every App is reconciled when it appears and then every `syncPeriod` (default 30 s; ref §3.1)
//!   with kapp-controller's timer: `RequeueAfter = syncPeriod − 5 s + Jitter(5 s)`, so Apps
//!   created together stay bunched (ref §3.1, `reconcile_timer.go`). The jitter here is a hash of
//!   the App's uid and sync count: the same run gives the same schedule.
//! - Each reconcile fetches every `spec.fetch[].image.url` as vendir does through imgpkg: the
//!   manifest (`GET /v2/<repo>/manifests/<tag or digest>`), then the config blob and every layer
//!   blob. Any failed request fails the sync (`ReconcileFailed`).
//! - vendir's cache (ref §2.2, §2.4) is **per App** (keyed by the App's uid) and holds only what
//!   was fetched **by digest**: a digest reference already fetched for this App makes no registry
//!   request at all; a tag reference is fetched on every sync and never cached.
//! - The whole sync runs on an emulated clock: an hour of syncs takes as long as its real
//!   registry requests do. Time advances only through [`KappController::run_until`].
//!
//! Simplified: only `image` fetches (an `imgpkgBundle` would add its ImagesLock checks, which
//! only make the uncached case costlier), no `tagSelection` (never cacheable: a tag list per
//! sync), no template/deploy steps, no `VENDIR_MAX_CACHE_SIZE` limit (the test images are far
//! below its 1 MiB), no pod restarts (which empty the in-memory cache).

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, HashSet},
    hash::{DefaultHasher, Hash, Hasher},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// kapp-controller's App default (ref §3.1).
pub const DEFAULT_SYNC_PERIOD: Duration = Duration::from_secs(30);
/// The part of the sync period replaced by jitter (ref §3.1).
const JITTER: Duration = Duration::from_secs(5);
/// Reconciles running at once (kapp-controller runs several App workers).
const WORKERS: usize = 32;

/// What the emulated reconciles did.
#[derive(Debug, Default)]
pub struct FetchStats {
    pub syncs: AtomicU64,
    pub failed_syncs: AtomicU64,
    /// Requests sent to registries.
    pub registry_requests: AtomicU64,
    /// Fetches answered from an App's vendir cache (no request).
    pub cache_hits: AtomicU64,
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
    /// vendir's cache: per App uid, the digest identifiers fetched by digest.
    caches: Arc<Mutex<HashMap<String, HashSet<String>>>>,
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
            let urls: Vec<String> = app
                .data
                .pointer("/spec/fetch")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|f| f.pointer("/image/url").and_then(Value::as_str))
                .map(str::to_owned)
                .collect();
            let mut ok = true;
            for url in urls {
                if let Err(error) = fetch(&http, &caches, &stats, &uid, &url).await {
                    tracing::debug!(%url, %error, "emulated kapp-controller: fetch failed");
                    ok = false;
                    break;
                }
            }
            stats.syncs.fetch_add(1, Ordering::Relaxed);
            if !ok {
                stats.failed_syncs.fetch_add(1, Ordering::Relaxed);
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

/// `host/repository` and the tag or digest of a reference as the test registries spell it.
struct Parsed<'a> {
    host: &'a str,
    repository: &'a str,
    /// `Some` for a digest reference (vendir's cache identifier).
    digest: Option<&'a str>,
    reference: &'a str,
}

fn parse(url: &str) -> Result<Parsed<'_>> {
    let (host, path) = url.split_once('/').context("no registry host")?;
    if let Some((repository, digest)) = path.split_once('@') {
        // `repo:tag@sha256:…` keeps only the digest (ggcr NewDigest, ref §1.8).
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

/// vendir's image fetch: from the App's cache for a digest it already has, else manifest, config
/// and layers from the registry (and into the cache when fetched by digest).
async fn fetch(
    http: &reqwest::Client,
    caches: &Mutex<HashMap<String, HashSet<String>>>,
    stats: &FetchStats,
    uid: &str,
    url: &str,
) -> Result<()> {
    let parsed = parse(url)?;
    if let Some(digest) = parsed.digest {
        let cached = caches
            .lock()
            .map_err(|_| anyhow::anyhow!("cache lock poisoned"))?
            .get(uid)
            .is_some_and(|c| c.contains(digest));
        if cached {
            stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
    }
    let base = format!("http://{}/v2/{}", parsed.host, parsed.repository);
    let get = |url: String, accept: Option<&'static str>| {
        stats.registry_requests.fetch_add(1, Ordering::Relaxed);
        let request = http.get(url);
        let request = match accept {
            Some(accept) => request.header(reqwest::header::ACCEPT, accept),
            None => request,
        };
        async move {
            let response = request.send().await?;
            if !response.status().is_success() {
                bail!("{}: {}", response.url().clone(), response.status());
            }
            Ok(response.bytes().await?)
        }
    };
    let manifest = get(
        format!("{base}/manifests/{}", parsed.reference),
        Some("application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"),
    )
    .await?;
    let manifest: Value = serde_json::from_slice(&manifest)?;
    let blobs = std::iter::once(&manifest["config"])
        .chain(manifest["layers"].as_array().into_iter().flatten())
        .filter_map(|d| d["digest"].as_str());
    for blob in blobs {
        get(format!("{base}/blobs/{blob}"), None).await?;
    }
    if let Some(digest) = parsed.digest {
        caches
            .lock()
            .map_err(|_| anyhow::anyhow!("cache lock poisoned"))?
            .entry(uid.to_string())
            .or_default()
            .insert(digest.to_string());
    }
    Ok(())
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
}

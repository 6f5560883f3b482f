//! The read-only view of the cluster the rules consult: in-memory stores fed by metadata-only
//! watches, so a lookup on the admission path is a map read. Two lookups may also ask the API
//! server, each only for an object the watch has not shown: the BuildWorkload and the app of an
//! Image created a moment after them ([`ClusterView::metadata_now`]), and whether the controller
//! of a new Build or build pod that the cache does not know was just created or is gone
//! ([`ClusterView::presence_now`]).

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock},
    time::{Duration, SystemTime},
};

use futures::{FutureExt, StreamExt, future::BoxFuture};
use holdfast_peers::{Served, korifi, kpack};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{WatchStreamExt, reflector, reflector::ObjectRef},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the rules may ask of the cluster.
pub trait ClusterView: Send + Sync {
    /// A namespace's labels; empty when the namespace is not known (yet).
    fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String>;

    /// When a namespace was created (its `creationTimestamp`); `None` when it is not known (yet).
    fn namespace_created(&self, namespace: &str) -> Option<SystemTime>;

    /// The value of a namespace's label.
    fn namespace_label(&self, namespace: &str, key: &str) -> Option<String> {
        self.namespace_labels(namespace).remove(key)
    }

    /// Whether `peer`'s API is served, as far as this view knows (the rules find no object of a
    /// kind it does not serve).
    fn serves(&self, peer: Peer) -> bool;

    /// Whether the named peer object is being deleted; `None` when it is not known (absent, or
    /// its API is not installed).
    fn terminating(&self, peer: Peer, namespace: &str, name: &str) -> Option<bool>;

    /// The metadata of a peer object (labels, ownerReferences), if known.
    fn metadata(&self, peer: Peer, namespace: &str, name: &str) -> Option<ObjectMeta>;

    /// [`metadata`](Self::metadata), asked of the API server (one metadata `get`, bounded) only
    /// when the cache does not know the object: Korifi creates an app's BuildWorkload a moment
    /// before its Image, and `kubectl apply` of several objects in one file creates them at once.
    fn metadata_now<'a>(
        &'a self,
        peer: Peer,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Option<ObjectMeta>> {
        futures::future::ready(self.metadata(peer, namespace, name)).boxed()
    }

    /// [`terminating`](Self::terminating), asked of the API server only when the cache does not
    /// know the object. For the controller of a new Build or build pod: kpack creates those for
    /// an owner *its* watch showed, so an owner missing from holdfast's watch was either created
    /// a moment ago or is already gone (kpack's cache still had it), and only a read tells
    /// which. An owner the cache knows is answered from memory: a read for every Build and
    /// build pod would cost the API server a round trip per admission (bench-apiserver) to
    /// narrow a window as wide as holdfast's watch lag (milliseconds).
    ///
    /// With `uid` (an ownerReference's), only that object counts: one of the same name and
    /// another uid is not it (the cache's is asked of the API server again; the API server's
    /// means the one named is [`Presence::Gone`]).
    fn presence_now<'a>(
        &'a self,
        peer: Peer,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> BoxFuture<'a, Presence>;
}

/// Whether `meta` is the object `uid` names (any object, without a uid to compare).
pub fn is_uid(meta: &ObjectMeta, uid: Option<&str>) -> bool {
    uid.is_none_or(|uid| meta.uid.as_deref() == Some(uid))
}

/// Whether an object exists, and is being deleted, as far as holdfast can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Live,
    Terminating,
    /// The API server has no such object.
    Gone,
    /// Its API is not installed, or the API server could not be asked and the cache does not know.
    Unknown,
}

impl Presence {
    fn cached(terminating: Option<bool>) -> Self {
        match terminating {
            Some(true) => Presence::Terminating,
            Some(false) => Presence::Live,
            None => Presence::Unknown,
        }
    }
}

/// How long a live lookup may take before the cached answer stands.
const LIVE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(1);

/// The peers' kinds whose deletion state the terminating guard reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    CfApp,
    BuildWorkload,
    KpackImage,
    KpackBuild,
}

impl Peer {
    pub const ALL: [Peer; 4] = [
        Peer::CfApp,
        Peer::BuildWorkload,
        Peer::KpackImage,
        Peer::KpackBuild,
    ];

    pub fn gvk(self) -> GroupVersionKind {
        match self {
            Peer::CfApp => korifi::cf_app(),
            Peer::BuildWorkload => korifi::build_workload(),
            Peer::KpackImage => kpack::image(),
            Peer::KpackBuild => kpack::build(),
        }
    }
}

type MetaStore = reflector::Store<holdfast_peers::Meta>;

/// The cluster view backed by reflectors. A kind whose API is not installed has no store and
/// answers nothing (holdfast runs on clusters without Korifi) until it is: its store starts when
/// discovery, asked again every `look_again` (a peer installed after holdfast), serves it.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    /// Every peer, set once its API is served.
    peers: Arc<BTreeMap<Peer, OnceLock<(ApiResource, MetaStore)>>>,
    namespaces: (ApiResource, MetaStore),
    synced: watch::Receiver<bool>,
}

impl Cluster {
    /// Starts the watches; they stop with `cancel`. Ready once [`Cluster::synced`] resolves:
    /// the stores of the peers served now and the namespaces' (a peer's store that starts later
    /// answers nothing until its first list, as before it was installed).
    pub async fn start(client: Client, look_again: Duration, cancel: CancellationToken) -> Self {
        let served = Served::discover(&client, Peer::ALL.map(Peer::gvk), "rules find no such objects").await;
        let peers: Arc<BTreeMap<Peer, OnceLock<(ApiResource, MetaStore)>>> = Arc::new(
            Peer::ALL
                .into_iter()
                .map(|peer| (peer, OnceLock::new()))
                .collect(),
        );
        let mut stores = Vec::new();
        for (peer, slot) in peers.iter() {
            if let Some(resource) = served.get(&peer.gvk()) {
                let store = watch_metadata(client.clone(), resource.clone(), cancel.clone());
                stores.push(store.clone());
                let _ = slot.set((resource, store));
            }
        }
        tokio::spawn(watch_when_installed(
            client.clone(),
            served.missing(),
            peers.clone(),
            look_again,
            cancel.clone(),
        ));
        let namespace_resource = ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&());
        let namespaces = (
            namespace_resource.clone(),
            watch_metadata(client.clone(), namespace_resource, cancel.clone()),
        );
        stores.push(namespaces.1.clone());
        // One waiter on the stores, fanned out through a watch channel: a reflector store wakes
        // only the last of several concurrent `wait_until_ready` callers.
        let (tx, synced) = watch::channel(false);
        tokio::spawn(async move {
            for store in stores {
                let _ = store.wait_until_ready().await;
            }
            let _ = tx.send(true);
        });
        Self {
            client,
            peers,
            namespaces,
            synced,
        }
    }

    /// The resource and store of `peer`, once its API is served.
    fn peer(&self, peer: Peer) -> Option<&(ApiResource, MetaStore)> {
        self.peers.get(&peer)?.get()
    }

    /// Resolves once every store has its first full list.
    pub async fn synced(&self) {
        let _ = self.synced.clone().wait_for(|synced| *synced).await;
    }

    /// A metadata `get` of an object the cache does not show, bounded by
    /// [`LIVE_LOOKUP_TIMEOUT`]; `None` on error or timeout (the request is admitted as if it
    /// did not exist).
    async fn live_metadata(&self, resource: &ApiResource, namespace: &str, name: &str) -> Option<ObjectMeta> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, resource);
        match tokio::time::timeout(LIVE_LOOKUP_TIMEOUT, api.get_metadata_opt(name)).await {
            Ok(Ok(found)) => found.map(|f| f.metadata),
            Ok(Err(error)) => {
                tracing::warn!(%error, namespace, name, kind = %resource.kind, "live lookup failed; admitting as if absent");
                None
            }
            Err(_) => {
                tracing::warn!(namespace, name, kind = %resource.kind, "live lookup timed out; admitting as if absent");
                None
            }
        }
    }
}

impl ClusterView for Cluster {
    fn serves(&self, peer: Peer) -> bool {
        self.peer(peer).is_some()
    }

    fn terminating(&self, peer: Peer, namespace: &str, name: &str) -> Option<bool> {
        Some(self.metadata(peer, namespace, name)?.deletion_timestamp.is_some())
    }

    fn metadata(&self, peer: Peer, namespace: &str, name: &str) -> Option<ObjectMeta> {
        let (resource, store) = self.peer(peer)?;
        let found = store.get(&ObjectRef::new_with(name, resource.clone()).within(namespace))?;
        Some(found.metadata.clone())
    }

    fn metadata_now<'a>(
        &'a self,
        peer: Peer,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Option<ObjectMeta>> {
        async move {
            if let Some(cached) = self.metadata(peer, namespace, name) {
                return Some(cached);
            }
            let (resource, _) = self.peer(peer)?;
            self.live_metadata(resource, namespace, name).await
        }
        .boxed()
    }

    fn presence_now<'a>(
        &'a self,
        peer: Peer,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> BoxFuture<'a, Presence> {
        async move {
            let known = self.metadata(peer, namespace, name).filter(|m| is_uid(m, uid));
            let cached = Presence::cached(known.map(|m| m.deletion_timestamp.is_some()));
            if cached != Presence::Unknown {
                return cached;
            }
            let Some((resource, _)) = self.peer(peer) else {
                return Presence::Unknown;
            };
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, resource);
            match tokio::time::timeout(LIVE_LOOKUP_TIMEOUT, api.get_metadata_opt(name)).await {
                // Another object of the same name: the one the reference names is gone.
                Ok(Ok(Some(found))) if !is_uid(&found.metadata, uid) => Presence::Gone,
                Ok(Ok(Some(found))) if found.metadata.deletion_timestamp.is_some() => Presence::Terminating,
                Ok(Ok(Some(_))) => Presence::Live,
                Ok(Ok(None)) => Presence::Gone,
                Ok(Err(error)) => {
                    tracing::warn!(%error, namespace, name, kind = %resource.kind, "live deletion check failed; using the cache");
                    cached
                }
                Err(_) => {
                    tracing::warn!(namespace, name, kind = %resource.kind, "live deletion check timed out; using the cache");
                    cached
                }
            }
        }
        .boxed()
    }

    fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        let (resource, store) = &self.namespaces;
        store
            .get(&ObjectRef::new_with(namespace, resource.clone()))
            .and_then(|found| found.metadata.labels.clone())
            .unwrap_or_default()
    }

    fn namespace_created(&self, namespace: &str) -> Option<SystemTime> {
        let (resource, store) = &self.namespaces;
        let found = store.get(&ObjectRef::new_with(namespace, resource.clone()))?;
        let created = found.metadata.creation_timestamp.as_ref()?;
        Some(SystemTime::from(created.0))
    }
}

/// Starts the watch of each of `missing`'s peers as its API comes to be served, until every one
/// is or `cancel`.
async fn watch_when_installed(
    client: Client,
    mut missing: Vec<GroupVersionKind>,
    peers: Arc<BTreeMap<Peer, OnceLock<(ApiResource, MetaStore)>>>,
    look_again: Duration,
    cancel: CancellationToken,
) {
    while !missing.is_empty() {
        let found = tokio::select! {
            _ = cancel.cancelled() => return,
            found = holdfast_peers::installed(&client, &missing, look_again) => found,
        };
        for (kind, resource) in found {
            missing.retain(|gvk| *gvk != kind);
            if let Some((_, slot)) = peers.iter().find(|(peer, _)| peer.gvk() == kind) {
                let store = watch_metadata(client.clone(), resource.clone(), cancel.clone());
                let _ = slot.set((resource, store));
            }
        }
    }
}

fn watch_metadata(client: Client, resource: ApiResource, cancel: CancellationToken) -> MetaStore {
    // Without managedFields and kubectl's last-applied copy: no rule reads them, and on a large
    // cluster they are most of the metadata.
    let (store, events) = holdfast_peers::metadata_reflector(client, &resource);
    let kind = resource.kind.clone();
    let stream = events.touched_objects();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream.take_until(cancel.cancelled_owned()));
        while let Some(event) = stream.next().await {
            if let Err(error) = event {
                tracing::warn!(%kind, %error, "metadata watch error; retrying with backoff");
            }
        }
    });
    store
}

/// A fixed view for tests of the rules.
#[derive(Debug, Default, Clone)]
pub struct StaticCluster {
    /// `(namespace, label key, value)`.
    pub namespace_labels: Vec<(String, String, String)>,
    /// Peer objects being deleted: `(peer, namespace, name)`.
    pub terminating: Vec<(Peer, String, String)>,
    /// Peer objects being deleted that only the API server knows of (the watch has not shown
    /// them at all yet).
    pub terminating_live: Vec<(Peer, String, String)>,
    /// Peer objects the API server no longer has (the watch lags).
    pub gone: Vec<(Peer, String, String)>,
    /// Peer objects' metadata: `(peer, namespace, metadata with its name)`.
    pub objects: Vec<(Peer, String, ObjectMeta)>,
    /// Namespaces' creation times; a namespace not listed was created at the epoch.
    pub namespace_created: Vec<(String, SystemTime)>,
}

impl ClusterView for StaticCluster {
    /// Every peer's: a fixed view of objects of any kind.
    fn serves(&self, _: Peer) -> bool {
        true
    }

    fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        self.namespace_labels
            .iter()
            .filter(|(ns, _, _)| ns == namespace)
            .map(|(_, k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn namespace_created(&self, namespace: &str) -> Option<SystemTime> {
        let listed = self.namespace_created.iter().find(|(ns, _)| ns == namespace);
        Some(listed.map_or(SystemTime::UNIX_EPOCH, |(_, at)| *at))
    }

    fn terminating(&self, peer: Peer, namespace: &str, name: &str) -> Option<bool> {
        let hit = self
            .terminating
            .iter()
            .any(|(p, ns, n)| *p == peer && ns == namespace && n == name);
        if hit {
            Some(true)
        } else {
            self.metadata(peer, namespace, name).map(|_| false)
        }
    }

    fn presence_now<'a>(
        &'a self,
        peer: Peer,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> BoxFuture<'a, Presence> {
        let listed = |list: &[(Peer, String, String)]| {
            list.iter()
                .any(|(p, ns, n)| *p == peer && ns == namespace && n == name)
        };
        // Memory holds another object of that name: as the real view, memory does not answer
        // for the one the reference names.
        let other = self
            .metadata(peer, namespace, name)
            .is_some_and(|m| !is_uid(&m, uid));
        // As the real view: memory first; the "API server" only for what memory lacks.
        let presence = match self.terminating(peer, namespace, name).filter(|_| !other) {
            Some(true) => Presence::Terminating,
            Some(false) => Presence::Live,
            None if listed(&self.terminating_live) => Presence::Terminating,
            None if listed(&self.gone) => Presence::Gone,
            None => Presence::Unknown,
        };
        futures::future::ready(presence).boxed()
    }

    fn metadata(&self, peer: Peer, namespace: &str, name: &str) -> Option<ObjectMeta> {
        let found = self
            .objects
            .iter()
            .find(|(p, ns, meta)| *p == peer && ns == namespace && meta.name.as_deref() == Some(name));
        found.map(|(_, _, meta)| meta.clone())
    }
}

//! The publisher: the digest cache as the parameters of holdfast's pinning policies
//! (`manifests/base/policy/`), so that the API server pins cached tags itself, with no webhook
//! call. A leader's loop: what to publish is `holdfast_pins::policy_params`'s pure decision over
//! the watched objects' written references, the cache and the namespaces; this module writes
//! it — `ClusterDigestPins` for anonymous entries, `DigestPins` in each namespace whose objects
//! name a `secretRef` — sharded, and only what changed (every write is an object the API server
//! re-reads for every admission). Objects it no longer wants, and only those carrying its label,
//! are deleted.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use holdfast_cache::DigestCache;
use holdfast_pins::{
    PinnedKind,
    policy_params::{
        self, DesiredPins, MAX_SHARD_BYTES, NamespaceState, Publishing, WrittenSite,
        crd::{ClusterDigestPins, DigestPins, MANAGED_BY, MANAGED_LABEL},
    },
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams},
    runtime::{
        reflector::{Store, store::Writer},
        watcher,
    },
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::{
    pinning::IGNORE_LABEL,
    watched::{Handlers, Index, Watched, spawn_watch},
};

/// The field manager of the parameters (server-side apply).
pub const MANAGER: &str = "holdfast-controller";

/// How long a burst of changes (a refresh round updates every entry) settles before a pass.
const SETTLE: Duration = Duration::from_secs(1);
/// A pass at least this often: entries age past the staleness limit with no change to see.
const RECHECK: Duration = Duration::from_secs(60);

/// The names of a map's shards: `<prefix>-0`, `<prefix>-1`, …
const CLUSTER_PREFIX: &str = "anonymous";
const NAMESPACED_PREFIX: &str = "private";

/// One parameter object, as desired or as stored: its namespace (`None`: a `ClusterDigestPins`),
/// its name and its map.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParamObject {
    pub namespace: Option<String>,
    pub name: String,
    pub pins: BTreeMap<String, String>,
}

/// The objects that hold `desired`, each map in as many shards as it needs (empty maps: none).
pub fn param_objects(desired: &DesiredPins, max_bytes: usize) -> Vec<ParamObject> {
    let named = |namespace: Option<&String>, prefix: &str, map: &BTreeMap<String, String>| {
        policy_params::shards(map, max_bytes)
            .into_iter()
            .enumerate()
            .filter(|(_, pins)| !pins.is_empty())
            .map(|(index, pins)| ParamObject {
                namespace: namespace.cloned(),
                name: format!("{prefix}-{index}"),
                pins,
            })
            .collect::<Vec<_>>()
    };
    let mut objects = named(None, CLUSTER_PREFIX, &desired.anonymous);
    for (namespace, map) in &desired.by_namespace {
        objects.extend(named(Some(namespace), NAMESPACED_PREFIX, map));
    }
    objects
}

/// What a pass does to go from `stored` (the objects carrying the publisher's label) to
/// `desired`: the objects to write (new or changed) and those to delete.
pub fn changes(desired: &[ParamObject], stored: &[ParamObject]) -> (Vec<ParamObject>, Vec<ParamObject>) {
    let held: HashSet<&ParamObject> = stored.iter().collect();
    let wanted: HashSet<(&Option<String>, &String)> =
        desired.iter().map(|o| (&o.namespace, &o.name)).collect();
    let writes = desired.iter().filter(|o| !held.contains(o)).cloned().collect();
    let deletes = stored
        .iter()
        .filter(|o| !wanted.contains(&(&o.namespace, &o.name)))
        .cloned()
        .collect();
    (writes, deletes)
}

/// The publisher of a leader's term.
pub struct Publisher {
    client: Client,
    own_namespace: String,
    cache: Arc<DigestCache>,
    watched: Arc<Watched>,
    publishing: Publishing,
    /// What each object writes, read again only when it changed.
    index: Index<WrittenSite, PinnedKind>,
    cluster: Store<DynamicObject>,
    namespaced: Store<DynamicObject>,
    listed: Vec<watch::Receiver<bool>>,
}

impl Publisher {
    /// Watches the parameter objects until `cancel`; publishes what `watched` names from
    /// `cache` (`mirror`: whether the webhook pins to mirror copies).
    pub fn start(
        client: &Client,
        own_namespace: &str,
        cache: Arc<DigestCache>,
        watched: Arc<Watched>,
        mirror: bool,
        cancel: &CancellationToken,
    ) -> Self {
        let (changed, _) = watch::channel(0u64);
        let mut listed = Vec::new();
        let mut follow = |resource: ApiResource| {
            let writer = Writer::new(resource.clone());
            let store = writer.as_reader();
            listed.push(spawn_watch(
                Api::<DynamicObject>::all_with(client.clone(), &resource),
                writer,
                Handlers {
                    slim: |object: &mut DynamicObject| holdfast_peers::slim_metadata(&mut object.metadata),
                    fingerprint: |_: &DynamicObject| 0,
                    observe: |_: &watcher::Event<DynamicObject>| {},
                },
                &changed,
                None,
                cancel,
            ));
            store
        };
        let cluster = follow(ApiResource::erase::<ClusterDigestPins>(&()));
        let namespaced = follow(ApiResource::erase::<DigestPins>(&()));
        let publishing = Publishing {
            max_staleness: cache.max_staleness(),
            mirror,
        };
        Self {
            client: client.clone(),
            own_namespace: own_namespace.to_owned(),
            cache,
            watched,
            publishing,
            index: Index::default(),
            cluster,
            namespaced,
            listed,
        }
    }

    /// Passes until `cancel`: one when the watches are listed, then one after each change of the
    /// objects, the namespaces or the cache (settled), and at least every [`RECHECK`].
    pub async fn run(mut self, cancel: CancellationToken) {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = self.ready() => {}
        }
        let mut objects = self.watched.changes();
        let mut entries = self.cache.changes();
        loop {
            self.pass().await;
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = objects.changed() => {}
                _ = entries.changed() => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(SETTLE) => {}
            }
        }
    }

    /// Resolves once the pinned kinds, the namespaces and the parameter objects are listed.
    pub async fn ready(&self) {
        self.watched.ready().await;
        for listed in &self.listed {
            let _ = listed.clone().wait_for(|listed| *listed).await;
        }
    }

    /// Writes what changed and deletes what is no longer wanted; returns how many objects it
    /// wrote and deleted. Nothing before every kind is listed: a partial list would unpublish
    /// the pins of the objects not listed yet.
    pub async fn pass(&mut self) -> (usize, usize) {
        if !self.watched.fully_listed() || !self.listed.iter().all(|l| *l.borrow()) {
            return (0, 0);
        }
        let objects: Vec<_> = self.watched.objects().collect();
        let sites = self.index.union(
            objects.iter().map(|(kind, object)| (object.as_ref(), *kind)),
            |object, kind| policy_params::written_sites(kind, object),
        );
        let namespaces = self.watched.namespaces().clone();
        let state = |namespace: &str| {
            if namespace == "kube-system" || namespace == self.own_namespace {
                return NamespaceState::Ignored;
            }
            match namespaces.labels(namespace) {
                None => NamespaceState::Unknown,
                Some(labels) if labels.get(IGNORE_LABEL).is_some_and(|v| v == "true") => {
                    NamespaceState::Ignored
                }
                Some(_) => namespaces
                    .created(namespace)
                    .map_or(NamespaceState::Unknown, |created| NamespaceState::Pinned {
                        created,
                    }),
            }
        };
        let desired = policy_params::desired(&sites, &self.cache, state, self.publishing, SystemTime::now());
        let (writes, deletes) = changes(&param_objects(&desired, MAX_SHARD_BYTES), &self.stored());
        let (mut written, mut deleted) = (0, 0);
        for object in &writes {
            match self.write(object).await {
                Ok(()) => written += 1,
                Err(error) => {
                    tracing::warn!(namespace = object.namespace.as_deref(), name = %object.name, %error, "publishing digest pins failed; retried at the next pass")
                }
            }
        }
        for object in &deletes {
            match self.delete(object).await {
                Ok(()) => deleted += 1,
                Err(error) => {
                    tracing::warn!(namespace = object.namespace.as_deref(), name = %object.name, %error, "deleting digest pins failed; retried at the next pass")
                }
            }
        }
        if written + deleted > 0 {
            tracing::info!(
                written,
                deleted,
                anonymous = desired.anonymous.len(),
                namespaces = desired.by_namespace.len(),
                "published digest pins"
            );
        }
        (written, deleted)
    }

    /// The parameter objects stored with the publisher's label.
    fn stored(&self) -> Vec<ParamObject> {
        let read = |store: &Store<DynamicObject>, namespaced: bool| {
            store
                .state()
                .into_iter()
                .filter(|object| object.labels().get(MANAGED_LABEL).map(String::as_str) == Some(MANAGED_BY))
                .map(|object| ParamObject {
                    namespace: namespaced.then(|| object.namespace()).flatten(),
                    name: object.name_any(),
                    pins: object
                        .data
                        .pointer("/spec/pins")
                        .and_then(|pins| serde_json::from_value(pins.clone()).ok())
                        .unwrap_or_default(),
                })
                .collect::<Vec<_>>()
        };
        let mut stored = read(&self.cluster, false);
        stored.extend(read(&self.namespaced, true));
        stored
    }

    async fn write(&self, object: &ParamObject) -> kube::Result<()> {
        let metadata = ObjectMeta {
            name: Some(object.name.clone()),
            namespace: object.namespace.clone(),
            labels: Some(BTreeMap::from([(
                MANAGED_LABEL.to_owned(),
                MANAGED_BY.to_owned(),
            )])),
            ..ObjectMeta::default()
        };
        let params = PatchParams::apply(MANAGER).force();
        match &object.namespace {
            None => {
                let mut pins = ClusterDigestPins::new(&object.name, Default::default());
                pins.metadata = metadata;
                pins.spec.pins = object.pins.clone();
                Api::<ClusterDigestPins>::all(self.client.clone())
                    .patch(&object.name, &params, &Patch::Apply(with_types(pins)))
                    .await?;
            }
            Some(namespace) => {
                let mut pins = DigestPins::new(&object.name, Default::default());
                pins.metadata = metadata;
                pins.spec.pins = object.pins.clone();
                Api::<DigestPins>::namespaced(self.client.clone(), namespace)
                    .patch(&object.name, &params, &Patch::Apply(with_types(pins)))
                    .await?;
            }
        }
        Ok(())
    }

    async fn delete(&self, object: &ParamObject) -> kube::Result<()> {
        let result = match &object.namespace {
            None => Api::<ClusterDigestPins>::all(self.client.clone())
                .delete(&object.name, &DeleteParams::default())
                .await
                .map(drop),
            Some(namespace) => Api::<DigestPins>::namespaced(self.client.clone(), namespace)
                .delete(&object.name, &DeleteParams::default())
                .await
                .map(drop),
        };
        match result {
            Ok(()) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(error) => Err(error),
        }
    }
}

/// `object` as an apply body: with its `apiVersion` and `kind`.
fn with_types<K: Resource<DynamicType = ()> + serde::Serialize>(object: K) -> serde_json::Value {
    let mut value = serde_json::to_value(&object).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), K::api_version(&()).into());
        map.insert("kind".into(), K::kind(&()).into());
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(namespace: Option<&str>, name: &str, pins: &[(&str, &str)]) -> ParamObject {
        ParamObject {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
            pins: pins.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    #[test]
    fn each_map_is_one_object_per_shard_and_empty_maps_none() {
        let desired = DesiredPins {
            anonymous: BTreeMap::from([("nginx:1.25".into(), "nginx@sha256:a".into())]),
            by_namespace: BTreeMap::from([
                (
                    "team".into(),
                    BTreeMap::from([("creds app:1".into(), "app@sha256:b".into())]),
                ),
                ("empty".into(), BTreeMap::new()),
            ]),
        };
        assert_eq!(
            param_objects(&desired, MAX_SHARD_BYTES),
            [
                object(None, "anonymous-0", &[("nginx:1.25", "nginx@sha256:a")]),
                object(Some("team"), "private-0", &[("creds app:1", "app@sha256:b")]),
            ]
        );
        assert!(param_objects(&DesiredPins::default(), MAX_SHARD_BYTES).is_empty());
        let sharded = param_objects(&desired, 10);
        assert!(sharded.iter().all(|o| o.pins.len() == 1), "{sharded:?}");
    }

    /// Only what changed is written; what is no longer wanted is deleted; the same desired
    /// state twice writes nothing.
    #[test]
    fn a_pass_writes_only_what_changed() {
        let anonymous = object(None, "anonymous-0", &[("nginx:1.25", "nginx@sha256:a")]);
        let team = object(Some("team"), "private-0", &[("creds app:1", "app@sha256:b")]);
        let moved = object(Some("team"), "private-0", &[("creds app:1", "app@sha256:c")]);
        let gone = object(Some("old"), "private-0", &[("creds app:1", "app@sha256:b")]);

        let (writes, deletes) = changes(&[anonymous.clone(), team.clone()], &[]);
        assert_eq!((writes, deletes), (vec![anonymous.clone(), team.clone()], vec![]));
        let stored = [anonymous.clone(), team.clone(), gone.clone()];
        let (writes, deletes) = changes(&[anonymous.clone(), moved.clone()], &stored);
        assert_eq!((writes, deletes), (vec![moved.clone()], vec![gone]));
        let (writes, deletes) = changes(&[anonymous.clone(), moved.clone()], &[anonymous, moved]);
        assert!(writes.is_empty() && deletes.is_empty());
    }
}

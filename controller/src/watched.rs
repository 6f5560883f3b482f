//! One watch per pinned kind for a leader's term: a reflector whose store the pinning
//! controller of the kind is driven by (kube's shared-stream controller: the store is the
//! controller's, the watch's significant applied objects its triggers) and the mirror's
//! reference index and the refresher read, and whose significant events (an object added,
//! deleted or changed in what a reconcile reads of it, a re-list done) wake the mirror; plus the namespaces' labels, metadata only, which the
//! pinners and the mirror's selection read instead of asking the API server (a change of a
//! namespace's labels triggers its objects). Objects are kept with only
//! what is read of them ([`Stored`]: metadata and the fetch field's OCI sources).
//!
//! The triggers go through a channel of this module's, not kube's `ReflectHandle`: in kube 5 a
//! `ReflectHandle` is a stream only for kinds with a static type, and the pinned kinds are
//! discovered. The refresher sends into the same channels the objects a refresh round concerns.
//!
//! What is read off the stored objects (the mirror copies they reference, the cache keys they
//! name) is kept per object by an [`Index`], read again only when the object changed.

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Debug,
    hash::{DefaultHasher, Hash, Hasher},
    sync::{Arc, Mutex},
};

use futures::StreamExt;
use holdfast_pins::{ORIGINAL_REFS_ANNOTATION, OriginalRefs, PinnedKind};
use k8s_openapi::{api::core::v1::Namespace, serde::de::DeserializeOwned};
use kube::{
    Api, Client, Resource,
    api::{ApiResource, DynamicObject, PartialObjectMeta},
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store, store::Writer},
        watcher,
    },
};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::{metrics::Metrics, stored::Stored};

/// Triggers a controller may lag behind before the watch waits for it.
const BUFFER: usize = 1024;

type Trigger = mpsc::Receiver<Arc<Stored>>;

/// A pinned kind's objects, as the term's one watch of it keeps them.
pub struct WatchedKind {
    pub kind: PinnedKind,
    pub resource: ApiResource,
    pub store: Store<Stored>,
    /// The kind's pinning controller's triggers, which the watch feeds too.
    trigger: mpsc::Sender<Arc<Stored>>,
}

impl WatchedKind {
    /// Has the kind's pinning controller reconcile `object` (the store's latest version of it),
    /// as a watch event would. Waits while the controller is [`BUFFER`] triggers behind.
    pub async fn trigger(&self, object: Arc<Stored>) {
        // A closed channel: the controller has stopped, with the term.
        let _ = self.trigger.send(object).await;
    }
}

/// The namespaces' labels, as the watch of their metadata keeps them.
#[derive(Clone)]
pub struct Namespaces {
    resource: ApiResource,
    store: Store<PartialObjectMeta<DynamicObject>>,
}

impl Namespaces {
    /// A namespace's labels as last seen; `None` while the watch has not seen it.
    pub fn labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.store
            .get(&ObjectRef::new_with(namespace, self.resource.clone()))
            .map(|found| found.metadata.labels.clone().unwrap_or_default())
    }

    /// When a namespace was created, as last seen; `None` while the watch has not seen it.
    pub fn created(&self, namespace: &str) -> Option<std::time::SystemTime> {
        let found = self
            .store
            .get(&ObjectRef::new_with(namespace, self.resource.clone()))?;
        let created = found.metadata.creation_timestamp.as_ref()?;
        Some(std::time::SystemTime::from(created.0))
    }

    /// A store holding `namespaces` (name, labels), for tests of the readers.
    #[cfg(test)]
    pub(crate) fn of(namespaces: &[(&str, &[(&str, &str)])]) -> Self {
        let resource = ApiResource::erase::<Namespace>(&());
        let mut writer = Writer::new(resource.clone());
        for (name, labels) in namespaces {
            let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
            let Ok(namespace) =
                serde_json::from_value::<PartialObjectMeta<DynamicObject>>(serde_json::json!({
                    "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels},
                }))
            else {
                continue;
            };
            writer.apply_watcher_event(&watcher::Event::Apply(namespace));
        }
        Self {
            resource,
            store: writer.as_reader(),
        }
    }
}

pub struct Watched {
    kinds: Vec<WatchedKind>,
    /// Turns true once the watch's first list is complete, one per kind and the namespaces'.
    /// Not `Store::wait_until_ready`: a store wakes only one of its concurrent waiters, and the
    /// pinning controllers wait on the same stores.
    listed: Vec<watch::Receiver<bool>>,
    /// Each kind's triggers, for its pinning controller (taken once).
    triggers: Mutex<Vec<Option<Trigger>>>,
    namespaces: Namespaces,
    changes: watch::Receiver<u64>,
}

impl Watched {
    /// Watches every kind of `kinds` and the namespaces until `cancel`.
    pub fn start(
        client: &Client,
        kinds: Vec<(PinnedKind, ApiResource)>,
        metrics: &Arc<Metrics>,
        cancel: &CancellationToken,
    ) -> Self {
        let (changed, changes) = watch::channel(0u64);
        let namespace_resource = ApiResource::erase::<Namespace>(&());
        // An Api of PartialObjectMeta makes metadata-only list/watch requests.
        let mut listed = Vec::new();
        let mut triggers = Vec::new();
        let kinds: Vec<WatchedKind> = kinds
            .into_iter()
            .map(|(kind, resource)| {
                let api: Api<Stored> = Api::all_with(client.clone(), &resource);
                let writer = Writer::new(resource.clone());
                let store = writer.as_reader();
                let (trigger, triggered) = mpsc::channel(BUFFER);
                triggers.push(Some(triggered));
                let mut syncs = Syncs::new(kind.kind(), metrics.clone());
                listed.push(spawn_watch(
                    api,
                    writer,
                    Handlers {
                        slim: |object: &mut Stored| holdfast_peers::slim_metadata(&mut object.metadata),
                        fingerprint: pin_fingerprint,
                        observe: move |event: &watcher::Event<Stored>| syncs.observe(event),
                    },
                    &changed,
                    Some(trigger.clone()),
                    cancel,
                ));
                WatchedKind {
                    kind,
                    resource,
                    store,
                    trigger,
                }
            })
            .collect();
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client.clone(), &namespace_resource);
        let writer = Writer::new(namespace_resource.clone());
        let store = writer.as_reader();
        let (relabelled, namespaces) = mpsc::channel(BUFFER);
        listed.push(spawn_watch(
            api,
            writer,
            Handlers {
                slim: |namespace: &mut PartialObjectMeta<DynamicObject>| {
                    holdfast_peers::slim_metadata(&mut namespace.metadata)
                },
                fingerprint: labels_fingerprint,
                observe: |_: &watcher::Event<PartialObjectMeta<DynamicObject>>| {},
            },
            &changed,
            Some(relabelled),
            cancel,
        ));
        let objects = kinds
            .iter()
            .map(|watched| (watched.store.clone(), watched.trigger.clone()))
            .collect();
        tokio::spawn(trigger_relabelled(namespaces, objects));
        Self {
            kinds,
            listed,
            triggers: Mutex::new(triggers),
            namespaces: Namespaces {
                resource: namespace_resource,
                store,
            },
            changes,
        }
    }

    pub fn kinds(&self) -> &[WatchedKind] {
        &self.kinds
    }

    /// Every stored object of every kind, with its kind.
    pub fn objects(&self) -> impl Iterator<Item = (PinnedKind, Arc<Stored>)> + '_ {
        self.kinds.iter().flat_map(|watched| {
            watched
                .store
                .state()
                .into_iter()
                .map(move |object| (watched.kind, object))
        })
    }

    /// The triggers of the `index`th kind's controller (each object the watch applied, and
    /// every object after a re-list); `None` once taken. Every kind's must be taken and polled
    /// (or dropped): the watch waits for a consumer more than [`BUFFER`] triggers behind.
    pub fn take_trigger(
        &self,
        index: usize,
    ) -> Option<impl futures::Stream<Item = Arc<Stored>> + Send + 'static> {
        let triggered = self
            .triggers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(index)
            .and_then(Option::take)?;
        Some(futures::stream::unfold(triggered, |mut triggered| async move {
            triggered.recv().await.map(|object| (object, triggered))
        }))
    }

    pub fn namespaces(&self) -> &Namespaces {
        &self.namespaces
    }

    /// Resolves once every kind and the namespaces have been listed in full.
    pub async fn ready(&self) {
        for listed in &self.listed {
            // A watch that ended (shutdown) is no wait either.
            let _ = listed.clone().wait_for(|listed| *listed).await;
        }
    }

    /// Whether every kind and the namespaces have been listed in full (before that, a store
    /// is empty or partial: what its objects name is not all they name).
    pub fn fully_listed(&self) -> bool {
        self.listed.iter().all(|listed| *listed.borrow())
    }

    /// Changes whenever what the objects reference may have changed (see [`significant`]).
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// Stores holding `kinds`' objects, listed in full or not, without a watch or namespaces
    /// (for tests of the readers).
    #[cfg(test)]
    pub(crate) fn of(kinds: Vec<(PinnedKind, Vec<Stored>)>, listed: bool) -> Self {
        let mut triggers = Vec::new();
        let kinds = kinds
            .into_iter()
            .map(|(kind, objects)| {
                let resource = ApiResource::from_gvk_with_plural(&kind.gvk(), kind.resource());
                let mut writer = Writer::new(resource.clone());
                for object in objects {
                    writer.apply_watcher_event(&watcher::Event::Apply(object));
                }
                let (trigger, triggered) = mpsc::channel(BUFFER);
                triggers.push(Some(triggered));
                WatchedKind {
                    kind,
                    resource,
                    store: writer.as_reader(),
                    trigger,
                }
            })
            .collect();
        Self {
            kinds,
            listed: vec![watch::channel(listed).1],
            triggers: Mutex::new(triggers),
            namespaces: Namespaces::of(&[]),
            changes: watch::channel(0).1,
        }
    }
}

/// Hands the pinned objects of a namespace whose labels changed to their controllers: the
/// labels decide whether they are pinned at all (`holdfast.dev/ignore`) and whether to the
/// mirror, and a refresh round reconciles only the objects naming a tag that moved. A namespace
/// seen for the first time (listed, or new) triggers nothing: its objects' own watches do. Ends
/// with the namespaces' watch.
async fn trigger_relabelled(
    mut namespaces: mpsc::Receiver<Arc<PartialObjectMeta<DynamicObject>>>,
    kinds: Vec<(Store<Stored>, mpsc::Sender<Arc<Stored>>)>,
) {
    // Labels by namespace name, as last seen.
    let mut seen: HashMap<String, u64> = HashMap::new();
    while let Some(namespace) = namespaces.recv().await {
        let name = namespace.metadata.name.clone().unwrap_or_default();
        let labels = labels_fingerprint(&namespace);
        if seen
            .insert(name.clone(), labels)
            .is_none_or(|before| before == labels)
        {
            continue;
        }
        for (store, trigger) in &kinds {
            for object in store.state() {
                if object.metadata.namespace.as_deref() == Some(name.as_str()) {
                    // A closed channel: the controller has stopped, with the term.
                    let _ = trigger.send(object).await;
                }
            }
        }
    }
}

/// What was read off each stored object (the mirror copies it references, the cache keys it
/// names), kept from one reading to the next: an object whose `resourceVersion` and context
/// (`C`: what else the reading depends on) are unchanged is not read again (serialising every
/// object on every pass was most of the mirror's time on a large cluster).
#[derive(Debug)]
pub(crate) struct Index<T, C> {
    /// By uid: the version and context the object was read at, and what was read.
    objects: HashMap<String, (String, C, Vec<T>)>,
    /// Objects read (not reused) so far, for tests.
    reads: usize,
}

impl<T, C> Default for Index<T, C> {
    fn default() -> Self {
        Self {
            objects: HashMap::new(),
            reads: 0,
        }
    }
}

impl<T: Clone + Eq + Hash, C: Copy + PartialEq> Index<T, C> {
    /// What `read` finds in `object` (as one document, [`Stored::document`]) in `context`: read
    /// again only when its version or the context changed.
    pub fn read(
        &mut self,
        object: &Stored,
        context: C,
        read: impl FnOnce(&Value, C) -> Vec<T>,
    ) -> Cow<'_, [T]> {
        let (Some(uid), Some(version)) = (&object.metadata.uid, &object.metadata.resource_version) else {
            // Without a uid and a version there is nothing to key on: read it every time.
            self.reads += 1;
            return Cow::Owned(read(&object.document(), context));
        };
        match self.objects.get(uid) {
            Some((at, was, _)) if at == version && *was == context => {}
            _ => {
                self.reads += 1;
                let found = read(&object.document(), context);
                self.objects
                    .insert(uid.clone(), (version.clone(), context, found));
            }
        }
        self.objects
            .get(uid)
            .map_or(Cow::Owned(Vec::new()), |(_, _, found)| Cow::Borrowed(found))
    }

    /// The union of what `read` finds in `objects` (each with its context); objects no longer
    /// among them are forgotten.
    pub fn union<'a>(
        &mut self,
        objects: impl IntoIterator<Item = (&'a Stored, C)>,
        mut read: impl FnMut(&Value, C) -> Vec<T>,
    ) -> HashSet<T> {
        let mut union = HashSet::new();
        let mut seen = HashSet::new();
        for (object, context) in objects {
            if let Some(uid) = &object.metadata.uid {
                seen.insert(uid.clone());
            }
            union.extend(self.read(object, context, &mut read).iter().cloned());
        }
        self.objects.retain(|uid, _| seen.contains(uid));
        union
    }

    /// Objects read (not reused) so far.
    #[cfg(test)]
    pub(crate) fn reads(&self) -> usize {
        self.reads
    }

    /// Objects remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.objects.len()
    }
}

/// What a watch does with its objects besides storing them.
pub(crate) struct Handlers<K, S, O> {
    /// Leaves of each object only what is kept.
    pub slim: S,
    /// What of an object, changed, makes an event [`significant`].
    pub fingerprint: fn(&K) -> u64,
    /// Sees every event.
    pub observe: O,
}

/// Keeps `writer`'s store by a watch of `api` until `cancel`, each object as `handlers.slim`
/// leaves it; `handlers.observe` sees every event; a [`significant`] event (by
/// `handlers.fingerprint`) bumps `changed`, and `trigger` gets every object applied (all of them
/// when a re-list completes), as kube's shared stores dispatch them. The receiver turns true
/// once the first list is complete.
pub(crate) fn spawn_watch<K, S, O>(
    api: Api<K>,
    writer: Writer<K>,
    handlers: Handlers<K, S, O>,
    changed: &watch::Sender<u64>,
    trigger: Option<mpsc::Sender<Arc<K>>>,
    cancel: &CancellationToken,
) -> watch::Receiver<bool>
where
    K: Resource<DynamicType = ApiResource> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    S: FnMut(&mut K) + Send + 'static,
    O: FnMut(&watcher::Event<K>) + Send + 'static,
{
    let Handlers {
        slim,
        fingerprint,
        mut observe,
    } = handlers;
    let kind = api.resource_url().to_owned();
    let store = writer.as_reader();
    let events = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(slim),
    )
    .take_until(cancel.clone().cancelled_owned());
    let changed = changed.clone();
    let (listed_tx, listed) = watch::channel(false);
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        let mut seen = HashMap::new();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => {
                    if matches!(event, watcher::Event::InitDone) {
                        listed_tx.send_replace(true);
                    }
                    observe(&event);
                    let significant = significant(&mut seen, &event, fingerprint);
                    if significant {
                        changed.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    if let Some(trigger) = &trigger {
                        for object in triggered(event, significant, &store) {
                            // A closed channel: the controller has stopped, with the term.
                            let _ = trigger.send(object).await;
                        }
                    }
                }
                Err(error) => tracing::warn!(%kind, %error, "watch failed; retrying with backoff"),
            }
        }
    });
    listed
}

/// The objects `event` hands to the controller: an applied object only when it is
/// [`significant`] (a pinned object's status, which kapp-controller writes on every sync, is
/// nothing its reconcile reads: reconciling on it re-resolved every pin at every sync), every
/// object once a re-list is complete.
fn triggered<K>(event: watcher::Event<K>, significant: bool, store: &Store<K>) -> Vec<Arc<K>>
where
    K: kube::Resource<DynamicType = ApiResource> + Clone + 'static,
{
    match event {
        watcher::Event::Apply(object) if significant => vec![Arc::new(object)],
        watcher::Event::InitDone => store.state(),
        _ => Vec::new(),
    }
}

/// Counts the syncs kapp-controller makes of objects holdfast pinned, for
/// `holdfast_controller_fetches_avoided`: each time an object's `status.fetch.startedAt` moves
/// (kapp-controller started another fetch), its pins in place (`holdfast.dev/original-refs`
/// entries whose digest the spec still holds) are fetches of a digest that would otherwise
/// have resolved a tag at the registry. The first sight of an object (a start, a new object)
/// counts nothing: the last sync before it is not known.
struct Syncs {
    kind: &'static str,
    metrics: Arc<Metrics>,
    /// The `fetch_started` last seen, by uid.
    started: HashMap<String, u64>,
    /// During a re-list, the uids listed: the others were deleted meanwhile.
    relisted: Option<HashSet<String>>,
}

impl Syncs {
    fn new(kind: &'static str, metrics: Arc<Metrics>) -> Self {
        Self {
            kind,
            metrics,
            started: HashMap::new(),
            relisted: None,
        }
    }

    fn observe(&mut self, event: &watcher::Event<Stored>) {
        match event {
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let Some(uid) = object.metadata.uid.as_deref() else {
                    return;
                };
                if let Some(relisted) = &mut self.relisted {
                    relisted.insert(uid.to_owned());
                }
                let Some(started) = object.fetch_started() else {
                    return;
                };
                let before = self.started.insert(uid.to_owned(), started);
                if before.is_some_and(|before| before != started) {
                    let pins = pins_in_place(object);
                    if pins > 0 {
                        self.metrics.fetches_avoided(self.kind, pins);
                    }
                }
            }
            watcher::Event::Delete(object) => {
                if let Some(uid) = object.metadata.uid.as_deref() {
                    self.started.remove(uid);
                }
            }
            watcher::Event::Init => self.relisted = Some(HashSet::new()),
            watcher::Event::InitDone => {
                if let Some(relisted) = self.relisted.take() {
                    self.started.retain(|uid, _| relisted.contains(uid));
                }
            }
        }
    }
}

/// How many of `object`'s pins are in place (none without the annotation, or with one that
/// does not parse).
fn pins_in_place(object: &Stored) -> usize {
    let annotated = object
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ORIGINAL_REFS_ANNOTATION));
    if !annotated {
        return 0;
    }
    let document = object.document();
    OriginalRefs::from_object(&document).map_or(0, |refs| refs.in_place(&document).count())
}

/// Whether `event` can change what the objects reference: an object added, deleted or with a
/// new `fingerprint`, or a re-list complete. Not the status updates kapp-controller writes on
/// every sync: each wake-up recomputes every object's references. `seen`: fingerprints by uid.
fn significant<K: kube::Resource>(
    seen: &mut HashMap<String, u64>,
    event: &watcher::Event<K>,
    fingerprint: fn(&K) -> u64,
) -> bool {
    let uid = |object: &K| object.meta().uid.clone().unwrap_or_default();
    match event {
        watcher::Event::Apply(object) => {
            let print = fingerprint(object);
            seen.insert(uid(object), print) != Some(print)
        }
        // A re-list replaces the store: remember afresh, and wake once when it is complete.
        watcher::Event::Init => {
            seen.clear();
            false
        }
        watcher::Event::InitApply(object) => {
            seen.insert(uid(object), fingerprint(object));
            false
        }
        watcher::Event::InitDone => true,
        watcher::Event::Delete(object) => {
            seen.remove(&uid(object));
            true
        }
    }
}

/// What a pinned object's reconcile reads of it: the fetch references (its kept spec, hashed as
/// text, not read off `metadata.generation`: Packages are served by kapp-controller's aggregated
/// API, whose objects need not keep one), the labels and annotations (the original refs, the pin
/// policy), the finalizers (a pin refused by a write in between is retried on it) and whether it
/// is being deleted. Not its status nor its `resourceVersion`.
fn pin_fingerprint(object: &Stored) -> u64 {
    let metadata = &object.metadata;
    let mut hasher = DefaultHasher::new();
    object.spec_text().hash(&mut hasher);
    metadata.labels.hash(&mut hasher);
    metadata.annotations.hash(&mut hasher);
    metadata.finalizers.hash(&mut hasher);
    metadata.deletion_timestamp.is_some().hash(&mut hasher);
    hasher.finish()
}

/// What of a namespace decides the mirror's selection: its labels.
fn labels_fingerprint(namespace: &PartialObjectMeta<DynamicObject>) -> u64 {
    let mut hasher = DefaultHasher::new();
    namespace.metadata.labels.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// An App pinned by holdfast (`pinned`: its spec still holds the pin) whose last fetch
    /// started at `started`.
    fn synced(uid: &str, pinned: bool, started: &str) -> Stored {
        let digest = format!("sha256:{}", "a".repeat(64));
        let url = if pinned {
            format!("registry.corp.com/app@{digest}")
        } else {
            "registry.corp.com/app:2".to_string()
        };
        let refs = json!({"/spec/fetch/0/image/url": {"ref": "registry.corp.com/app:1", "digest": digest}});
        serde_json::from_value(json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
            "metadata": {"name": uid, "namespace": "n", "uid": uid,
                "annotations": {ORIGINAL_REFS_ANNOTATION: refs.to_string()}},
            "spec": {"fetch": [{"image": {"url": url}}, {"git": {"url": "https://git.corp.com/c"}}]},
            "status": {"fetch": {"startedAt": started, "exitCode": 0}, "deploy": {"stdout": "x"}},
        }))
        .unwrap()
    }

    /// The Apps' count of fetches avoided.
    fn avoided(metrics: &Metrics) -> String {
        let text = metrics.encode().unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("holdfast_controller_fetches_avoided_total{kind=\"App\"}"));
        line.and_then(|l| l.rsplit(' ').next())
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn each_sync_of_a_pinned_object_counts_its_pins_in_place() {
        let metrics = Arc::new(Metrics::new());
        let mut syncs = Syncs::new("App", metrics.clone());
        let apply = |syncs: &mut Syncs, object: Stored| syncs.observe(&watcher::Event::Apply(object));
        // First sight, then the same fetch again (another status write): no sync seen.
        apply(&mut syncs, synced("a", true, "2026-12-03T10:00:00Z"));
        apply(&mut syncs, synced("a", true, "2026-12-03T10:00:00Z"));
        assert_eq!(avoided(&metrics), "0");
        // Two syncs of the pinned App: one pin each (the git source is not an OCI pin).
        apply(&mut syncs, synced("a", true, "2026-12-03T10:00:30Z"));
        apply(&mut syncs, synced("a", true, "2026-12-03T10:01:00Z"));
        assert_eq!(avoided(&metrics), "2");
        // A sync of an App whose pin was replaced by a tag: nothing avoided.
        apply(&mut syncs, synced("b", false, "2026-12-03T10:00:00Z"));
        apply(&mut syncs, synced("b", false, "2026-12-03T10:00:30Z"));
        assert_eq!(avoided(&metrics), "2");
        // Deleted, or gone from a re-list: forgotten.
        syncs.observe(&watcher::Event::Delete(synced("a", true, "x")));
        syncs.observe(&watcher::Event::Init);
        syncs.observe(&watcher::Event::InitDone);
        assert!(syncs.started.is_empty(), "{:?}", syncs.started);
    }

    fn object(uid: &str, tag: &str, status: &str) -> Stored {
        serde_json::from_value(json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
            "metadata": {"name": uid, "namespace": "n", "uid": uid},
            "spec": {"fetch": [{"image": {"url": format!("registry.corp.com/app:{tag}")}}]},
            "status": {"friendlyDescription": status},
        }))
        .unwrap()
    }

    #[test]
    fn only_spec_changes_additions_deletions_and_relists_wake_the_mirror() {
        let mut seen = HashMap::new();
        let mut wakes = |event: watcher::Event<Stored>| significant(&mut seen, &event, pin_fingerprint);
        assert!(!wakes(watcher::Event::Init));
        assert!(!wakes(watcher::Event::InitApply(object("a", "1", "x"))));
        assert!(wakes(watcher::Event::InitDone));
        assert!(
            !wakes(watcher::Event::Apply(object("a", "1", "syncing"))),
            "status only"
        );
        assert!(
            wakes(watcher::Event::Apply(object("a", "2", "syncing"))),
            "spec changed"
        );
        assert!(wakes(watcher::Event::Apply(object("b", "1", ""))), "added");
        assert!(wakes(watcher::Event::Delete(object("b", "1", ""))), "deleted");
        assert!(wakes(watcher::Event::Apply(object("b", "1", ""))), "added again");
    }

    /// kapp-controller writes a pinned App's status on every sync: that reaches the store but
    /// not the pinning controller, which reconciles an object again only when what it reads of
    /// it changed, and every object after a re-list.
    #[test]
    fn only_what_a_reconcile_reads_triggers_it() {
        let resource = ApiResource::from_gvk_with_plural(&PinnedKind::App.gvk(), "apps");
        let mut writer = Writer::new(resource);
        let store = writer.as_reader();
        let mut seen = HashMap::new();
        let mut names = |event: watcher::Event<Stored>| {
            writer.apply_watcher_event(&event);
            let significant = significant(&mut seen, &event, pin_fingerprint);
            triggered(event, significant, &store)
                .iter()
                .map(|object| object.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        let annotated = |key: &str| {
            let mut app = object("a", "1", "reconciled");
            app.metadata.annotations = Some(BTreeMap::from([(key.to_owned(), "x".to_owned())]));
            app
        };
        assert_eq!(
            names(watcher::Event::Apply(object("a", "1", "new"))),
            ["a"],
            "added"
        );
        assert!(
            names(watcher::Event::Apply(object("a", "1", "syncing"))).is_empty(),
            "status only"
        );
        assert_eq!(
            names(watcher::Event::Apply(object("a", "2", "syncing"))),
            ["a"],
            "spec"
        );
        assert_eq!(
            names(watcher::Event::Apply(annotated("policy"))),
            ["a"],
            "annotations"
        );
        let mut finalized = annotated("policy");
        finalized.metadata.finalizers = Some(vec!["finalizers.kapp-ctrl.k14s.io/delete".into()]);
        assert_eq!(
            names(watcher::Event::Apply(finalized.clone())),
            ["a"],
            "finalizers"
        );
        finalized.metadata.resource_version = Some("9".into());
        assert!(
            names(watcher::Event::Apply(finalized)).is_empty(),
            "another version, same content"
        );
        assert!(names(watcher::Event::Init).is_empty());
        assert!(names(watcher::Event::InitApply(object("b", "1", ""))).is_empty());
        assert_eq!(names(watcher::Event::InitDone), ["b"], "a re-list hands over all");
    }

    #[test]
    fn a_namespaces_labels_are_its_fingerprint() {
        let namespace = |labels: Value| -> PartialObjectMeta<DynamicObject> {
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": "n", "uid": "u", "labels": labels}}))
            .unwrap()
        };
        let a = namespace(json!({"holdfast.dev/mirror": "true"}));
        assert_eq!(labels_fingerprint(&a), labels_fingerprint(&a.clone()));
        assert_ne!(labels_fingerprint(&a), labels_fingerprint(&namespace(json!({}))));
    }

    /// A namespace's labels decide whether and where its objects are pinned: new labels hand
    /// its objects (only) to their controller; a namespace seen for the first time, or again
    /// with the same labels, triggers nothing.
    #[tokio::test]
    async fn a_namespaces_new_labels_trigger_its_objects_only() {
        let mut writer = Writer::new(ApiResource::from_gvk_with_plural(&PinnedKind::App.gvk(), "apps"));
        for (uid, namespace) in [("a", "team"), ("b", "other")] {
            let mut app = object(uid, "1", "");
            app.metadata.namespace = Some(namespace.into());
            writer.apply_watcher_event(&watcher::Event::Apply(app));
        }
        let (trigger, mut triggered) = mpsc::channel(BUFFER);
        let (namespaces, relabelled) = mpsc::channel(BUFFER);
        let task = tokio::spawn(trigger_relabelled(
            relabelled,
            vec![(writer.as_reader(), trigger)],
        ));
        let namespace = |name: &str, labels: Value| -> Arc<PartialObjectMeta<DynamicObject>> {
            Arc::new(
                serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "uid": name, "labels": labels}}))
                .unwrap(),
            )
        };
        for seen in [
            namespace("team", json!({})),
            namespace("other", json!({})),
            namespace("team", json!({})),
            namespace("team", json!({"holdfast.dev/ignore": "true"})),
        ] {
            namespaces.send(seen).await.unwrap();
        }
        drop(namespaces);
        task.await.unwrap();
        let mut names = Vec::new();
        while let Ok(object) = triggered.try_recv() {
            names.push(object.metadata.name.clone().unwrap_or_default());
        }
        assert_eq!(names, ["a"]);
    }
}

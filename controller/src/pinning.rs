//! The pinning reconciler, one controller per pinned kind: catch-up for references admitted
//! unpinned, and moving `follow` pins after their tags moved. Objects being deleted are never
//! touched: a spec change would only bump the generation of an object on its way out.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use holdfast_peers::Served;
use holdfast_pins::{
    PinnedKind, Pinner,
    resolve::{Change, PinUpdate},
};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{ApiResource, Patch, PatchParams},
    runtime::{
        Controller,
        controller::{self, Action},
        events::{Event, EventType, Recorder},
    },
};

use crate::{
    backoff::{Backoff, FIRST_RETRY, RETRY_CEILING},
    metrics::Metrics,
    stored::Stored,
    watched::{Namespaces, Watched},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("building the update: {0}")]
    Patch(#[from] json_patch::PatchError),
    #[error("object has no namespace")]
    NoNamespace,
    #[error(transparent)]
    Deadline(#[from] crate::metrics::DeadlineExceeded),
}

/// Who the API server records as the controller: `reportingController` of its Events and field
/// manager of its pin patches, so `managedFields` tell a pin the controller wrote from one the
/// webhook added to somebody else's write.
pub const MANAGER: &str = "holdfast-controller";

/// Namespaces labelled so are left alone, as the webhook configurations' namespaceSelector does.
pub const IGNORE_LABEL: &str = "holdfast.dev/ignore";

struct Ctx {
    own_namespace: String,
    client: Client,
    namespaces: Namespaces,
    resource: ApiResource,
    kind: PinnedKind,
    pinner: Arc<Pinner>,
    /// Keyed by namespace and name (one context per kind).
    retries: Backoff<(String, String)>,
    recorder: Recorder,
    metrics: Arc<Metrics>,
}

/// Reconciles of one kind in flight at once. Unbounded, a first list (every object triggered)
/// can have thousands of reconciles, each with its object's document, in memory together.
const CONCURRENCY: u16 = 16;

/// Runs a controller for each kind `watched` follows, driven by its watch, until `cancel`.
/// The refresher hands it the objects naming a tag that moved, through the same triggers
/// ([`crate::watched::WatchedKind::trigger`]); every object is reconciled again when
/// `reconcile_all` changes (the mirror, after a copy).
pub async fn run(
    client: Client,
    own_namespace: String,
    pinner: Arc<Pinner>,
    watched: Arc<Watched>,
    reconcile_all: watch::Receiver<u64>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut controllers = Vec::new();
    for (index, followed) in watched.kinds().iter().enumerate() {
        let Some(trigger) = watched.take_trigger(index) else {
            continue;
        };
        let resource = followed.resource.clone();
        let ctx = Arc::new(Ctx {
            own_namespace: own_namespace.clone(),
            client: client.clone(),
            namespaces: watched.namespaces().clone(),
            resource: resource.clone(),
            kind: followed.kind,
            pinner: pinner.clone(),
            retries: Backoff::new(FIRST_RETRY, RETRY_CEILING),
            recorder: Recorder::new(client.clone(), MANAGER.into()),
            metrics: metrics.clone(),
        });
        let controller = Controller::for_shared_stream_with(trigger, followed.store.clone(), resource)
            .with_config(controller::Config::default().concurrency(CONCURRENCY))
            .reconcile_all_on(changes(reconcile_all.clone()))
            .graceful_shutdown_on(cancel.clone().cancelled_owned())
            .run(reconcile, error_policy, ctx)
            .take_until(crate::shutdown::never_listed(
                cancel.clone(),
                followed.store.clone(),
            ))
            .for_each(|result| async move {
                if let Err(error) = result {
                    tracing::debug!(%error, "pinning reconcile");
                }
            });
        controllers.push(controller);
    }
    futures::future::join_all(controllers).await;
}

/// The pinned kinds `served` (discovered with [`PinnedKind::gvk`]), with their resources.
pub fn served_kinds(served: &Served) -> Vec<(PinnedKind, ApiResource)> {
    PinnedKind::ALL
        .into_iter()
        .filter_map(|kind| Some((kind, served.get(&kind.gvk())?)))
        .collect()
}

fn changes(counter: watch::Receiver<u64>) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold(counter, |mut counter| async move {
        counter.changed().await.ok().map(|()| ((), counter))
    })
}

impl Ctx {
    /// Whether a bundle was relocated at `from` (its images in its repository there), as far
    /// as this controller knows: every mirror copy is; upstream, what the copy to `to` found.
    fn relocated(&self, from: &holdfast_registry::Reference, to: &str) -> Option<bool> {
        let on_mirror = self
            .pinner
            .mirror()
            .is_some_and(|mirror| mirror.location.registry() == from.registry());
        if on_mirror {
            return Some(true);
        }
        self.pinner.copying().colocated_upstream(to)
    }

    /// The labels of the namespace of an object to pin (they select the mirror); `None` for the
    /// namespaces the webhooks never see: kube-system, holdfast's own, and opted-out ones. Read
    /// from the namespaces' watch; asked of the API server only for a namespace it has not
    /// shown yet (one created a moment ago).
    async fn pinned_namespace(&self, namespace: &str) -> Result<Option<BTreeMap<String, String>>, Error> {
        if namespace == "kube-system" || namespace == self.own_namespace {
            return Ok(None);
        }
        let labels = match self.namespaces.labels(namespace) {
            Some(labels) => labels,
            None => Api::<Namespace>::all(self.client.clone())
                .get_metadata(namespace)
                .await?
                .labels()
                .clone(),
        };
        let opted_out = labels.get(IGNORE_LABEL).is_some_and(|v| v == "true");
        Ok((!opted_out).then_some(labels))
    }
}

/// The metrics' name of this controller.
const CONTROLLER: &str = "pinning";

#[tracing::instrument(
    skip(object, ctx),
    fields(kind = ctx.kind.kind(), namespace = object.metadata.namespace.as_deref(), name = %object.name_any())
)]
async fn reconcile(object: Arc<Stored>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let metrics = ctx.metrics.clone();
    metrics
        .reconcile(CONTROLLER, ctx.kind.kind(), pin(object, ctx))
        .await
}

async fn pin(object: Arc<Stored>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if object.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = object.namespace().ok_or(Error::NoNamespace)?;
    let Some(labels) = ctx.pinned_namespace(&namespace).await? else {
        return Ok(Action::await_change());
    };
    let name = object.name_any();
    let stored = object.document();
    let update = ctx
        .pinner
        .reconcile(ctx.kind, &namespace, &labels, &stored)
        .await?;
    for warning in &update.warnings {
        tracing::debug!(kind = ctx.kind.kind(), %namespace, %name, %warning, "unpinned reference");
    }
    let mut events = events_for(&update);
    // kapp-controller fetched it: a bundle moved to another copy of its digest may be cached.
    let moves = if object.fetch_started().is_some() {
        crate::cached_fetch::cached_moves(&stored, &update.ops, |from, to| ctx.relocated(from, to))
    } else {
        Vec::new()
    };
    for moved in &moves {
        tracing::warn!(kind = ctx.kind.kind(), %namespace, %name, field = %moved.field, from = %moved.from, to = %moved.to, "bundle moved; kapp-controller may keep its cached fetch");
        events.push(crate::cached_fetch::event(ctx.kind.kind(), moved));
    }
    if !update.ops.is_empty() {
        let api: Api<Stored> = Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.resource);
        let params = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        let patched = api
            .patch(&name, &params, &Patch::Json::<()>(json_patch::Patch(update.ops)))
            .await;
        match patched {
            Ok(_) => {}
            // kapp-controller, say, added its finalizer after the create. That write's watch
            // event brings the object back; the backoff bounds a guard that keeps failing.
            Err(error) if guard_failed(&error) => {
                tracing::info!(kind = ctx.kind.kind(), %namespace, %name, "changed since read; pinning again");
                return Ok(Action::requeue(ctx.retries.failed((namespace, name))));
            }
            Err(error) => return Err(error.into()),
        }
        tracing::info!(kind = ctx.kind.kind(), %namespace, %name, change = ?update.change, "pinned fetch references");
        for _ in &moves {
            ctx.metrics.bundle_move_cached(ctx.kind.kind());
        }
    }
    let reference = object.object_ref(&ctx.resource);
    for event in &events {
        // An Event is a courtesy to the user: failing to record one never fails the reconcile.
        if let Err(error) = ctx.recorder.publish(event, &reference).await {
            tracing::warn!(kind = ctx.kind.kind(), %namespace, %name, reason = %event.reason, %error, "recording an Event");
        }
    }
    // A reference that could not be pinned (registry down, tag not pushed yet) is tried again
    // without waiting for the next refresh round.
    let key = (namespace, name);
    Ok(if update.unresolved == 0 {
        ctx.retries.succeeded(&key);
        Action::await_change()
    } else {
        Action::requeue(ctx.retries.failed(key))
    })
}

/// Whether a failed patch failed on its `resourceVersion` test, the object having changed
/// since the watch showed it: the API server answers a failed test with a bare 422, no causes
/// (a patch the schema refuses names its causes).
fn guard_failed(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status)
        if status.code == 422 && status.details.as_ref().is_none_or(|d| d.causes.is_empty()))
}

/// The Events an update deserves: `Pinned`/`Repinned` for what it changes, `PinStale` when the
/// registry failed and cached digests were used, `PinFailed` when references stay unpinned.
fn events_for(update: &PinUpdate) -> Vec<Event> {
    let event = |type_, reason: &str, note: String| Event {
        type_,
        reason: reason.into(),
        note: Some(truncate(note)),
        action: "Pin".into(),
        secondary: None,
    };
    let mut events = Vec::new();
    match update.change {
        Some(Change::Pinned) => events.push(event(
            EventType::Normal,
            "Pinned",
            "fetch references pinned to digests".into(),
        )),
        Some(Change::Repinned) => events.push(event(
            EventType::Normal,
            "Repinned",
            "tags moved: follow pins moved to the digests they now hold".into(),
        )),
        None => {}
    }
    let warnings = update.warnings.join("; ");
    if update.unresolved > 0 {
        events.push(event(EventType::Warning, "PinFailed", warnings));
    } else if update.stale > 0 {
        events.push(event(EventType::Warning, "PinStale", warnings));
    }
    events
}

/// Event notes are limited to 1 kB.
pub(crate) fn truncate(note: String) -> String {
    const MAX: usize = 1000;
    holdfast_registry::truncated(&note, MAX).into_owned()
}

/// A failed update (the object changed under us, the API server is unavailable) is retried.
fn error_policy(object: Arc<Stored>, error: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(name = %object.name_any(), %error, "pinning failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reasons(update: &PinUpdate) -> Vec<String> {
        events_for(update).into_iter().map(|e| e.reason).collect()
    }

    #[test]
    fn each_update_gets_the_events_it_deserves() {
        assert!(reasons(&PinUpdate::default()).is_empty());
        let pinned = PinUpdate {
            change: Some(Change::Pinned),
            ..PinUpdate::default()
        };
        assert_eq!(reasons(&pinned), ["Pinned"]);
        let moved_with_one_failure = PinUpdate {
            change: Some(Change::Repinned),
            unresolved: 1,
            stale: 1,
            warnings: vec!["/spec/fetch/1/image/url: registry down".into()],
            ..PinUpdate::default()
        };
        assert_eq!(reasons(&moved_with_one_failure), ["Repinned", "PinFailed"]);
        let stale = PinUpdate {
            stale: 1,
            ..PinUpdate::default()
        };
        let events = events_for(&stale);
        assert_eq!(events[0].reason, "PinStale");
        assert_eq!(events[0].type_, EventType::Warning);
    }

    #[test]
    fn long_notes_are_cut_to_the_events_api_limit() {
        let note = truncate("é".repeat(800));
        assert!(note.len() <= 1003 && note.ends_with('…'), "{}", note.len());
        assert_eq!(truncate("short".into()), "short");
    }

    /// The exact requests `reconcile` sends, against a mocked API server.
    mod api {
        use std::time::SystemTime;

        use holdfast_cache::{CacheConfig, CacheEntry, CacheKey, DigestCache, Scope, testing::Unreachable};
        use holdfast_registry::{Digest, Reference};
        use http::{Method, StatusCode};
        use serde_json::{Value, json};

        use super::super::*;
        use crate::fixtures::{self, ApiServer};

        const NAMESPACE: &str = "team";
        const TAGGED: &str = "registry.example/team/app:1.0.0";

        fn digest() -> Digest {
            Digest::sha256_of(b"team/app 1.0.0")
        }

        /// A context for Apps whose cache holds a fresh entry for [`TAGGED`], the namespaces'
        /// watch having shown `namespaces`.
        fn context(namespaces: Namespaces) -> (Arc<Ctx>, Arc<DigestCache>, ApiServer) {
            let (client, server) = fixtures::mock();
            // Never asked: every figure below comes from the cache.
            let cache = Arc::new(DigestCache::new(
                Arc::new(Unreachable),
                CacheConfig::default(),
                None,
            ));
            let reference = Reference::parse(TAGGED).unwrap_or_else(|e| panic!("{e}"));
            let now = SystemTime::now();
            cache.insert(CacheEntry {
                key: CacheKey::tag(&reference, Scope::Anonymous),
                digest: digest(),
                tag: None,
                resolved_at: now,
                checked_at: now,
                error: None,
                secret_uid: None,
            });
            let ctx = Ctx {
                own_namespace: "holdfast-system".into(),
                client: client.clone(),
                namespaces,
                resource: ApiResource::from_gvk_with_plural(&PinnedKind::App.gvk(), "apps"),
                kind: PinnedKind::App,
                pinner: Arc::new(crate::term::pinner(cache.clone(), None, None)),
                retries: Backoff::new(FIRST_RETRY, RETRY_CEILING),
                recorder: Recorder::new(client, MANAGER.into()),
                metrics: Arc::default(),
            };
            (Arc::new(ctx), cache, server)
        }

        fn app(extra_metadata: Value) -> Value {
            let mut metadata = json!({
                "name": "app",
                "namespace": NAMESPACE,
                "uid": "app-uid",
                "resourceVersion": "41",
            });
            if let (Some(metadata), Value::Object(extra)) = (metadata.as_object_mut(), extra_metadata) {
                metadata.extend(extra);
            }
            json!({
                "apiVersion": "kappctrl.k14s.io/v1alpha1",
                "kind": "App",
                "metadata": metadata,
                "spec": {
                    "serviceAccountName": "default",
                    "fetch": [{"image": {"url": TAGGED}}],
                    "template": [{"ytt": {}}],
                    "deploy": [{"kapp": {}}],
                },
            })
        }

        fn object(value: &Value) -> Arc<Stored> {
            Arc::new(serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}")))
        }

        /// The test namespace as the namespaces' watch shows it.
        fn watched_namespace(labels: &[(&str, &str)]) -> Namespaces {
            Namespaces::of(&[(NAMESPACE, labels)])
        }

        /// The Namespace lookup of a reconcile in a namespace the watch has not shown yet.
        async fn namespace_is_read(server: &mut ApiServer) {
            let (_, answer) = server
                .expect(Method::GET, &format!("/api/v1/namespaces/{NAMESPACE}"))
                .await;
            answer.ok(&json!({
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": {"name": NAMESPACE, "uid": "ns-uid", "labels": {"kubernetes.io/metadata.name": NAMESPACE}},
            }));
        }

        fn patch_path() -> String {
            format!(
                "/apis/kappctrl.k14s.io/v1alpha1/namespaces/{NAMESPACE}/apps/app?&fieldManager=holdfast-controller"
            )
        }

        /// An App with a tag whose digest is cached: one JSON patch, guarded by the
        /// resourceVersion the watch showed (its `test` op first), sent as holdfast-controller,
        /// then the `Pinned` Event; the registry is not asked.
        #[tokio::test]
        async fn a_cached_tag_is_pinned_with_a_guarded_json_patch_as_holdfast_controller() {
            let (ctx, cache, mut server) = context(watched_namespace(&[]));
            let stored = app(json!({}));
            let pinned = format!("registry.example/team/app@{}", digest());
            let api = {
                let (stored, pinned) = (stored.clone(), pinned.clone());
                tokio::spawn(async move {
                    let (patch, answer) = server.expect(Method::PATCH, &patch_path()).await;
                    let original =
                        json!({"/spec/fetch/0/image/url": {"ref": TAGGED, "digest": digest().as_str()}});
                    assert_eq!(
                        patch,
                        json!([
                            {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
                            {"op": "add", "path": "/metadata/annotations", "value": {
                                "holdfast.dev/original-refs": original.to_string(),
                            }},
                            {"op": "replace", "path": "/spec/fetch/0/image/url", "value": pinned},
                        ])
                    );
                    let mut patched = stored;
                    patched["spec"]["fetch"][0]["image"]["url"] = json!(pinned);
                    answer.ok(&patched);
                    let (event, answer) = server
                        .expect(
                            Method::POST,
                            &format!("/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events?"),
                        )
                        .await;
                    assert_eq!(event["reason"], "Pinned");
                    assert_eq!(event["type"], "Normal");
                    assert_eq!(event["reportingController"], MANAGER);
                    assert_eq!(event["regarding"]["kind"], "App");
                    assert_eq!(event["regarding"]["name"], "app");
                    assert_eq!(event["regarding"]["uid"], "app-uid");
                    answer.json(StatusCode::CREATED, &event);
                    server
                })
            };
            let metrics = ctx.metrics.clone();
            let reconciled = reconcile(object(&stored), ctx).await;
            assert_eq!(
                reconciled.unwrap_or_else(|e| panic!("reconcile failed: {e}")),
                Action::await_change()
            );
            let server = api.await.unwrap_or_else(|e| panic!("mock API server: {e}"));
            server.done().await;
            assert_eq!(metrics.reconciles(CONTROLLER, "App", "ok"), 1);
            assert_eq!(
                cache
                    .stats
                    .registry_lookups
                    .load(std::sync::atomic::Ordering::Relaxed),
                0
            );
        }

        /// An object being deleted is not touched: not even its namespace is read.
        #[tokio::test]
        async fn an_object_being_deleted_sends_nothing() {
            let (ctx, _, server) = context(Namespaces::of(&[]));
            let leaving = app(json!({
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "finalizers": ["kapp.k14s.io/delete"],
            }));
            let reconciled = reconcile(object(&leaving), ctx).await;
            assert_eq!(
                reconciled.unwrap_or_else(|e| panic!("reconcile failed: {e}")),
                Action::await_change()
            );
            server.done().await;
        }

        /// An object in a namespace labelled `holdfast.dev/ignore=true` (by the namespaces'
        /// watch) is left alone: no request at all.
        #[tokio::test]
        async fn an_object_in_an_opted_out_namespace_sends_nothing() {
            let (ctx, _, server) = context(watched_namespace(&[(IGNORE_LABEL, "true")]));
            let reconciled = reconcile(object(&app(json!({}))), ctx).await;
            assert_eq!(
                reconciled.unwrap_or_else(|e| panic!("reconcile failed: {e}")),
                Action::await_change()
            );
            server.done().await;
        }

        /// The resourceVersion guard failed (a bare 422, no causes: the object changed since
        /// the watch showed it): a quiet requeue after the first retry delay, no error, no Event.
        /// The namespace is one the watch has not shown yet: it is read first.
        #[tokio::test]
        async fn a_failed_guard_is_requeued_without_an_error() {
            let (ctx, _, mut server) = context(Namespaces::of(&[]));
            let stored = app(json!({}));
            let api = tokio::spawn(async move {
                namespace_is_read(&mut server).await;
                let (patch, answer) = server.expect(Method::PATCH, &patch_path()).await;
                assert_eq!(patch[0]["op"], "test");
                answer.json(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    &fixtures::status(
                        422,
                        "Invalid",
                        "the server rejected our request due to an error in our request",
                    ),
                );
                server
            });
            let reconciled = reconcile(object(&stored), ctx).await;
            assert_eq!(
                reconciled.unwrap_or_else(|e| panic!("a failed guard is no error: {e}")),
                Action::requeue(FIRST_RETRY)
            );
            let server = api.await.unwrap_or_else(|e| panic!("mock API server: {e}"));
            server.done().await;
        }
    }

    #[test]
    fn only_a_bare_422_is_a_failed_resource_version_guard() {
        use kube::core::{Status, response::StatusCause, response::StatusDetails};
        let status = |code, causes: Vec<StatusCause>| {
            kube::Error::Api(
                Status::failure(
                    "the server rejected our request due to an error in our request",
                    "Invalid",
                )
                .with_code(code)
                .with_details(StatusDetails {
                    name: String::new(),
                    group: String::new(),
                    kind: String::new(),
                    uid: String::new(),
                    causes,
                    retry_after_seconds: 0,
                })
                .boxed(),
            )
        };
        assert!(guard_failed(&status(422, Vec::new())));
        let schema = StatusCause {
            reason: "FieldValueInvalid".into(),
            message: "must be a string".into(),
            field: "spec.fetch[0].image.url".into(),
        };
        assert!(!guard_failed(&status(422, vec![schema])));
        assert!(!guard_failed(&status(409, Vec::new())));
    }
}

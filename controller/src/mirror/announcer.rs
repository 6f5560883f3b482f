//! Events on the cache entries a copy or a deletion concerns, recorded in the background and
//! only within the leader's term: the term's end cancels those still in flight, so a deposed
//! leader records none after it, and [`Announcer::close`] waits until none runs.

use std::sync::Arc;

use holdfast_cache::{CacheKey, cluster_store};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams},
    runtime::events::{Event, EventType, Recorder},
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// Records Events on the cache entries a copy or a deletion concerns, in holdfast's namespace.
pub(super) struct Announcer {
    recorder: Recorder,
    entries: Api<DynamicObject>,
    namespace: String,
    /// The term's: its end stops what is being recorded.
    cancel: CancellationToken,
    tasks: TaskTracker,
}

impl Announcer {
    /// Records until `cancel` (the leader's term).
    pub(super) fn new(client: Client, namespace: &str, cancel: CancellationToken) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), crate::pinning::MANAGER.into()),
            entries: cluster_store::api(client, namespace),
            namespace: namespace.to_owned(),
            cancel,
            tasks: TaskTracker::new(),
        }
    }

    /// Takes no more Events and waits until none is being recorded (at once after the term's
    /// end: those in flight are cancelled).
    pub(super) async fn close(&self) {
        self.tasks.close();
        self.tasks.wait().await;
    }

    /// Publishes in the background: an Event is a courtesy, never a wait for the copier.
    pub(super) fn spawn(
        self: &Arc<Self>,
        keys: Vec<CacheKey>,
        type_: EventType,
        reason: &'static str,
        action: &'static str,
        note: String,
    ) {
        let this = self.clone();
        self.tasks.spawn(async move {
            let event = Event {
                type_,
                reason: reason.into(),
                note: Some(crate::pinning::truncate(note)),
                action: action.into(),
                secondary: None,
            };
            let record = async {
                for key in keys {
                    let reference = this.reference(&key).await;
                    if let Err(error) = this.recorder.publish(&event, &reference).await {
                        tracing::warn!(reference = %key.reference, reason, %error, "recording an Event");
                    }
                }
            };
            tokio::select! {
                () = this.cancel.cancelled() => tracing::debug!(reason, "the term ended; Event not recorded"),
                () = record => {}
            }
        });
    }

    /// The entry's object reference, with its uid when the list finds it (`kubectl describe`
    /// matches Events by uid; the Role has list, not get).
    async fn reference(&self, key: &CacheKey) -> ObjectReference {
        let name = cluster_store::object_name(key);
        let uid = self
            .entries
            .list_metadata(&ListParams::default().fields(&format!("metadata.name={name}")))
            .await
            .ok()
            .and_then(|list| list.items.into_iter().next())
            .and_then(|object| object.metadata.uid);
        ObjectReference {
            api_version: Some("holdfast.dev/v1alpha1".into()),
            kind: Some("DigestCacheEntry".into()),
            name: Some(name),
            namespace: Some(self.namespace.clone()),
            uid,
            ..ObjectReference::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use holdfast_cache::Scope;
    use holdfast_registry::Reference;
    use http::Method;

    use super::*;
    use crate::fixtures;

    /// An Event still being recorded when the term ends is dropped, its request unanswered, and
    /// nothing is sent after: a deposed leader writes no Event.
    #[tokio::test]
    async fn the_terms_end_cancels_the_events_in_flight() {
        let (client, mut server) = fixtures::mock();
        let cancel = CancellationToken::new();
        let announcer = Arc::new(Announcer::new(client, "holdfast-system", cancel.clone()));
        let Ok(reference) = Reference::parse("registry.corp.com/app:1") else {
            panic!("a reference");
        };
        let keys = vec![CacheKey::tag(&reference, Scope::Anonymous)];
        announcer.spawn(keys, EventType::Normal, "MirrorCopied", "Copy", "copied".into());
        let name = cluster_store::object_name(&CacheKey::tag(&reference, Scope::Anonymous));
        let (_, lookup) = server
            .expect(
                Method::GET,
                &format!("/apis/holdfast.dev/v1alpha1/namespaces/holdfast-system/digestcacheentries?&fieldSelector=metadata.name%3D{name}"),
            )
            .await;
        // The term ends while the entry is being looked up.
        cancel.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), announcer.close())
            .await
            .unwrap_or_else(|_| panic!("close waited for a cancelled Event"));
        drop(lookup);
        let Ok(announcer) = Arc::try_unwrap(announcer) else {
            panic!("the announcer is still shared");
        };
        drop(announcer);
        server.done().await;
    }
}

//! Events on the cache entries a copy or a deletion concerns.

use std::sync::Arc;

use holdfast_cache::{CacheKey, cluster_store};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams},
    runtime::events::{Event, EventType, Recorder},
};

/// Records Events on the cache entries a copy or a deletion concerns, in holdfast's namespace.
pub(super) struct Announcer {
    recorder: Recorder,
    entries: Api<DynamicObject>,
    namespace: String,
}

impl Announcer {
    pub(super) fn new(client: Client, namespace: &str) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), crate::pinning::MANAGER.into()),
            entries: cluster_store::api(client, namespace),
            namespace: namespace.to_owned(),
        }
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
        tokio::spawn(async move {
            let event = Event {
                type_,
                reason: reason.into(),
                note: Some(crate::pinning::truncate(note)),
                action: action.into(),
                secondary: None,
            };
            for key in keys {
                let reference = this.reference(&key).await;
                if let Err(error) = this.recorder.publish(&event, &reference).await {
                    tracing::warn!(reference = %key.reference, reason, %error, "recording an Event");
                }
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

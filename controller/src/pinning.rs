//! The pinning reconciler, one controller per pinned kind: catch-up for references admitted
//! unpinned, and moving `follow` pins after their tags moved. Objects being deleted are never
//! touched: a spec change would only bump the generation of an object on its way out.

use std::{sync::Arc, time::Duration};

use futures::{Stream, StreamExt};
use holdfast_pins::{PinnedKind, Pinner};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    discovery,
    runtime::{Controller, controller::Action, watcher},
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
}

/// How soon an object with a reference that could not be pinned is tried again.
const UNPINNED_RETRY: Duration = Duration::from_secs(60);

/// Namespaces labelled so are left alone, as the webhook configurations' namespaceSelector does.
pub const IGNORE_LABEL: &str = "holdfast.dev/ignore";

struct Ctx {
    own_namespace: String,
    client: Client,
    resource: ApiResource,
    kind: PinnedKind,
    pinner: Arc<Pinner>,
}

/// Runs a controller for each pinned kind whose API is installed, until `cancel`. Every object
/// is reconciled again after each refresh round (`rounds` changes).
pub async fn run(
    client: Client,
    own_namespace: String,
    pinner: Arc<Pinner>,
    rounds: watch::Receiver<u64>,
    cancel: CancellationToken,
) {
    let mut controllers = Vec::new();
    for kind in PinnedKind::ALL {
        let gvk = GroupVersionKind::gvk(kind.group(), "v1alpha1", kind.kind());
        let (resource, _) = match discovery::pinned_kind(&client, &gvk).await {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(kind = kind.kind(), %error, "API not available; not reconciling this kind");
                continue;
            }
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let ctx = Arc::new(Ctx {
            own_namespace: own_namespace.clone(),
            client: client.clone(),
            resource: resource.clone(),
            kind,
            pinner: pinner.clone(),
        });
        let controller = Controller::new_with(api, watcher::Config::default(), resource)
            .reconcile_all_on(round_ends(rounds.clone()))
            .graceful_shutdown_on(cancel.clone().cancelled_owned())
            .run(reconcile, error_policy, ctx)
            .for_each(|result| async move {
                if let Err(error) = result {
                    tracing::debug!(%error, "pinning reconcile");
                }
            });
        controllers.push(controller);
    }
    futures::future::join_all(controllers).await;
}

fn round_ends(rounds: watch::Receiver<u64>) -> impl Stream<Item = ()> + Send {
    futures::stream::unfold(rounds, |mut rounds| async move {
        rounds.changed().await.ok().map(|()| ((), rounds))
    })
}

impl Ctx {
    /// The namespaces the webhooks never see: kube-system, holdfast's own, and opted-out ones.
    async fn excluded(&self, namespace: &str) -> Result<bool, Error> {
        if namespace == "kube-system" || namespace == self.own_namespace {
            return Ok(true);
        }
        let meta = Api::<Namespace>::all(self.client.clone())
            .get_metadata(namespace)
            .await?;
        Ok(meta.labels().get(IGNORE_LABEL).is_some_and(|v| v == "true"))
    }
}

async fn reconcile(object: Arc<DynamicObject>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    if object.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = object.namespace().ok_or(Error::NoNamespace)?;
    if ctx.excluded(&namespace).await? {
        return Ok(Action::await_change());
    }
    let stored = serde_json::to_value(object.as_ref()).unwrap_or_default();
    let update = ctx.pinner.reconcile(ctx.kind, &namespace, &stored).await?;
    for warning in &update.warnings {
        tracing::debug!(kind = ctx.kind.kind(), %namespace, name = %object.name_any(), %warning, "unpinned reference");
    }
    if !update.ops.is_empty() {
        let api: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &namespace, &ctx.resource);
        api.patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(json_patch::Patch(update.ops)),
        )
        .await?;
        tracing::info!(kind = ctx.kind.kind(), %namespace, name = %object.name_any(), "pinned fetch references");
    }
    // A reference that could not be pinned (registry down, tag not pushed yet) is tried again
    // without waiting for the next refresh round.
    Ok(if update.warnings.is_empty() {
        Action::await_change()
    } else {
        Action::requeue(UNPINNED_RETRY)
    })
}

/// A failed update (the object changed under us, the API server is unavailable) is retried.
fn error_policy(object: Arc<DynamicObject>, error: &Error, _: Arc<Ctx>) -> Action {
    tracing::warn!(name = %object.name_any(), %error, "pinning failed; retrying");
    Action::requeue(Duration::from_secs(5))
}

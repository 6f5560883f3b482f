//! The end of a term for kube's controllers. `graceful_shutdown_on` lets the running reconciles
//! finish, but kube holds a controller's runner until its store is ready (nothing reconciles
//! before the first complete list), and the graceful shutdown waits for that runner: for a kind
//! whose list is forbidden for good (a rule taken out of the ClusterRole) the store is never
//! ready, and the term's end waited out the renewal deadline. [`never_listed`] ends such a
//! controller at once; it had reconciled nothing.

use futures::FutureExt as _;
use kube::runtime::reflector::{Lookup, Store};
use tokio_util::sync::CancellationToken;

/// Resolves when `cancel` is cancelled while `store` has not been listed in full (or its writer
/// is gone); never otherwise, so that the graceful shutdown of a listed store's controller runs
/// its course. For a controller's `take_until`.
pub(crate) async fn never_listed<K>(cancel: CancellationToken, store: Store<K>)
where
    K: Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    cancel.cancelled().await;
    if let Some(Ok(())) = store.wait_until_ready().now_or_never() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use std::{sync::Arc, time::Duration};

    use futures::StreamExt as _;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{
        Controller,
        controller::Action,
        reflector::{self, store::Writer},
        watcher,
    };

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    /// A controller over `store`, gracefully shut down on `cancel` and ended by
    /// [`never_listed`]; resolves when it has stopped.
    async fn controller(store: reflector::Store<ConfigMap>, cancel: CancellationToken) {
        Controller::for_stream(
            futures::stream::pending::<Result<ConfigMap, watcher::Error>>(),
            store.clone(),
        )
        .graceful_shutdown_on(cancel.clone().cancelled_owned())
        .run(
            |_: Arc<ConfigMap>, _: Arc<()>| async { Ok::<_, Never>(Action::await_change()) },
            |_, _: &Never, _| Action::await_change(),
            Arc::new(()),
        )
        .take_until(never_listed(cancel, store))
        .for_each(|_| async {})
        .await;
    }

    /// A store that never got its first list (a forbidden watch): the term's end stops its
    /// controller at once.
    #[tokio::test]
    async fn a_controller_whose_store_never_listed_stops_at_once() {
        let writer = Writer::<ConfigMap>::default();
        let cancel = CancellationToken::new();
        let running = tokio::spawn(controller(writer.as_reader(), cancel.clone()));
        cancel.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(5), running).await;
        assert!(
            stopped.is_ok(),
            "the controller waited for a store that is never listed"
        );
        drop(writer);
    }

    /// A listed store's controller is left to its graceful shutdown.
    #[tokio::test]
    async fn a_listed_store_is_left_to_the_graceful_shutdown() {
        let mut writer = Writer::<ConfigMap>::default();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let ended = tokio::time::timeout(
            Duration::from_millis(200),
            never_listed(cancel, writer.as_reader()),
        )
        .await;
        assert!(ended.is_err(), "never_listed ended a listed store's controller");
    }
}

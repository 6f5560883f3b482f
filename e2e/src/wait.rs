//! Bounded waits on watches: tests never sleep for a condition the API server can tell them.

use std::{collections::BTreeMap, fmt::Debug, time::Duration};

use anyhow::{Context, Result};
use kube::{
    Api, Resource,
    runtime::wait::{Condition, await_condition},
};
use serde::de::DeserializeOwned;

/// Long enough for the controller manager's work on a loaded 2-core machine, short enough to fail.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits, on a watch, until `name` satisfies `condition`; returns the object as last seen.
pub async fn until<K, C>(api: &Api<K>, name: &str, condition: C) -> Result<Option<K>>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
    C: Condition<K>,
{
    tokio::time::timeout(DEFAULT_TIMEOUT, await_condition(api.clone(), name, condition))
        .await
        .with_context(|| format!("timed out after {DEFAULT_TIMEOUT:?} waiting for {name}"))?
        .with_context(|| format!("watching {name}"))
}

/// Waits until the object with this `uid` is gone.
pub async fn deleted<K>(api: &Api<K>, name: &str, uid: &str) -> Result<()>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    gone(api.clone(), name, uid, DEFAULT_TIMEOUT).await
}

/// Waits, at most `timeout` and through watch errors, until the object `name` with this `uid`
/// is gone (none by that name, or one with another uid).
pub async fn gone<K>(api: Api<K>, name: &str, uid: &str, timeout: Duration) -> Result<()>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    let absent = |objects: &[K]| objects.iter().all(|o| o.meta().uid.as_deref() != Some(uid));
    until_listed(api, config, absent, timeout)
        .await
        .with_context(|| format!("{name} not gone"))
        .map(drop)
}

/// Waits, on a watch of the objects `config` selects, until the set of them satisfies `done`;
/// returns that set. A watch error (an API server restarting, a dropped connection) is waited
/// out within `timeout`: the watcher lists and watches again after a backoff, and the error is
/// named if the time runs out.
pub async fn until_listed<K>(
    api: Api<K>,
    config: kube::runtime::watcher::Config,
    done: impl Fn(&[K]) -> bool,
    timeout: Duration,
) -> Result<Vec<K>>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    use futures::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher::Event};
    let key = |o: &K| {
        format!(
            "{}/{}",
            o.meta().namespace.as_deref().unwrap_or_default(),
            o.meta().name.as_deref().unwrap_or_default()
        )
    };
    let mut events = std::pin::pin!(kube::runtime::watcher(api, config).default_backoff());
    let mut last_error = None;
    let wait = async {
        // Judged only on whole lists: once the initial listing is in, then after every change.
        let (mut objects, mut listing) = (BTreeMap::new(), None::<BTreeMap<String, K>>);
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    last_error = Some(error);
                    continue;
                }
            };
            match event {
                Event::Init => listing = Some(BTreeMap::new()),
                Event::InitApply(o) => {
                    listing.get_or_insert_default().insert(key(&o), o);
                }
                Event::InitDone => objects = listing.take().unwrap_or_default(),
                Event::Apply(o) => {
                    objects.insert(key(&o), o);
                }
                Event::Delete(o) => {
                    objects.remove(&key(&o));
                }
            }
            let current: Vec<K> = objects.values().cloned().collect();
            if listing.is_none() && done(&current) {
                return Ok(current);
            }
        }
        anyhow::bail!("watch ended")
    };
    let waited = tokio::time::timeout(timeout, wait).await;
    match (waited, last_error) {
        (Ok(done), _) => done,
        (Err(_), None) => anyhow::bail!("timed out after {timeout:?}"),
        (Err(_), Some(error)) => anyhow::bail!("timed out after {timeout:?} (last watch error: {error})"),
    }
}

//! The namespace-scope invariant's load: an image in a registry that answers only with
//! credentials, a Secret holding them in one namespace (the owner), and Apps in every namespace
//! naming the image with a `secretRef` of that Secret's name. The owner's Apps get pinned (by the
//! controller, which reads the Secret, then by the webhook or the pinning policy from the entry
//! scoped to it); in another namespace no such Secret exists, and an App there stored pinned was
//! pinned from the owner's private entry: a violation.

use std::collections::BTreeSet;

use anyhow::{Context, Result};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt as _,
    api::{DynamicObject, PostParams},
    runtime::{WatchStreamExt as _, watcher},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{faults::RegistryFront, invariants::Violations};
use crate::{Env, control_plane::SpareRegistry, images, objects, peers::kapp_controller};

/// On every private App: `owner` in the Secret's namespace, `other` elsewhere.
pub const PRIVATE_LABEL: &str = "soak.holdfast.dev/private";
/// The Secret's name, in the owner namespace only.
const SECRET: &str = "soak-pull";
/// The one user the private registry answers (throwaway, test-only).
const USER: (&str, &str) = ("soak", "soak-private-password");

/// The private registry and its image.
pub struct Private {
    /// `host:port`, plain HTTP.
    pub addr: String,
    /// The tagged reference every private App names.
    url: String,
    /// Kept running for the soak.
    _registry: (SpareRegistry, RegistryFront),
}

impl Private {
    /// Starts the registry, behind a front on `host` (where holdfast reaches it), and pushes
    /// the image.
    pub async fn start(env: &Env, host: &str) -> Result<Self> {
        let registry = env.spare_registry_with_users(&[USER]).await?;
        let config =
            b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config}\ndata: {private: \"true\"}\n";
        let image = images::Image::with_files(&[("config.yml", config)])?;
        images::push_as(&registry.addr, Some(USER), "soak/private", "live", &image)
            .await
            .context("pushing the private image")?;
        let front = RegistryFront::start(host, &registry.addr).await?;
        Ok(Self {
            url: format!("{}/soak/private:live", front.addr),
            addr: front.addr.clone(),
            _registry: (registry, front),
        })
    }

    /// The Secret with the registry's credentials in `owner` (the shape vendir reads).
    pub async fn grant(&self, client: &Client, owner: &str) -> Result<()> {
        let secret = objects::registry_credentials(SECRET, USER);
        Api::<Secret>::namespaced(client.clone(), owner)
            .create(&PostParams::default(), &secret)
            .await
            .context("creating the private registry's Secret")?;
        Ok(())
    }

    /// The fetch of a private App: the tag, and the Secret by name.
    pub fn fetch(&self) -> Value {
        json!([{"image": {"url": self.url, "secretRef": {"name": SECRET}}}])
    }

    /// A private App `name`, labelled `owner` or `other`. Paused: what is judged is what the
    /// admission and holdfast's controller store, not kapp-controller's deploy.
    pub fn app(&self, name: &str, owned: bool, sync_period: std::time::Duration) -> Value {
        let mut app = kapp_controller::own_names_app(name, &self.url, sync_period);
        app["spec"]["fetch"] = self.fetch();
        app["spec"]["paused"] = json!(true);
        app["metadata"]["labels"] = json!({PRIVATE_LABEL: if owned { "owner" } else { "other" }});
        app
    }
}

/// What the private watch has seen: the owner's Apps stored pinned, and the others' (each a
/// violation, reported once).
#[derive(Debug, Default)]
struct PrivatePins {
    owner_pinned: BTreeSet<Option<String>>,
    leaked: BTreeSet<Option<String>>,
}

impl PrivatePins {
    /// Takes in a private App as stored: the violation's detail when it is another namespace's
    /// App stored pinned, the first time it is seen so.
    fn apply(&mut self, object: &DynamicObject) -> Option<String> {
        let url = object
            .data
            .pointer("/spec/fetch/0/image/url")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !url.contains('@') {
            return None;
        }
        if object.labels().get(PRIVATE_LABEL).map(String::as_str) == Some("owner") {
            self.owner_pinned.insert(object.uid());
            return None;
        }
        self.leaked.insert(object.uid()).then(|| {
            format!(
                "App {}/{} names the private tag with a Secret its namespace does not have, and was stored pinned to {url}",
                object.namespace().unwrap_or_default(),
                object.name_any()
            )
        })
    }
}

/// Watches the private Apps until `stop`: one stored pinned outside the owner namespace is a
/// `private-entry-leaked` violation. Returns how many of the owner's were seen pinned (the
/// check is not vacuous once the controller pinned one).
pub async fn watch(api: Api<DynamicObject>, violations: Violations, stop: CancellationToken) -> usize {
    let config = watcher::Config::default().labels(PRIVATE_LABEL);
    let mut objects = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
    let mut pins = PrivatePins::default();
    while let Some(Some(object)) = stop.run_until_cancelled(objects.next()).await {
        let Ok(object) = object else { continue };
        if let Some(detail) = pins.apply(&object) {
            violations.record("private-entry-leaked", detail);
        }
    }
    pins.owner_pinned.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(namespace: &str, uid: &str, label: &str, url: &str) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
            "metadata": {"name": "p", "namespace": namespace, "uid": uid, "labels": {PRIVATE_LABEL: label}},
            "spec": {"fetch": [{"image": {"url": url, "secretRef": {"name": SECRET}}}]}
        }))
        .expect("an App")
    }

    const TAG: &str = "127.0.0.1:5000/soak/private:live";
    const PINNED: &str =
        "127.0.0.1:5000/soak/private@sha256:0000000000000000000000000000000000000000000000000000000000000000";

    #[test]
    fn another_namespaces_app_stored_pinned_is_a_leak_reported_once() {
        let mut pins = PrivatePins::default();
        assert_eq!(pins.apply(&app("b", "u1", "other", TAG)), None);
        let leak = pins.apply(&app("b", "u1", "other", PINNED));
        assert!(
            leak.as_deref()
                .is_some_and(|d| d.starts_with("App b/p ") && d.ends_with(PINNED)),
            "{leak:?}"
        );
        assert_eq!(
            pins.apply(&app("b", "u1", "other", PINNED)),
            None,
            "reported once"
        );
        assert!(pins.apply(&app("c", "u2", "other", PINNED)).is_some());
        assert!(pins.owner_pinned.is_empty());
    }

    #[test]
    fn the_owners_apps_stored_pinned_are_counted_not_reported() {
        let mut pins = PrivatePins::default();
        assert_eq!(pins.apply(&app("a", "u1", "owner", TAG)), None);
        assert!(pins.owner_pinned.is_empty(), "a tag is not a pin");
        for uid in ["u1", "u1", "u2"] {
            assert_eq!(pins.apply(&app("a", uid, "owner", PINNED)), None);
        }
        assert_eq!(pins.owner_pinned.len(), 2);
    }
}

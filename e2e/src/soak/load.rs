//! The load: Apps and PackageRepositories naming tens of tags (fewer in the short soak),
//! created, updated and deleted continuously, and tags moved upstream (a new image pushed under
//! the tag) every so often. Every create and update is an admission, counted from the client's
//! side: failed (the API server answered an error), or stored pinned or unpinned.

use std::{
    collections::{BTreeMap, VecDeque},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use holdfast_pins::PinnedKind;
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{
    invariants::{Move, Shared, lock},
    private::Private,
};
use crate::{images, peers::kapp_controller};

/// The label on every object of the load: the number of the tag it names.
pub const TAG_LABEL: &str = "soak.holdfast.dev/tag";
/// The label (`=true`) of the namespace whose objects holdfast pins to the mirror's copies
/// (`--mirror-namespace-selector`).
pub const MIRROR_LABEL: &str = "soak.holdfast.dev/mirror";
/// The tag every repository of the load is moved under.
const TAG: &str = "live";

/// The API of `kind` in `namespace`.
pub fn api(client: &Client, namespace: &str, kind: PinnedKind) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&kind.gvk(), kind.resource());
    Api::namespaced_with(client.clone(), namespace, &resource)
}

/// The same, across namespaces (the watches).
pub fn api_all(client: &Client, kind: PinnedKind) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(&kind.gvk(), kind.resource());
    Api::all_with(client.clone(), &resource)
}

/// The URL a load object fetches, as stored (`spec.fetch[0].image.url` of an App,
/// `spec.fetch.image.url` of a PackageRepository), and the tag its label names.
pub fn tag_and_url(object: &DynamicObject, kind: PinnedKind) -> Option<(usize, &str)> {
    let tag = object.metadata.labels.as_ref()?.get(TAG_LABEL)?.parse().ok()?;
    Some((tag, fetch_url(object, kind)?))
}

/// The URL a load object fetches, as stored.
fn fetch_url(object: &DynamicObject, kind: PinnedKind) -> Option<&str> {
    let pointer = match kind {
        PinnedKind::PackageRepository => "/spec/fetch/image/url",
        _ => "/spec/fetch/0/image/url",
    };
    object.data.pointer(pointer)?.as_str()
}

/// How one admission went, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pinned,
    /// Stored with its tag: the webhook was not asked, or did not answer in time.
    Unpinned,
    /// The API server answered an error (or none).
    Failed,
}

#[derive(Debug, Clone)]
pub struct Admission {
    pub start: Instant,
    pub end: Instant,
    pub outcome: Outcome,
    /// Of a private App ([`Private`]): unpinned is what it may be.
    pub private: bool,
    /// The object, and for a failure its error.
    pub detail: String,
}

/// What the load does.
#[derive(Debug, Clone)]
pub struct Shape {
    pub namespaces: usize,
    pub tags: usize,
    /// Objects kept alive (created up to it, then deleted and created again).
    pub objects: usize,
    /// One create, update or delete this often.
    pub churn_every: Duration,
    /// One tag moved this often (the tags in turn).
    pub move_every: Duration,
    /// kapp-controller's sync period of the Apps.
    pub sync_period: Duration,
}

/// One live object of the load.
#[derive(Debug, Clone)]
struct Live {
    namespace: String,
    name: String,
    kind: PinnedKind,
    /// The tag it names; none for a private App.
    tag: Option<usize>,
}

pub struct Load {
    client: Client,
    /// Where the soak pushes (the registry itself, not the front the objects name).
    registry: String,
    namespaces: Vec<String>,
    shape: Shape,
    shared: Shared,
    live: VecDeque<Live>,
    created: usize,
    /// The private image, its Secret in the first namespace.
    private: Private,
    private_created: usize,
    pub admissions: Vec<Admission>,
    pub failed_deletes: usize,
}

impl Load {
    /// Creates the namespaces (with kapp-controller's deployer; the last labelled
    /// [`MIRROR_LABEL`], its objects pinned to the mirror's copies), the private registry's
    /// Secret in the first, and pushes every tag's first image; objects will name the tags at
    /// `front`.
    pub async fn prepare(
        env: &crate::Env,
        registry: &str,
        front: &str,
        private: Private,
        shape: Shape,
        shared: Shared,
    ) -> Result<Self> {
        anyhow::ensure!(
            shape.namespaces >= 2,
            "the soak needs two namespaces: the private Secret's, and the mirror's"
        );
        let mut namespaces = Vec::new();
        for n in 0..shape.namespaces {
            let namespace = if n + 1 == shape.namespaces {
                env.namespace_with_labels("soak-mirror", &[(MIRROR_LABEL, "true")])
                    .await?
            } else {
                env.namespace("soak").await?
            };
            kapp_controller::add_deployer(env, &namespace)?;
            namespaces.push(namespace);
        }
        let client = env.client().await?;
        private.grant(&client, &namespaces[0]).await?;
        let load = Self {
            client,
            registry: registry.into(),
            namespaces,
            shape,
            shared,
            live: VecDeque::new(),
            created: 0,
            private,
            private_created: 0,
            admissions: Vec::new(),
            failed_deletes: 0,
        };
        for tag in 0..load.shape.tags {
            let reference = format!("{front}/soak/config-{tag:02}:{TAG}");
            let added = lock(&load.shared.history).add_tag(reference);
            anyhow::ensure!(added == tag, "tags added out of order");
            push(&load.registry, &load.shared, tag, 0).await?;
        }
        Ok(load)
    }

    /// Creates objects up to the shape's number, one by one.
    pub async fn fill(&mut self) -> Result<()> {
        while self.live.len() < self.shape.objects {
            self.create().await;
        }
        Ok(())
    }

    /// Creates, updates and deletes until `stop`: while under the shape's number of objects a
    /// create, else a delete of the oldest and an update in turn.
    pub async fn churn(mut self, stop: CancellationToken) -> Self {
        let mut tick = tokio::time::interval(self.shape.churn_every);
        let mut turn = 0usize;
        while stop.run_until_cancelled(tick.tick()).await.is_some() {
            if self.live.len() < self.shape.objects {
                self.create().await;
            } else if turn.is_multiple_of(2) {
                self.delete_oldest().await;
            } else {
                self.update(turn / 2).await;
            }
            turn += 1;
        }
        self
    }

    /// The namespace holding the private registry's Secret.
    pub fn owner(&self) -> &str {
        &self.namespaces[0]
    }

    async fn create(&mut self) {
        let n = self.created;
        self.created += 1;
        // One in eight is a private App, the namespaces in turn.
        if n % 8 == 6 {
            return self.create_private().await;
        }
        let (tag, namespace) = (
            n % self.shape.tags,
            self.namespaces[n % self.namespaces.len()].clone(),
        );
        // One PackageRepository in four.
        let kind = if n % 4 == 3 {
            PinnedKind::PackageRepository
        } else {
            PinnedKind::App
        };
        let name = format!("soak-{n:06}");
        let url = lock(&self.shared.history)
            .reference(tag)
            .unwrap_or_default()
            .to_string();
        let mut object = match kind {
            PinnedKind::App => kapp_controller::own_names_app(&name, &url, self.shape.sync_period),
            _ => json!({
                "apiVersion": "packaging.carvel.dev/v1alpha1",
                "kind": "PackageRepository",
                "metadata": {"name": name},
                "spec": {"fetch": {"image": {"url": url}}},
            }),
        };
        object["metadata"]["labels"] = json!({TAG_LABEL: tag.to_string()});
        let live = Live {
            namespace,
            name,
            kind,
            tag: Some(tag),
        };
        self.create_as(live, object).await;
    }

    async fn create_private(&mut self) {
        let k = self.private_created;
        self.private_created += 1;
        let namespace = self.namespaces[k % self.namespaces.len()].clone();
        let name = format!("soak-private-{k:06}");
        let owned = namespace == self.owner();
        let app = self.private.app(&name, owned, self.shape.sync_period);
        let live = Live {
            namespace,
            name,
            kind: PinnedKind::App,
            tag: None,
        };
        self.create_as(live, app).await;
    }

    /// Creates `object`, the live object `live` describes, counting the admission; keeps it
    /// when it was stored.
    async fn create_as(&mut self, live: Live, object: serde_json::Value) {
        let api = api(&self.client, &live.namespace, live.kind);
        let start = Instant::now();
        let result = match serde_json::from_value::<DynamicObject>(object) {
            Ok(object) => api
                .create(&PostParams::default(), &object)
                .await
                .map_err(anyhow::Error::from),
            Err(e) => Err(e.into()),
        };
        let private = live.tag.is_none();
        let what = format!(
            "create {}{} {}/{}",
            if private { "private " } else { "" },
            live.kind,
            live.namespace,
            live.name
        );
        if self.admitted(start, what, live.kind, private, result) {
            if let Some(tag) = live.tag {
                *lock(&self.shared.live).entry(tag).or_default() += 1;
            }
            self.live.push_back(live);
        }
    }

    /// Writes the tag again into one live object's fetch (as a user re-applying it), with an
    /// annotation that changes each time: an UPDATE admission.
    async fn update(&mut self, n: usize) {
        let Some(live) = self.live.get(n % self.live.len().max(1)).cloned() else {
            return;
        };
        let fetch = match live.tag {
            None => self.private.fetch(),
            Some(tag) => {
                let url = lock(&self.shared.history)
                    .reference(tag)
                    .unwrap_or_default()
                    .to_string();
                match live.kind {
                    PinnedKind::PackageRepository => json!({"image": {"url": url}}),
                    _ => json!([{"image": {"url": url}}]),
                }
            }
        };
        let patch = json!({
            "metadata": {"annotations": {"soak.holdfast.dev/update": n.to_string()}},
            "spec": {"fetch": fetch},
        });
        let api = api(&self.client, &live.namespace, live.kind);
        let start = Instant::now();
        let result = api
            .patch(&live.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(anyhow::Error::from);
        let what = format!("update {} {}/{}", live.kind, live.namespace, live.name);
        self.admitted(start, what, live.kind, live.tag.is_none(), result);
    }

    async fn delete_oldest(&mut self) {
        let Some(live) = self.live.pop_front() else { return };
        if let Some(tag) = live.tag
            && let Some(count) = lock(&self.shared.live).get_mut(&tag)
        {
            *count = count.saturating_sub(1);
        }
        let api = api(&self.client, &live.namespace, live.kind);
        match api.delete(&live.name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(error) => {
                tracing::debug!(%error, name = %live.name, "delete failed");
                self.failed_deletes += 1;
            }
        }
    }

    /// Counts one admission (of a private App: `private`); whether the object was stored.
    fn admitted(
        &mut self,
        start: Instant,
        what: String,
        kind: PinnedKind,
        private: bool,
        result: Result<DynamicObject>,
    ) -> bool {
        let (outcome, detail) = match &result {
            Ok(stored) => match fetch_url(stored, kind) {
                Some(url) if url.contains('@') => (Outcome::Pinned, what),
                Some(url) => (Outcome::Unpinned, format!("{what}: stored as {url}")),
                None => (Outcome::Unpinned, format!("{what}: stored without its fetch URL")),
            },
            Err(error) => (Outcome::Failed, format!("{what}: {error:#}")),
        };
        self.admissions.push(Admission {
            start,
            end: Instant::now(),
            outcome,
            private,
            detail,
        });
        result.is_ok()
    }
}

/// Pushes version `version` of tag `tag`'s image under the tag, recorded in the history first;
/// returns its position there.
async fn push(registry: &str, shared: &Shared, tag: usize, version: usize) -> Result<usize> {
    let config = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: config}}\ndata: {{tag: \"{tag}\", version: \"{version}\"}}\n"
    );
    let image = images::Image::with_files(&[("config.yml", config.as_bytes())])?;
    let position = lock(&shared.history).record(tag, image.digest().to_string());
    let repository = format!("soak/config-{tag:02}");
    let pushed = images::push(registry, &repository, TAG, &image)
        .await
        .with_context(|| format!("pushing {repository}:{TAG}"))?;
    anyhow::ensure!(
        pushed == image.digest(),
        "the registry reports {pushed} for {repository}:{TAG}, pushed as {}",
        image.digest()
    );
    Ok(position)
}

/// Moves the tags in turn, one every `every`, until `stop`, sending each move to `moved`;
/// returns how many. A push that fails (the registry is being stopped by a fault) is tried
/// again at the next turn.
pub async fn move_tags(
    registry: String,
    shared: Shared,
    tags: usize,
    every: Duration,
    moved: tokio::sync::mpsc::UnboundedSender<Move>,
    stop: CancellationToken,
) -> usize {
    let mut versions: BTreeMap<usize, usize> = BTreeMap::new();
    let mut tick = tokio::time::interval_at((Instant::now() + every).into(), every);
    let mut turn = 0usize;
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        let tag = turn % tags;
        let version = versions.get(&tag).copied().unwrap_or(0) + 1;
        match push(&registry, &shared, tag, version).await {
            Ok(position) => {
                versions.insert(tag, version);
                let _ = moved.send(Move {
                    tag,
                    position,
                    at: Instant::now(),
                });
                turn += 1;
            }
            Err(error) => tracing::debug!(%error, tag, "moving a tag; trying again"),
        }
    }
    turn
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A load object of `kind` labelled with `tag`, fetching `url`.
    fn object(kind: PinnedKind, tag: &str, url: &str) -> DynamicObject {
        let fetch: serde_json::Value = match kind {
            PinnedKind::PackageRepository => json!({"image": {"url": url}}),
            _ => json!([{"image": {"url": url}}]),
        };
        serde_json::from_value(json!({
            "apiVersion": "v1alpha1",
            "kind": kind.kind(),
            "metadata": {"name": "o", "labels": {TAG_LABEL: tag}},
            "spec": {"fetch": fetch},
        }))
        .expect("a valid object")
    }

    #[test]
    fn the_url_is_read_where_each_kind_keeps_it() {
        let app = object(PinnedKind::App, "3", "r/a:live");
        assert_eq!(tag_and_url(&app, PinnedKind::App), Some((3, "r/a:live")));
        let repo = object(PinnedKind::PackageRepository, "1", "r/b@sha256:00");
        assert_eq!(
            tag_and_url(&repo, PinnedKind::PackageRepository),
            Some((1, "r/b@sha256:00"))
        );
        assert_eq!(tag_and_url(&repo, PinnedKind::App), None);
        assert_eq!(
            tag_and_url(&object(PinnedKind::App, "x", "r/a:live"), PinnedKind::App),
            None
        );
    }
}

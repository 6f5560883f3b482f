//! The I/O edge of pinning, shared by the webhook and the controller: digests from the shared
//! cache (the registry only on a miss), credentials from the object's `secretRef` only when the
//! registry must be asked. The decisions are this crate's pure functions.

use std::{collections::BTreeMap, sync::Arc};

use futures::{FutureExt, future::BoxFuture};
use holdfast_cache::{CacheError, CacheKey, DigestCache, Loaded, Origin, Scope};
use holdfast_registry::{Credentials, Reference, VersionSelection};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use serde_json::Value;

use crate::{
    MirrorPins, Need, ObjectPlan, PinOutcome, PinnedKind, Resolution, Step,
    mirror_scope::{Copying, stays_on_mirror},
    pin_patch,
};

/// What [`Pinner::reconcile`] found: the guarded JSON patch for the stored object, and why any
/// reference stays unpinned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PinUpdate {
    pub ops: Vec<json_patch::PatchOperation>,
    pub warnings: Vec<String>,
    /// What `ops` does, for the Events the controller records; `None` when `ops` is empty.
    pub change: Option<Change>,
    /// References pinned from a cache entry because the registry failed.
    pub stale: usize,
    /// References left unpinned because the registry failed and nothing was cached.
    pub unresolved: usize,
}

/// The kind of change a [`PinUpdate`] makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// References stored as tags get their first digest (catch-up).
    Pinned,
    /// `follow` pins move to the digests their tags now hold.
    Repinned,
}

/// Reads the Secrets that `secretRef`s name: the API server through a kube [`Client`] (a
/// stand-in in tests). Only ever asked for a Secret a live object names.
pub trait SecretSource: Send + Sync + 'static {
    /// The Secret `name` in `namespace`; `None` when there is none.
    fn secret(&self, namespace: &str, name: &str) -> BoxFuture<'static, Result<Option<Secret>, String>>;
}

impl SecretSource for Client {
    fn secret(&self, namespace: &str, name: &str) -> BoxFuture<'static, Result<Option<Secret>, String>> {
        let api = Api::<Secret>::namespaced(self.clone(), namespace);
        let name = name.to_owned();
        async move {
            // The API's own message ("forbidden: ..."), not its dump.
            api.get_opt(&name).await.map_err(|e| match e {
                kube::Error::Api(status) => status.message,
                other => other.to_string(),
            })
        }
        .boxed()
    }
}

pub struct Pinner {
    cache: Arc<DigestCache>,
    /// Reads `secretRef` Secrets; `None` where holdfast may not read Secrets (then objects with a
    /// `secretRef` are pinned only from anonymous cache entries).
    secrets: Option<Arc<dyn SecretSource>>,
    /// The mirror whose copies (recorded in the cache) are pinned instead of the upstream.
    mirror: Option<MirrorPins>,
    /// The controller's mirror copier, which `follow` pins to a mirror copy wait for when their
    /// tag moved ([`Pinner::reconcile`]).
    copying: Arc<Copying>,
}

impl Pinner {
    pub fn new(cache: Arc<DigestCache>, secrets: Option<Arc<dyn SecretSource>>) -> Self {
        Self {
            cache,
            secrets,
            mirror: None,
            copying: Arc::default(),
        }
    }

    /// Shares the controller's view of its mirror copier (`holdfast_controller::mirror` keeps
    /// it up to date); the default copies from every registry and never gives up.
    pub fn with_copying(mut self, copying: Arc<Copying>) -> Self {
        self.copying = copying;
        self
    }

    pub fn copying(&self) -> &Arc<Copying> {
        &self.copying
    }

    /// Pins references whose content the controller copied into the mirror to the mirror's copy
    /// (`<mirror>/<prefix>/<source host>/<source repository>@sha256:…`), in the namespaces the
    /// mirror selects; private content only as [`MirrorPins`] allows.
    pub fn with_mirror(mut self, mirror: Option<MirrorPins>) -> Self {
        self.mirror = mirror;
        self
    }

    pub fn mirror(&self) -> Option<&MirrorPins> {
        self.mirror.as_ref()
    }

    pub fn cache(&self) -> &Arc<DigestCache> {
        &self.cache
    }

    /// The credentials for a lookup in `scope`: the Secret it names, read only now, when the
    /// registry is to be asked ([`load_credentials`]); anonymous where this pinner reads no
    /// Secrets or the scope is anonymous.
    pub fn credentials(&self, scope: Scope) -> BoxFuture<'static, Result<Loaded, CacheError>> {
        load_credentials(self.secrets.clone(), scope)
    }

    /// The update that brings a stored object to its pins: references admitted unpinned get
    /// pinned (catch-up), and `follow` pins move with their tags (from the cache, which the
    /// refresher keeps current); a pin to a mirror copy whose tag moved stays on that copy while
    /// the new digest's copy is coming ([`stays_on_mirror`]). Empty when the object is as it
    /// should be.
    /// `labels` are the namespace's (they decide whether the object is pinned to the mirror).
    pub async fn reconcile(
        &self,
        kind: PinnedKind,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        stored: &Value,
    ) -> Result<PinUpdate, json_patch::PatchError> {
        let mut desired = crate::repin::unpinned(stored);
        // The controller reads the Secret of every lookup it makes: its uid proves the entry.
        let outcome = self
            .pin_sites(kind, namespace, labels, SecretScoped::Any, &desired, None, true)
            .await;
        json_patch::patch(&mut desired, &outcome.ops)?;
        let ops = crate::repin::update(stored, &desired);
        let change = (!ops.is_empty()).then(|| {
            let stored_plan = ObjectPlan::new(kind, stored, None);
            if stored_plan
                .steps
                .iter()
                .any(|step| matches!(step, Step::Resolve { .. }))
            {
                Change::Pinned
            } else {
                Change::Repinned
            }
        });
        Ok(PinUpdate {
            ops,
            warnings: outcome.warnings,
            change,
            stale: outcome.stale,
            unresolved: outcome.unresolved,
        })
    }

    /// The patch that pins `object` (in `namespace`, labelled `labels`; `old` is the stored
    /// object on an update), with a warning for every reference it could not pin.
    /// `secret_scoped`: which entries resolved with a Secret may answer.
    pub async fn pin(
        &self,
        kind: PinnedKind,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        secret_scoped: SecretScoped,
        object: &Value,
        old: Option<&Value>,
    ) -> PinOutcome {
        self.pin_sites(kind, namespace, labels, secret_scoped, object, old, false)
            .await
    }

    /// [`Pinner::pin`]; `repinning` (the controller's reconcile): `follow` pins to a mirror copy
    /// wait there for their moved tag's new copy.
    #[allow(clippy::too_many_arguments)]
    async fn pin_sites(
        &self,
        kind: PinnedKind,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        secret_scoped: SecretScoped,
        object: &Value,
        old: Option<&Value>,
        repinning: bool,
    ) -> PinOutcome {
        let mirror = self.mirror.as_ref().filter(|m| m.selects(labels));
        let plan = ObjectPlan::new(kind, object, old);
        let mut warnings = plan.warnings.clone();
        let (mut stale, mut unresolved) = (0, 0);
        let mut resolutions = Vec::new();
        for (index, (site, step)) in plan.sites.iter().zip(&plan.steps).enumerate() {
            match step {
                Step::Keep | Step::Invalid(_) => {}
                Step::Reuse(resolution) => resolutions.push((index, resolution.clone())),
                Step::Resolve { need, fallback } => {
                    let scope = site_scope(site, namespace);
                    match self.resolve(need, scope, secret_scoped, mirror).await {
                        Ok(Resolved {
                            resolution,
                            origin,
                            key,
                            source,
                        }) => {
                            if let Origin::Stale { error, age } = origin {
                                stale += 1;
                                warnings.push(format!(
                                    "{}: the registry failed ({error}); pinned from a {}s old cache entry",
                                    site.field,
                                    age.as_secs()
                                ));
                            }
                            // The copier wants the new copy while the entry records the old one
                            // (`holdfast_controller::mirror::wanted`), unless it gave up on it.
                            let coming = |old: &str, new: &str| {
                                self.copying.coming(&source, new)
                                    && self.cache.serving_record(&key).is_some_and(|m| m.location == old)
                            };
                            let stays = fallback.as_ref().filter(|recorded| {
                                repinning
                                    && mirror.is_some_and(|mirror| {
                                        stays_on_mirror(recorded, &resolution, &mirror.location, coming)
                                    })
                            });
                            if stays.is_some() {
                                tracing::debug!(field = %site.field, moved_to = %resolution.digest, "tag moved; kept on its mirror copy until the new digest's copy is recorded");
                            }
                            resolutions.push((index, stays.cloned().unwrap_or(resolution)));
                        }
                        Err(error) => match fallback {
                            Some(previous) => {
                                stale += 1;
                                warnings.push(format!("{}: {error}; kept the recorded pin", site.field));
                                resolutions.push((index, previous.clone()));
                            }
                            None => {
                                unresolved += 1;
                                tracing::warn!(field = %site.field, %error, "left a fetch reference unpinned");
                                warnings.push(format!(
                                    "{}: {error}; left unpinned (the holdfast controller retries)",
                                    site.field
                                ));
                            }
                        },
                    }
                }
            }
        }
        let mut outcome = pin_patch(object, &plan.sites, &resolutions, plan.policy);
        warnings.append(&mut outcome.warnings);
        outcome.warnings = warnings;
        outcome.stale = stale;
        outcome.unresolved = unresolved;
        outcome
    }

    async fn resolve(
        &self,
        need: &Need,
        scope: Scope,
        secret_scoped: SecretScoped,
        mirror: Option<&MirrorPins>,
    ) -> Result<Resolved, CacheError> {
        // `ObjectPlan` turns pinned references into `Step::Keep`; they need no lookup.
        let Some((key, target, selection)) = lookup_of(need, scope.clone()) else {
            return Err(CacheError::Credentials(
                "internal: asked to resolve a pinned reference".into(),
            ));
        };
        let secrets = self.secrets.clone();
        let answer = self
            .cache
            .lookup(key.clone(), target.clone(), selection, {
                let scope = scope.clone();
                move || load_credentials(secrets, scope)
            })
            .await?;
        if let Scope::Secret { namespace, .. } = &scope
            && !secret_scoped.admits(answer.resolved_at)
        {
            return Err(CacheError::NotSinceNamespace {
                namespace: namespace.clone(),
            });
        }
        let (mirror, pull_secret) = mirror
            .and_then(|m| m.pin_target(&scope, &target, &answer.digest, answer.mirrored.as_ref()))
            .map_or((None, None), |(repository, pull)| (Some(repository), pull));
        Ok(Resolved {
            resolution: Resolution {
                digest: answer.digest,
                selected_tag: answer.tag,
                mirror,
                pull_secret,
            },
            origin: answer.origin,
            key,
            source: target,
        })
    }
}

/// Which cache entries resolved with a Secret may pin an object. The controller reads the Secret
/// for each lookup, and an entry of another Secret (deleted, or re-created under its name) never
/// answers it ([`Any`](Self::Any)). The webhook reads no Secrets: it takes only entries resolved
/// since the object's namespace was created, so a namespace deleted and re-created under its
/// name (by another tenant, perhaps) is never pinned from the earlier one's private entries, nor
/// to their mirror copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretScoped {
    Any,
    /// Resolved at or after the namespace's creation (its `creationTimestamp`, whole seconds).
    ResolvedSince(std::time::SystemTime),
    /// The namespace is not known (yet): none.
    None,
}

impl SecretScoped {
    fn admits(self, resolved_at: std::time::SystemTime) -> bool {
        match self {
            SecretScoped::Any => true,
            SecretScoped::ResolvedSince(created) => resolved_at >= created,
            SecretScoped::None => false,
        }
    }
}

/// What [`Pinner::resolve`] found for one site, with the cache key it asked and the reference
/// (tag, or repository of a selection) it resolved.
struct Resolved {
    resolution: Resolution,
    origin: Origin,
    key: CacheKey,
    source: Reference,
}

/// The cache scope of a site in `namespace`: its (upstream) `secretRef`'s Secret, or anonymous.
fn site_scope(site: &crate::FetchSite, namespace: &str) -> Scope {
    match &site.upstream_secret {
        Some(name) => Scope::Secret {
            namespace: namespace.to_string(),
            name: name.clone(),
        },
        None => Scope::Anonymous,
    }
}

/// What looking up `need` in `scope` asks the cache: the key, the reference (tag, or repository
/// of a selection) and the selection; `None` for a reference already pinned.
fn lookup_of(need: &Need, scope: Scope) -> Option<(CacheKey, Reference, Option<VersionSelection>)> {
    match need {
        Need::Tag(reference) => Some((CacheKey::tag(reference, scope), reference.clone(), None)),
        Need::Select(repository, selection) => Some((
            CacheKey::selection(repository, selection, scope),
            repository.clone(),
            Some(selection.clone()),
        )),
        Need::AlreadyPinned => None,
    }
}

/// The cache key a site of an object in `namespace` is looked up under (with its upstream
/// `secretRef`'s scope); `None` for a site already pinned or that cannot be pinned. What
/// `kubectl holdfast explain` follows from a reference to its entry.
pub fn site_key(site: &crate::FetchSite, namespace: &str) -> Option<CacheKey> {
    let need = crate::plan(site).ok()?;
    lookup_of(&need, site_scope(site, namespace)).map(|(key, ..)| key)
}

/// The cache keys a stored object names: those its reconcile looks up (tags restored from
/// `holdfast.dev/original-refs` for `follow` pins, each with its site's scope). These are
/// checked against the objects, never taken from an entry.
pub fn named_keys(kind: PinnedKind, object: &Value) -> Vec<CacheKey> {
    let namespace = object
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let desired = crate::repin::unpinned(object);
    let plan = ObjectPlan::new(kind, &desired, None);
    plan.sites
        .iter()
        .zip(&plan.steps)
        .filter_map(|(site, step)| match step {
            Step::Resolve { need, .. } => lookup_of(need, site_scope(site, namespace)).map(|(key, ..)| key),
            _ => None,
        })
        .collect()
}

/// The Secret a `secretRef` names, read as vendir reads it, with its uid; anonymous without
/// one. A Secret that does not exist is [`CacheError::SecretGone`]: its entries stop answering.
pub fn load_credentials(
    secrets: Option<Arc<dyn SecretSource>>,
    scope: Scope,
) -> BoxFuture<'static, Result<Loaded, CacheError>> {
    async move {
        let Scope::Secret { namespace, name } = scope else {
            return Ok(Loaded::anonymous());
        };
        let secrets = secrets
            .ok_or_else(|| CacheError::Credentials(format!("cannot read Secret {namespace}/{name}")))?;
        let secret = secrets
            .secret(&namespace, &name)
            .await
            .map_err(|reason| {
                CacheError::Credentials(format!("reading Secret {namespace}/{name}: {reason}"))
            })?
            .ok_or_else(|| CacheError::SecretGone {
                namespace: namespace.clone(),
                name: name.clone(),
            })?;
        let secret_uid = secret.metadata.uid.clone();
        let data = secret.data.unwrap_or_default();
        let credentials = Credentials::from_secret(
            &name,
            secret.type_.as_deref(),
            data.iter().map(|(k, v)| (k, &v.0)),
        )
        .map_err(|e| CacheError::Credentials(e.to_string()))?;
        Ok(Loaded {
            credentials,
            secret_uid,
        })
    }
    .boxed()
}

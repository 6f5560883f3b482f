//! The I/O edge of pinning, shared by the webhook and the controller: digests from the shared
//! cache (the registry only on a miss), credentials from the object's `secretRef` only when the
//! registry must be asked. The decisions are this crate's pure functions.

use std::sync::Arc;

use futures::{FutureExt, future::BoxFuture};
use holdfast_registry::{
    Credentials,
    cache::{CacheError, CacheKey, DigestCache, Origin, Scope},
};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use serde_json::Value;

use crate::{Need, ObjectPlan, PinOutcome, PinnedKind, Resolution, Step, pin_patch};

pub struct Pinner {
    cache: Arc<DigestCache>,
    /// Reads `secretRef` Secrets; `None` where holdfast may not read Secrets (then objects with a
    /// `secretRef` are pinned only from anonymous cache entries).
    secrets: Option<Client>,
}

impl Pinner {
    pub fn new(cache: Arc<DigestCache>, secrets: Option<Client>) -> Self {
        Self { cache, secrets }
    }

    pub fn cache(&self) -> &Arc<DigestCache> {
        &self.cache
    }

    /// The patch that pins `object` (in `namespace`; `old` is the stored object on an update),
    /// with a warning for every reference it could not pin.
    pub async fn pin(
        &self,
        kind: PinnedKind,
        namespace: &str,
        object: &Value,
        old: Option<&Value>,
    ) -> PinOutcome {
        let plan = ObjectPlan::new(kind, object, old);
        let mut warnings = plan.warnings.clone();
        let mut resolutions = Vec::new();
        for (index, (site, step)) in plan.sites.iter().zip(&plan.steps).enumerate() {
            match step {
                Step::Keep | Step::Invalid(_) => {}
                Step::Reuse(resolution) => resolutions.push((index, resolution.clone())),
                Step::Resolve { need, fallback } => {
                    let scope = match &site.secret_ref {
                        Some(name) => Scope::Secret {
                            namespace: namespace.to_string(),
                            name: name.clone(),
                        },
                        None => Scope::Anonymous,
                    };
                    match self.resolve(need, scope).await {
                        Ok((resolution, origin)) => {
                            if let Origin::Stale { error, age } = origin {
                                warnings.push(format!(
                                    "{}: the registry failed ({error}); pinned from a {}s old cache entry",
                                    site.field,
                                    age.as_secs()
                                ));
                            }
                            resolutions.push((index, resolution));
                        }
                        Err(error) => match fallback {
                            Some(previous) => {
                                warnings.push(format!("{}: {error}; kept the recorded pin", site.field));
                                resolutions.push((index, previous.clone()));
                            }
                            None => {
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
        outcome
    }

    async fn resolve(&self, need: &Need, scope: Scope) -> Result<(Resolution, Origin), CacheError> {
        let (key, target, selection) = match need {
            Need::Tag(reference) => (CacheKey::tag(reference, scope.clone()), reference.clone(), None),
            Need::Select(repository, selection) => (
                CacheKey::selection(repository, selection, scope.clone()),
                repository.clone(),
                Some(selection.clone()),
            ),
            // `ObjectPlan` turns these into `Step::Keep`; a digest reference needs no lookup.
            Need::AlreadyPinned => {
                return Err(CacheError::Credentials(
                    "internal: asked to resolve a pinned reference".into(),
                ));
            }
        };
        let secrets = self.secrets.clone();
        let answer = self
            .cache
            .lookup(key, target, selection, move || load_credentials(secrets, scope))
            .await?;
        Ok((
            Resolution {
                digest: answer.digest,
                selected_tag: answer.tag,
            },
            answer.origin,
        ))
    }
}

/// The Secret a `secretRef` names, read as vendir reads it; anonymous without one.
fn load_credentials(
    client: Option<Client>,
    scope: Scope,
) -> BoxFuture<'static, Result<Credentials, CacheError>> {
    async move {
        let Scope::Secret { namespace, name } = scope else {
            return Ok(Credentials::anonymous());
        };
        let client = client
            .ok_or_else(|| CacheError::Credentials(format!("cannot read Secret {namespace}/{name}")))?;
        let secret = Api::<Secret>::namespaced(client, &namespace)
            .get(&name)
            .await
            .map_err(|e| CacheError::Credentials(format!("reading Secret {namespace}/{name}: {e}")))?;
        let data = secret.data.unwrap_or_default();
        Credentials::from_secret(
            &name,
            secret.type_.as_deref(),
            data.iter().map(|(k, v)| (k, &v.0)),
        )
        .map_err(|e| CacheError::Credentials(e.to_string()))
    }
    .boxed()
}

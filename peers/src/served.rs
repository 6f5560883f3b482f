//! Which of the peers' kinds the cluster serves. holdfast runs on clusters without Korifi or
//! kpack and then leaves their rules idle; a peer installed after holdfast (one `kapp deploy`
//! or Argo CD sync that brings both, in any order) is looked for again on an interval, so its
//! rules start without a restart.

use std::time::Duration;

use kube::{
    Client,
    api::{ApiResource, GroupVersionKind},
    core::GroupVersion,
    discovery,
};

/// How often the kinds a cluster did not serve are asked for again by default: one discovery
/// request per missing API group version each time, none once every kind is served.
pub const LOOK_AGAIN_EVERY: Duration = Duration::from_secs(30);

/// The API resource of `gvk` when the cluster serves it, `None` when it does not (its group or
/// kind is not in discovery). Any other failure (the API server unreachable, forbidden) is the
/// caller's to report.
pub async fn served(client: &Client, gvk: &GroupVersionKind) -> Result<Option<ApiResource>, kube::Error> {
    match discovery::pinned_kind(client, gvk).await {
        Ok((resource, _)) => Ok(Some(resource)),
        Err(e) if not_served(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether discovery's `error` says the group version or kind is not served (rather than that
/// the API server could not be asked).
fn not_served(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(e) if e.code == 404) || matches!(error, kube::Error::Discovery(_))
}

/// What discovery answered for a set of kinds when they were asked for: each kind's resource,
/// or nothing when the cluster did not serve it or could not be asked (the API server
/// unreachable a moment): those are the [`Served::missing`] kinds, to look for again.
#[derive(Debug, Clone, Default)]
pub struct Served(Vec<(GroupVersionKind, Option<ApiResource>)>);

impl Served {
    /// Asks discovery for each of `kinds` ([`look`]), logging each one missing and what
    /// `without` it (what the caller does without the kind until it is served).
    pub async fn discover(
        client: &Client,
        kinds: impl IntoIterator<Item = GroupVersionKind>,
        without: &str,
    ) -> Self {
        let kinds: Vec<GroupVersionKind> = kinds.into_iter().collect();
        let mut found = Vec::new();
        for (gvk, answer) in look(client, &kinds).await {
            let resource = match answer {
                Ok(Some(resource)) => Some(resource),
                Ok(None) => {
                    tracing::warn!(kind = %gvk.kind, group = %gvk.group, "API not installed; {without} until it is");
                    None
                }
                Err(error) => {
                    tracing::warn!(kind = %gvk.kind, group = %gvk.group, %error, "API discovery failed; {without} until it answers");
                    None
                }
            };
            found.push((gvk, resource));
        }
        Self(found)
    }

    /// The resource of `gvk`, when it was served (`None` too for a kind not asked for).
    pub fn get(&self, gvk: &GroupVersionKind) -> Option<ApiResource> {
        self.0.iter().find(|(kind, _)| kind == gvk)?.1.clone()
    }

    /// Every kind asked for, and whether it was served.
    pub fn kinds(&self) -> impl Iterator<Item = (&GroupVersionKind, bool)> {
        self.0.iter().map(|(kind, resource)| (kind, resource.is_some()))
    }

    /// The kinds asked for and not served.
    pub fn missing(&self) -> Vec<GroupVersionKind> {
        self.0
            .iter()
            .filter(|(_, resource)| resource.is_none())
            .map(|(kind, _)| kind.clone())
            .collect()
    }
}

/// Resolves with those of `kinds` the cluster serves, asking every `every` until one is
/// ([`look`]; an error is logged at debug and asked again next time): every kind found in that
/// look. Never when `kinds` is empty.
pub async fn installed(
    client: &Client,
    kinds: &[GroupVersionKind],
    every: Duration,
) -> Vec<(GroupVersionKind, ApiResource)> {
    loop {
        tokio::time::sleep(every).await;
        let mut found = Vec::new();
        for (kind, answer) in look(client, kinds).await {
            match answer {
                Ok(Some(resource)) => {
                    tracing::info!(kind = %kind.kind, group = %kind.group, "API installed");
                    found.push((kind, resource));
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::debug!(kind = %kind.kind, group = %kind.group, %error, "looking for an API again failed");
                }
            }
        }
        if !found.is_empty() {
            return found;
        }
    }
}

/// One discovery request per API group version of `kinds` (Korifi's seven kinds are one):
/// each kind's resource when served, `None` when its group version or the kind is not served,
/// the error when the group version could not be asked (the API server unreachable a moment).
async fn look(
    client: &Client,
    kinds: &[GroupVersionKind],
) -> Vec<(GroupVersionKind, Result<Option<ApiResource>, String>)> {
    let mut versions: Vec<GroupVersion> = Vec::new();
    for kind in kinds {
        let version = GroupVersion::gv(&kind.group, &kind.version);
        if !versions.contains(&version) {
            versions.push(version);
        }
    }
    let mut answers = Vec::new();
    for version in versions {
        let listed = match discovery::pinned_group(client, &version).await {
            Ok(group) => Ok(group.versioned_resources(&version.version)),
            Err(error) if not_served(&error) => Ok(Vec::new()),
            Err(error) => Err(error.to_string()),
        };
        let of_version = kinds
            .iter()
            .filter(|kind| kind.group == version.group && kind.version == version.version);
        for kind in of_version {
            let answer = match &listed {
                Ok(resources) => Ok(resources
                    .iter()
                    .find(|(resource, _)| resource.kind == kind.kind)
                    .map(|(resource, _)| resource.clone())),
                Err(error) => Err(error.clone()),
            };
            answers.push((kind.clone(), answer));
        }
    }
    answers
}

#[cfg(test)]
mod tests {
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::json;

    use super::*;

    fn answer(send: tower_test::mock::SendResponse<Response<Body>>, status: u16, body: serde_json::Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string().into_bytes()))
            .expect("a response");
        send.send_response(response);
    }

    fn not_found() -> serde_json::Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "the server could not find the requested resource"})
    }

    /// A group that appears between two looks is found on the second, with one request per
    /// group version each time (two kinds of kpack's, one request): the kind it serves, as its
    /// resource (not a subresource's), and not the one it does not.
    #[tokio::test(start_paused = true)]
    async fn a_kind_installed_later_is_found_on_the_next_look() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let kinds = [
            GroupVersionKind::gvk("kpack.io", "v1alpha2", "Image"),
            GroupVersionKind::gvk("kpack.io", "v1alpha2", "Build"),
        ];
        let looking = tokio::spawn(async move { installed(&client, &kinds, LOOK_AGAIN_EVERY).await });

        let (request, send) = handle.next_request().await.expect("the first look");
        assert_eq!(request.uri().path(), "/apis/kpack.io/v1alpha2");
        answer(send, 404, not_found());

        let (request, send) = handle.next_request().await.expect("the second look");
        assert_eq!(request.uri().path(), "/apis/kpack.io/v1alpha2");
        answer(
            send,
            200,
            json!({
                "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "kpack.io/v1alpha2",
                "resources": [
                    {"name": "builds/status", "singularName": "", "namespaced": true, "kind": "Build", "verbs": ["get"]},
                    {"name": "builds", "singularName": "build", "namespaced": true, "kind": "Build", "verbs": ["get", "list", "watch"]},
                ],
            }),
        );
        let found = tokio::time::timeout(3 * LOOK_AGAIN_EVERY, looking).await;
        let found = found.expect("found on the second look").expect("the look");
        let [(kind, resource)] = found.as_slice() else {
            panic!("found {found:?}, not the Build alone");
        };
        assert_eq!(kind.kind, "Build");
        assert_eq!(
            (resource.plural.as_str(), resource.api_version.as_str()),
            ("builds", "kpack.io/v1alpha2")
        );
    }

    #[test]
    fn missing_lists_the_kinds_not_served() {
        let image = GroupVersionKind::gvk("kpack.io", "v1alpha2", "Image");
        let app = GroupVersionKind::gvk("korifi.cloudfoundry.org", "v1alpha1", "CFApp");
        let served = Served(vec![
            (image.clone(), Some(ApiResource::from_gvk(&image))),
            (app.clone(), None),
        ]);
        assert_eq!(served.missing(), std::slice::from_ref(&app));
        assert!(served.get(&image).is_some());
        assert!(served.get(&app).is_none());
    }
}

//! `holdfast-webhook --remove-webhook-configurations`: the chart's `pre-delete` hook. Helm deletes
//! the kinds it does not know, webhook configurations among them, after everything else, so
//! without the hook they outlive the Service and the pods, and every admission in between fails
//! (or, under `failurePolicy: Ignore`, goes through unpinned).

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Resource},
};
use serde::de::DeserializeOwned;

/// Deletes the named configurations; one already gone counts as deleted. Returns how many it
/// deleted.
pub async fn remove_configurations(
    client: Client,
    mutating: &[String],
    validating: &[String],
) -> Result<usize, kube::Error> {
    let deleted = delete_all(Api::<MutatingWebhookConfiguration>::all(client.clone()), mutating).await?;
    Ok(deleted + delete_all(Api::<ValidatingWebhookConfiguration>::all(client), validating).await?)
}

async fn delete_all<K>(api: Api<K>, names: &[String]) -> Result<usize, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut deleted = 0;
    for name in names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(kind = %K::kind(&()), name, "webhook configuration deleted");
                deleted += 1;
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                tracing::info!(kind = %K::kind(&()), name, "webhook configuration already gone");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

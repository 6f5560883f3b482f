//! Creating objects from YAML text, whatever their kind, the way `kubectl create` would; and the
//! few objects the suites build by hand.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{
    Api, Client,
    api::{DynamicObject, GroupVersionKind, ObjectMeta, PostParams},
    discovery::{Scope, pinned_kind},
};
use serde::Deserialize as _;

/// Parses every document of a multi-document YAML text.
pub fn parse_documents(yaml: &str) -> Result<Vec<DynamicObject>> {
    let mut objects = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        objects.push(serde_yaml::from_value(value).context("not a Kubernetes object")?);
    }
    Ok(objects)
}

/// The typed API for a dynamic object's kind, found through discovery.
pub async fn api_for(
    client: &Client,
    object: &DynamicObject,
    namespace: Option<&str>,
) -> Result<Api<DynamicObject>> {
    let types = object.types.as_ref().context("object without apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(types)?;
    let (resource, capabilities) = pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {}", types.kind))?;
    Ok(
        match (
            capabilities.scope,
            namespace.or(object.metadata.namespace.as_deref()),
        ) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
            _ => Api::all_with(client.clone(), &resource),
        },
    )
}

/// Creates every object in `yaml` in `namespace` (overriding the documents' own namespace).
pub async fn create_all(client: &Client, namespace: &str, yaml: &str) -> Result<Vec<DynamicObject>> {
    let mut created = Vec::new();
    for mut object in parse_documents(yaml)? {
        object.metadata.namespace = None;
        let api = api_for(client, &object, Some(namespace)).await?;
        let name = object.metadata.name.clone().unwrap_or_default();
        let kind = object.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        created.push(
            api.create(&PostParams::default(), &object)
                .await
                .with_context(|| format!("creating {kind} {namespace}/{name}"))?,
        );
    }
    Ok(created)
}

/// Creates the namespace `name`, without the harness's labels (holdfast's own namespace, as an
/// installation creates it).
pub async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// A registry's credentials as the Secret `name` that `secretRef`s name, in the shape vendir
/// reads (`username` and `password` keys).
pub fn registry_credentials(name: &str, user: (&str, &str)) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some(
            [
                ("username".to_string(), user.0.to_string()),
                ("password".to_string(), user.1.to_string()),
            ]
            .into(),
        ),
        ..Default::default()
    }
}

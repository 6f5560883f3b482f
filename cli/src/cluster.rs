//! What the CLI reads from (and, for `refresh` and `unpin`, writes to) the cluster: the pinned
//! kinds, holdfast's digest cache entries, the namespaces, holdfast's webhook configuration
//! and Events. It never talks to a registry: re-resolving is the controller's job.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use holdfast_cache::cluster_store;
use holdfast_pins::PinnedKind;
use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    core::v1::{Event, Namespace},
};
use kube::{
    Api, Client, Config,
    api::{DynamicObject, ListParams},
    config::{KubeConfigOptions, Kubeconfig},
    core::{Selector, SelectorExt},
    discovery::ApiResource,
};

use crate::{args::Global, entries::Entries, report::Served};

/// The webhook of holdfast's MutatingWebhookConfiguration that pins fetch references.
const PIN_WEBHOOK: &str = "pin-fetch-refs.holdfast.dev";
/// The namespace label that has the controller leave a namespace alone (as the webhook's
/// namespaceSelector does).
const IGNORE_LABEL: &str = "holdfast.dev/ignore";
/// The reporting controller of holdfast's Events on pinned objects.
const CONTROLLER: &str = "holdfast-controller";

pub struct Cluster {
    pub client: Client,
    pub holdfast_namespace: String,
    webhook_configuration: String,
}

impl Cluster {
    /// A client from the kubeconfig (or in-cluster), as kubectl would pick it.
    pub async fn connect(global: &Global) -> Result<Self> {
        let options = KubeConfigOptions {
            context: global.context.clone(),
            ..Default::default()
        };
        let config = match &global.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading the kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await?
            }
            None if global.context.is_some() => Config::from_kubeconfig(&options).await?,
            None => Config::infer()
                .await
                .context("no kubeconfig found (set KUBECONFIG or --kubeconfig)")?,
        };
        Ok(Self {
            client: Client::try_from(config)?,
            holdfast_namespace: global.holdfast_namespace.clone(),
            webhook_configuration: global.webhook_configuration.clone(),
        })
    }

    pub fn api(&self, kind: PinnedKind, namespace: Option<&str>) -> Api<DynamicObject> {
        let resource = ApiResource::from_gvk_with_plural(&kind.gvk(), kind.resource());
        match namespace {
            Some(namespace) => Api::namespaced_with(self.client.clone(), namespace, &resource),
            None => Api::all_with(self.client.clone(), &resource),
        }
    }

    /// The objects of `kind` in `namespace` (all: `None`). A kind the cluster does not serve
    /// (kapp-controller not installed, or its aggregated Package API unavailable) has none,
    /// with a warning.
    pub async fn list(&self, kind: PinnedKind, namespace: Option<&str>) -> Result<Vec<DynamicObject>> {
        match self.api(kind, namespace).list(&ListParams::default()).await {
            Ok(list) => Ok(list.items),
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 503) => {
                eprintln!(
                    "warning: the cluster does not serve {} ({}): is kapp-controller installed?",
                    kind.resource(),
                    status.message
                );
                Ok(Vec::new())
            }
            Err(error) => Err(error).with_context(|| format!("listing {}", kind.resource())),
        }
    }

    pub async fn get(&self, kind: PinnedKind, namespace: &str, name: &str) -> Result<DynamicObject> {
        self.api(kind, Some(namespace))
            .get(name)
            .await
            .with_context(|| format!("reading {} {namespace}/{name}", kind.kind()))
    }

    /// holdfast's digest cache entries.
    pub fn entries_api(&self) -> Api<DynamicObject> {
        cluster_store::api(self.client.clone(), &self.holdfast_namespace)
    }

    pub async fn entries(&self) -> Result<Entries> {
        let list = self
            .entries_api()
            .list(&ListParams::default())
            .await
            .with_context(|| {
                format!(
                    "listing the DigestCacheEntry objects in {}",
                    self.holdfast_namespace
                )
            })?;
        Ok(Entries::from_objects(&list.items))
    }

    /// Which namespaces holdfast serves: the pinning webhook's namespaceSelector, and the
    /// controller's ignore label.
    pub async fn served(&self) -> Result<ServedNamespaces> {
        let configuration = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .get_opt(&self.webhook_configuration)
            .await
            .with_context(|| {
                format!(
                    "reading the MutatingWebhookConfiguration {}",
                    self.webhook_configuration
                )
            })?;
        let selector = match &configuration {
            None => {
                eprintln!(
                    "warning: there is no MutatingWebhookConfiguration {}: is holdfast installed? (--webhook-configuration)",
                    self.webhook_configuration
                );
                None
            }
            Some(configuration) => configuration
                .webhooks
                .iter()
                .flatten()
                .find(|w| w.name == PIN_WEBHOOK)
                .and_then(|w| w.namespace_selector.clone()),
        };
        let describe = selector.as_ref().map(describe_selector).unwrap_or_default();
        let selector = selector
            .map(Selector::try_from)
            .transpose()
            .context("holdfast's namespaceSelector does not parse")?;
        let namespaces = Api::<Namespace>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .context("listing namespaces")?;
        let labels = namespaces
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
            .collect();
        Ok(ServedNamespaces {
            installed: configuration.is_some(),
            selector,
            describe,
            labels,
        })
    }

    /// The Events holdfast's controller recorded on the object of `uid`, oldest first.
    pub async fn events(&self, namespace: &str, uid: &str) -> Result<Vec<Event>> {
        let list = Api::<Event>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default().fields(&format!("involvedObject.uid={uid}")))
            .await
            .context("listing the object's Events")?;
        let mut events: Vec<Event> = list
            .items
            .into_iter()
            .filter(|e| {
                e.reporting_component.as_deref() == Some(CONTROLLER)
                    || e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(CONTROLLER)
            })
            .collect();
        events.sort_by_key(|e| {
            e.event_time
                .as_ref()
                .map(|t| t.0)
                .or(e.last_timestamp.as_ref().map(|t| t.0))
        });
        Ok(events)
    }
}

/// The namespaces and whether holdfast serves each.
pub struct ServedNamespaces {
    installed: bool,
    selector: Option<Selector>,
    describe: String,
    labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl ServedNamespaces {
    pub fn served(&self, namespace: &str) -> Served {
        let labels = self.labels.get(namespace).cloned().unwrap_or_default();
        if !self.installed {
            return Served::No("holdfast's webhook configuration is not installed".to_owned());
        }
        if self.selector.as_ref().is_some_and(|s| !s.matches(&labels)) {
            return Served::No(format!(
                "namespace {namespace} is not served by holdfast: its labels ({}) do not match the webhook's namespaceSelector ({}); the controller leaves it alone too",
                show_labels(&labels),
                self.describe
            ));
        }
        if labels.get(IGNORE_LABEL).is_some_and(|v| v == "true") {
            return Served::No(format!(
                "namespace {namespace} is labelled {IGNORE_LABEL}=true: holdfast leaves it alone"
            ));
        }
        Served::Yes
    }
}

fn show_labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A label selector in kubectl's words: `a In [x, y], b NotIn [z]`.
fn describe_selector(selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for expression in selector.match_expressions.iter().flatten() {
        let values = expression.values.as_deref().unwrap_or_default().join(", ");
        parts.push(format!("{} {} [{values}]", expression.key, expression.operator));
    }
    parts.join(", ")
}

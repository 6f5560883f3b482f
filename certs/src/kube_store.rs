//! The self-managed certificate mode against the cluster: the CA, the serving certificate and the
//! published caBundle live in one Secret that every replica reads; whichever replica finds a
//! renewal due performs it with optimistic concurrency (an update conditioned on the
//! resourceVersion), and every replica swaps what the Secret holds into its resolver.
//!
//! CA rotation keeps both CAs in the webhook configurations' `caBundle` for an overlap before the
//! serving certificate switches to the new CA, so no API server ever sees a certificate it does
//! not trust.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Secret,
    },
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use crate::{
    CaOptions, CertError, CertificateAuthority, ServingCert, ServingOptions, SwappableCert, TlsSecret,
    add_to_bundle,
};

/// The Secret key holding the caBundle published to the webhook configurations (every CA a
/// client may still need during a rotation).
pub const SECRET_CA_BUNDLE: &str = "ca-bundle.crt";
/// How many times a read-modify-write is retried when another replica wrote first.
const CONFLICT_RETRIES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("certificate: {0}")]
    Cert(#[from] CertError),
    #[error("Secret {0} holds no caBundle")]
    MissingBundle(String),
    #[error("gave up on {what} after {CONFLICT_RETRIES} conflicting writes")]
    Conflicts { what: String },
}

/// What to manage and where to publish it.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    pub namespace: String,
    pub secret: String,
    pub ca: CaOptions,
    pub serving: ServingOptions,
    /// Fraction of a certificate's lifetime after which it is renewed.
    pub renew_at_fraction: f64,
    /// How long both CAs are published before the serving certificate moves to the new one.
    pub ca_overlap: Duration,
    pub mutating_webhook_configurations: Vec<String>,
    pub validating_webhook_configurations: Vec<String>,
}

/// The Secret's contents, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredTls {
    pub tls: TlsSecret,
    pub ca_bundle: String,
}

impl StoredTls {
    fn from_secret(secret: &Secret) -> Result<Option<Self>, StoreError> {
        let Some(data) = &secret.data else { return Ok(None) };
        let name = secret.metadata.name.clone().unwrap_or_default();
        let tls = TlsSecret::from_secret_data(data.iter().map(|(k, v)| (k, &v.0)))?;
        let bundle = data
            .get(SECRET_CA_BUNDLE)
            .ok_or_else(|| StoreError::MissingBundle(name.clone()))?;
        let ca_bundle = String::from_utf8(bundle.0.clone()).map_err(|_| StoreError::MissingBundle(name))?;
        Ok(Some(Self { tls, ca_bundle }))
    }

    fn to_data(&self) -> BTreeMap<String, ByteString> {
        let mut data: BTreeMap<String, ByteString> = self
            .tls
            .to_secret_data()
            .into_iter()
            .map(|(k, v)| (k, ByteString(v.into_bytes())))
            .collect();
        data.insert(
            SECRET_CA_BUNDLE.into(),
            ByteString(self.ca_bundle.clone().into_bytes()),
        );
        data
    }
}

/// The Secret-backed certificate store of one replica.
pub struct KubeCertStore {
    client: Client,
    secrets: Api<Secret>,
    config: StoreConfig,
    resolver: Arc<SwappableCert>,
}

impl KubeCertStore {
    /// Reads the Secret (creating it, with a new CA, if there is none), renews what is due,
    /// publishes the caBundle, and returns a store whose resolver serves the current certificate.
    pub async fn bootstrap(client: Client, config: StoreConfig) -> Result<Self, StoreError> {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
        let stored = match secrets.get_opt(&config.secret).await? {
            Some(secret) => match StoredTls::from_secret(&secret)? {
                Some(stored) => stored,
                None => Self::initialise(&secrets, &config, Some(secret)).await?,
            },
            None => Self::initialise(&secrets, &config, None).await?,
        };
        let resolver = Arc::new(SwappableCert::new(&stored.tls.serving)?);
        let store = Self {
            client,
            secrets,
            config,
            resolver,
        };
        store.publish(&stored.ca_bundle).await?;
        store.renew_due(OffsetDateTime::now_utc()).await?;
        Ok(store)
    }

    async fn initialise(
        secrets: &Api<Secret>,
        config: &StoreConfig,
        existing: Option<Secret>,
    ) -> Result<StoredTls, StoreError> {
        let ca = CertificateAuthority::generate(&config.ca)?;
        let serving = ca.issue_serving(&config.serving)?;
        let stored = StoredTls {
            ca_bundle: ca.cert_pem().to_string(),
            tls: TlsSecret { ca, serving },
        };
        let result = match existing {
            Some(mut secret) => {
                secret.data = Some(stored.to_data());
                secrets
                    .replace(&config.secret, &PostParams::default(), &secret)
                    .await
            }
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(config.secret.clone()),
                        ..Default::default()
                    },
                    type_: Some("Opaque".into()),
                    data: Some(stored.to_data()),
                    ..Default::default()
                };
                secrets.create(&PostParams::default(), &secret).await
            }
        };
        match result {
            Ok(_) => {
                tracing::info!(secret = %config.secret, "issued a new CA and serving certificate");
                Ok(stored)
            }
            // Another replica initialised it first: use theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let secret = secrets.get(&config.secret).await?;
                StoredTls::from_secret(&secret)?
                    .ok_or_else(|| StoreError::MissingBundle(config.secret.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The resolver the TLS server serves from.
    pub fn resolver(&self) -> Arc<SwappableCert> {
        self.resolver.clone()
    }

    /// The caBundle currently published.
    pub async fn ca_bundle(&self) -> Result<String, StoreError> {
        Ok(self.read().await?.ca_bundle)
    }

    async fn read(&self) -> Result<StoredTls, StoreError> {
        let secret = self.secrets.get(&self.config.secret).await?;
        StoredTls::from_secret(&secret)?.ok_or_else(|| StoreError::MissingBundle(self.config.secret.clone()))
    }

    /// Applies `change` to the latest Secret until the write wins; `change` returns `None` when,
    /// on the latest contents, there is nothing to do (another replica did it).
    async fn update(
        &self,
        what: &str,
        change: impl Fn(&StoredTls) -> Result<Option<StoredTls>, StoreError>,
    ) -> Result<StoredTls, StoreError> {
        for _ in 0..CONFLICT_RETRIES {
            let mut secret = self.secrets.get(&self.config.secret).await?;
            let current = StoredTls::from_secret(&secret)?
                .ok_or_else(|| StoreError::MissingBundle(self.config.secret.clone()))?;
            let Some(next) = change(&current)? else {
                return Ok(current);
            };
            secret.data = Some(next.to_data());
            match self
                .secrets
                .replace(&self.config.secret, &PostParams::default(), &secret)
                .await
            {
                Ok(_) => return Ok(next),
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Conflicts { what: what.into() })
    }

    /// Issues a new serving certificate from the current CA and serves it.
    pub async fn rotate_leaf(&self) -> Result<(), StoreError> {
        let serving = self.config.serving.clone();
        let stored = self
            .update("serving certificate rotation", |current| {
                let mut next = current.clone();
                next.tls.serving = current.tls.ca.issue_serving(&serving)?;
                Ok(Some(next))
            })
            .await?;
        self.serve(&stored.tls.serving)?;
        tracing::info!(not_after = %stored.tls.serving.not_after, fingerprint = %self.resolver.fingerprint(), "rotated the serving certificate");
        Ok(())
    }

    /// Starts using a new CA: publishes old and new CA together, waits out the overlap, then
    /// moves the serving certificate to the new CA. Expired CAs leave the bundle on the way.
    pub async fn rotate_ca(&self) -> Result<(), StoreError> {
        let ca = CertificateAuthority::generate(&self.config.ca)?;
        let now = OffsetDateTime::now_utc();
        let stored = self
            .update("CA rotation", |current| {
                let mut next = current.clone();
                next.ca_bundle = add_to_bundle(&current.ca_bundle, &ca, now)?;
                next.tls.ca = ca.clone();
                Ok(Some(next))
            })
            .await?;
        self.publish(&stored.ca_bundle).await?;
        tracing::info!(
            overlap_seconds = self.config.ca_overlap.as_secs(),
            "published a new CA next to the old one"
        );
        tokio::time::sleep(self.config.ca_overlap).await;
        self.rotate_leaf().await
    }

    /// Renews whatever is due at `now`: the CA (with its overlap), or the serving certificate.
    pub async fn renew_due(&self, now: OffsetDateTime) -> Result<(), StoreError> {
        let stored = self.read().await?;
        let fraction = self.config.renew_at_fraction;
        if stored.tls.ca.validity().needs_renewal(now, fraction) {
            self.rotate_ca().await
        } else if stored.tls.serving.validity().needs_renewal(now, fraction) {
            self.rotate_leaf().await
        } else {
            self.serve(&stored.tls.serving)
        }
    }

    fn serve(&self, serving: &ServingCert) -> Result<(), StoreError> {
        if serving.fingerprint()? != self.resolver.fingerprint() {
            self.resolver.store(serving)?;
        }
        Ok(())
    }

    /// Writes `bundle` into every webhook of holdfast's own webhook configurations.
    pub async fn publish(&self, bundle: &str) -> Result<(), StoreError> {
        let bytes = ByteString(bundle.as_bytes().to_vec());
        self.publish_to::<MutatingWebhookConfiguration>(&self.config.mutating_webhook_configurations, &bytes)
            .await?;
        self.publish_to::<ValidatingWebhookConfiguration>(
            &self.config.validating_webhook_configurations,
            &bytes,
        )
        .await
    }

    async fn publish_to<K: WebhookConfiguration>(
        &self,
        names: &[String],
        bundle: &ByteString,
    ) -> Result<(), StoreError> {
        let api: Api<K> = Api::all(self.client.clone());
        for name in names {
            inject(&api, name, bundle).await?;
        }
        Ok(())
    }

    /// Follows the Secret (another replica's rotation) and renews when due, until `cancel`.
    pub async fn run(self: Arc<Self>, recheck: Duration, cancel: CancellationToken) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.config.secret));
        let mut changes = std::pin::pin!(
            watcher(self.secrets.clone(), config)
                .default_backoff()
                .applied_objects()
        );
        let mut tick = tokio::time::interval(recheck);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(error) = self.renew_due(OffsetDateTime::now_utc()).await {
                        tracing::warn!(%error, "certificate renewal failed; serving the current certificate");
                    }
                }
                Some(event) = changes.next() => match event {
                    Ok(secret) => match StoredTls::from_secret(&secret) {
                        Ok(Some(stored)) => if let Err(error) = self.serve(&stored.tls.serving) {
                            tracing::warn!(%error, "the Secret's serving certificate does not load; keeping the current one");
                        },
                        Ok(None) => {}
                        Err(error) => tracing::warn!(%error, "the certificate Secret does not decode; keeping the current one"),
                    },
                    Err(error) => tracing::warn!(%error, "watching the certificate Secret"),
                },
            }
        }
    }
}

/// A webhook configuration kind whose webhooks each carry a `clientConfig.caBundle`.
trait WebhookConfiguration:
    kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
    + Clone
    + serde::Serialize
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>>;
}

impl WebhookConfiguration for MutatingWebhookConfiguration {
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>> {
        self.webhooks
            .iter_mut()
            .flatten()
            .map(|w| &mut w.client_config.ca_bundle)
            .collect()
    }
}

impl WebhookConfiguration for ValidatingWebhookConfiguration {
    fn ca_bundles(&mut self) -> Vec<&mut Option<ByteString>> {
        self.webhooks
            .iter_mut()
            .flatten()
            .map(|w| &mut w.client_config.ca_bundle)
            .collect()
    }
}

async fn inject<K: WebhookConfiguration>(
    api: &Api<K>,
    name: &str,
    bundle: &ByteString,
) -> Result<(), StoreError> {
    for _ in 0..CONFLICT_RETRIES {
        let mut config = api.get(name).await?;
        let mut changed = false;
        for slot in config.ca_bundles() {
            if slot.as_ref() != Some(bundle) {
                *slot = Some(bundle.clone());
                changed = true;
            }
        }
        if !changed {
            return Ok(());
        }
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(_) => {
                tracing::info!(configuration = name, "injected the caBundle");
                return Ok(());
            }
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(StoreError::Conflicts {
        what: format!("caBundle injection into {name}"),
    })
}

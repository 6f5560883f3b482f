//! Leader election on a `coordination.k8s.io/v1` Lease, so the controller can run with several
//! replicas and only one reconciles. A candidate takes the Lease when it is free or expired; the
//! leader renews it and stops its work at once if a renewal fails (like controller-runtime, it
//! then exits and restarts as a candidate), and releases it on shutdown so a standby takes over
//! without waiting for the expiry.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone)]
pub struct Election {
    pub namespace: String,
    pub lease: String,
    /// This replica's name (the pod name).
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// How often the leader renews (well under `duration`).
    pub renew_every: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("lost the lease {0} to another replica or could not renew it in time")]
    Lost(String),
}

impl Election {
    /// Waits until this replica holds the Lease, then runs `work` with a token that is cancelled
    /// when leadership is lost or `cancel` fires. Returns `Err(Lost)` if leadership was lost.
    pub async fn lead<F, Fut>(&self, client: Client, cancel: CancellationToken, work: F) -> Result<(), Error>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let leases: Api<Lease> = Api::namespaced(client, &self.namespace);
        loop {
            if cancel.is_cancelled() {
                return Ok(());
            }
            if self.try_acquire(&leases).await? {
                break;
            }
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(self.renew_every) => {}
            }
        }
        tracing::info!(lease = %self.lease, identity = %self.identity, "became leader");
        let leading = cancel.child_token();
        let task = tokio::spawn(work(leading.clone()));
        let result = loop {
            tokio::select! {
                _ = cancel.cancelled() => break Ok(()),
                _ = tokio::time::sleep(self.renew_every) => {
                    match self.try_acquire(&leases).await {
                        Ok(true) => {}
                        Ok(false) => break Err(Error::Lost(self.lease.clone())),
                        Err(error) => {
                            tracing::warn!(%error, "renewing the lease failed");
                            break Err(Error::Lost(self.lease.clone()));
                        }
                    }
                }
            }
        };
        leading.cancel();
        let _ = task.await;
        if result.is_ok() {
            self.release(&leases).await;
        }
        result
    }

    /// Takes or renews the Lease; `false` when another replica holds an unexpired one.
    async fn try_acquire(&self, leases: &Api<Lease>) -> Result<bool, Error> {
        let now = Timestamp::now();
        let Some(mut lease) = leases.get_opt(&self.lease).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.lease.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, now, 0)),
            };
            return match leases.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let renewed = spec.renew_time.as_ref().map_or(Timestamp::MIN, |t| t.0);
        let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
        let expires = renewed.checked_add(duration).unwrap_or(Timestamp::MAX);
        let mine = holder == self.identity;
        if !mine && !holder.is_empty() && expires > now {
            return Ok(false);
        }
        let acquired = if mine {
            spec.acquire_time.map(|t| t.0).unwrap_or(now)
        } else {
            now
        };
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        lease.spec = Some(self.spec(acquired, now, transitions));
        match leases.replace(&self.lease, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Hands the Lease back so a standby need not wait for it to expire.
    async fn release(&self, leases: &Api<Lease>) {
        if let Ok(Some(mut lease)) = leases.get_opt(&self.lease).await
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(self.identity.as_str())
        {
            spec.holder_identity = None;
            spec.renew_time = None;
            let _ = leases.replace(&self.lease, &PostParams::default(), &lease).await;
            tracing::info!(lease = %self.lease, "released the lease");
        }
    }

    fn spec(&self, acquired: Timestamp, renewed: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(renewed)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }
}

//! Org deletions through the faults: one Korifi org after another, each with a space and a few
//! apps staged by the real kpack and running ([`org_deletion::populate`]), deleted as
//! `cf delete-org` would ([`org_deletion::delete`]), for the whole soak. holdfast's replicas are
//! in the chain: the webhooks stamp each kpack Image with its CFApp and refuse Builds and build
//! pods for terminating owners, the leading controller finalizes fast. Every deletion must
//! complete, and no kpack Build or build pod may be created in the space after the delete,
//! except while a fault takes a webhook replica or the API server down (the shipped
//! `failurePolicy: Ignore` then lets an admission through unjudged). One incomplete deletion is
//! told apart: across a kube-apiserver restart the namespace controller can delete the org's
//! namespace while its CFSpace stays stored there ([`org_deletion::orphaned_space`]), which no
//! one then deletes; that is counted, not judged.

use std::time::{Duration, Instant};

use kube::Client;
use tokio_util::sync::CancellationToken;

use super::{
    GRACE,
    faults::{Fault, Timeline},
    invariants::Violations,
};
use crate::peers::korifi::org_deletion;

/// How long an org's deletion may take: about a minute on a quiet machine (three apps: their
/// pods' 30 s grace, then the namespace controller's passes), slowed here by the load beside it
/// and by a fault that restarts the API server or kills etcd meanwhile.
const DELETION_TIMEOUT: Duration = Duration::from_secs(300);

/// What the org churn did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Churned {
    /// Orgs deleted to the end (the CFOrg, both namespaces and the apps' volumes gone).
    pub deletions: usize,
    /// Builds and build pods created in a space after its org's delete, excused ones included.
    pub builds_after_delete: usize,
    /// Orgs Korifi or kpack did not stage in time (a fault slowed them): not deleted, not judged.
    pub not_populated: usize,
    /// Org deletions that overlapped the API server's downtime and stopped short because the
    /// namespace controller left the org's CFSpace stored in its deleted namespace
    /// ([`org_deletion::orphaned_space`]): Kubernetes' loss, not judged.
    pub orphaned_by_apiserver_restart: usize,
}

/// The org churn: `apps` apps per org, pushed from `registry` under `repository_prefix`.
pub struct Orgs {
    pub client: Client,
    pub registry: String,
    pub repository_prefix: String,
    pub apps: usize,
    pub timeline: Timeline,
    pub violations: Violations,
}

impl Orgs {
    /// Populates and deletes orgs until `stop`; the org being deleted then is waited for.
    pub async fn churn(self, stop: CancellationToken) -> Churned {
        let mut churned = Churned::default();
        while !stop.is_cancelled() {
            let populated =
                org_deletion::populate(&self.client, &self.registry, &self.repository_prefix, self.apps)
                    .await;
            let org = match populated {
                Ok(org) => org,
                Err(error) => {
                    churned.not_populated += 1;
                    eprintln!("soak: an org was not staged in time; another follows: {error:#}");
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(5)) => continue,
                    }
                }
            };
            let started = Instant::now();
            match org_deletion::delete(&self.client, &org, DELETION_TIMEOUT).await {
                Ok(deletion) => {
                    churned.deletions += 1;
                    let (builds, pods) = (deletion.builds_created(), deletion.build_pods_created());
                    churned.builds_after_delete += builds + pods;
                    let down = |f: Fault| f.apiserver_down() || f.webhook_down();
                    if builds + pods > 0 && !self.timeline.overlaps(started, Instant::now(), GRACE, down) {
                        self.violations.record(
                            "build-after-org-delete",
                            format!(
                                "org {}: {builds} kpack Builds and {pods} build pods created in its space after the delete",
                                org.org
                            ),
                        );
                    }
                    eprintln!(
                        "soak: org {} with {} app(s) deleted in {:.1} s; {builds} Builds and {pods} build pods after the delete",
                        org.org,
                        org.apps.len(),
                        deletion.total().as_secs_f64()
                    );
                }
                Err(error) => {
                    // The namespace controller's own loss under an API server restart is told
                    // apart (and counted), not holdfast's to answer for; anything else is.
                    let restarted =
                        self.timeline
                            .overlaps(started, Instant::now(), GRACE, Fault::apiserver_down);
                    match org_deletion::orphaned_space(&self.client, &org).await {
                        Ok(Some(orphan)) if restarted => {
                            churned.orphaned_by_apiserver_restart += 1;
                            eprintln!(
                                "soak: org {}'s deletion left an orphan across a kube-apiserver restart (excused): {orphan}; {error:#}",
                                org.org
                            );
                        }
                        _ => self
                            .violations
                            .record("org-deletion-incomplete", format!("org {}: {error:#}", org.org)),
                    }
                }
            }
        }
        churned
    }
}

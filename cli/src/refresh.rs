//! `kubectl holdfast refresh REF|KIND/NAME`: asks the controller to re-resolve entries now, by
//! setting their `holdfast.dev/refresh` annotation to a new value, and waits until each entry's
//! `status.lastRefresh` answers that value. The CLI never asks a registry itself: the controller
//! checks only keys that live objects name, with the Secrets they name.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use holdfast_cache::{
    CacheKey, Scope,
    cluster_store::{self, REFRESH_ANNOTATION, RefreshOutcome, RefreshResult},
};
use holdfast_registry::Reference;
use kube::{
    api::{DynamicObject, Patch, PatchParams},
    runtime::wait::await_condition,
};
use serde_json::json;

use crate::{
    Outcome,
    args::Refresh,
    cluster::Cluster,
    report::report,
    target::{self, display},
};

pub async fn run(cluster: &Cluster, args: &Refresh) -> Result<Outcome> {
    let entries = cluster.entries().await?;
    let (what, keys): (String, Vec<CacheKey>) = match target::parse(&args.target)? {
        Some(target) => {
            let object = cluster.get(target.kind, &args.namespace, &target.name).await?;
            let served = cluster.served().await?.served(&args.namespace);
            let value = serde_json::to_value(&object)?;
            let report = report(target.kind, &value, &args.namespace, &served, &entries);
            let keys = report.sites.iter().filter_map(|s| s.key.clone()).collect();
            (
                format!("{} -n {}", display(target.kind, &target.name), args.namespace),
                keys,
            )
        }
        None => {
            let reference = Reference::parse(&args.target)
                .with_context(|| format!("{:?} is not an image reference", args.target))?;
            let normalised = CacheKey::tag(&reference, Scope::Anonymous).reference;
            let keys = entries
                .of_reference(&normalised)
                .into_iter()
                .map(|e| e.entry.key.clone())
                .collect();
            (normalised, keys)
        }
    };
    let targets: Vec<_> = keys.iter().filter_map(|key| entries.get(key)).collect();
    if targets.is_empty() {
        bail!(
            "no digest cache entry for {what}: holdfast keeps entries only for tags that objects name and it resolved (kubectl holdfast explain says why)"
        );
    }
    let token = request_token();
    let api = cluster.entries_api();
    for entry in &targets {
        let patch = json!({"metadata": {"annotations": {REFRESH_ANNOTATION: token}}});
        api.patch(&entry.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("annotating the DigestCacheEntry {}", entry.name))?;
    }
    println!(
        "asked the controller to refresh {} entries of {what}",
        targets.len()
    );
    let mut outcome = Outcome::Fine;
    for entry in &targets {
        let (wanted, before) = (token.clone(), entry.entry.digest.to_string());
        // A moved tag's new digest may reach the entry's spec after its status says Moved (two
        // writes of the controller): wait for both, so the digest printed is the new one.
        let acted = await_condition(api.clone(), &entry.name, move |object: Option<&DynamicObject>| {
            last_refresh(object).is_some_and(|r| {
                r.request == wanted
                    && (r.result != RefreshResult::Moved || spec_digest(object).is_some_and(|d| d != before))
            })
        });
        let acted = tokio::time::timeout(args.timeout, acted).await.map_err(|_| {
            anyhow::anyhow!(
                "the controller did not act on {} within {:?}: is holdfast-controller running and leading? (kubectl -n {} get lease holdfast-controller)",
                entry.name,
                args.timeout,
                cluster.holdfast_namespace
            )
        })??;
        let Some(done) = last_refresh(acted.as_ref()) else {
            bail!("the DigestCacheEntry {} was deleted while refreshing", entry.name);
        };
        let digest = spec_digest(acted.as_ref()).unwrap_or_default();
        let said = match done.result {
            RefreshResult::Checked => format!("checked: the tag still holds {digest}"),
            RefreshResult::Moved => format!(
                "moved: now {digest} (was {}); the objects naming it are re-pinned",
                entry.entry.digest
            ),
            RefreshResult::Failed => {
                outcome = Outcome::NeedsAttention;
                "failed: the registry did not answer; see the entry's Stale condition".to_owned()
            }
            RefreshResult::NotNamed => {
                outcome = Outcome::NeedsAttention;
                "not checked: no object names it any more (the controller checks only what objects name)"
                    .to_owned()
            }
        };
        println!(
            "  {} ({}, entry {}): {said}",
            entry.entry.key.reference, entry.entry.key.scope, entry.name
        );
    }
    Ok(outcome)
}

/// The digest the entry's spec holds.
fn spec_digest(object: Option<&DynamicObject>) -> Option<String> {
    Some(cluster_store::parse(object?).ok()?.spec.digest.to_string())
}

fn last_refresh(object: Option<&DynamicObject>) -> Option<RefreshOutcome> {
    cluster_store::parse(object?).ok()?.status?.last_refresh
}

/// A value no earlier request used: the time, and this process.
fn request_token() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    format!("{}-{}", now.as_millis(), std::process::id())
}

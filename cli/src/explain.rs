//! `kubectl holdfast explain KIND/NAME`: each fetch reference as written and as stored, the
//! digest cache entry it came from, the last holdfast Events on the object, and in words why it
//! is or is not pinned. Exits 1 when the object needs attention.

use std::time::SystemTime;

use anyhow::{Result, bail};
use kube::ResourceExt;

use crate::{
    Outcome,
    args::Explain,
    cluster::Cluster,
    entries::{Entry, relative},
    report::{SitePin, report},
    status::rfc3339,
    target::{self, display},
};

/// At most this many Events are shown, the latest.
const EVENTS: usize = 5;

pub async fn run(cluster: &Cluster, args: &Explain) -> Result<Outcome> {
    let Some(target) = target::parse(&args.target)? else {
        bail!("{:?}: give KIND/NAME, e.g. app/my-app", args.target);
    };
    let object = cluster.get(target.kind, &args.namespace, &target.name).await?;
    let served = cluster.served().await?.served(&args.namespace);
    let entries = cluster.entries().await?;
    let value = serde_json::to_value(&object)?;
    let report = report(target.kind, &value, &args.namespace, &served, &entries);
    let now = SystemTime::now();
    println!(
        "{} -n {}: {} (holdfast.dev/pin: {})",
        display(target.kind, &target.name),
        args.namespace,
        report.state.words(),
        report.policy.as_str()
    );
    println!("  {}", report.why);
    if report.sites.is_empty() {
        println!("\nNo OCI image or imgpkg bundle reference in its fetch.");
    }
    for site in &report.sites {
        println!("\n{}", site.field);
        println!("  written:  {}", site.written);
        println!("  stored:   {}", site.stored);
        match &site.pin {
            SitePin::Holdfast { digest, mirror } => {
                println!("  pinned:   {digest}, by holdfast");
                if let Some(mirror) = mirror {
                    println!("  mirror:   pinned to holdfast's mirror copy in {mirror}");
                }
            }
            SitePin::UserDigest => {
                println!("  pinned:   a digest written by the user; holdfast leaves it alone")
            }
            SitePin::Unpinned(why) => println!("  not pinned: {why}"),
        }
        match (site.entry, &site.key) {
            (Some(entry), _) => print_entry(entry, &cluster.holdfast_namespace, now),
            (None, Some(key)) => println!(
                "  entry:    none in {} for {} ({})",
                cluster.holdfast_namespace, key.reference, key.scope
            ),
            (None, None) => {}
        }
    }
    let uid = object.uid().unwrap_or_default();
    let events = cluster.events(&args.namespace, &uid).await?;
    println!("\nEvents (holdfast-controller):");
    if events.is_empty() {
        println!("  none");
    }
    for event in events.iter().rev().take(EVENTS).rev() {
        let at = event
            .event_time
            .as_ref()
            .map(|t| t.0)
            .or(event.last_timestamp.as_ref().map(|t| t.0))
            .map(|t| relative(SystemTime::from(t), now))
            .unwrap_or_default();
        println!(
            "  {at:>8}  {:<7}  {:<10}  {}",
            event.type_.as_deref().unwrap_or_default(),
            event.reason.as_deref().unwrap_or_default(),
            event.message.as_deref().unwrap_or_default()
        );
    }
    Ok(if report.state.needs_attention() {
        Outcome::NeedsAttention
    } else {
        Outcome::Fine
    })
}

fn print_entry(entry: &Entry, namespace: &str, now: SystemTime) {
    let e = &entry.entry;
    println!(
        "  entry:    {namespace}/{} ({}, scope {}{})",
        entry.name,
        e.key.reference,
        e.key.scope,
        entry
            .used_by()
            .map(|n| format!(", named by {n} objects"))
            .unwrap_or_default()
    );
    println!(
        "            {}{}, resolved {} ({}), checked {} ({})",
        e.digest,
        e.tag.as_ref().map(|t| format!(" (tag {t})")).unwrap_or_default(),
        rfc3339(e.resolved_at),
        relative(e.resolved_at, now),
        rfc3339(e.checked_at),
        relative(e.checked_at, now),
    );
    match &e.error {
        None => println!("            state: fresh"),
        Some(error) => println!(
            "            state: stale, the last check failed: {error}{}",
            entry
                .serve_stale_until()
                .map(|until| format!("; served until {} ({})", rfc3339(until), relative(until, now)))
                .unwrap_or_default()
        ),
    }
    match entry.mirror_copy() {
        Some(copy) => println!("            mirror copy: {copy}"),
        None => {
            if let Some(mirrored) = entry.condition("Mirrored") {
                println!("            mirror: {}", mirrored.message);
            }
        }
    }
}

//! `kubectl holdfast status`: per namespace, how many objects are pinned, not pinned, pinned
//! from stale entries, pinned to the mirror, opted out or ignored; the entries serving stale
//! and until when; the objects that need attention.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::SystemTime,
};

use anyhow::Result;
use holdfast_cache::CacheKey;
use holdfast_pins::PinnedKind;
use kube::ResourceExt;

use crate::{
    Outcome,
    args::Status,
    cluster::Cluster,
    entries::{Entry, relative},
    report::{ObjectState, SitePin, report},
    target::display,
};

/// The states, in the columns' order.
const COLUMNS: [ObjectState; 7] = [
    ObjectState::Pinned,
    ObjectState::Unpinned,
    ObjectState::PinnedStale,
    ObjectState::PinnedToMirror,
    ObjectState::OptedOut,
    ObjectState::Ignored,
    ObjectState::NothingToPin,
];

pub async fn run(cluster: &Cluster, args: &Status) -> Result<Outcome> {
    let scope = args.namespaces.one();
    let served = cluster.served().await?;
    let entries = cluster.entries().await?;
    let mut counts: BTreeMap<String, [usize; COLUMNS.len()]> = BTreeMap::new();
    let mut attention = Vec::new();
    let mut named: BTreeSet<CacheKey> = BTreeSet::new();
    for kind in PinnedKind::ALL {
        for object in cluster.list(kind, scope).await? {
            let namespace = object.namespace().unwrap_or_default();
            let value = serde_json::to_value(&object)?;
            let report = report(kind, &value, &namespace, &served.served(&namespace), &entries);
            let column = COLUMNS
                .iter()
                .position(|s| *s == report.state)
                .unwrap_or_default();
            counts.entry(namespace.clone()).or_default()[column] += 1;
            named.extend(report.sites.iter().filter_map(|s| s.key.clone()));
            if report.state.needs_attention() {
                let why = report
                    .sites
                    .iter()
                    .find_map(|s| match &s.pin {
                        SitePin::Unpinned(why) => Some(format!("{}: {why}", s.field)),
                        _ => None,
                    })
                    .unwrap_or(report.why);
                attention.push(format!(
                    "{} -n {namespace}: {}: {why}",
                    display(kind, &object.name_any()),
                    report.state.words()
                ));
            }
        }
    }
    if counts.is_empty() {
        println!(
            "No App, PackageRepository or Package {}.",
            match scope {
                Some(namespace) => format!("in namespace {namespace}"),
                None => "in the cluster".to_owned(),
            }
        );
    } else {
        let header = [
            "NAMESPACE",
            "PINNED",
            "UNPINNED",
            "STALE",
            "MIRROR",
            "OPTED-OUT",
            "IGNORED",
            "NOTHING-TO-PIN",
        ];
        let rows: Vec<Vec<String>> = counts
            .iter()
            .map(|(namespace, counts)| {
                std::iter::once(namespace.clone())
                    .chain(counts.iter().map(usize::to_string))
                    .collect()
            })
            .collect();
        print_table(&header, &rows);
    }
    // With one namespace, the entries its objects name; otherwise every entry.
    let stale: Vec<&Entry> = entries
        .all()
        .into_iter()
        .filter(|e| e.is_stale() && (scope.is_none() || named.contains(&e.entry.key)))
        .collect();
    let now = SystemTime::now();
    println!();
    if stale.is_empty() {
        println!("Entries serving stale: none.");
    } else {
        println!(
            "Entries serving stale: {} (the registry failed on their last check)",
            stale.len()
        );
        for entry in &stale {
            let until = match (entry.staleness_exceeded(), entry.serve_stale_until()) {
                (true, _) => {
                    "the staleness limit has run out: references naming it are left unpinned".to_owned()
                }
                (false, Some(until)) => format!("served until {} ({})", rfc3339(until), relative(until, now)),
                (false, None) => {
                    "served until the controller's --cache-max-staleness-seconds (no status written yet)"
                        .to_owned()
                }
            };
            println!(
                "  {} ({}, entry {}): {}; resolved {}; {until}",
                entry.entry.key.reference,
                entry.entry.key.scope,
                entry.name,
                entry.entry.error.as_deref().unwrap_or_default(),
                relative(entry.entry.resolved_at, now),
            );
        }
    }
    if attention.is_empty() && stale.is_empty() {
        return Ok(Outcome::Fine);
    }
    if !attention.is_empty() {
        println!();
        println!(
            "Needs attention ({}; kubectl holdfast explain KIND/NAME -n NAMESPACE says more):",
            attention.len()
        );
        for line in &attention {
            println!("  {line}");
        }
    }
    Ok(Outcome::NeedsAttention)
}

/// Columns padded as kubectl pads them (three spaces between).
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("   ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

pub fn rfc3339(time: SystemTime) -> String {
    time::OffsetDateTime::from(time)
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

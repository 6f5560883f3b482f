//! What must hold all along, each breach a counted violation: no object stored pinned to a digest
//! its tag never pointed to; no DigestCacheEntry lost (deleted while objects name its tag),
//! reverted (back to an older digest of its tag) or naming a digest its tag never pointed to;
//! every moved tag's pins followed within two refresh intervals of the last recovery; no holdfast
//! process panicking. The history of each tag comes from the soak's own pushes, each recorded
//! before the push, so a digest is in it before any registry can serve it. Also here: the
//! resources of holdfast's processes sampled (and a process that exited started again, as a
//! kubelet would).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::StreamExt as _;
use holdfast_cache::cluster_store::DigestCacheEntry;
use kube::{
    Api, ResourceExt as _,
    api::DynamicObject,
    runtime::{WatchStreamExt as _, watcher},
};
use tokio_util::sync::CancellationToken;

use super::{
    faults::Timeline,
    load,
    replicas::{Component, Holdfast},
};
use crate::{Env, process::Usage};

/// Locks a soak mutex; every writer leaves its state whole (one insert or push at a time), so
/// a poisoned one is still consistent.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Each tag's digests, oldest first, as the soak pushed them.
#[derive(Debug, Default)]
pub struct History {
    /// Indexed by tag number: the tag's reference as objects name it, and its digests.
    tags: Vec<(String, Vec<String>)>,
}

impl History {
    /// A tag named `reference` (`front/repository:tag`), with no digest yet; its number.
    pub fn add_tag(&mut self, reference: String) -> usize {
        self.tags.push((reference, Vec::new()));
        self.tags.len() - 1
    }

    /// `digest` is about to be pushed under tag `tag`; its position in the tag's history. A
    /// push tried again (the registry was stopped) records nothing new: the same digest twice
    /// would make the later position look older than the move it is.
    pub fn record(&mut self, tag: usize, digest: String) -> usize {
        let digests = &mut self.tags[tag].1;
        if digests.last() != Some(&digest) {
            digests.push(digest);
        }
        digests.len() - 1
    }

    pub fn reference(&self, tag: usize) -> Option<&str> {
        self.tags.get(tag).map(|(reference, _)| reference.as_str())
    }

    /// The tag named `reference`.
    pub fn tag_of(&self, reference: &str) -> Option<usize> {
        self.tags.iter().position(|(r, _)| r == reference)
    }

    /// Where `digest` is in tag `tag`'s history; none if the tag never pointed to it.
    pub fn position(&self, tag: usize, digest: &str) -> Option<usize> {
        self.tags.get(tag)?.1.iter().position(|d| d == digest)
    }

    pub fn tags(&self) -> usize {
        self.tags.len()
    }
}

/// One breach of an invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

/// Every violation so far; each is also printed when found.
#[derive(Debug, Clone, Default)]
pub struct Violations(Arc<Mutex<Vec<Violation>>>);

impl Violations {
    pub fn record(&self, invariant: &'static str, detail: String) {
        eprintln!("soak: VIOLATION {invariant}: {detail}");
        lock(&self.0).push(Violation { invariant, detail });
    }

    pub fn all(&self) -> Vec<Violation> {
        lock(&self.0).clone()
    }
}

/// What the checks share with the load.
#[derive(Clone)]
pub struct Shared {
    pub history: Arc<Mutex<History>>,
    /// Live objects per tag, as the load created and deleted them.
    pub live: Arc<Mutex<BTreeMap<usize, usize>>>,
    pub violations: Violations,
    pub timeline: Timeline,
    pub mirrored: Mirrored,
}

/// The mirror as pins name it, and the pins to it seen so far (each must be served by the
/// mirror: checked at the end, [`Mirrored::seen`]).
#[derive(Debug, Clone, Default)]
pub struct Mirrored {
    /// Where the upstream front's repositories are copied: `mirror/holdfast/<front's host>`
    /// (`--mirror-prefix`'s default).
    prefix: String,
    seen: Arc<Mutex<BTreeSet<String>>>,
}

impl Mirrored {
    /// The mirror `mirror` (`host:port`, as pins name it) of the registry `upstream`.
    pub fn new(mirror: &str, upstream: &str) -> Self {
        Self {
            prefix: format!(
                "{mirror}/holdfast/{}",
                holdfast_registry::mirror::host_component(upstream)
            ),
            seen: Arc::default(),
        }
    }

    /// The mirror's copy of the repository `written` (`upstream/path`).
    pub fn repository_of(&self, written: &str) -> Option<String> {
        let (_, path) = written.split_once('/')?;
        Some(format!("{}/{path}", self.prefix))
    }

    /// Every pin to the mirror seen (`mirror/…@digest`).
    pub fn seen(&self) -> Vec<String> {
        lock(&self.seen).iter().cloned().collect()
    }
}

/// Watches the load's objects of `kind` until `stop`: every version stored pinned must name
/// its tag's repository and a digest the tag pointed to.
pub async fn watch_pins(
    api: Api<DynamicObject>,
    kind: holdfast_pins::PinnedKind,
    shared: Shared,
    stop: CancellationToken,
) {
    let config = watcher::Config::default().labels(load::TAG_LABEL);
    let mut objects = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
    // Each stored version is judged once, however often the watch delivers it again.
    let mut reported = BTreeSet::new();
    while let Some(Some(object)) = stop.run_until_cancelled(objects.next()).await {
        let Ok(object) = object else { continue };
        let Some((tag, url)) = load::tag_and_url(&object, kind) else {
            continue;
        };
        let Some((repository, digest)) = url.split_once('@') else {
            continue;
        };
        let (served, mirrored) = {
            let history = lock(&shared.history);
            let written = history
                .reference(tag)
                .and_then(|r| r.rsplit_once(':'))
                .map(|(repo, _)| repo);
            // Pinned upstream, or to the mirror's copy of the same repository.
            let mirrored =
                written.and_then(|w| shared.mirrored.repository_of(w)).as_deref() == Some(repository);
            let known = history.position(tag, digest).is_some();
            ((written == Some(repository) || mirrored) && known, mirrored)
        };
        if served && mirrored {
            lock(&shared.mirrored.seen).insert(url.to_string());
        }
        if !served && reported.insert((object.uid(), url.to_string())) {
            shared.violations.record(
                "pin-never-served",
                format!(
                    "{kind} {}/{} stored pinned to {url}, which tag {tag} never pointed to",
                    object.namespace().unwrap_or_default(),
                    object.name_any()
                ),
            );
        }
    }
}

/// Watches the digest cache until `stop`: an entry of a soak tag must name a digest of the tag,
/// never move back to an older one, and never go while objects name the tag.
pub async fn watch_entries(api: Api<DigestCacheEntry>, shared: Shared, stop: CancellationToken) {
    use kube::runtime::watcher::Event;
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    // Per entry: its tag and the latest position of its digest in the tag's history.
    let mut known: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut listing: Option<BTreeSet<String>> = None;
    while let Some(Some(event)) = stop.run_until_cancelled(events.next()).await {
        let Ok(event) = event else { continue };
        match event {
            Event::Init => listing = Some(BTreeSet::new()),
            Event::InitApply(entry) => {
                listing.get_or_insert_default().insert(entry.name_any());
                judge_entry(&entry, &mut known, &shared);
            }
            // A relisting (after the API server or etcd came back) shows what went meanwhile.
            Event::InitDone => {
                let listed = listing.take().unwrap_or_default();
                let gone: Vec<String> = known.keys().filter(|k| !listed.contains(*k)).cloned().collect();
                for name in gone {
                    entry_gone(&name, &mut known, &shared);
                }
            }
            Event::Apply(entry) => judge_entry(&entry, &mut known, &shared),
            Event::Delete(entry) => entry_gone(&entry.name_any(), &mut known, &shared),
        }
    }
}

fn judge_entry(entry: &DigestCacheEntry, known: &mut BTreeMap<String, (usize, usize)>, shared: &Shared) {
    let history = lock(&shared.history);
    let Some(tag) = history.tag_of(&entry.spec.reference) else {
        return;
    };
    let digest = entry.spec.digest.to_string();
    let name = entry.name_any();
    match history.position(tag, &digest) {
        None => shared.violations.record(
            "entry-never-served",
            format!("DigestCacheEntry {name} holds {digest}, which tag {tag} never pointed to"),
        ),
        Some(position) => {
            if let Some((_, before)) = known.get(&name)
                && position < *before
            {
                shared.violations.record(
                    "entry-reverted",
                    format!(
                        "DigestCacheEntry {name} went back from version {before} to {position} ({digest}) of tag {tag}"
                    ),
                );
            }
            known.insert(name, (tag, position));
        }
    }
}

fn entry_gone(name: &str, known: &mut BTreeMap<String, (usize, usize)>, shared: &Shared) {
    let Some((tag, _)) = known.remove(name) else {
        return;
    };
    let named_by = lock(&shared.live).get(&tag).copied().unwrap_or(0);
    if named_by > 0 {
        shared.violations.record(
            "entry-lost",
            format!("DigestCacheEntry {name} of tag {tag} deleted while {named_by} objects name the tag"),
        );
    }
}

/// A tag moved: its new digest's position in the tag's history, and when.
#[derive(Debug, Clone, Copy)]
pub struct Move {
    pub tag: usize,
    pub position: usize,
    pub at: Instant,
}

/// Waits until two refresh intervals (and `slack`) after the later of the move and the last
/// recovery from a fault that touched the time since, then checks that every object naming the
/// tag, not being deleted, is pinned to the moved digest or a later one. Returns whether it
/// was checked (an API server that does not answer by `give_up` leaves it unchecked).
pub async fn follow(
    apis: Vec<(holdfast_pins::PinnedKind, Api<DynamicObject>)>,
    moved: Move,
    refresh: Duration,
    slack: Duration,
    shared: Shared,
) -> bool {
    let wait = refresh * 2 + slack;
    let due = loop {
        let due = shared
            .timeline
            .last_recovery_since(moved.at)
            .unwrap_or(moved.at)
            .max(moved.at)
            + wait;
        tokio::time::sleep_until(due.into()).await;
        // A fault injected meanwhile moves the deadline to two intervals after its recovery.
        if shared.timeline.last_recovery_since(moved.at).unwrap_or(moved.at) + wait <= Instant::now() {
            break due;
        }
    };
    let selector = format!("{}={}", load::TAG_LABEL, moved.tag);
    let mut behind = Vec::new();
    for (kind, api) in apis {
        let listed = loop {
            match api
                .list(&kube::api::ListParams::default().labels(&selector))
                .await
            {
                Ok(listed) => break listed,
                // The next fault may be the API server's: wait for it, as the load does.
                Err(error) if due.elapsed() < refresh * 4 => {
                    tracing::debug!(%error, "listing for a follow check");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(error) => {
                    eprintln!("soak: follow check of tag {} not done: {error}", moved.tag);
                    return false;
                }
            }
        };
        let history = lock(&shared.history);
        for object in listed
            .items
            .iter()
            .filter(|o| o.metadata.deletion_timestamp.is_none())
        {
            let Some((_, url)) = load::tag_and_url(object, kind) else {
                continue;
            };
            let position = url
                .split_once('@')
                .and_then(|(_, d)| history.position(moved.tag, d));
            if position.is_none_or(|p| p < moved.position) {
                behind.push(format!(
                    "{kind} {}/{}: {url}",
                    object.namespace().unwrap_or_default(),
                    object.name_any()
                ));
            }
        }
    }
    if !behind.is_empty() {
        shared.violations.record(
            "pins-did-not-follow",
            format!(
                "tag {} moved to version {} {:.0} s ago; {:.0} s after the move (or the last recovery since) these still name an older digest or the tag: {}",
                moved.tag,
                moved.position,
                moved.at.elapsed().as_secs_f64(),
                wait.as_secs_f64(),
                behind.join(", ")
            ),
        );
    }
    true
}

/// What a holdfast process was doing when sampled. A controller's footprint steps when it
/// starts leading (a watch of every kind, registry connections), so each role is judged apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// A webhook replica.
    Serving,
    /// A controller replica holding the Lease (`holdfast_controller_leader 1`).
    Leading,
    /// A controller replica standing by (`holdfast_controller_leader 0`).
    StandingBy,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Serving => "serving",
            Role::Leading => "leading",
            Role::StandingBy => "standing-by",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        [Role::Serving, Role::Leading, Role::StandingBy]
            .into_iter()
            .find(|role| role.as_str() == text)
    }
}

/// One sample of one holdfast process.
#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub pid: u32,
    pub role: Role,
    pub at: Instant,
    pub usage: Usage,
}

/// Samples every holdfast process every `every` until `stop`, and has holdfast start again the
/// host processes that exited ([`Holdfast::restart_exited`]); returns the samples and the
/// restarts. A controller whose role cannot be read (it is starting, or just exited) is not
/// sampled that round.
pub async fn monitor(
    env: Arc<tokio::sync::Mutex<Env>>,
    holdfast: Arc<Holdfast>,
    every: Duration,
    started: Instant,
    stop: CancellationToken,
) -> Result<(Vec<Sample>, Vec<String>)> {
    let (mut samples, mut restarts) = (Vec::new(), Vec::new());
    let mut tick = tokio::time::interval(every);
    while stop.run_until_cancelled(tick.tick()).await.is_some() {
        for restart in holdfast
            .restart_exited(&env, started.elapsed().as_secs_f64())
            .await?
        {
            eprintln!("soak: {restart}");
            restarts.push(restart);
        }
        for replica in holdfast.replicas() {
            // A process that exits between the look-up and the read is seen next round.
            let Some(pid) = holdfast.pid(&env, replica).await else {
                continue;
            };
            let (at, Ok(usage)) = (Instant::now(), Usage::of(Some(pid))) else {
                continue;
            };
            let role = match replica.component {
                Component::Webhook => Some(Role::Serving),
                Component::Controller => leading(&replica.admin)
                    .await
                    .map(|leading| if leading { Role::Leading } else { Role::StandingBy }),
            };
            if let Some(role) = role {
                samples.push(Sample {
                    name: replica.name.clone(),
                    pid,
                    role,
                    at,
                    usage,
                });
            }
        }
    }
    Ok((samples, restarts))
}

/// Whether the controller serving its admin port at `admin` leads (its
/// `holdfast_controller_leader` gauge); none when the gauge cannot be read.
pub(super) async fn leading(admin: &str) -> Option<bool> {
    let text = crate::metrics::scrape(admin).await.ok()?;
    crate::metrics::value(&text, "holdfast_controller_leader").map(|value| value == 1.0)
}

/// Writes `samples` to `path` as CSV (seconds since `started`, process, pid, role, RSS in MiB,
/// open file descriptors, threads): what a resource bound was judged on, kept for a reader.
pub fn write_samples(path: &std::path::Path, samples: &[Sample], started: Instant) -> Result<()> {
    use std::fmt::Write as _;
    let mut csv = String::from("seconds,process,pid,role,rss_mib,open_fds,threads\n");
    for s in samples {
        let _ = writeln!(
            csv,
            "{:.1},{},{},{},{:.2},{},{}",
            s.at.duration_since(started).as_secs_f64(),
            s.name,
            s.pid,
            s.role.as_str(),
            s.usage.rss_mib(),
            s.usage.open_fds,
            s.usage.threads
        );
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, csv)?;
    Ok(())
}

/// The samples [`write_samples`] wrote, their times counted from `started`: a run's samples
/// judged again (`holdfast-soak --judge`).
pub fn read_samples(csv: &str, started: Instant) -> Result<Vec<Sample>> {
    csv.lines()
        .enumerate()
        .skip(1)
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            let fields: Vec<&str> = line.split(',').collect();
            let parsed = match fields.as_slice() {
                [seconds, name, pid, role, rss_mib, open_fds, threads] => (|| {
                    Some(Sample {
                        name: (*name).to_owned(),
                        pid: pid.parse().ok()?,
                        role: Role::parse(role)?,
                        at: started + Duration::try_from_secs_f64(seconds.parse().ok()?).ok()?,
                        usage: Usage {
                            rss_kib: (rss_mib.parse::<f64>().ok()? * 1024.0).round() as u64,
                            open_fds: open_fds.parse().ok()?,
                            threads: threads.parse().ok()?,
                            ..Default::default()
                        },
                    })
                })(),
                _ => None,
            };
            parsed.ok_or_else(|| {
                anyhow::anyhow!(
                    "samples line {}: not seconds,process,pid,role,rss_mib,open_fds,threads: {line}",
                    n + 1
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_read_back_as_written() {
        let started = Instant::now();
        let sample = |name: &str, pid, role, secs, rss_kib| Sample {
            name: name.into(),
            pid,
            role,
            at: started + Duration::from_millis(secs),
            usage: Usage {
                rss_kib,
                open_fds: 21,
                threads: 4,
                ..Default::default()
            },
        };
        let samples = [
            sample("holdfast-webhook-a", 7, Role::Serving, 20_900, 44_780),
            sample("holdfast-controller-b", 9, Role::StandingBy, 35_100, 30_720),
        ];
        let path = std::env::temp_dir().join(format!("holdfast-samples-{}.csv", std::process::id()));
        write_samples(&path, &samples, started).unwrap();
        let csv = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let read = read_samples(&csv, started).unwrap();
        assert_eq!(read.len(), 2);
        for (read, written) in read.iter().zip(&samples) {
            assert_eq!(
                (&read.name, read.pid, read.role),
                (&written.name, written.pid, written.role)
            );
            assert_eq!(read.at, written.at);
            assert!(
                read.usage.rss_kib.abs_diff(written.usage.rss_kib) <= 5,
                "{read:?}"
            );
            assert_eq!((read.usage.open_fds, read.usage.threads), (21, 4));
        }
        let err = read_samples("header\n1.0,holdfast-webhook-a,7,dozing,1,2,3\n", started).unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn a_push_tried_again_keeps_its_position() {
        let mut history = History::default();
        let tag = history.add_tag("front/soak/config-00:live".into());
        assert_eq!(history.record(tag, "sha256:a".into()), 0);
        assert_eq!(history.record(tag, "sha256:b".into()), 1);
        // The push of b failed and is tried again: b is still the move it was.
        assert_eq!(history.record(tag, "sha256:b".into()), 1);
        assert_eq!(history.position(tag, "sha256:b"), Some(1));
        assert_eq!(history.record(tag, "sha256:c".into()), 2);
        assert_eq!(history.tag_of("front/soak/config-00:live"), Some(tag));
        assert_eq!(history.position(tag, "sha256:d"), None);
    }

    #[test]
    fn the_mirrors_copy_of_a_repository_is_under_the_upstream_hosts_name() {
        let mirrored = Mirrored::new("127.0.0.1:5001", "127.0.0.1:5000");
        assert_eq!(
            mirrored.repository_of("127.0.0.1:5000/soak/config-00").as_deref(),
            Some(format!(
                "127.0.0.1:5001/holdfast/{}/soak/config-00",
                holdfast_registry::mirror::host_component("127.0.0.1:5000")
            ))
            .as_deref()
        );
        assert_eq!(mirrored.repository_of("no-path"), None);
    }
}

//! The fault injector: one fault at a time, held, then recovered from (the component restarted
//! and ready again) before a quiet spell and the next. Each fault is logged with its start and
//! end; the [`Timeline`] of them is what the invariants excuse a client failure by (the API
//! server's own downtime) or wait out (a moved tag's pins follow within two refresh intervals of
//! the recovery).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use holdfast_certs::{
    CaOptions, ServingOptions,
    kube_store::{KubeCertStore, StoreConfig},
};
use holdfast_controller::leader::crd::ControllerLease;
use kube::Api;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
    sync::watch,
};
use tokio_util::sync::CancellationToken;

use super::replicas::{Component, Holdfast, LEASE, LEASE_DURATION};
use crate::{
    Env,
    control_plane::{ETCD, KUBE_APISERVER, SpareRegistry},
    installed::NAMESPACE,
    process::Stop,
};

/// The faults the injector knows, in the order it cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The upstream registry's process stopped (connections refused), then started again.
    RegistryStopped,
    /// The registry answering 503 to everything.
    RegistryErrors,
    /// The registry answering 429 with `Retry-After: 1` to everything.
    RegistryThrottling,
    /// The registry slow: every connection to it waits [`SLOW_REGISTRY_DELAY`] (past the
    /// resolver's request timeout) before it is passed through.
    RegistrySlow,
    /// The registry naming, for every tag, a digest it does not serve (a proxy's stale or
    /// corrupt mapping): the HEADs of tagged manifests answered with a made-up digest, held
    /// past one refresh round.
    RegistryWrongDigests,
    /// kube-apiserver stopped (SIGTERM) and started again.
    ApiserverRestarted,
    /// etcd SIGKILLed and started again.
    EtcdKilled,
    /// The leading controller's link to the API server hung (bytes held both ways) for longer
    /// than the lease, then resumed.
    LeaderLinkCut,
    /// A webhook replica SIGKILLed and started again: always the second, so that the first lives
    /// the whole run and its memory is judged over all of it.
    WebhookKilled,
    /// The leading controller SIGKILLed and started again.
    ControllerKilled,
    /// A new serving certificate written to the webhooks' Secret; both replicas must serve it.
    CertificateRotated,
    /// The mirror full: every write to it (an upload, a manifest) answered 507 Insufficient
    /// Storage, reads served; held until a copy meets it, and the hold after.
    MirrorFull,
    /// The mirror refusing writes (403 `DENIED`, as a registry in read-only mode or over its
    /// quota answers), reads served; held until a copy meets it, and the hold after.
    MirrorRefusingWrites,
}

impl Fault {
    pub const ALL: [Fault; 13] = [
        Fault::RegistryStopped,
        Fault::RegistryErrors,
        Fault::RegistryThrottling,
        Fault::RegistrySlow,
        Fault::RegistryWrongDigests,
        Fault::ApiserverRestarted,
        Fault::EtcdKilled,
        Fault::LeaderLinkCut,
        Fault::WebhookKilled,
        Fault::ControllerKilled,
        Fault::CertificateRotated,
        Fault::MirrorFull,
        Fault::MirrorRefusingWrites,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::RegistryStopped => "registry-stopped",
            Fault::RegistryErrors => "registry-503",
            Fault::RegistryThrottling => "registry-429",
            Fault::RegistrySlow => "registry-slow",
            Fault::RegistryWrongDigests => "registry-wrong-digests",
            Fault::ApiserverRestarted => "apiserver-restarted",
            Fault::EtcdKilled => "etcd-killed",
            Fault::LeaderLinkCut => "leader-link-cut",
            Fault::WebhookKilled => "webhook-killed",
            Fault::ControllerKilled => "controller-killed",
            Fault::CertificateRotated => "certificate-rotated",
            Fault::MirrorFull => "mirror-full",
            Fault::MirrorRefusingWrites => "mirror-refusing-writes",
        }
    }

    /// Whether the API server itself is down during it: a client's failure then is its own,
    /// not an admission's.
    pub fn apiserver_down(self) -> bool {
        matches!(self, Fault::ApiserverRestarted | Fault::EtcdKilled)
    }

    /// Whether a webhook replica dies during it: the admissions in flight on its connections
    /// are let through unpinned (the shipped `failurePolicy: Ignore`), for the controller to pin.
    pub fn webhook_down(self) -> bool {
        matches!(self, Fault::WebhookKilled)
    }
}

/// One fault's span: from its injection to its recovery (`end`: none while it lasts).
#[derive(Debug, Clone)]
pub struct Window {
    pub fault: Fault,
    pub start: Instant,
    pub end: Option<Instant>,
    /// What was done, and to which replica.
    pub detail: String,
}

/// A leader's link to the API server that hung and resumed ([`Fault::LeaderLinkCut`]): the
/// replica, and when the relay was told to deliver what it held (wall clock, as the audit log).
#[derive(Debug, Clone)]
pub struct Cut {
    pub replica: String,
    pub resumed: k8s_openapi::jiff::Timestamp,
}

/// Every fault injected so far, shared with the invariants; and the links cut.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    windows: Arc<Mutex<Vec<Window>>>,
    cuts: Arc<Mutex<Vec<Cut>>>,
}

impl Timeline {
    fn windows_mut(&self) -> std::sync::MutexGuard<'_, Vec<Window>> {
        // A panicking holder cannot leave a half-written window: each write is one push or field.
        self.windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cuts_mut(&self) -> std::sync::MutexGuard<'_, Vec<Cut>> {
        self.cuts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every leader's link cut so far.
    pub fn cuts(&self) -> Vec<Cut> {
        self.cuts_mut().clone()
    }

    pub fn windows(&self) -> Vec<Window> {
        self.windows_mut().clone()
    }

    fn begin(&self, fault: Fault) -> usize {
        let mut windows = self.windows_mut();
        windows.push(Window {
            fault,
            start: Instant::now(),
            end: None,
            detail: String::new(),
        });
        windows.len() - 1
    }

    fn end(&self, index: usize, detail: String) -> Window {
        let mut windows = self.windows_mut();
        let window = &mut windows[index];
        window.end = Some(Instant::now());
        window.detail = detail;
        window.clone()
    }

    /// Whether `[from, to]` meets a window of a fault `which` selects, each window reaching
    /// `grace` past its end (clients reconnect, caches resync); an open window reaches now.
    pub fn overlaps(
        &self,
        from: Instant,
        to: Instant,
        grace: Duration,
        which: impl Fn(Fault) -> bool,
    ) -> bool {
        self.windows_mut().iter().filter(|w| which(w.fault)).any(|w| {
            let end = w.end.unwrap_or_else(Instant::now) + grace;
            w.start <= to && from <= end
        })
    }

    /// The last recovery of a fault that lasted into `[since, now]`; now while one is still
    /// injected; none when no fault touched that span.
    pub fn last_recovery_since(&self, since: Instant) -> Option<Instant> {
        self.windows_mut()
            .iter()
            .map(|w| w.end.unwrap_or_else(Instant::now))
            .filter(|end| *end >= since)
            .max()
    }
}

/// How long a slow registry's connections wait: past the resolver's 3 s request timeout.
pub const SLOW_REGISTRY_DELAY: Duration = Duration::from_secs(5);

/// What the registry front answers: the registry itself, or an error of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Pass,
    /// This status to every request, `Retry-After: 1` with it, then the connection closed.
    Status(u16),
    /// The registry, after [`SLOW_REGISTRY_DELAY`].
    Slow,
    /// A HEAD of a tagged manifest answered with a digest nothing serves ([`unserved_digest`]);
    /// anything else passed through.
    WrongDigest,
    /// A write (`POST`, `PUT`, `PATCH`, `DELETE`) answered with this status and a registry error
    /// body; a read passed through on a connection closed after it, so that the client's next
    /// request comes on a new one and is judged too.
    RefuseWrites(u16),
}

/// The digest the front names for `path` while it answers [`Answer::WrongDigest`]: no manifest
/// has it.
pub fn unserved_digest(path: &str) -> String {
    use sha2::Digest as _;
    format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(format!("holdfast-soak-unserved {path}")))
    )
}

/// A front before the upstream registry that the soak's objects name, so that the registry can
/// answer errors without being changed: passes connections through, or answers every request
/// with a status of its own. A change of answer closes every connection open before it
/// (clients keep registry connections alive, and must meet the new answer at once).
pub struct RegistryFront {
    /// `host:port` the objects name, and holdfast reaches over plain HTTP.
    pub addr: String,
    answer: watch::Sender<Answer>,
    /// Requests answered with the fault itself so far: digests named that nothing serves
    /// ([`Answer::WrongDigest`]), writes refused ([`Answer::RefuseWrites`]).
    faulted: watch::Sender<usize>,
    stop: CancellationToken,
}

impl RegistryFront {
    /// A front listening on `host` (loopback, or the real node's address) before `upstream`.
    pub async fn start(host: &str, upstream: &str) -> Result<Self> {
        let listener = TcpListener::bind((host, 0)).await?;
        let addr = listener.local_addr()?.to_string();
        let upstream = upstream.to_string();
        let answer = watch::Sender::new(Answer::Pass);
        let stop = CancellationToken::new();
        let faulted = watch::Sender::new(0);
        let (answers, accepting, told) = (answer.clone(), stop.clone(), faulted.clone());
        tokio::spawn(accepting.clone().run_until_cancelled_owned(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let (upstream, mut changed) = (upstream.clone(), answers.subscribe());
                let now = *changed.borrow_and_update();
                let told = told.clone();
                tokio::spawn(accepting.clone().run_until_cancelled_owned(async move {
                    tokio::select! {
                        _ = serve(inbound, &upstream, now, &told) => {}
                        _ = changed.changed() => {}
                    }
                }));
            }
        }));
        Ok(Self {
            addr,
            answer,
            faulted,
            stop,
        })
    }

    /// How many requests it answered with the fault itself so far (a made-up digest, a refused
    /// write): a fault no request met proves nothing.
    pub fn faulted(&self) -> usize {
        *self.faulted.borrow()
    }

    /// Whether a request meets the fault (the count passes `after`) within `limit`.
    pub async fn until_faulted(&self, after: usize, limit: Duration) -> bool {
        let mut count = self.faulted.subscribe();
        tokio::time::timeout(limit, count.wait_for(|n| *n > after))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }

    /// From now on, `answer` to everything.
    pub fn answer(&self, answer: Answer) {
        self.answer.send_replace(answer);
    }
}

impl Drop for RegistryFront {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// One connection to the front, answered as `answer` says.
async fn serve(
    mut inbound: tokio::net::TcpStream,
    upstream: &str,
    answer: Answer,
    faulted: &watch::Sender<usize>,
) {
    match answer {
        Answer::Pass => pass(inbound, upstream, &[]).await,
        Answer::Slow => {
            tokio::time::sleep(SLOW_REGISTRY_DELAY).await;
            pass(inbound, upstream, &[]).await;
        }
        Answer::WrongDigest => {
            let Some(head) = request_head(&mut inbound).await else {
                return;
            };
            let line = String::from_utf8_lossy(&head);
            let mut words = line.split_whitespace();
            let (method, path) = (words.next(), words.next().unwrap_or_default());
            let tagged = path
                .rsplit_once("/manifests/")
                .is_some_and(|(_, reference)| !reference.starts_with("sha256:"));
            if method != Some("HEAD") || !tagged {
                // What follows on this connection passes through unchanged too.
                return pass(inbound, upstream, &head).await;
            }
            faulted.send_modify(|n| *n += 1);
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.index.v1+json\r\nDocker-Content-Digest: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                unserved_digest(path)
            );
            reply(inbound, &response).await;
        }
        Answer::RefuseWrites(code) => {
            let Some(head) = request_head(&mut inbound).await else {
                return;
            };
            let method = head.split(|b| *b == b' ').next().unwrap_or_default();
            if !matches!(method, b"POST" | b"PUT" | b"PATCH" | b"DELETE") {
                return pass(inbound, upstream, &with_connection_close(&head)).await;
            }
            faulted.send_modify(|n| *n += 1);
            let (reason, code_word, message) = match code {
                507 => ("Insufficient Storage", "UNKNOWN", "no space left on the storage"),
                _ => ("Forbidden", "DENIED", "the registry is read-only"),
            };
            let body = format!(r#"{{"errors":[{{"code":"{code_word}","message":"{message}"}}]}}"#);
            let response = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            reply(inbound, &response).await;
        }
        Answer::Status(code) => {
            // The request's head, so that the client reads an answer, not a reset.
            if request_head(&mut inbound).await.is_none() {
                return;
            }
            let reason = match code {
                429 => "Too Many Requests",
                503 => "Service Unavailable",
                _ => "Error",
            };
            let response = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
            );
            reply(inbound, &response).await;
        }
    }
}

/// The front's own answer `response` on the connection, which it then closes (a client that
/// went away meanwhile is no matter).
async fn reply(mut inbound: tokio::net::TcpStream, response: &str) {
    let _ = inbound.write_all(response.as_bytes()).await;
    let _ = inbound.shutdown().await;
}

/// The connection passed through to the registry, `read` (bytes already read from the client)
/// first.
async fn pass(mut inbound: tokio::net::TcpStream, upstream: &str, read: &[u8]) {
    match tokio::net::TcpStream::connect(upstream).await {
        Ok(mut outbound) => {
            if outbound.write_all(read).await.is_ok() {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        }
        // A stopped registry: the client's connection is closed unanswered, as refused.
        Err(error) => tracing::debug!(%error, "registry front: upstream refused"),
    }
}

/// `head` (a request's head, and what of its body was read with it) asking the server to close
/// the connection after its answer: its own `Connection` headers dropped, `Connection: close`
/// added.
fn with_connection_close(head: &[u8]) -> Vec<u8> {
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(head.len());
    let mut out = Vec::with_capacity(head.len() + 19);
    for line in head[..end].split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if !line.to_ascii_lowercase().starts_with(b"connection:") {
            out.extend_from_slice(line);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(head.get(end + 4..).unwrap_or_default());
    out
}

/// The first request's head (through its blank line; a GET or HEAD has no body), or none if the
/// client sends none within 5 s or past 64 KiB.
async fn request_head(inbound: &mut tokio::net::TcpStream) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() >= 64 * 1024 {
            return None;
        }
        match tokio::time::timeout(Duration::from_secs(5), inbound.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => head.extend_from_slice(&buf[..n]),
            _ => return None,
        }
    }
    Some(head)
}

/// What the injector needs to reach: the environment's processes, the upstream registry and its
/// front, holdfast's replicas.
pub struct Injector {
    pub env: Arc<tokio::sync::Mutex<Env>>,
    /// Shared with the soak, which needs it running after the last fault (the last moves).
    pub registry: Arc<tokio::sync::Mutex<SpareRegistry>>,
    pub front: Arc<RegistryFront>,
    /// The front before the mirror registry, which holdfast copies into.
    pub mirror: Arc<RegistryFront>,
    pub holdfast: Arc<Holdfast>,
    pub client: kube::Client,
    pub timeline: Timeline,
    /// How long a fault is held before recovery begins.
    pub hold: Duration,
    /// The controllers' refresh interval.
    pub refresh: Duration,
    /// The quiet spell before each fault.
    pub quiet: Duration,
    /// The soak's start, which logged times count from.
    pub started: Instant,
}

impl Injector {
    /// Cycles through [`Fault::ALL`] until `deadline`, and at least once through all of them;
    /// returns how many faults were injected. A recovery that fails (a component that does not
    /// come back) ends the soak with its error.
    pub async fn run(mut self, deadline: Instant) -> Result<usize> {
        let mut injected = 0;
        while injected < Fault::ALL.len() || Instant::now() < deadline {
            let fault = Fault::ALL[injected % Fault::ALL.len()];
            tokio::time::sleep(self.quiet).await;
            let index = self.timeline.begin(fault);
            let detail = self
                .inject(fault)
                .await
                .with_context(|| format!("fault {}", fault.name()))?;
            let window = self.timeline.end(index, detail);
            let at = |t: Instant| t.duration_since(self.started).as_secs_f64();
            eprintln!(
                "soak: fault {} start=+{:.1}s end=+{:.1}s ({})",
                fault.name(),
                at(window.start),
                at(window.end.unwrap_or(window.start)),
                window.detail
            );
            injected += 1;
        }
        Ok(injected)
    }

    /// Injects `fault`, holds it, recovers; returns what it did.
    async fn inject(&mut self, fault: Fault) -> Result<String> {
        match fault {
            Fault::RegistryStopped => {
                let mut registry = self.registry.lock().await;
                registry.stop();
                tokio::time::sleep(self.hold).await;
                registry.start().await?;
                Ok(format!(
                    "upstream registry stopped for {:?}, started again",
                    self.hold
                ))
            }
            Fault::RegistryErrors => self.registry_answers(503).await,
            Fault::RegistryThrottling => self.registry_answers(429).await,
            Fault::RegistrySlow => {
                self.front.answer(Answer::Slow);
                tokio::time::sleep(self.hold).await;
                self.front.answer(Answer::Pass);
                Ok(format!(
                    "registry answered after {SLOW_REGISTRY_DELAY:?} for {:?}",
                    self.hold
                ))
            }
            Fault::RegistryWrongDigests => {
                // Past one refresh round of a leader's, so that the controller's checks meet it.
                self.leader().await?;
                let held = self.refresh + self.hold;
                let before = self.front.faulted();
                self.front.answer(Answer::WrongDigest);
                tokio::time::sleep(held).await;
                self.front.answer(Answer::Pass);
                let lies = self.front.faulted() - before;
                // A fault no resolution met would prove nothing: a refresh round runs within it.
                anyhow::ensure!(
                    lies > 0,
                    "no tag was resolved through the registry in {held:?} of wrong digests (the refresh interval is {:?})",
                    self.refresh
                );
                Ok(format!(
                    "registry named unserved digests for {held:?} ({lies} HEADs answered so)"
                ))
            }
            Fault::ApiserverRestarted => {
                let mut env = self.env.lock().await;
                env.respawn_process(KUBE_APISERVER, Stop::Term(Duration::from_secs(10)))?;
                env.until_apiserver_ready().await?;
                Ok("kube-apiserver stopped (SIGTERM), started again, ready".into())
            }
            Fault::EtcdKilled => {
                let mut env = self.env.lock().await;
                env.respawn_process(ETCD, Stop::Kill)?;
                env.until_apiserver_ready().await?;
                Ok("etcd SIGKILLed, started again; kube-apiserver ready".into())
            }
            Fault::LeaderLinkCut => {
                let leader = self.leader().await?;
                let cut_for = LEASE_DURATION + self.hold;
                self.holdfast.hang(&leader).await?;
                tokio::time::sleep(cut_for).await;
                self.timeline.cuts_mut().push(Cut {
                    replica: leader.clone(),
                    resumed: k8s_openapi::jiff::Timestamp::now(),
                });
                self.holdfast.resume(&leader).await?;
                Ok(format!(
                    "{leader}'s link to the API server hung for {cut_for:?}, resumed"
                ))
            }
            Fault::WebhookKilled => {
                // Always the second: the first lives the whole run, its memory judged over it.
                let name = self
                    .holdfast
                    .webhooks()
                    .nth(1)
                    .context("no second webhook replica")?
                    .name
                    .clone();
                self.holdfast.kill(&self.env, &name).await?;
                Ok(format!("{name} SIGKILLed, started again, ready"))
            }
            Fault::ControllerKilled => {
                let leader = self.leader().await?;
                self.holdfast.kill(&self.env, &leader).await?;
                Ok(format!("{leader} (leading) SIGKILLed, started again, ready"))
            }
            Fault::CertificateRotated => self.rotate_certificate().await,
            Fault::MirrorFull => self.mirror_refuses_writes(507).await,
            Fault::MirrorRefusingWrites => self.mirror_refuses_writes(403).await,
        }
    }

    /// The mirror answering `code` to every write until a copy meets it (a tag moved, the
    /// controller's refresh pinned the new digest and copies it: at most four refresh
    /// intervals), then for the hold; fails if no write met it.
    async fn mirror_refuses_writes(&self, code: u16) -> Result<String> {
        // The window counts from a leader's term: only a leader's refresh copies.
        let leader = self.leader().await?;
        let (before, started) = (self.mirror.faulted(), Instant::now());
        self.mirror.answer(Answer::RefuseWrites(code));
        let met = self.mirror.until_faulted(before, self.refresh * 4).await;
        if met {
            tokio::time::sleep(self.hold).await;
        }
        self.mirror.answer(Answer::Pass);
        let (held, refused) = (started.elapsed(), self.mirror.faulted() - before);
        anyhow::ensure!(
            met,
            "no copy wrote to the mirror in {held:?} of refusing writes (the refresh interval is {:?})",
            self.refresh
        );
        Ok(format!(
            "mirror answered {code} to writes for {held:.1?} ({refused} refused; {leader} leading)"
        ))
    }

    async fn registry_answers(&self, code: u16) -> Result<String> {
        self.front.answer(Answer::Status(code));
        tokio::time::sleep(self.hold).await;
        self.front.answer(Answer::Pass);
        Ok(format!("registry answered {code} for {:?}", self.hold))
    }

    /// The controller replica leading now: the Lease's holder, which says so itself (its
    /// `holdfast_controller_leader` gauge) and is ready. Waited for, up to the kubelet's longest
    /// restart back-off: after a kill or an API server restart a term may not have begun yet,
    /// and a fault that needs a leader (a refresh round, a copy) proves nothing without one.
    async fn leader(&self) -> Result<String> {
        let leases = Api::<ControllerLease>::namespaced(self.client.clone(), NAMESPACE);
        let deadline = Instant::now() + Duration::from_secs(330);
        loop {
            let holder = leases
                .get(LEASE)
                .await
                .context("reading the controllers' ControllerLease")?
                .spec
                .holder_identity;
            let replica = holder.as_deref().and_then(|h| self.holdfast.replica(h).ok());
            if let Some(replica) = replica.filter(|r| r.component == Component::Controller)
                && super::invariants::leading(&replica.admin).await == Some(true)
                && replica.ready().await.is_ok()
            {
                return Ok(replica.name.clone());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "no controller replica led 330 s on (the Lease's holder: {holder:?})"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A new serving certificate in the Secret the webhooks serve from (as any replica's renewal
    /// writes it), then every replica serving it, seen by a client that trusts only the
    /// published caBundle.
    async fn rotate_certificate(&self) -> Result<String> {
        let config = StoreConfig {
            namespace: NAMESPACE.into(),
            // The webhook's defaults for its Secret and Service.
            secret: "holdfast-webhook-tls".into(),
            ca: CaOptions::default(),
            serving: ServingOptions::for_service("holdfast-webhook", NAMESPACE)
                .with_ip(std::net::Ipv4Addr::LOCALHOST.into()),
            renew_at_fraction: holdfast_certs::DEFAULT_RENEW_AT_FRACTION,
            ca_overlap: Duration::from_secs(3600),
            mutating_webhook_configurations: vec!["holdfast".into()],
            validating_webhook_configurations: vec!["holdfast".into()],
        };
        let store = KubeCertStore::bootstrap(self.client.clone(), config).await?;
        let first = self
            .holdfast
            .webhooks()
            .next()
            .context("no webhook replica")?
            .addr
            .as_deref()
            .context("a webhook without an address")?;
        let before =
            crate::webhook::served_fingerprint(first, SERVICE_NAME, &store.ca_bundle().await?).await?;
        store.rotate_leaf().await?;
        let (rotated, bundle) = (store.resolver().fingerprint(), store.ca_bundle().await?);
        anyhow::ensure!(
            rotated != before,
            "the rotation left the certificate {before} in place"
        );
        let started = Instant::now();
        for webhook in self.holdfast.webhooks() {
            let addr = webhook.addr.as_deref().context("a webhook without an address")?;
            // Nothing to watch: the certificate a process serves is seen only by connecting.
            loop {
                let served = crate::webhook::served_fingerprint(addr, SERVICE_NAME, &bundle).await;
                if served.as_deref().ok() == Some(rotated.as_str()) {
                    break;
                }
                anyhow::ensure!(
                    started.elapsed() < Duration::from_secs(60),
                    "{} still serves {served:?}, not the rotated certificate {rotated}, 60 s on",
                    webhook.name
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        Ok(format!(
            "serving certificate rotated; both replicas served it after {:.1} s",
            started.elapsed().as_secs_f64()
        ))
    }
}

/// The webhook Service's name, which every serving certificate names (the replicas' own and the
/// rotation's), on loopback or in a pod alike.
const SERVICE_NAME: &str = "holdfast-webhook.holdfast-system.svc";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_read_asks_for_the_connection_to_close() {
        let head = b"HEAD /v2/r/blobs/sha256:ab HTTP/1.1\r\nHost: m\r\nconnection: keep-alive\r\nAccept: */*\r\n\r\n";
        assert_eq!(
            with_connection_close(head),
            b"HEAD /v2/r/blobs/sha256:ab HTTP/1.1\r\nHost: m\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        // What of a body was read with the head follows it unchanged.
        let with_body = b"PUT /x HTTP/1.1\r\nContent-Length: 2\r\n\r\nab";
        assert_eq!(
            with_connection_close(with_body),
            b"PUT /x HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab"
        );
    }
}

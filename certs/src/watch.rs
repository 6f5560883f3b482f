//! File mode (Mode A): serve a certificate that something else writes to disk, typically
//! cert-manager through a mounted `kubernetes.io/tls` Secret, and pick up renewals live.
//!
//! Why poll and hash instead of inotify: the kubelet updates a Secret volume by writing a new
//! timestamped directory and atomically re-pointing the `..data` symlink; `tls.crt` and
//! `tls.key` are symlinks through `..data`. The files we opened are never written, they are
//! replaced, so a per-file inotify watch sees nothing (or fires once and dies with the old
//! inode). Reading both files every few seconds and comparing a SHA-256 of their contents is
//! immune to how the update happens, costs two small reads, and also notices a cert and key
//! that are briefly out of step (the pair is only swapped in once it loads as a matching pair).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::{sync::watch, task::JoinHandle, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::{CertError, ServingCert, SwappableCert};

/// Default poll interval. The kubelet itself syncs Secret volumes only every minute or so and
/// cert-manager renews weeks before expiry, so 30 s adds no meaningful delay.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(30);

/// Reads a certificate chain and key from files and parses them (validity from the leaf).
/// Use it for the initial load before starting [`FileWatcher`].
pub async fn load_pair(cert_path: &Path, key_path: &Path) -> Result<ServingCert, CertError> {
    let (cert, key) = read_pair(cert_path, key_path).await?;
    parse_pair(&cert, &key)
}

/// What the watcher has seen so far; observable through [`FileWatcher::status`] (for tests,
/// a readiness check or metrics). Never contains key material.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchStatus {
    /// Completed polls.
    pub polls: u64,
    /// Times changed file contents were loaded and stored into the resolver.
    pub reloads: u64,
    /// Times a changed pair failed to load (the previous certificate kept being served).
    pub rejected: u64,
    /// Polls where the files could not be read.
    pub read_failures: u64,
    /// The last load or read error, cleared by the next successful reload.
    pub last_error: Option<String>,
    /// Fingerprint of the last pair this watcher stored.
    pub fingerprint: Option<String>,
}

/// What one poll did.
#[derive(Debug)]
pub enum PollOutcome {
    /// Contents are as last seen (loaded or rejected before): nothing to do.
    Unchanged,
    /// Changed file contents loaded and are now served (on the first poll this is usually the
    /// certificate already being served, re-stored).
    Reloaded {
        /// SHA-256 of the new leaf.
        fingerprint: String,
    },
    /// The contents changed but do not load; the old certificate is still served.
    Rejected(CertError),
    /// A file could not be read; retried on the next poll.
    ReadFailed(CertError),
}

/// Polls a certificate file and a key file and swaps changed pairs into a [`SwappableCert`].
pub struct FileWatcher {
    cert_path: PathBuf,
    key_path: PathBuf,
    interval: Duration,
    /// Hash of the contents last acted on (loaded *or* rejected), so a bad pair is reported
    /// once rather than on every poll, and retried as soon as either file changes.
    last_hash: Option<[u8; 32]>,
    /// Whether the previous poll failed to read, to warn once per outage, not every poll.
    read_failing: bool,
    status: watch::Sender<WatchStatus>,
}

impl FileWatcher {
    /// Watches `cert_path` and `key_path` every [`DEFAULT_POLL_INTERVAL`].
    pub fn new(cert_path: impl Into<PathBuf>, key_path: impl Into<PathBuf>) -> Self {
        Self {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            interval: DEFAULT_POLL_INTERVAL,
            last_hash: None,
            read_failing: false,
            status: watch::Sender::new(WatchStatus::default()),
        }
    }

    /// Sets the poll interval (tests use milliseconds). Zero is raised to 1 ms.
    #[must_use]
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// A receiver of the watcher's [`WatchStatus`], updated after every poll.
    pub fn status(&self) -> watch::Receiver<WatchStatus> {
        self.status.subscribe()
    }

    /// Polls once: reads both files, and if their combined hash changed, loads the pair and
    /// stores it into `resolver`. Failures keep the current certificate and log a warning.
    pub async fn poll_once(&mut self, resolver: &SwappableCert) -> PollOutcome {
        let outcome = self.poll_inner(resolver).await;
        self.status.send_modify(|s| {
            s.polls += 1;
            match &outcome {
                PollOutcome::Unchanged => {}
                PollOutcome::Reloaded { fingerprint } => {
                    s.reloads += 1;
                    s.last_error = None;
                    s.fingerprint = Some(fingerprint.clone());
                }
                PollOutcome::Rejected(e) => {
                    s.rejected += 1;
                    s.last_error = Some(e.to_string());
                }
                PollOutcome::ReadFailed(e) => {
                    s.read_failures += 1;
                    s.last_error = Some(e.to_string());
                }
            }
        });
        outcome
    }

    async fn poll_inner(&mut self, resolver: &SwappableCert) -> PollOutcome {
        let (cert, key) = match read_pair(&self.cert_path, &self.key_path).await {
            Ok(pair) => pair,
            Err(error) => {
                if self.read_failing {
                    tracing::debug!(cert_path = %self.cert_path.display(), key_path = %self.key_path.display(),
                        %error, "certificate files still unreadable");
                } else {
                    tracing::warn!(cert_path = %self.cert_path.display(), key_path = %self.key_path.display(),
                        %error, "cannot read certificate files; keeping the current certificate");
                }
                self.read_failing = true;
                return PollOutcome::ReadFailed(error);
            }
        };
        self.read_failing = false;
        let hash = pair_hash(&cert, &key);
        if self.last_hash == Some(hash) {
            return PollOutcome::Unchanged;
        }
        self.last_hash = Some(hash);

        let previous = resolver.fingerprint();
        let loaded = parse_pair(&cert, &key).and_then(|serving| {
            if serving.validity().is_expired(OffsetDateTime::now_utc()) {
                return Err(CertError::Expired {
                    not_after: serving.not_after,
                });
            }
            resolver.store(&serving)?;
            Ok(serving)
        });
        match loaded {
            Ok(serving) => {
                let fingerprint = resolver.fingerprint();
                if fingerprint == previous {
                    // Typically the first poll, re-reading what `load_pair` loaded at startup.
                    tracing::debug!(cert_path = %self.cert_path.display(), %fingerprint,
                        "certificate files read; same certificate as served");
                } else {
                    tracing::info!(cert_path = %self.cert_path.display(), %fingerprint,
                        previous_fingerprint = %previous, not_after = %serving.not_after,
                        "serving certificate reloaded from files");
                }
                PollOutcome::Reloaded { fingerprint }
            }
            Err(error) => {
                tracing::warn!(cert_path = %self.cert_path.display(), key_path = %self.key_path.display(),
                    %error, served_fingerprint = %resolver.fingerprint(),
                    "changed certificate files do not load; keeping the current certificate");
                PollOutcome::Rejected(error)
            }
        }
    }

    /// Polls every interval until `cancel` fires. The first poll runs immediately, so a pair
    /// that changed between the initial [`load_pair`] and the start of the task is not missed.
    pub async fn run(mut self, resolver: Arc<SwappableCert>, cancel: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        // After a stall (suspended node), poll once and continue, rather than a burst.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                _ = ticker.tick() => {
                    self.poll_once(&resolver).await;
                }
            }
        }
        tracing::debug!(cert_path = %self.cert_path.display(), "certificate file watcher stopped");
    }

    /// Spawns [`Self::run`] on the current tokio runtime; returns the task and a status receiver.
    pub fn spawn(
        self,
        resolver: Arc<SwappableCert>,
        cancel: CancellationToken,
    ) -> (JoinHandle<()>, watch::Receiver<WatchStatus>) {
        let status = self.status();
        (tokio::spawn(self.run(resolver, cancel)), status)
    }
}

/// Reads the cert, the key, then the cert again, retrying (a few times) while the cert changed
/// in between: a `..data` swap landing between the two reads would otherwise pair an old cert
/// with a new key and produce a spurious "does not load" warning.
async fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    const ATTEMPTS: usize = 3;
    let read = |path: &Path| {
        let path = path.to_path_buf();
        async move {
            tokio::fs::read(&path)
                .await
                .map_err(|source| CertError::Io { path, source })
        }
    };
    let mut cert = read(cert_path).await?;
    let mut key = read(key_path).await?;
    for _ in 1..ATTEMPTS {
        let again = read(cert_path).await?;
        if again == cert {
            break;
        }
        cert = again;
        key = read(key_path).await?;
    }
    Ok((cert, key))
}

fn parse_pair(cert: &[u8], key: &[u8]) -> Result<ServingCert, CertError> {
    let cert = std::str::from_utf8(cert).map_err(|_| CertError::NotUtf8(crate::SECRET_TLS_CERT))?;
    let key = std::str::from_utf8(key).map_err(|_| CertError::NotUtf8(crate::SECRET_TLS_KEY))?;
    ServingCert::from_pem(cert, key)
}

/// One hash over both files; the cert length is included so that moving bytes from the end of
/// one file to the start of the other changes the hash.
fn pair_hash(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((cert.len() as u64).to_be_bytes());
    h.update(cert);
    h.update(key);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CaOptions, CertificateAuthority, ServingOptions};

    fn write_pair(dir: &Path, cert: &ServingCert) -> (PathBuf, PathBuf) {
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, &cert.cert_pem).unwrap();
        std::fs::write(&k, &cert.key_pem).unwrap();
        (c, k)
    }

    #[tokio::test]
    async fn poll_once_reloads_only_on_change_and_rejects_bad_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let opts = ServingOptions::for_service("s", "n");
        let a = ca.issue_serving(&opts).unwrap();
        let b = ca.issue_serving(&opts).unwrap();
        let (c, k) = write_pair(dir.path(), &a);
        let resolver = SwappableCert::new(&load_pair(&c, &k).await.unwrap()).unwrap();
        let mut w = FileWatcher::new(&c, &k);

        // First poll acts (same pair: a harmless re-store), then nothing changes.
        assert!(matches!(
            w.poll_once(&resolver).await,
            PollOutcome::Reloaded { .. }
        ));
        assert!(matches!(w.poll_once(&resolver).await, PollOutcome::Unchanged));

        // Only the cert rotated so far: a mismatched pair is rejected, A stays served.
        std::fs::write(&c, &b.cert_pem).unwrap();
        assert!(matches!(
            w.poll_once(&resolver).await,
            PollOutcome::Rejected(CertError::KeyMismatch { .. })
        ));
        assert_eq!(resolver.fingerprint(), a.fingerprint().unwrap());
        // The same bad contents are not re-reported.
        assert!(matches!(w.poll_once(&resolver).await, PollOutcome::Unchanged));
        // The key arrives: B is served.
        std::fs::write(&k, &b.key_pem).unwrap();
        assert!(matches!(
            w.poll_once(&resolver).await,
            PollOutcome::Reloaded { .. }
        ));
        assert_eq!(resolver.fingerprint(), b.fingerprint().unwrap());

        // A missing file is a read failure, retried; B stays served.
        std::fs::remove_file(&k).unwrap();
        assert!(matches!(
            w.poll_once(&resolver).await,
            PollOutcome::ReadFailed(CertError::Io { .. })
        ));
        assert!(matches!(w.poll_once(&resolver).await, PollOutcome::ReadFailed(_)));
        assert_eq!(resolver.fingerprint(), b.fingerprint().unwrap());

        let status = w.status().borrow().clone();
        assert_eq!(
            (
                status.polls,
                status.reloads,
                status.rejected,
                status.read_failures
            ),
            (7, 2, 1, 2)
        );
        assert_eq!(status.fingerprint, Some(b.fingerprint().unwrap()));
        assert!(status.last_error.is_some());
        assert!(!status.last_error.unwrap_or_default().contains("PRIVATE KEY"));
    }

    #[tokio::test]
    async fn an_expired_pair_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let now = OffsetDateTime::now_utc();
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let opts = ServingOptions::for_service("s", "n");
        let good = ca.issue_serving(&opts).unwrap();
        let old = ca
            .issue_serving_at(
                &opts.clone().with_validity(time::Duration::days(1)),
                now - time::Duration::days(2),
            )
            .unwrap();
        let (c, k) = write_pair(dir.path(), &old);
        let resolver = SwappableCert::new(&good).unwrap();
        let mut w = FileWatcher::new(&c, &k);
        assert!(matches!(
            w.poll_once(&resolver).await,
            PollOutcome::Rejected(CertError::Expired { .. })
        ));
        assert_eq!(resolver.fingerprint(), good.fingerprint().unwrap());
    }

    #[test]
    fn pair_hash_separates_the_files() {
        assert_ne!(pair_hash(b"ab", b"c"), pair_hash(b"a", b"bc"));
        assert_eq!(pair_hash(b"a", b"b"), pair_hash(b"a", b"b"));
    }
}

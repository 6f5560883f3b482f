//! `--registry-ca-file`: the CA certificates a private registry's certificate chains to (an
//! on-prem Harbor behind a corporate CA), trusted besides the system's roots. Loaded at start (a
//! bad file stops the process with a message naming it) and re-read when its contents change:
//! the kubelet replaces a mounted ConfigMap or Secret by swapping a symlink, so the file is
//! polled and compared, as the serving certificate's file watcher does
//! (`holdfast_certs::FileWatcher`). A changed file that does not load is reported once and
//! changes nothing; the roots before it stay trusted.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use holdfast_registry::{ExtraRoots, ResolverBuildError};
use tokio::{task::JoinHandle, time::MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// How often the file is read (the kubelet syncs volumes about every minute).
pub const POLL_INTERVAL: Duration = Duration::from_secs(30);

/// Why the CA file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum RegistryCaError {
    #[error("--registry-ca-file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--registry-ca-file {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: ResolverBuildError,
    },
}

/// The roots in `path`, and the file's contents they came from.
pub fn load(path: &Path) -> Result<(ExtraRoots, Vec<u8>), RegistryCaError> {
    let contents = read(path)?;
    let roots = ExtraRoots::from_pem(&[&contents]).map_err(|source| RegistryCaError::Parse {
        path: path.to_owned(),
        source,
    })?;
    Ok((roots, contents))
}

fn read(path: &Path) -> Result<Vec<u8>, RegistryCaError> {
    std::fs::read(path).map_err(|source| RegistryCaError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Re-reads `path` every `interval` until `cancel`, replacing `roots` when its contents change
/// from `loaded` (what [`load`] read).
pub fn watch(
    path: PathBuf,
    roots: ExtraRoots,
    loaded: Vec<u8>,
    interval: Duration,
    cancel: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = loaded;
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = ticks.tick() => {}
            }
            poll(&path, &roots, &mut last);
        }
    })
}

/// One read: replaces `roots` when the contents differ from `last` and load; a changed file
/// that fails is reported once (`last` takes its contents either way).
fn poll(path: &Path, roots: &ExtraRoots, last: &mut Vec<u8>) {
    let contents = match read(path) {
        Ok(contents) => contents,
        Err(error) => {
            tracing::warn!(%error, "registry CA bundle unreadable; the certificates loaded before stay trusted");
            return;
        }
    };
    if contents == *last {
        return;
    }
    match roots.replace(&[&contents]) {
        Ok(certificates) => tracing::info!(
            path = %path.display(),
            certificates,
            "registry CA bundle reloaded"
        ),
        Err(source) => {
            let error = RegistryCaError::Parse {
                path: path.to_owned(),
                source,
            };
            tracing::warn!(%error, "registry CA bundle changed but does not load; the certificates loaded before stay trusted");
        }
    }
    *last = contents;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate in PEM (the resolver's parser checks the DER, not the chain).
    fn certificate() -> Vec<u8> {
        let cert = rcgen::generate_simple_self_signed(vec!["registry.corp".to_owned()]).unwrap();
        cert.cert.pem().into_bytes()
    }

    #[test]
    fn a_missing_or_empty_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("ca.crt");
        let err = load(&missing).unwrap_err();
        assert!(matches!(err, RegistryCaError::Read { .. }));
        assert!(err.to_string().contains("ca.crt"), "{err}");
        std::fs::write(&missing, "").unwrap();
        assert!(matches!(load(&missing), Err(RegistryCaError::Parse { .. })));
    }

    #[test]
    fn a_changed_file_replaces_the_roots_and_a_broken_one_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, certificate()).unwrap();
        let (roots, mut last) = load(&path).unwrap();
        assert_eq!(roots.generation(), 1);

        poll(&path, &roots, &mut last);
        assert_eq!(roots.generation(), 1, "unchanged contents replace nothing");

        let two = [certificate(), certificate()].concat();
        std::fs::write(&path, &two).unwrap();
        poll(&path, &roots, &mut last);
        assert_eq!(roots.generation(), 2);
        assert_eq!(last, two);

        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\nbroken\n").unwrap();
        poll(&path, &roots, &mut last);
        assert_eq!(roots.generation(), 2, "a broken bundle keeps the roots before it");
        std::fs::remove_file(&path).unwrap();
        poll(&path, &roots, &mut last);
        assert_eq!(roots.generation(), 2, "an unreadable file keeps them too");
    }
}

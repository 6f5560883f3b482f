//! Extra trusted roots for registries (a private CA, `--registry-ca-file`), replaceable while
//! the process runs: every [`Resolver`](crate::Resolver) built from one
//! [`ResolverConfig`](crate::ResolverConfig) shares them, and rebuilds its HTTP client before
//! its next request once they change (the controller builds a resolver per leadership term and
//! one for the mirror copier; a replaced bundle reaches all of them).

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use arc_swap::ArcSwap;

use crate::{ResolverBuildError, resolve::error_chain};

/// The extra roots and their version; cheap to clone (clones share).
#[derive(Clone, Default)]
pub struct ExtraRoots(Arc<Shared>);

#[derive(Default)]
struct Shared {
    current: ArcSwap<Vec<reqwest::Certificate>>,
    /// Bumped by every [`ExtraRoots::replace`], so a resolver knows its client is out of date.
    generation: AtomicU64,
}

impl std::fmt::Debug for ExtraRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraRoots")
            .field("certificates", &self.0.current.load().len())
            .field("generation", &self.generation())
            .finish()
    }
}

impl ExtraRoots {
    /// The certificates of `pems` (PEM bundles).
    pub fn from_pem(pems: &[&[u8]]) -> Result<Self, ResolverBuildError> {
        let roots = Self::default();
        roots.replace(pems)?;
        Ok(roots)
    }

    /// Trusts the certificates of `pems` from the next request on, instead of those before, and
    /// returns how many there are. A bundle that does not parse, or holds no certificate,
    /// changes nothing.
    pub fn replace(&self, pems: &[&[u8]]) -> Result<usize, ResolverBuildError> {
        let mut certificates = Vec::new();
        for pem in pems {
            let parsed = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| ResolverBuildError::Certificate(error_chain(&e)))?;
            if parsed.is_empty() {
                return Err(ResolverBuildError::Certificate(
                    "no certificate in the PEM bundle".into(),
                ));
            }
            certificates.extend(parsed);
        }
        let count = certificates.len();
        self.0.current.store(Arc::new(certificates));
        self.0.generation.fetch_add(1, Ordering::Release);
        Ok(count)
    }

    /// How many times the roots were replaced.
    pub fn generation(&self) -> u64 {
        self.0.generation.load(Ordering::Acquire)
    }

    /// The certificates now, with the generation they belong to (read in that order, so a
    /// client built from them is at least that new).
    pub(crate) fn current(&self) -> (u64, Arc<Vec<reqwest::Certificate>>) {
        let generation = self.generation();
        (generation, self.0.current.load_full())
    }
}

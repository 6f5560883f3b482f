//! What this crate's TLS peers trust: the one crypto provider (ring) and the roots of a
//! `caBundle`. Shared by serving ([`crate::resolver`]) and rotation ([`crate::rotation`]).

use std::sync::{Arc, OnceLock};

use rustls::{RootCertStore, crypto::CryptoProvider};

use crate::{CertError, pem::certs_from_pem};

/// The ring crypto provider, shared. This crate never uses the process-default provider, so it
/// behaves the same whether or not `main` installed one, and aws-lc-rs is never pulled in.
pub fn ring_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// A rustls root store trusting every certificate in `bundle_pem`.
pub fn root_store(bundle_pem: &str) -> Result<RootCertStore, CertError> {
    let mut roots = RootCertStore::empty();
    for der in certs_from_pem(bundle_pem, "caBundle")? {
        roots.add(der).map_err(CertError::TlsConfig)?;
    }
    Ok(roots)
}

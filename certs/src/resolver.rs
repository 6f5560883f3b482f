//! Serving a certificate that can be replaced while the server runs.
//!
//! rustls asks a [`ResolvesServerCert`] for the certificate on every handshake, so swapping what
//! the resolver returns is enough to rotate without a restart: established connections keep
//! their session, new handshakes get the new certificate. The swap is one atomic pointer store
//! (`arc-swap`), so handshakes never block on a lock held by a reload.

use std::{fmt, sync::Arc};

use arc_swap::ArcSwap;
use rustls::{
    ClientConfig, ServerConfig,
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::{
    CertError, ServingCert,
    pem::{certs_from_pem, private_key_from_pem},
    trust::{ring_provider, root_store},
};

/// ALPN protocols offered by [`server_config`], preferred first. The Kubernetes API server
/// speaks HTTP/2 to webhooks when offered; HTTP/1.1 keeps curl and older clients working.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// SHA-256 of a certificate's DER, lowercase hex (the `openssl x509 -fingerprint -sha256` value
/// without colons): identifies which certificate is being served, in logs and tests.
pub fn fingerprint(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// What is being served, kept together so one atomic load gives a key and the metadata that
/// belongs to it (a fingerprint computed separately could describe the previous certificate).
struct Served {
    key: Arc<CertifiedKey>,
    fingerprint: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

/// A [`ResolvesServerCert`] whose certificate can be replaced atomically at runtime.
///
/// Backed by `ArcSwap<Served>`, where `Served` holds the `Arc<rustls::sign::CertifiedKey>`
/// plus its fingerprint and validity.
pub struct SwappableCert {
    current: ArcSwap<Served>,
}

impl SwappableCert {
    /// Starts serving `cert`.
    pub fn new(cert: &ServingCert) -> Result<Self, CertError> {
        Ok(Self {
            current: ArcSwap::from_pointee(load(cert)?),
        })
    }

    /// Replaces the served certificate; the next handshake uses it. On error (unparsable PEM,
    /// key not matching the certificate, unsupported key type) the current one stays in place.
    pub fn store(&self, cert: &ServingCert) -> Result<(), CertError> {
        self.current.store(Arc::new(load(cert)?));
        Ok(())
    }

    /// SHA-256 (hex) of the leaf currently served; see [`fingerprint`].
    pub fn fingerprint(&self) -> String {
        self.current.load().fingerprint.clone()
    }

    /// `notAfter` of the leaf currently served (for renewal decisions and an expiry metric).
    pub fn not_after(&self) -> OffsetDateTime {
        self.current.load().not_after
    }

    /// `notBefore` of the leaf currently served.
    pub fn not_before(&self) -> OffsetDateTime {
        self.current.load().not_before
    }

    /// The rustls key currently served.
    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        self.current.load().key.clone()
    }
}

impl ResolvesServerCert for SwappableCert {
    /// Same certificate whatever the SNI: all our names are in one certificate, and the API
    /// server sends no SNI when it dials an IP address.
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load().key.clone())
    }
}

impl fmt::Debug for SwappableCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let served = self.current.load();
        f.debug_struct("SwappableCert")
            .field("fingerprint", &served.fingerprint)
            .field("not_after", &served.not_after)
            .finish_non_exhaustive()
    }
}

/// Parses and checks a pair into what rustls serves.
fn load(cert: &ServingCert) -> Result<Served, CertError> {
    let chain = certs_from_pem(&cert.cert_pem, "serving certificate")?;
    let key = private_key_from_pem(&cert.key_pem, "serving private key")?;
    let fingerprint = chain.first().map(|der| fingerprint(der)).unwrap_or_default();
    let key = CertifiedKey::from_der(chain, key, &ring_provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => CertError::KeyMismatch { what: "serving" },
        other => CertError::Rustls(other),
    })?;
    Ok(Served {
        key: Arc::new(key),
        fingerprint,
        not_before: cert.not_before,
        not_after: cert.not_after,
    })
}

/// A server config for the webhook: ring provider, TLS 1.2 and 1.3 only, no client auth,
/// certificates from `resolver`, ALPN [`ALPN_PROTOCOLS`].
///
/// Session resumption stays at rustls' default (stateful, in-memory): a client resuming a
/// session made before a swap keeps that session's certificate until it does a full handshake.
/// Go's TLS client resumes only when given a `ClientSessionCache`, which the API server's webhook
/// client is not known to set, so in practice every new connection sees the current certificate.
///
/// ALPN is set here because `axum_server::tls_rustls::RustlsConfig::from_config` (unlike its PEM
/// constructors) leaves it empty, and then HTTP/2 is never negotiated.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig, CertError> {
    let mut config = ServerConfig::builder_with_provider(ring_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(CertError::TlsConfig)?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client config trusting exactly `bundle_pem` (a `caBundle`), ring provider, same ALPN as
/// the server: what the API server does, for tests and e2e probes.
pub fn client_config(bundle_pem: &str) -> Result<ClientConfig, CertError> {
    let mut config = ClientConfig::builder_with_provider(ring_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(CertError::TlsConfig)?
        .with_root_certificates(root_store(bundle_pem)?)
        .with_no_client_auth();
    config.alpn_protocols = ALPN_PROTOCOLS.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CaOptions, CertificateAuthority, ServingOptions};

    fn pair() -> (CertificateAuthority, ServingCert) {
        let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
        let leaf = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        (ca, leaf)
    }

    #[test]
    fn store_swaps_and_reports_the_new_leaf() {
        let (ca, a) = pair();
        let b = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        let r = SwappableCert::new(&a).unwrap();
        assert_eq!(r.fingerprint(), a.fingerprint().unwrap());
        assert_eq!(r.not_after(), a.not_after);
        r.store(&b).unwrap();
        assert_eq!(r.fingerprint(), b.fingerprint().unwrap());
        assert_eq!(r.not_before(), b.not_before);
        let served = r.certified_key();
        assert_eq!(
            fingerprint(served.end_entity_cert().unwrap()),
            b.fingerprint().unwrap()
        );
    }

    #[test]
    fn a_mismatched_or_broken_pair_is_refused_and_the_old_one_kept() {
        let (ca, a) = pair();
        let b = ca.issue_serving(&ServingOptions::for_service("s", "n")).unwrap();
        let r = SwappableCert::new(&a).unwrap();
        let mixed = ServingCert {
            key_pem: b.key_pem.clone(),
            ..a.clone()
        };
        assert!(matches!(
            r.store(&mixed),
            Err(CertError::KeyMismatch { what: "serving" })
        ));
        let broken = ServingCert {
            cert_pem: "garbage".into(),
            ..b.clone()
        };
        assert!(matches!(r.store(&broken), Err(CertError::NoCertificate { .. })));
        let no_key = ServingCert {
            key_pem: String::new(),
            ..b
        };
        assert!(matches!(r.store(&no_key), Err(CertError::Pem { .. })));
        assert_eq!(r.fingerprint(), a.fingerprint().unwrap());
    }

    #[test]
    fn server_config_offers_h2_and_http11() {
        let (_, a) = pair();
        let config = server_config(Arc::new(SwappableCert::new(&a).unwrap())).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn debug_shows_fingerprint_only() {
        let (_, a) = pair();
        let r = SwappableCert::new(&a).unwrap();
        let text = format!("{r:?}");
        assert!(text.contains(&a.fingerprint().unwrap()));
        assert!(!text.contains("PRIVATE"));
    }
}

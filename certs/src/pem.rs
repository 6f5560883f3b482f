//! Crate-private PEM/X.509 helpers shared by the other modules.
//!
//! PEM splitting uses `rustls-pki-types` (the maintained replacement for `rustls-pemfile`);
//! X.509 fields are read with `x509-parser`.

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;

use crate::CertError;

/// All `CERTIFICATE` blocks of `pem`, in order. Errors if there is none, so a truncated or
/// empty file is never mistaken for "no certificates needed".
pub(crate) fn certs_from_pem(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CertError::Pem { what, source })?;
    if certs.is_empty() {
        return Err(CertError::NoCertificate { what });
    }
    Ok(certs)
}

/// The first private key block (PKCS#8, SEC1 or PKCS#1) of `pem`.
pub(crate) fn private_key_from_pem(
    pem: &str,
    what: &'static str,
) -> Result<PrivateKeyDer<'static>, CertError> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|source| CertError::Pem { what, source })
}

/// Runs `f` on the parsed certificate. A callback, because `X509Certificate` borrows `der`.
pub(crate) fn with_x509<T>(
    der: &[u8],
    what: &'static str,
    f: impl FnOnce(&X509Certificate<'_>) -> T,
) -> Result<T, CertError> {
    let (_rest, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| CertError::X509 {
        what,
        reason: e.to_string(),
    })?;
    Ok(f(&cert))
}

/// `(not_before, not_after)` of a DER certificate.
pub(crate) fn validity_of_der(
    der: &[u8],
    what: &'static str,
) -> Result<(OffsetDateTime, OffsetDateTime), CertError> {
    with_x509(der, what, |c| {
        (
            c.validity().not_before.to_datetime(),
            c.validity().not_after.to_datetime(),
        )
    })
}

/// Re-encodes DER as a PEM `CERTIFICATE` block (64-column base64, trailing newline), so
/// bundles we write are byte-stable whatever formatting the input had.
pub(crate) fn der_to_pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = String::with_capacity(b64.len() + b64.len() / 64 + 64);
    out.push_str("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        // base64 output is ASCII, so every chunk is valid UTF-8.
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_to_pem_round_trips() {
        let der: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let pem = der_to_pem(&der);
        let parsed = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        assert_eq!(parsed.as_ref(), der.as_slice());
        assert!(pem.lines().all(|l| l.len() <= 64 || l.starts_with("-----")));
    }

    #[test]
    fn empty_or_garbage_pem_is_an_error() {
        assert!(matches!(
            certs_from_pem("", "test"),
            Err(CertError::NoCertificate { .. })
        ));
        assert!(matches!(
            certs_from_pem("not pem at all\n", "test"),
            Err(CertError::NoCertificate { .. })
        ));
        let broken = "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            certs_from_pem(broken, "test"),
            Err(CertError::Pem { .. })
        ));
    }
}

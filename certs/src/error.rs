//! The one error type of this crate.
//!
//! Messages name *what* failed (which file, which Secret key, which step) and never include PEM or
//! key bytes, so an error can be logged as-is.

use std::path::PathBuf;

/// Everything that can go wrong while issuing, loading, verifying or serving certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// rcgen could not generate a fresh key pair.
    #[error("generating a key pair: {0}")]
    KeyGeneration(#[source] rcgen::Error),

    /// A DNS subject alternative name is not a valid DNS name.
    #[error("invalid DNS name {name:?} for a serving certificate")]
    InvalidName {
        /// The rejected name.
        name: String,
    },

    /// A serving certificate needs at least one DNS name or IP address to be verifiable.
    #[error("a serving certificate needs at least one DNS name or IP address")]
    NoSubjectAltNames,

    /// A validity period was zero or negative.
    #[error("{what} validity must be positive")]
    InvalidValidity {
        /// Which certificate ("CA" or "serving").
        what: &'static str,
    },

    /// The CA has expired (or expires before the leaf would start), so it can sign nothing useful.
    #[error("the CA expired at {not_after}; rotate the CA before issuing")]
    CaExpired {
        /// The CA's `notAfter`.
        not_after: time::OffsetDateTime,
    },

    /// A certificate offered for serving has already expired.
    #[error("the certificate expired at {not_after}")]
    Expired {
        /// The certificate's `notAfter`.
        not_after: time::OffsetDateTime,
    },

    /// rcgen failed to sign a certificate.
    #[error("signing the {what} certificate: {source}")]
    Sign {
        /// Which certificate ("CA" or "serving").
        what: &'static str,
        /// rcgen's reason.
        #[source]
        source: rcgen::Error,
    },

    /// A private key PEM could not be parsed (by rcgen, for signing).
    #[error("parsing the {what} private key: {source}")]
    PrivateKey {
        /// Which key ("CA", "serving").
        what: &'static str,
        /// rcgen's reason.
        #[source]
        source: rcgen::Error,
    },

    /// The stored CA certificate could not be turned into an rcgen issuer.
    #[error("loading the CA certificate as an issuer: {0}")]
    CaIssuer(#[source] rcgen::Error),

    /// PEM text was malformed.
    #[error("parsing PEM ({what}): {source}")]
    Pem {
        /// What was being parsed ("CA certificate", "caBundle", ...).
        what: &'static str,
        /// The PEM parser's reason.
        #[source]
        source: rustls::pki_types::pem::Error,
    },

    /// PEM text held no `CERTIFICATE` block.
    #[error("no CERTIFICATE block in {what}")]
    NoCertificate {
        /// What was being parsed.
        what: &'static str,
    },

    /// A certificate's DER could not be parsed as X.509.
    #[error("parsing X.509 ({what}): {reason}")]
    X509 {
        /// What was being parsed.
        what: &'static str,
        /// x509-parser's reason (its error type borrows the input, so it is stringified).
        reason: String,
    },

    /// A certificate loaded as a CA does not have `basicConstraints cA=TRUE`.
    #[error("the CA certificate is not a CA (basicConstraints cA is not set)")]
    NotACa,

    /// A private key does not belong to the certificate it was paired with.
    #[error("the {what} private key does not match its certificate")]
    KeyMismatch {
        /// Which pair ("CA", "serving").
        what: &'static str,
    },

    /// rustls refused the certificate/key pair (unsupported key type, mismatch, ...).
    #[error("loading the serving certificate into rustls: {0}")]
    Rustls(#[source] rustls::Error),

    /// rustls could not build a server or client configuration.
    #[error("building the TLS configuration: {0}")]
    TlsConfig(#[source] rustls::Error),

    /// A certificate chain did not verify against a CA bundle.
    #[error("certificate does not verify for {server_name:?}: {source}")]
    Verify {
        /// The DNS name or IP address that was checked.
        server_name: String,
        /// rustls/webpki's reason.
        #[source]
        source: rustls::Error,
    },

    /// A name is neither a valid DNS name nor an IP address.
    #[error("invalid server name {0:?}")]
    InvalidServerName(String),

    /// A Kubernetes Secret's data lacks a required key.
    #[error("Secret data has no key {0:?}")]
    MissingSecretKey(&'static str),

    /// A Kubernetes Secret's value is not UTF-8 (so not PEM).
    #[error("Secret data key {0:?} is not UTF-8 PEM")]
    NotUtf8(&'static str),

    /// A certificate or key file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

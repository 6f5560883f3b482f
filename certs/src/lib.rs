//! CA and serving certificate issue and rotation for the webhook (the controller serves no TLS:
//! its admin port is plain HTTP behind a NetworkPolicy).
//!
//! - [`issue`]: a self-managed CA and serving leaves (rcgen), PEM in and out, Secret data keys.
//! - [`rotation`]: pure renewal decisions and `caBundle` management during CA rotation.
//! - [`resolver`]: a rustls certificate resolver that can be swapped without a restart.
//! - [`watch`]: reloads cert-manager-mounted files into that resolver.
//! - [`kube_store`]: the self-managed mode: a Secret shared by replicas, caBundle injection.
//!
//! Crypto is ring only (never aws-lc-rs); this crate builds its rustls objects with an explicit
//! ring provider and never depends on the process default. Only [`kube_store`] talks to the
//! cluster (the Secret and the caBundle injection); the rest is pure.

mod error;
pub mod issue;
pub mod kube_store;
mod pem;
pub mod resolver;
pub mod rotation;
mod trust;
pub mod watch;

pub use error::CertError;
pub use issue::{
    BACKDATE, CA_COMMON_NAME, CaOptions, CertificateAuthority, DEFAULT_CA_VALIDITY, DEFAULT_SERVING_VALIDITY,
    SECRET_CA_CERT, SECRET_CA_KEY, SECRET_TLS_CERT, SECRET_TLS_KEY, ServingCert, ServingOptions, TlsSecret,
    service_dns_names,
};
pub use resolver::{SwappableCert, client_config, fingerprint, server_config};
pub use rotation::{
    DEFAULT_RENEW_AT_FRACTION, Validity, add_to_bundle, ca_bundle, needs_renewal, prune_expired, verify_chain,
};
pub use trust::{ring_provider, root_store};
pub use watch::{FileWatcher, WatchStatus, load_pair};

//! A CA and a serving certificate for a peer's webhook Service, in place of the cert-manager
//! `Certificate` a release would have issued (cert-manager does not run here): the key pair goes
//! where the peer reads it, the CA into the `caBundle`s, as cert-manager's CA injector would.

use anyhow::{Context, Result};
use base64::Engine as _;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};

/// PEM-encoded CA certificate, serving certificate and its key.
#[derive(Debug, Clone)]
pub struct ServingCert {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl ServingCert {
    /// For `<service>.<namespace>.svc` (the name kube-apiserver verifies) and its cluster-local form.
    pub fn for_service(service: &str, namespace: &str) -> Result<Self> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{service}-ca"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?).context("issuing the webhook CA")?;
        let key = KeyPair::generate()?;
        let names = vec![
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ];
        let mut params = CertificateParams::new(names)?;
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{service}.{namespace}.svc"));
        let cert = params
            .signed_by(&key, &ca)
            .context("issuing the webhook serving certificate")?;
        Ok(Self {
            ca_pem: ca.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA as a webhook configuration's `caBundle` holds it (base64 of the PEM).
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

//! Key material of the local control plane, written into its directory at boot: the
//! service-account key pair, the admin token, and the front-proxy (request-header) CA with the
//! client certificate kube-apiserver presents to aggregated API servers (kapp-controller's
//! `data.packaging.carvel.dev`), which authenticate it through the
//! `extension-apiserver-authentication` ConfigMap; and the client certificate kube-apiserver
//! presents to a real kubelet (`make cluster`'s node, `scripts/node.sh`: logs, exec,
//! port-forward), with the CA that kubelet authenticates it by.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// The common name kube-apiserver's proxy client certificate carries, and the only one
/// `--requestheader-allowed-names` accepts.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The common name of kube-apiserver's kubelet client certificate (in `system:masters`, which the
/// kubelet's webhook authorization lets do anything).
pub const KUBELET_CLIENT: &str = "kube-apiserver-kubelet-client";

/// Paths of the files [`Pki::write`] created.
#[derive(Debug, Clone)]
pub struct Pki {
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    pub tokens: PathBuf,
    pub token: String,
    pub front_proxy_ca: PathBuf,
    pub front_proxy_client_cert: PathBuf,
    pub front_proxy_client_key: PathBuf,
    pub kubelet_client_ca: PathBuf,
    pub kubelet_client_cert: PathBuf,
    pub kubelet_client_key: PathBuf,
}

impl Pki {
    pub fn write(dir: &Path, token: String) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let pki = Pki {
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            tokens: dir.join("tokens.csv"),
            token,
            front_proxy_ca: dir.join("front-proxy-ca.crt"),
            front_proxy_client_cert: dir.join("front-proxy-client.crt"),
            front_proxy_client_key: dir.join("front-proxy-client.key"),
            kubelet_client_ca: dir.join("kubelet-client-ca.crt"),
            kubelet_client_cert: dir.join("kubelet-client.crt"),
            kubelet_client_key: dir.join("kubelet-client.key"),
        };
        let sa_key = KeyPair::generate().context("generating the service-account key")?;
        std::fs::write(&pki.sa_key, sa_key.serialize_pem())?;
        std::fs::write(&pki.sa_pub, sa_key.public_key_pem())?;
        std::fs::write(&pki.tokens, format!("{},admin,admin,system:masters\n", pki.token))?;

        write_client_pair(
            "front-proxy-ca",
            FRONT_PROXY_CLIENT,
            None,
            [
                &pki.front_proxy_ca,
                &pki.front_proxy_client_cert,
                &pki.front_proxy_client_key,
            ],
        )?;
        write_client_pair(
            "kubelet-client-ca",
            KUBELET_CLIENT,
            Some("system:masters"),
            [
                &pki.kubelet_client_ca,
                &pki.kubelet_client_cert,
                &pki.kubelet_client_key,
            ],
        )?;
        Ok(pki)
    }

    /// kube-apiserver's flags for these files.
    pub fn apiserver_flags(&self) -> Vec<String> {
        vec![
            format!("--token-auth-file={}", self.tokens.display()),
            format!("--service-account-key-file={}", self.sa_pub.display()),
            format!("--service-account-signing-key-file={}", self.sa_key.display()),
            format!("--requestheader-client-ca-file={}", self.front_proxy_ca.display()),
            format!("--requestheader-allowed-names={FRONT_PROXY_CLIENT}"),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            format!(
                "--proxy-client-cert-file={}",
                self.front_proxy_client_cert.display()
            ),
            format!(
                "--proxy-client-key-file={}",
                self.front_proxy_client_key.display()
            ),
            format!(
                "--kubelet-client-certificate={}",
                self.kubelet_client_cert.display()
            ),
            format!("--kubelet-client-key={}", self.kubelet_client_key.display()),
        ]
    }
}

/// A CA of its own and one client certificate it issues (`common_name`, in `organization` when
/// given): writes `[ca, cert, key]`.
fn write_client_pair(
    ca_name: &str,
    common_name: &str,
    organization: Option<&str>,
    [ca_file, cert_file, key_file]: [&Path; 3],
) -> Result<()> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, ca_name);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)
        .with_context(|| format!("issuing the CA {ca_name}"))?;
    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client.distinguished_name.push(DnType::CommonName, common_name);
    if let Some(organization) = organization {
        client
            .distinguished_name
            .push(DnType::OrganizationName, organization);
    }
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = client
        .signed_by(&client_key, &ca)
        .with_context(|| format!("issuing the client certificate {common_name}"))?;
    std::fs::write(ca_file, ca.pem())?;
    std::fs::write(cert_file, client.pem())?;
    std::fs::write(key_file, client_key.serialize_pem())?;
    Ok(())
}

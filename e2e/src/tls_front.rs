//! A registry behind a private CA: a TLS front on loopback, with a certificate for 127.0.0.1
//! issued by a CA of its own, that forwards every connection to a plain-HTTP registry of the
//! environment. The real registry answers; only the TLS in front is the test's (Distribution
//! serves TLS too, but the harness pushes over plain HTTP, and one registry can then stand
//! behind several CAs).

use std::{net::SocketAddr, sync::Arc};

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_rustls::TlsAcceptor;

/// A running front; stops when dropped.
pub struct TlsFront {
    /// `127.0.0.1:PORT`, the registry part of references through it.
    pub addr: String,
    /// The CA its certificate chains to (PEM).
    pub ca_pem: String,
    task: JoinHandle<()>,
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsFront {
    /// A front for `upstream` (`host:port`, plain HTTP) with a new CA.
    pub async fn start(upstream: &str, ca_name: &str) -> Result<Self> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
        let key = KeyPair::generate()?;
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])?.signed_by(&key, &ca)?;
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(leaf.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .context("the front's server configuration")?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?.to_string();
        let upstream = upstream.to_owned();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (acceptor, upstream) = (acceptor.clone(), upstream.clone());
                tokio::spawn(async move {
                    // A client that does not trust the CA ends the handshake: nothing to forward.
                    let Ok(mut tls) = acceptor.accept(socket).await else {
                        return;
                    };
                    let Ok(mut plain) = tokio::net::TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Ok(Self {
            addr,
            ca_pem: ca.pem(),
            task,
        })
    }
}

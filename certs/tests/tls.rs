//! End-to-end checks of the certificate machinery with real rustls clients: chain verification,
//! in-process TLS handshakes against a `SwappableCert` server, and the file watcher.

// The whole file is test code; clippy.toml's allow-unwrap-in-tests does not reach the helper
// functions of an integration-test crate, so allow it here explicitly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    sync::Arc,
    time::Duration,
};

use holdfast_certs::{
    CaOptions, CertificateAuthority, FileWatcher, ServingCert, ServingOptions, SwappableCert, WatchStatus,
    ca_bundle, client_config, fingerprint, ring_provider, root_store, server_config,
};
use rustls::{
    ClientConfig, ProtocolVersion,
    client::{Resumption, WebPkiServerVerifier, danger::ServerCertVerifier},
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;

const SVC: &str = "holdfast-webhook";
const NS: &str = "holdfast";
const DNS: &str = "holdfast-webhook.holdfast.svc";
/// Upper bound for anything asynchronous; tests finish in milliseconds when healthy.
const DEADLINE: Duration = Duration::from_secs(20);

fn opts() -> ServingOptions {
    ServingOptions::for_service(SVC, NS).with_ip(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

fn ca() -> CertificateAuthority {
    CertificateAuthority::generate(&CaOptions::default()).unwrap()
}

fn leaf_der(cert: &ServingCert) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap()
}

#[test]
fn chain_verifies_for_the_dns_names_and_127_0_0_1_but_not_other_names() {
    let ca = ca();
    let leaf = ca.issue_serving(&opts()).unwrap();
    let roots = Arc::new(root_store(&ca_bundle(&[&ca])).unwrap());
    let verifier = WebPkiServerVerifier::builder_with_provider(roots, ring_provider())
        .build()
        .unwrap();
    let verify = |name: &str| {
        let name = ServerName::try_from(name.to_owned()).unwrap();
        verifier.verify_server_cert(&leaf_der(&leaf), &[], &name, &[], UnixTime::now())
    };
    verify(DNS).unwrap();
    verify("holdfast-webhook.holdfast.svc.cluster.local").unwrap();
    verify("127.0.0.1").unwrap();
    for wrong in [
        "other.holdfast.svc",
        "holdfast-webhook.default.svc",
        "localhost",
        "127.0.0.2",
        "::1",
    ] {
        let err = verify(wrong).unwrap_err();
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })
            ),
            "{wrong}: {err:?}"
        );
    }
    // A different CA does not vouch for it.
    let stranger = Arc::new(root_store(ca_bundle(&[&self::ca()]).as_str()).unwrap());
    let verifier = WebPkiServerVerifier::builder_with_provider(stranger, ring_provider())
        .build()
        .unwrap();
    let name = ServerName::try_from(DNS).unwrap();
    assert!(
        verifier
            .verify_server_cert(&leaf_der(&leaf), &[], &name, &[], UnixTime::now())
            .is_err()
    );
}

/// A TLS server on 127.0.0.1 that answers every connection with "ok" and closes it.
async fn start_server(resolver: Arc<SwappableCert>) -> (SocketAddr, JoinHandle<()>) {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(resolver).unwrap()));
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let _ = tls.write_all(b"ok").await;
                    let _ = tls.shutdown().await;
                }
            });
        }
    });
    (addr, task)
}

struct Handshake {
    fingerprint: String,
    alpn: Option<Vec<u8>>,
    version: Option<ProtocolVersion>,
}

/// One full handshake. Resumption is off: a resumed TLS session reuses the certificate of the
/// session it resumes, and we want to observe what the server serves *now*.
async fn handshake(
    addr: SocketAddr,
    mut config: ClientConfig,
    name: &str,
) -> Result<Handshake, std::io::Error> {
    config.resumption = Resumption::disabled();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    let tcp = TcpStream::connect(addr).await?;
    let mut tls = tokio::time::timeout(DEADLINE, TlsConnector::from(Arc::new(config)).connect(name, tcp))
        .await
        .map_err(std::io::Error::other)??;
    let (_, conn) = tls.get_ref();
    let out = Handshake {
        fingerprint: fingerprint(&conn.peer_certificates().unwrap()[0]),
        alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
        version: conn.protocol_version(),
    };
    let mut body = Vec::new();
    tls.read_to_end(&mut body).await?;
    assert_eq!(body, b"ok");
    Ok(out)
}

#[tokio::test]
async fn handshake_sees_the_swapped_certificate_without_a_restart() {
    let ca = ca();
    let a = ca.issue_serving(&opts()).unwrap();
    let b = ca.issue_serving(&opts()).unwrap();
    let resolver = Arc::new(SwappableCert::new(&a).unwrap());
    let (addr, server) = start_server(resolver.clone()).await;
    let client = client_config(&ca_bundle(&[&ca])).unwrap();

    let first = handshake(addr, client.clone(), DNS).await.unwrap();
    assert_eq!(first.fingerprint, a.fingerprint().unwrap());
    assert_eq!(first.fingerprint, resolver.fingerprint());
    assert_eq!(first.alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(first.version, Some(ProtocolVersion::TLSv1_3));

    resolver.store(&b).unwrap();
    // The next handshake, same server task, same listener: the new leaf.
    let second = handshake(addr, client.clone(), "127.0.0.1").await.unwrap();
    assert_eq!(second.fingerprint, b.fingerprint().unwrap());
    assert_ne!(second.fingerprint, first.fingerprint);

    // A client that does not trust this CA is refused.
    let stranger = client_config(&ca_bundle(&[&self::ca()])).unwrap();
    assert!(handshake(addr, stranger, DNS).await.is_err());
    // So is one that asks for a name the certificate does not carry.
    assert!(handshake(addr, client, "other.holdfast.svc").await.is_err());
    server.abort();
}

#[tokio::test]
async fn tls12_and_http11_clients_are_served() {
    let ca = ca();
    let resolver = Arc::new(SwappableCert::new(&ca.issue_serving(&opts()).unwrap()).unwrap());
    let (addr, server) = start_server(resolver).await;
    let mut tls12 = ClientConfig::builder_with_provider(ring_provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(root_store(&ca_bundle(&[&ca])).unwrap())
        .with_no_client_auth();
    tls12.alpn_protocols = vec![b"http/1.1".to_vec()];
    let hs = handshake(addr, tls12, DNS).await.unwrap();
    assert_eq!(hs.version, Some(ProtocolVersion::TLSv1_2));
    assert_eq!(hs.alpn.as_deref(), Some(&b"http/1.1"[..]));
    server.abort();
}

#[tokio::test]
async fn ca_rotation_keeps_clients_working_through_the_overlap() {
    let old = ca();
    let new = ca();
    let resolver = Arc::new(SwappableCert::new(&old.issue_serving(&opts()).unwrap()).unwrap());
    let (addr, server) = start_server(resolver.clone()).await;
    // Step 1: the API server gets the bundle with both CAs while the old leaf is still served.
    let both = client_config(&ca_bundle(&[&old, &new])).unwrap();
    handshake(addr, both.clone(), DNS).await.unwrap();
    // Step 2: switch to a leaf from the new CA; the same client keeps working.
    let new_leaf = new.issue_serving(&opts()).unwrap();
    resolver.store(&new_leaf).unwrap();
    assert_eq!(
        handshake(addr, both, DNS).await.unwrap().fingerprint,
        new_leaf.fingerprint().unwrap()
    );
    // Without the overlap, a client still on the old bundle would have broken.
    let old_only = client_config(&ca_bundle(&[&old])).unwrap();
    assert!(handshake(addr, old_only, DNS).await.is_err());
    server.abort();
}

fn write_pair(cert_path: &Path, key_path: &Path, cert: &ServingCert) {
    std::fs::write(cert_path, &cert.cert_pem).unwrap();
    std::fs::write(key_path, &cert.key_pem).unwrap();
}

/// Waits (bounded) until the watcher reports a state satisfying `cond`.
async fn wait_status(status: &mut watch::Receiver<WatchStatus>, cond: impl FnMut(&WatchStatus) -> bool) {
    tokio::time::timeout(DEADLINE, status.wait_for(cond))
        .await
        .expect("watcher deadline")
        .unwrap();
}

#[tokio::test]
async fn file_watcher_picks_up_a_rewritten_pair_and_ignores_a_corrupt_one() {
    let dir = tempfile::tempdir().unwrap();
    let (cert_path, key_path) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let ca = ca();
    let a = ca.issue_serving(&opts()).unwrap();
    let b = ca.issue_serving(&opts()).unwrap();
    write_pair(&cert_path, &key_path, &a);

    let initial = holdfast_certs::load_pair(&cert_path, &key_path).await.unwrap();
    let resolver = Arc::new(SwappableCert::new(&initial).unwrap());
    let (addr, server) = start_server(resolver.clone()).await;
    let client = client_config(&ca_bundle(&[&ca])).unwrap();
    let cancel = CancellationToken::new();
    let (task, mut status) = FileWatcher::new(&cert_path, &key_path)
        .with_interval(Duration::from_millis(10))
        .spawn(resolver.clone(), cancel.clone());

    // Rewritten pair (cert first, then key, as a careless writer would): B gets served.
    write_pair(&cert_path, &key_path, &b);
    let fp_b = b.fingerprint().unwrap();
    wait_status(&mut status, |s| s.fingerprint.as_deref() == Some(fp_b.as_str())).await;
    assert_eq!(resolver.fingerprint(), fp_b);
    assert_eq!(
        handshake(addr, client.clone(), DNS).await.unwrap().fingerprint,
        fp_b
    );

    // Corrupt certificate: rejected, B stays.
    let rejected_before = status.borrow().rejected;
    std::fs::write(
        &cert_path,
        "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    wait_status(&mut status, |s| s.rejected > rejected_before).await;
    assert_eq!(resolver.fingerprint(), fp_b);
    assert!(status.borrow().last_error.is_some());
    assert_eq!(handshake(addr, client, DNS).await.unwrap().fingerprint, fp_b);

    // Cancellation stops the task.
    cancel.cancel();
    tokio::time::timeout(DEADLINE, task)
        .await
        .expect("watcher did not stop")
        .unwrap();
    server.abort();
}

/// The kubelet's Secret volume layout: `tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`,
/// updated by atomically renaming a new `..data` symlink over the old one.
#[cfg(unix)]
#[tokio::test]
async fn file_watcher_follows_a_kubelet_style_symlink_swap() {
    use std::os::unix::fs::symlink;

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let ca = ca();
    let a = ca.issue_serving(&opts()).unwrap();
    let b = ca.issue_serving(&opts()).unwrap();

    let publish = |version: &str, cert: &ServingCert| {
        let data_dir = root.join(version);
        std::fs::create_dir(&data_dir).unwrap();
        write_pair(&data_dir.join("tls.crt"), &data_dir.join("tls.key"), cert);
        symlink(version, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    };
    publish("..2026_01_01_00_00_00.1", &a);
    symlink("..data/tls.crt", root.join("tls.crt")).unwrap();
    symlink("..data/tls.key", root.join("tls.key")).unwrap();

    let (cert_path, key_path) = (root.join("tls.crt"), root.join("tls.key"));
    let resolver = Arc::new(
        SwappableCert::new(&holdfast_certs::load_pair(&cert_path, &key_path).await.unwrap()).unwrap(),
    );
    let cancel = CancellationToken::new();
    let (task, mut status) = FileWatcher::new(&cert_path, &key_path)
        .with_interval(Duration::from_millis(10))
        .spawn(resolver.clone(), cancel.clone());
    wait_status(&mut status, |s| s.polls >= 1).await;
    assert_eq!(resolver.fingerprint(), a.fingerprint().unwrap());

    publish("..2026_01_02_00_00_00.2", &b);
    let fp_b = b.fingerprint().unwrap();
    wait_status(&mut status, |s| s.fingerprint.as_deref() == Some(fp_b.as_str())).await;
    assert_eq!(resolver.fingerprint(), fp_b);
    assert_eq!(
        status.borrow().rejected,
        0,
        "an atomic swap never shows a mixed pair"
    );

    cancel.cancel();
    tokio::time::timeout(DEADLINE, task).await.unwrap().unwrap();
}

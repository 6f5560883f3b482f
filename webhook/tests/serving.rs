//! The TLS and admin ports of a real server on loopback: TLS 1.2 and 1.3 with ALPN, no plain
//! HTTP on the TLS port, readiness that waits for the caches and turns off first on shutdown,
//! metrics with the certificate's expiry, and a shutdown that lets an admission in flight finish.

// Helpers outside #[test] fns are not covered by clippy.toml's allow-unwrap-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use holdfast_certs::{
    CaOptions, CertificateAuthority, ServingOptions, SwappableCert, ring_provider, root_store,
};
use holdfast_webhook::{
    cluster::StaticCluster,
    server::{self, Running, Settings},
};
use rustls::{ClientConfig, pki_types::ServerName};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::oneshot,
};
use tokio_rustls::TlsConnector;

mod support;

struct Fixture {
    running: Running,
    bundle: String,
    release_sync: Option<oneshot::Sender<()>>,
}

async fn start() -> Fixture {
    start_with(Default::default()).await
}

/// A server whose pinning resolves through `registry`; ready once `release_sync` fires.
async fn start_with(registry: holdfast_cache::testing::FakeSource) -> Fixture {
    let ca = CertificateAuthority::generate(&CaOptions::default()).unwrap();
    let leaf = ca
        .issue_serving(
            &ServingOptions::for_service("holdfast-webhook", "holdfast-system")
                .with_ip([127, 0, 0, 1].into()),
        )
        .unwrap();
    let (release, synced) = oneshot::channel::<()>();
    let settings = Settings {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        deadline: Duration::from_secs(3),
        limits: holdfast_webhook::handler::Limits {
            body_bytes: 1 << 20,
            ..Default::default()
        },
        handshake_timeout: Duration::from_secs(2),
    };
    let running = server::start(
        settings,
        support::context(StaticCluster::default(), registry),
        async move {
            let _ = synced.await;
        },
        Arc::new(SwappableCert::new(&leaf).unwrap()),
    )
    .await
    .unwrap();
    Fixture {
        running,
        bundle: ca.cert_pem().to_string(),
        release_sync: Some(release),
    }
}

fn client(bundle: &str, version: &'static rustls::SupportedProtocolVersion) -> ClientConfig {
    let mut config = ClientConfig::builder_with_provider(ring_provider())
        .with_protocol_versions(&[version])
        .unwrap()
        .with_root_certificates(root_store(bundle).unwrap())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test]
async fn serves_tls_12_and_13_with_alpn() {
    let fx = start().await;
    for (version, alpn) in [
        (&rustls::version::TLS13, b"h2".as_slice()),
        (&rustls::version::TLS12, b"h2".as_slice()),
    ] {
        let tcp = TcpStream::connect(fx.running.addr).await.unwrap();
        let tls = TlsConnector::from(Arc::new(client(&fx.bundle, version)))
            .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
            .await
            .unwrap();
        let (_, session) = tls.get_ref();
        assert_eq!(session.protocol_version(), Some(version.version));
        assert_eq!(session.alpn_protocol(), Some(alpn));
    }
    fx.running.shutdown(Duration::ZERO, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn plain_http_on_the_tls_port_gets_no_http_answer() {
    let fx = start().await;
    let mut stream = TcpStream::connect(fx.running.addr).await.unwrap();
    stream
        .write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut buf))
        .await
        .unwrap();
    // The handshake fails: the connection closes (or resets) without an HTTP response.
    assert!(
        read.is_err() || !String::from_utf8_lossy(&buf).starts_with("HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&buf)
    );
    fx.running.shutdown(Duration::ZERO, Duration::from_secs(1)).await;
}

#[tokio::test]
async fn readiness_waits_for_caches_and_metrics_report_expiry() {
    let mut fx = start().await;
    let admin = fx.running.admin_addr;
    assert_eq!(http_get(admin, "/healthz").await.0, 200);
    let (status, body) = http_get(admin, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.contains("caches not synced"), "{body}");

    fx.release_sync.take().unwrap().send(()).unwrap();
    let readiness = fx.running.readiness.clone();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !readiness.blockers().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(http_get(admin, "/readyz").await.0, 200);

    let (status, body) = http_get(admin, "/metrics").await;
    assert_eq!(status, 200);
    let expiry: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("holdfast_webhook_serving_certificate_expiry_seconds "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(expiry > 80.0 * 86400.0 && expiry <= 90.0 * 86400.0, "{expiry}");
    // The view serves every peer's kind here; each is a series of its own.
    for kind in ["CFApp", "BuildWorkload", "Image", "Build"] {
        assert!(
            body.lines()
                .any(|l| l.starts_with("holdfast_webhook_peer_api_served{")
                    && l.contains(&format!("kind=\"{kind}\""))
                    && l.ends_with(" 1")),
            "{body}"
        );
    }

    fx.running.shutdown(Duration::ZERO, Duration::from_secs(1)).await;
    assert!(readiness.blockers().contains(&"shutting down"));
    assert!(
        TcpStream::connect(admin).await.is_err(),
        "admin port still open after shutdown"
    );
}

#[tokio::test]
async fn shutdown_lets_an_admission_in_flight_finish_and_then_refuses_connections() {
    const TAG: &str = "registry.example/team/app-config:1.0.0";
    let registry =
        holdfast_cache::testing::FakeSource::with([(TAG, holdfast_registry::Digest::sha256_of(b"config"))])
            .with_latency(Duration::from_millis(500));
    let asked = registry.started();
    let mut fx = start_with(registry).await;
    if let Some(release) = fx.release_sync.take() {
        let _ = release.send(());
    }
    let running = fx.running;
    let addr = running.addr;
    let readiness = running.readiness.clone();

    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "7d1e3c2a-0b4f-4c1e-9a55-2f7f2b1d9e10",
            "kind": {"group": "kappctrl.k14s.io", "version": "v1alpha1", "kind": "App"},
            "resource": {"group": "kappctrl.k14s.io", "version": "v1alpha1", "resource": "apps"},
            "name": "app", "namespace": "team", "operation": "CREATE", "userInfo": {},
            "object": {"apiVersion": "kappctrl.k14s.io/v1alpha1", "kind": "App",
                       "metadata": {"name": "app", "namespace": "team"},
                       "spec": {"fetch": [{"image": {"url": TAG}}]}},
            "oldObject": null, "dryRun": false
        }
    })
    .to_string();
    let mut config = client(&fx.bundle, &rustls::version::TLS13);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let in_flight = tokio::spawn(async move {
        let request = format!(
            "POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{review}",
            review.len()
        );
        tls.write_all(request.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        let _ = tls.read_to_end(&mut answer).await;
        String::from_utf8_lossy(&answer).into_owned()
    });

    // The admission is waiting on the registry: shut down now.
    asked.notified().await;
    let shutdown = tokio::spawn(running.shutdown(Duration::ZERO, Duration::from_secs(5)));
    let answer = in_flight.await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"patchType\":\"JSONPatch\""), "{answer}");
    shutdown.await.unwrap();
    assert!(readiness.blockers().contains(&"shutting down"));
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the TLS port still accepts connections after the shutdown"
    );
}

#[tokio::test]
async fn during_the_shutdown_delay_it_is_unready_and_still_answers_new_connections() {
    let mut fx = start().await;
    if let Some(release) = fx.release_sync.take() {
        let _ = release.send(());
    }
    let running = fx.running;
    let (addr, admin) = (running.addr, running.admin_addr);
    let readiness = running.readiness.clone();
    tokio::time::timeout(Duration::from_secs(10), async {
        while !readiness.blockers().is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    let shutdown = tokio::spawn(running.shutdown(Duration::from_secs(3), Duration::from_secs(1)));
    tokio::time::timeout(Duration::from_secs(2), async {
        while !readiness.blockers().contains(&"shutting down") {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap();
    assert_eq!(http_get(admin, "/readyz").await.0, 503);
    // A connection opened now (kube-proxy still routing here) completes its handshake and gets an
    // HTTP answer.
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut config = client(&fx.bundle, &rustls::version::TLS13);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    assert!(
        String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(!shutdown.is_finished(), "the delay ended early");
    shutdown.await.unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after the delay and drain"
    );
}

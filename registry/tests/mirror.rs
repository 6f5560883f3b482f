//! The mirror copier against a **fake** registry (a test fixture) that serves a blob whose content
//! does not match its digest — something a real registry never does — and records what arrives
//! on the mirror side: the copy must fail with a verification error, and the bad blob must never
//! complete an upload (the copier withholds the last chunk, so the mirror sees an aborted body),
//! nor may any manifest be pushed. Deleting a copy is checked against a fake mirror for the
//! answers a real one gives only when misconfigured (405: deletes disabled), and what a copy holds
//! (an index's manifests, a bundle's locked images) is read back from a fake mirror. The happy paths run
//! against real registries in `e2e/tests/mirror_copier.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    body::{Body, Bytes},
    extract::State,
    http::{Method, StatusCode, Uri, header},
    response::{IntoResponse, Response},
};
use futures::StreamExt as _;
use holdfast_registry::{
    Credentials, Digest, Reference, Resolver, ResolverConfig,
    mirror::{Copier, CopierConfig, CopyError, DeleteError, Deletion, MirrorLocation, VerifyError},
};
use tokio::sync::Notify;

const LAYER_SIZE: usize = 3 * 1024 * 1024;

struct Fake {
    manifest: Vec<u8>,
    config: Vec<u8>,
    /// What the manifest's layer descriptor promises (its digest is of this).
    layer_promised: Vec<u8>,
    /// What is served instead: the same length, one byte different (at the very end).
    layer_served: Vec<u8>,
    completed_uploads: AtomicUsize,
    aborted_uploads: AtomicUsize,
    manifests_pushed: AtomicUsize,
    /// Signalled whenever an upload ends, completed or aborted.
    upload_ended: Notify,
}

impl Fake {
    fn new() -> Self {
        let config =
            br#"{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[]}}"#
                .to_vec();
        let layer_promised: Vec<u8> = (0..LAYER_SIZE).map(|i| (i % 251) as u8).collect();
        let mut layer_served = layer_promised.clone();
        *layer_served.last_mut().unwrap() ^= 0xff;
        let descriptor = |media_type: &str, bytes: &[u8]| serde_json::json!({"mediaType": media_type, "digest": Digest::sha256_of(bytes).as_str(), "size": bytes.len()});
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", &config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", &layer_promised)],
        }))
        .unwrap();
        Self {
            manifest,
            config,
            layer_promised,
            layer_served,
            completed_uploads: AtomicUsize::new(0),
            aborted_uploads: AtomicUsize::new(0),
            manifests_pushed: AtomicUsize::new(0),
            upload_ended: Notify::new(),
        }
    }
}

async fn handle(State(fake): State<Arc<Fake>>, method: Method, uri: Uri, body: Body) -> Response {
    let path = uri.path();
    let digest_of = |bytes: &[u8]| Digest::sha256_of(bytes).to_string();
    if let Some(rest) = path.strip_prefix("/v2/src/app/") {
        let served = match rest.split_once('/') {
            Some(("manifests", d)) if d == digest_of(&fake.manifest) => Some(&fake.manifest),
            Some(("blobs", d)) if d == digest_of(&fake.config) => Some(&fake.config),
            Some(("blobs", d)) if d == digest_of(&fake.layer_promised) => Some(&fake.layer_served),
            _ => None,
        };
        return match served {
            Some(bytes) if *bytes == fake.manifest => (
                [(header::CONTENT_TYPE, "application/vnd.oci.image.manifest.v1+json")],
                bytes.clone(),
            )
                .into_response(),
            Some(bytes) => Bytes::from(bytes.clone()).into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        };
    }
    // Everything else is the mirror side: `/v2/mirror/<host>/src/app/…`.
    match method {
        Method::HEAD => StatusCode::NOT_FOUND.into_response(),
        Method::POST if path.ends_with("/blobs/uploads/") => (
            StatusCode::ACCEPTED,
            [(header::LOCATION, format!("{path}upload-1"))],
        )
            .into_response(),
        Method::PUT if path.contains("/blobs/uploads/") => {
            let mut stream = body.into_data_stream();
            let mut received = Vec::new();
            while let Some(chunk) = stream.next().await {
                match chunk {
                    Ok(chunk) => received.extend_from_slice(&chunk),
                    Err(_) => {
                        fake.aborted_uploads.fetch_add(1, Ordering::SeqCst);
                        fake.upload_ended.notify_waiters();
                        return StatusCode::BAD_REQUEST.into_response();
                    }
                }
            }
            let wanted = uri
                .query()
                .and_then(|q| q.split("digest=").nth(1))
                .unwrap_or_default();
            if wanted.replace("%3A", ":") != digest_of(&received) {
                return StatusCode::BAD_REQUEST.into_response();
            }
            fake.completed_uploads.fetch_add(1, Ordering::SeqCst);
            fake.upload_ended.notify_waiters();
            StatusCode::CREATED.into_response()
        }
        Method::PUT if path.contains("/manifests/") => {
            fake.manifests_pushed.fetch_add(1, Ordering::SeqCst);
            StatusCode::CREATED.into_response()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Serves `app` on loopback as a plain-HTTP registry; its address, and a copier into its
/// `mirror` prefix.
async fn serve(app: Router) -> (String, Copier) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let resolver = Resolver::new(ResolverConfig {
        insecure_registries: [addr.clone()].into(),
        ..ResolverConfig::default()
    })
    .unwrap();
    let config = CopierConfig::new(MirrorLocation::new(&addr, "mirror").unwrap());
    (addr, Copier::new(resolver, config, Credentials::anonymous()))
}

#[tokio::test]
async fn content_that_does_not_match_its_digest_never_completes_an_upload() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let fake = Arc::new(Fake::new());
    let app = Router::new().fallback(handle).with_state(fake.clone());
    let (addr, copier) = serve(app).await;
    let manifest_digest = Digest::sha256_of(&fake.manifest);
    let source = Reference::parse(&format!("{addr}/src/app@{manifest_digest}")).unwrap();

    let error = copier.copy(&source, &Credentials::anonymous()).await.unwrap_err();
    let CopyError::Verify {
        error: VerifyError::Digest { expected, actual },
        ..
    } = &error
    else {
        panic!("expected a digest verification error, got {error:?}");
    };
    assert_eq!(*expected, Digest::sha256_of(&fake.layer_promised));
    assert_eq!(*actual, Digest::sha256_of(&fake.layer_served));
    assert!(!error.is_transient());
    // The client gives up as soon as its body stream fails; the fake's handler may notice the
    // cut-off body a moment later.
    let ended =
        || fake.completed_uploads.load(Ordering::SeqCst) + fake.aborted_uploads.load(Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let notified = fake.upload_ended.notified();
            if ended() >= 2 {
                break;
            }
            notified.await;
        }
    })
    .await
    .expect("the mirror never saw the end of the layer's upload");
    assert_eq!(
        fake.completed_uploads.load(Ordering::SeqCst),
        1,
        "only the config arrived"
    );
    assert_eq!(
        fake.aborted_uploads.load(Ordering::SeqCst),
        1,
        "the mirror saw the bad layer's upload cut off before its end"
    );
    assert_eq!(
        fake.manifests_pushed.load(Ordering::SeqCst),
        0,
        "no manifest may reference it"
    );
}

/// A fake mirror's answers to `DELETE /v2/<repository>/manifests/<digest>`: `mirror/…/kept` had
/// the manifest (202), `mirror/…/gone` did not (404), `mirror/…/locked` does not allow deletes
/// (405 with Distribution's `UNSUPPORTED` error).
async fn deletes(
    State(seen): State<Arc<std::sync::Mutex<Vec<String>>>>,
    method: Method,
    uri: Uri,
) -> Response {
    seen.lock().unwrap().push(format!("{method} {}", uri.path()));
    match (method, uri.path()) {
        (Method::DELETE, path) if path.contains("/kept/manifests/") => StatusCode::ACCEPTED.into_response(),
        (Method::DELETE, path) if path.contains("/locked/manifests/") => (
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"errors":[{"code":"UNSUPPORTED","message":"The operation is unsupported."}]}"#,
        )
            .into_response(),
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

#[tokio::test]
async fn deleting_a_copy_says_whether_it_was_there_and_when_the_mirror_refuses() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let app = Router::new().fallback(deletes).with_state(seen.clone());
    let (addr, copier) = serve(app).await;
    let digest = Digest::sha256_of(b"manifest");
    let copy =
        |repository: &str| Reference::parse(&format!("{addr}/mirror/up_5000/{repository}@{digest}")).unwrap();

    assert_eq!(copier.delete(&copy("kept")).await.unwrap(), Deletion::Deleted);
    assert_eq!(copier.delete(&copy("gone")).await.unwrap(), Deletion::Absent);
    let refused = copier.delete(&copy("locked")).await.unwrap_err();
    assert!(matches!(refused, DeleteError::Unsupported { .. }), "{refused:?}");
    assert!(
        refused
            .to_string()
            .contains("REGISTRY_STORAGE_DELETE_ENABLED=true"),
        "{refused}"
    );
    assert_eq!(
        seen.lock().unwrap().clone(),
        [
            format!("DELETE /v2/mirror/up_5000/kept/manifests/{digest}"),
            format!("DELETE /v2/mirror/up_5000/gone/manifests/{digest}"),
            format!("DELETE /v2/mirror/up_5000/locked/manifests/{digest}"),
        ]
    );

    // Never anything outside the mirror's prefix, nor a tag: refused without a request.
    for outside in [
        format!("{addr}/elsewhere/app@{digest}"),
        format!("{addr}/mirror/up_5000/kept:1.0"),
        format!("upstream.example/mirror/app@{digest}"),
    ] {
        let refused = copier
            .delete(&Reference::parse(&outside).unwrap())
            .await
            .unwrap_err();
        assert!(
            matches!(refused, DeleteError::NotInMirror(_)),
            "{outside}: {refused:?}"
        );
    }
    assert_eq!(seen.lock().unwrap().len(), 3);
}

/// A mirror repository holding an index (`index`) of a plain image (`plain`) and a bundle
/// (`bundle`) whose ImagesLock lists `locked` (absent from this fake): what retention reads to
/// keep a copy another copy holds.
struct Held {
    manifests: std::collections::HashMap<String, Vec<u8>>,
    blobs: std::collections::HashMap<String, Vec<u8>>,
}

async fn held(State(held): State<Arc<Held>>, method: Method, uri: Uri) -> Response {
    let Some(rest) = uri.path().strip_prefix("/v2/mirror/up_5000/app/") else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let found = match rest.split_once('/') {
        Some(("manifests", d)) if method == Method::GET => held.manifests.get(d),
        Some(("blobs", d)) if method == Method::GET => held.blobs.get(d),
        _ => None,
    };
    match found {
        Some(bytes) => Bytes::from(bytes.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

#[tokio::test]
async fn what_a_copy_holds_is_read_from_the_mirror_through_indexes_and_bundle_locks() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let digest_of = |bytes: &[u8]| Digest::sha256_of(bytes).to_string();
    let descriptor = |media_type: &str, bytes: &[u8]| serde_json::json!({"mediaType": media_type, "digest": digest_of(bytes), "size": bytes.len()});
    let image = |config: &[u8], layer: &[u8]| {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar", layer)],
        }))
        .unwrap()
    };
    let plain_config = br#"{"config":{}}"#.to_vec();
    let plain_layer = b"plain layer".to_vec();
    let plain = image(&plain_config, &plain_layer);
    let locked = Digest::sha256_of(b"locked image");
    let lock = format!(
        "apiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\nimages:\n- image: registry.corp.com/other/img@{locked}\n"
    );
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(lock.len() as u64);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, ".imgpkg/images.yml", lock.as_bytes())
        .unwrap();
    let bundle_layer = builder.into_inner().unwrap();
    let bundle_config = br#"{"config":{"Labels":{"dev.carvel.imgpkg.bundle":""}}}"#.to_vec();
    let bundle = image(&bundle_config, &bundle_layer);
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            descriptor("application/vnd.oci.image.manifest.v1+json", &plain),
            descriptor("application/vnd.oci.image.manifest.v1+json", &bundle),
        ],
    }))
    .unwrap();
    let fake = Held {
        manifests: [&plain, &bundle, &index]
            .map(|m| (digest_of(m), m.clone()))
            .into(),
        blobs: [&plain_config, &plain_layer, &bundle_config, &bundle_layer]
            .map(|b| (digest_of(b), b.clone()))
            .into(),
    };
    let app = Router::new().fallback(held).with_state(Arc::new(fake));
    let (addr, copier) = serve(app).await;
    let copy = |digest: &str| Reference::parse(&format!("{addr}/mirror/up_5000/app@{digest}")).unwrap();
    let contents = |digest: String| {
        let copier = &copier;
        let location = copy(&digest);
        async move {
            let mut held: Vec<String> = copier
                .contents(&location)
                .await
                .unwrap()
                .iter()
                .map(ToString::to_string)
                .collect();
            held.sort();
            held
        }
    };

    let mut all = vec![digest_of(&plain), digest_of(&bundle), locked.to_string()];
    all.sort();
    assert_eq!(
        contents(digest_of(&index)).await,
        all,
        "the index, and the bundle's lock below it"
    );
    assert_eq!(contents(digest_of(&bundle)).await, [locked.to_string()]);
    assert!(
        contents(digest_of(&plain)).await.is_empty(),
        "a plain image holds no manifest"
    );
    assert!(
        contents(locked.to_string()).await.is_empty(),
        "absent: holds nothing"
    );
}

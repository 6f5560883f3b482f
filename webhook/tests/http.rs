//! The admission HTTP contract, in-process (no sockets): status codes for bad input, uid
//! round-trip, patches, warnings and metrics.

// Helpers outside #[test] fns are not covered by clippy.toml's allow-unwrap-in-tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, time::Duration};

use axum::body::Body;
use holdfast_webhook::{
    cluster::{Peer, StaticCluster},
    handler::{AdmissionState, Limits, router},
    metrics::Metrics,
};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use tower::ServiceExt;

mod support;

use holdfast_cache::testing::FakeSource;
use holdfast_registry::Digest;

const APP_CONFIG: &str = "registry.example/team/app-config:1.0.0";
const UID: &str = "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4";

fn state() -> (Arc<AdmissionState>, Arc<Metrics>) {
    state_with_deadline(Duration::from_secs(3))
}

fn state_with_deadline(deadline: Duration) -> (Arc<AdmissionState>, Arc<Metrics>) {
    // The Korifi app `app-guid`: its CFApp and the BuildWorkload its Image names.
    let meta = |name: &str, uid: &str, labels: Value| -> ObjectMeta {
        serde_json::from_value(json!({"name": name, "uid": uid, "labels": labels})).unwrap()
    };
    let cluster = StaticCluster {
        objects: vec![
            (
                Peer::CfApp,
                "space".into(),
                meta("app-guid", "cfapp-uid", json!({})),
            ),
            (
                Peer::BuildWorkload,
                "space".into(),
                meta(
                    "bw",
                    "bw-uid",
                    json!({"korifi.cloudfoundry.org/app-guid": "app-guid"}),
                ),
            ),
        ],
        ..Default::default()
    };
    let registry = FakeSource::with([(APP_CONFIG, Digest::sha256_of(b"config v1"))]);
    let context = support::context(cluster, registry);
    let metrics = Arc::new(Metrics::new(Some(context.cache().clone())));
    let state = AdmissionState {
        context,
        metrics: metrics.clone(),
        deadline,
    };
    (Arc::new(state), metrics)
}

fn review(group: &str, resource: &str, kind: &str, name: &str) -> Value {
    let mut metadata = json!({"name": name, "namespace": "space"});
    if kind == "Image" {
        // As Korifi creates it: owned by the BuildWorkload that built it.
        metadata["ownerReferences"] = json!([{"apiVersion": "korifi.cloudfoundry.org/v1alpha1", "kind": "BuildWorkload", "name": "bw", "uid": "bw-uid"}]);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": UID,
            "kind": {"group": group, "version": "v1alpha2", "kind": kind},
            "resource": {"group": group, "version": "v1alpha2", "resource": resource},
            "name": name, "namespace": "space", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:cf:korifi-controllers"},
            "object": {"apiVersion": format!("{group}/v1alpha2"), "kind": kind, "metadata": metadata},
            "oldObject": null, "dryRun": false
        }
    })
}

fn body_limit(body_bytes: usize) -> Limits {
    Limits {
        body_bytes,
        ..Limits::default()
    }
}

async fn post(
    path: &str,
    content_type: &str,
    body: Vec<u8>,
    limit: usize,
) -> (StatusCode, Value, Arc<Metrics>) {
    let (state, metrics) = state();
    let rsp = router(state, body_limit(limit))
        .oneshot(
            Request::post(path)
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = rsp.status();
    let bytes = rsp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        metrics,
    )
}

async fn post_json(path: &str, value: &Value) -> (StatusCode, Value, Arc<Metrics>) {
    post(
        path,
        "application/json",
        serde_json::to_vec(value).unwrap(),
        1 << 20,
    )
    .await
}

fn patch_of(response: &Value) -> Value {
    let bytes: Vec<u8> = serde_json::from_value(response["patch"].clone()).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn stamps_the_owner_and_round_trips_the_uid() {
    let (status, body, metrics) =
        post_json("/mutate", &review("kpack.io", "images", "Image", "app-guid")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    let rsp = &body["response"];
    assert_eq!(rsp["uid"], UID);
    assert_eq!(rsp["allowed"], true);
    assert_eq!(rsp["patchType"], "JSONPatch");
    assert_eq!(patch_of(rsp)[0]["path"], "/metadata/ownerReferences/-");
    assert_eq!(patch_of(rsp)[0]["value"]["uid"], "cfapp-uid");
    let text = metrics.encode().unwrap();
    assert!(
        text.contains(r#"holdfast_webhook_admission_requests_total{outcome="patched"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"rule="stamp-owners",operation="CREATE",result="patched""#),
        "{text}"
    );
}

#[tokio::test]
async fn an_image_without_an_app_is_admitted_unchanged() {
    let (status, body, _) = post_json("/mutate", &review("kpack.io", "images", "Image", "other")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response"]["allowed"], true);
    assert!(body["response"].get("patch").is_none());
}

#[tokio::test]
async fn an_unknown_resource_is_admitted_with_a_warning() {
    let (status, body, metrics) =
        post_json("/mutate", &review("example.com", "widgets", "Widget", "w")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response"]["allowed"], true);
    let warning = body["response"]["warnings"][0].as_str().unwrap();
    assert!(warning.contains("no rule for example.com/widgets"), "{warning}");
    assert!(metrics.encode().unwrap().contains(r#"rule="none""#));
}

#[tokio::test]
async fn malformed_json_is_a_400_with_the_reason() {
    let (status, body, metrics) = post(
        "/mutate",
        "application/json",
        b"{\"apiVersion\":".to_vec(),
        1 << 20,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"].as_str().unwrap().contains("not valid JSON"),
        "{body}"
    );
    assert!(
        metrics
            .encode()
            .unwrap()
            .contains(r#"holdfast_webhook_admission_requests_total{outcome="error"} 1"#)
    );
}

#[tokio::test]
async fn a_v1beta1_review_is_refused_by_name() {
    let mut v = review("kpack.io", "images", "Image", "app-guid");
    v["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let (status, body, _) = post_json("/validate", &v).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("admission.k8s.io/v1beta1"),
        "{body}"
    );
}

#[tokio::test]
async fn a_review_without_request_is_a_400() {
    let (status, body, _) = post_json(
        "/mutate",
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"], "AdmissionReview has no request");
}

#[tokio::test]
async fn a_non_json_body_is_a_415() {
    let (status, _, _) = post("/mutate", "text/plain", b"hello".to_vec(), 1 << 20).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn an_oversized_body_is_a_413() {
    let mut v = review("kpack.io", "images", "Image", "app-guid");
    v["request"]["object"]["metadata"]["annotations"] = json!({"big": "x".repeat(4096)});
    let (status, _, _) = post(
        "/mutate",
        "application/json",
        serde_json::to_vec(&v).unwrap(),
        1024,
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// A body still being sent holds its share of the in-flight budget: a second request past the
/// budget waits out the deadline and gets 503 (counted), and once the first is done the next
/// one is served.
#[tokio::test]
async fn requests_past_the_in_flight_budget_are_shed_until_room_comes_back() {
    let (state, metrics) = state_with_deadline(Duration::from_millis(200));
    let app = router(
        state,
        Limits {
            body_bytes: 64 * 1024,
            in_flight_bytes: 64 * 1024,
        },
    );
    // 40 KiB each (JSON takes trailing whitespace): two do not fit in 64 KiB.
    let mut body = serde_json::to_vec(&review("kpack.io", "images", "Image", "app-guid")).unwrap();
    body.resize(40 * 1024, b' ');
    let (sender, chunks) = futures::channel::mpsc::unbounded::<Result<bytes::Bytes, std::io::Error>>();
    sender.unbounded_send(Ok(body[..10].to_vec().into())).unwrap();
    let mut slow = Box::pin(
        app.clone().oneshot(
            Request::post("/mutate")
                .header("content-type", "application/json")
                .header("content-length", body.len())
                .body(Body::from_stream(chunks))
                .unwrap(),
        ),
    );
    // One poll: it takes its share of the budget and waits for the rest of its body.
    assert!(futures::poll!(&mut slow).is_pending());
    let send = |app: axum::Router| {
        let body = body.clone();
        async move {
            app.oneshot(
                Request::post("/mutate")
                    .header("content-type", "application/json")
                    .header("content-length", body.len())
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap()
            .status()
        }
    };
    assert_eq!(send(app.clone()).await, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        metrics
            .encode()
            .unwrap()
            .contains("holdfast_webhook_admission_shed_total 1")
    );
    sender.unbounded_send(Ok(body[10..].to_vec().into())).unwrap();
    drop(sender);
    assert_eq!(slow.await.unwrap().status(), StatusCode::OK);
    assert_eq!(send(app).await, StatusCode::OK);
}

#[tokio::test]
async fn other_paths_and_methods_are_refused() {
    let (state, _) = state();
    let app = router(state, body_limit(1 << 20));
    let rsp = app
        .clone()
        .oneshot(Request::get("/mutate").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(rsp.status(), StatusCode::METHOD_NOT_ALLOWED);
    let rsp = app
        .oneshot(Request::post("/other").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(rsp.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_app_fetch_tag_is_pinned_through_the_cache() {
    let mut v = review("kappctrl.k14s.io", "apps", "App", "app");
    v["request"]["object"]["spec"] = json!({"fetch": [
        {"image": {"url": APP_CONFIG}},
        {"git": {"url": "https://example.com/repo", "ref": "origin/main"}},
    ]});
    let (status, body, metrics) = post_json("/mutate", &v).await;
    assert_eq!(status, StatusCode::OK);
    let mut object = v["request"]["object"].clone();
    json_patch::patch(
        &mut object,
        &serde_json::from_value::<json_patch::Patch>(patch_of(&body["response"])).unwrap(),
    )
    .unwrap();
    let pinned = format!(
        "registry.example/team/app-config@{}",
        Digest::sha256_of(b"config v1")
    );
    assert_eq!(object["spec"]["fetch"][0]["image"]["url"], pinned.as_str());
    assert_eq!(
        object["spec"]["fetch"][1]["git"]["url"],
        "https://example.com/repo"
    );
    let original: Value = serde_json::from_str(
        object["metadata"]["annotations"]["holdfast.dev/original-refs"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(original["/spec/fetch/0/image/url"]["ref"], APP_CONFIG);
    let text = metrics.encode().unwrap();
    for line in [
        r#"rule="pin-fetch-refs",operation="CREATE",result="patched""#,
        r#"holdfast_webhook_digest_cache_lookups_total{result="miss"} 1"#,
        r#"holdfast_webhook_digest_cache_lookups_total{result="hit"} 0"#,
        "holdfast_webhook_registry_lookups_total 1",
        "holdfast_webhook_registry_errors_total 0",
        "holdfast_webhook_digest_cache_refused_total 0",
        "holdfast_webhook_digest_cache_entries 1",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[tokio::test]
async fn an_unresolvable_tag_is_admitted_unpinned_with_a_warning() {
    let mut v = review("kappctrl.k14s.io", "apps", "App", "app");
    v["request"]["object"]["spec"] =
        json!({"fetch": [{"image": {"url": "registry.example/team/missing:9.9.9"}}]});
    let (status, body, metrics) = post_json("/mutate", &v).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["response"]["allowed"], true);
    assert!(body["response"].get("patch").is_none());
    let warning = body["response"]["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("spec.fetch[0].image.url") && warning.contains("left unpinned"),
        "{warning}"
    );
    let text = metrics.encode().unwrap();
    for line in [
        "holdfast_webhook_registry_errors_total 1",
        "holdfast_webhook_digest_cache_entries 0",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

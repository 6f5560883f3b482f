//! A mocked API server for the reconcilers' unit tests, as kube-rs's controller-rs has it: a
//! [`Client`] over a tower-test service, and the test's end of that service, which takes each
//! request a reconcile sends, asserts its method, path, query and body, and answers it. No
//! control plane: `cargo test -p holdfast-controller` checks the exact writes.

use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use kube::{Client, client::Body};
use serde_json::Value;
use tower_test::mock::{Handle, SendResponse};

/// How long the mock waits for a request the test expects (the reconciler is in-process: a
/// request it sends arrives at once, so this only bounds a test that would otherwise hang).
const PATIENCE: Duration = Duration::from_secs(5);

/// The test's end of the mocked API server.
pub(crate) struct ApiServer(Handle<Request<Body>, Response<Body>>);

/// A client whose every request goes to the returned [`ApiServer`].
pub(crate) fn mock() -> (Client, ApiServer) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, "default"), ApiServer(handle))
}

/// A request taken from the mock, to answer.
pub(crate) struct Answer(SendResponse<Response<Body>>);

impl Answer {
    /// Answers with `status` and the JSON `body`.
    pub(crate) fn json(self, status: StatusCode, body: &Value) {
        let response = Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string().into_bytes()));
        match response {
            Ok(response) => self.0.send_response(response),
            Err(error) => panic!("building the mock response: {error}"),
        }
    }

    /// Answers 200 with `body`.
    pub(crate) fn ok(self, body: &Value) {
        self.json(StatusCode::OK, body);
    }
}

impl ApiServer {
    /// Takes the next request, asserts that it is `method` on `path_and_query` (exactly: the
    /// query parameters as the client writes them), and returns its JSON body (`Null` when it
    /// has none) with the means to answer it.
    pub(crate) async fn expect(&mut self, method: Method, path_and_query: &str) -> (Value, Answer) {
        let (request, send) = match tokio::time::timeout(PATIENCE, self.0.next_request()).await {
            Ok(Some(taken)) => taken,
            Ok(None) => panic!("expected {method} {path_and_query}; the client sent nothing more"),
            Err(_) => panic!("expected {method} {path_and_query}; nothing came within {PATIENCE:?}"),
        };
        let (parts, body) = request.into_parts();
        let sent = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default();
        assert_eq!(
            (parts.method.clone(), sent.as_str()),
            (method, path_and_query),
            "the request sent"
        );
        let bytes = match body.collect_bytes().await {
            Ok(bytes) => bytes,
            Err(error) => panic!("reading the body of {} {sent}: {error}", parts.method),
        };
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            match serde_json::from_slice(&bytes) {
                Ok(body) => body,
                Err(error) => panic!("the body of {} {sent} is not JSON: {error}", parts.method),
            }
        };
        (body, Answer(send))
    }

    /// Asserts that the client sends nothing more: the next thing the mock sees is the last
    /// clone of the client going away (drop the reconciler's context before calling this).
    pub(crate) async fn done(mut self) {
        match tokio::time::timeout(PATIENCE, self.0.next_request()).await {
            Ok(None) => {}
            Ok(Some((request, _))) => {
                panic!("unexpected request: {} {}", request.method(), request.uri())
            }
            Err(_) => panic!("the client was not dropped within {PATIENCE:?}: drop the reconciler's context"),
        }
    }
}

/// A Kubernetes `Status` as the API server answers a failed request.
pub(crate) fn status(code: u16, reason: &str, message: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

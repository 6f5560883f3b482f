//! The HTTP side of admission: decode, route, time, log, encode. The rules do the deciding.

use std::{
    convert::Infallible,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, FromRequestParts, State},
    http::{HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
    routing::post,
};
use bytes::Bytes;
use kube::core::admission::Operation;
use serde_json::json;

use crate::{
    decision::{Outcome, Verdict},
    metrics::Metrics,
    review::{self, Request},
    rules::{Family, MUTATE_PATH, Rule, RuleContext, VALIDATE_PATH},
};

/// The API server sends at most two objects of at most 3 MiB each (object and oldObject).
pub const DEFAULT_BODY_LIMIT: usize = 7 * 1024 * 1024;
/// Well under the manifests' `timeoutSeconds` (5 s), so holdfast answers before the API server gives up.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3);

pub struct AdmissionState {
    pub context: RuleContext,
    pub metrics: Arc<Metrics>,
    pub deadline: Duration,
}

/// The admission routes, with a body limit (oversized bodies get 413).
pub fn router(state: Arc<AdmissionState>, body_limit: usize) -> Router {
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .route(VALIDATE_PATH, post(validate))
        // One `layer` call for both (outermost first): each call wraps every route in one more
        // boxed service, cloned and boxed again on every request.
        .layer((
            tower_http::catch_panic::CatchPanicLayer::custom(panic_response),
            DefaultBodyLimit::max(body_limit),
        ))
        .with_state(state)
}

async fn mutate(
    State(state): State<Arc<AdmissionState>>,
    content_type: ContentType,
    body: Bytes,
) -> Response {
    admit(Family::Mutating, &state, content_type, body).await
}

async fn validate(
    State(state): State<Arc<AdmissionState>>,
    content_type: ContentType,
    body: Bytes,
) -> Response {
    admit(Family::Validating, &state, content_type, body).await
}

/// The request's `Content-Type`, the only header admission reads: extracting it alone spares
/// cloning the whole `HeaderMap` on every request.
struct ContentType(Option<HeaderValue>);

impl<S: Send + Sync> FromRequestParts<S> for ContentType {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(parts.headers.get(header::CONTENT_TYPE).cloned()))
    }
}

async fn admit(family: Family, state: &AdmissionState, content_type: ContentType, body: Bytes) -> Response {
    let started = Instant::now();
    let content_type = content_type.0;
    if !is_json(content_type.as_ref()) {
        state.metrics.count(Outcome::Error);
        tracing::warn!(content_type = ?content_type.as_ref(), "rejected a non-JSON admission body");
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "admission requests must be application/json",
        );
    }
    let request = match review::decode(&body) {
        Ok(request) => request,
        Err(e) => {
            state.metrics.count(Outcome::Error);
            tracing::warn!(error = %e, bytes = body.len(), "rejected an undecodable admission body");
            return error(StatusCode::BAD_REQUEST, &e.to_string());
        }
    };
    let operation = operation_name(&request.operation);
    let (rule, verdict) = match Rule::route(family, &request) {
        Some(rule) => (rule.name(), decide(rule, &request, state).await),
        None => ("none", unrouted(&request)),
    };
    let outcome = verdict.outcome();
    let elapsed = started.elapsed();
    state
        .metrics
        .observe(rule, operation, outcome, elapsed.as_secs_f64());
    tracing::info!(
        uid = &*request.uid,
        kind = &*request.kind.kind,
        namespace = request.namespace.as_deref().unwrap_or(""),
        name = &*request.name,
        operation,
        rule,
        decision = outcome.as_str(),
        warnings = verdict.warnings.len(),
        dry_run = request.dry_run,
        latency_us = elapsed.as_micros() as u64,
        "admission"
    );
    match review::encode(&request, verdict) {
        Ok(body) => (
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response(),
        // What axum's `Json` answers when serialising fails (it cannot for these types).
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Runs a rule within the deadline. Past it, holdfast admits unchanged: the webhook must never
/// be what blocks the cluster, and the controller catches up on what it let through.
async fn decide(rule: Rule, request: &Request<'_>, state: &AdmissionState) -> Verdict {
    let evaluation = rule.evaluate(request, &state.context);
    match tokio::time::timeout(state.deadline, evaluation).await {
        Ok(verdict) => verdict,
        Err(_) => {
            tracing::warn!(uid = %request.uid, rule = rule.name(), deadline_ms = state.deadline.as_millis() as u64, "deadline exceeded; admitting unchanged");
            Verdict::allow().with_warning(format!(
                "holdfast: {} did not finish within {:?}; admitted unchanged",
                rule.name(),
                state.deadline
            ))
        }
    }
}

/// A request for a kind holdfast has no rule for means the webhook configuration is broader than
/// the code: admit, and say so where an operator will see it.
fn unrouted(request: &Request<'_>) -> Verdict {
    let r = &request.resource;
    tracing::warn!(group = %r.group, resource = %r.resource, subresource = ?request.sub_resource, "no rule for this resource; check the webhook configuration's rules");
    Verdict::allow().with_warning(format!(
        "holdfast has no rule for {}/{}; admitted unchanged",
        if r.group.is_empty() { "core" } else { &*r.group },
        r.resource
    ))
}

/// The operation as the API server spells it, for the `operation` label and log field.
fn operation_name(operation: &Operation) -> &'static str {
    match operation {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

fn is_json(content_type: Option<&HeaderValue>) -> bool {
    content_type.and_then(|v| v.to_str().ok()).is_some_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
    })
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": message}))).into_response()
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!(
        "an admission handler panicked; answered 500 (the API server applies the failure policy)"
    );
    error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
}

//! The HTTP side of admission: decode, route, time, log, encode. The rules do the deciding.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use bytes::Bytes;
use kube::core::{DynamicObject, admission::AdmissionRequest};
use serde_json::json;

use crate::{
    decision::{Outcome, Verdict},
    metrics::Metrics,
    review,
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
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

async fn mutate(State(state): State<Arc<AdmissionState>>, headers: HeaderMap, body: Bytes) -> Response {
    admit(Family::Mutating, &state, &headers, body).await
}

async fn validate(State(state): State<Arc<AdmissionState>>, headers: HeaderMap, body: Bytes) -> Response {
    admit(Family::Validating, &state, &headers, body).await
}

async fn admit(family: Family, state: &AdmissionState, headers: &HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    if !is_json(headers) {
        state.metrics.count(Outcome::Error);
        tracing::warn!(content_type = ?headers.get(header::CONTENT_TYPE), "rejected a non-JSON admission body");
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
    let operation = format!("{:?}", request.operation).to_uppercase();
    let (rule, verdict) = match Rule::route(family, &request) {
        Some(rule) => (rule.name(), decide(rule, &request, state).await),
        None => ("none", unrouted(&request)),
    };
    let outcome = verdict.outcome();
    let elapsed = started.elapsed();
    state
        .metrics
        .observe(rule, &operation, outcome, elapsed.as_secs_f64());
    tracing::info!(
        uid = %request.uid,
        kind = %request.kind.kind,
        namespace = request.namespace.as_deref().unwrap_or(""),
        name = %request.name,
        operation = %operation,
        rule,
        decision = outcome.as_str(),
        warnings = verdict.warnings.len(),
        dry_run = request.dry_run,
        latency_us = elapsed.as_micros() as u64,
        "admission"
    );
    Json(review::respond(&request, verdict)).into_response()
}

/// Runs a rule within the deadline. Past it, holdfast admits unchanged: the webhook must never
/// be what blocks the cluster, and the controller catches up on what it let through.
async fn decide(rule: Rule, request: &AdmissionRequest<DynamicObject>, state: &AdmissionState) -> Verdict {
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
fn unrouted(request: &AdmissionRequest<DynamicObject>) -> Verdict {
    let r = &request.resource;
    tracing::warn!(group = %r.group, resource = %r.resource, subresource = ?request.sub_resource, "no rule for this resource; check the webhook configuration's rules");
    Verdict::allow().with_warning(format!(
        "holdfast has no rule for {}/{}; admitted unchanged",
        if r.group.is_empty() {
            "core"
        } else {
            r.group.as_str()
        },
        r.resource
    ))
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
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

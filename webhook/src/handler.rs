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
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::post,
};
use bytes::Bytes;
use kube::core::admission::Operation;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::{
    decision::{Outcome, Verdict},
    metrics::Metrics,
    review::{self, Request},
    rules::{Family, MUTATE_PATH, Rule, RuleContext, VALIDATE_PATH},
};

/// The largest review of the kinds holdfast is called for: an UPDATE carries two objects of at
/// most etcd's 1.5 MiB each (object and oldObject), a CREATE one of at most the API server's
/// 3 MiB request body; 4 MiB holds either with the review around it. A larger one could not be
/// stored anyway; it gets 413, and the API server applies the webhook's failure policy.
pub const DEFAULT_BODY_LIMIT: usize = 4 * 1024 * 1024;
/// Review bodies being read or decided at once, in bytes (as their `Content-Length` says, or
/// the body limit when they say nothing): four reviews of the largest size, thousands of
/// ordinary ones. A decoded review takes a few times its bytes, so this bounds the memory
/// admission can take whatever a client on the port sends.
pub const DEFAULT_IN_FLIGHT_BYTES: usize = 16 * 1024 * 1024;
/// Well under the manifests' `timeoutSeconds` (5 s), so holdfast answers before the API server gives up.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(3);

pub struct AdmissionState {
    pub context: RuleContext,
    pub metrics: Arc<Metrics>,
    pub deadline: Duration,
}

/// What one replica spends on the bodies it is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest body accepted; larger ones get 413.
    pub body_bytes: usize,
    /// Bytes of bodies in flight at once (see [`DEFAULT_IN_FLIGHT_BYTES`]); a request waits for
    /// room up to the deadline, then gets 503 (the API server applies the failure policy). At
    /// least `body_bytes`, so the largest body can always be served.
    pub in_flight_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            body_bytes: DEFAULT_BODY_LIMIT,
            in_flight_bytes: DEFAULT_IN_FLIGHT_BYTES,
        }
    }
}

/// The in-flight byte budget, in KiB permits.
struct Budget {
    permits: Semaphore,
    body_bytes: usize,
    wait: Duration,
    metrics: Arc<Metrics>,
}

/// The admission routes, with a body limit (oversized bodies get 413) and the in-flight
/// budget (requests past it wait, then get 503).
pub fn router(state: Arc<AdmissionState>, limits: Limits) -> Router {
    let budget = Arc::new(Budget {
        permits: Semaphore::new(kib(limits.in_flight_bytes.max(limits.body_bytes))),
        body_bytes: limits.body_bytes,
        wait: state.deadline,
        metrics: state.metrics.clone(),
    });
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .route(VALIDATE_PATH, post(validate))
        // One `layer` call for all (outermost first): each call wraps every route in one more
        // boxed service, cloned and boxed again on every request.
        .layer((
            tower_http::catch_panic::CatchPanicLayer::custom(panic_response),
            middleware::from_fn_with_state(budget, reserve),
            DefaultBodyLimit::max(limits.body_bytes),
        ))
        .with_state(state)
}

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024).clamp(1, Semaphore::MAX_PERMITS)
}

/// How long a request waited for its share of the in-flight budget: it counts against the
/// deadline, so that waiting and deciding together stay within it.
#[derive(Debug, Clone, Copy)]
struct Waited(Duration);

/// Holds the request's share of the in-flight budget until its answer is written, before its
/// body is read. Taken at once while there is room (no timer on the common path); else waited
/// for up to the deadline, and the wait recorded on the request ([`Waited`]).
async fn reserve(
    State(budget): State<Arc<Budget>>,
    mut request: axum::extract::Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(budget.body_bytes)
        .min(budget.body_bytes);
    let share = u32::try_from(kib(declared)).unwrap_or(u32::MAX);
    let held = match budget.permits.try_acquire_many(share) {
        Ok(held) => held,
        Err(_) => {
            let queued = Instant::now();
            match tokio::time::timeout(budget.wait, budget.permits.acquire_many(share)).await {
                Ok(Ok(held)) => {
                    request.extensions_mut().insert(Waited(queued.elapsed()));
                    held
                }
                _ => return shed(&budget, declared),
            }
        }
    };
    let response = next.run(request).await;
    drop(held);
    response
}

/// The answer past the budget: 503 (the API server applies the failure policy), counted.
fn shed(budget: &Budget, declared: usize) -> Response {
    budget.metrics.count(Outcome::Error);
    budget.metrics.shed();
    tracing::warn!(
        bytes = declared,
        wait_ms = budget.wait.as_millis() as u64,
        "admission bodies in flight at their budget; answered 503"
    );
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "holdfast is at its in-flight review budget; retry",
    )
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

/// What admission reads of the request besides its body: the `Content-Type` (extracting it
/// alone spares cloning the whole `HeaderMap` on every request) and how long the request
/// waited for the in-flight budget ([`Waited`]).
struct ContentType(Option<HeaderValue>, Duration);

impl<S: Send + Sync> FromRequestParts<S> for ContentType {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let waited = parts.extensions.get::<Waited>().map_or(Duration::ZERO, |w| w.0);
        Ok(Self(parts.headers.get(header::CONTENT_TYPE).cloned(), waited))
    }
}

async fn admit(family: Family, state: &AdmissionState, content_type: ContentType, body: Bytes) -> Response {
    let started = Instant::now();
    let ContentType(content_type, waited) = content_type;
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
        Some(rule) => (
            rule.name(),
            decide(rule, &request, state, state.deadline.saturating_sub(waited)).await,
        ),
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

/// Runs a rule within what is left of the deadline (`left`). Past it, holdfast admits unchanged:
/// the webhook must never be what blocks the cluster, and the controller catches up on what it
/// let through.
async fn decide(rule: Rule, request: &Request<'_>, state: &AdmissionState, left: Duration) -> Verdict {
    let evaluation = rule.evaluate(request, &state.context);
    match tokio::time::timeout(left, evaluation).await {
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

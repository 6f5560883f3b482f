//! The HTTP side of admission: decode, route, time, log, encode. The rules do the deciding.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{DefaultBodyLimit, FromRequest, State},
    http::{HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
    routing::post,
};
use bytes::Bytes;
use kube::core::admission::Operation;
use serde_json::json;
use tokio::sync::{Semaphore, SemaphorePermit};

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
}

/// What the routes share: the admission state and the budget.
struct Served {
    admission: Arc<AdmissionState>,
    budget: Budget,
}

/// The admission routes, with a body limit (oversized bodies get 413) and the in-flight
/// budget (requests past it wait, then get 503). The budget is taken by an extractor
/// ([`Admission`]), not a middleware: it runs before the body is read all the same, without a
/// boxed layer around every request (2.3 k instructions an admission, `make instructions`).
pub fn router(state: Arc<AdmissionState>, limits: Limits) -> Router {
    let served = Arc::new(Served {
        budget: Budget {
            permits: Semaphore::new(kib(limits.in_flight_bytes.max(limits.body_bytes))),
            body_bytes: limits.body_bytes,
            wait: state.deadline,
        },
        admission: state,
    });
    Router::new()
        .route(MUTATE_PATH, post(mutate))
        .route(VALIDATE_PATH, post(validate))
        // One `layer` call for all (outermost first): each call wraps every route in one more
        // boxed service, cloned and boxed again on every request.
        .layer((
            tower_http::catch_panic::CatchPanicLayer::custom(panic_response),
            DefaultBodyLimit::max(limits.body_bytes),
        ))
        .with_state(served)
}

fn kib(bytes: usize) -> usize {
    bytes.div_ceil(1024).clamp(1, Semaphore::MAX_PERMITS)
}

/// What admission reads of the request besides its body, taken before the body is read: its
/// share of the in-flight budget, held until the answer is built (taken at once while there is
/// room, no timer on the common path; else waited for up to the deadline), how long it waited
/// (it counts against the deadline, so waiting and deciding together stay within it), and the
/// `Content-Type` (extracting it alone spares cloning the whole `HeaderMap`).
struct Admission<'a> {
    content_type: Option<HeaderValue>,
    waited: Duration,
    _held: SemaphorePermit<'a>,
}

/// Takes `parts`' share of `budget` ([`Admission`]); past the budget, the 503 to answer.
async fn reserve<'a>(
    budget: &'a Budget,
    metrics: &Metrics,
    parts: &Parts,
) -> Result<Admission<'a>, Response> {
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .unwrap_or(budget.body_bytes)
        .min(budget.body_bytes);
    let share = u32::try_from(kib(declared)).unwrap_or(u32::MAX);
    let (held, waited) = match budget.permits.try_acquire_many(share) {
        Ok(held) => (held, Duration::ZERO),
        Err(_) => {
            let queued = Instant::now();
            match tokio::time::timeout(budget.wait, budget.permits.acquire_many(share)).await {
                Ok(Ok(held)) => (held, queued.elapsed()),
                _ => return Err(shed(budget, metrics, declared)),
            }
        }
    };
    Ok(Admission {
        content_type: parts.headers.get(header::CONTENT_TYPE).cloned(),
        waited,
        _held: held,
    })
}

/// The answer past the budget: 503 (the API server applies the failure policy), counted.
fn shed(budget: &Budget, metrics: &Metrics, declared: usize) -> Response {
    metrics.count(Outcome::Error);
    metrics.shed();
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

async fn mutate(State(served): State<Arc<Served>>, request: axum::extract::Request) -> Response {
    serve(Family::Mutating, &served, request).await
}

async fn validate(State(served): State<Arc<Served>>, request: axum::extract::Request) -> Response {
    serve(Family::Validating, &served, request).await
}

/// The budget first, then the body (within the body limit: 413 past it), then [`admit`].
async fn serve(family: Family, served: &Served, request: axum::extract::Request) -> Response {
    let state = &served.admission;
    let (parts, body) = request.into_parts();
    let admission = match reserve(&served.budget, &state.metrics, &parts).await {
        Ok(admission) => admission,
        Err(shed) => return shed,
    };
    let body = match Bytes::from_request(axum::extract::Request::from_parts(parts, body), &()).await {
        Ok(body) => body,
        Err(rejection) => return rejection.into_response(),
    };
    admit(family, state, admission, body).await
}

async fn admit(family: Family, state: &AdmissionState, admission: Admission<'_>, body: Bytes) -> Response {
    let started = Instant::now();
    let (content_type, waited) = (&admission.content_type, admission.waited);
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

//! The route handlers: authentication and permission (every request, replays included), the
//! per-principal rate limit, header and body validation (nothing touches the database before
//! they pass, so a refused request never consumes its key), and the mapping of each
//! [`ClaimOutcome`] to its HTTP answer.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use governor::clock::Clock;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use uuid::Uuid;

use super::problem::{Problem, ProblemType, PROBLEM_JSON};
use super::run_to_end::RunToEnd;
use super::state::{ApiState, Live};
use crate::auth::{Approval, Permission, Principal};
use crate::claim::{self, Answered, ClaimError, ClaimOutcome, ClaimRequest, Decision};
use crate::config::SUPPORTED_API_VERSIONS;
use crate::fingerprint::Fingerprint;
use crate::lookup::{self, LookupError};
use crate::order_request::{self, OrderRequestError};

/// `Idempotency-Key`.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// `Idempotent-Replayed: true` marks a stored answer.
pub const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");
/// `Api-Version`.
pub const API_VERSION: HeaderName = HeaderName::from_static("api-version");

/// Longest idempotency key accepted.
pub const MAX_KEY_LEN: usize = 255;

/// `Retry-After` for 409 request-in-progress: the owner's transaction is short.
const RETRY_IN_PROGRESS_SECS: u64 = 1;
/// `Retry-After` for 503s.
const RETRY_UNAVAILABLE_SECS: u64 = 2;
/// `Retry-After` when the database is out of disk, memory or connections (SQLSTATE class 53):
/// an operator usually has to act, so retries come less often than for a blip.
const RETRY_RESOURCES_SECS: u64 = 10;

/// The claim outcome label, put in the response's extensions for the request log line when the
/// request came through the router (the API's own dispatch takes it from [`Labelled`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct OutcomeLabel(pub &'static str);

/// A response and the claim outcome it reports (the request log line's and the span's
/// `outcome`).
pub(crate) struct Labelled {
    pub(crate) response: Response,
    pub(crate) outcome: &'static str,
}

// ---- authentication, permission, rate limit ----------------------------------------------------

/// The bearer token of the request, if exactly one well-formed `Authorization: Bearer` is present.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.to_str().ok()?.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Authenticates, checks `permission` and the principal's rate limit.
fn admit(
    live: &Live,
    headers: &HeaderMap,
    permission: Permission,
) -> Result<Arc<Principal>, Problem> {
    let principal = bearer(headers)
        .and_then(|token| live.tokens.authenticate(token))
        .ok_or_else(|| {
            Problem::new(
                ProblemType::Unauthenticated,
                "Send `Authorization: Bearer <token>` with a token listed in the tokens file.",
            )
        })?;
    if !principal.may(permission) {
        return Err(Problem::new(
            ProblemType::PermissionDenied,
            format!(
                "This token does not have the {} permission.",
                permission.name()
            ),
        ));
    }
    if let Err(not_until) = live.limiter.check_key(principal.rate_key()) {
        let wait = not_until.wait_time_from(live.limiter.clock().now());
        let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        return Err(Problem::new(
            ProblemType::RateLimited,
            format!(
                "More than {} requests per second (burst {}) for this principal.",
                live.rate.0, live.rate.1
            ),
        )
        .retry_after(seconds.max(1)));
    }
    Ok(principal)
}

// ---- headers and body ---------------------------------------------------------------------------

/// The idempotency key: exactly one header, 1-255 visible ASCII characters (0x21-0x7E).
fn check_key(value: &[u8]) -> Result<String, Problem> {
    let invalid = |detail: &str| Problem::new(ProblemType::InvalidIdempotencyKey, detail);
    if value.is_empty() || value.len() > MAX_KEY_LEN {
        return Err(invalid(
            "The idempotency key must be 1 to 255 characters long.",
        ));
    }
    if !value.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(invalid(
            "The idempotency key may contain only visible ASCII characters (0x21-0x7E): no \
             spaces, control characters or non-ASCII.",
        ));
    }
    String::from_utf8(value.to_vec()).map_err(|_| invalid("The idempotency key is not ASCII."))
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, Problem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Err(Problem::new(
            ProblemType::InvalidIdempotencyKey,
            "The Idempotency-Key header is required: one key per business intent, reused on \
             every retry of it.",
        ));
    };
    if values.next().is_some() {
        return Err(Problem::new(
            ProblemType::InvalidIdempotencyKey,
            "Send exactly one Idempotency-Key header.",
        ));
    }
    check_key(value.as_bytes())
}

/// The request's `Api-Version`, or the configured default: borrowed either way (it is only
/// hashed into the fingerprint).
fn api_version<'a>(headers: &HeaderMap, live: &'a Live) -> Result<&'a str, Problem> {
    let mut values = headers.get_all(API_VERSION).iter();
    let Some(value) = values.next() else {
        return Ok(&live.default_api_version);
    };
    let unsupported = || {
        Problem::new(
            ProblemType::UnsupportedApiVersion,
            format!(
                "Supported Api-Version values: {}.",
                SUPPORTED_API_VERSIONS.join(", ")
            ),
        )
        .with("supported_versions", SUPPORTED_API_VERSIONS)
    };
    if values.next().is_some() {
        return Err(unsupported());
    }
    let version = value.to_str().map_err(|_| unsupported())?;
    SUPPORTED_API_VERSIONS
        .iter()
        .find(|v| **v == version)
        .copied()
        .ok_or_else(unsupported)
}

/// `application/json`, optionally with `charset=utf-8` (any case); nothing else.
fn check_content_type(headers: &HeaderMap) -> Result<(), Problem> {
    let refuse = || {
        Problem::new(
            ProblemType::UnsupportedMediaType,
            "Send the body as `Content-Type: application/json` (charset, if given, utf-8).",
        )
    };
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return Err(refuse());
    };
    let text = value.to_str().map_err(|_| refuse())?;
    let mut parts = text.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(refuse());
    }
    for parameter in parts {
        let (name, value) = parameter.split_once('=').ok_or_else(refuse)?;
        if name.trim().eq_ignore_ascii_case("charset")
            && !value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        {
            return Err(refuse());
        }
    }
    Ok(())
}

fn too_large(limit: usize) -> Problem {
    Problem::new(
        ProblemType::PayloadTooLarge,
        format!("The body may be at most {limit} bytes."),
    )
    .with("max_body_bytes", limit)
}

/// Reads the body, at most `limit` bytes: refused early by `Content-Length`, and while streaming
/// when there is none (chunked). A body that does not arrive within `timeout` is refused too,
/// so a half-sent request cannot hold its connection.
async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, Problem> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large(limit));
    }
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large(limit)),
        Ok(Err(_)) => Err(Problem::new(
            ProblemType::MalformedJson,
            "The request body could not be read completely.",
        )),
        Err(_) => Err(Problem::new(
            ProblemType::MalformedJson,
            format!(
                "The request body did not arrive within {} (api.header_read_timeout).",
                humantime::format_duration(timeout)
            ),
        )
        .close_connection()),
    }
}

/// Everything a POST is checked for before the database is touched, in this order: key, version,
/// media type, size, JSON, fields; then the approval limit decides what owning the key means.
async fn prepare_claim(
    live: &Live,
    principal: &Principal,
    headers: &HeaderMap,
    body: Body,
) -> Result<ClaimRequest, Problem> {
    let key = idempotency_key(headers)?;
    let version = api_version(headers, live)?;
    check_content_type(headers)?;
    let bytes = read_body(headers, body, live.max_body_bytes, live.body_read_timeout).await?;
    let order = order_request::parse_order(&bytes, &live.defaults).map_err(|e| match e {
        OrderRequestError::Malformed(detail) => Problem::new(ProblemType::MalformedJson, detail),
        OrderRequestError::Invalid(errors) => {
            let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
            let detail = format!("Invalid fields: {}.", fields.join(", "));
            let errors: Vec<serde_json::Value> = errors
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "field": e.field,
                        "pointer": format!("#/{}", e.field.replace('~', "~0").replace('/', "~1")),
                        "detail": e.detail,
                    })
                })
                .collect();
            Problem::new(ProblemType::ValidationFailed, detail).with("errors", errors)
        }
    })?;
    let fingerprint = Fingerprint::of(&order, version).map_err(|e| {
        tracing::error!(error = %e, "fingerprint");
        Problem::new(
            ProblemType::InternalError,
            "The request could not be fingerprinted.",
        )
    })?;
    let decision = match principal.approve(order.amount_minor, order.currency) {
        Approval::Approved => Decision::Create,
        Approval::Exceeded { limit_minor } => {
            let currency = order.currency;
            let detail = match limit_minor {
                Some(limit) => format!(
                    "The amount {} {currency} exceeds your approval limit of {} {currency}. This \
                     refusal is the stored outcome of this idempotency key.",
                    currency.format(order.amount_minor),
                    currency.format(limit),
                ),
                None => format!(
                    "You have no approval limit in {currency}, so no amount in it can be \
                     approved. This refusal is the stored outcome of this idempotency key."
                ),
            };
            let problem = Problem::new(ProblemType::ApprovalLimitExceeded, detail);
            Decision::Reject {
                status: problem.kind.status(),
                body: problem.to_json(),
            }
        }
    };
    Ok(ClaimRequest {
        tenant: principal.tenant.clone(),
        principal: principal.principal.clone(),
        key,
        fingerprint,
        order,
        decision,
    })
}

// ---- responses ---------------------------------------------------------------------------------

fn order_url(order_id: Uuid) -> String {
    format!("/v1/orders/{order_id}")
}

/// `Location: /v1/orders/{order_id}`, written in place: a header value is a copy of its text, so
/// making the text a `String` first would allocate twice per created or replayed order.
fn order_location(order_id: Uuid) -> Option<HeaderValue> {
    const PREFIX: &[u8] = b"/v1/orders/";
    let mut text = [0u8; PREFIX.len() + uuid::fmt::Hyphenated::LENGTH];
    text[..PREFIX.len()].copy_from_slice(PREFIX);
    order_id
        .hyphenated()
        .encode_lower(&mut text[PREFIX.len()..]);
    HeaderValue::from_bytes(&text).ok()
}

/// A stored (or freshly stored) body sent exactly as the database returned it.
fn stored(status: u16, body: String, order_id: Option<Uuid>, replayed: bool) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let content_type = if status.is_success() {
        "application/json"
    } else {
        PROBLEM_JSON
    };
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(location) = order_id.and_then(order_location) {
        headers.insert(header::LOCATION, location);
    }
    if replayed {
        headers.insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    response
}

fn outcome_response(outcome: ClaimOutcome) -> Response {
    match outcome {
        ClaimOutcome::Created { order_id, body } => stored(201, body, Some(order_id), false),
        ClaimOutcome::Rejected { status, body } => stored(status, body, None, false),
        ClaimOutcome::Replayed {
            status,
            body,
            order_id,
        } => stored(status, body, order_id, true),
        ClaimOutcome::DuplicateRequestSameOrder { order_id, body } => {
            stored(200, body, Some(order_id), true)
        }
        ClaimOutcome::KeyReused => Problem::new(
            ProblemType::IdempotencyKeyReused,
            "This idempotency key was first used for a request with different business \
             parameters. A new purchase needs a new key.",
        )
        .into_response(),
        ClaimOutcome::Expired { order_id } => {
            let mut problem = Problem::new(
                ProblemType::ReplayWindowExpired,
                "The stored response for this idempotency key is past its replay window and is \
                 no longer kept. The request was not executed again; look up the business object \
                 instead.",
            );
            if let Some(id) = order_id {
                problem = problem
                    .with("order_id", id.to_string())
                    .with("order_url", order_url(id));
            }
            let mut response = problem.into_response();
            // The first answer's Location again: where the business object is to be looked up.
            if let Some(location) = order_id.and_then(order_location) {
                response.headers_mut().insert(header::LOCATION, location);
            }
            response
        }
        ClaimOutcome::InProgress => Problem::new(
            ProblemType::RequestInProgress,
            "Another request with this idempotency key (or for this request_id) is still in \
             progress; its outcome is pending. Retry with the same Idempotency-Key.",
        )
        .retry_after(RETRY_IN_PROGRESS_SECS)
        .into_response(),
        ClaimOutcome::DuplicateRequestConflict => Problem::new(
            ProblemType::DuplicateRequestId,
            "This request_id already has an order with different parameters or another owner. \
             Nothing was created, and this idempotency key was not recorded.",
        )
        .into_response(),
    }
}

/// 409 for a request refused by the per-key admission ([`super::key_gate`]): the same answer a
/// waiter gets when the owner outlasts `api.claim_lock_timeout`.
fn key_busy() -> Problem {
    Problem::new(
        ProblemType::RequestInProgress,
        "Other requests with this idempotency key are in progress (an owner and one waiter); \
         the outcome is pending. Retry with the same Idempotency-Key.",
    )
    .retry_after(RETRY_IN_PROGRESS_SECS)
}

fn claim_error_response(state: &ApiState, error: &ClaimError) -> Response {
    if let Some(db) = error.db_error() {
        state.metrics().db_error(db.sqlstate_class());
        state.health().record_failure(db);
    }
    match error {
        ClaimError::OutcomeUnknown(db) => {
            tracing::warn!(
                sqlstate_class = db.sqlstate_class(),
                "claim outcome unknown"
            );
            Problem::new(
                ProblemType::OutcomeUnknown,
                "The database connection failed while the transaction was being committed: the \
                 order may or may not have been created. Outcome unknown: retry with the same \
                 Idempotency-Key to learn it.",
            )
            .retry_after(RETRY_IN_PROGRESS_SECS)
            .into_response()
        }
        ClaimError::Unavailable(_) | ClaimError::Transient(_) | ClaimError::Unstable => {
            tracing::warn!(error = %crate::db::error_text(error), "claim: database unavailable");
            unavailable().into_response()
        }
        ClaimError::Database(db) => database_error(db),
        ClaimError::CorruptRecord(what) => {
            tracing::error!(problem = what, "claim: inconsistent idempotency record");
            Problem::new(ProblemType::InternalError, "Internal error.").into_response()
        }
    }
}

fn unavailable() -> Problem {
    Problem::new(
        ProblemType::DatabaseUnavailable,
        "The database is unavailable or busy; nothing was done. Retry later with the same \
         Idempotency-Key.",
    )
    .retry_after(RETRY_UNAVAILABLE_SECS)
}

/// The database is out of resources (class 53: disk full, out of memory): it said so and rolled
/// back, nothing was done. Not a bug of ours or the client's: 503 with `Retry-After`.
fn resources_exhausted() -> Problem {
    Problem::new(
        ProblemType::DatabaseUnavailable,
        "The database is out of resources (disk space or memory); nothing was done. Retry later \
         with the same Idempotency-Key.",
    )
    .retry_after(RETRY_RESOURCES_SECS)
}

/// A database error no protocol branch handles: resource exhaustion is 503, anything else 500.
fn database_error(db: &crate::db::DbError) -> Response {
    if db.class() == crate::db::ErrorClass::InsufficientResources {
        let code = match db {
            crate::db::DbError::Query(e) => e.code().map(|c| c.code().to_owned()),
            _ => None,
        };
        tracing::warn!(sqlstate = ?code, "the database is out of resources");
        return resources_exhausted().into_response();
    }
    internal(db)
}

/// Logs only the SQLSTATE and constraint: server messages can quote row values (keys).
fn internal(db: &crate::db::DbError) -> Response {
    let (code, constraint) = match db {
        crate::db::DbError::Query(e) => (
            e.code().map(|c| c.code().to_owned()),
            crate::db::violated_constraint(e).map(str::to_owned),
        ),
        _ => (None, None),
    };
    let misuse = match db {
        crate::db::DbError::Query(e) => e.code().is_some_and(crate::db::pooler::is_misuse_symptom),
        _ => false,
    };
    if misuse {
        // Only a transaction-mode pooler loses or mixes our prepared statements: say what to set.
        tracing::error!(sqlstate = ?code, "{}", crate::db::pooler::MISUSE_HINT);
    } else {
        tracing::error!(sqlstate = ?code, constraint = ?constraint, "unexpected database error");
    }
    Problem::new(ProblemType::InternalError, "Internal error.").into_response()
}

fn lookup_error_response(state: &ApiState, error: &LookupError) -> Response {
    state.metrics().db_error(error.db_error().sqlstate_class());
    state.health().record_failure(error.db_error());
    match error {
        LookupError::Unavailable(_) => unavailable().into_response(),
        LookupError::Database(db) => database_error(db),
    }
}

fn with_label(response: Response, outcome: &'static str) -> Labelled {
    Labelled { response, outcome }
}

// ---- handlers ----------------------------------------------------------------------------------

/// `POST /v1/orders` as a route of the router (the API's dispatch calls [`create_order`]
/// directly): the outcome label goes in the response's extensions for the middleware.
pub(crate) async fn create_order_route(
    State(state): State<ApiState>,
    request: Request,
) -> Response {
    let Labelled {
        mut response,
        outcome,
    } = create_order(&state, request).await;
    response.extensions_mut().insert(OutcomeLabel(outcome));
    response
}

/// `POST /v1/orders`.
pub(crate) async fn create_order(state: &ApiState, request: Request) -> Labelled {
    // The request whole, not its headers extracted: axum's `HeaderMap` extractor copies them.
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let live = state.live();
    let principal = match admit(&live, headers, Permission::CreateOrders) {
        Ok(p) => p,
        Err(problem) => return with_label(problem.into_response(), ""),
    };
    let request = match prepare_claim(&live, &principal, headers, body).await {
        Ok(r) => r,
        Err(problem) => {
            let label = if problem.kind == ProblemType::InternalError {
                "error"
            } else {
                claim::count(state.metrics(), Answered::Invalid);
                "invalid"
            };
            return with_label(problem.into_response(), label);
        }
    };
    // A third request for a key whose owner and one waiter are in flight would only queue on
    // the owner's row lock with a pooled connection: answered at once instead.
    let Some(admission) = state
        .keys()
        .enter(&request.tenant, &request.principal, &request.key)
    else {
        claim::count(state.metrics(), Answered::KeyBusy);
        return with_label(key_busy().into_response(), "in_progress");
    };
    // The transaction runs inline, in this request's task; if the client disconnects, hyper
    // drops this future, and the claim is handed to the tracked tasks to finish (commit or roll
    // back) and stay replayable. The admission goes with it, so the key stays counted until the
    // claim really ends.
    let pool = state.pool().clone();
    let database = Arc::clone(state.database());
    let settings = live.claim.clone();
    let task = RunToEnd::new(state.tasks(), async move {
        let outcome = claim::claim(&pool, &database, &settings, &request).await;
        drop(admission);
        outcome
    });
    match task.await {
        Ok(outcome) => {
            claim::count(state.metrics(), Answered::Outcome(&outcome));
            let label = outcome.metric_label();
            with_label(outcome_response(outcome), label)
        }
        Err(error) => with_label(claim_error_response(state, &error), "error"),
    }
}

/// `GET /v1/orders/{order_id}`.
pub(crate) async fn get_order(
    State(state): State<ApiState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let live = state.live();
    let principal = match admit(&live, &headers, Permission::ReadOrders) {
        Ok(p) => p,
        Err(problem) => return problem.into_response(),
    };
    let not_found = || {
        Problem::new(
            ProblemType::OrderNotFound,
            "No order with this id exists in your tenant.",
        )
        .into_response()
    };
    let Some(order_id) = path.ok().and_then(|Path(id)| Uuid::parse_str(&id).ok()) else {
        return not_found();
    };
    match lookup::order(state.pool(), state.database(), &principal.tenant, order_id).await {
        Ok(Some(order)) => axum::Json(order).into_response(),
        Ok(None) => not_found(),
        Err(e) => lookup_error_response(&state, &e),
    }
}

/// `GET /v1/idempotency-keys/{key}`.
pub(crate) async fn get_key_status(
    State(state): State<ApiState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let live = state.live();
    let principal = match admit(&live, &headers, Permission::CreateOrders) {
        Ok(p) => p,
        Err(problem) => return problem.into_response(),
    };
    let key = match path {
        Ok(Path(key)) => match check_key(key.as_bytes()) {
            Ok(key) => key,
            Err(problem) => return problem.into_response(),
        },
        Err(_) => {
            return Problem::new(
                ProblemType::InvalidIdempotencyKey,
                "The key in the path is not valid.",
            )
            .into_response()
        }
    };
    match lookup::key_status(
        state.pool(),
        state.database(),
        &principal.tenant,
        &principal.principal,
        &key,
    )
    .await
    {
        Ok(Some(status)) => axum::Json(status).into_response(),
        Ok(None) => Problem::new(
            ProblemType::IdempotencyKeyNotFound,
            "Your scope has no record of this idempotency key: no request with it was \
             committed.",
        )
        .into_response(),
        Err(e) => lookup_error_response(&state, &e),
    }
}

/// Any path the router does not know.
pub(crate) async fn route_not_found() -> Response {
    Problem::new(
        ProblemType::RouteNotFound,
        "No such route; see docs/api.md.",
    )
    .into_response()
}

/// A known path with a method it does not serve (axum adds `Allow`).
pub(crate) async fn method_not_allowed() -> Response {
    Problem::new(
        ProblemType::MethodNotAllowed,
        "This route does not serve this method; see the Allow header.",
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn keys() {
        assert_eq!(check_key(b"a").unwrap(), "a");
        assert!(check_key(&[b'k'; 255]).is_ok());
        for bad in [
            &b""[..],
            &[b'k'; 256],
            b"a b",
            b"a\tb",
            "é".as_bytes(),
            b"\x7f",
        ] {
            assert_eq!(
                check_key(bad).unwrap_err().kind,
                ProblemType::InvalidIdempotencyKey,
                "{bad:?}"
            );
        }
        let two = headers(&[("idempotency-key", b"a"), ("idempotency-key", b"b")]);
        assert!(idempotency_key(&two).is_err());
    }

    #[test]
    fn the_location_header_is_the_orders_url() {
        let id = Uuid::now_v7();
        assert_eq!(order_location(id).unwrap().to_str().unwrap(), order_url(id));
    }

    #[test]
    fn content_types() {
        for ok in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/json;charset=\"UTF-8\"",
        ] {
            assert!(
                check_content_type(&headers(&[("content-type", ok.as_bytes())])).is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "text/plain",
            "application/json; charset=latin1",
            "application/jsonx",
            "application/problem+json",
            "",
        ] {
            assert!(
                check_content_type(&headers(&[("content-type", bad.as_bytes())])).is_err(),
                "{bad}"
            );
        }
        assert!(check_content_type(&HeaderMap::new()).is_err());
    }

    #[test]
    fn bearer_tokens() {
        assert_eq!(
            bearer(&headers(&[("authorization", b"Bearer abc")])),
            Some("abc")
        );
        assert_eq!(
            bearer(&headers(&[("authorization", b"bearer abc")])),
            Some("abc")
        );
        assert_eq!(bearer(&headers(&[("authorization", b"Basic abc")])), None);
        assert_eq!(bearer(&headers(&[("authorization", b"Bearer ")])), None);
        assert_eq!(
            bearer(&headers(&[
                ("authorization", b"Bearer a"),
                ("authorization", b"Bearer b")
            ])),
            None
        );
    }
}

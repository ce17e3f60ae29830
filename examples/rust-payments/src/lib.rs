//! `POST /payments` with an `Idempotency-Key` (and `GET /payments/{id}`, where `Location` leads),
//! on tombstoned's SQL API: tokio-postgres (pooled by deadpool-postgres) and axum. See
//! examples/README.md for the contract the three examples share; `src/main.rs` reads the
//! environment and calls [`run`].
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod};
use serde_json::{json, Value};
use tokio_postgres::error::SqlState;
use tokio_postgres::IsolationLevel;

const OPERATION: &str = "create-payment";
const APPLICATION_NAME: &str = "payments-rust";
/// ISO 4217 minor-unit exponents of the currencies this service takes.
const CURRENCIES: [(&str, u32); 3] = [("EUR", 2), ("JPY", 0), ("USD", 2)];
const DEFAULT_CURRENCY: &str = "EUR";
const MAX_BODY_BYTES: usize = 16 * 1024;
const ATTEMPTS: usize = 3;
const REQUEST_ID_CONSTRAINT: &str = "payments_request_id_key";
const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

// Every statement takes its values as parameters.
const CLAIM: &str = "SELECT outcome, status_code, response_body, resource_id
  FROM tombstoned.claim($1, $2, $3, $4, tombstoned.fingerprint($5::text::jsonb),
                        $6::text::interval, $7::text::interval)";
const INSERT_PAYMENT: &str = "INSERT INTO payments AS p
    (tenant_id, principal_id, request_id, amount_minor, currency, payee)
VALUES ($1, $2, $3, $4, $5, $6)
RETURNING p.payment_id::text, payment_body(p)::text";
const ENQUEUE: &str = "SELECT tombstoned.enqueue_event($1, $2, 'payment.created', $3::text::jsonb)";
const COMPLETE: &str = "SELECT tombstoned.complete($1, $2, $3, $4, 201, $5::text::jsonb, $6)";
const BY_REQUEST_ID: &str = "SELECT p.principal_id = $1 AND p.amount_minor = $2
           AND p.currency = $3 AND p.payee = $4,
       payment_body(p)::text, p.payment_id::text
  FROM payments AS p
 WHERE p.tenant_id = $5 AND p.request_id = $6";
const BY_ID: &str = "SELECT payment_body(p)::text FROM payments AS p
 WHERE p.tenant_id = $1 AND p.payment_id::text = $2";

/// Who a bearer token authenticates: the scope's tenant and principal.
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant: String,
    pub principal: String,
}

/// What the service is configured with (the environment, in `main.rs`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Bearer token → caller.
    pub tokens: HashMap<String, Caller>,
    /// How long a claim waits for an in-flight owner (an interval, "2 seconds").
    pub lock_timeout: String,
    /// How long a key replays its answer ("24 hours").
    pub replay_window: String,
}

impl Settings {
    /// `PAYMENTS_TOKENS`' JSON (`{"token": {"tenant": ..., "principal": ...}}`) and the two
    /// intervals.
    pub fn new(tokens_json: &str, lock_timeout: &str, replay_window: &str) -> Result<Self, String> {
        let doc: Value = serde_json::from_str(tokens_json)
            .map_err(|e| format!("PAYMENTS_TOKENS is not JSON: {e}"))?;
        let entries = doc
            .as_object()
            .ok_or("PAYMENTS_TOKENS must be a JSON object")?;
        let mut tokens = HashMap::new();
        for (token, caller) in entries {
            let part = |name: &str| {
                caller
                    .get(name)
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .ok_or(format!("PAYMENTS_TOKENS: a token without a {name}"))
            };
            let caller = Caller {
                tenant: part("tenant")?,
                principal: part("principal")?,
            };
            tokens.insert(token.clone(), caller);
        }
        Ok(Settings {
            tokens,
            lock_timeout: lock_timeout.to_owned(),
            replay_window: replay_window.to_owned(),
        })
    }
}

/// A pool of sessions of the service role at `database_url`.
pub fn pool(database_url: &str) -> Result<Pool, String> {
    let mut config: tokio_postgres::Config = database_url
        .parse()
        .map_err(|e| format!("DATABASE_URL: {e}"))?;
    config.application_name(APPLICATION_NAME);
    let manager = Manager::from_config(
        config,
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(8)
        .build()
        .map_err(|e| format!("database pool: {e}"))
}

/// The service's routes.
pub fn router(pool: Pool, settings: Settings) -> Router {
    Router::new()
        .route("/payments", post(create_payment))
        .route("/payments/{payment_id}", get(show_payment))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Arc::new(App { pool, settings }))
}

/// Serves on `listener` until the process ends.
pub async fn run(
    listener: tokio::net::TcpListener,
    pool: Pool,
    settings: Settings,
) -> std::io::Result<()> {
    axum::serve(listener, router(pool, settings)).await
}

struct App {
    pool: Pool,
    settings: Settings,
}

/// An HTTP answer: its status, its body's exact text, extra headers.
struct Answer {
    status: StatusCode,
    body: String,
    headers: Vec<(HeaderName, String)>,
}

impl Answer {
    fn new(status: StatusCode, body: String) -> Self {
        Answer {
            status,
            body,
            headers: Vec::new(),
        }
    }

    fn problem(status: StatusCode, title: &str) -> Self {
        Answer::problem_with(status, title, json!({}))
    }

    fn problem_with(status: StatusCode, title: &str, mut extra: Value) -> Self {
        if let Some(fields) = extra.as_object_mut() {
            fields.insert("status".into(), status.as_u16().into());
            fields.insert("title".into(), title.into());
        }
        Answer::new(status, extra.to_string())
    }

    fn header(mut self, name: HeaderName, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    fn retry_later(status: StatusCode, title: &str) -> Self {
        Answer::problem(status, title).header(RETRY_AFTER, "1")
    }

    fn in_progress() -> Self {
        Answer::retry_later(
            StatusCode::CONFLICT,
            "a request with this Idempotency-Key is still in progress: retry later with the same key",
        )
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let content_type = if self.status.as_u16() < 300 {
            "application/json"
        } else {
            "application/problem+json"
        };
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        for (name, value) in self.headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(name, value);
            }
        }
        (self.status, headers, self.body).into_response()
    }
}

/// The normalised intent: defaults applied, the amount in minor units. Its fingerprint is
/// `tombstoned.fingerprint()` of exactly [`Intent::json`].
struct Intent {
    request_id: String,
    amount_minor: i64,
    currency: &'static str,
    payee: String,
}

impl Intent {
    fn json(&self) -> String {
        json!({
            "v": 1,
            "request_id": self.request_id,
            "amount_minor": self.amount_minor,
            "currency": self.currency,
            "payee": self.payee,
        })
        .to_string()
    }
}

/// "12.5" → 1250 in a currency of exponent 2; a JSON number is not accepted.
fn minor_units(amount: Option<&Value>, exponent: u32) -> Result<i64, String> {
    let refused = || format!("amount: a decimal string with at most {exponent} decimals");
    let text = amount.and_then(Value::as_str).ok_or_else(refused)?;
    let (whole, fraction) = match text.split_once('.') {
        Some((whole, fraction)) if !fraction.is_empty() => (whole, fraction),
        Some(_) => return Err(refused()),
        None => (text, ""),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || whole.len() > 12
        || (whole.len() > 1 && whole.starts_with('0'))
        || !digits(whole)
        || !digits(fraction)
        || fraction.len() > exponent as usize
    {
        return Err(refused());
    }
    let padded = format!("{fraction:0<width$}", width = exponent as usize);
    let number = |s: &str| {
        if s.is_empty() {
            Ok(0)
        } else {
            s.parse::<i64>().map_err(|_| refused())
        }
    };
    let minor = number(whole)? * 10_i64.pow(exponent) + number(&padded)?;
    if minor <= 0 {
        return Err("amount: must be positive".into());
    }
    Ok(minor)
}

fn text_field(doc: &Value, name: &str, longest: usize) -> Result<String, String> {
    match doc.get(name).and_then(Value::as_str) {
        Some(value) if (1..=longest).contains(&value.chars().count()) => Ok(value.to_owned()),
        _ => Err(format!("{name}: a string of 1 to {longest} characters")),
    }
}

/// Validation before any transaction: a refused request does not consume its key.
fn parse_intent(raw: &[u8]) -> Result<Intent, String> {
    let doc: Value = serde_json::from_slice(raw).map_err(|_| "the body is not JSON")?;
    if !doc.is_object() {
        return Err("the body must be a JSON object".into());
    }
    let currency = match doc.get("currency") {
        None => Some(DEFAULT_CURRENCY),
        Some(value) => value.as_str(),
    };
    let (currency, exponent) = currency
        .and_then(|c| CURRENCIES.iter().find(|(code, _)| *code == c))
        .copied()
        .ok_or("currency: one of EUR, JPY, USD")?;
    Ok(Intent {
        request_id: text_field(&doc, "request_id", 64)?,
        amount_minor: minor_units(doc.get("amount"), exponent)?,
        currency,
        payee: text_field(&doc, "payee", 100)?,
    })
}

/// The caller a bearer token names, or the 401.
fn authenticate<'a>(app: &'a App, headers: &HeaderMap) -> Result<&'a Caller, Answer> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    token
        .and_then(|t| app.settings.tokens.get(t))
        .ok_or_else(|| {
            Answer::problem(StatusCode::UNAUTHORIZED, "unauthenticated")
                .header(WWW_AUTHENTICATE, "Bearer")
        })
}

/// Where a payment's `Location` leads (the 201, a replay, the 410 once its window is over).
fn location(payment_id: &str) -> String {
    format!("/payments/{payment_id}")
}

/// `GET /payments/{payment_id}`: the caller's tenant's payment, or 404.
async fn show_payment(
    State(app): State<Arc<App>>,
    Path(payment_id): Path<String>,
    headers: HeaderMap,
) -> Answer {
    let caller = match authenticate(&app, &headers) {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let unavailable = || {
        Answer::retry_later(
            StatusCode::SERVICE_UNAVAILABLE,
            "database unavailable: retry later",
        )
    };
    let Ok(client) = app.pool.get().await else {
        return unavailable();
    };
    match client
        .query_opt(BY_ID, &[&caller.tenant, &payment_id])
        .await
    {
        Ok(Some(row)) => match row.try_get::<_, String>(0) {
            Ok(body) => Answer::new(StatusCode::OK, body),
            Err(e) => {
                eprintln!("show payment failed: {e}");
                Answer::problem(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
        },
        Ok(None) => Answer::problem(StatusCode::NOT_FOUND, "no such payment"),
        Err(e) if is_connection_error(&e) => unavailable(),
        Err(e) => {
            eprintln!("show payment failed: {e}");
            Answer::problem(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
}

async fn create_payment(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Answer {
    let caller = match authenticate(&app, &headers) {
        Ok(caller) => caller,
        Err(refused) => return refused,
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| (1..=255).contains(&k.chars().count()));
    let Some(key) = key else {
        return Answer::problem(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key: a header of 1 to 255 characters",
        );
    };
    let intent = match parse_intent(&body) {
        Ok(intent) => intent,
        Err(why) => return Answer::problem(StatusCode::BAD_REQUEST, &why),
    };
    let Ok(mut client) = app.pool.get().await else {
        return Answer::retry_later(
            StatusCode::SERVICE_UNAVAILABLE,
            "database unavailable: retry with the same Idempotency-Key",
        );
    };
    for _ in 0..ATTEMPTS {
        match attempt(&mut client, &app.settings, caller, key, &intent).await {
            Ok(answer) => return answer,
            Err(Failure::Again) => continue,
            Err(Failure::Database(e)) if is_connection_error(&e) => {
                return Answer::retry_later(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database unavailable: retry with the same Idempotency-Key",
                )
            }
            Err(Failure::Database(e)) => {
                eprintln!("create payment failed: {e}");
                return Answer::problem(StatusCode::INTERNAL_SERVER_ERROR, "internal error");
            }
        }
    }
    Answer::retry_later(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy: retry with the same Idempotency-Key",
    )
}

enum Failure {
    /// Run the whole transaction again (40001, 40P01, or a conflict that went away).
    Again,
    Database(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Database(e)
    }
}

/// The session is gone (closed, an I/O error, SQLSTATE class 08): not an answer of the server.
fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    let io = std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>());
    e.is_closed() || io || e.code().is_some_and(|c| c.code().starts_with("08"))
}

/// What the transaction ended with.
struct Claimed {
    outcome: String,
    status: Option<i32>,
    body: Option<String>,
    resource: Option<String>,
}

/// Where a transaction failed: before COMMIT (nothing of it remains) or at COMMIT (unknown).
enum Stage {
    Work,
    Commit,
}

/// One READ COMMITTED transaction: claim; the owner writes the payment, its event and the
/// answer; commit — right after a replay's read too: the cleaner waits for that share lock.
/// No remote call happens inside.
async fn transaction(
    client: &mut Object,
    settings: &Settings,
    caller: &Caller,
    key: &str,
    intent: &Intent,
) -> Result<Claimed, (Stage, tokio_postgres::Error)> {
    let work = |e| (Stage::Work, e);
    let (tenant, principal) = (&caller.tenant, &caller.principal);
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await
        .map_err(work)?;
    // Every statement prepared once per pooled session (deadpool's statement cache): a text query
    // is parsed, planned and described by the server at every call, one more round trip each.
    let row = tx
        .query_one(
            &tx.prepare_cached(CLAIM).await.map_err(work)?,
            &[
                tenant,
                principal,
                &OPERATION,
                &key,
                &intent.json(),
                &settings.replay_window,
                &settings.lock_timeout,
            ],
        )
        .await
        .map_err(work)?;
    let mut claimed = Claimed {
        outcome: row.try_get(0).map_err(work)?,
        status: row.try_get(1).map_err(work)?,
        body: row.try_get(2).map_err(work)?,
        resource: row.try_get(3).map_err(work)?,
    };
    if claimed.outcome == "owner" {
        let payment = tx
            .query_one(
                &tx.prepare_cached(INSERT_PAYMENT).await.map_err(work)?,
                &[
                    tenant,
                    principal,
                    &intent.request_id,
                    &intent.amount_minor,
                    &intent.currency,
                    &intent.payee,
                ],
            )
            .await
            .map_err(work)?;
        let payment_id: String = payment.try_get(0).map_err(work)?;
        let created: String = payment.try_get(1).map_err(work)?;
        let enqueue = tx.prepare_cached(ENQUEUE).await.map_err(work)?;
        tx.query_one(&enqueue, &[tenant, &payment_id, &created])
            .await
            .map_err(work)?;
        let completed = tx
            .query_one(
                &tx.prepare_cached(COMPLETE).await.map_err(work)?,
                &[tenant, principal, &OPERATION, &key, &created, &payment_id],
            )
            .await
            .map_err(work)?;
        claimed.body = Some(completed.try_get(0).map_err(work)?);
        claimed.status = Some(201);
        claimed.resource = Some(payment_id);
    }
    tx.commit().await.map_err(|e| (Stage::Commit, e))?;
    Ok(claimed)
}

async fn attempt(
    client: &mut Object,
    settings: &Settings,
    caller: &Caller,
    key: &str,
    intent: &Intent,
) -> Result<Answer, Failure> {
    // On an error the transaction was dropped: its ROLLBACK goes out before the next statement.
    let claimed = match transaction(client, settings, caller, key, intent).await {
        Ok(claimed) => claimed,
        Err((stage, e)) => {
            let constraint = e.as_db_error().and_then(|d| d.constraint());
            return match e.code() {
                // The key's owner is still in flight.
                Some(&SqlState::LOCK_NOT_AVAILABLE) => Ok(Answer::in_progress()),
                Some(&SqlState::UNIQUE_VIOLATION) if constraint == Some(REQUEST_ID_CONSTRAINT) => {
                    by_request_id(client, caller, intent).await
                }
                Some(&SqlState::T_R_SERIALIZATION_FAILURE | &SqlState::T_R_DEADLOCK_DETECTED) => {
                    Err(Failure::Again)
                }
                // A read-only server: a standby, mid-failover.
                Some(&SqlState::READ_ONLY_SQL_TRANSACTION) => Ok(Answer::retry_later(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database read-only: retry with the same Idempotency-Key",
                )),
                _ if matches!(stage, Stage::Commit) && is_connection_error(&e) => {
                    Ok(Answer::retry_later(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "outcome unknown: retry with the same Idempotency-Key",
                    ))
                }
                _ => Err(Failure::Database(e)),
            };
        }
    };
    let resource = claimed.resource.unwrap_or_default();
    let location = location(&resource);
    Ok(match claimed.outcome.as_str() {
        // complete's text: what every replay sends.
        "owner" => Answer::new(StatusCode::CREATED, claimed.body.unwrap_or_default())
            .header(LOCATION, location),
        "replay" => {
            let status = claimed
                .status
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Answer::new(status, claimed.body.unwrap_or_default())
                .header(LOCATION, location)
                .header(IDEMPOTENT_REPLAYED, "true")
        }
        "key_reused" => Answer::problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "this Idempotency-Key was used for another request",
        ),
        "expired" => Answer::problem_with(
            StatusCode::GONE,
            "beyond the replay window: look the payment up",
            json!({ "payment_id": resource }),
        )
        .header(LOCATION, location),
        other => {
            eprintln!("unknown claim outcome {other:?}");
            Answer::problem(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    })
}

/// The transaction rolled back on the business id: the request already has a payment, made
/// under another key. The same caller's same request gets it as a replay, with its `Location`
/// like a key's replay; anything else is a conflict that says nothing of the other payment.
async fn by_request_id(
    client: &mut Object,
    caller: &Caller,
    intent: &Intent,
) -> Result<Answer, Failure> {
    let row = client
        .query_opt(
            BY_REQUEST_ID,
            &[
                &caller.principal,
                &intent.amount_minor,
                &intent.currency,
                &intent.payee,
                &caller.tenant,
                &intent.request_id,
            ],
        )
        .await?;
    let Some(row) = row else {
        return Err(Failure::Again);
    };
    if !row.try_get::<_, bool>(0)? {
        return Ok(Answer::problem(
            StatusCode::CONFLICT,
            "request_id already names another payment",
        ));
    }
    let payment_id: String = row.try_get(2)?;
    Ok(Answer::new(StatusCode::OK, row.try_get(1)?)
        .header(LOCATION, location(&payment_id))
        .header(IDEMPOTENT_REPLAYED, "true"))
}

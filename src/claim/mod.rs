//! The claim/replay protocol transaction for `create-order` (docs/protocol.md), independent of
//! HTTP: every statement it runs, in one place, and the [`ClaimOutcome`] that the HTTP layer,
//! metrics, logs and tests all read.
//!
//! # The transactions, as PostgreSQL sees them
//!
//! Owner attempt — one round trip: the four messages are pipelined on one connection.
//!
//! ```sql
//! BEGIN ISOLATION LEVEL READ COMMITTED;
//! SELECT set_config('lock_timeout', $1, true);      -- api.claim_lock_timeout, transaction-local
//! <CLAIM_AND_CREATE or CLAIM_REJECTED>               -- one statement, see below
//! COMMIT;                                            -- ends as ROLLBACK if the statement failed
//! ```
//!
//! [`sql::CLAIM_AND_CREATE`] inserts the idempotency record with `ON CONFLICT (scope, key) DO
//! NOTHING`, and, in data-modifying CTEs that read the claim's `RETURNING`, the order and its
//! `order.created` outbox event. The record is inserted *complete* (status 201, the response body,
//! the order id): the body depends only on the request and on `now()`, the transaction's start
//! time, which is also the order's `created_at`. So claim, business write and stored response are
//! one statement in one transaction; if any part fails (23505 on `orders_tenant_request_key`,
//! 55P03 waiting for an in-flight owner) nothing of it remains.
//!
//! The statement first reads the key in its own snapshot, without a lock (the `existing` CTE).
//! When the key is there, the INSERT inserts nothing — so it never waits on that record, for
//! instance while a cleanup batch is tombstoning it — and the statement returns the record's
//! fingerprint, order id and expiry instead: key reuse (422) and "expired" (410) are answered
//! from those, which never change, in this one round trip. When the key is not in the snapshot
//! the INSERT runs with `ON CONFLICT DO NOTHING`, exactly as the protocol says: it waits for an
//! in-flight owner of the key (bounded by `lock_timeout`), and if that owner commits it returns
//! no row and the CTEs insert nothing.
//!
//! A record inside its replay window, or no row at all → replay attempt, a new transaction (so a
//! new snapshot, which sees the record the INSERT conflicted with):
//!
//! ```sql
//! BEGIN ISOLATION LEVEL READ COMMITTED;
//! SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true);
//! <READ_FOR_REPLAY>                                  -- SELECT ... FOR SHARE, window open only
//! COMMIT;
//! ```
//!
//! `FOR SHARE` conflicts with the cleaner's tombstoning UPDATE, so a replay that read the body
//! finishes with it, and one that comes after the cleaner sees the tombstone. Nothing but the copy
//! of the row happens while the share lock is held. The lock is taken only on a record whose
//! replay window is still open — the only kind whose body is sent — and the cleaner only ever
//! locks records whose window has closed (its cutoff is the database clock when its run began),
//! so a replay waits for a cleanup batch only in the rare overlap where its transaction began just
//! before the cleaner's cutoff (then it sees the tombstone). A record past its window (or a
//! tombstone) answers from columns that never change (fingerprint, order id), read without a
//! lock by [`sql::READ_EXPIRED`] when the locking read finds nothing.
//!
//! The replay transaction commits asynchronously: its only write is the transient lock marker
//! (which is also what gives it a transaction id and a commit record), nothing durable depends
//! on it, and the body it sends was made durable by the owner's synchronous commit before any
//! other transaction could see it. So a replay does not wait for a WAL flush.
//!
//! The response body is sent exactly as PostgreSQL returns `response_body::text`, so the first
//! response and every replay are byte-for-byte identical.

use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Pool};
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::pipeline::{self, PipelineFailure, Pipelined};
use crate::db::{self, DbError, ErrorClass};
use crate::fingerprint::Fingerprint;
use crate::order_request::OrderRequest;

/// The `operation` part of every record's scope written by this module.
pub const OPERATION_CREATE_ORDER: &str = "create-order";

/// Status of a newly created order.
pub const ORDER_STATUS_CREATED: &str = "created";

/// The unique constraint whose violation means "this request_id already has an order".
pub const ORDER_REQUEST_CONSTRAINT: &str = "orders_tenant_request_key";

/// How many times a claim is retried when the record it conflicted with is gone before it could
/// be read (only possible while `retention.purge_tombstones_after` deletes tombstones).
pub const MAX_CLAIM_ATTEMPTS: usize = 3;

/// The order's JSON representation, as one SQL expression over ten SQL expressions. Used by the
/// claim (over parameters) and by the duplicate-request lookup (over an `orders` row), so both
/// produce the same jsonb — and the same text — for the same order. The colons of the time
/// format are quoted (`":"`) so pgbench, which reads `:name` as a variable even inside string
/// literals, can run these statements verbatim.
macro_rules! order_json_sql {
    ($order_id:literal, $request_id:literal, $amount_minor:literal, $amount:literal,
     $currency:literal, $item:literal, $quantity:literal, $recipient:literal, $status:literal,
     $created_at:literal) => {
        concat!(
            "jsonb_build_object(",
            "'order_id', ",
            $order_id,
            ", 'request_id', ",
            $request_id,
            ", 'amount_minor', ",
            $amount_minor,
            ", 'amount', ",
            $amount,
            ", 'currency', ",
            $currency,
            ", 'item', ",
            $item,
            ", 'quantity', ",
            $quantity,
            ", 'recipient', ",
            $recipient,
            ", 'status', ",
            $status,
            ", 'created_at', to_char(",
            $created_at,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24\":\"MI\":\"SS.US\"Z\"'))"
        )
    };
}

/// `WITH existing AS (...`: the claim statements' unlocked read of the record (see
/// [`sql::EXISTING`]); the caller closes the parenthesis.
macro_rules! existing_cte {
    () => {
        "WITH existing AS (
    SELECT fingerprint, status_code, order_id, expired, replay_deadline <= now() AS past_deadline
    FROM idempotency_records
    WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3 AND idempotency_key = $4
"
    };
}

/// Every statement of the protocol, by name. Parameters are positional (`$n`); the table in
/// docs/api.md lists them. The benchmark's pgbench scripts copy these texts.
pub mod sql {
    /// Starts the claiming transaction; READ COMMITTED whatever the server's default.
    pub const BEGIN: &str = crate::db::sql::BEGIN_READ_COMMITTED;

    /// `$1` = `api.claim_lock_timeout` in milliseconds, e.g. `'2000ms'`. Transaction-local: when
    /// the connection goes back to the pool nothing needs restoring.
    pub const SET_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

    /// Claim the key and, only if this transaction now owns it, create the order and its outbox
    /// event — one statement.
    ///
    /// `$1` tenant, `$2` principal, `$3` operation, `$4` idempotency key, `$5` fingerprint
    /// (bytea, 32 bytes), `$6` new order id (uuid v7), `$7` request_id, `$8` amount_minor,
    /// `$9` amount as a decimal string with the currency's minor digits, `$10` currency,
    /// `$11` item, `$12` quantity, `$13` recipient, `$14` replay window in microseconds,
    /// `$15` new event id (uuid v7), `$16` metadata (jsonb or NULL).
    ///
    /// Returns [`CLAIM_RESULT_COLUMNS`]: one row with `created` to the owner (`body`,
    /// `order_id`); one row with `created = false` describing the record when the statement's
    /// snapshot already holds the key (see [`EXISTING`]); no row when the key was committed by a
    /// concurrent owner while this INSERT waited for it.
    pub const CLAIM_AND_CREATE: &str =
        concat!(
        existing_cte!(),
        "), claim AS (\n",
        "    INSERT INTO idempotency_records\n",
        "        (tenant_id, principal_id, operation, idempotency_key, fingerprint,\n",
        "         status_code, response_body, order_id, replay_deadline)\n",
        "    SELECT $1, $2, $3, $4, $5::bytea, 201,\n        ",
        order_json_sql!(
            "$6::uuid", "$7::text", "$8::bigint", "$9::text", "$10::text", "$11::text",
            "$12::integer", "$13::text", "'created'", "now()"
        ),
        ",\n",
        "        $6::uuid, now() + $14::bigint * interval '1 microsecond'\n",
        "    WHERE NOT EXISTS (SELECT FROM existing)\n",
        "    ON CONFLICT (tenant_id, principal_id, operation, idempotency_key) DO NOTHING\n",
        "    RETURNING order_id, response_body\n",
        "), new_order AS (\n",
        "    INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor,\n",
        "                        currency, item, quantity, recipient, status, created_at)\n",
        "    SELECT claim.order_id, $1, $2, $7, $8, $10, $11, $12, $13, 'created', now()\n",
        "    FROM claim\n",
        "    RETURNING order_id\n",
        "), event AS (\n",
        "    INSERT INTO outbox_events (event_id, tenant_id, order_id, event_type, payload)\n",
        "    SELECT $15, $1, new_order.order_id, 'order.created',\n",
        "           jsonb_build_object('order', claim.response_body,\n",
        "                              'metadata', coalesce($16::jsonb, '{}'::jsonb))\n",
        "    FROM new_order CROSS JOIN claim\n",
        ")\n",
        "SELECT true AS created, response_body::text AS body, order_id, NULL::bytea AS fingerprint,\n",
        "       NULL::boolean AS expired, NULL::boolean AS past_deadline\n",
        "FROM claim\n",
        "UNION ALL\n",
        "SELECT false, NULL, order_id, fingerprint, expired, past_deadline FROM existing"
    );

    /// Claim the key with a deterministic business rejection as its stored, terminal outcome
    /// (422 approval-limit-exceeded): no order, no event.
    ///
    /// `$1` tenant, `$2` principal, `$3` operation, `$4` key, `$5` fingerprint, `$6` status code
    /// (smallint), `$7` problem body (jsonb), `$8` replay window in microseconds.
    ///
    /// Returns [`CLAIM_RESULT_COLUMNS`] like [`CLAIM_AND_CREATE`] (`order_id` is NULL).
    pub const CLAIM_REJECTED: &str = concat!(
        existing_cte!(),
        "), claim AS (
    INSERT INTO idempotency_records
        (tenant_id, principal_id, operation, idempotency_key, fingerprint,
         status_code, response_body, order_id, replay_deadline)
    SELECT $1, $2, $3, $4, $5::bytea, $6::smallint, $7::jsonb, NULL,
           now() + $8::bigint * interval '1 microsecond'
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (tenant_id, principal_id, operation, idempotency_key) DO NOTHING
    RETURNING order_id, response_body
)
SELECT true AS created, response_body::text AS body, order_id, NULL::bytea AS fingerprint,
       NULL::boolean AS expired, NULL::boolean AS past_deadline
FROM claim
UNION ALL
SELECT false, NULL, order_id, fingerprint, expired, past_deadline FROM existing"
    );

    /// The columns both claim statements return, in order.
    pub const CLAIM_RESULT_COLUMNS: [&str; 6] = [
        "created",
        "body",
        "order_id",
        "fingerprint",
        "expired",
        "past_deadline",
    ];

    /// The `existing` part of both claim statements, for the documentation: the record as the
    /// statement's snapshot sees it, read without a lock. When it is there, the INSERT inserts
    /// nothing and so never waits on the record: not for a cleanup batch tombstoning it, not
    /// for anyone else holding it. (A key committed by someone else after the snapshot is not
    /// seen here; the INSERT then waits for that owner, as the protocol requires, and finds the
    /// conflict.)
    pub const EXISTING: &str = concat!(existing_cte!(), ")");

    /// Starts the replay transaction's settings: `$1` = `api.claim_lock_timeout` like
    /// [`SET_LOCK_TIMEOUT`], and asynchronous commit — the replay's only write is its transient
    /// row-lock marker, so its COMMIT need not wait for a WAL flush (module docs).
    pub const SET_REPLAY_SETTINGS: &str = "\
SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true)";

    /// The existing record while its replay window is open, share-locked so the cleaner cannot
    /// tombstone it under the reader. Records past their window are not returned (nor locked,
    /// nor waited for): those are the ones the cleaner locks, and their answer needs no body —
    /// [`READ_EXPIRED`] reads them. The window is judged on the database clock and ends exactly
    /// at `replay_deadline`, whether or not the cleaner has run yet.
    ///
    /// `$1` tenant, `$2` principal, `$3` operation, `$4` key.
    pub const READ_FOR_REPLAY: &str = "\
SELECT fingerprint, status_code, response_body::text AS body, order_id, expired,
       replay_deadline <= now() AS past_deadline
FROM idempotency_records
WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3 AND idempotency_key = $4
  AND NOT expired AND replay_deadline > now()
FOR SHARE";

    /// When [`READ_FOR_REPLAY`] found nothing: the record as it is, without a lock (a plain
    /// snapshot read never waits for the cleaner). It is past its window or a tombstone — the
    /// answer is key reuse or "expired", from the fingerprint and the order id, which never
    /// change — or it is gone (only a retention purge deletes records).
    ///
    /// `$1` tenant, `$2` principal, `$3` operation, `$4` key.
    pub const READ_EXPIRED: &str = "\
SELECT fingerprint, status_code, NULL::text AS body, order_id, expired,
       replay_deadline <= now() AS past_deadline
FROM idempotency_records
WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3 AND idempotency_key = $4";

    /// Ends the transaction (a ROLLBACK when a statement in it failed).
    pub const COMMIT: &str = crate::db::sql::COMMIT;

    /// After 23505 on `orders_tenant_request_key` (the claiming transaction rolled back): the
    /// order that has this request_id, with its representation built exactly as the claim built
    /// it. A plain snapshot read, outside any transaction; takes no row lock.
    ///
    /// `$1` tenant, `$2` request_id, `$3` amount as a decimal string in the *request's* currency
    /// (only used when the stored order's amount and currency equal the request's).
    pub const FIND_ORDER_BY_REQUEST_ID: &str = concat!(
        "SELECT principal_id, amount_minor, currency::text AS currency, item, quantity,\n",
        "       recipient, order_id,\n       ",
        order_json_sql!(
            "order_id",
            "request_id",
            "amount_minor",
            "$3::text",
            "currency::text",
            "item",
            "quantity",
            "recipient",
            "status",
            "created_at"
        ),
        "::text AS body\n",
        "FROM orders\n",
        "WHERE tenant_id = $1 AND request_id = $2"
    );
}

/// Every statement by name, for the benchmark's pgbench scripts and the documentation.
pub const STATEMENTS: &[(&str, &str)] = &[
    ("begin", sql::BEGIN),
    ("set_lock_timeout", sql::SET_LOCK_TIMEOUT),
    ("set_replay_settings", sql::SET_REPLAY_SETTINGS),
    ("claim_and_create", sql::CLAIM_AND_CREATE),
    ("claim_rejected", sql::CLAIM_REJECTED),
    ("read_for_replay", sql::READ_FOR_REPLAY),
    ("read_expired", sql::READ_EXPIRED),
    ("commit", sql::COMMIT),
    ("find_order_by_request_id", sql::FIND_ORDER_BY_REQUEST_ID),
];

/// The settings a claim runs with (reloadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSettings {
    /// How long a statement waits for a row lock (an in-flight owner of the same key, the
    /// cleaner's tombstoning) before giving up with 55P03.
    pub lock_timeout: Duration,
    /// How long a stored response is replayable (`retention.replay_window`).
    pub replay_window: Duration,
}

impl ClaimSettings {
    fn lock_timeout_setting(&self) -> String {
        db::sql::duration_setting(self.lock_timeout)
    }

    fn replay_window_micros(&self) -> i64 {
        i64::try_from(self.replay_window.as_micros()).unwrap_or(i64::MAX)
    }
}

/// What to store when the key is claimed.
#[derive(Debug, Clone)]
pub enum Decision {
    /// Create the order.
    Create,
    /// Store this rejection (status and problem body) as the key's outcome; create nothing.
    Reject {
        /// HTTP status to store (422).
        status: u16,
        /// The problem document.
        body: serde_json::Value,
    },
}

/// One claim: the caller's scope, the key, the validated request and its fingerprint.
#[derive(Debug, Clone)]
pub struct ClaimRequest {
    /// Scope: tenant (from the token).
    pub tenant: String,
    /// Scope: principal (from the token).
    pub principal: String,
    /// The idempotency key (validated: 1-255 visible ASCII).
    pub key: String,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// The validated request.
    pub order: OrderRequest,
    /// What owning the key means.
    pub decision: Decision,
}

/// What a claim came to. Every variant is an answer the protocol defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// This request owned the key and created the order (201).
    Created {
        /// The new order.
        order_id: Uuid,
        /// The stored response body, exactly as stored.
        body: String,
    },
    /// This request owned the key and stored a business rejection (422) as its outcome.
    Rejected {
        /// The stored status.
        status: u16,
        /// The stored problem document.
        body: String,
    },
    /// Same key, same fingerprint, inside the replay window: the stored answer.
    Replayed {
        /// The stored status (201, or 422 for a stored rejection).
        status: u16,
        /// The stored body, byte for byte.
        body: String,
        /// The order, when the outcome created one.
        order_id: Option<Uuid>,
    },
    /// Same key, different fingerprint (before or after expiry).
    KeyReused,
    /// Same key, same fingerprint, but the replay window is over (tombstone, or past the
    /// deadline and not yet tombstoned). Never re-executed.
    Expired {
        /// The order the key created, if any.
        order_id: Option<Uuid>,
    },
    /// Waited `lock_timeout` for another transaction holding the record (an in-flight owner, or
    /// the cleaner) or this request_id's order: outcome pending, retry with the same key.
    InProgress,
    /// A new key for a request_id that already has an order of the same principal with the same
    /// business parameters: that order, as a replay. The new key is not recorded.
    DuplicateRequestSameOrder {
        /// The existing order.
        order_id: Uuid,
        /// Its representation (the same bytes its own key replays).
        body: String,
    },
    /// A new key for a request_id whose order differs (or belongs to another principal).
    DuplicateRequestConflict,
}

impl ClaimOutcome {
    /// The `tombstoned_claims_total{outcome}` label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            ClaimOutcome::Created { .. } => "created",
            ClaimOutcome::Rejected { .. } => "rejected",
            ClaimOutcome::Replayed { .. } => "replayed",
            ClaimOutcome::KeyReused => "key_reused",
            ClaimOutcome::Expired { .. } => "expired",
            ClaimOutcome::InProgress => "in_progress",
            ClaimOutcome::DuplicateRequestSameOrder { .. }
            | ClaimOutcome::DuplicateRequestConflict => "duplicate_request",
        }
    }
}

/// Why a claim has no protocol answer.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// No connection, or the connection failed before anything could have been committed.
    #[error("database unavailable")]
    Unavailable(#[source] DbError),
    /// The connection failed after the claiming transaction (with its COMMIT) was sent: it may or
    /// may not have committed. A retry with the same key finds out.
    #[error("connection lost during the claiming transaction: outcome unknown")]
    OutcomeUnknown(#[source] DbError),
    /// A transient failure that rolled the transaction back (40001, 40P01, 57014).
    #[error("transient database failure; nothing was committed")]
    Transient(#[source] DbError),
    /// The record kept disappearing between the claim and the read (concurrent purge).
    #[error("the idempotency record vanished {MAX_CLAIM_ATTEMPTS} times between claim and read")]
    Unstable,
    /// Anything else the database said: a bug or a schema problem.
    #[error("unexpected database error")]
    Database(#[source] DbError),
    /// A committed record without status or body: not written by this protocol.
    #[error("the stored idempotency record is incomplete ({0})")]
    CorruptRecord(&'static str),
}

impl ClaimError {
    /// The database error inside, if any (for `db_errors_total{sqlstate_class}`).
    pub fn db_error(&self) -> Option<&DbError> {
        match self {
            ClaimError::Unavailable(e)
            | ClaimError::OutcomeUnknown(e)
            | ClaimError::Transient(e)
            | ClaimError::Database(e) => Some(e),
            ClaimError::Unstable | ClaimError::CorruptRecord(_) => None,
        }
    }
}

/// Runs the protocol for one request on a pooled connection. Cancellation: callers should run
/// this in a spawned task so an abandoned HTTP request never abandons a transaction half way.
#[tracing::instrument(name = "claim", skip_all, fields(tenant = %req.tenant, principal = %req.principal))]
pub async fn claim(
    pool: &Pool,
    settings: &ClaimSettings,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, ClaimError> {
    let client = pool
        .get()
        .await
        .map_err(|e| ClaimError::Unavailable(DbError::Pool(e)))?;
    let result = claim_on(&client, settings, req).await;
    if result.is_err() {
        // The connection saw something unexpected (or is gone): never hand it to another request.
        db::discard(client);
    }
    result
}

async fn claim_on(
    client: &ClientWrapper,
    settings: &ClaimSettings,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, ClaimError> {
    let lock_timeout = settings.lock_timeout_setting();
    let window = settings.replay_window_micros();
    for _ in 0..MAX_CLAIM_ATTEMPTS {
        match owner_attempt(client, &lock_timeout, window, req).await {
            Ok(Some(row)) => {
                let created: bool = row
                    .try_get("created")
                    .map_err(|e| ClaimError::Database(DbError::Query(e)))?;
                if created {
                    return owned(row, req);
                }
                // The key was already in the claim's snapshot, read without a lock: key reuse
                // and "expired" are answered from it; a replay needs the body, read FOR SHARE.
                if let Some(outcome) = without_body(&row, req)? {
                    return Ok(outcome);
                }
            }
            Ok(None) => {}
            Err(failure) => {
                let class = db::classify(&failure.error);
                if class == ErrorClass::UniqueViolation
                    && db::violated_constraint(&failure.error) == Some(ORDER_REQUEST_CONSTRAINT)
                {
                    match duplicate_request(client, req).await? {
                        Some(outcome) => return Ok(outcome),
                        None => continue, // the order is gone again: claim anew
                    }
                }
                return match class {
                    ErrorClass::LockNotAvailable => Ok(ClaimOutcome::InProgress),
                    // Everything was sent, COMMIT included: it may have committed.
                    ErrorClass::Unavailable if failure.sent => {
                        Err(ClaimError::OutcomeUnknown(DbError::Query(failure.error)))
                    }
                    ErrorClass::Unavailable => {
                        Err(ClaimError::Unavailable(DbError::Query(failure.error)))
                    }
                    _ => Err(transient_or_database(failure.error)),
                };
            }
        }
        match replay_attempt(client, &lock_timeout, req).await {
            Ok(Some(row)) => return existing(&row, req),
            Ok(None) => continue, // deleted between our INSERT and SELECT (purge): claim anew
            Err(failure) => {
                return match db::classify(&failure.error) {
                    ErrorClass::LockNotAvailable => Ok(ClaimOutcome::InProgress),
                    ErrorClass::Unavailable => {
                        Err(ClaimError::Unavailable(DbError::Query(failure.error)))
                    }
                    _ => Err(transient_or_database(failure.error)),
                };
            }
        }
    }
    Err(ClaimError::Unstable)
}

fn transient_or_database(error: tokio_postgres::Error) -> ClaimError {
    match db::classify(&error) {
        ErrorClass::SerializationFailure | ErrorClass::Deadlock | ErrorClass::QueryCanceled => {
            ClaimError::Transient(DbError::Query(error))
        }
        _ => ClaimError::Database(DbError::Query(error)),
    }
}

/// Runs `BEGIN; <settings>($1 = lock timeout); <main>; COMMIT` as one pipeline (one round trip,
/// [`db::pipeline`]) and returns the main statement's rows.
async fn in_transaction(
    client: &ClientWrapper,
    settings: &str,
    main: &str,
    lock_timeout: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, PipelineFailure> {
    let [begin, settings, main, commit] = pipeline::prepare_cached(client, settings, main).await?;
    let set_params: [&(dyn ToSql + Sync); 1] = [&lock_timeout];
    Pipelined {
        begin: &begin,
        settings: &settings,
        statement: &main,
        commit: &commit,
    }
    .query(client, &set_params, params)
    .await
}

async fn owner_attempt(
    client: &ClientWrapper,
    lock_timeout: &str,
    window_micros: i64,
    req: &ClaimRequest,
) -> Result<Option<Row>, PipelineFailure> {
    let fingerprint: &[u8] = req.fingerprint.as_bytes();
    let rows = match &req.decision {
        Decision::Create => {
            let o = &req.order;
            let order_id = Uuid::now_v7();
            let event_id = Uuid::now_v7();
            let amount = o.currency.format(o.amount_minor);
            let currency = o.currency.code();
            in_transaction(
                client,
                sql::SET_LOCK_TIMEOUT,
                sql::CLAIM_AND_CREATE,
                lock_timeout,
                &[
                    &req.tenant,
                    &req.principal,
                    &OPERATION_CREATE_ORDER,
                    &req.key,
                    &fingerprint,
                    &order_id,
                    &o.request_id,
                    &o.amount_minor,
                    &amount,
                    &currency,
                    &o.item,
                    &o.quantity,
                    &o.recipient,
                    &window_micros,
                    &event_id,
                    &o.metadata,
                ],
            )
            .await?
        }
        Decision::Reject { status, body } => {
            let status = i16::try_from(*status).unwrap_or(422);
            in_transaction(
                client,
                sql::SET_LOCK_TIMEOUT,
                sql::CLAIM_REJECTED,
                lock_timeout,
                &[
                    &req.tenant,
                    &req.principal,
                    &OPERATION_CREATE_ORDER,
                    &req.key,
                    &fingerprint,
                    &status,
                    body,
                    &window_micros,
                ],
            )
            .await?
        }
    };
    Ok(rows.into_iter().next())
}

fn owned(row: Row, req: &ClaimRequest) -> Result<ClaimOutcome, ClaimError> {
    let body: String = row
        .try_get("body")
        .map_err(|e| ClaimError::Database(DbError::Query(e)))?;
    match &req.decision {
        Decision::Create => {
            let order_id: Uuid = row
                .try_get("order_id")
                .map_err(|e| ClaimError::Database(DbError::Query(e)))?;
            Ok(ClaimOutcome::Created { order_id, body })
        }
        Decision::Reject { status, .. } => Ok(ClaimOutcome::Rejected {
            status: *status,
            body,
        }),
    }
}

async fn replay_attempt(
    client: &ClientWrapper,
    lock_timeout: &str,
    req: &ClaimRequest,
) -> Result<Option<Row>, PipelineFailure> {
    let key: [&(dyn ToSql + Sync); 4] = [
        &req.tenant,
        &req.principal,
        &OPERATION_CREATE_ORDER,
        &req.key,
    ];
    let rows = in_transaction(
        client,
        sql::SET_REPLAY_SETTINGS,
        sql::READ_FOR_REPLAY,
        lock_timeout,
        &key,
    )
    .await?;
    if let Some(row) = rows.into_iter().next() {
        return Ok(Some(row));
    }
    // Past its window, a tombstone, or gone: read it without a lock (never waits for the
    // cleaner, which only locks records past their window).
    let failed = |error| PipelineFailure { error, sent: true };
    let statement = client
        .prepare_cached(sql::READ_EXPIRED)
        .await
        .map_err(|error| PipelineFailure { error, sent: false })?;
    let row = client.query_opt(&statement, &key).await.map_err(failed)?;
    Ok(row.filter(|row| {
        // A record inside its window here was not returned by the locking read only if it was
        // deleted and claimed anew in between (a retention purge): claim again.
        let open = !row.try_get::<_, bool>("expired").unwrap_or(true)
            && !row.try_get::<_, bool>("past_deadline").unwrap_or(true);
        let same = row
            .try_get::<_, &[u8]>("fingerprint")
            .is_ok_and(|f| f == req.fingerprint.as_bytes());
        !(open && same)
    }))
}

/// The protocol's decision for an existing record when it needs no body: key reuse (checked
/// first, so a changed intent never learns anything about the stored one, before or after
/// expiry) and "expired". `None`: a replay, which needs the body.
fn without_body(row: &Row, req: &ClaimRequest) -> Result<Option<ClaimOutcome>, ClaimError> {
    let get = |e| ClaimError::Database(DbError::Query(e));
    let fingerprint: &[u8] = row.try_get("fingerprint").map_err(get)?;
    let order_id: Option<Uuid> = row.try_get("order_id").map_err(get)?;
    let expired: bool = row.try_get("expired").map_err(get)?;
    let past_deadline: bool = row.try_get("past_deadline").map_err(get)?;
    if fingerprint != req.fingerprint.as_bytes() {
        return Ok(Some(ClaimOutcome::KeyReused));
    }
    if expired || past_deadline {
        return Ok(Some(ClaimOutcome::Expired { order_id }));
    }
    Ok(None)
}

/// The protocol's decision for an existing record read by the replay transaction.
fn existing(row: &Row, req: &ClaimRequest) -> Result<ClaimOutcome, ClaimError> {
    if let Some(outcome) = without_body(row, req)? {
        return Ok(outcome);
    }
    let get = |e| ClaimError::Database(DbError::Query(e));
    let status: Option<i16> = row.try_get("status_code").map_err(get)?;
    let body: Option<String> = row.try_get("body").map_err(get)?;
    let order_id: Option<Uuid> = row.try_get("order_id").map_err(get)?;
    let status = status
        .and_then(|s| u16::try_from(s).ok())
        .ok_or(ClaimError::CorruptRecord("no status code"))?;
    let body = body.ok_or(ClaimError::CorruptRecord("live record without a body"))?;
    Ok(ClaimOutcome::Replayed {
        status,
        body,
        order_id,
    })
}

/// After 23505 on the order's request_id: same principal and same business parameters → that
/// order; otherwise a conflict. `None` when the order cannot be found (deleted meanwhile).
async fn duplicate_request(
    client: &ClientWrapper,
    req: &ClaimRequest,
) -> Result<Option<ClaimOutcome>, ClaimError> {
    let o = &req.order;
    let amount = o.currency.format(o.amount_minor);
    let fail = |e: tokio_postgres::Error| match db::classify(&e) {
        ErrorClass::Unavailable => ClaimError::Unavailable(DbError::Query(e)),
        _ => transient_or_database(e),
    };
    let statement = client
        .prepare_cached(sql::FIND_ORDER_BY_REQUEST_ID)
        .await
        .map_err(fail)?;
    let Some(row) = client
        .query_opt(&statement, &[&req.tenant, &o.request_id, &amount])
        .await
        .map_err(fail)?
    else {
        return Ok(None);
    };
    let get = |e| ClaimError::Database(DbError::Query(e));
    let principal: &str = row.try_get("principal_id").map_err(get)?;
    let amount_minor: i64 = row.try_get("amount_minor").map_err(get)?;
    let currency: &str = row.try_get("currency").map_err(get)?;
    let item: &str = row.try_get("item").map_err(get)?;
    let quantity: i32 = row.try_get("quantity").map_err(get)?;
    let recipient: &str = row.try_get("recipient").map_err(get)?;
    let same = principal == req.principal
        && amount_minor == o.amount_minor
        && currency == o.currency.code()
        && item == o.item
        && quantity == o.quantity
        && recipient == o.recipient;
    if !same {
        return Ok(Some(ClaimOutcome::DuplicateRequestConflict));
    }
    Ok(Some(ClaimOutcome::DuplicateRequestSameOrder {
        order_id: row.try_get("order_id").map_err(get)?,
        body: row.try_get("body").map_err(get)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_parameterised_and_name_the_conflict_target() {
        // Parameters are numbered 1..=n without gaps (a gap would be an unbound placeholder).
        for (name, text) in STATEMENTS {
            let mut used: Vec<usize> = text
                .split('$')
                .skip(1)
                .filter_map(|t| {
                    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok()
                })
                .collect();
            used.sort_unstable();
            used.dedup();
            assert_eq!(used, (1..=used.len()).collect::<Vec<_>>(), "{name}");
        }
        for text in [sql::CLAIM_AND_CREATE, sql::CLAIM_REJECTED] {
            assert!(text.contains(
                "ON CONFLICT (tenant_id, principal_id, operation, idempotency_key) DO NOTHING"
            ));
        }
        assert!(sql::READ_FOR_REPLAY.trim_end().ends_with("FOR SHARE"));
        assert!(
            !sql::READ_EXPIRED.contains("FOR "),
            "the expired read takes no lock"
        );
    }

    #[test]
    fn only_the_replay_transaction_commits_asynchronously() {
        // A claim's 201 must be durable before it is sent; a replay writes nothing durable.
        assert!(sql::SET_REPLAY_SETTINGS.contains("'synchronous_commit', 'off'"));
        assert!(!sql::SET_LOCK_TIMEOUT.contains("synchronous_commit"));
        assert!(!sql::CLAIM_AND_CREATE.contains("synchronous_commit"));
    }

    #[test]
    fn statements_run_verbatim_in_pgbench() {
        // pgbench substitutes `:name` everywhere, string literals included; `::` casts are fine.
        for (name, text) in STATEMENTS {
            let b = text.as_bytes();
            for i in 0..b.len() {
                let lone_colon = b[i] == b':'
                    && (i == 0 || b[i - 1] != b':')
                    && b.get(i + 1)
                        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
                assert!(!lone_colon, "{name}: `:name` at byte {i}");
            }
        }
    }

    #[test]
    fn settings_render_for_postgres() {
        let s = ClaimSettings {
            lock_timeout: Duration::from_millis(1500),
            replay_window: Duration::from_secs(2),
        };
        assert_eq!(s.lock_timeout_setting(), "1500ms");
        assert_eq!(s.replay_window_micros(), 2_000_000);
    }
}

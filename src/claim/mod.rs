//! The claim/replay protocol transaction for `create-order` (docs/protocol.md), independent of
//! HTTP: [`claim`], and the [`ClaimOutcome`] that the HTTP layer, metrics, logs and tests all
//! read. Every statement it runs is in [`sql`], in one place; the decisions are in `protocol`.
//!
//! # The transactions, as PostgreSQL sees them
//!
//! Owner attempt, on a direct connection (or through a session pooler) — **one statement in one
//! implicit transaction**: one Bind, Execute and Sync of the statement prepared on the pooled
//! session, and the server commits at that Sync. READ COMMITTED and the lock timeout are the
//! session's own settings ([`crate::db::pooled`]), set when the pool opens the session and again
//! before its next statement after a reload changed them; the claim checks its session carries
//! the ones it runs with ([`crate::db::pipeline::in_session`]: a comparison, as a rule).
//!
//! ```sql
//! -- once per pooled session (and after a reload of api.claim_lock_timeout):
//! SELECT set_config('lock_timeout', $1, false),      -- api.claim_lock_timeout
//!        set_config('default_transaction_isolation', 'read committed', false);
//! -- each owner attempt:
//! <CLAIM_AND_CREATE or CLAIM_REJECTED>               -- alone: committed at its Sync, or rolled back
//! ```
//!
//! The answer is read to its ReadyForQuery, which the server sends only once the implicit
//! transaction has committed: a commit that fails is the claim's error, and a connection lost
//! after the statement was sent is "outcome unknown" (`tests/it/api_commit_loss.rs` cuts at that
//! Sync, both ways). A 55P03 rolls the implicit transaction back and leaves the session's
//! settings as they were: nothing to restore before the connection goes back to the pool. The
//! owner's commit is as durable as before: tombstoned never sets `synchronous_commit` on a
//! session, so it is the server's.
//!
//! Behind a transaction pooler (`database.pooler = "transaction"`) nothing may stay set on a
//! session, and the owner attempt is [`sql::CALL_CLAIM_AND_CREATE`] (or
//! [`sql::CALL_CLAIM_REJECTED`]): the same statement run by its function (migration V6), whose
//! plan PL/pgSQL keeps for the server connection where no named statement may stay
//! ([`sql::claim_and_create`] chooses, and says why). The function checks READ COMMITTED and sets
//! the lock timeout itself, transaction-locally, so the call too is sent alone, an implicit
//! transaction: one round trip and one server-connection assignment in the pooler. Under a server
//! default of another isolation level it refuses (TS005, nothing done) and the call runs inside
//! `BEGIN ISOLATION LEVEL READ COMMITTED ... COMMIT`. Everything below holds for both shapes.
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
//! When the key is in the snapshot with the request's fingerprint and its replay window open,
//! the same statement also reads the record `FOR SHARE` and returns its stored status and body
//! (the `replay` CTE, [`sql::REPLAY`], which has the locking argument): a replay is this one
//! round trip. That transaction commits synchronously, as every claim transaction does (the
//! statement cannot know in advance it will be a replay): one WAL flush, shared with concurrent
//! commits, for its lock marker.
//!
//! No row at all (an in-flight owner committed the key while the INSERT waited: a key the
//! snapshot could not see), or a record inside its window that the locking read no longer
//! found (it changed after the snapshot) → replay attempt, a new transaction (so a new snapshot,
//! which sees the record the INSERT conflicted with):
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
//! other transaction could see it. So a replay does not wait for a WAL flush. It stays an
//! explicit transaction, pipelined, on every connection: asynchronous commit is chosen there,
//! transaction-locally, where a statement alone could only take the session's
//! `synchronous_commit` — which is the owner's, and stays the server's. It runs only after a wait
//! on an in-flight owner or for a record that changed after the claim's snapshot, so its three
//! extra Syncs are rare (BENCHMARKS.md, Round 4, has what either shape costs).
//!
//! The response body is sent exactly as PostgreSQL returns `response_body::text`, so the first
//! response and every replay are byte-for-byte identical.

mod protocol;
mod record;
pub mod sql;

pub use record::{RecordState, RetryAnswer};
pub use sql::STATEMENTS;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::db::Pool;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::config::DatabaseConfig;
use crate::db::{self, Conn, DbError};
use crate::fingerprint::Fingerprint;
use crate::metrics::Metrics;
use crate::order_request::OrderRequest;
use crate::telemetry::{Attribute, Kind, Span};

/// The `operation` part of every record's scope written by this module.
pub const OPERATION_CREATE_ORDER: &str = "create-order";

/// The unique constraint whose violation means "this request_id already has an order".
pub const ORDER_REQUEST_CONSTRAINT: &str = "orders_tenant_request_key";

/// How many times a claim is retried when the record it conflicted with is gone before it could
/// be read (only possible while `retention.purge_tombstones_after` deletes tombstones).
pub const MAX_CLAIM_ATTEMPTS: usize = 3;

/// The settings a claim runs with (reloadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSettings {
    /// How long a statement waits for a row lock (an in-flight owner of the same key, the
    /// cleaner's tombstoning) before giving up with 55P03.
    pub lock_timeout: Duration,
    /// How long a stored response is replayable (`retention.replay_window`).
    pub replay_window: Duration,
}

/// What a claim's statements may take on top of their lock waits before the client gives up on
/// the database (module [`crate::db::deadline`]): they take milliseconds; this is for a loaded
/// server, not part of the protocol.
pub const STATEMENT_ALLOWANCE: Duration = Duration::from_secs(3);

impl ClaimSettings {
    fn lock_timeout_setting(&self) -> String {
        db::sql::duration_setting(self.lock_timeout)
    }

    /// What the API's pooled sessions carry session-wide for the owner attempt on a direct
    /// connection: READ COMMITTED and [`ClaimSettings::lock_timeout`] (`db::pool_carrying`).
    pub fn session_settings(&self) -> db::SessionSettings {
        db::SessionSettings {
            lock_timeout: self.lock_timeout,
        }
    }

    /// The client-side bound on one claim once it holds a connection: an owner attempt and a
    /// replay attempt, each of which may wait `lock_timeout` for a row lock, plus
    /// [`STATEMENT_ALLOWANCE`] and the deadline's slack. Past it the database is taken to be
    /// silent: the connection is discarded and the request answered 503.
    pub fn deadline(&self) -> Duration {
        db::deadline::beyond(
            self.lock_timeout
                .saturating_mul(2)
                .saturating_add(STATEMENT_ALLOWANCE),
        )
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
    /// The SQLSTATE of the database error this outcome answers, when the protocol turned one
    /// into an answer: 55P03 for an owner still in flight past the lock timeout, 23505 on the
    /// order's request id for a duplicate request.
    pub fn sqlstate(&self) -> Option<&'static SqlState> {
        match self {
            ClaimOutcome::InProgress => Some(&SqlState::LOCK_NOT_AVAILABLE),
            ClaimOutcome::DuplicateRequestSameOrder { .. }
            | ClaimOutcome::DuplicateRequestConflict => Some(&SqlState::UNIQUE_VIOLATION),
            _ => None,
        }
    }

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

/// What `POST /v1/orders` answered, as the claim metrics count it.
#[derive(Debug, Clone, Copy)]
pub enum Answered<'a> {
    /// The claim ran and came to this outcome.
    Outcome(&'a ClaimOutcome),
    /// The request was refused before any claim (invalid; the key is not consumed).
    Invalid,
    /// The key's admission refused it: an owner and a waiter are in flight (answered as
    /// [`ClaimOutcome::InProgress`], without asking the database).
    KeyBusy,
}

/// Counts one answer: `tombstoned_claims_total{outcome}` and, for an outcome the database gave
/// as an error, that error's SQLSTATE class in `tombstoned_db_errors_total`. The one place the
/// claim metrics are recorded.
pub fn count(metrics: &Metrics, answered: Answered<'_>) {
    let (label, sqlstate) = match answered {
        Answered::Outcome(outcome) => (outcome.metric_label(), outcome.sqlstate()),
        Answered::Invalid => ("invalid", None),
        Answered::KeyBusy => (ClaimOutcome::InProgress.metric_label(), None),
    };
    metrics.claims.with_label_values(&[label]).inc();
    if let Some(class) = sqlstate.and_then(|code| code.code().get(..2)) {
        metrics.db_error(class);
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

/// Runs the protocol for one request on a connection of `pool` (opened for `database`, whose
/// schema the statements name and whose `pooler` says how they are sent). Cancellation: a
/// dropped claim may leave its transaction half way; a caller whose request can be abandoned
/// keeps it running to its end (the HTTP API awaits it inline and hands it to its task tracker
/// only if the request is dropped first: `http::run_to_end`).
///
/// With tracing on, the claim is a span (`claim create-order`) inside the request's, its
/// statements database client spans inside it; its attributes name the scope's tenant and
/// principal and the outcome, never the key.
#[tracing::instrument(name = "claim", skip_all, fields(tenant = %req.tenant, principal = %req.principal))]
pub async fn claim(
    pool: &Pool,
    database: &DatabaseConfig,
    settings: &ClaimSettings,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, ClaimError> {
    let span = Span::child("claim create-order", Kind::Internal, || {
        vec![
            Attribute::new("tombstoned.operation", OPERATION_CREATE_ORDER),
            Attribute::new("tombstoned.tenant", req.tenant.clone()),
            Attribute::new("tombstoned.principal", req.principal.clone()),
        ]
    });
    let result = span
        .in_scope(claim_untraced(pool, database, settings, req))
        .await;
    match &result {
        Ok(outcome) => span.set(|| {
            // With the order id's room: growing the Vec would reallocate it.
            let mut attributes = Vec::with_capacity(2);
            attributes.push(Attribute::new("tombstoned.outcome", outcome.metric_label()));
            if let ClaimOutcome::Created { order_id, .. } = outcome {
                attributes.push(Attribute::new("tombstoned.order_id", order_id.to_string()));
            }
            attributes
        }),
        Err(e) => span.fail(match e.db_error() {
            Some(db) => db.sqlstate_class().to_owned(),
            None => "unstable".to_owned(),
        }),
    }
    span.end();
    result
}

async fn claim_untraced(
    pool: &Pool,
    database: &DatabaseConfig,
    settings: &ClaimSettings,
    req: &ClaimRequest,
) -> Result<ClaimOutcome, ClaimError> {
    let client = pool
        .get()
        .await
        .map_err(|e| ClaimError::Unavailable(DbError::Pool(e)))?;
    let conn = Conn::pooled(&client, &database.schema, database.pooler);
    let commit_sent = AtomicBool::new(false);
    // Boxed: the protocol's state machine (every attempt's pipelined statements) is several
    // kilobytes, and an unboxed future is copied whole each time it moves (into the deadline,
    // into the caller's future, into a task if it is abandoned): the copies cost more than the
    // claim's own work in the daemon.
    let bounded = db::deadline::within(
        settings.deadline(),
        "the claim",
        Box::pin(protocol::claim_on(&conn, settings, req, &commit_sent)),
    )
    .await;
    let result = bounded.unwrap_or_else(|timeout| {
        // The connection is silent or stuck mid-statement. Its idle siblings were opened the
        // same way over the same path: retire them too, so the next requests open fresh ones
        // instead of each spending its own deadline on a silent socket.
        let retired = db::retire_idle(pool);
        tracing::warn!(retired, error = %db::error_text(&timeout), "claim timed out; connection discarded");
        Err(if commit_sent.load(Ordering::Acquire) {
            ClaimError::OutcomeUnknown(timeout)
        } else {
            ClaimError::Unavailable(timeout)
        })
    });
    if result.is_err() {
        // The connection saw something unexpected, refused a write (25006: a standby or a
        // read-only database; the pool reconnects through target_session_attrs), timed out or
        // is gone: never hand it to another request.
        db::discard(client);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_render_for_postgres() {
        let s = ClaimSettings {
            lock_timeout: Duration::from_millis(1500),
            replay_window: Duration::from_secs(2),
        };
        assert_eq!(s.lock_timeout_setting(), "1500ms");
        assert_eq!(s.replay_window_micros(), 2_000_000);
        assert_eq!(s.deadline(), Duration::from_secs(8));
    }

    #[test]
    fn an_answer_is_counted_with_the_sqlstate_class_behind_it() {
        let metrics = Metrics::new().unwrap();
        count(&metrics, Answered::Outcome(&ClaimOutcome::InProgress));
        count(&metrics, Answered::KeyBusy);
        count(
            &metrics,
            Answered::Outcome(&ClaimOutcome::DuplicateRequestConflict),
        );
        count(&metrics, Answered::Outcome(&ClaimOutcome::KeyReused));
        count(&metrics, Answered::Invalid);
        let claims = |label: &str| metrics.claims.with_label_values(&[label]).get();
        assert_eq!(claims("in_progress"), 2);
        assert_eq!(claims("duplicate_request"), 1);
        assert_eq!((claims("key_reused"), claims("invalid")), (1, 1));
        let errors = |class: &str| metrics.db_errors.with_label_values(&[class]).get();
        // Only the waiter that met 55P03 asked the database; the busy key did not.
        assert_eq!((errors("55"), errors("23")), (1, 1));
    }
}

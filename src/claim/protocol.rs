//! The protocol's decisions for one claim (docs/protocol.md): the owner attempt, the replay
//! attempt in a new transaction, the duplicate-request lookup after 23505, and the mapping of
//! every row and SQLSTATE to a [`ClaimOutcome`] or [`ClaimError`]. The statements are in
//! [`super::sql`]; each attempt is one round trip ([`crate::db::pipeline`]): the owner attempt
//! its statement alone, the others a pipelined transaction.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio_postgres::Row;
use uuid::Uuid;

use super::record::{RecordState, RetryAnswer};
use super::{
    sql, ClaimError, ClaimOutcome, ClaimRequest, ClaimSettings, Decision, MAX_CLAIM_ATTEMPTS,
    OPERATION_CREATE_ORDER, ORDER_REQUEST_CONSTRAINT,
};
use crate::db::pipeline::{self, PipelineFailure, Pipelined};
use crate::db::statement::types_of;
use crate::db::{self, Conn, DbError, ErrorClass, Param, SessionSettings};
use crate::telemetry::Span;

/// The attempt `attempt` makes, timed by a database client span named after its statement (with
/// tracing on), failed with the SQLSTATE `sqlstate` finds in its error. A leaf: the span is not
/// made current while the statement runs (nothing starts inside it), which spares every poll of
/// it. The attempt is made here, not passed in made: a future passed in and awaited is held
/// twice in this one's state (as the argument and as the awaited), doubling every claim's.
async fn statement_span<T, E, F: std::future::Future<Output = Result<T, E>>>(
    statement: &'static str,
    attempt: impl FnOnce() -> F,
    sqlstate: fn(&E) -> Option<&str>,
) -> Result<T, E> {
    let span = Span::database(statement);
    let result = attempt().await;
    if let Err(e) = &result {
        span.fail_sqlstate(sqlstate(e));
    }
    span.end();
    result
}

fn failure_sqlstate(failure: &PipelineFailure) -> Option<&str> {
    failure.error.code().map(|code| code.code())
}

fn claim_error_sqlstate(error: &ClaimError) -> Option<&str> {
    error.db_error().and_then(DbError::sqlstate)
}

/// `commit_sent` is true while an owner attempt (its COMMIT included) is in flight: if the
/// caller's deadline expires then, the claim may have committed (outcome unknown).
pub(super) async fn claim_on(
    client: &Conn<'_>,
    settings: &ClaimSettings,
    req: &ClaimRequest,
    commit_sent: &AtomicBool,
) -> Result<ClaimOutcome, ClaimError> {
    let lock_timeout = settings.lock_timeout_setting();
    let session = settings.session_settings();
    let window = settings.replay_window_micros();
    let mut scope_ensured = false;
    let mut attempt = 0;
    while attempt < MAX_CLAIM_ATTEMPTS {
        attempt += 1;
        commit_sent.store(true, Ordering::Release);
        let owned_or_not = statement_span(
            owner_statement(req),
            || owner_attempt(client, session, &lock_timeout, window, req),
            failure_sqlstate,
        )
        .await;
        commit_sent.store(false, Ordering::Release);
        match owned_or_not {
            Ok(Some(row)) => {
                let created: Option<bool> = row
                    .try_get("created")
                    .map_err(|e| ClaimError::Database(DbError::Query(e)))?;
                let Some(created) = created else {
                    // The scope has no row yet (its first claim): nothing was written. Insert
                    // it, committed, and claim again; that attempt is not a purge race's.
                    if scope_ensured {
                        return Err(ClaimError::Unstable);
                    }
                    // Boxed, as every path but the owner attempt's: a rare path's state would
                    // otherwise size (and be copied with) every claim's future.
                    let ensured = Box::pin(statement_span(
                        "ensure_scope",
                        || ensure_scope(client, settings, req),
                        claim_error_sqlstate,
                    ));
                    if let Some(outcome) = ensured.await? {
                        return Ok(outcome);
                    }
                    scope_ensured = true;
                    attempt -= 1;
                    continue;
                };
                if created {
                    return owned(row, req);
                }
                // The key was already in the claim's snapshot, read without a lock: key reuse
                // and "expired" are answered from it; a replay needs the body, which the same
                // statement read FOR SHARE while the window was open (`sql::REPLAY`).
                if let Some(outcome) = without_body(&row, req)? {
                    return Ok(outcome);
                }
                let locked: Option<&str> = row
                    .try_get("body")
                    .map_err(|e| ClaimError::Database(DbError::Query(e)))?;
                if locked.is_some() {
                    return existing(&row, req);
                }
                // No body: the record changed after the snapshot (tombstoned, or its window
                // closed) — the replay transaction answers from the record as it is now.
            }
            Ok(None) => {}
            Err(failure) => {
                let class = db::classify(&failure.error);
                if class == ErrorClass::UniqueViolation
                    && db::violated_constraint(&failure.error) == Some(ORDER_REQUEST_CONSTRAINT)
                {
                    let duplicate = Box::pin(statement_span(
                        "find_order_by_request_id",
                        || duplicate_request(client, req),
                        claim_error_sqlstate,
                    ));
                    match duplicate.await? {
                        Some(outcome) => return Ok(outcome),
                        None => continue, // the order is gone again: claim anew
                    }
                }
                return match class {
                    ErrorClass::LockNotAvailable => Ok(ClaimOutcome::InProgress),
                    ErrorClass::ReadOnly => {
                        Box::pin(read_only(client, settings, req, failure.error)).await
                    }
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
        let replay = Box::pin(statement_span(
            "read_for_replay",
            || replay_attempt(client, &lock_timeout, req),
            failure_sqlstate,
        ));
        match replay.await {
            Ok(Some(row)) => return existing(&row, req),
            Ok(None) => continue, // deleted between our INSERT and SELECT (purge): claim anew
            Err(failure) => {
                return match db::classify(&failure.error) {
                    ErrorClass::LockNotAvailable => Ok(ClaimOutcome::InProgress),
                    ErrorClass::ReadOnly => {
                        Box::pin(read_only(client, settings, req, failure.error)).await
                    }
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

/// The first claim of a scope: [`sql::ENSURE_SCOPE`], a transaction of its own (with the
/// claim's `lock_timeout`), so the scope row is committed before the claim's next attempt
/// begins. `Some`: the answer already (a server that refuses writes: the read-only path
/// answers, 503 when nothing is recorded; a scope row another transaction holds uncommitted
/// past `lock_timeout`: in progress, 409).
async fn ensure_scope(
    client: &Conn<'_>,
    settings: &ClaimSettings,
    req: &ClaimRequest,
) -> Result<Option<ClaimOutcome>, ClaimError> {
    let scope: [&dyn Param; 3] = [&req.tenant, &req.principal, &OPERATION_CREATE_ORDER];
    let lock_timeout = settings.lock_timeout_setting();
    match in_transaction(
        client,
        sql::SET_LOCK_TIMEOUT,
        sql::ENSURE_SCOPE,
        &lock_timeout,
        &scope,
    )
    .await
    {
        Ok(_) => Ok(None),
        Err(failure) => match db::classify(&failure.error) {
            // Another transaction inserted the scope and is still open (an SQL API caller's
            // first claim of it): retry, as for an owner in flight.
            ErrorClass::LockNotAvailable => Ok(Some(ClaimOutcome::InProgress)),
            ErrorClass::ReadOnly => read_only(client, settings, req, failure.error)
                .await
                .map(Some),
            ErrorClass::Unavailable => Err(ClaimError::Unavailable(DbError::Query(failure.error))),
            _ => Err(transient_or_database(failure.error)),
        },
    }
}

/// The claim met 25006 (read_only_sql_transaction): the server refuses writes — a standby, a
/// demoted primary, or `default_transaction_read_only = on`. Nothing was written. A new claim
/// cannot be made (503, `Unavailable`, carrying `refused`), but every answer about a key that is
/// already recorded needs no write, so it is read without a lock in a READ ONLY transaction:
///
/// - key reuse (422) and "expired" (410) come from the fingerprint and the expiry, as always;
/// - a replay sends the stored body. The protocol share-locks it so the cleaner cannot tombstone
///   it under the reader; here no lock is needed (nor possible: `FOR SHARE` is a write): while
///   this server refuses writes, the cleaner's UPDATE is refused too, so nothing can tombstone
///   the record between this read and the answer. The window is still judged on the database
///   clock (`replay_deadline > now()`), so an expired record is never replayed.
///
/// When the connection reached a standby after a failover, the record read is the standby's
/// replayed copy: only committed data, so the answer is one the primary gave or would give.
async fn read_only(
    client: &Conn<'_>,
    settings: &ClaimSettings,
    req: &ClaimRequest,
    refused: tokio_postgres::Error,
) -> Result<ClaimOutcome, ClaimError> {
    statement_span(
        "read_record_read_only",
        || read_only_untraced(client, settings, req, refused),
        claim_error_sqlstate,
    )
    .await
}

async fn read_only_untraced(
    client: &Conn<'_>,
    settings: &ClaimSettings,
    req: &ClaimRequest,
    refused: tokio_postgres::Error,
) -> Result<ClaimOutcome, ClaimError> {
    let key: [&dyn Param; 4] = [
        &req.tenant,
        &req.principal,
        &OPERATION_CREATE_ORDER,
        &req.key,
    ];
    let lock_timeout = settings.lock_timeout_setting();
    let set_params: [&dyn Param; 1] = [&lock_timeout];
    let rows = match pipeline::prepare_with(
        client,
        db::sql::BEGIN_READ_ONLY,
        (sql::SET_LOCK_TIMEOUT, &types_of(&set_params)),
        (sql::READ_RECORD_READ_ONLY, &types_of(&key)),
    )
    .await
    {
        Ok([begin, set, main, commit]) => {
            Pipelined {
                begin: &begin,
                settings: &set,
                statement: &main,
                commit: &commit,
            }
            .query(client.client(), &set_params, &key)
            .await
        }
        Err(failure) => Err(failure),
    };
    match rows {
        Ok(rows) => match rows.first() {
            Some(row) => existing(row, req),
            None => Err(ClaimError::Unavailable(DbError::Query(refused))),
        },
        Err(failure) => Err(match db::classify(&failure.error) {
            ErrorClass::Unavailable | ErrorClass::ReadOnly => {
                ClaimError::Unavailable(DbError::Query(failure.error))
            }
            _ => transient_or_database(failure.error),
        }),
    }
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
    client: &Conn<'_>,
    settings: &'static str,
    main: &'static str,
    lock_timeout: &str,
    params: &[&dyn Param],
) -> Result<Vec<Row>, PipelineFailure> {
    pipeline::query(client, settings, &[&lock_timeout], main, params).await
}

/// The owner attempt's statement, by its name in [`sql`].
fn owner_statement(req: &ClaimRequest) -> &'static str {
    match req.decision {
        Decision::Create => "claim_and_create",
        Decision::Reject { .. } => "claim_rejected",
    }
}

async fn owner_attempt(
    client: &Conn<'_>,
    session: SessionSettings,
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
            // The claim span's context, stored with the order's outbox event (README "Traces"):
            // only while a recorded trace is current.
            let trace = crate::telemetry::current_traceparent();
            claim_statement(
                client,
                sql::claim_and_create(client.pooler()),
                session,
                lock_timeout,
                trace
                    .as_deref()
                    .map(|trace| (sql::CLAIM_AND_CREATE_TRACED, trace)),
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
                    &lock_timeout,
                ],
            )
            .await?
        }
        Decision::Reject { status, body } => {
            let status = i16::try_from(*status).unwrap_or(422);
            // No event, so no trace context to store.
            claim_statement(
                client,
                sql::claim_rejected(client.pooler()),
                session,
                lock_timeout,
                None,
                &[
                    &req.tenant,
                    &req.principal,
                    &OPERATION_CREATE_ORDER,
                    &req.key,
                    &fingerprint,
                    &status,
                    body,
                    &window_micros,
                    &lock_timeout,
                ],
            )
            .await?
        }
    };
    Ok(rows.into_iter().next())
}

/// The owner attempt's transaction. On a session that keeps session state (a direct connection,
/// a session pooler) the statement alone, an implicit transaction: the session carries READ
/// COMMITTED and the lock timeout ([`pipeline::in_session`]), so the statement takes all of
/// `params` but the last (the lock timeout) and is one Bind/Execute/Sync — the server commits at
/// that Sync, and the answer is read to its ReadyForQuery, after the commit. Through a
/// transaction pooler the statement is its function's call, which checks READ COMMITTED and sets
/// the lock timeout itself (`params`' last): sent alone, it is the whole transaction — one round
/// trip and one server-connection assignment in the pooler. Under a server whose default
/// isolation is not READ COMMITTED the function refuses ([`ErrorClass::WrongIsolation`], nothing
/// done) and the call runs again inside `BEGIN ISOLATION LEVEL READ COMMITTED ... COMMIT`.
///
/// `traced`: the statement's variant that stores a trace context with the order's event, and
/// that context. On a session that keeps session state the variant runs instead, alone as
/// above: a traced claim is one statement too. Through a transaction pooler the function's call
/// runs in an explicit transaction that sets `tombstoned.traceparent` first
/// ([`sql::SET_LOCK_TIMEOUT_AND_TRACE`]), as the SQL API's callers set it.
async fn claim_statement(
    client: &Conn<'_>,
    statement: &'static str,
    session: SessionSettings,
    lock_timeout: &str,
    traced: Option<(&'static str, &str)>,
    params: &[&dyn Param],
) -> Result<Vec<Row>, PipelineFailure> {
    if client.pooler().keeps_session_state() {
        let statement_params = params.split_last().map_or(params, |(_, rest)| rest);
        return match traced {
            None => pipeline::in_session(client, session, statement, statement_params).await,
            Some((traced_statement, trace)) => {
                let mut traced_params = statement_params.to_vec();
                traced_params.push(&trace);
                Box::pin(pipeline::in_session(
                    client,
                    session,
                    traced_statement,
                    &traced_params,
                ))
                .await
            }
        };
    }
    // Boxed, as below: the rarer shapes' states would size every claim's future.
    if let Some((_, trace)) = traced {
        return Box::pin(traced_transaction(
            client,
            statement,
            lock_timeout,
            trace,
            params,
        ))
        .await;
    }
    match pipeline::alone(client, statement, params).await {
        Err(failure) if db::classify(&failure.error) == ErrorClass::WrongIsolation => {
            tracing::debug!(
                "the server's default isolation is not READ COMMITTED: the claim runs in an \
                 explicit transaction"
            );
            Box::pin(in_transaction(
                client,
                sql::SET_LOCK_TIMEOUT,
                statement,
                lock_timeout,
                params,
            ))
            .await
        }
        done => done,
    }
}

/// [`in_transaction`] with the trace context set beside the lock timeout
/// ([`sql::SET_LOCK_TIMEOUT_AND_TRACE`]).
async fn traced_transaction(
    client: &Conn<'_>,
    statement: &'static str,
    lock_timeout: &str,
    trace: &str,
    params: &[&dyn Param],
) -> Result<Vec<Row>, PipelineFailure> {
    pipeline::query(
        client,
        sql::SET_LOCK_TIMEOUT_AND_TRACE,
        &[&lock_timeout, &trace],
        statement,
        params,
    )
    .await
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
    client: &Conn<'_>,
    lock_timeout: &str,
    req: &ClaimRequest,
) -> Result<Option<Row>, PipelineFailure> {
    let key: [&dyn Param; 4] = [
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
    let statement = client
        .ready(sql::READ_EXPIRED, &db::statement::types_of(&key))
        .await
        .map_err(|error| PipelineFailure { error, sent: false })?;
    let row = statement
        .query_opt(client.client(), &key)
        .await
        .map_err(|error| PipelineFailure { error, sent: true })?;
    Ok(row.filter(|row| {
        // A record inside its window here was not returned by the locking read only if it was
        // deleted and claimed anew in between (a retention purge): claim again.
        let open = RecordState::read(row).is_ok_and(RecordState::is_replayable);
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
    let state = RecordState::read(row).map_err(get)?;
    Ok(
        match state.answer(fingerprint == req.fingerprint.as_bytes()) {
            RetryAnswer::KeyReused => Some(ClaimOutcome::KeyReused),
            RetryAnswer::Expired => Some(ClaimOutcome::Expired { order_id }),
            RetryAnswer::Replay => None,
        },
    )
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
    client: &Conn<'_>,
    req: &ClaimRequest,
) -> Result<Option<ClaimOutcome>, ClaimError> {
    let o = &req.order;
    let amount = o.currency.format(o.amount_minor);
    let fail = |e: tokio_postgres::Error| match db::classify(&e) {
        ErrorClass::Unavailable => ClaimError::Unavailable(DbError::Query(e)),
        _ => transient_or_database(e),
    };
    let Some(row) = client
        .query_opt(
            sql::FIND_ORDER_BY_REQUEST_ID,
            &[&req.tenant, &o.request_id, &amount],
        )
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

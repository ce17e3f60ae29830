//! Every SQL statement of the outbox relay and its commands, in one place, so the leasing
//! protocol reads top to bottom. Every statement names the schema (`{schema}.outbox_events`,
//! rendered by [`crate::db::sql::qualify`]); every value is a parameter.
//!
//! Each relay statement is its own short transaction, pipelined with its settings
//! (`BEGIN; SETTINGS; <statement>; COMMIT` in one round trip, [`crate::db::pipeline`]): the pick
//! commits before the HTTP call starts, the record is a new transaction after it ends. The
//! settings are transaction-local, so nothing is left on a session a connection pooler hands to
//! other clients; they include `idle_in_transaction_session_timeout`, so even a bug could not keep
//! a transaction open across a delivery.

/// Every relay transaction's settings (`is_local = true`): `$1` statement_timeout, `$2`
/// lock_timeout, `$3` idle_in_transaction_session_timeout (milliseconds, as text).
pub const SETTINGS: &str = "\
SELECT set_config('statement_timeout', $1, true),
       set_config('lock_timeout', $2, true),
       set_config('idle_in_transaction_session_timeout', $3, true)";

/// Opens the read-only transaction of the inspecting commands: one snapshot, nothing written.
pub const READ_ONLY_BEGIN: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// Ends it.
pub const READ_ONLY_END: &str = "ROLLBACK";

/// The database clock.
pub const NOW: &str = "SELECT now()";

/// The condition "due now": pending (neither delivered nor a dead letter), its retry time
/// reached, no live lease, and every lower-sequence event of its subject delivered
/// (head-of-line per order, or per aggregate for `enqueue_event`'s events: an event has exactly
/// one of `order_id` and `aggregate_id`, so one of the two checks is void; each has its own
/// index, `outbox_events_order_sequence_key` and `outbox_events_aggregate_sequence_key`).
/// Alias `e`.
macro_rules! due_condition {
    () => {
        "e.published_at IS NULL
    AND e.dead_lettered_at IS NULL
    AND e.next_attempt_at <= now()
    AND (e.locked_until IS NULL OR e.locked_until <= now())
    AND NOT EXISTS (
        SELECT FROM {schema}.outbox_events AS earlier
        WHERE earlier.order_id = e.order_id
          AND earlier.sequence < e.sequence
          AND earlier.published_at IS NULL)
    AND NOT EXISTS (
        SELECT FROM {schema}.outbox_events AS earlier
        WHERE earlier.tenant_id = e.tenant_id
          AND earlier.aggregate_id = e.aggregate_id
          AND earlier.sequence < e.sequence
          AND earlier.published_at IS NULL)"
    };
}

/// The columns of an [`super::Event`].
macro_rules! event_columns {
    () => {
        "e.event_id, e.tenant_id, e.order_id, e.aggregate_id, e.event_type, e.sequence, e.payload, \
         e.created_at, e.attempts, e.sender, e.traceparent"
    };
}

/// Pick and lease up to `$3` due events, oldest first. `$1` this relay's instance id, `$2` the
/// lease length in microseconds, `$4` event ids not to pick (uuid[]; the one-shot `deliver`
/// passes what it already attempted, so one run attempts each event at most once).
///
/// `FOR UPDATE SKIP LOCKED` never waits: an event another relay is picking right now is left to
/// it. A row whose lease another relay committed after this statement's snapshot is re-checked
/// on its current version after the lock (READ COMMITTED), sees the live lease and drops out.
/// The walk is over `outbox_events_unpublished_idx` (pending events and dead letters only).
pub const PICK: &str = concat!(
    "WITH due AS (
    SELECT e.event_id
    FROM {schema}.outbox_events AS e
    WHERE ",
    due_condition!(),
    "
      AND e.event_id <> ALL ($4::uuid[])
    ORDER BY e.created_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox_events AS e
SET locked_by = $1,
    locked_until = now() + $2::bigint * interval '1 microsecond',
    attempts = e.attempts + 1
FROM due
WHERE e.event_id = due.event_id
RETURNING ",
    event_columns!()
);

/// The guard every record statement carries: the lease is still this one. `$1` event id, `$2`
/// instance id, `$3` the attempt number the pick returned. A relay whose lease expired and was
/// taken over records nothing; the new holder's outcome stands.
macro_rules! lease_guard {
    () => {
        "WHERE event_id = $1 AND locked_by = $2 AND attempts = $3"
    };
}

/// 2xx: delivered. `$4` the HTTP status.
pub const RECORD_DELIVERED: &str = concat!(
    "UPDATE {schema}.outbox_events
SET published_at = now(), last_attempt_at = now(), last_status = $4, last_error = NULL,
    locked_by = NULL, locked_until = NULL
",
    lease_guard!()
);

/// Not delivered, try again: `$4` status (NULL: no answer), `$5` reason, `$6` delay in
/// microseconds.
pub const RECORD_RETRY: &str = concat!(
    "UPDATE {schema}.outbox_events
SET next_attempt_at = now() + $6::bigint * interval '1 microsecond',
    last_attempt_at = now(), last_status = $4, last_error = $5,
    locked_by = NULL, locked_until = NULL
",
    lease_guard!()
);

/// Given up: a dead letter until `tombstoned outbox requeue`. `$4` status, `$5` reason.
pub const RECORD_DEAD_LETTER: &str = concat!(
    "UPDATE {schema}.outbox_events
SET dead_lettered_at = now(), last_attempt_at = now(), last_status = $4, last_error = $5,
    locked_by = NULL, locked_until = NULL
",
    lease_guard!()
);

/// A leased event that was never sent (shutdown, or too late in its lease to start): free it at
/// once for any relay, and do not count the attempt.
pub const RELEASE_UNATTEMPTED: &str = concat!(
    "UPDATE {schema}.outbox_events
SET attempts = attempts - 1, locked_by = NULL, locked_until = NULL
",
    lease_guard!()
);

/// What the gauges and the dry runs show, read through `outbox_events_unpublished_idx` only
/// (cost follows the backlog and the dead letters, never the delivered history): pending events,
/// the oldest pending one's creation time, dead letters, and events leased right now.
pub const COUNTS: &str = "\
SELECT count(*) FILTER (WHERE dead_lettered_at IS NULL) AS pending,
       min(created_at) FILTER (WHERE dead_lettered_at IS NULL) AS oldest_pending,
       count(*) FILTER (WHERE dead_lettered_at IS NOT NULL) AS dead_letters,
       count(*) FILTER (WHERE dead_lettered_at IS NULL AND locked_until > now()) AS in_flight,
       now() AS now
FROM {schema}.outbox_events
WHERE published_at IS NULL";

/// The columns of an [`super::EventSummary`].
macro_rules! summary_columns {
    () => {
        "e.event_id, e.event_type, e.order_id, e.aggregate_id, e.sequence, e.created_at, e.attempts,
       e.next_attempt_at, e.locked_until, e.last_attempt_at, e.last_status, e.last_error,
       e.published_at, e.dead_lettered_at"
    };
}

/// `tombstoned outbox deliver --dry-run`: what a pick would take now, oldest first, at most
/// `$1` (without locking anything).
pub const DUE_NOW: &str = concat!(
    "SELECT ",
    summary_columns!(),
    "
FROM {schema}.outbox_events AS e
WHERE ",
    due_condition!(),
    "
ORDER BY e.created_at
LIMIT $1"
);

/// `tombstoned outbox deliver` on a terminal: how many events are due now (what its progress
/// line counts toward), without locking anything.
pub const DUE_COUNT: &str = concat!(
    "SELECT count(*)
FROM {schema}.outbox_events AS e
WHERE ",
    due_condition!()
);

/// `tombstoned outbox list`: undelivered events (pending and dead letters), oldest first, at
/// most `$2`; only dead letters when `$1`.
pub const LIST_UNDELIVERED: &str = concat!(
    "SELECT ",
    summary_columns!(),
    "
FROM {schema}.outbox_events AS e
WHERE e.published_at IS NULL
  AND (NOT $1::boolean OR e.dead_lettered_at IS NOT NULL)
ORDER BY e.created_at
LIMIT $2"
);

/// `tombstoned outbox requeue --event ...`: dead letters among `$1` (uuid[]) become pending, due
/// now, with a fresh count of attempts. Returns the ids requeued.
pub const REQUEUE_EVENTS: &str = "\
UPDATE {schema}.outbox_events
SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = now()
WHERE event_id = ANY ($1::uuid[]) AND dead_lettered_at IS NOT NULL
RETURNING event_id";

/// `tombstoned outbox requeue --all-dead-letters`.
pub const REQUEUE_ALL: &str = "\
UPDATE {schema}.outbox_events
SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = now()
WHERE published_at IS NULL AND dead_lettered_at IS NOT NULL
RETURNING event_id";

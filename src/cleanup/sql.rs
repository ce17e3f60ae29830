//! Every SQL statement of the cleanup engine, in one place, so the locking protocol reads top to
//! bottom. docs/cleanup.md explains the choices and has the measurements behind them.
//!
//! Every statement names the schema (`{schema}.idempotency_records`, rendered by
//! [`crate::db::sql::qualify`]); no session has a `search_path` set. Every value is a parameter,
//! every setting transaction-local. The statements it shares with other parts (each batch's
//! `BEGIN` and `COMMIT`, a transaction's `statement_timeout`) are in
//! [`crate::db::sql`].
//!
//! # The batch statements
//!
//! Every phase (tombstoning, the optional retention purge of tombstones, and the optional
//! retention of delivered outbox events) runs the same shape of statement,
//! one per batch transaction, taking `$1` the due bound used for the re-check after locking,
//! `$2` where this batch starts in the index (inclusive; `NULL` = from the beginning), `$3`
//! where it must stop (inclusive, never past `$1`) and `$4` the batch size. Each returns one row:
//! `picked`, `changed`, `last` (the largest index key picked, where the next batch starts) and,
//! for the `SKIP LOCKED` variants, `passed_over` (due rows left because another session held
//! them; see [`crate::cleanup`] for how each is counted once).
//!
//! * `picked`: the oldest due rows through the partial index (`WHERE NOT expired` for
//!   tombstoning, `WHERE expired` for purging, `WHERE published_at IS NOT NULL` for outbox
//!   retention), `LIMIT $4`, from the keyset position `$2`, so a
//!   batch never steps over the entries earlier batches of the run left dead in the index.
//!   Materialised: the index is read once.
//! * `changed`: ONE `UPDATE` (or `DELETE`) joined on `ctid` to the picked rows sorted by primary
//!   key. With hash and merge joins disabled for the transaction ([`BATCH_SETTINGS`]) the plan is
//!   a nested loop whose outer side is that sorted list, so the statement's own row locks
//!   (FOR NO KEY UPDATE strength for the UPDATE, FOR UPDATE for the DELETE; both conflict with a
//!   replay's FOR SHARE) are taken in primary-key order. A row that changed since it was picked
//!   is re-checked after its lock by EvalPlanQual: a new version fails the `ctid` condition and
//!   the due condition is re-evaluated on the current row, so nothing that stopped being due is
//!   touched. The test `batch_plans_lock_rows_in_primary_key_order` pins the plan shape;
//!   correctness does not depend on it (another order could at worst deadlock, 40P01, and the
//!   batch is retried).

/// Per batch transaction (`SET LOCAL` semantics: `is_local = true`): `$1` lock_timeout, `$2`
/// statement_timeout (both in milliseconds).
///
/// * Hash and merge joins are disabled so the batch statement's join is the nested loop that
///   locks rows in primary-key order.
/// * Plans are always made for the actual parameters (a generic plan cannot see how many rows
///   are due).
/// * `synchronous_commit = off`: the batch's COMMIT does not wait for its WAL to reach disk (it
///   was ~10% of a batch of 1000 here). Safe for this work only: a batch lost in a crash leaves
///   its rows due and the next run does it again; nothing outside the database learns of a
///   tombstone before it is durable except a replay answering "expired" for a record whose
///   stored answer was itself correct; and any later synchronous commit (a claim reusing a
///   purged key) flushes the WAL written before it, so no durable state can depend on a lost
///   batch.
pub const BATCH_SETTINGS: &str = "\
SELECT set_config('lock_timeout', $1, true),
       set_config('statement_timeout', $2, true),
       set_config('enable_hashjoin', 'off', true),
       set_config('enable_mergejoin', 'off', true),
       set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('synchronous_commit', 'off', true)";

/// Opens the dry run's transaction: one snapshot for every figure, and nothing written.
pub const DRY_RUN_BEGIN: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// Ends the dry run's transaction.
pub const DRY_RUN_END: &str = "ROLLBACK";

/// The run's cutoff: the database clock, read once, fixed for the whole run.
pub const CUTOFF: &str = "SELECT now()";

/// The standbys' replay lag, as the server the cleaner writes to sees it (`cleanup.max_replica_lag`
/// and the dry run; [`super::throttle`]): whether this role may see the positions
/// (`pg_read_all_stats`, which `pg_monitor` includes; always true for a superuser), the role,
/// and one row per walsender — or one row with `false` in the third column when there is none.
/// Bytes behind: from the server's WAL insert position (its replay position when it is itself a
/// standby, so a dry run against a cascading standby works too) to the walsender's `replay_lsn`,
/// NULL until the standby has reported one. The insert position, not `pg_current_wal_lsn()`
/// (the write position): batches commit with `synchronous_commit = off`, so a batch's WAL may
/// not be written yet when the next check runs, and the lag it is about to cause would be missed. Reads shared memory only: no table, no
/// lock, microseconds — sent before each batch while the setting is on, and every
/// poll of a waiting run.
pub const REPLICA_LAG: &str = "\
SELECT v.visible, current_user::text, s.pid IS NOT NULL,
       coalesce(s.application_name, ''), s.state,
       pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                            ELSE pg_current_wal_insert_lsn() END,
                       s.replay_lsn)::bigint
FROM (SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS visible) AS v
LEFT JOIN pg_stat_replication AS s ON true
ORDER BY s.application_name, s.pid";

/// Tombstone one batch, waiting (up to `lock_timeout`) for rows other sessions hold.
pub const TOMBSTONE_BATCH: &str = "\
WITH picked AS MATERIALIZED (
    SELECT ctid AS tid, scope_id, idempotency_key, replay_deadline
    FROM {schema}.idempotency_records
    WHERE NOT expired
      AND replay_deadline >= coalesce($2::timestamptz, '-infinity')
      AND replay_deadline <= $3::timestamptz
    ORDER BY replay_deadline
    LIMIT $4
),
changed AS (
    UPDATE {schema}.idempotency_records AS r
    SET response_body = NULL, expired = true, expired_at = now()
    FROM (SELECT tid FROM picked
          ORDER BY scope_id, idempotency_key) AS k
    WHERE r.ctid = k.tid
      AND NOT r.expired
      AND r.replay_deadline <= $1::timestamptz
    RETURNING 1
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT count(*) FROM changed) AS changed,
       (SELECT max(replay_deadline) FROM picked) AS last";

/// Tombstone one batch without waiting: rows another session holds are passed over
/// (`cleanup.on_locked = "skip"`, and the one batch that isolates a held row after a lock
/// timeout). `SKIP LOCKED` never waits, so lock order cannot matter here.
///
/// `passed_over` counts the due rows in `[$2, last)` (or `[$2, $3]` when nothing was picked)
/// that were not picked: in this snapshot they were due, and the only reason to pass a due row
/// is its lock. Rows at exactly `last` are counted by the batch that moves past them. Both
/// bounds are index conditions, so the count reads the batch's own key range, never the backlog
/// beyond it.
pub const TOMBSTONE_BATCH_SKIP_LOCKED: &str = "\
WITH picked AS MATERIALIZED (
    SELECT ctid AS tid, replay_deadline
    FROM {schema}.idempotency_records
    WHERE NOT expired
      AND replay_deadline >= coalesce($2::timestamptz, '-infinity')
      AND replay_deadline <= $3::timestamptz
    ORDER BY replay_deadline
    LIMIT $4
    FOR NO KEY UPDATE SKIP LOCKED
),
changed AS (
    UPDATE {schema}.idempotency_records AS r
    SET response_body = NULL, expired = true, expired_at = now()
    FROM picked AS k
    WHERE r.ctid = k.tid
      AND NOT r.expired
      AND r.replay_deadline <= $1::timestamptz
    RETURNING 1
),
summary AS (
    SELECT count(*) AS picked, max(replay_deadline) AS last FROM picked
)
SELECT s.picked,
       (SELECT count(*) FROM changed) AS changed,
       s.last,
       (SELECT count(*) FROM {schema}.idempotency_records
        WHERE NOT expired
          AND replay_deadline >= coalesce($2::timestamptz, '-infinity')
          AND replay_deadline < coalesce(s.last, $3::timestamptz + interval '1 microsecond'))
       - (SELECT count(*) FROM picked WHERE replay_deadline < s.last) AS passed_over
FROM summary AS s";

/// Purge one batch of old tombstones (`retention.purge_tombstones_after`), waiting for held rows.
/// Same shape as [`TOMBSTONE_BATCH`], on the purge index (`expired_at WHERE expired`).
pub const PURGE_BATCH: &str = "\
WITH picked AS MATERIALIZED (
    SELECT ctid AS tid, scope_id, idempotency_key, expired_at
    FROM {schema}.idempotency_records
    WHERE expired
      AND expired_at >= coalesce($2::timestamptz, '-infinity')
      AND expired_at <= $3::timestamptz
    ORDER BY expired_at
    LIMIT $4
),
changed AS (
    DELETE FROM {schema}.idempotency_records AS r
    USING (SELECT tid FROM picked
           ORDER BY scope_id, idempotency_key) AS k
    WHERE r.ctid = k.tid
      AND r.expired
      AND r.expired_at <= $1::timestamptz
    RETURNING 1
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT count(*) FROM changed) AS changed,
       (SELECT max(expired_at) FROM picked) AS last";

/// Purge one batch without waiting; see [`TOMBSTONE_BATCH_SKIP_LOCKED`].
pub const PURGE_BATCH_SKIP_LOCKED: &str = "\
WITH picked AS MATERIALIZED (
    SELECT ctid AS tid, expired_at
    FROM {schema}.idempotency_records
    WHERE expired
      AND expired_at >= coalesce($2::timestamptz, '-infinity')
      AND expired_at <= $3::timestamptz
    ORDER BY expired_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
),
changed AS (
    DELETE FROM {schema}.idempotency_records AS r
    USING picked AS k
    WHERE r.ctid = k.tid
      AND r.expired
      AND r.expired_at <= $1::timestamptz
    RETURNING 1
),
summary AS (
    SELECT count(*) AS picked, max(expired_at) AS last FROM picked
)
SELECT s.picked,
       (SELECT count(*) FROM changed) AS changed,
       s.last,
       (SELECT count(*) FROM {schema}.idempotency_records
        WHERE expired
          AND expired_at >= coalesce($2::timestamptz, '-infinity')
          AND expired_at < coalesce(s.last, $3::timestamptz + interval '1 microsecond'))
       - (SELECT count(*) FROM picked WHERE expired_at < s.last) AS passed_over
FROM summary AS s";

/// Delete one batch of delivered outbox events (`retention.outbox_keep_delivered`), waiting
/// for held rows. Same shape as [`PURGE_BATCH`], on `outbox_events_delivered_idx`
/// (`published_at WHERE published_at IS NOT NULL`), row locks taken in `event_id` order. Only a
/// delivered event can match: pending events and dead letters have no `published_at`.
pub const OUTBOX_RETENTION_BATCH: &str = "\
WITH picked AS MATERIALIZED (
    SELECT ctid AS tid, event_id, published_at
    FROM {schema}.outbox_events
    WHERE published_at IS NOT NULL
      AND published_at >= coalesce($2::timestamptz, '-infinity')
      AND published_at <= $3::timestamptz
    ORDER BY published_at
    LIMIT $4
),
changed AS (
    DELETE FROM {schema}.outbox_events AS r
    USING (SELECT tid FROM picked ORDER BY event_id) AS k
    WHERE r.ctid = k.tid
      AND r.published_at IS NOT NULL
      AND r.published_at <= $1::timestamptz
    RETURNING 1
)
SELECT (SELECT count(*) FROM picked) AS picked,
       (SELECT count(*) FROM changed) AS changed,
       (SELECT max(published_at) FROM picked) AS last";

/// Delete one batch of delivered outbox events without waiting; see
/// [`TOMBSTONE_BATCH_SKIP_LOCKED`].
pub const OUTBOX_RETENTION_BATCH_SKIP_LOCKED: &str = "\
WITH picked AS MATERIALIZED (
    SELECT ctid AS tid, published_at
    FROM {schema}.outbox_events
    WHERE published_at IS NOT NULL
      AND published_at >= coalesce($2::timestamptz, '-infinity')
      AND published_at <= $3::timestamptz
    ORDER BY published_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
),
changed AS (
    DELETE FROM {schema}.outbox_events AS r
    USING picked AS k
    WHERE r.ctid = k.tid
      AND r.published_at IS NOT NULL
      AND r.published_at <= $1::timestamptz
    RETURNING 1
),
summary AS (
    SELECT count(*) AS picked, max(published_at) AS last FROM picked
)
SELECT s.picked,
       (SELECT count(*) FROM changed) AS changed,
       s.last,
       (SELECT count(*) FROM {schema}.outbox_events
        WHERE published_at IS NOT NULL
          AND published_at >= coalesce($2::timestamptz, '-infinity')
          AND published_at < coalesce(s.last, $3::timestamptz + interval '1 microsecond'))
       - (SELECT count(*) FROM picked WHERE published_at < s.last) AS passed_over
FROM summary AS s";

/// Due rows still there in one deadline range `[$1, $2]` (`$1` NULL = from the beginning): the
/// backlog a run leaves, counted only over the ranges where the run knows rows may remain, so the
/// count does not walk the index entries the run itself just left dead.
pub const DUE_IN_RANGE: &str = "\
SELECT count(*), min(replay_deadline)
FROM {schema}.idempotency_records
WHERE NOT expired
  AND replay_deadline >= coalesce($1::timestamptz, '-infinity')
  AND replay_deadline <= $2::timestamptz";

/// The deadlines that split the rows due at the cutoff `$1` into equal shares for
/// `cleanup.workers` (`$2`: the fractions 1/N, 2/N, ... (N-1)/N); NULL when nothing is due.
///
/// Workers take disjoint slices of the due **deadline range** `(b[i-1], b[i]]` rather than a hash
/// of the key modulo N: each worker then runs the unchanged batch statement over its slice, so
/// every batch is still an index range scan of `idempotency_records_due_idx` that reads only its
/// own rows (a hash filter would make every worker read every due row and step over the other
/// workers' fresh dead entries), and still locks its rows in primary-key order. Slices share no
/// row, so workers never wait for each other; each waits only for single-row lockers (replays,
/// claims), as one cleaner does. One pass over the due entries (what a dry run's count costs);
/// rows sharing one deadline stay in one slice, so a table whose due rows mostly share a deadline
/// splits unevenly (correct, only less parallel).
pub const SPLIT_DUE: &str = "\
SELECT percentile_disc($2::float8[]) WITHIN GROUP (ORDER BY replay_deadline)
FROM {schema}.idempotency_records
WHERE NOT expired AND replay_deadline <= $1::timestamptz";

/// Rows due at the cutoff `$1`, and the oldest due deadline: the dry run's and `status`'s
/// ([`super::Due`]).
pub const DUE_AT: &str = "\
SELECT count(*), min(replay_deadline)
FROM {schema}.idempotency_records
WHERE NOT expired AND replay_deadline <= $1::timestamptz";

/// Dry run: the tenants with the most rows due at `$1`.
pub const DRY_RUN_TOP_TENANTS: &str = "\
SELECT s.tenant_id, count(*) AS due
FROM {schema}.idempotency_records AS r
JOIN {schema}.idempotency_scopes AS s USING (scope_id)
WHERE NOT r.expired AND r.replay_deadline <= $1::timestamptz
GROUP BY s.tenant_id
ORDER BY due DESC, s.tenant_id
LIMIT 10";

/// Dry run: the operations with the most rows due at `$1`.
pub const DRY_RUN_TOP_OPERATIONS: &str = "\
SELECT s.operation, count(*) AS due
FROM {schema}.idempotency_records AS r
JOIN {schema}.idempotency_scopes AS s USING (scope_id)
WHERE NOT r.expired AND r.replay_deadline <= $1::timestamptz
GROUP BY s.operation
ORDER BY due DESC, s.operation
LIMIT 10";

/// Dry run: tombstones and live records in total (each through its partial index).
pub const DRY_RUN_TOTALS: &str = "\
SELECT (SELECT count(*) FROM {schema}.idempotency_records WHERE expired) AS tombstones,
       (SELECT count(*) FROM {schema}.idempotency_records WHERE NOT expired) AS live";

/// Dry run: tombstones a purge would delete (`expired_at <= $1`).
pub const DRY_RUN_PURGEABLE: &str = "\
SELECT count(*) FROM {schema}.idempotency_records WHERE expired AND expired_at <= $1::timestamptz";

/// Dry run: delivered outbox events in total (through the delivered index).
pub const DRY_RUN_OUTBOX_DELIVERED: &str =
    "SELECT count(*) FROM {schema}.outbox_events WHERE published_at IS NOT NULL";

/// Dry run: delivered outbox events retention would delete (`published_at <= $1`).
pub const DRY_RUN_OUTBOX_DELETABLE: &str = "\
SELECT count(*) FROM {schema}.outbox_events
WHERE published_at IS NOT NULL AND published_at <= $1::timestamptz";

// ---- the single-runner lease (migration V3, src/cleanup/lease.rs) ----------------------------
//
// These name the schema (`{schema}.cleanup_lease`): send them through `db::sql::qualify`. Every
// instant is the database clock; a lease's length `$3` travels as whole milliseconds.

/// The settings of the lease's own short transactions (take, release and record): `$1`
/// lock_timeout, `$2` statement_timeout, transaction-local.
pub const LEASE_SETTINGS: &str = "\
SELECT set_config('lock_timeout', $1, true),
       set_config('statement_timeout', $2, true)";

/// Takes the lease `$1` for holder `$2` until now + `$3` ms, in one statement: inserted when it
/// never existed, taken over when it has expired, and kept when `$2` already holds it (a retried
/// take). One row (`acquired_at`, `expires_at`) when this holder has it now, none when another
/// holder's lease is still running.
///
/// A lease is free once it has expired **or once the server session that last took or renewed it
/// has ended** (`holder_pid` no longer in `pg_stat_activity`): a run holds the lease on its own
/// session for its whole length and renews it only there, so a holder whose session is gone
/// (SIGKILL, a crash, a lost host once the server notices) can never commit another batch, and
/// the next fire takes over at once instead of after the lease's length. A recycled pid only
/// delays that to the expiry. Through a pooler the pid is a server connection's; if the pooler
/// closes it under a live run, another instance may take over and the old run stops at its next
/// batch (`lease_lost`): wasteful, never unsafe (two runs at once are safe).
///
/// A lease another holder holds (by its last committed renewal) proposes no row at all, so the
/// statement returns at once without touching the row lock, which a running batch holds while
/// it renews. Otherwise `ON CONFLICT DO UPDATE` locks the row first, so two takers at once are
/// serialised by the row lock and the second re-checks the first's expiry on the row's newest
/// version: exactly one wins.
///
/// The dead-session test applies only to a lease last taken or renewed before this transaction
/// began (`renewed_at < now()`). `pg_stat_activity` is read once per transaction, at its first
/// use — possibly before this statement waited on the row lock (PostgreSQL 18 plans it so) —
/// and a holder that took the lease while we waited may have connected after that read: its
/// pid would be missing from our copy, and the live holder would look dead (the test
/// `of_concurrent_takers_exactly_one_wins` saw three winners that way). A holder whose last take
/// or renewal precedes our transaction's start had its session before our read, so for it the
/// test is sound; a younger one is left to its expiry.
///
/// A take-over's instants are `clock_timestamp()` once the row is locked, not `now()`: the
/// statement may have waited for the previous holder's last transaction (the one that released
/// the lease and recorded its run), and `now()` — this transaction's start — would then date the
/// take before that release, making the runs' [started, finished] intervals in `cleanup_runs`
/// overlap although they took turns. One `clock_timestamp()` for all three columns keeps
/// `renewed_at >= acquired_at`.
pub const ACQUIRE_LEASE: &str = "\
INSERT INTO {schema}.cleanup_lease AS l
    (name, holder, holder_pid, holder_application_name, acquired_at, renewed_at, expires_at)
SELECT $1, $2, pg_backend_pid(), current_setting('application_name'), now(), now(),
       now() + $3::bigint * interval '1 millisecond'
WHERE NOT EXISTS (SELECT 1 FROM {schema}.cleanup_lease h
                  WHERE h.name = $1 AND h.holder <> $2 AND h.expires_at > now()
                    AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = h.holder_pid))
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder,
    holder_pid = excluded.holder_pid,
    holder_application_name = excluded.holder_application_name,
    (acquired_at, renewed_at, expires_at) = (
        SELECT CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE t.taken END,
               t.taken, t.taken + $3::bigint * interval '1 millisecond'
        FROM (SELECT clock_timestamp() AS taken) AS t)
WHERE l.expires_at <= now() OR l.holder = excluded.holder
   OR (l.renewed_at < now()
       AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.holder_pid))
RETURNING acquired_at, expires_at";

/// Renews the lease `$1` of holder `$2` until now + `$3` ms, or fails with SQLSTATE TS001
/// (`db::LEASE_LOST`) when `$2` no longer holds it: the first statement after the settings of
/// every batch transaction, so the batch commits only while its run holds the lease, and the
/// lease row stays locked by the batch until it commits (a taker waits, then sees it renewed).
///
/// By holder alone, expired or not: while the row still names this run, nobody else took the
/// lease since this run last renewed it, so continuing cannot overlap another run's batches.
pub const RENEW_LEASE: &str = "\
WITH renewed AS (
    UPDATE {schema}.cleanup_lease
    SET renewed_at = now(),
        expires_at = now() + $3::bigint * interval '1 millisecond',
        holder_pid = pg_backend_pid(),
        holder_application_name = current_setting('application_name')
    WHERE name = $1 AND holder = $2
    RETURNING expires_at
)
SELECT {schema}.cleanup_lease_required((SELECT expires_at FROM renewed))";

/// Checks, without locking the row, that holder `$2` still holds the lease `$1`, or fails with
/// SQLSTATE TS001 like [`RENEW_LEASE`]: the guard of every batch of a run with several workers.
/// Their batches cannot each renew the lease: the renewal locks the lease row until the batch
/// commits, so the workers would take turns on it. The run renews it from its own session
/// instead, a third of the lease's length apart ([`super::lease`]).
pub const LEASE_HELD: &str = "\
SELECT {schema}.cleanup_lease_required(
    (SELECT expires_at FROM {schema}.cleanup_lease WHERE name = $1 AND holder = $2))";

/// Ends a run in one statement: releases the lease `$1` if holder `$2` still has it
/// (`expires_at = now()`), records the run in `cleanup_runs` and trims the history to its
/// newest rows. `$3` when the run took the lease (its start: the same database clock, so the
/// [started, finished] intervals of runs taking turns never overlap), `$4` outcome, `$5` stopped_by, `$6`..
/// `$11` rows_tombstoned, tombstones_purged, outbox_events_deleted, lock_timeouts, rows_skipped,
/// batches, `$12` backlog_rows, `$13` error, `$14` how many of the existing rows to keep (the
/// history length minus one: the new row is not visible to this statement's own DELETE).
///
/// Written while the lease is still held, so the runs of instances taking turns never trim
/// concurrently; two writers at once (a run that lost its lease, recording next to the new
/// holder) can leave one row over the bound until the next run trims it.
pub const FINISH_RUN: &str = "\
WITH released AS (
    UPDATE {schema}.cleanup_lease
    SET expires_at = least(expires_at, now())
    WHERE name = $1 AND holder = $2
    RETURNING 1
),
recorded AS (
    INSERT INTO {schema}.cleanup_runs
        (instance, started_at, finished_at, outcome, stopped_by, rows_tombstoned,
         tombstones_purged, outbox_events_deleted, lock_timeouts, rows_skipped, batches,
         backlog_rows, error)
    VALUES ($2, least($3::timestamptz, now()), now(), $4, $5, $6, $7, $8, $9,
            $10, $11, $12, $13)
    RETURNING run_id
),
trimmed AS (
    DELETE FROM {schema}.cleanup_runs
    WHERE run_id <= (SELECT run_id FROM {schema}.cleanup_runs
                     ORDER BY run_id DESC OFFSET $14 LIMIT 1)
    RETURNING 1
)
SELECT (SELECT count(*) FROM released) AS released,
       (SELECT run_id FROM recorded) AS run_id,
       (SELECT count(*) FROM trimmed) AS trimmed";

/// Releases the lease `$1` if holder `$2` still has it, recording nothing.
pub const RELEASE_LEASE: &str = "\
UPDATE {schema}.cleanup_lease SET expires_at = least(expires_at, now())
WHERE name = $1 AND holder = $2";

/// The lease row `$1` as it stands, with the database clock: who holds or last held it, since
/// when, until when (`held` = not yet expired).
pub const LEASE_STATE: &str = "\
SELECT holder, holder_pid, holder_application_name, acquired_at, renewed_at, expires_at,
       expires_at > now()
           AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = holder_pid) AS held,
       now() AS now
FROM {schema}.cleanup_lease
WHERE name = $1";

/// The last `$1` runs of the history, newest first.
pub const RECENT_RUNS: &str = "\
SELECT run_id, instance, started_at, finished_at, outcome, stopped_by, rows_tombstoned,
       tombstones_purged, outbox_events_deleted, lock_timeouts, rows_skipped, batches,
       backlog_rows, error
FROM {schema}.cleanup_runs
ORDER BY run_id DESC
LIMIT $1";

/// The newest run that made progress without error (`success` or `partial`, as the
/// `cleanup_last_success_timestamp_seconds` metric counts it).
pub const LAST_SUCCESSFUL_RUN: &str = "\
SELECT run_id, instance, started_at, finished_at, outcome, stopped_by, rows_tombstoned,
       tombstones_purged, outbox_events_deleted, lock_timeouts, rows_skipped, batches,
       backlog_rows, error
FROM {schema}.cleanup_runs
WHERE outcome IN ('success', 'partial')
ORDER BY run_id DESC
LIMIT 1";

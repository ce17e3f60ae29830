//! The statements of `tombstoned keys explain`, in one place so the way it reads without locking
//! can be reviewed at once. All run in one `READ ONLY` transaction (REPEATABLE READ: one snapshot
//! for every read); none takes a row lock (`FOR SHARE` is refused in a read-only transaction, and
//! would make a cleaner or a claim wait), and the only table locks are `AccessShareLock`s, which
//! conflict with DDL alone. The record's lock holder is found from the row's `xmax` and
//! `pg_locks`; an uncommitted claim, which no snapshot shows, from the primary key's index
//! (module documentation of [`super`]).

/// Starts the explain's transaction.
pub const BEGIN: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";

/// Ends it: nothing was written.
pub const END: &str = "ROLLBACK";

/// The transaction's settings: `$1` lock_timeout (a DDL holding the tables), `$2`
/// statement_timeout; and the planner kept off sequential and bitmap scans, so the probe reads
/// the unique index entry by entry (an index or index-only scan: it counts the entries it
/// returns and marks those whose row is dead to everyone, [`PROBE_RECORD`]). Every other read is
/// a primary-key or unique-key lookup anyway. Returns the role reading (an error for want of a
/// grant names it).
pub const SETTINGS: &str = "\
SELECT current_user::text, set_config('lock_timeout', $1, true),
       set_config('statement_timeout', $2, true),
       set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)";

/// Whether this role may execute the SQL API's `fingerprint(jsonb)` (an intent of an operation
/// other than the endpoint's is fingerprinted by it, never re-implemented).
pub const MAY_FINGERPRINT: &str =
    "SELECT has_function_privilege('{schema}.fingerprint(jsonb)', 'EXECUTE')";

/// `$1` the intent (JSON text): its fingerprint as the SQL API computes it.
pub const FINGERPRINT: &str = "SELECT {schema}.fingerprint($1::jsonb)";

/// The scope `$1` tenant, `$2` principal, `$3` operation and its record of key `$4`, without the
/// body, read without a lock: always one row (`scope_id` NULL: no such scope; `found` false: no
/// committed record). The window is judged by the schema's rule on the transaction's clock, as
/// the endpoint judges it; `xmax` (as text) names the transaction that locked or updated the row
/// version last, if any ([`HOLDER`]).
pub const RECORD: &str = "\
SELECT s.scope_id, now() AS read_at, pg_has_role('pg_read_all_stats', 'USAGE') AS sees_all_sessions,
       r.scope_id IS NOT NULL AS found, r.created_at, r.replay_deadline, r.expired, r.expired_at,
       r.status_code, r.resource_id, r.order_id, r.fingerprint,
       NOT {schema}.replay_window_open(r.replay_deadline, now()) AS past_deadline,
       r.xmax::text AS xmax
FROM (SELECT 1) AS one
LEFT JOIN {schema}.idempotency_scopes AS s
       ON s.tenant_id = $1 AND s.principal_id = $2 AND s.operation = $3
LEFT JOIN {schema}.idempotency_records AS r
       ON r.scope_id = s.scope_id AND r.idempotency_key = $4";

/// `$1` scope id, `$2` key: the stored body (`--show-body` only; a role may be granted every
/// column but this one).
pub const BODY: &str = "\
SELECT response_body::text FROM {schema}.idempotency_records
WHERE scope_id = $1 AND idempotency_key = $2";

/// `$1` a record's `xmax` (text): the session whose open transaction has that id, when that
/// transaction also holds a row-level lock mode on the records table — so it holds the row's
/// lock now (a replay's `FOR SHARE`, the cleaner's `FOR NO KEY UPDATE`, an uncommitted update). A
/// finished locker's id stays in the row until it is overwritten and matches no open
/// transaction. Several share lockers at once leave a multixact id there, which matches none
/// either (this read cannot expand it without the risk of an error).
pub const HOLDER: &str = "\
SELECT l.pid FROM pg_locks AS l
WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted
  AND l.transactionid = $1::text::xid AND l.pid <> pg_backend_pid()
  AND EXISTS (SELECT 1 FROM pg_locks AS t
              WHERE t.pid = l.pid AND t.locktype = 'relation' AND t.granted
                AND t.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND t.relation = '{schema}.idempotency_records'::regclass
                AND t.mode IN ('RowShareLock', 'RowExclusiveLock'))";

/// `$1` an index (its qualified name): the probe's counters of it in this transaction, index
/// scans and index entries returned (`pg_stat_get_xact_*`: this backend's own counts, not yet
/// reported).
pub const INDEX_COUNTERS: &str = "\
SELECT pg_stat_get_xact_numscans($1::text::regclass),
       pg_stat_get_xact_tuples_returned($1::text::regclass)";

/// `$1` scope id, `$2` key, through the primary key: the rows visible to this snapshot. The index
/// returns every entry of the key, also one whose row no snapshot shows yet — an uncommitted
/// insert — or any more (a dead version, which the scan marks dead in the index when it is dead
/// to everyone, so a second scan no longer returns it).
pub const PROBE_RECORD: &str = "\
SELECT count(*) FROM {schema}.idempotency_records WHERE scope_id = $1 AND idempotency_key = $2";

/// [`PROBE_RECORD`] for the scope `$1` tenant, `$2` principal, `$3` operation.
pub const PROBE_SCOPE: &str = "\
SELECT count(*) FROM {schema}.idempotency_scopes
WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3";

/// `$1` a table (its qualified name): the sessions whose open transaction has written to it and
/// not committed (a row-exclusive lock on it, and a transaction id). A relation's lock names it
/// by database and OID: databases cloned from one template share their tables' OIDs, so the
/// database is part of the match. An uncommitted claim of a
/// record (or of a scope's first key, for the scopes table) is one of them.
pub const WRITERS: &str = "\
SELECT DISTINCT l.pid FROM pg_locks AS l
WHERE l.locktype = 'relation' AND l.mode = 'RowExclusiveLock' AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.relation = $1::text::regclass AND l.pid <> pg_backend_pid()
  AND EXISTS (SELECT 1 FROM pg_locks AS x
              WHERE x.pid = l.pid AND x.locktype = 'transactionid' AND x.granted
                AND x.mode = 'ExclusiveLock')
ORDER BY l.pid";

/// `$1` pids (int4[]): each session as this role may see it. `visible`: whether the role may
/// see its state (its own role's sessions, or `pg_read_all_stats`, which `pg_monitor`
/// includes); otherwise `pg_stat_activity` shows only its pid, role and application name, and
/// the state, times and wait are NULL. The locks it holds on the records table and the sessions
/// it waits for and blocks come from `pg_locks`, which every role may read.
pub const SESSIONS: &str = "\
SELECT a.pid, a.application_name, a.usename::text AS role,
       pg_has_role('pg_read_all_stats', 'USAGE')
           OR (a.usesysid IS NOT NULL AND pg_has_role(a.usesysid, 'USAGE')) AS visible,
       a.state, extract(epoch FROM clock_timestamp() - a.xact_start)::float8 AS transaction_seconds,
       a.wait_event_type, a.wait_event,
       pg_blocking_pids(a.pid) AS waiting_for,
       ARRAY(SELECT l.mode FROM pg_locks AS l
             WHERE l.pid = a.pid AND l.locktype = 'relation' AND l.granted
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND l.relation = '{schema}.idempotency_records'::regclass
             ORDER BY l.mode) AS record_locks,
       ARRAY(SELECT b.pid FROM pg_stat_activity AS b
             WHERE a.pid = ANY (pg_blocking_pids(b.pid)) ORDER BY b.pid) AS blocking
FROM pg_stat_activity AS a
WHERE a.pid = ANY ($1)
ORDER BY a.pid";

/// `$1` tenant, `$2` principal, `$3` key, `$4` the operation asked about: the other operations of
/// that tenant and principal that have a record of the key (a key looked up in the wrong
/// operation is the first thing to rule out).
pub const OTHER_OPERATIONS: &str = "\
SELECT s.operation FROM {schema}.idempotency_scopes AS s
JOIN {schema}.idempotency_records AS r ON r.scope_id = s.scope_id AND r.idempotency_key = $3
WHERE s.tenant_id = $1 AND s.principal_id = $2 AND s.operation <> $4
ORDER BY s.operation";

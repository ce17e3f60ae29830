//! The statements that ask a database about its schema, by name: the migration history, the SQL
//! API's version, whether the endpoint's claim functions may be executed, and the migrate
//! session's own (its advisory lock, its schema and `search_path`).

/// Waits for the session-level advisory lock on the text key `$1` (hashed by the server with
/// `hashtextextended($1, 0)`; in `pg_locks`: locktype `advisory`, objsubid 1). Session state:
/// never through a transaction pooler.
pub const ADVISORY_LOCK: &str = "SELECT pg_advisory_lock(hashtextextended($1, 0))";

/// Releases the advisory lock on `$1` (closing the session releases it too).
pub const ADVISORY_UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";

/// Creates the configured schema if it is missing. DDL takes no parameter: `schema` is a plain
/// lower-case identifier (the configuration validates it) and is quoted anyway.
pub fn create_schema(schema: &str) -> String {
    format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\"")
}

/// Resolves the migration files' unqualified names in `schema` for the rest of the (dedicated)
/// migrate session.
pub fn set_search_path(schema: &str) -> String {
    format!("SET search_path TO \"{schema}\"")
}

/// Whether the history table exists.
pub const HISTORY_EXISTS: &str = "SELECT to_regclass('{schema}.schema_history') IS NOT NULL";

/// The history, oldest first (the table refinery keeps, `schema_history`).
pub const HISTORY: &str =
    "SELECT version, name, applied_on, checksum FROM {schema}.schema_history \
                           ORDER BY version";

/// The schema's `api_version()`; no argument.
pub const API_VERSION: &str = "SELECT {schema}.api_version()";

/// This session's role, and whether it may execute both of the endpoint's claim functions
/// (migration V6; `crate::claim::sql::CALL_CLAIM_AND_CREATE` and `CALL_CLAIM_REJECTED` call
/// them): `serve` asks it at start-up when its claims go through a transaction pooler.
pub const MAY_EXECUTE_CLAIM_FUNCTIONS: &str = "\
SELECT current_user::text,
       has_function_privilege('{schema}.endpoint_claim_order(text, text, text, text, bytea, uuid, \
text, bigint, text, text, text, integer, text, bigint, uuid, jsonb, text)', 'EXECUTE')
       AND has_function_privilege('{schema}.endpoint_claim_rejected(text, text, text, text, \
bytea, smallint, jsonb, bigint, text)', 'EXECUTE')";

/// What the migrate session `$1` (its pid) is doing, as another session of the same role sees
/// it: its wait, the sessions it waits for, its index build (`pg_stat_progress_create_index`:
/// phase, blocks and tuples), the strong table locks it holds (those that hold the application
/// back: `ShareLock` and above, as "<mode> on <relation>") and the lock it waits for, if any. A
/// relation the migration created and has not committed yet is not in this session's catalogue:
/// it shows as its oid. Reads views only; locks nothing.
pub const MIGRATION_ACTIVITY: &str = "\
SELECT a.wait_event_type, a.wait_event, pg_blocking_pids(a.pid) AS blocked_by,
       p.phase, p.blocks_total, p.blocks_done, p.tuples_total, p.tuples_done,
       p.index_relid::regclass::text AS index_name, p.relid::regclass::text AS table_name,
       ARRAY(SELECT l.mode || ' on ' || l.relation::regclass::text
             FROM pg_locks AS l
             WHERE l.pid = a.pid AND l.granted AND l.locktype = 'relation'
               AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
                              'AccessExclusiveLock')
             ORDER BY l.relation::regclass::text, l.mode) AS holds,
       w.locktype AS waits_locktype, w.mode AS waits_mode,
       w.relation::regclass::text AS waits_relation
FROM pg_stat_activity AS a
LEFT JOIN pg_stat_progress_create_index AS p ON p.pid = a.pid
LEFT JOIN LATERAL (SELECT l.locktype, l.mode, l.relation FROM pg_locks AS l
                   WHERE l.pid = a.pid AND NOT l.granted LIMIT 1) AS w ON true
WHERE a.pid = $1";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_are_quoted() {
        assert_eq!(
            create_schema("idem"),
            "CREATE SCHEMA IF NOT EXISTS \"idem\""
        );
        assert_eq!(set_search_path("idem"), "SET search_path TO \"idem\"");
    }
}

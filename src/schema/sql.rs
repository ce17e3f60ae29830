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

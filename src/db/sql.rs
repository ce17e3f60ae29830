//! The statements several parts of tombstoned share (each feature's own statements live in its
//! `sql` module: [`crate::claim::sql`], [`crate::cleanup::sql`]), and the one way a duration
//! becomes a PostgreSQL setting. Every value is a parameter.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Where a statement names tombstoned's schema: `FROM {schema}.idempotency_records`. Statements
/// name the schema instead of relying on `search_path`, because nothing may be set on a session
/// that a connection pooler hands to other clients (`options` at start-up is refused by
/// PgBouncer; a session-level `SET` leaks in transaction pooling). See [`qualify`].
pub const SCHEMA_MARKER: &str = "{schema}";

/// Opens a transaction READ COMMITTED, whatever the server's default: the protocol's re-checks
/// after a lock wait rely on it (docs/protocol.md).
pub const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Opens a transaction that can write nothing (READ COMMITTED, READ ONLY): the API's lookups and
/// the replay it answers while the database refuses writes. Also what a standby accepts.
pub const BEGIN_READ_ONLY: &str = "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY";

/// Whether the server is a standby, and whether a transaction begun now would be read-only
/// (`default_transaction_read_only`, which a configuration reload changes for open sessions
/// too): the two ways a server answers writes with 25006.
pub const READ_ONLY_CHECK: &str =
    "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'";

/// The cheapest statement a server answers: readiness sends it (simple protocol) to see a pooled
/// connection is alive.
pub const PING: &str = "SELECT 1";

/// Ends a transaction; a ROLLBACK when a statement in it failed.
pub const COMMIT: &str = "COMMIT";

/// The transaction's `lock_timeout` (`is_local = true`: it ends with the transaction), `$1` as
/// [`duration_setting`] renders it.
pub const SET_LOCAL_LOCK_TIMEOUT: &str = "SELECT set_config('lock_timeout', $1, true)";

/// The transaction's `statement_timeout` (`is_local = true`: it ends with the transaction, so
/// nothing is left on a session a pooler hands on), `$1` as [`duration_setting`] renders it.
pub const SET_LOCAL_STATEMENT_TIMEOUT: &str = "SELECT set_config('statement_timeout', $1, true)";

/// The settings a pooled API session carries session-wide on a direct connection (or through a
/// session pooler), so that a statement sent alone — its own implicit transaction — runs the way
/// the claim's transaction must: READ COMMITTED whatever the server's, the database's or the
/// role's default, and with `api.claim_lock_timeout` (`$1`, as [`duration_setting`] renders it).
/// Sent alone, so it commits at its own Sync and holds until the session ends or sets them again
/// (inside an explicit transaction a rollback would undo it). Never through a transaction pooler,
/// where the next transaction may run on a server connection shared with other clients
/// (`super::pooled::SessionSettings`).
pub const SET_SESSION_SETTINGS: &str = "SELECT set_config('lock_timeout', $1, false), \
set_config('default_transaction_isolation', 'read committed', false)";

/// A duration as a timeout setting's value: whole milliseconds, at least 1 (`"5000ms"`), since 0
/// would mean "no bound". Configuration keeps timeouts within what PostgreSQL accepts.
pub fn duration_setting(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// `template` with every [`SCHEMA_MARKER`] replaced by the quoted schema name: the text to send.
///
/// Rendered once per (statement, schema) and kept for the life of the process, so the result is a
/// `&'static str` like the templates themselves: call sites stay as cheap as with constant text
/// (the set is bounded: a few dozen statements times the schemas a process uses, normally one).
/// The schema is validated by the configuration as a plain lower-case identifier; it is quoted
/// anyway. A template without the marker is returned as it is.
pub fn qualify(template: &'static str, schema: &str) -> &'static str {
    if !template.contains(SCHEMA_MARKER) {
        return template;
    }
    // By template, then by schema: a lookup (every statement a request sends) allocates nothing.
    type Rendered = HashMap<usize, Vec<(String, &'static str)>>;
    static RENDERED: Mutex<Option<Rendered>> = Mutex::new(None);
    let mut rendered = RENDERED.lock().unwrap_or_else(PoisonError::into_inner);
    let by_schema = rendered
        .get_or_insert_with(HashMap::new)
        .entry(template.as_ptr() as usize)
        .or_default();
    if let Some((_, text)) = by_schema.iter().find(|(s, _)| s == schema) {
        return text;
    }
    let quoted = format!("\"{}\"", schema.replace('"', "\"\""));
    let text: &'static str = Box::leak(template.replace(SCHEMA_MARKER, &quoted).into_boxed_str());
    by_schema.push((schema.to_owned(), text));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_quoted_schema_and_are_rendered_once() {
        const T: &str = "SELECT 1 FROM {schema}.t JOIN {schema}.u USING (id)";
        let a = qualify(T, "tomb");
        assert_eq!(a, r#"SELECT 1 FROM "tomb".t JOIN "tomb".u USING (id)"#);
        assert!(std::ptr::eq(a, qualify(T, "tomb")), "rendered once");
        assert_eq!(
            qualify(T, "other"),
            r#"SELECT 1 FROM "other".t JOIN "other".u USING (id)"#
        );
        assert!(std::ptr::eq(qualify(COMMIT, "tomb"), COMMIT));
    }

    #[test]
    fn timeouts_are_sent_as_milliseconds_and_never_as_zero() {
        assert_eq!(duration_setting(Duration::from_secs(5)), "5000ms");
        assert_eq!(duration_setting(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration_setting(Duration::from_micros(10)), "1ms");
        assert_eq!(duration_setting(Duration::ZERO), "1ms");
    }
}

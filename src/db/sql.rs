//! The statements several parts of tombstoned share (each feature's own statements live in its
//! `sql` module: [`crate::claim::sql`], [`crate::cleanup::sql`]), and the one way a duration
//! becomes a PostgreSQL setting. Every value is a parameter.

use std::time::Duration;

/// Opens a transaction READ COMMITTED, whatever the server's default: the protocol's re-checks
/// after a lock wait rely on it (docs/protocol.md).
pub const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

/// Ends a transaction; a ROLLBACK when a statement in it failed.
pub const COMMIT: &str = "COMMIT";

/// The session's `statement_timeout` (`is_local = false`: until the session ends), `$1` as
/// [`duration_setting`] renders it.
pub const SET_STATEMENT_TIMEOUT: &str = "SELECT set_config('statement_timeout', $1, false)";

/// Waits for the session-level advisory lock on the text key `$1` (hashed by the server with
/// `hashtextextended($1, 0)`; in `pg_locks`: locktype `advisory`, objsubid 1).
pub const ADVISORY_LOCK: &str = "SELECT pg_advisory_lock(hashtextextended($1, 0))";

/// Takes the advisory lock on `$1` if free, without waiting: one boolean, whether it was taken.
pub const ADVISORY_TRY_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended($1, 0))";

/// Releases the advisory lock on `$1` (closing the session releases it too).
pub const ADVISORY_UNLOCK: &str = "SELECT pg_advisory_unlock(hashtextextended($1, 0))";

/// A duration as a timeout setting's value: whole milliseconds, at least 1 (`"5000ms"`), since 0
/// would mean "no bound". Configuration keeps timeouts within what PostgreSQL accepts.
pub fn duration_setting(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_sent_as_milliseconds_and_never_as_zero() {
        assert_eq!(duration_setting(Duration::from_secs(5)), "5000ms");
        assert_eq!(duration_setting(Duration::from_millis(1500)), "1500ms");
        assert_eq!(duration_setting(Duration::from_micros(10)), "1ms");
        assert_eq!(duration_setting(Duration::ZERO), "1ms");
    }
}

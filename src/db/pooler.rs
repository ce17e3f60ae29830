//! `database.pooler`: what sits between tombstoned and PostgreSQL, and what that allows — named
//! prepared statements, and session state (a session-level advisory lock or `SET`) spanning
//! transactions. Also how the symptom of a transaction-mode pooler configured as `"none"` is
//! recognised (by SQLSTATE) so that the error names the setting.
//!
//! Whatever the setting, nothing is sent as a startup `options` parameter, and statements name
//! the schema ([`super::sql::qualify`]). Through a transaction pooler no setting is left on a
//! session: every setting a statement needs is transaction-local (`set_config(..., true)` inside
//! its transaction). Where a session is the daemon's from connect to close (`none`, `session`),
//! the API's pooled sessions carry the claim's READ COMMITTED and lock timeout session-wide
//! ([`super::pooled`]), so the claim is one statement; everything else stays transaction-local.

use std::fmt;

use tokio_postgres::error::SqlState;

/// `database.pooler`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pooler {
    /// Direct connections (the default): a session is ours from connect to close.
    #[default]
    None,
    /// A pooler in session mode (PgBouncer `pool_mode = session`, RDS Proxy without pinning
    /// concerns): a client keeps its server connection until it disconnects. Behaves as `None`.
    Session,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`, Neon's `-pooler` host,
    /// Supabase's port 6543): consecutive transactions of one client may run on different server
    /// connections, shared with other clients. No named prepared statement may outlive its
    /// transaction, and nothing may rely on session state.
    Transaction,
}

impl Pooler {
    /// The configuration value: `"none"`, `"session"` or `"transaction"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooler::None => "none",
            Pooler::Session => "session",
            Pooler::Transaction => "transaction",
        }
    }

    /// Parses the configuration value; `None` for anything else.
    pub fn parse(text: &str) -> Option<Pooler> {
        match text {
            "none" => Some(Pooler::None),
            "session" => Some(Pooler::Session),
            "transaction" => Some(Pooler::Transaction),
            _ => None,
        }
    }

    /// Whether a named prepared statement may be kept for later transactions of a session: not
    /// through a transaction pooler, whose next transaction may run on another server connection
    /// (26000, "does not exist") or leave the statement behind for another client (42P05,
    /// "already exists").
    pub fn keeps_prepared_statements(self) -> bool {
        self != Pooler::Transaction
    }

    /// Whether session state (a session-level advisory lock, `SET search_path`) lasts from one
    /// transaction to the next. `migrate` needs it.
    pub fn keeps_session_state(self) -> bool {
        self != Pooler::Transaction
    }

    /// What `check-config` says about the mode.
    pub fn describe(self) -> &'static str {
        match self {
            Pooler::None => {
                "none (direct connections; statements prepared once per pooled connection)"
            }
            Pooler::Session => {
                "session (a session-mode pooler; statements prepared once per pooled connection)"
            }
            Pooler::Transaction => {
                "transaction (a transaction-mode pooler; unnamed statements only, nothing kept \
                 on a session; `migrate` needs a direct or session-pooled URL)"
            }
        }
    }
}

impl fmt::Display for Pooler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an error with [`is_misuse_symptom`] adds to its text: the setting to look at.
pub const MISUSE_HINT: &str = "a prepared statement was missing or already present on the server \
connection: a transaction-mode connection pooler is in between? then set database.pooler = \
\"transaction\"";

/// Whether `code` is what a transaction-mode pooler does to named prepared statements when
/// tombstoned was told there is none: 26000 invalid_sql_statement_name (the statement was
/// prepared on another server connection) or 42P05 duplicate_prepared_statement (another client
/// left one of that name on this server connection). tombstoned never names a statement itself,
/// so neither has another cause.
pub fn is_misuse_symptom(code: &SqlState) -> bool {
    *code == SqlState::INVALID_SQL_STATEMENT_NAME || *code == SqlState::DUPLICATE_PSTATEMENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_only_transaction_mode_forbids_session_state() {
        for p in [Pooler::None, Pooler::Session, Pooler::Transaction] {
            assert_eq!(Pooler::parse(p.as_str()), Some(p));
            assert_eq!(p.to_string(), p.as_str());
        }
        assert_eq!(Pooler::parse("Transaction"), None);
        assert_eq!(Pooler::default(), Pooler::None);
        assert!(Pooler::Session.keeps_prepared_statements());
        assert!(!Pooler::Transaction.keeps_prepared_statements());
        assert!(!Pooler::Transaction.keeps_session_state());
    }

    #[test]
    fn the_symptoms_are_the_two_prepared_statement_sqlstates() {
        assert!(is_misuse_symptom(&SqlState::from_code("26000")));
        assert!(is_misuse_symptom(&SqlState::from_code("42P05")));
        assert!(!is_misuse_symptom(&SqlState::from_code("42P01")));
        assert!(MISUSE_HINT.contains("database.pooler"));
    }
}

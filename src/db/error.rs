//! Database failures and what a caller can do about them: [`DbError`] (with the server it
//! concerns, password redacted) and its [`ErrorClass`], derived from the SQLSTATE only — never
//! from message text.

use tokio_postgres::error::SqlState;

/// A database failure, with the server it concerns (password redacted).
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The connection could not be established (refused, timed out, TLS, authentication, ...).
    #[error("cannot connect to PostgreSQL: {source}")]
    Connect {
        /// Why, for each host tried (one line, never the password).
        #[source]
        source: super::connect::ConnectError,
    },
    /// The pool could not hand out a connection in time, or could not open one.
    #[error("no database connection available")]
    Pool(#[source] deadpool_postgres::PoolError),
    /// The pool could not be built from the configuration.
    #[error("cannot build the connection pool")]
    BuildPool(#[source] deadpool_postgres::BuildError),
    /// A statement failed.
    #[error("database error")]
    Query(#[from] tokio_postgres::Error),
    /// The database did not answer within the client-side bound ([`super::deadline`]): the
    /// connection may be silent (a lost NAT entry, a partition, a hung server) or stuck
    /// mid-statement, so it is discarded, never reused.
    #[error("the database did not answer {what} within {}", humantime::format_duration(*.after))]
    Timeout {
        /// What was waited for ("the claim", "a tombstone batch", ...).
        what: &'static str,
        /// The bound.
        after: std::time::Duration,
    },
}

impl DbError {
    /// How this failure should be treated; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            DbError::Connect { .. } | DbError::Timeout { .. } => ErrorClass::Unavailable,
            DbError::Pool(deadpool_postgres::PoolError::Backend(e)) | DbError::Query(e) => {
                classify(e)
            }
            DbError::Pool(_) => ErrorClass::Unavailable,
            DbError::BuildPool(_) => ErrorClass::Other,
        }
    }

    /// The server's SQLSTATE (`"53100"`, ...), when the server answered with one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            DbError::Pool(deadpool_postgres::PoolError::Backend(e)) | DbError::Query(e) => {
                e.code().map(SqlState::code)
            }
            _ => None,
        }
    }

    /// The two-character SQLSTATE class for metrics (`"55"`, `"23"`, ...), `"connection"` when
    /// there is no server error code (connection refused, reset or closed), `"timeout"` when the
    /// database did not answer within the client-side bound, `"pool_timeout"` when no pooled
    /// connection was free in time.
    pub fn sqlstate_class(&self) -> &str {
        match self {
            DbError::Pool(deadpool_postgres::PoolError::Backend(e)) | DbError::Query(e) => {
                sqlstate_class(e)
            }
            DbError::Pool(deadpool_postgres::PoolError::Timeout(_)) => "pool_timeout",
            DbError::Timeout { .. } => "timeout",
            _ => "connection",
        }
    }
}

/// What a caller can do about an error. Derived from the SQLSTATE only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// 55P03 lock_not_available: a `lock_timeout` expired waiting for a row lock.
    LockNotAvailable,
    /// 23505 unique_violation.
    UniqueViolation,
    /// 40001 serialization_failure: retry the whole transaction.
    SerializationFailure,
    /// 40P01 deadlock_detected: retry the whole transaction.
    Deadlock,
    /// 57014 query_canceled: `statement_timeout` or a cancel request.
    QueryCanceled,
    /// Class 08, an admin/crash shutdown (57P01-57P03), 53300 too_many_connections (refused at
    /// connection start), or no SQLSTATE at all because the socket failed: the database is
    /// unreachable or the connection is gone.
    Unavailable,
    /// 25006 read_only_sql_transaction: the server refuses writes — a standby (a demoted
    /// primary after a failover), or `default_transaction_read_only = on`. Nothing was written;
    /// the connection is evicted so the pool reconnects to whichever host is the primary now.
    ReadOnly,
    /// The rest of class 53, insufficient resources (53100 disk_full, 53200 out_of_memory,
    /// 53400 configuration_limit_exceeded): the server answered and rolled the statement back;
    /// retry later, nothing to fix in the request.
    InsufficientResources,
    /// [`LEASE_LOST`]: the cleanup lease's renewal found the lease held by another run
    /// (migration V3's `cleanup_lease_required`); the batch transaction rolled back whole.
    LeaseLost,
    /// [`WRONG_ISOLATION`]: the endpoint's claim function (migration V6) was called in a
    /// transaction that is not READ COMMITTED (an implicit transaction under a server default of
    /// another level); it did nothing. Run it again inside `BEGIN ISOLATION LEVEL READ COMMITTED`.
    WrongIsolation,
    /// Anything else: a bug or a schema problem, not something to retry blindly.
    Other,
}

/// The SQLSTATE the cleanup lease's renewal raises when this run no longer holds the lease: class
/// `TS`, tombstoned's own (PostgreSQL uses no class starting with `T`).
pub const LEASE_LOST: &str = "TS001";

/// The SQLSTATE the endpoint's claim functions (migration V6) raise outside READ COMMITTED.
pub const WRONG_ISOLATION: &str = "TS005";

/// Classifies a driver error by its SQLSTATE.
pub fn classify(err: &tokio_postgres::Error) -> ErrorClass {
    let Some(code) = err.code() else {
        // No server error: the connection failed or closed (or a client-side conversion
        // failed, which the io-source check tells apart).
        return if err.is_closed() || has_io_source(err) {
            ErrorClass::Unavailable
        } else {
            ErrorClass::Other
        };
    };
    if *code == SqlState::LOCK_NOT_AVAILABLE {
        ErrorClass::LockNotAvailable
    } else if *code == SqlState::UNIQUE_VIOLATION {
        ErrorClass::UniqueViolation
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE {
        ErrorClass::SerializationFailure
    } else if *code == SqlState::T_R_DEADLOCK_DETECTED {
        ErrorClass::Deadlock
    } else if *code == SqlState::QUERY_CANCELED {
        ErrorClass::QueryCanceled
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        ErrorClass::ReadOnly
    } else if code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
    {
        ErrorClass::Unavailable
    } else if code.code().starts_with("53") {
        ErrorClass::InsufficientResources
    } else if code.code() == LEASE_LOST {
        ErrorClass::LeaseLost
    } else if code.code() == WRONG_ISOLATION {
        ErrorClass::WrongIsolation
    } else {
        ErrorClass::Other
    }
}

/// The SQLSTATE class (first two characters), or `"connection"` without a server error code.
pub fn sqlstate_class(err: &tokio_postgres::Error) -> &str {
    match err.code() {
        Some(code) => code.code().get(..2).unwrap_or("unknown"),
        None => "connection",
    }
}

/// The constraint a server error names, for telling one unique violation from another.
pub fn violated_constraint(err: &tokio_postgres::Error) -> Option<&str> {
    err.as_db_error().and_then(|e| e.constraint())
}

fn has_io_source(err: &tokio_postgres::Error) -> bool {
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        if e.is::<std::io::Error>() {
            return true;
        }
        source = e.source();
    }
    false
}

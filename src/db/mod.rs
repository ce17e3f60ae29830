//! Database access: connection settings every session gets, the pooled and dedicated sessions,
//! and the classification of PostgreSQL errors by SQLSTATE (never by message text).

pub mod migrations;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

use crate::config::DatabaseConfig;

/// A database failure, with the server it concerns (password redacted).
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The connection could not be established (refused, timed out, authentication failed, ...).
    #[error("cannot connect to PostgreSQL at {target}")]
    Connect {
        /// The redacted URL.
        target: String,
        /// Why.
        #[source]
        source: tokio_postgres::Error,
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
}

impl DbError {
    /// How this failure should be treated; see [`ErrorClass`].
    pub fn class(&self) -> ErrorClass {
        match self {
            DbError::Connect { .. } => ErrorClass::Unavailable,
            DbError::Pool(deadpool_postgres::PoolError::Backend(e)) | DbError::Query(e) => {
                classify(e)
            }
            DbError::Pool(_) => ErrorClass::Unavailable,
            DbError::BuildPool(_) => ErrorClass::Other,
        }
    }

    /// The two-character SQLSTATE class for metrics (`"55"`, `"23"`, ...), or `"connection"`
    /// when there is no server error code (connection refused, reset or closed).
    pub fn sqlstate_class(&self) -> &str {
        match self {
            DbError::Pool(deadpool_postgres::PoolError::Backend(e)) | DbError::Query(e) => {
                sqlstate_class(e)
            }
            DbError::Pool(deadpool_postgres::PoolError::Timeout(_)) => "pool_timeout",
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
    /// The rest of class 53, insufficient resources (53100 disk_full, 53200 out_of_memory,
    /// 53400 configuration_limit_exceeded): the server answered and rolled the statement back;
    /// retry later, nothing to fix in the request.
    InsufficientResources,
    /// Anything else: a bug or a schema problem, not something to retry blindly.
    Other,
}

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
    } else if code.code().starts_with("08")
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
    {
        ErrorClass::Unavailable
    } else if code.code().starts_with("53") {
        ErrorClass::InsufficientResources
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

/// The connection settings for one purpose: the configured URL, plus our `application_name`
/// (visible in `pg_stat_activity`), the connect timeout, TCP keepalives so a dead peer is
/// noticed, and `search_path` set to the configured schema at connection start-up.
pub fn pg_config(db: &DatabaseConfig, purpose: &str) -> tokio_postgres::Config {
    let mut pg = db.url.pg_config().clone();
    if pg.get_application_name().is_none() {
        pg.application_name(format!("tombstoned/{purpose}"));
    }
    pg.connect_timeout(db.connect_timeout);
    pg.keepalives(true);
    pg.keepalives_idle(Duration::from_secs(30));
    pg.keepalives_interval(Duration::from_secs(10));
    pg.keepalives_retries(3);
    // The schema name was validated as a plain lower-case identifier; no quoting needed.
    let search_path = format!("-c search_path={}", db.schema);
    let options = match pg.get_options() {
        Some(existing) if !existing.trim().is_empty() => format!("{existing} {search_path}"),
        _ => search_path,
    };
    pg.options(options);
    pg
}

/// Builds a pool of at most `size` sessions; waiting for a free session is bounded by `wait`.
/// Connections are opened lazily, so building never touches the network.
pub fn pool(
    db: &DatabaseConfig,
    purpose: &str,
    size: usize,
    wait: Duration,
) -> Result<Pool, DbError> {
    let manager = Manager::from_config(
        pg_config(db, purpose),
        NoTls,
        ManagerConfig {
            // Fast: a connection the driver saw close is dropped; a statement that fails on a
            // broken connection marks it closed, so the next checkout opens a fresh one.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(wait))
        .create_timeout(Some(db.connect_timeout))
        .recycle_timeout(Some(db.connect_timeout))
        .build()
        .map_err(DbError::BuildPool)
}

/// A dedicated session outside any pool (migrations, the cleanup lease). The connection task
/// ends when the client is dropped.
pub struct Session {
    /// The client.
    pub client: Client,
    task: JoinHandle<()>,
}

impl Session {
    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.client.is_closed() || self.task.is_finished()
    }

    /// The server process id of this session (`pg_backend_pid()`), for `pg_stat_activity`.
    pub async fn backend_pid(&self) -> Result<i32, DbError> {
        Ok(self
            .client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Closing the client ends the task; aborting covers a task stuck on a dead socket.
        self.task.abort();
    }
}

/// Opens a dedicated session.
pub async fn connect(db: &DatabaseConfig, purpose: &str) -> Result<Session, DbError> {
    let (client, connection) = pg_config(db, purpose)
        .connect(NoTls)
        .await
        .map_err(|source| DbError::Connect {
            target: db.url.to_string(),
            source,
        })?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "database connection ended");
        }
    });
    Ok(Session { client, task })
}

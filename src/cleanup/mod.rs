//! The cleanup engine: batched, key-ordered tombstoning of expired idempotency records, the
//! optional retention purge, the optional retention of delivered outbox events, the dry run, and
//! the single-runner lease.
//!
//! A record is *due* when `NOT expired AND replay_deadline <= cutoff`, the cutoff being the
//! database clock read once when the run starts. [`run_once`] turns due records into tombstones
//! (`response_body = NULL, expired = true, expired_at = now()`; scope, key, fingerprint and
//! everything else stay) in batches, each its own short READ COMMITTED transaction with bounded
//! lock and statement waits. The batch statement takes its row locks in primary-key order, and
//! those locks conflict with a replay's `FOR SHARE`, so the cleaner waits for in-flight replays
//! and a replay that starts later sees the tombstone. The statements and the reasoning behind
//! them are in [`sql`]; `docs/cleanup.md` has the measurements.
//!
//! How a run walks the due index (module `keyset`): each batch starts where the previous one
//! stopped (a keyset cursor on `replay_deadline`), so a run never re-reads the index entries its
//! own committed batches left dead, and its cost stays linear in the rows it tombstones. Rows it
//! passes over because another session holds them past `cleanup.lock_timeout` are isolated in
//! one `SKIP LOCKED` batch (the rest of the batch is tombstoned at once) and retried once at the
//! end of the run; whatever is still held then is left for the next run and counted.
//!
//! Files, one concept each: `run` (one run, [`run_once`]), `context` ([`RunContext`]: what a run
//! and every engine of it work with and share), `engine` (the batch engine every phase and
//! worker runs), `figures` ([`RunFigures`]: what a run did, added up with `+=`), `meter`
//! ([`Meter`]: every metric a run and the scheduler count), `report` ([`RunReport`],
//! [`StopReason`], [`RunOutcome`]), `keyset` (where a pass
//! stands in its index), `dry_run`, `lease` ([`Lease`], the single-runner lease row), `history`
//! ([`RecordedRun`], the `cleanup_runs` table), `throttle` (the replica-lag and rate limits on a
//! run's pace: [`ReplicaLag`], [`rate_wait`]), `workers` (a run's tombstoning split between
//! `cleanup.workers` sessions), `sizing` (each batch's size, `cleanup.batch_time`) and [`sql`]
//! (every statement). Nothing here prints: the CLI renders reports, the scheduler and the CLI
//! report failures. When runs happen is [`crate::scheduler`]'s business.

mod context;
mod dry_run;
mod engine;
mod figures;
mod history;
mod keyset;
mod lease;
mod meter;
mod report;
mod run;
mod sizing;
pub mod sql;
mod throttle;
mod workers;

pub use context::{RunContext, RunLimits};
pub use dry_run::{
    dry_run, dry_run_with_purge, DryRunReport, Due, DueCount, OutboxPreview, PurgePreview,
    ReplicaPreview, WorkerSlice,
};
pub use figures::{FiguresCell, RunFigures};
pub use history::RecordedRun;
pub use lease::{lease_ttl, Lease, LeaseState, LEASE_NAME};
pub use meter::Meter;
pub use report::{RunOutcome, RunReport, StopReason};
pub use run::{
    check_replica_lag_visible, run_leased, run_leased_on, run_once, server_refuses_writes,
    LeasedRun, STOP_GRACE,
};
pub use throttle::{rate_wait, ReplicaLag, StandbyLag, ThrottleReason};

use std::future::Future;
use std::time::Duration;

use crate::db::{self, DbError, ErrorClass};

/// Runs one auxiliary statement of a run (its settings, the cutoff, preparing, the backlog
/// count, the lease) under a client-side deadline a little beyond `statement_timeout`, the
/// server-side bound: a silent database fails the step instead of hanging it
/// ([`db::deadline`]). The caller's session is then dropped, never reused.
pub(crate) async fn bounded<T>(
    statement_timeout: Duration,
    step: &'static str,
    call: impl Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, CleanupError> {
    match db::deadline::within(db::deadline::beyond(statement_timeout), step, call).await {
        Ok(result) => result.map_err(CleanupError::query(step)),
        Err(timeout) => Err(CleanupError::Database {
            step,
            source: timeout,
        }),
    }
}

/// Why a cleanup run (or dry run, or lease operation) failed. Every variant carries the
/// [`DbError`] behind it, so callers classify it by SQLSTATE ([`CleanupError::class`]) and the
/// CLI maps an unreachable database to exit status 69.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// The cleanup session could not be opened.
    #[error("cannot open the cleanup database session")]
    Connect(#[source] DbError),
    /// A statement failed (connection lost, statement timeout, schema missing, ...).
    #[error("cleanup failed while {step}")]
    Database {
        /// What the engine was doing.
        step: &'static str,
        /// The database error.
        #[source]
        source: DbError,
    },
    /// A batch kept failing with deadlock (40P01) or serialization failure (40001).
    #[error(
        "a cleanup batch failed {attempts} times in a row with a deadlock or serialization failure"
    )]
    RetriesExhausted {
        /// How many attempts were made.
        attempts: u32,
        /// The last failure.
        #[source]
        source: DbError,
    },
    /// `cleanup.max_replica_lag` is set but the role cannot see the standbys' replay positions
    /// (for other roles' walsenders `pg_stat_replication` shows them only to superusers and
    /// members of `pg_read_all_stats`): the setting is refused rather than silently ignored.
    #[error(
        "cleanup.max_replica_lag is set, but role {role:?} cannot see the standbys' replay \
         positions (pg_stat_replication shows them only to superusers and members of \
         pg_read_all_stats): GRANT pg_monitor TO \"{role}\", or turn the setting off"
    )]
    ReplicaLagHidden {
        /// The role tombstoned connects as.
        role: String,
    },
}

impl CleanupError {
    /// The failure's class, from its SQLSTATE ([`ErrorClass::Other`] for a refused setting).
    pub fn class(&self) -> ErrorClass {
        self.db_error().map_or(ErrorClass::Other, DbError::class)
    }

    /// The SQLSTATE class for `tombstoned_db_errors_total{sqlstate_class}`; `None` when the
    /// failure is not a database error (a refused setting).
    pub fn sqlstate_class(&self) -> Option<&str> {
        self.db_error().map(DbError::sqlstate_class)
    }

    /// True when a setting was refused (the configuration's to fix: exit status 64).
    pub fn is_configuration(&self) -> bool {
        matches!(self, CleanupError::ReplicaLagHidden { .. })
    }

    /// The error and its causes on one line, safe for logs and status lines: a server error
    /// appears as severity, SQLSTATE and message, never with its DETAIL (which can quote row
    /// values such as keys).
    pub fn summary(&self) -> String {
        db::error_text(self)
    }

    /// True when the database could not be reached or the connection was lost.
    pub fn is_unavailable(&self) -> bool {
        self.class() == ErrorClass::Unavailable
    }

    fn db_error(&self) -> Option<&DbError> {
        match self {
            CleanupError::Connect(e)
            | CleanupError::Database { source: e, .. }
            | CleanupError::RetriesExhausted { source: e, .. } => Some(e),
            CleanupError::ReplicaLagHidden { .. } => None,
        }
    }

    /// A run abandoned at shutdown: its batch did not end within [`run::STOP_GRACE`].
    fn abandoned() -> CleanupError {
        CleanupError::Database {
            step: "stopping: the batch in flight was abandoned (it rolls back with the session)",
            source: DbError::Timeout {
                what: "the batch in flight at shutdown",
                after: run::STOP_GRACE,
            },
        }
    }

    fn query(step: &'static str) -> impl FnOnce(tokio_postgres::Error) -> CleanupError {
        move |e| CleanupError::Database {
            step,
            source: DbError::Query(e),
        }
    }
}

//! The run history (`cleanup_runs`, migration V3): what a leased run writes at its end, in ONE
//! statement that also releases its lease and trims the history to `cleanup.history_runs`
//! ([`finish_run`]), and what `tombstoned status` reads back ([`RecordedRun`]).

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;

use super::figures::RunFigures;
use super::lease::{short_transaction, Lease, LEASE_NAME};
use super::report::{RunOutcome, RunReport};
use super::{sql, CleanupError};
use crate::config::CleanupConfig;
use crate::db::{Conn, DbError};

/// One run as the history stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RunRecord {
    pub(super) outcome: RunOutcome,
    pub(super) stopped_by: Option<&'static str>,
    pub(super) rows_tombstoned: u64,
    pub(super) tombstones_purged: u64,
    pub(super) outbox_events_deleted: u64,
    pub(super) lock_timeouts: u64,
    pub(super) rows_skipped: u64,
    pub(super) batches: u64,
    pub(super) backlog_rows: Option<u64>,
    pub(super) error: Option<String>,
}

impl RunRecord {
    /// A run that ended with its report.
    pub(super) fn finished(report: &RunReport) -> Self {
        RunRecord {
            outcome: report.outcome,
            stopped_by: Some(report.stopped_by.label()),
            rows_tombstoned: report.rows_tombstoned,
            tombstones_purged: report.tombstones_purged,
            outbox_events_deleted: report.outbox_events_deleted,
            lock_timeouts: report.lock_timeouts,
            rows_skipped: report.rows_skipped,
            batches: report.batches + report.purge_batches + report.outbox_batches,
            backlog_rows: Some(report.backlog_rows),
            error: None,
        }
    }

    /// A run that failed after doing `figures`, with `error`'s one-line text (never a DETAIL).
    pub(super) fn failed(error: &CleanupError, figures: &RunFigures) -> Self {
        RunRecord {
            outcome: RunOutcome::Failed,
            stopped_by: None,
            rows_tombstoned: figures.rows_tombstoned,
            tombstones_purged: figures.tombstones_purged,
            outbox_events_deleted: figures.outbox_events_deleted,
            lock_timeouts: figures.lock_timeouts,
            rows_skipped: figures.rows_skipped,
            batches: figures.batches(),
            backlog_rows: None,
            error: Some(error.summary()),
        }
    }
}

fn int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Releases `lease` (if its run still holds it), records the run and trims the history to the
/// newest `cleanup.history_runs` runs: one statement, in a short transaction of its own.
/// Returns whether the lease was still this run's to release.
pub(super) async fn finish_run(
    conn: &Conn<'_>,
    cleanup: &CleanupConfig,
    lease: &Lease,
    record: &RunRecord,
) -> Result<bool, DbError> {
    let keep_existing = i64::from(cleanup.history_runs) - 1;
    let row = short_transaction(
        conn,
        cleanup,
        sql::FINISH_RUN,
        &[
            &LEASE_NAME,
            &lease.holder(),
            &lease.acquired_at(),
            &record.outcome.label(),
            &record.stopped_by,
            &int(record.rows_tombstoned),
            &int(record.tombstones_purged),
            &int(record.outbox_events_deleted),
            &int(record.lock_timeouts),
            &int(record.rows_skipped),
            &int(record.batches),
            &record.backlog_rows.map(int),
            &record.error,
            &keep_existing,
        ],
    )
    .await?;
    let released: i64 = match row {
        Some(row) => row.try_get("released")?,
        None => 0,
    };
    Ok(released > 0)
}

/// One run of the history, as `tombstoned status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecordedRun {
    /// Increasing with the order runs were recorded in.
    pub run_id: i64,
    /// The lease holder that ran it: `<host>:<pid>:<run token>`.
    pub instance: String,
    /// When it started (database clock).
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// `success`, `partial` or `failed`.
    pub outcome: String,
    /// Why it stopped (`finished`, `max_run_time`, `max_batches`, `shutdown`, `lease_lost`);
    /// `None` for a failed run.
    pub stopped_by: Option<String>,
    /// Records turned into tombstones.
    pub rows_tombstoned: i64,
    /// Tombstones deleted by the retention purge.
    pub tombstones_purged: i64,
    /// Delivered outbox events deleted by retention.
    pub outbox_events_deleted: i64,
    /// Batches rolled back on `cleanup.lock_timeout`.
    pub lock_timeouts: i64,
    /// Due rows left because another session held them.
    pub rows_skipped: i64,
    /// Committed batches that found rows, all phases.
    pub batches: i64,
    /// Rows still due at its end (`None`: it failed first).
    pub backlog_rows: Option<i64>,
    /// Why it failed: one line, severity, SQLSTATE and message, never a DETAIL.
    pub error: Option<String>,
}

impl RecordedRun {
    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(RecordedRun {
            run_id: row.try_get("run_id")?,
            instance: row.try_get("instance")?,
            started_at: row.try_get("started_at")?,
            finished_at: row.try_get("finished_at")?,
            outcome: row.try_get("outcome")?,
            stopped_by: row.try_get("stopped_by")?,
            rows_tombstoned: row.try_get("rows_tombstoned")?,
            tombstones_purged: row.try_get("tombstones_purged")?,
            outbox_events_deleted: row.try_get("outbox_events_deleted")?,
            lock_timeouts: row.try_get("lock_timeouts")?,
            rows_skipped: row.try_get("rows_skipped")?,
            batches: row.try_get("batches")?,
            backlog_rows: row.try_get("backlog_rows")?,
            error: row.try_get("error")?,
        })
    }

    /// The newest `limit` runs, newest first.
    pub async fn recent(
        conn: &Conn<'_>,
        limit: i64,
    ) -> Result<Vec<RecordedRun>, tokio_postgres::Error> {
        conn.query(sql::RECENT_RUNS, &[&limit])
            .await?
            .iter()
            .map(RecordedRun::from_row)
            .collect()
    }

    /// The newest run that ended `success` or `partial`.
    pub async fn last_successful(
        conn: &Conn<'_>,
    ) -> Result<Option<RecordedRun>, tokio_postgres::Error> {
        conn.query_opt(sql::LAST_SUCCESSFUL_RUN, &[])
            .await?
            .as_ref()
            .map(RecordedRun::from_row)
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_run_keeps_what_committed_and_its_one_line_error() {
        let error = CleanupError::Connect(DbError::Pool(deadpool_postgres::PoolError::Closed));
        let figures = RunFigures {
            rows_tombstoned: 30,
            tombstone_batches: 2,
            purge_batches: 1,
            ..RunFigures::default()
        };
        let record = RunRecord::failed(&error, &figures);
        assert_eq!(record.outcome, RunOutcome::Failed);
        assert_eq!(record.stopped_by, None);
        assert_eq!((record.rows_tombstoned, record.batches), (30, 3));
        assert_eq!(record.backlog_rows, None);
        let text = record.error.unwrap();
        assert!(
            text.starts_with("cannot open the cleanup database session"),
            "{text}"
        );
        assert!(!text.contains('\n'));
    }
}

//! Everything a cleanup run and its scheduler count in the metrics, in one place: [`Meter`],
//! which the engine feeds per batch, wait and error, a run at its end, and the scheduler per fire.
//! Without metrics (a test's run, `tombstoned cleanup`) it counts nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::report::{RunOutcome, RunReport};
use super::throttle::{ReplicaLag, ThrottleReason};
use super::CleanupError;
use crate::metrics::Metrics;

/// Feeds the metrics when the caller passed them (`None`: a run nobody meters, such as a test's).
#[derive(Clone, Copy)]
pub struct Meter<'a>(Option<&'a Metrics>);

impl std::fmt::Debug for Meter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Meter(metrics)"
        } else {
            "Meter(none)"
        })
    }
}

impl<'a> Meter<'a> {
    /// A meter feeding `metrics`.
    pub fn new(metrics: Option<&'a Metrics>) -> Meter<'a> {
        Meter(metrics)
    }

    pub(super) fn batch(&self, outcome: &str, took: Duration) {
        if let Some(m) = self.0 {
            m.cleanup_batches.with_label_values(&[outcome]).inc();
            m.cleanup_batch_duration.observe(took.as_secs_f64());
        }
    }

    pub(super) fn tombstoned(&self, rows: u64) {
        if let Some(m) = self.0 {
            m.cleanup_rows_tombstoned.inc_by(rows);
        }
    }

    pub(super) fn purged(&self, rows: u64) {
        if let Some(m) = self.0 {
            m.tombstones_purged.inc_by(rows);
        }
    }

    pub(super) fn outbox_deleted(&self, rows: u64) {
        if let Some(m) = self.0 {
            m.outbox_events_deleted.inc_by(rows);
        }
    }

    pub(super) fn throttled(&self, reason: ThrottleReason, waited: Duration) {
        if let Some(m) = self.0 {
            m.cleanup_throttled_seconds
                .with_label_values(&[reason.label()])
                .inc_by(waited.as_secs_f64());
        }
    }

    pub(super) fn replica_lag(&self, lag: &ReplicaLag) {
        if let Some(m) = self.0 {
            m.set_replica_lags(lag.standbys.iter().filter_map(|s| {
                s.lag_bytes
                    .map(|bytes| (s.application_name.as_str(), bytes))
            }));
        }
    }

    pub(super) fn lock_timeout(&self) {
        if let Some(m) = self.0 {
            m.cleanup_lock_timeouts.inc();
        }
    }

    pub(super) fn db_error(&self, sqlstate_class: &str) {
        if let Some(m) = self.0 {
            m.db_error(sqlstate_class);
        }
    }

    pub(super) fn run_finished(&self, report: &RunReport) {
        if let Some(m) = self.0 {
            m.cleanup_runs
                .with_label_values(&[report.outcome.label()])
                .inc();
            m.cleanup_run_duration
                .observe(report.duration.as_secs_f64());
            m.cleanup_backlog_rows
                .set(i64::try_from(report.backlog_rows).unwrap_or(i64::MAX));
            m.cleanup_oldest_due_age_seconds
                .set(report.oldest_due_age.map_or(0.0, |d| d.as_secs_f64()));
            // A partial run made progress without error: it counts as a success here; the
            // backlog gauges show what it left.
            m.cleanup_last_success_timestamp_seconds
                .set(Utc::now().timestamp_millis() as f64 / 1000.0);
        }
    }

    pub(super) fn skipped_for_lease(&self) {
        if let Some(m) = self.0 {
            m.cleanup_runs
                .with_label_values(&[RunOutcome::SkippedLease.label()])
                .inc();
        }
    }

    pub(super) fn lease_held(&self, held: bool) {
        if let Some(m) = self.0 {
            m.cleanup_lease_held.set(i64::from(held));
        }
    }

    pub(super) fn run_failed(&self, error: &CleanupError, took: Duration) {
        self.failed(error);
        if let Some(m) = self.0 {
            m.cleanup_run_duration.observe(took.as_secs_f64());
        }
    }

    /// A run that failed before it began (the scheduler's check whether the server accepts
    /// writes): counted as failed, with its SQLSTATE class; no run duration.
    pub fn failed(&self, error: &CleanupError) {
        if let Some(m) = self.0 {
            m.cleanup_runs
                .with_label_values(&[RunOutcome::Failed.label()])
                .inc();
            if let Some(class) = error.sqlstate_class() {
                m.db_error(class);
            }
        }
    }

    /// A run the scheduler skipped because the server refuses writes.
    pub fn skipped_read_only(&self) {
        if let Some(m) = self.0 {
            m.cleanup_runs
                .with_label_values(&[RunOutcome::SkippedReadOnly.label()])
                .inc();
        }
    }

    /// Fire times the scheduler coalesced into one catch-up run.
    pub fn fires_coalesced(&self, missed: u64) {
        if let Some(m) = self.0 {
            m.cleanup_fires_coalesced.inc_by(missed);
        }
    }

    /// The scheduler's next fire time (`None`: none, paused or stopped).
    pub fn next_run(&self, next: Option<DateTime<Utc>>) {
        if let Some(m) = self.0 {
            m.cleanup_next_run_timestamp_seconds
                .set(next.map_or(0.0, |t| t.timestamp_millis() as f64 / 1000.0));
        }
    }
}

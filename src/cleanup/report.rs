//! What a cleanup run reports: [`RunReport`] (read by metrics, logs, the CLI and tests), why it
//! stopped ([`StopReason`]) and how it ended ([`RunOutcome`]). Durations serialise as seconds.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::throttle::ThrottleReason;

/// Why a run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A batch found nothing more to do.
    Finished,
    /// `cleanup.max_run_time` was reached.
    MaxRunTime,
    /// `--max-batches` was reached.
    MaxBatches,
    /// Shutdown was requested; the batch in flight committed or rolled back first.
    Shutdown,
    /// Another run took the single-runner lease (this one's had expired): the batch that found
    /// out rolled back, and no other started.
    LeaseLost,
    /// `cleanup.max_run_time` was reached while the run waited for a standby to replay to
    /// within `cleanup.max_replica_lag`.
    ReplicaLag,
}

impl StopReason {
    /// The name used in logs and JSON.
    pub fn label(self) -> &'static str {
        match self {
            StopReason::Finished => "finished",
            StopReason::MaxRunTime => "max_run_time",
            StopReason::MaxBatches => "max_batches",
            StopReason::Shutdown => "shutdown",
            StopReason::LeaseLost => "lease_lost",
            StopReason::ReplicaLag => "replica_lag",
        }
    }
}

/// How a run ended, as `tombstoned_cleanup_runs_total{outcome}` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The run did everything it could (rows another session held are counted, not failed).
    Success,
    /// The run stopped early (time, batch limit, shutdown or a lost lease) with rows still due.
    Partial,
    /// The run failed (database unreachable, connection lost, statement error).
    Failed,
    /// Another instance held the single-runner lease; nothing was done.
    SkippedLease,
    /// The server refuses writes (a standby, or a read-only database); nothing was attempted.
    SkippedReadOnly,
}

impl RunOutcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RunOutcome::Success => "success",
            RunOutcome::Partial => "partial",
            RunOutcome::Failed => "failed",
            RunOutcome::SkippedLease => "skipped_lease",
            RunOutcome::SkippedReadOnly => "skipped_read_only",
        }
    }
}

/// What one run did. Durations serialise as seconds.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The database clock when the run started; rows due at this instant were the work.
    pub cutoff: DateTime<Utc>,
    /// Records turned into tombstones.
    pub rows_tombstoned: u64,
    /// Committed tombstoning batches that found rows (the final empty probe is not counted).
    pub batches: u64,
    /// Batches (of either phase) rolled back because a row lock wait exceeded
    /// `cleanup.lock_timeout`.
    pub lock_timeouts: u64,
    /// Due rows left for a later run because another session held them (`on_locked = "skip"`,
    /// or still held when the run came back to them).
    pub rows_skipped: u64,
    /// Batches retried after a deadlock or serialization failure.
    pub retries: u64,
    /// Tombstones deleted by the retention purge.
    pub tombstones_purged: u64,
    /// Committed purge batches that found rows.
    pub purge_batches: u64,
    /// Tombstones that expired at or before this instant were purge candidates (`None`: purge
    /// is off, or the run stopped before the purge phase).
    pub purge_before: Option<DateTime<Utc>>,
    /// Delivered outbox events deleted by retention (`retention.outbox_keep_delivered`).
    pub outbox_events_deleted: u64,
    /// Committed outbox retention batches that found events.
    pub outbox_batches: u64,
    /// Events delivered at or before this instant were deletion candidates (`None`: outbox
    /// retention is off, or the run stopped before that phase).
    pub outbox_delete_before: Option<DateTime<Utc>>,
    /// Wall time of the run.
    #[serde(rename = "duration_seconds", serialize_with = "seconds")]
    pub duration: Duration,
    /// `rows_tombstoned / duration`.
    pub rows_per_second: f64,
    /// Rows due at the cutoff that are still not tombstoned at the end of the run.
    pub backlog_rows: u64,
    /// The oldest deadline among those rows.
    pub oldest_due_deadline: Option<DateTime<Utc>>,
    /// How overdue that row was at the end of the run.
    #[serde(rename = "oldest_due_age_seconds", serialize_with = "optional_seconds")]
    pub oldest_due_age: Option<Duration>,
    /// The longest batch transaction (BEGIN to COMMIT/ROLLBACK): the longest any row lock of
    /// this run was held.
    #[serde(rename = "slowest_batch_seconds", serialize_with = "seconds")]
    pub slowest_batch: Duration,
    /// The 99th percentile of batch transaction durations.
    #[serde(rename = "batch_p99_seconds", serialize_with = "seconds")]
    pub batch_p99: Duration,
    /// Time spent waiting for standbys to replay to within `cleanup.max_replica_lag`.
    #[serde(rename = "throttled_replica_lag_seconds", serialize_with = "seconds")]
    pub throttled_replica_lag: Duration,
    /// Time spent waiting to keep to `cleanup.max_rows_per_second`.
    #[serde(rename = "throttled_rate_seconds", serialize_with = "seconds")]
    pub throttled_rate: Duration,
    /// What the run was waiting for when a shutdown or `cleanup.max_run_time` ended it
    /// (`None`: it did not end during a wait).
    pub stopped_while_waiting_for: Option<ThrottleReason>,
    /// Sessions that tombstoned at once (`cleanup.workers`, or fewer when few rows were due to
    /// split); every figure above covers all of them.
    pub workers: u32,
    /// Why the run stopped.
    pub stopped_by: StopReason,
    /// `success`, or `partial` when the run stopped early with rows still due.
    pub outcome: RunOutcome,
}

pub(super) fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

pub(super) fn optional_seconds<S: serde::Serializer>(
    d: &Option<Duration>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_serialises_durations_as_seconds_and_enums_in_snake_case() {
        let report = RunReport {
            cutoff: DateTime::from_timestamp(1_800_000_000, 0).unwrap(),
            rows_tombstoned: 3,
            batches: 1,
            lock_timeouts: 0,
            rows_skipped: 0,
            retries: 0,
            tombstones_purged: 0,
            purge_batches: 0,
            purge_before: None,
            outbox_events_deleted: 0,
            outbox_batches: 0,
            outbox_delete_before: None,
            duration: Duration::from_millis(1500),
            rows_per_second: 2.0,
            backlog_rows: 0,
            oldest_due_deadline: None,
            oldest_due_age: None,
            slowest_batch: Duration::from_millis(20),
            batch_p99: Duration::from_millis(20),
            throttled_replica_lag: Duration::from_millis(2500),
            throttled_rate: Duration::ZERO,
            stopped_while_waiting_for: Some(ThrottleReason::ReplicaLag),
            workers: 1,
            stopped_by: StopReason::ReplicaLag,
            outcome: RunOutcome::Partial,
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["duration_seconds"], 1.5);
        assert_eq!(json["stopped_by"], "replica_lag");
        assert_eq!(json["stopped_while_waiting_for"], "replica_lag");
        assert_eq!(json["throttled_replica_lag_seconds"], 2.5);
        assert_eq!(json["throttled_rate_seconds"], 0.0);
        assert_eq!(json["outcome"], "partial");
        assert_eq!(json["oldest_due_age_seconds"], serde_json::Value::Null);
        assert_eq!(RunOutcome::SkippedLease.label(), "skipped_lease");
    }
}

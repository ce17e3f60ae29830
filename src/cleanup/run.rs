//! One cleanup run ([`run_once`]): the cutoff, the tombstoning phase, the optional retention
//! purge, the optional retention of delivered outbox events, the backlog left, and the
//! [`RunReport`] that metrics, logs, the CLI and tests read.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use serde::Serialize;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};
use tokio_util::sync::CancellationToken;

use super::keyset::{BatchRows, Key, KeyRange, Pass, Revisit, Step};
use super::{sql, CleanupError};
use crate::config::{CleanupConfig, DatabaseConfig, OnLocked, RetentionConfig};
use crate::db::{self, DbError, ErrorClass};
use crate::metrics::Metrics;

/// Attempts per batch when it fails with a deadlock (40P01) or serialization failure (40001).
/// Neither should happen (every locker goes in primary-key order); a few retries cover a foreign
/// locker that does not.
const MAX_BATCH_ATTEMPTS: u32 = 5;

/// Limits a caller puts on one run, on top of the configuration's `cleanup.max_run_time`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunLimits {
    /// Stop after this many committed batches (`tombstoned cleanup --max-batches`).
    pub max_batches: Option<u64>,
}

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
}

impl StopReason {
    /// The name used in logs and JSON.
    pub fn label(self) -> &'static str {
        match self {
            StopReason::Finished => "finished",
            StopReason::MaxRunTime => "max_run_time",
            StopReason::MaxBatches => "max_batches",
            StopReason::Shutdown => "shutdown",
        }
    }
}

/// How a run ended, as `tombstoned_cleanup_runs_total{outcome}` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// The run did everything it could (rows another session held are counted, not failed).
    Success,
    /// The run stopped early (time, batch limit or shutdown) with rows still due.
    Partial,
    /// The run failed (database unreachable, connection lost, statement error).
    Failed,
    /// Another instance held the single-runner lease; nothing was done.
    SkippedLease,
}

impl RunOutcome {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            RunOutcome::Success => "success",
            RunOutcome::Partial => "partial",
            RunOutcome::Failed => "failed",
            RunOutcome::SkippedLease => "skipped_lease",
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
    /// Why the run stopped.
    pub stopped_by: StopReason,
    /// `success`, or `partial` when the run stopped early with rows still due.
    pub outcome: RunOutcome,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn optional_seconds<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_some(&d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

/// Runs one cleanup pass: reads the cutoff, tombstones every row due at it (batch by batch,
/// until a batch finds nothing, `cleanup.max_run_time`, `limits.max_batches` or `shutdown`),
/// purges old tombstones when `retention.purge_tombstones_after` is set, deletes old delivered
/// outbox events when `retention.outbox_keep_delivered` is set, and counts the backlog left. Opens its own session (application_name `tombstoned/cleanup`), so a run after an outage
/// simply reconnects. Does not take the single-runner lease: that is the caller's choice
/// ([`super::Lease`]); two runs at once are safe, only wasteful.
///
/// `shutdown` is checked between batches, never inside one. With `metrics`, every batch, row,
/// lock timeout and database error is counted, and the run's outcome, duration, backlog and
/// last-success time are recorded.
#[tracing::instrument(name = "cleanup_run", skip_all, fields(schema = %db.schema))]
pub async fn run_once(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
    retention: &RetentionConfig,
    limits: RunLimits,
    shutdown: &CancellationToken,
    metrics: Option<&Metrics>,
) -> Result<RunReport, CleanupError> {
    let meter = Meter(metrics);
    let started = Instant::now();
    let result = run_inner(db, cleanup, retention, limits, shutdown, meter, started).await;
    match &result {
        Ok(report) => {
            meter.run_finished(report);
            tracing::info!(
                outcome = report.outcome.label(),
                rows_tombstoned = report.rows_tombstoned,
                batches = report.batches,
                lock_timeouts = report.lock_timeouts,
                rows_skipped = report.rows_skipped,
                retries = report.retries,
                tombstones_purged = report.tombstones_purged,
                outbox_events_deleted = report.outbox_events_deleted,
                backlog_rows = report.backlog_rows,
                duration_seconds = report.duration.as_secs_f64(),
                rows_per_second = report.rows_per_second.round(),
                slowest_batch_seconds = report.slowest_batch.as_secs_f64(),
                stopped_by = report.stopped_by.label(),
                "cleanup run finished"
            );
        }
        Err(e) => {
            meter.run_failed(e, started.elapsed());
            tracing::warn!(error = %error_chain(e), "cleanup run failed");
        }
    }
    result
}

/// `error: cause: cause` on one line, for logs and the scheduler status. A server error is shown
/// as its SQLSTATE and message only: its DETAIL can quote row values (keys, bodies), which never
/// go into logs.
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = String::new();
    let mut next = Some(e);
    while let Some(cause) = next {
        if !text.is_empty() {
            text.push_str(": ");
        }
        let server = cause
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::as_db_error);
        match server {
            Some(db) => {
                text.push_str(&format!(
                    "{} {}: {}",
                    db.severity(),
                    db.code().code(),
                    db.message()
                ));
                break;
            }
            None => text.push_str(&cause.to_string()),
        }
        next = cause.source();
    }
    text
}

async fn run_inner(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
    retention: &RetentionConfig,
    limits: RunLimits,
    shutdown: &CancellationToken,
    meter: Meter<'_>,
    started: Instant,
) -> Result<RunReport, CleanupError> {
    let session = db::connect(db, "cleanup")
        .await
        .map_err(CleanupError::Connect)?;
    let client = &session.client;
    client
        .query_one(sql::SESSION_SETTINGS, &[&millis(cleanup.statement_timeout)])
        .await
        .map_err(CleanupError::query("configuring the cleanup session"))?;
    let cutoff: DateTime<Utc> = client
        .query_one(sql::CUTOFF, &[])
        .await
        .map_err(CleanupError::query("reading the cutoff"))?
        .try_get(0)
        .map_err(CleanupError::query("reading the cutoff"))?;

    // Prepared once: every batch is then one pipelined round trip (BEGIN, settings, batch,
    // COMMIT).
    let prepare = |text: &'static str| async move {
        client
            .prepare(text)
            .await
            .map_err(CleanupError::query("preparing the batch transaction"))
    };
    let mut engine = Engine {
        client,
        begin: prepare(sql::BATCH_BEGIN).await?,
        batch_settings: prepare(sql::BATCH_SETTINGS).await?,
        commit: prepare(sql::BATCH_COMMIT).await?,
        cleanup,
        limits,
        shutdown,
        meter,
        started,
        lock_timeout: millis(cleanup.lock_timeout),
        statement_timeout: millis(cleanup.statement_timeout),
        committed_batches: 0,
        batch_durations: Vec::new(),
        retries: 0,
    };

    let tombstoning = engine.phase(Phase::Tombstone, cutoff).await?;
    let mut stopped = tombstoning.stopped;
    let mut purge_bound = None;
    let mut purging = PhaseResult::default();
    if let (None, Some(after)) = (stopped, retention.purge_tombstones_after) {
        if let Some(before) = purge_before(cutoff, after) {
            purge_bound = Some(before);
            purging = engine.phase(Phase::Purge, before).await?;
            stopped = purging.stopped;
        }
    }
    let mut outbox_bound = None;
    let mut outbox = PhaseResult::default();
    if let (None, Some(keep)) = (stopped, retention.outbox_keep_delivered) {
        if let Some(before) = purge_before(cutoff, keep) {
            outbox_bound = Some(before);
            outbox = engine.phase(Phase::OutboxRetention, before).await?;
            stopped = outbox.stopped;
        }
    }

    let (backlog_rows, oldest_due_deadline) =
        backlog(client, cutoff, tombstoning.left.ranges()).await?;
    let duration = started.elapsed();
    let stopped_by = stopped.unwrap_or(StopReason::Finished);
    let outcome = if stopped_by != StopReason::Finished && backlog_rows > 0 {
        RunOutcome::Partial
    } else {
        RunOutcome::Success
    };
    let oldest_due_age = oldest_due_deadline.and_then(|deadline| {
        let now = cutoff + TimeDelta::from_std(duration).unwrap_or_default();
        (now - deadline).to_std().ok()
    });
    let mut durations = std::mem::take(&mut engine.batch_durations);
    durations.sort_unstable();
    let slowest_batch = durations.last().copied().unwrap_or_default();
    let batch_p99 = percentile(&durations, 0.99);
    Ok(RunReport {
        cutoff,
        rows_tombstoned: tombstoning.changed,
        batches: tombstoning.batches,
        lock_timeouts: tombstoning.lock_timeouts + purging.lock_timeouts + outbox.lock_timeouts,
        rows_skipped: tombstoning.rows_skipped,
        retries: engine.retries,
        tombstones_purged: purging.changed,
        purge_batches: purging.batches,
        purge_before: purge_bound,
        outbox_events_deleted: outbox.changed,
        outbox_batches: outbox.batches,
        outbox_delete_before: outbox_bound,
        duration,
        rows_per_second: per_second(tombstoning.changed, duration),
        backlog_rows,
        oldest_due_deadline,
        oldest_due_age,
        slowest_batch,
        batch_p99,
        stopped_by,
        outcome,
    })
}

/// The instant tombstones must have expired at or before to be purged (or outbox events been
/// delivered at or before to be deleted): "older than `purge_after`" is strict, and the index
/// range inclusive, hence the microsecond.
pub(crate) fn purge_before(cutoff: DateTime<Utc>, after: Duration) -> Option<DateTime<Utc>> {
    TimeDelta::from_std(after)
        .ok()
        .and_then(|after| cutoff.checked_sub_signed(after))
        .and_then(|t| t.checked_sub_signed(TimeDelta::microseconds(1)))
}

/// Counts the rows still due at the cutoff, only where this run knows some may remain (what it
/// did not reach, what it passed over), so the count does not walk the entries it left dead.
#[tracing::instrument(skip_all)]
async fn backlog(
    client: &Client,
    cutoff: Key,
    ranges: &[KeyRange],
) -> Result<(u64, Option<Key>), CleanupError> {
    let mut rows = 0u64;
    let mut oldest: Option<Key> = None;
    for range in ranges {
        let to = range.to.min(cutoff);
        let row = client
            .query_one(sql::DUE_IN_RANGE, &[&range.from, &to])
            .await
            .map_err(CleanupError::query("counting the backlog"))?;
        let count: i64 = row
            .try_get(0)
            .map_err(CleanupError::query("counting the backlog"))?;
        let min: Option<Key> = row
            .try_get(1)
            .map_err(CleanupError::query("counting the backlog"))?;
        rows += u64::try_from(count).unwrap_or(0);
        oldest = match (oldest, min) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Ok((rows, oldest))
}

fn millis(d: Duration) -> String {
    // Configuration guarantees 1 ms ..= i32::MAX ms.
    format!("{}ms", d.as_millis().max(1))
}

fn per_second(rows: u64, d: Duration) -> f64 {
    let secs = d.as_secs_f64();
    if secs > 0.0 {
        rows as f64 / secs
    } else {
        0.0
    }
}

/// The `q` quantile of sorted durations (nearest rank).
fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The phases of a run share one batch engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Due records become tombstones (index: `idempotency_records_due_idx`).
    Tombstone,
    /// Old tombstones are deleted (index: `idempotency_records_purge_idx`).
    Purge,
    /// Old delivered outbox events are deleted (index: `outbox_events_delivered_idx`).
    OutboxRetention,
}

impl Phase {
    fn statements(self) -> (&'static str, &'static str) {
        match self {
            Phase::Tombstone => (sql::TOMBSTONE_BATCH, sql::TOMBSTONE_BATCH_SKIP_LOCKED),
            Phase::Purge => (sql::PURGE_BATCH, sql::PURGE_BATCH_SKIP_LOCKED),
            Phase::OutboxRetention => (
                sql::OUTBOX_RETENTION_BATCH,
                sql::OUTBOX_RETENTION_BATCH_SKIP_LOCKED,
            ),
        }
    }

    fn step(self) -> &'static str {
        match self {
            Phase::Tombstone => "running a tombstone batch",
            Phase::Purge => "running a purge batch",
            Phase::OutboxRetention => "running an outbox retention batch",
        }
    }
}

/// Main pass over the whole range, or the final pass over ranges the main pass left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PassKind {
    Main,
    Final,
}

#[derive(Debug, Default)]
struct PhaseResult {
    /// `Some` when a limit or shutdown stopped the phase.
    stopped: Option<StopReason>,
    changed: u64,
    batches: u64,
    lock_timeouts: u64,
    rows_skipped: u64,
    /// Ranges that may still hold rows at the end.
    left: Revisit,
}

/// A batch that ran to its end, or one rolled back by `lock_timeout`.
enum BatchResult {
    Done(BatchRows),
    LockTimeout,
}

struct Engine<'a> {
    client: &'a Client,
    begin: Statement,
    batch_settings: Statement,
    commit: Statement,
    cleanup: &'a CleanupConfig,
    limits: RunLimits,
    shutdown: &'a CancellationToken,
    meter: Meter<'a>,
    started: Instant,
    lock_timeout: String,
    statement_timeout: String,
    committed_batches: u64,
    batch_durations: Vec<Duration>,
    retries: u64,
}

impl Engine<'_> {
    /// Walks the phase's index from the beginning up to `bound` (inclusive), batch by batch.
    ///
    /// `on_locked = "wait"`: a batch waits up to `lock_timeout` for held rows. On a timeout the
    /// batch has rolled back; the same range runs once more with `SKIP LOCKED`, which does the
    /// rest of it and passes over what is held. Ranges passed over get one more (waiting) pass at
    /// the end of the phase; what is still held then is left for the next run.
    ///
    /// `on_locked = "skip"`: every batch uses `SKIP LOCKED`; held rows are left for the next run.
    #[tracing::instrument(level = "debug", skip(self), fields(?phase, %bound))]
    async fn phase(&mut self, phase: Phase, bound: Key) -> Result<PhaseResult, CleanupError> {
        let (wait_sql, skip_sql) = phase.statements();
        let wait = self
            .client
            .prepare(wait_sql)
            .await
            .map_err(CleanupError::query("preparing the batch statement"))?;
        let skip = self
            .client
            .prepare(skip_sql)
            .await
            .map_err(CleanupError::query("preparing the batch statement"))?;
        let waits = self.cleanup.on_locked == OnLocked::Wait;

        let mut result = PhaseResult::default();
        let mut work = VecDeque::from([(
            KeyRange {
                from: None,
                to: bound,
            },
            PassKind::Main,
        )]);
        let mut deferred = Revisit::default();
        while let Some((range, kind)) = work.pop_front() {
            // Rows passed over in the main pass of "wait" mode get one more try at the end.
            let retry_later = waits && kind == PassKind::Main;
            let mut pass = Pass::new(range);
            loop {
                if let Some(reason) = self.limit_reached() {
                    result.left.add(pass.remaining());
                    for (range, _) in work.drain(..) {
                        result.left.add(range);
                    }
                    for range in deferred.take() {
                        result.left.add(range);
                    }
                    result.stopped = Some(reason);
                    return Ok(result);
                }
                let statement = if waits { &wait } else { &skip };
                let rows = match self.batch(phase, statement, bound, &pass).await? {
                    BatchResult::Done(rows) => rows,
                    BatchResult::LockTimeout => {
                        result.lock_timeouts += 1;
                        // Isolate the held rows: the same batch without waiting for them.
                        match self.batch(phase, &skip, bound, &pass).await? {
                            BatchResult::Done(rows) => rows,
                            // Only a table-level lock can time out a SKIP LOCKED batch (DDL in
                            // progress): leave the rest of this pass for later.
                            BatchResult::LockTimeout => {
                                result.lock_timeouts += 1;
                                result.left.add(pass.remaining());
                                break;
                            }
                        }
                    }
                };
                result.changed += rows.changed;
                if rows.picked > 0 {
                    // The last, empty batch of a pass is a transaction but no work.
                    result.batches += 1;
                }
                if !retry_later {
                    result.rows_skipped += rows.passed_over;
                }
                let advance = pass.advance(rows);
                if let Some(range) = advance.revisit {
                    if retry_later {
                        deferred.add(range);
                    } else {
                        result.left.add(range);
                    }
                }
                if advance.step == Step::Exhausted {
                    break;
                }
                self.pause().await;
            }
            if kind == PassKind::Main {
                work.extend(deferred.take().into_iter().map(|r| (r, PassKind::Final)));
            }
        }
        Ok(result)
    }

    fn limit_reached(&self) -> Option<StopReason> {
        if self.shutdown.is_cancelled() {
            Some(StopReason::Shutdown)
        } else if self
            .limits
            .max_batches
            .is_some_and(|max| self.committed_batches >= max)
        {
            Some(StopReason::MaxBatches)
        } else if self.committed_batches > 0 && self.started.elapsed() >= self.cleanup.max_run_time
        {
            // Checked once a batch has run, so even a run that connected slowly makes progress.
            Some(StopReason::MaxRunTime)
        } else {
            None
        }
    }

    /// `cleanup.pause_between_batches`, outside any transaction; cut short by shutdown.
    async fn pause(&self) {
        let pause = self.cleanup.pause_between_batches;
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.shutdown.cancelled() => {}
            }
        }
    }

    /// One batch, retried on deadlock or serialization failure.
    async fn batch(
        &mut self,
        phase: Phase,
        statement: &Statement,
        bound: Key,
        pass: &Pass,
    ) -> Result<BatchResult, CleanupError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let began = Instant::now();
            let result = self.transaction(statement, bound, pass).await;
            let took = began.elapsed();
            self.batch_durations.push(took);
            match result {
                Ok(rows) => {
                    self.committed_batches += 1;
                    self.meter.batch("committed", took);
                    match phase {
                        Phase::Tombstone => self.meter.tombstoned(rows.changed),
                        Phase::Purge => self.meter.purged(rows.changed),
                        Phase::OutboxRetention => self.meter.outbox_deleted(rows.changed),
                    }
                    tracing::debug!(
                        ?phase,
                        picked = rows.picked,
                        changed = rows.changed,
                        passed_over = rows.passed_over,
                        seconds = took.as_secs_f64(),
                        "batch committed"
                    );
                    return Ok(BatchResult::Done(rows));
                }
                Err(e) => match e.class() {
                    ErrorClass::LockNotAvailable => {
                        self.meter.db_error(e.sqlstate_class());
                        self.meter.batch("lock_timeout", took);
                        self.meter.lock_timeout();
                        tracing::info!(
                            ?phase,
                            lock_timeout = %self.lock_timeout,
                            "batch rolled back: a row stayed locked past lock_timeout"
                        );
                        return Ok(BatchResult::LockTimeout);
                    }
                    ErrorClass::Deadlock | ErrorClass::SerializationFailure
                        if attempt < MAX_BATCH_ATTEMPTS =>
                    {
                        self.meter.db_error(e.sqlstate_class());
                        self.meter.batch("retried", took);
                        self.retries += 1;
                        tracing::warn!(?phase, attempt, error = %error_chain(&e), "batch rolled back, retrying");
                        tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                    }
                    ErrorClass::Deadlock | ErrorClass::SerializationFailure => {
                        self.meter.batch("failed", took);
                        return Err(CleanupError::RetriesExhausted {
                            attempts: attempt,
                            source: e,
                        });
                    }
                    // Fatal errors are counted once, by `run_failed`.
                    _ => {
                        self.meter.batch("failed", took);
                        return Err(CleanupError::Database {
                            step: phase.step(),
                            source: e,
                        });
                    }
                },
            }
        }
    }

    /// BEGIN; SET LOCAL timeouts and join settings; the batch statement; COMMIT — pipelined,
    /// one round trip. The batch's row locks are released the moment its statement ends (the
    /// COMMIT is already waiting at the server), not one client round trip later; that is the
    /// lock hold a replay can meet. If any statement fails, the server skips the rest of the
    /// transaction up to the COMMIT, which then ends it as a ROLLBACK: the batch applies whole
    /// or not at all, and nothing else has run on the session in between.
    async fn transaction(
        &self,
        statement: &Statement,
        bound: Key,
        pass: &Pass,
    ) -> Result<BatchRows, DbError> {
        let limit = i64::from(self.cleanup.batch_size);
        let from = pass.cursor();
        let to = pass.to();
        let settings: [&(dyn ToSql + Sync); 2] = [&self.lock_timeout, &self.statement_timeout];
        let params: [&(dyn ToSql + Sync); 4] = [&bound, &from, &to, &limit];
        // tokio-postgres sends a request when its future is first polled; `biased` polls in the
        // order written, so this is the order on the wire. Each request carries its own Sync, so
        // an error in one does not swallow the COMMIT behind it.
        let (begin, set, batch, commit) = tokio::join!(
            biased;
            self.client.execute(&self.begin, &[]),
            self.client.query_one(&self.batch_settings, &settings),
            self.client.query_one(statement, &params),
            self.client.execute(&self.commit, &[]),
        );
        // The first failure in statement order is the cause; later ones only report the
        // aborted transaction.
        begin?;
        set?;
        let row = batch?;
        commit?;
        let picked: i64 = row.try_get(0)?;
        let changed: i64 = row.try_get(1)?;
        let last: Option<Key> = row.try_get(2)?;
        let passed_over: i64 = if row.len() > 3 { row.try_get(3)? } else { 0 };
        Ok(BatchRows {
            picked: u64::try_from(picked).unwrap_or(0),
            changed: u64::try_from(changed).unwrap_or(0),
            last,
            passed_over: u64::try_from(passed_over).unwrap_or(0),
        })
    }
}

/// Feeds the metrics when the caller passed them.
#[derive(Clone, Copy)]
struct Meter<'a>(Option<&'a Metrics>);

impl Meter<'_> {
    fn batch(&self, outcome: &str, took: Duration) {
        if let Some(m) = self.0 {
            m.cleanup_batches.with_label_values(&[outcome]).inc();
            m.cleanup_batch_duration.observe(took.as_secs_f64());
        }
    }

    fn tombstoned(&self, rows: u64) {
        if let Some(m) = self.0 {
            m.cleanup_rows_tombstoned.inc_by(rows);
        }
    }

    fn purged(&self, rows: u64) {
        if let Some(m) = self.0 {
            m.tombstones_purged.inc_by(rows);
        }
    }

    fn outbox_deleted(&self, rows: u64) {
        if let Some(m) = self.0 {
            m.outbox_events_deleted.inc_by(rows);
        }
    }

    fn lock_timeout(&self) {
        if let Some(m) = self.0 {
            m.cleanup_lock_timeouts.inc();
        }
    }

    fn db_error(&self, sqlstate_class: &str) {
        if let Some(m) = self.0 {
            m.db_error(sqlstate_class);
        }
    }

    fn run_finished(&self, report: &RunReport) {
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

    fn run_failed(&self, error: &CleanupError, took: Duration) {
        if let Some(m) = self.0 {
            m.cleanup_runs
                .with_label_values(&[RunOutcome::Failed.label()])
                .inc();
            m.cleanup_run_duration.observe(took.as_secs_f64());
            m.db_error(error.sqlstate_class());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_is_nearest_rank() {
        let ms = |v: u64| Duration::from_millis(v);
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 0.99), ms(99));
        assert_eq!(percentile(&sorted, 0.5), ms(50));
        assert_eq!(percentile(&sorted[..1], 0.99), ms(1));
        assert_eq!(percentile(&[], 0.99), Duration::ZERO);
    }

    #[test]
    fn timeouts_are_sent_as_milliseconds() {
        assert_eq!(millis(Duration::from_secs(5)), "5000ms");
        assert_eq!(millis(Duration::from_micros(10)), "1ms");
    }

    #[test]
    fn rows_per_second_survives_a_zero_duration() {
        assert_eq!(per_second(10, Duration::ZERO), 0.0);
        assert_eq!(per_second(10, Duration::from_secs(2)), 5.0);
    }

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
            stopped_by: StopReason::MaxRunTime,
            outcome: RunOutcome::Partial,
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["duration_seconds"], 1.5);
        assert_eq!(json["stopped_by"], "max_run_time");
        assert_eq!(json["outcome"], "partial");
        assert_eq!(json["oldest_due_age_seconds"], serde_json::Value::Null);
        assert_eq!(RunOutcome::SkippedLease.label(), "skipped_lease");
    }

    #[test]
    fn purge_bound_is_strictly_older_than_the_setting() {
        let cutoff = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let before = purge_before(cutoff, Duration::from_secs(3600)).unwrap();
        assert_eq!(
            before,
            DateTime::from_timestamp(1_800_000_000 - 3600, 0).unwrap() - TimeDelta::microseconds(1)
        );
        // Absurdly long retention: nothing is old enough, no overflow.
        assert_eq!(purge_before(cutoff, Duration::MAX), None);
    }
}

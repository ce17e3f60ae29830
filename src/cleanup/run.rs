//! One cleanup run ([`run_once`]): the cutoff, the tombstoning phase, the optional retention
//! purge, the optional retention of delivered outbox events, the backlog left, and the
//! [`RunReport`] it returns. The batches themselves are the [`super::engine`]'s, and what they
//! add up to is the run's figures ([`super::figures`], in its [`RunContext`]). [`run_leased`] is
//! the same run under the single-runner lease, recorded in the run history.

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use tokio_util::sync::CancellationToken;

use super::context::{RunContext, RunLimits};
use super::engine::{Engine, Phase, Renewal};
use super::history::{finish_run, RunRecord};
use super::keyset::{Key, KeyRange};
use super::lease::{Lease, LeaseState};
use super::meter::Meter;
use super::report::{RunOutcome, RunReport, StopReason};
use super::throttle::ReplicaLag;
use super::workers;
use super::{sql, CleanupError};
use crate::config::{CleanupConfig, DatabaseConfig, RetentionConfig};
use crate::db::{self, pipeline, Conn, ErrorClass, Param};
use crate::metrics::Metrics;
use crate::telemetry::{Attribute, Kind, Span};

/// How long a stopped run (SIGTERM, `serve` shutting down) waits for its batch in flight to
/// commit or roll back before it abandons it: a batch normally ends in milliseconds; on a silent
/// database it would wait its whole deadline.
pub const STOP_GRACE: Duration = Duration::from_secs(3);

/// Why the server refuses writes, if it does: a standby (`pg_is_in_recovery()`), or
/// `default_transaction_read_only = on`. The scheduler skips its run there (every batch would
/// fail with 25006). Opens, asks and closes one session, bounded like a connect plus one
/// statement.
pub async fn server_refuses_writes(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
) -> Result<Option<&'static str>, CleanupError> {
    let session = db::connect(db, "cleanup")
        .await
        .map_err(CleanupError::Connect)?;
    let row = super::bounded(
        cleanup.statement_timeout,
        "checking whether the server accepts writes",
        session.conn().query_one(db::sql::READ_ONLY_CHECK, &[]),
    )
    .await?;
    let get = |i| {
        row.try_get::<_, bool>(i).map_err(CleanupError::query(
            "checking whether the server accepts writes",
        ))
    };
    Ok(if get(0)? {
        Some("the server is a standby (pg_is_in_recovery())")
    } else if get(1)? {
        Some("the database is read-only (transaction_read_only = on)")
    } else {
        None
    })
}

/// With `cleanup.max_replica_lag` set, checks that the role can see the standbys' replay
/// positions, and refuses the setting ([`CleanupError::ReplicaLagHidden`]) when it cannot:
/// `serve` and `tombstoned cleanup` call it at start-up, so the refusal is said once, before any
/// run (a run checks again at each poll, for a role that lost the grant later). Without the
/// setting it does nothing. Opens, asks and closes one session.
pub async fn check_replica_lag_visible(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
) -> Result<(), CleanupError> {
    if cleanup.max_replica_lag.is_none() {
        return Ok(());
    }
    const STEP: &str = "checking that the role can see the standbys' replay lag";
    let session = db::connect(db, "cleanup")
        .await
        .map_err(CleanupError::Connect)?;
    let rows = super::bounded(
        cleanup.statement_timeout,
        STEP,
        session.conn().query(sql::REPLICA_LAG, &[]),
    )
    .await?;
    let lag = ReplicaLag::from_rows(&rows).map_err(CleanupError::query(STEP))?;
    if lag.visible {
        Ok(())
    } else {
        Err(CleanupError::ReplicaLagHidden { role: lag.role })
    }
}

/// Runs one cleanup pass: reads the cutoff, tombstones every row due at it (batch by batch,
/// until a batch finds nothing, `cleanup.max_run_time`, `limits.max_batches` or `shutdown`),
/// purges old tombstones when `retention.purge_tombstones_after` is set, deletes old delivered
/// outbox events when `retention.outbox_keep_delivered` is set, and counts the backlog left.
/// Opens its own session (application_name `tombstoned/cleanup`), so a run after an outage
/// simply reconnects. Does not take the single-runner lease: that is the caller's choice
/// ([`super::Lease`]); two runs at once are safe, only wasteful.
///
/// `shutdown` is checked between batches, never inside one. With `metrics`, every batch, row,
/// lock timeout and database error is counted, and the run's outcome, duration, backlog and
/// last-success time are recorded. A finished run is logged; a failed one is returned, not
/// logged: reporting it is the caller's.
#[tracing::instrument(name = "cleanup_run", skip_all, fields(schema = %db.schema))]
pub async fn run_once(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
    retention: &RetentionConfig,
    limits: RunLimits,
    shutdown: &CancellationToken,
    metrics: Option<&Metrics>,
) -> Result<RunReport, CleanupError> {
    let run = RunContext::new(db, cleanup, retention, limits, shutdown, metrics);
    let result = with_stop_grace(shutdown, async {
        let session = db::connect(db, "cleanup")
            .await
            .map_err(CleanupError::Connect)?;
        // Boxed: a run's future (its engine's, its workers') is large for a caller's stack.
        Box::pin(run_on(&run, session.conn(), None)).await
    })
    .await;
    report_result(run.meter, &result, run.started);
    result
}

/// What [`run_leased`] did.
#[derive(Debug)]
pub enum LeasedRun {
    /// Another instance holds the lease (as it stood when the take failed, if readable):
    /// nothing was done.
    Skipped(Option<LeaseState>),
    /// The run, holding the lease. It is recorded in the history and the lease released.
    Ran(RunReport),
    /// A stop was requested before the run held the lease (while it connected or took it, e.g.
    /// on a database that does not answer): nothing was done, nothing recorded.
    Stopped,
}

/// [`run_once`] under the single-runner lease: takes the lease on the run's session (or
/// returns [`LeasedRun::Skipped`] when another run holds it), renews it in every batch (a batch
/// that finds it lost rolls back and the run stops, `stopped_by = lease_lost`), then records the
/// run in `cleanup_runs` and releases the lease in one statement — a failed run too, when the
/// database can be reached (otherwise that is logged and the lease expires on its own).
///
/// With `metrics`, a skip counts as `skipped_lease` and `tombstoned_cleanup_lease_held` is 1
/// while this run holds the lease; errors are counted and returned like [`run_once`]'s.
pub async fn run_leased(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
    retention: &RetentionConfig,
    limits: RunLimits,
    shutdown: &CancellationToken,
    metrics: Option<&Metrics>,
) -> Result<LeasedRun, CleanupError> {
    let run = RunContext::new(db, cleanup, retention, limits, shutdown, metrics);
    // Until the lease is held there is no batch to let finish: a stop ends the wait at once.
    let session = tokio::select! {
        connected = db::connect(db, "cleanup") => match connected {
            Ok(session) => session,
            Err(e) => {
                let e = CleanupError::Connect(e);
                run.meter.run_failed(&e, run.started.elapsed());
                return Err(e);
            }
        },
        () = shutdown.cancelled() => return Ok(LeasedRun::Stopped),
    };
    run_leased_on(session, &run).await
}

/// [`run_leased`] on a session the caller opened (`tombstoned cleanup` checks the schema on it
/// first: one connection per run, not two), for the run `run` (made when the run began,
/// connecting included).
///
/// With tracing on, the run is the root span of a trace of its own (`cleanup run`), each batch a
/// database client span inside it (phase, rows, lock waits), its log lines carrying their ids.
#[tracing::instrument(name = "cleanup_run", skip_all, fields(schema = %run.db.schema))]
pub async fn run_leased_on(
    session: db::Session,
    run: &RunContext<'_>,
) -> Result<LeasedRun, CleanupError> {
    let span = Span::root("cleanup run", Kind::Internal, || {
        vec![
            Attribute::new("tombstoned.schema", run.db.schema.clone()),
            Attribute::new("tombstoned.cleanup.workers", i64::from(run.cleanup.workers)),
        ]
    });
    let result = span.in_scope(leased_on(session, run)).await;
    match &result {
        Ok(LeasedRun::Ran(report)) => span.set(|| run_attributes(report)),
        Ok(LeasedRun::Skipped(_)) => span.set(|| {
            vec![Attribute::new(
                "tombstoned.cleanup.outcome",
                RunOutcome::SkippedLease.label(),
            )]
        }),
        Ok(LeasedRun::Stopped) => {
            span.set(|| vec![Attribute::new("tombstoned.cleanup.outcome", "stopped")]);
        }
        Err(e) => span.fail(e.sqlstate_class().unwrap_or("failed").to_owned()),
    }
    span.end();
    result
}

/// What a finished run's span says: its figures, never a key.
fn run_attributes(report: &RunReport) -> Vec<Attribute> {
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    vec![
        Attribute::new("tombstoned.cleanup.outcome", report.outcome.label()),
        Attribute::new("tombstoned.cleanup.stopped_by", report.stopped_by.label()),
        Attribute::new(
            "tombstoned.cleanup.rows_tombstoned",
            count(report.rows_tombstoned),
        ),
        Attribute::new("tombstoned.cleanup.batches", count(report.batches)),
        Attribute::new(
            "tombstoned.cleanup.lock_timeouts",
            count(report.lock_timeouts),
        ),
        Attribute::new(
            "tombstoned.cleanup.rows_skipped",
            count(report.rows_skipped),
        ),
        Attribute::new(
            "tombstoned.cleanup.tombstones_purged",
            count(report.tombstones_purged),
        ),
        Attribute::new(
            "tombstoned.cleanup.outbox_events_deleted",
            count(report.outbox_events_deleted),
        ),
        Attribute::new(
            "tombstoned.cleanup.backlog_rows",
            count(report.backlog_rows),
        ),
    ]
}

async fn leased_on(session: db::Session, run: &RunContext<'_>) -> Result<LeasedRun, CleanupError> {
    let (db, cleanup, shutdown, meter, started) =
        (run.db, run.cleanup, run.shutdown, run.meter, run.started);
    let holder = crate::instance::instance_id();
    let conn = session.conn();
    let taken = tokio::select! {
        taken = Lease::try_acquire(&conn, cleanup, &holder) => taken,
        () = shutdown.cancelled() => return Ok(LeasedRun::Stopped),
    };
    let lease = match taken {
        Ok(Some(lease)) => lease,
        Ok(None) => {
            meter.skipped_for_lease();
            let state = LeaseState::read(&conn).await.ok().flatten();
            tracing::info!(
                holder = state.as_ref().map(|s| s.holder.as_str()),
                "another instance holds the cleanup lease; run skipped"
            );
            return Ok(LeasedRun::Skipped(state));
        }
        Err(e) => {
            meter.run_failed(&e, started.elapsed());
            return Err(e);
        }
    };
    meter.lease_held(true);
    tracing::debug!(%holder, expires_at = %lease.expires_at(), "cleanup lease taken");
    let result = with_stop_grace(shutdown, async {
        let statement = lease.prepare_renewal(&conn, cleanup).await?;
        let renewal = Renewal {
            lease: &lease,
            statement,
        };
        Box::pin(run_on(run, conn, Some(renewal))).await
    })
    .await;
    let record = match &result {
        Ok(report) => RunRecord::finished(report),
        Err(e) => RunRecord::failed(e, &run.figures()),
    };
    // Recorded on the run's session; after a lost connection, on a new one (bounded by
    // connect_timeout): a run that failed is recorded whenever the database can be reached.
    // A run that failed at shutdown may have been abandoned with its batch still in flight on
    // its session: record it on a fresh one instead.
    let abandoned = result.is_err() && shutdown.is_cancelled();
    let mut recorded = None;
    if !session.is_closed() && !abandoned {
        recorded = Some(finish_run(&conn, cleanup, &lease, &record).await);
    }
    let connection_lost = match &recorded {
        None => true,
        Some(Err(e)) => e.class() == ErrorClass::Unavailable,
        Some(Ok(_)) => false,
    };
    if connection_lost {
        recorded = Some(match db::connect(db, "cleanup").await {
            Ok(fresh) => finish_run(&fresh.conn(), cleanup, &lease, &record).await,
            Err(e) => Err(e),
        });
    }
    let recorded = recorded.unwrap_or(Ok(false));
    meter.lease_held(false);
    match recorded {
        Ok(true) => {}
        Ok(false) => tracing::info!("run recorded; the cleanup lease had passed to another run"),
        // After a run that failed because the database went away, the run's own error (reported
        // once, by the caller) already says why; this is only detail.
        Err(e) if result.is_err() && e.class() == ErrorClass::Unavailable => tracing::debug!(
            error = %db::error_text(&e),
            "cleanup run not recorded in cleanup_runs; its lease expires on its own"
        ),
        Err(e) => tracing::warn!(
            error = %db::error_text(&e),
            "cleanup run not recorded in cleanup_runs; its lease expires on its own"
        ),
    }
    report_result(meter, &result, started);
    result.map(LeasedRun::Ran)
}

/// `run`, abandoned [`STOP_GRACE`] after `shutdown` if it has not ended by then: a stop lets
/// the batch in flight commit or roll back, but on a silent database it would otherwise wait its
/// whole deadline, past a service manager's stop timeout. Dropping the run's session makes the
/// server roll the batch back.
async fn with_stop_grace<T>(
    shutdown: &CancellationToken,
    run: impl std::future::Future<Output = Result<T, CleanupError>>,
) -> Result<T, CleanupError> {
    tokio::select! {
        result = run => result,
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(STOP_GRACE).await;
        } => Err(CleanupError::abandoned()),
    }
}

/// Counts and logs a run's end (a failure is counted only: reporting it is the caller's).
fn report_result(meter: Meter<'_>, result: &Result<RunReport, CleanupError>, started: Instant) {
    match result {
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
        // Counted, not logged: the caller reports a failure, once (the scheduler in its log and
        // status, `tombstoned cleanup` on its error line).
        Err(e) => meter.run_failed(e, started.elapsed()),
    }
}

/// The run itself on `conn` (its session), its lease renewed by every batch with `renewal`.
async fn run_on(
    run: &RunContext<'_>,
    conn: Conn<'_>,
    renewal: Option<Renewal<'_>>,
) -> Result<RunReport, CleanupError> {
    let (cleanup, retention) = (run.cleanup, run.retention);
    // Each statement outside the batches is its own transaction with the server-side bound set
    // transaction-local (nothing stays set on a session a pooler hands on); the client waits a
    // little beyond it ([`super::bounded`]).
    let bound = cleanup.statement_timeout;
    let statement_timeout = db::sql::duration_setting(bound);
    let cutoff: DateTime<Utc> = super::bounded(bound, "reading the cutoff", async {
        in_own_transaction(&conn, &statement_timeout, sql::CUTOFF, &[])
            .await?
            .try_get(0)
    })
    .await?;

    let lease = renewal.as_ref().map(|r| r.lease);
    let mut engine = Engine::new(conn, run, renewal).await?;

    let mut workers = 1;
    let tombstoning = if cleanup.workers > 1 {
        let team = Box::pin(workers::tombstone(run, lease, &conn, cutoff)).await?;
        workers = team.workers.max(1);
        team.phase
    } else {
        engine.phase(Phase::Tombstone, cutoff).await?
    };
    let mut stopped = tombstoning.stopped;
    let mut purge_bound = None;
    if let (None, Some(after)) = (stopped, retention.purge_tombstones_after) {
        if let Some(before) = purge_before(cutoff, after) {
            purge_bound = Some(before);
            stopped = engine.phase(Phase::Purge, before).await?.stopped;
        }
    }
    let mut outbox_bound = None;
    if let (None, Some(keep)) = (stopped, retention.outbox_keep_delivered) {
        if let Some(before) = purge_before(cutoff, keep) {
            outbox_bound = Some(before);
            stopped = engine.phase(Phase::OutboxRetention, before).await?.stopped;
        }
    }

    let (backlog_rows, oldest_due_deadline) = backlog(
        &conn,
        &statement_timeout,
        cutoff,
        tombstoning.left.ranges(),
        bound,
    )
    .await?;
    let duration = run.started.elapsed();
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
    let mut figures = run.figures();
    figures.batch_durations.sort_unstable();
    let durations = &figures.batch_durations;
    Ok(RunReport {
        cutoff,
        rows_tombstoned: figures.rows_tombstoned,
        batches: figures.tombstone_batches,
        lock_timeouts: figures.lock_timeouts,
        rows_skipped: figures.rows_skipped,
        retries: figures.retries,
        tombstones_purged: figures.tombstones_purged,
        purge_batches: figures.purge_batches,
        purge_before: purge_bound,
        outbox_events_deleted: figures.outbox_events_deleted,
        outbox_batches: figures.outbox_batches,
        outbox_delete_before: outbox_bound,
        duration,
        rows_per_second: per_second(figures.rows_tombstoned, duration),
        backlog_rows,
        oldest_due_deadline,
        oldest_due_age,
        slowest_batch: durations.last().copied().unwrap_or_default(),
        batch_p99: percentile(durations, 0.99),
        throttled_replica_lag: figures.throttled_replica_lag,
        throttled_rate: figures.throttled_rate,
        stopped_while_waiting_for: run.pace.waiting_when_stopped(),
        workers,
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
    conn: &Conn<'_>,
    statement_timeout: &str,
    cutoff: Key,
    ranges: &[KeyRange],
    bound: Duration,
) -> Result<(u64, Option<Key>), CleanupError> {
    let mut rows = 0u64;
    let mut oldest: Option<Key> = None;
    for range in ranges {
        let to = range.to.min(cutoff);
        let row = super::bounded(
            bound,
            "counting the backlog",
            in_own_transaction(
                conn,
                statement_timeout,
                sql::DUE_IN_RANGE,
                &[&range.from, &to],
            ),
        )
        .await?;
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

/// `template`'s one row, in a transaction of its own with `statement_timeout` set for it: one
/// pipelined round trip ([`pipeline`]).
async fn in_own_transaction(
    conn: &Conn<'_>,
    statement_timeout: &str,
    template: &'static str,
    params: &[&dyn Param],
) -> Result<tokio_postgres::Row, tokio_postgres::Error> {
    pipeline::query_one(
        conn,
        db::sql::SET_LOCAL_STATEMENT_TIMEOUT,
        &[&statement_timeout],
        template,
        params,
    )
    .await
    .map_err(|failure| failure.error)
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
    fn rows_per_second_survives_a_zero_duration() {
        assert_eq!(per_second(10, Duration::ZERO), 0.0);
        assert_eq!(per_second(10, Duration::from_secs(2)), 5.0);
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

//! The batch engine both phases of a run share (tombstoning, then the optional purge): it walks
//! the phase's index batch by batch, each batch one short pipelined transaction, isolates rows
//! held past `cleanup.lock_timeout` with `SKIP LOCKED`, retries deadlocks, and feeds the metrics.
//! The statements and their locking argument are in [`super::sql`]; where a pass stands in its
//! index is [`super::keyset`]. A leased run's batches renew the lease first, in the same
//! transaction ([`super::lease`]): a batch that finds the lease lost rolls back and ends the run.
//! Before each batch the engine waits as `cleanup.max_rows_per_second` and
//! `cleanup.max_replica_lag` ask ([`super::throttle`]), outside any transaction, renewing the
//! lease when a wait outlasts a third of it. With `cleanup.workers > 1` each worker runs an engine
//! of its own over its slice ([`super::workers`]), its batches guarded by a [`LeaseCheck`]. Every
//! engine of a run works in the run's [`RunContext`]: it adds what it does to the run's figures
//! and keeps to the run's [`super::context::Pace`] (the first stop stops all; `--max-batches` and
//! the rate cap count every engine's batches and rows).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio_postgres::types::Type;

use super::context::RunContext;
use super::figures::RunFigures;
use super::keyset::{BatchRows, Key, KeyRange, Pass, Revisit, Step};
use super::lease::Lease;
use super::report::StopReason;
use super::sizing::BatchSizer;
use super::throttle::{self, ReplicaLag, ThrottleReason, LAG_POLL_INTERVAL};
use super::{sql, CleanupError};
use crate::config::OnLocked;
use crate::db::pipeline::{self, Guard, Pipelined};
use crate::db::statement::Ready;
use crate::db::{self, Conn, DbError, ErrorClass, Param};
use crate::telemetry::{Attribute, Kind, Span};

/// Attempts per batch when it fails with a deadlock (40P01) or serialization failure (40001).
/// Neither should happen (every locker goes in primary-key order); a few retries cover a foreign
/// locker that does not.
const MAX_BATCH_ATTEMPTS: u32 = 5;

/// The longest single sleep of a throttled run: its waited seconds are counted (and the lease
/// looked at) at least this often, so the metric rises while a long wait goes on.
const MAX_WAIT_SLICE: Duration = Duration::from_secs(1);

/// The two phases of a run share one batch engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
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

    /// The phase's name in traces.
    fn label(self) -> &'static str {
        match self {
            Phase::Tombstone => "tombstone",
            Phase::Purge => "purge",
            Phase::OutboxRetention => "outbox_retention",
        }
    }

    /// The batch statement's name (`cleanup::sql`), a database span's `db.query.summary`.
    fn statement_name(self) -> &'static str {
        match self {
            Phase::Tombstone => "tombstone_batch",
            Phase::Purge => "purge_batch",
            Phase::OutboxRetention => "outbox_retention_batch",
        }
    }

    fn step(self) -> &'static str {
        match self {
            Phase::Tombstone => "running a tombstone batch",
            Phase::Purge => "running a purge batch",
            Phase::OutboxRetention => "running an outbox retention batch",
        }
    }

    /// What one committed batch of this phase adds to the run's figures.
    fn committed(self, rows: &BatchRows) -> RunFigures {
        let batches = u64::from(rows.picked > 0);
        let mut figures = RunFigures::default();
        match self {
            Phase::Tombstone => {
                figures.rows_tombstoned = rows.changed;
                figures.tombstone_batches = batches;
            }
            Phase::Purge => {
                figures.tombstones_purged = rows.changed;
                figures.purge_batches = batches;
            }
            Phase::OutboxRetention => {
                figures.outbox_events_deleted = rows.changed;
                figures.outbox_batches = batches;
            }
        }
        figures
    }
}

/// Main pass over the whole range, or the final pass over ranges the main pass left behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PassKind {
    Main,
    Final,
}

/// Where a phase ended (its figures are the run's, [`RunContext::figures`]).
#[derive(Debug, Default)]
pub(super) struct PhaseResult {
    /// `Some` when a limit or shutdown stopped the phase.
    pub(super) stopped: Option<StopReason>,
    /// Ranges that may still hold rows at the end.
    pub(super) left: Revisit,
}

/// A batch that ran to its end, or one rolled back by `lock_timeout`, or one rolled back because
/// its run no longer holds the lease.
enum BatchResult {
    Done(BatchRows),
    LockTimeout,
    LeaseLost,
}

/// The lease a leased run renews in every batch, and its prepared renewal.
pub(super) struct Renewal<'a> {
    pub(super) lease: &'a Lease,
    pub(super) statement: Ready,
}

/// A worker's lease check ([`super::sql::LEASE_HELD`], prepared on its session): the guard of
/// its batches, instead of the renewal a single-session run pipelines into each batch.
pub(super) struct LeaseCheck<'a> {
    pub(super) lease: &'a Lease,
    pub(super) statement: Ready,
}

/// The parameter types of [`sql::BATCH_SETTINGS`]: lock_timeout, statement_timeout.
static BATCH_SETTINGS_TYPES: [Type; 2] = [Type::TEXT, Type::TEXT];

/// The parameter types of every batch statement: bound, from, to, limit.
static BATCH_TYPES: [Type; 4] = [
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
    Type::TIMESTAMPTZ,
    Type::INT8,
];

/// One batch engine of a run: its session, the prepared transaction frame, the run it works for.
pub(super) struct Engine<'a> {
    conn: Conn<'a>,
    begin: Ready,
    batch_settings: Ready,
    commit: Ready,
    run: &'a RunContext<'a>,
    lock_timeout: String,
    statement_timeout: String,
    /// The next batch's size (`cleanup.batch_size`, or following `cleanup.batch_time`).
    sizer: BatchSizer,
    renewal: Option<Renewal<'a>>,
    /// When the lease was last taken or renewed (by a committed batch, or during a wait).
    last_renewal: Instant,
    /// How many engines of the run wait side by side (its workers, or 1): each counts its share
    /// of a wait, so the run's figures and metric add up to the run's waiting time.
    side_by_side: u32,
    /// A worker's lease check, when its run holds the lease.
    lease_check: Option<LeaseCheck<'a>>,
}

impl<'a> Engine<'a> {
    /// An engine of `run` on `conn`, with BEGIN, the batch settings and COMMIT prepared once
    /// (named statements; through a transaction pooler unnamed ones, sent whole each batch):
    /// every batch is then one pipelined round trip. With `renewal`, each batch renews the run's
    /// lease first, in its transaction.
    pub(super) async fn new(
        conn: Conn<'a>,
        run: &'a RunContext<'a>,
        renewal: Option<Renewal<'a>>,
    ) -> Result<Engine<'a>, CleanupError> {
        let cleanup = run.cleanup;
        // Prepared side by side: one round trip, not three.
        let (begin, batch_settings, commit) = super::bounded(
            cleanup.statement_timeout,
            "preparing the batch transaction",
            async {
                futures::try_join!(
                    conn.prepare(db::sql::BEGIN_READ_COMMITTED, &[]),
                    conn.prepare(sql::BATCH_SETTINGS, &BATCH_SETTINGS_TYPES),
                    conn.prepare(db::sql::COMMIT, &[]),
                )
            },
        )
        .await?;
        Ok(Engine {
            conn,
            begin,
            batch_settings,
            commit,
            run,
            lock_timeout: db::sql::duration_setting(cleanup.lock_timeout),
            statement_timeout: db::sql::duration_setting(cleanup.statement_timeout),
            sizer: BatchSizer::new(cleanup.batch_size, cleanup.batch_time),
            renewal,
            last_renewal: Instant::now(),
            side_by_side: 1,
            lease_check: None,
        })
    }

    /// This engine as one of `workers` working side by side, each batch guarded by
    /// `lease_check` (the run renews the lease elsewhere).
    pub(super) fn working_beside(
        mut self,
        workers: u32,
        lease_check: Option<LeaseCheck<'a>>,
    ) -> Self {
        self.side_by_side = workers.max(1);
        self.lease_check = lease_check;
        self
    }

    /// Ends this engine for `reason`, or for the reason another engine of the run stopped first.
    fn stop_reason(&self, reason: StopReason) -> StopReason {
        self.run.pace.stop(reason)
    }

    /// Walks the phase's index from the beginning up to `bound` (inclusive), batch by batch.
    ///
    /// `on_locked = "wait"`: a batch waits up to `lock_timeout` for held rows. On a timeout the
    /// batch has rolled back; the same range runs once more with `SKIP LOCKED`, which does the
    /// rest of it and passes over what is held. Ranges passed over get one more (waiting) pass at
    /// the end of the phase; what is still held then is left for the next run.
    ///
    /// `on_locked = "skip"`: every batch uses `SKIP LOCKED`; held rows are left for the next run.
    pub(super) async fn phase(
        &mut self,
        phase: Phase,
        bound: Key,
    ) -> Result<PhaseResult, CleanupError> {
        let whole = KeyRange {
            from: None,
            to: bound,
        };
        self.phase_over(phase, bound, whole).await
    }

    /// [`Engine::phase`] over the part `range` of the phase's index (a worker's slice): rows
    /// outside it are left to others.
    #[tracing::instrument(level = "debug", skip(self), fields(?phase, %bound, ?range))]
    pub(super) async fn phase_over(
        &mut self,
        phase: Phase,
        bound: Key,
        range: KeyRange,
    ) -> Result<PhaseResult, CleanupError> {
        let (wait_sql, skip_sql) = phase.statements();
        // Both prepared side by side: one round trip.
        let (wait, skip) = super::bounded(
            self.run.cleanup.statement_timeout,
            "preparing the batch statement",
            async {
                futures::try_join!(
                    self.conn.prepare(wait_sql, &BATCH_TYPES),
                    self.conn.prepare(skip_sql, &BATCH_TYPES),
                )
            },
        )
        .await?;
        let waits = self.run.cleanup.on_locked == OnLocked::Wait;
        self.sizer.restart();

        let mut result = PhaseResult::default();
        let mut work = VecDeque::from([(range, PassKind::Main)]);
        let mut deferred = Revisit::default();
        while let Some((range, kind)) = work.pop_front() {
            // Rows passed over in the main pass of "wait" mode get one more try at the end.
            let retry_later = waits && kind == PassKind::Main;
            let mut pass = Pass::new(range);
            loop {
                if let Some(reason) = self.limit_reached() {
                    let reason = self.stop_reason(reason);
                    stop_phase(&mut result, reason, &pass, &mut work, &mut deferred);
                    return Ok(result);
                }
                if let Some(reason) = self.throttle().await? {
                    let reason = self.stop_reason(reason);
                    stop_phase(&mut result, reason, &pass, &mut work, &mut deferred);
                    return Ok(result);
                }
                self.run.pace.batch_begins();
                let statement = if waits { &wait } else { &skip };
                let first = self.batch(phase, statement, bound, &pass).await?;
                let outcome = match first {
                    BatchResult::LockTimeout => {
                        // Isolate the held rows: the same batch without waiting for them.
                        self.batch(phase, &skip, bound, &pass).await?
                    }
                    other => other,
                };
                let rows = match outcome {
                    BatchResult::LeaseLost => {
                        let reason = self.stop_reason(StopReason::LeaseLost);
                        stop_phase(&mut result, reason, &pass, &mut work, &mut deferred);
                        return Ok(result);
                    }
                    BatchResult::Done(rows) => rows,
                    // The SKIP LOCKED batch timed out too (a first batch that did not time out
                    // came through as it was): only a table-level lock can do that (DDL in
                    // progress), so leave the rest of this pass for later.
                    BatchResult::LockTimeout => {
                        result.left.add(pass.remaining());
                        break;
                    }
                };
                // Due rows passed over for good (the purge and outbox phases' are not due rows).
                if phase == Phase::Tombstone && !retry_later && rows.passed_over > 0 {
                    self.run.figures.add(RunFigures {
                        rows_skipped: rows.passed_over,
                        ..RunFigures::default()
                    });
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
        let run = self.run;
        let committed = run.pace.committed_batches();
        if let Some(reason) = run.pace.stopped() {
            // Another engine stopped: the run stops, for the same reason.
            Some(reason)
        } else if run.shutdown.is_cancelled() {
            Some(StopReason::Shutdown)
        } else if run.limits.max_batches.is_some_and(|max| committed >= max) {
            Some(StopReason::MaxBatches)
        } else if committed > 0 && run.started.elapsed() >= run.cleanup.max_run_time {
            // Checked once a batch has run, so even a run that connected slowly makes progress.
            Some(StopReason::MaxRunTime)
        } else {
            None
        }
    }

    /// Waits before a batch as `cleanup.max_rows_per_second` and then `cleanup.max_replica_lag`
    /// ask, outside any transaction. `Some(reason)` when the run must stop instead of starting
    /// the batch: shutdown, `cleanup.max_run_time` (during a replica-lag wait:
    /// [`StopReason::ReplicaLag`]), or the lease found lost.
    async fn throttle(&mut self) -> Result<Option<StopReason>, CleanupError> {
        let run = self.run;
        if let (Some(per_second), Some(since)) =
            (run.cleanup.max_rows_per_second, run.pace.first_batch())
        {
            let wait = throttle::rate_wait(run.pace.rows_changed(), per_second, since.elapsed());
            if !wait.is_zero() {
                let stop = self
                    .wait(ThrottleReason::Rate, wait, StopReason::MaxRunTime)
                    .await?;
                if stop.is_some() {
                    return Ok(stop);
                }
            }
        }
        let Some(limit) = run.cleanup.max_replica_lag else {
            return Ok(None);
        };
        let mut waiting_since: Option<Instant> = None;
        loop {
            let lag = self.read_replica_lag().await?;
            run.meter.replica_lag(&lag);
            if !lag.visible {
                return Err(CleanupError::ReplicaLagHidden { role: lag.role });
            }
            match lag.over(limit) {
                None => {
                    if let Some(since) = waiting_since {
                        tracing::info!(
                            waited_seconds = since.elapsed().as_secs_f64(),
                            "the standbys caught up; cleanup goes on"
                        );
                    }
                    return Ok(None);
                }
                Some((standby, lag_bytes)) => {
                    if waiting_since.is_none() {
                        tracing::info!(
                            standby = %standby.application_name,
                            lag_bytes,
                            max_replica_lag = limit,
                            "a standby replays too far behind; cleanup waits for it"
                        );
                        waiting_since = Some(Instant::now());
                    }
                }
            }
            let stop = self
                .wait(
                    ThrottleReason::ReplicaLag,
                    LAG_POLL_INTERVAL,
                    StopReason::ReplicaLag,
                )
                .await?;
            if stop.is_some() {
                return Ok(stop);
            }
        }
    }

    /// `pg_stat_replication` as the server sees it now: one short statement in a transaction
    /// of its own, bounded by `statement_timeout`.
    async fn read_replica_lag(&self) -> Result<ReplicaLag, CleanupError> {
        const STEP: &str = "reading the standbys' replay lag";
        let rows = super::bounded(self.run.cleanup.statement_timeout, STEP, async {
            pipeline::query(
                &self.conn,
                db::sql::SET_LOCAL_STATEMENT_TIMEOUT,
                &[&self.statement_timeout],
                sql::REPLICA_LAG,
                &[],
            )
            .await
            .map_err(|failure| failure.error)
        })
        .await?;
        ReplicaLag::from_rows(&rows).map_err(CleanupError::query(STEP))
    }

    /// Sleeps `wait` outside any transaction, counting it under `reason` as it goes, and
    /// renewing the lease whenever a third of its time has passed since the last renewal. Ends
    /// early with `Some(Shutdown)`, with `Some(at_deadline)` at `cleanup.max_run_time`, or with
    /// `Some(LeaseLost)` when a renewal finds another run holding the lease.
    async fn wait(
        &mut self,
        reason: ThrottleReason,
        wait: Duration,
        at_deadline: StopReason,
    ) -> Result<Option<StopReason>, CleanupError> {
        let run = self.run;
        let deadline = run.started + run.cleanup.max_run_time;
        let until = Instant::now() + wait;
        loop {
            let now = Instant::now();
            let stop = if run.shutdown.is_cancelled() {
                Some(StopReason::Shutdown)
            } else if now >= until {
                return Ok(None);
            } else if let Some(stopped) = run.pace.stopped() {
                // Another engine stopped the run while this one waited.
                Some(stopped)
            } else if now >= deadline {
                Some(at_deadline)
            } else {
                self.renew_if_due().await?
            };
            if let Some(stop) = stop {
                run.pace.stopped_while_waiting_for(reason);
                return Ok(Some(stop));
            }
            let slice_end = until.min(deadline).min(now + MAX_WAIT_SLICE);
            tokio::select! {
                _ = tokio::time::sleep_until(slice_end.into()) => {}
                _ = run.shutdown.cancelled() => {}
            }
            // The workers of a run wait side by side for the same reason: each counts its share,
            // so the figures and the metric add up to the run's waiting time.
            let share = now.elapsed() / self.side_by_side;
            run.meter.throttled(reason, share);
            let mut waited = RunFigures::default();
            match reason {
                ThrottleReason::ReplicaLag => waited.throttled_replica_lag = share,
                ThrottleReason::Rate => waited.throttled_rate = share,
            }
            run.figures.add(waited);
        }
    }

    /// Renews the lease in a transaction of its own when a third of its time has passed since
    /// the last renewal (a leased run only): a wait must not let it expire.
    async fn renew_if_due(&mut self) -> Result<Option<StopReason>, CleanupError> {
        let Some(renewal) = &self.renewal else {
            return Ok(None);
        };
        if self.last_renewal.elapsed() < renewal.lease.ttl() / 3 {
            return Ok(None);
        }
        match renewal.lease.renew(&self.conn, self.run.cleanup).await {
            Ok(()) => {
                self.last_renewal = Instant::now();
                Ok(None)
            }
            Err(e) if e.class() == ErrorClass::LeaseLost => {
                tracing::warn!(
                    "another run holds the cleanup lease now (this run's had expired); stopping"
                );
                Ok(Some(StopReason::LeaseLost))
            }
            Err(e) => Err(e),
        }
    }

    /// `cleanup.pause_between_batches`, outside any transaction; cut short by shutdown.
    async fn pause(&self) {
        let pause = self.run.cleanup.pause_between_batches;
        if !pause.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = self.run.shutdown.cancelled() => {}
            }
        }
    }

    /// One batch, retried on deadlock or serialization failure.
    ///
    /// With tracing on, a database client span inside the run's: its phase, then the rows it
    /// picked, changed and passed over (held by others), or that it waited `lock_timeout` for a
    /// row in vain.
    async fn batch(
        &mut self,
        phase: Phase,
        statement: &Ready,
        bound: Key,
        pass: &Pass,
    ) -> Result<BatchResult, CleanupError> {
        let span = Span::child("cleanup batch", Kind::Client, || {
            vec![
                Attribute::new("db.system.name", "postgresql"),
                Attribute::new("db.query.summary", phase.statement_name()),
                Attribute::new("tombstoned.cleanup.phase", phase.label()),
            ]
        });
        let result = span
            .in_scope(self.batch_untraced(phase, statement, bound, pass))
            .await;
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        match &result {
            Ok(BatchResult::Done(rows)) => span.set(|| {
                vec![
                    Attribute::new("tombstoned.cleanup.rows", count(rows.changed)),
                    Attribute::new("tombstoned.cleanup.rows_picked", count(rows.picked)),
                    Attribute::new(
                        "tombstoned.cleanup.rows_passed_over",
                        count(rows.passed_over),
                    ),
                ]
            }),
            Ok(BatchResult::LockTimeout) => {
                span.set(|| vec![Attribute::new("tombstoned.cleanup.lock_timeout", true)]);
            }
            Ok(BatchResult::LeaseLost) => span.fail("lease_lost"),
            Err(e) => span.fail_sqlstate(e.db_error().and_then(DbError::sqlstate)),
        }
        span.end();
        result
    }

    async fn batch_untraced(
        &mut self,
        phase: Phase,
        statement: &Ready,
        bound: Key,
        pass: &Pass,
    ) -> Result<BatchResult, CleanupError> {
        let (run, meter) = (self.run, self.run.meter);
        let mut attempt = 0;
        let size = self.sizer.next();
        loop {
            attempt += 1;
            let began = Instant::now();
            let result = self.transaction(statement, bound, pass, size).await;
            let took = began.elapsed();
            let mut figures = RunFigures {
                batch_durations: vec![took],
                ..RunFigures::default()
            };
            match result {
                Ok(rows) => {
                    self.sizer.committed(size, rows.picked, took);
                    run.pace.committed(rows.changed);
                    if self.renewal.is_some() {
                        // The batch renewed the lease before its statement, in its transaction.
                        self.last_renewal = began;
                    }
                    figures += phase.committed(&rows);
                    run.figures.add(figures);
                    meter.batch("committed", took);
                    match phase {
                        Phase::Tombstone => meter.tombstoned(rows.changed),
                        Phase::Purge => meter.purged(rows.changed),
                        Phase::OutboxRetention => meter.outbox_deleted(rows.changed),
                    }
                    tracing::debug!(
                        ?phase,
                        size,
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
                        figures.lock_timeouts = 1;
                        run.figures.add(figures);
                        meter.db_error(e.sqlstate_class());
                        meter.batch("lock_timeout", took);
                        meter.lock_timeout();
                        tracing::info!(
                            ?phase,
                            lock_timeout = %self.lock_timeout,
                            "batch rolled back: a row stayed locked past lock_timeout"
                        );
                        return Ok(BatchResult::LockTimeout);
                    }
                    ErrorClass::LeaseLost => {
                        run.figures.add(figures);
                        meter.batch("failed", took);
                        tracing::warn!(
                            ?phase,
                            "batch rolled back: another run holds the cleanup lease now (this \
                             run's had expired); stopping"
                        );
                        return Ok(BatchResult::LeaseLost);
                    }
                    ErrorClass::Deadlock | ErrorClass::SerializationFailure
                        if attempt < MAX_BATCH_ATTEMPTS =>
                    {
                        figures.retries = 1;
                        run.figures.add(figures);
                        meter.db_error(e.sqlstate_class());
                        meter.batch("retried", took);
                        tracing::warn!(?phase, attempt, error = %db::error_text(&e), "batch rolled back, retrying");
                        tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
                    }
                    ErrorClass::Deadlock | ErrorClass::SerializationFailure => {
                        run.figures.add(figures);
                        meter.batch("failed", took);
                        return Err(CleanupError::RetriesExhausted {
                            attempts: attempt,
                            source: e,
                        });
                    }
                    // Fatal errors are counted once, by `run_failed`.
                    _ => {
                        run.figures.add(figures);
                        meter.batch("failed", took);
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
    /// one round trip ([`db::pipeline`]): the batch's row locks are released the moment its
    /// statement ends, and the batch applies whole or not at all.
    async fn transaction(
        &self,
        statement: &Ready,
        bound: Key,
        pass: &Pass,
        size: u32,
    ) -> Result<BatchRows, DbError> {
        let limit = i64::from(size);
        let from = pass.cursor();
        let to = pass.to();
        let settings: [&dyn Param; 2] = [&self.lock_timeout, &self.statement_timeout];
        let params: [&dyn Param; 4] = [&bound, &from, &to, &limit];
        let pipelined = Pipelined {
            begin: &self.begin,
            settings: &self.batch_settings,
            statement,
            commit: &self.commit,
        };
        let client = self.conn.client();
        // Every statement of the batch is bounded by statement_timeout on the server; the client
        // waits a little beyond that, then gives up on a silent database: the run fails and its
        // session is dropped (the server rolls the batch back if it ever hears of it).
        let row = db::deadline::within(
            db::deadline::beyond(self.run.cleanup.statement_timeout),
            "a cleanup batch",
            async {
                if let Some(check) = &self.lease_check {
                    let check_params = check.lease.check_params();
                    let guard = Guard {
                        statement: &check.statement,
                        params: &check_params,
                    };
                    return pipelined
                        .query_one_guarded(client, &settings, guard, &params)
                        .await;
                }
                match &self.renewal {
                    Some(renewal) => {
                        let renewal_params = renewal.lease.renewal_params();
                        let guard = Guard {
                            statement: &renewal.statement,
                            params: &renewal_params,
                        };
                        pipelined
                            .query_one_guarded(client, &settings, guard, &params)
                            .await
                    }
                    None => pipelined.query_one(client, &settings, &params).await,
                }
            },
        )
        .await?
        .map_err(|failure| DbError::Query(failure.error))?;
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

/// Ends a phase early: what it had not reached yet is left for the next run.
fn stop_phase(
    result: &mut PhaseResult,
    reason: StopReason,
    pass: &Pass,
    work: &mut VecDeque<(KeyRange, PassKind)>,
    deferred: &mut Revisit,
) {
    result.left.add(pass.remaining());
    for (range, _) in work.drain(..) {
        result.left.add(range);
    }
    for range in deferred.take() {
        result.left.add(range);
    }
    result.stopped = Some(reason);
}

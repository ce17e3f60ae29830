//! The batch engine both phases of a run share (tombstoning, then the optional purge): it walks
//! the phase's index batch by batch, each batch one short pipelined transaction, isolates rows
//! held past `cleanup.lock_timeout` with `SKIP LOCKED`, retries deadlocks, and feeds the metrics.
//! The statements and their locking argument are in [`super::sql`]; where a pass stands in its
//! index is [`super::keyset`]. A leased run's batches renew the lease first, in the same
//! transaction ([`super::lease`]): a batch that finds the lease lost rolls back and ends the run.
//! Before each batch the engine waits as `cleanup.max_rows_per_second` and
//! `cleanup.max_replica_lag` ask ([`super::throttle`]), outside any transaction, renewing the
//! lease when a wait outlasts a third of it. With `cleanup.workers > 1` each worker runs an engine
//! of its own over its slice ([`super::workers`]), in a [`Team`] that shares the run's stop
//! reason, batch count and rate cap, its batches guarded by a [`LeaseCheck`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

use super::history::ProgressCell;
use super::keyset::{BatchRows, Key, KeyRange, Pass, Revisit, Step};
use super::lease::Lease;
use super::report::{RunOutcome, RunReport, StopReason};
use super::sizing::BatchSizer;
use super::throttle::{self, ReplicaLag, ThrottleReason, LAG_POLL_INTERVAL};
use super::{sql, CleanupError};
use crate::config::{CleanupConfig, OnLocked};
use crate::db::pipeline::{self, Guard, Pipelined};
use crate::db::statement::Ready;
use crate::db::{self, Conn, DbError, ErrorClass, Param};
use crate::metrics::Metrics;

/// Limits a caller puts on one run, on top of the configuration's `cleanup.max_run_time`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunLimits {
    /// Stop after this many committed batches (`tombstoned cleanup --max-batches`).
    pub max_batches: Option<u64>,
}

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
pub(super) struct PhaseResult {
    /// `Some` when a limit or shutdown stopped the phase.
    pub(super) stopped: Option<StopReason>,
    pub(super) changed: u64,
    pub(super) batches: u64,
    pub(super) lock_timeouts: u64,
    pub(super) rows_skipped: u64,
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

/// What the workers of one run (`cleanup.workers > 1`, [`super::workers`]) share, so that the
/// run's limits hold for the run as a whole: the first reason that stops any worker stops all,
/// `--max-batches` and the rate cap count every worker's batches and rows, and the rate cap's
/// clock starts with the run's first batch.
#[derive(Debug)]
pub(super) struct Team {
    workers: u32,
    stopped: Mutex<Option<StopReason>>,
    committed_batches: AtomicU64,
    rows_changed: AtomicU64,
    pace_started: OnceLock<Instant>,
}

impl Team {
    pub(super) fn new(workers: u32) -> Team {
        Team {
            workers: workers.max(1),
            stopped: Mutex::new(None),
            committed_batches: AtomicU64::new(0),
            rows_changed: AtomicU64::new(0),
            pace_started: OnceLock::new(),
        }
    }

    /// Records `reason` unless another worker stopped first; returns the reason that stops the
    /// team (the first one).
    pub(super) fn stop(&self, reason: StopReason) -> StopReason {
        *self
            .stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get_or_insert(reason)
    }

    fn stopped(&self) -> Option<StopReason> {
        *self
            .stopped
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn committed_batches(&self) -> u64 {
        self.committed_batches.load(Ordering::Relaxed)
    }

    pub(super) fn rows_changed(&self) -> u64 {
        self.rows_changed.load(Ordering::Relaxed)
    }

    pub(super) fn pace_started(&self) -> Option<Instant> {
        self.pace_started.get().copied()
    }
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

/// One run's batch engine: the session, the prepared transaction frame, the run's limits and its
/// running figures.
pub(super) struct Engine<'a> {
    conn: Conn<'a>,
    begin: Ready,
    batch_settings: Ready,
    commit: Ready,
    cleanup: &'a CleanupConfig,
    limits: RunLimits,
    shutdown: &'a CancellationToken,
    meter: Meter<'a>,
    started: Instant,
    lock_timeout: String,
    statement_timeout: String,
    committed_batches: u64,
    /// The next batch's size (`cleanup.batch_size`, or following `cleanup.batch_time`).
    sizer: BatchSizer,
    renewal: Option<Renewal<'a>>,
    /// What committed so far, readable by the caller after a failure.
    progress: &'a ProgressCell,
    /// Every batch transaction's duration, committed or not.
    pub(super) batch_durations: Vec<Duration>,
    /// Batches retried after a deadlock or serialization failure.
    pub(super) retries: u64,
    /// When the first batch began: `cleanup.max_rows_per_second` is kept from then on.
    pace_started: Option<Instant>,
    /// Rows the run's committed batches changed (every phase), which the rate cap paces.
    rows_changed: u64,
    /// When the lease was last taken or renewed (by a committed batch, or during a wait).
    last_renewal: Instant,
    /// Time spent waiting for the standbys ([`ThrottleReason::ReplicaLag`]).
    pub(super) throttled_replica_lag: Duration,
    /// Time spent waiting for the rate cap ([`ThrottleReason::Rate`]).
    pub(super) throttled_rate: Duration,
    /// What the run was waiting for when it was stopped, if it was stopped during a wait.
    pub(super) stopped_while_waiting_for: Option<ThrottleReason>,
    /// The run's other workers, when it has several.
    team: Option<&'a Team>,
    /// A worker's lease check, when its run holds the lease.
    lease_check: Option<LeaseCheck<'a>>,
}

impl<'a> Engine<'a> {
    /// An engine on `conn`, with BEGIN, the batch settings and COMMIT prepared once (named
    /// statements; through a transaction pooler unnamed ones, sent whole each batch): every batch
    /// is then one pipelined round trip.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn new(
        conn: Conn<'a>,
        cleanup: &'a CleanupConfig,
        limits: RunLimits,
        shutdown: &'a CancellationToken,
        meter: Meter<'a>,
        started: Instant,
        renewal: Option<Renewal<'a>>,
        progress: &'a ProgressCell,
    ) -> Result<Engine<'a>, CleanupError> {
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
            cleanup,
            limits,
            shutdown,
            meter,
            started,
            lock_timeout: db::sql::duration_setting(cleanup.lock_timeout),
            statement_timeout: db::sql::duration_setting(cleanup.statement_timeout),
            committed_batches: 0,
            sizer: BatchSizer::new(cleanup.batch_size, cleanup.batch_time),
            renewal,
            progress,
            batch_durations: Vec::new(),
            retries: 0,
            pace_started: None,
            rows_changed: 0,
            last_renewal: Instant::now(),
            throttled_replica_lag: Duration::ZERO,
            throttled_rate: Duration::ZERO,
            stopped_while_waiting_for: None,
            team: None,
            lease_check: None,
        })
    }

    /// This engine as one of a run's workers: limits, rate cap and stop shared with `team`,
    /// each batch guarded by `lease_check` (the run renews the lease elsewhere).
    pub(super) fn in_team(mut self, team: &'a Team, lease_check: Option<LeaseCheck<'a>>) -> Self {
        self.team = Some(team);
        self.lease_check = lease_check;
        self
    }

    /// Continues a run whose tombstoning phase its workers did: their batches and rows count
    /// toward `--max-batches`, `max_run_time`'s first batch and the rate cap from here on.
    pub(super) fn carry_over(&mut self, team: &Team) {
        self.committed_batches += team.committed_batches();
        self.rows_changed += team.rows_changed();
        if let Some(started) = team.pace_started() {
            self.pace_started = Some(self.pace_started.map_or(started, |p| p.min(started)));
        }
    }

    /// Batches committed by this run so far (every worker's, in a team).
    fn committed(&self) -> u64 {
        self.team
            .map_or(self.committed_batches, Team::committed_batches)
    }

    /// Rows changed by this run so far (every worker's, in a team), for the rate cap.
    fn rows_so_far(&self) -> u64 {
        self.team.map_or(self.rows_changed, Team::rows_changed)
    }

    /// When the run's first batch began (the team's first, in a team), for the rate cap.
    fn pace_start(&self) -> Option<Instant> {
        match self.team {
            Some(team) => team.pace_started(),
            None => self.pace_started,
        }
    }

    /// Ends this worker for `reason`, or for the reason another worker stopped first.
    fn stop_reason(&self, reason: StopReason) -> StopReason {
        self.team.map_or(reason, |team| team.stop(reason))
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
            self.cleanup.statement_timeout,
            "preparing the batch statement",
            async {
                futures::try_join!(
                    self.conn.prepare(wait_sql, &BATCH_TYPES),
                    self.conn.prepare(skip_sql, &BATCH_TYPES),
                )
            },
        )
        .await?;
        let waits = self.cleanup.on_locked == OnLocked::Wait;
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
                let now = Instant::now();
                self.pace_started.get_or_insert(now);
                if let Some(team) = self.team {
                    team.pace_started.get_or_init(|| now);
                }
                let statement = if waits { &wait } else { &skip };
                let first = self.batch(phase, statement, bound, &pass).await?;
                let outcome = match first {
                    BatchResult::LockTimeout => {
                        result.lock_timeouts += 1;
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
                        result.lock_timeouts += 1;
                        result.left.add(pass.remaining());
                        break;
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

    fn record_progress(&self, phase: Phase, rows: &BatchRows) {
        self.progress.update(|p| {
            match phase {
                Phase::Tombstone => p.rows_tombstoned += rows.changed,
                Phase::Purge => p.tombstones_purged += rows.changed,
                Phase::OutboxRetention => p.outbox_events_deleted += rows.changed,
            }
            if rows.picked > 0 {
                p.batches += 1;
            }
        });
    }

    fn limit_reached(&self) -> Option<StopReason> {
        if let Some(reason) = self.team.and_then(Team::stopped) {
            // Another worker stopped: the run stops, for the same reason.
            Some(reason)
        } else if self.shutdown.is_cancelled() {
            Some(StopReason::Shutdown)
        } else if self
            .limits
            .max_batches
            .is_some_and(|max| self.committed() >= max)
        {
            Some(StopReason::MaxBatches)
        } else if self.committed() > 0 && self.started.elapsed() >= self.cleanup.max_run_time {
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
        if let (Some(per_second), Some(since)) =
            (self.cleanup.max_rows_per_second, self.pace_start())
        {
            let wait = throttle::rate_wait(self.rows_so_far(), per_second, since.elapsed());
            if !wait.is_zero() {
                let stop = self
                    .wait(ThrottleReason::Rate, wait, StopReason::MaxRunTime)
                    .await?;
                if stop.is_some() {
                    return Ok(stop);
                }
            }
        }
        let Some(limit) = self.cleanup.max_replica_lag else {
            return Ok(None);
        };
        let mut waiting_since: Option<Instant> = None;
        loop {
            let lag = self.read_replica_lag().await?;
            self.meter.replica_lag(&lag);
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
        let rows = super::bounded(self.cleanup.statement_timeout, STEP, async {
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
        let deadline = self.started + self.cleanup.max_run_time;
        let until = Instant::now() + wait;
        loop {
            let now = Instant::now();
            if self.shutdown.is_cancelled() {
                self.stopped_while_waiting_for = Some(reason);
                return Ok(Some(StopReason::Shutdown));
            }
            if now >= until {
                return Ok(None);
            }
            if let Some(stopped) = self.team.and_then(Team::stopped) {
                // Another worker stopped the run while this one waited.
                self.stopped_while_waiting_for = Some(reason);
                return Ok(Some(stopped));
            }
            if now >= deadline {
                self.stopped_while_waiting_for = Some(reason);
                return Ok(Some(at_deadline));
            }
            if let Some(stop) = self.renew_if_due().await? {
                self.stopped_while_waiting_for = Some(reason);
                return Ok(Some(stop));
            }
            let slice_end = until.min(deadline).min(now + MAX_WAIT_SLICE);
            tokio::select! {
                _ = tokio::time::sleep_until(slice_end.into()) => {}
                _ = self.shutdown.cancelled() => {}
            }
            let slept = now.elapsed();
            // The workers of a run wait side by side for the same reason: the metric counts the
            // run's waiting time, each worker its share of it.
            let workers = self.team.map_or(1, |team| team.workers);
            self.meter.throttled(reason, slept / workers);
            match reason {
                ThrottleReason::ReplicaLag => self.throttled_replica_lag += slept,
                ThrottleReason::Rate => self.throttled_rate += slept,
            }
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
        match renewal.lease.renew(&self.conn, self.cleanup).await {
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
        statement: &Ready,
        bound: Key,
        pass: &Pass,
    ) -> Result<BatchResult, CleanupError> {
        let mut attempt = 0;
        let size = self.sizer.next();
        loop {
            attempt += 1;
            let began = Instant::now();
            let result = self.transaction(statement, bound, pass, size).await;
            let took = began.elapsed();
            self.batch_durations.push(took);
            match result {
                Ok(rows) => {
                    self.sizer.committed(size, rows.picked, took);
                    self.committed_batches += 1;
                    self.rows_changed += rows.changed;
                    if let Some(team) = self.team {
                        team.committed_batches.fetch_add(1, Ordering::Relaxed);
                        team.rows_changed.fetch_add(rows.changed, Ordering::Relaxed);
                    }
                    if self.renewal.is_some() {
                        // The batch renewed the lease before its statement, in its transaction.
                        self.last_renewal = began;
                    }
                    self.record_progress(phase, &rows);
                    self.meter.batch("committed", took);
                    match phase {
                        Phase::Tombstone => self.meter.tombstoned(rows.changed),
                        Phase::Purge => self.meter.purged(rows.changed),
                        Phase::OutboxRetention => self.meter.outbox_deleted(rows.changed),
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
                        self.meter.db_error(e.sqlstate_class());
                        self.meter.batch("lock_timeout", took);
                        self.meter.lock_timeout();
                        self.progress.update(|p| p.lock_timeouts += 1);
                        tracing::info!(
                            ?phase,
                            lock_timeout = %self.lock_timeout,
                            "batch rolled back: a row stayed locked past lock_timeout"
                        );
                        return Ok(BatchResult::LockTimeout);
                    }
                    ErrorClass::LeaseLost => {
                        self.meter.batch("failed", took);
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
                        self.meter.db_error(e.sqlstate_class());
                        self.meter.batch("retried", took);
                        self.retries += 1;
                        tracing::warn!(?phase, attempt, error = %db::error_text(&e), "batch rolled back, retrying");
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
            db::deadline::beyond(self.cleanup.statement_timeout),
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

/// Feeds the metrics when the caller passed them.
#[derive(Clone, Copy)]
pub(super) struct Meter<'a>(pub(super) Option<&'a Metrics>);

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

    fn throttled(&self, reason: ThrottleReason, waited: Duration) {
        if let Some(m) = self.0 {
            m.cleanup_throttled_seconds
                .with_label_values(&[reason.label()])
                .inc_by(waited.as_secs_f64());
        }
    }

    fn replica_lag(&self, lag: &ReplicaLag) {
        if let Some(m) = self.0 {
            m.set_replica_lags(lag.standbys.iter().filter_map(|s| {
                s.lag_bytes
                    .map(|bytes| (s.application_name.as_str(), bytes))
            }));
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
        if let Some(m) = self.0 {
            m.cleanup_runs
                .with_label_values(&[RunOutcome::Failed.label()])
                .inc();
            m.cleanup_run_duration.observe(took.as_secs_f64());
            if let Some(class) = error.sqlstate_class() {
                m.db_error(class);
            }
        }
    }
}

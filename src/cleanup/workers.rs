//! Parallel tombstoning (`cleanup.workers = N > 1`): how one run splits its due rows into N
//! disjoint slices of the due deadline range ([`split_due`], statement [`sql::SPLIT_DUE`] and
//! the argument for it), runs one batch engine per slice on a session of its own, keeps the
//! lease renewed from the run's session while they work, and adds their figures up
//! ([`TeamResult`]).
//!
//! Why this cannot deadlock: every worker runs the unchanged batch statement, which locks its
//! rows in primary-key order, over a slice no other worker touches, so no worker ever waits for
//! another's row; replays and claims lock one row each. What a worker does with a row a replay
//! holds (wait up to `lock_timeout`, isolate it with `SKIP LOCKED`, retry it at the end of its
//! pass, or skip it) is exactly what a single run does.

use std::time::{Duration, Instant};

use chrono::TimeDelta;
use tokio_util::sync::CancellationToken;

use super::engine::{Engine, LeaseCheck, Meter, Phase, PhaseResult, RunLimits, Team};
use super::history::ProgressCell;
use super::keyset::{Key, KeyRange};
use super::lease::Lease;
use super::report::StopReason;
use super::throttle::ThrottleReason;
use super::{sql, CleanupError};
use crate::config::{CleanupConfig, DatabaseConfig};
use crate::db::{self, pipeline, Conn, ErrorClass};

/// The slices of the due deadline range `(-infinity, cutoff]` that [`sql::SPLIT_DUE`] gives for
/// `workers`, in order: the first from the beginning of the index, each next one from a
/// microsecond past the previous one's end (timestamps have microsecond resolution, so the
/// slices share no deadline), the last up to the cutoff. Fewer than `workers` slices when
/// nothing is due or many rows share a deadline.
pub(super) fn slices(cutoff: Key, bounds: &[Key]) -> Vec<KeyRange> {
    let mut ends: Vec<Key> = bounds.iter().copied().filter(|b| *b < cutoff).collect();
    ends.sort_unstable();
    ends.dedup();
    ends.push(cutoff);
    let mut from = None;
    let mut slices = Vec::with_capacity(ends.len());
    for to in ends {
        slices.push(KeyRange { from, to });
        match to.checked_add_signed(TimeDelta::microseconds(1)) {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    slices
}

/// The fractions 1/N .. (N-1)/N that [`sql::SPLIT_DUE`] takes.
fn fractions(workers: u32) -> Vec<f64> {
    (1..workers)
        .map(|i| f64::from(i) / f64::from(workers))
        .collect()
}

/// Splits the rows due at `cutoff` for `workers` ([`slices`]), reading them in a transaction of
/// its own (a dry run reads them in its snapshot: [`split_due_in`]).
pub(super) async fn split_due(
    conn: &Conn<'_>,
    cleanup: &CleanupConfig,
    cutoff: Key,
) -> Result<Vec<KeyRange>, CleanupError> {
    const STEP: &str = "splitting the due rows between the workers";
    let statement_timeout = db::sql::duration_setting(cleanup.statement_timeout);
    let fractions = fractions(cleanup.workers);
    let bounds: Option<Vec<Option<Key>>> = super::bounded(cleanup.statement_timeout, STEP, async {
        pipeline::query_one(
            conn,
            db::sql::SET_LOCAL_STATEMENT_TIMEOUT,
            &[&statement_timeout],
            sql::SPLIT_DUE,
            &[&cutoff, &fractions],
        )
        .await
        .map_err(|failure| failure.error)?
        .try_get(0)
    })
    .await?;
    let bounds: Vec<Key> = bounds.unwrap_or_default().into_iter().flatten().collect();
    Ok(slices(cutoff, &bounds))
}

/// [`split_due`] inside the caller's transaction (the dry run's snapshot).
pub(super) async fn split_due_in(
    conn: &Conn<'_>,
    workers: u32,
    cutoff: Key,
) -> Result<Vec<KeyRange>, tokio_postgres::Error> {
    let fractions = fractions(workers);
    let bounds: Option<Vec<Option<Key>>> = conn
        .query_one(sql::SPLIT_DUE, &[&cutoff, &fractions])
        .await?
        .try_get(0)?;
    let bounds: Vec<Key> = bounds.unwrap_or_default().into_iter().flatten().collect();
    Ok(slices(cutoff, &bounds))
}

/// What a worker's engine measured, taken out before its session closes.
struct Figures {
    batch_durations: Vec<Duration>,
    retries: u64,
    throttled_replica_lag: Duration,
    throttled_rate: Duration,
    stopped_while_waiting_for: Option<ThrottleReason>,
}

impl Figures {
    fn of(engine: Engine<'_>) -> Figures {
        Figures {
            batch_durations: engine.batch_durations,
            retries: engine.retries,
            throttled_replica_lag: engine.throttled_replica_lag,
            throttled_rate: engine.throttled_rate,
            stopped_while_waiting_for: engine.stopped_while_waiting_for,
        }
    }
}

/// The tombstoning phase of a run's workers, added up.
#[derive(Debug)]
pub(super) struct TeamResult {
    pub(super) phase: PhaseResult,
    pub(super) batch_durations: Vec<Duration>,
    pub(super) retries: u64,
    /// The longest any worker waited for the standbys (they wait side by side).
    pub(super) throttled_replica_lag: Duration,
    /// The longest any worker waited for the rate cap.
    pub(super) throttled_rate: Duration,
    pub(super) stopped_while_waiting_for: Option<ThrottleReason>,
    /// How many workers ran (one per slice: fewer than `cleanup.workers` when few rows are due).
    pub(super) workers: u32,
    /// Their shared counts, which the rest of the run goes on from ([`Engine::carry_over`]).
    pub(super) team: Team,
}

impl TeamResult {
    fn add(&mut self, phase: PhaseResult, engine: Figures) {
        let total = &mut self.phase;
        total.changed += phase.changed;
        total.batches += phase.batches;
        total.lock_timeouts += phase.lock_timeouts;
        total.rows_skipped += phase.rows_skipped;
        for range in phase.left.ranges() {
            total.left.add(*range);
        }
        // Every worker reports the team's first stop reason.
        total.stopped = total.stopped.or(phase.stopped);
        self.batch_durations.extend(engine.batch_durations);
        self.retries += engine.retries;
        self.throttled_replica_lag = self.throttled_replica_lag.max(engine.throttled_replica_lag);
        self.throttled_rate = self.throttled_rate.max(engine.throttled_rate);
        self.stopped_while_waiting_for = self
            .stopped_while_waiting_for
            .or(engine.stopped_while_waiting_for);
        self.workers += 1;
    }
}

/// What the workers of a run share: its settings, limits, clock and figures.
pub(super) struct Crew<'a> {
    pub(super) db: &'a DatabaseConfig,
    pub(super) cleanup: &'a CleanupConfig,
    pub(super) limits: RunLimits,
    pub(super) shutdown: &'a CancellationToken,
    pub(super) meter: Meter<'a>,
    pub(super) started: Instant,
    pub(super) progress: &'a ProgressCell,
    /// The lease the run holds, if it is leased: renewed on `conn`, checked by every batch.
    pub(super) lease: Option<&'a Lease>,
}

/// Tombstones the rows due at `cutoff` with `cleanup.workers` sessions at once, one slice of
/// the due deadlines each, while `conn` (the run's session) renews the lease a third of its
/// length apart. Returns when every worker has stopped; the first reason that stops one stops
/// all (shutdown and `max_run_time` reach each of them anyway). A worker that fails fails the
/// run: the others are dropped with their sessions, and the server rolls their batches in
/// flight back.
pub(super) async fn tombstone(
    crew: &Crew<'_>,
    conn: &Conn<'_>,
    cutoff: Key,
) -> Result<TeamResult, CleanupError> {
    let slices = split_due(conn, crew.cleanup, cutoff).await?;
    let count = u32::try_from(slices.len()).unwrap_or(u32::MAX);
    tracing::debug!(workers = count, ?slices, "cleanup workers start");
    let team = Team::new(count);
    let done = CancellationToken::new();
    let (results, renewals) = {
        let workers = slices
            .into_iter()
            .map(|slice| Box::pin(worker(crew, cutoff, slice, &team)));
        // Boxed: a worker's future (its engine's, with its session) is large, and N of them
        // side by side on the stack would overflow a small thread stack.
        let all = futures::future::try_join_all(workers);
        // Joined, not raced: a renewal in flight when the workers end finishes its transaction
        // before the run's session is used again.
        tokio::join!(
            async {
                let results = all.await;
                done.cancel();
                results
            },
            keep_lease(crew, conn, &team, &done),
        )
    };
    let results = results?;
    renewals?;
    let mut total = TeamResult {
        phase: PhaseResult::default(),
        batch_durations: Vec::new(),
        retries: 0,
        throttled_replica_lag: Duration::ZERO,
        throttled_rate: Duration::ZERO,
        stopped_while_waiting_for: None,
        workers: 0,
        team,
    };
    for (phase, figures) in results {
        total.add(phase, figures);
    }
    Ok(total)
}

/// One worker: its own session, its own engine, its slice.
async fn worker<'a>(
    crew: &'a Crew<'a>,
    cutoff: Key,
    slice: KeyRange,
    team: &'a Team,
) -> Result<(PhaseResult, Figures), CleanupError> {
    let session = db::connect(crew.db, "cleanup")
        .await
        .map_err(CleanupError::Connect)?;
    // The engine borrows the session; both live in this future until the worker ends, and the
    // engine's figures are taken out before the session closes.
    let conn = session.conn();
    let check = match crew.lease {
        Some(lease) => Some(LeaseCheck {
            lease,
            statement: lease.prepare_check(&conn, crew.cleanup).await?,
        }),
        None => None,
    };
    let mut engine = Engine::new(
        conn,
        crew.cleanup,
        crew.limits,
        crew.shutdown,
        crew.meter,
        crew.started,
        None,
        crew.progress,
    )
    .await?
    .in_team(team, check);
    let phase = engine.phase_over(Phase::Tombstone, cutoff, slice).await?;
    Ok((phase, Figures::of(engine)))
}

/// Renews the lease on the run's session a third of its length apart until `done` (the one
/// place it is renewed while the workers run). A lease found lost stops the team (`lease_lost`,
/// each worker at its next batch, whose check fails too); a renewal that fails otherwise stops
/// the team too, and fails the run once the workers have stopped.
async fn keep_lease(
    crew: &Crew<'_>,
    conn: &Conn<'_>,
    team: &Team,
    done: &CancellationToken,
) -> Result<(), CleanupError> {
    let Some(lease) = crew.lease else {
        return Ok(());
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(lease.ttl() / 3) => {}
            () = done.cancelled() => return Ok(()),
        }
        match lease.renew(conn, crew.cleanup).await {
            Ok(()) => {}
            Err(e) if e.class() == ErrorClass::LeaseLost => {
                tracing::warn!(
                    "another run holds the cleanup lease now (this run's had expired); stopping"
                );
                team.stop(StopReason::LeaseLost);
                return Ok(());
            }
            Err(e) => {
                team.stop(StopReason::LeaseLost);
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::DateTime;

    fn at(s: i64) -> Key {
        DateTime::from_timestamp(s, 0).unwrap()
    }

    #[test]
    fn slices_are_disjoint_and_cover_everything_up_to_the_cutoff() {
        let us = TimeDelta::microseconds(1);
        let got = slices(at(100), &[at(10), at(50)]);
        assert_eq!(
            got,
            vec![
                KeyRange {
                    from: None,
                    to: at(10)
                },
                KeyRange {
                    from: Some(at(10) + us),
                    to: at(50)
                },
                KeyRange {
                    from: Some(at(50) + us),
                    to: at(100)
                },
            ]
        );
    }

    #[test]
    fn shared_deadlines_and_an_empty_table_give_fewer_slices() {
        let one = vec![KeyRange {
            from: None,
            to: at(100),
        }];
        assert_eq!(slices(at(100), &[]), one);
        assert_eq!(slices(at(100), &[at(100), at(100)]), one);
        assert_eq!(slices(at(100), &[at(7), at(7), at(7)]).len(), 2);
    }

    #[test]
    fn fractions_split_evenly() {
        assert_eq!(fractions(1), Vec::<f64>::new());
        assert_eq!(fractions(4), vec![0.25, 0.5, 0.75]);
    }
}

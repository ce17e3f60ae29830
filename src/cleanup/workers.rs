//! Parallel tombstoning (`cleanup.workers = N > 1`): how one run splits its due rows into N
//! disjoint slices of the due deadline range ([`split_due`], statement [`sql::SPLIT_DUE`] and
//! the argument for it), runs one batch engine per slice on a session of its own, and keeps the
//! lease renewed from the run's session while they work. Each worker's engine adds its figures to
//! the run's and keeps to the run's pace ([`super::context`]); what is left here is where each
//! stopped ([`TeamResult`]).
//!
//! Why this cannot deadlock: every worker runs the unchanged batch statement, which locks its
//! rows in primary-key order, over a slice no other worker touches, so no worker ever waits for
//! another's row; replays and claims lock one row each. What a worker does with a row a replay
//! holds (wait up to `lock_timeout`, isolate it with `SKIP LOCKED`, retry it at the end of its
//! pass, or skip it) is exactly what a single run does.

use chrono::TimeDelta;
use tokio_util::sync::CancellationToken;

use super::context::RunContext;
use super::engine::{Engine, LeaseCheck, Phase, PhaseResult};
use super::keyset::{Key, KeyRange};
use super::lease::Lease;
use super::report::StopReason;
use super::{sql, CleanupError};
use crate::config::CleanupConfig;
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

/// Where the workers of a run's tombstoning phase stopped.
#[derive(Debug)]
pub(super) struct TeamResult {
    /// The first reason that stopped one (every worker reports it), and every range a worker
    /// left.
    pub(super) phase: PhaseResult,
    /// How many workers ran (one per slice: fewer than `cleanup.workers` when few rows are due).
    pub(super) workers: u32,
}

/// Tombstones the rows due at `cutoff` with `cleanup.workers` sessions at once, one slice of
/// the due deadlines each, while `conn` (the run's session) renews the lease a third of its
/// length apart. Returns when every worker has stopped; the first reason that stops one stops
/// all (shutdown and `max_run_time` reach each of them anyway). A worker that fails fails the
/// run: the others are dropped with their sessions, and the server rolls their batches in
/// flight back.
pub(super) async fn tombstone(
    run: &RunContext<'_>,
    lease: Option<&Lease>,
    conn: &Conn<'_>,
    cutoff: Key,
) -> Result<TeamResult, CleanupError> {
    let slices = split_due(conn, run.cleanup, cutoff).await?;
    let count = u32::try_from(slices.len()).unwrap_or(u32::MAX);
    tracing::debug!(workers = count, ?slices, "cleanup workers start");
    let done = CancellationToken::new();
    let (results, renewals) = {
        let workers = slices
            .into_iter()
            .map(|slice| Box::pin(worker(run, lease, count, cutoff, slice)));
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
            keep_lease(run, lease, conn, &done),
        )
    };
    let results = results?;
    renewals?;
    let mut total = TeamResult {
        phase: PhaseResult::default(),
        workers: 0,
    };
    for phase in results {
        for range in phase.left.ranges() {
            total.phase.left.add(*range);
        }
        // Every worker reports the run's first stop reason.
        total.phase.stopped = total.phase.stopped.or(phase.stopped);
        total.workers += 1;
    }
    Ok(total)
}

/// One worker of `workers`: its own session, its own engine, its slice.
async fn worker<'a>(
    run: &'a RunContext<'a>,
    lease: Option<&'a Lease>,
    workers: u32,
    cutoff: Key,
    slice: KeyRange,
) -> Result<PhaseResult, CleanupError> {
    let session = db::connect(run.db, "cleanup")
        .await
        .map_err(CleanupError::Connect)?;
    // The engine borrows the session; both live in this future until the worker ends.
    let conn = session.conn();
    let check = match lease {
        Some(lease) => Some(LeaseCheck {
            lease,
            statement: lease.prepare_check(&conn, run.cleanup).await?,
        }),
        None => None,
    };
    let mut engine = Engine::new(conn, run, None)
        .await?
        .working_beside(workers, check);
    engine.phase_over(Phase::Tombstone, cutoff, slice).await
}

/// Renews the lease on the run's session a third of its length apart until `done` (the one
/// place it is renewed while the workers run). A lease found lost stops the run (`lease_lost`,
/// each worker at its next batch, whose check fails too); a renewal that fails otherwise stops
/// it too, and fails the run once the workers have stopped.
async fn keep_lease(
    run: &RunContext<'_>,
    lease: Option<&Lease>,
    conn: &Conn<'_>,
    done: &CancellationToken,
) -> Result<(), CleanupError> {
    let Some(lease) = lease else {
        return Ok(());
    };
    loop {
        tokio::select! {
            () = tokio::time::sleep(lease.ttl() / 3) => {}
            () = done.cancelled() => return Ok(()),
        }
        match lease.renew(conn, run.cleanup).await {
            Ok(()) => {}
            Err(e) if e.class() == ErrorClass::LeaseLost => {
                tracing::warn!(
                    "another run holds the cleanup lease now (this run's had expired); stopping"
                );
                run.pace.stop(StopReason::LeaseLost);
                return Ok(());
            }
            Err(e) => {
                run.pace.stop(StopReason::LeaseLost);
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

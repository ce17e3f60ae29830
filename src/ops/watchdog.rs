//! The watchdog's policy: when the daemon still vouches for itself to systemd (`WATCHDOG=1`,
//! sent by [`super::systemd::Notifier::spawn_watchdog`]). Healthy means the cleanup scheduler's
//! loop is alive — beating while it waits, or running within the run's own bounds — and the
//! database has answered a readiness check within a tolerance derived from `WatchdogSec=`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::Config;
use crate::ops::readiness::ReadinessProbe;
use crate::scheduler::{SchedulerState, SchedulerStatus};

/// How many watchdog timeouts (`WatchdogSec=`) the database may stay unreachable before the
/// watchdog stops vouching for us, so that systemd restarts the daemon (which re-resolves and
/// reconnects from scratch). With the shipped `WatchdogSec=30s`: 5 minutes.
///
/// Derived from `WatchdogSec=` rather than fixed, because that setting is where the operator says
/// how long the service may fail to do its job before systemd steps in; a database outage is the
/// same question asked with more patience: a restart cannot mend the database, and while the
/// restarted daemon waits for it (exit 69, `Restart=on-failure`) the API answers nothing instead
/// of 503 with `Retry-After`. Short outages — a restart, a fail-over — are ridden out.
const DATABASE_OUTAGE_WATCHDOG_TIMEOUTS: u32 = 10;
/// The least database outage tolerance, so that a very short `WatchdogSec=` never mistakes a
/// readiness check's own latency (bounded at 2 s, cached for 1 s) for an outage.
const MIN_DATABASE_OUTAGE_TOLERANCE: Duration = Duration::from_secs(10);
/// How long the scheduler loop may go without a heartbeat while it waits for a fire time.
const SCHEDULER_STALL: Duration = Duration::from_secs(10);
/// Slack on top of a run's own bounds before a run counts as stuck.
const RUN_SLACK: Duration = Duration::from_secs(60);

/// The database outage the watchdog rides out before it withholds its pings: see
/// [`DATABASE_OUTAGE_WATCHDOG_TIMEOUTS`].
fn database_outage_tolerance(watchdog_timeout: Duration) -> Duration {
    (watchdog_timeout * DATABASE_OUTAGE_WATCHDOG_TIMEOUTS).max(MIN_DATABASE_OUTAGE_TOLERANCE)
}

/// Why the watchdog withholds its ping.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Unhealthy {
    /// The scheduler loop has ended.
    #[error("the cleanup scheduler has stopped")]
    SchedulerStopped,
    /// The scheduler loop stopped beating while it waited for a fire time.
    #[error("the cleanup scheduler loop has not reported for {:.1} s", .0.as_secs_f64())]
    SchedulerStalled(Duration),
    /// A run has gone on longer than its own bounds allow.
    #[error(
        "the cleanup run has gone on for {:.0} s, past its bound of {:.0} s",
        .elapsed.as_secs_f64(),
        .bound.as_secs_f64()
    )]
    RunStuck {
        /// How long it has been running.
        elapsed: Duration,
        /// [`run_bound`].
        bound: Duration,
    },
    /// No readiness check has succeeded for longer than the tolerance.
    #[error(
        "the database has not answered a readiness check for {:.1} s (tolerance {:.0} s)",
        .silent.as_secs_f64(),
        .tolerance.as_secs_f64()
    )]
    DatabaseOutage {
        /// Since the last successful check (or the start).
        silent: Duration,
        /// [`database_outage_tolerance`].
        tolerance: Duration,
    },
}

/// What the watchdog saw of the scheduler loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoopSeen {
    /// Waiting for a fire time (or paused), last heartbeat this long ago.
    Waiting { since_beat: Duration },
    /// A run in progress for this long.
    Running { elapsed: Duration },
    /// The loop has ended.
    Stopped,
}

/// The longest a run may take when nothing is wrong: `max_run_time` is checked between
/// batches, so on top of it come the run's connection (and a second one to record a run whose
/// connection was lost), the pause before the check, and a few statements that may each take
/// `statement_timeout` — the lease take, the batch in flight (twice when it times out on a lock
/// and is re-run with SKIP LOCKED), the backlog count and the statement that records the run and
/// releases the lease.
fn run_bound(config: &Config) -> Duration {
    let c = &config.cleanup;
    c.max_run_time
        + c.pause_between_batches
        + c.statement_timeout * 4
        + config.database.connect_timeout * 2
        + RUN_SLACK
}

/// The watchdog's decision, from what it saw: the scheduler loop alive (beating while it waits,
/// or running within [`run_bound`]) and the database answering readiness checks within the
/// tolerance.
fn watchdog_verdict(
    seen: LoopSeen,
    config: &Config,
    database_silent: Duration,
    database_tolerance: Duration,
) -> Result<(), Unhealthy> {
    match seen {
        LoopSeen::Stopped => return Err(Unhealthy::SchedulerStopped),
        LoopSeen::Waiting { since_beat } if since_beat >= SCHEDULER_STALL => {
            return Err(Unhealthy::SchedulerStalled(since_beat))
        }
        LoopSeen::Running { elapsed } if elapsed >= run_bound(config) => {
            return Err(Unhealthy::RunStuck {
                elapsed,
                bound: run_bound(config),
            })
        }
        LoopSeen::Waiting { .. } | LoopSeen::Running { .. } => {}
    }
    if database_silent >= database_tolerance {
        return Err(Unhealthy::DatabaseOutage {
            silent: database_silent,
            tolerance: database_tolerance,
        });
    }
    Ok(())
}

/// Times the run in progress on the monotonic clock. The scheduler's heartbeat keeps beating
/// while a run is stuck (it beats from the loop that awaits the run), and the run's fire time
/// is wall-clock time, which can jump; so a run is timed from the moment the watchdog first
/// sees it (at most one ping interval late).
#[derive(Debug, Default)]
struct RunClock {
    /// The fire time of the run being timed, and when the watchdog first saw it.
    current: Option<(chrono::DateTime<chrono::Utc>, Instant)>,
}

impl RunClock {
    /// What the loop is doing, as of `now`.
    fn observe(&mut self, state: SchedulerState, heartbeat: Instant, now: Instant) -> LoopSeen {
        match state {
            SchedulerState::Running { started } => {
                let seen_at = match self.current {
                    Some((fired, seen_at)) if fired == started => seen_at,
                    _ => {
                        self.current = Some((started, now));
                        now
                    }
                };
                LoopSeen::Running {
                    elapsed: now.saturating_duration_since(seen_at),
                }
            }
            SchedulerState::Idle | SchedulerState::Paused => {
                self.current = None;
                LoopSeen::Waiting {
                    since_beat: now.saturating_duration_since(heartbeat),
                }
            }
            SchedulerState::Stopped => {
                self.current = None;
                LoopSeen::Stopped
            }
        }
    }
}

/// The watchdog's health function: cheap and synchronous (a `watch` borrow, a cached probe
/// time), called once per ping interval.
pub struct WatchdogHealth {
    status: watch::Receiver<SchedulerStatus>,
    readiness: Arc<ReadinessProbe>,
    config: watch::Receiver<Arc<Config>>,
    database_outage_tolerance: Duration,
    /// When the daemon started: the database counts as silent since then until a check passes.
    started: Instant,
    run: Mutex<RunClock>,
    /// The last failure, so that each change of reason is logged once.
    failing: Mutex<Option<Unhealthy>>,
}

impl WatchdogHealth {
    /// A health function for a watchdog of `watchdog_timeout` (`WatchdogSec=`), reading the
    /// scheduler's `status`, the `readiness` probe's last success and the running `config`.
    pub fn new(
        status: watch::Receiver<SchedulerStatus>,
        readiness: Arc<ReadinessProbe>,
        config: watch::Receiver<Arc<Config>>,
        watchdog_timeout: Duration,
    ) -> Self {
        WatchdogHealth {
            status,
            readiness,
            config,
            database_outage_tolerance: database_outage_tolerance(watchdog_timeout),
            started: Instant::now(),
            run: Mutex::new(RunClock::default()),
            failing: Mutex::new(None),
        }
    }

    /// Whether the daemon is healthy now; logs each new reason it is not, once.
    pub fn check(&self) -> bool {
        let now = Instant::now();
        let (state, heartbeat) = {
            let status = self.status.borrow();
            (status.state, status.heartbeat)
        };
        let seen = self
            .run
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .observe(state, heartbeat, now);
        let config = self.config.borrow().clone();
        let database_silent = self
            .readiness
            .last_ready_age()
            .unwrap_or_else(|| now.saturating_duration_since(self.started));
        let verdict = watchdog_verdict(
            seen,
            &config,
            database_silent,
            self.database_outage_tolerance,
        );
        let mut failing = self
            .failing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &verdict {
            Err(reason) => {
                let new_kind = failing.as_ref().is_none_or(|old| {
                    std::mem::discriminant(old) != std::mem::discriminant(reason)
                });
                if new_kind {
                    tracing::warn!(%reason, "unhealthy: the watchdog stops vouching for the daemon");
                }
                *failing = Some(reason.clone());
            }
            Ok(()) => *failing = None,
        }
        verdict.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        // Shipped defaults: max_run_time 4m, statement_timeout 30s, connect_timeout 5s, no pause.
        Config::default()
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn database_outage_tolerance_is_ten_watchdog_timeouts_but_never_under_ten_seconds() {
        // The shipped unit: WatchdogSec=30s.
        assert_eq!(
            database_outage_tolerance(30 * SECOND),
            Duration::from_secs(300)
        );
        assert_eq!(database_outage_tolerance(2 * SECOND), 20 * SECOND);
        assert_eq!(
            database_outage_tolerance(Duration::from_millis(100)),
            MIN_DATABASE_OUTAGE_TOLERANCE
        );
    }

    #[test]
    fn a_waiting_loop_is_healthy_while_it_beats_and_the_database_answers() {
        let c = config();
        let tolerance = 300 * SECOND;
        let waiting = LoopSeen::Waiting { since_beat: SECOND };
        assert_eq!(watchdog_verdict(waiting, &c, 5 * SECOND, tolerance), Ok(()));
        // A database outage shorter than the tolerance is ridden out.
        assert_eq!(
            watchdog_verdict(waiting, &c, 299 * SECOND, tolerance),
            Ok(())
        );
        assert_eq!(
            watchdog_verdict(waiting, &c, 300 * SECOND, tolerance),
            Err(Unhealthy::DatabaseOutage {
                silent: 300 * SECOND,
                tolerance
            })
        );
    }

    #[test]
    fn a_loop_that_stops_beating_or_has_ended_is_unhealthy() {
        let c = config();
        let stalled = LoopSeen::Waiting {
            since_beat: SCHEDULER_STALL,
        };
        assert_eq!(
            watchdog_verdict(stalled, &c, SECOND, 300 * SECOND),
            Err(Unhealthy::SchedulerStalled(SCHEDULER_STALL))
        );
        assert_eq!(
            watchdog_verdict(LoopSeen::Stopped, &c, SECOND, 300 * SECOND),
            Err(Unhealthy::SchedulerStopped)
        );
    }

    #[test]
    fn a_run_is_healthy_within_its_bounds_and_stuck_beyond_them() {
        let c = config();
        // 4m + 0s pause + 4 x 30s + 2 x 5s + 60s
        let bound = Duration::from_secs(240 + 120 + 10 + 60);
        assert_eq!(run_bound(&c), bound);
        let within = LoopSeen::Running {
            elapsed: bound - SECOND,
        };
        assert_eq!(watchdog_verdict(within, &c, SECOND, 300 * SECOND), Ok(()));
        let beyond = LoopSeen::Running { elapsed: bound };
        assert_eq!(
            watchdog_verdict(beyond, &c, SECOND, 300 * SECOND),
            Err(Unhealthy::RunStuck {
                elapsed: bound,
                bound
            })
        );
    }

    #[test]
    fn reasons_read_in_seconds() {
        let outage = Unhealthy::DatabaseOutage {
            silent: Duration::from_millis(10_234),
            tolerance: 10 * SECOND,
        };
        assert_eq!(
            outage.to_string(),
            "the database has not answered a readiness check for 10.2 s (tolerance 10 s)"
        );
    }

    #[test]
    fn runs_are_timed_from_when_the_watchdog_first_sees_them_on_the_monotonic_clock() {
        let mut clock = RunClock::default();
        let t0 = Instant::now();
        let fired = chrono::DateTime::<chrono::Utc>::from_timestamp(1_700_000_000, 0).unwrap();
        let running = SchedulerState::Running { started: fired };
        // The heartbeat is irrelevant while running: it beats even when the run is stuck.
        assert_eq!(
            clock.observe(running, t0, t0),
            LoopSeen::Running {
                elapsed: Duration::ZERO
            }
        );
        assert_eq!(
            clock.observe(running, t0 + 600 * SECOND, t0 + 600 * SECOND),
            LoopSeen::Running {
                elapsed: 600 * SECOND
            }
        );
        // The next run (another fire time) starts a new clock, even without an idle look between.
        let next = SchedulerState::Running {
            started: fired + chrono::TimeDelta::seconds(300),
        };
        assert_eq!(
            clock.observe(next, t0, t0 + 601 * SECOND),
            LoopSeen::Running {
                elapsed: Duration::ZERO
            }
        );
        assert_eq!(
            clock.observe(SchedulerState::Idle, t0 + 601 * SECOND, t0 + 603 * SECOND),
            LoopSeen::Waiting {
                since_beat: 2 * SECOND
            }
        );
        assert_eq!(
            clock.observe(running, t0, t0 + 700 * SECOND),
            LoopSeen::Running {
                elapsed: Duration::ZERO
            }
        );
    }
}

//! When cleanup runs happen inside `serve`: fire on `cleanup.schedule`, never overlap, coalesce
//! fire times missed during a long run into one catch-up run, take the single-runner lease for
//! each run, survive database outages, and publish a [`SchedulerStatus`] (for systemd's
//! `STATUS=` and watchdog) and the scheduling metrics.
//!
//! One pass is [`cleanup::run_once`]; this module only decides *when*, the way River separates
//! its maintenance services' loops from their `runOnce`.
//!
//! Configuration reloads arrive on a `watch` channel: a new schedule takes effect for the next
//! fire time, batch size and timeouts for the next run, and `cleanup.enabled = false` pauses
//! scheduling (a run in progress finishes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::cleanup::{self, LeasedRun, Meter, RunLimits, RunOutcome, RunReport};
use crate::config::{Config, DatabaseConfig};
use crate::metrics::Metrics;
use crate::schedule::Schedule;

/// How often the loop proves it is alive ([`SchedulerStatus::heartbeat`]), idle or running.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// Fire times counted at most per coalescing (a schedule of every second across a day-long
/// outage would otherwise be walked one fire at a time).
const MAX_MISSED_FIRES_COUNTED: u64 = 10_000;

/// What the scheduler is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchedulerState {
    /// Waiting for the next fire time.
    Idle,
    /// A run (lease, cleanup pass) is in progress since `started`.
    Running {
        /// When this run was fired.
        started: DateTime<Utc>,
    },
    /// `cleanup.enabled = false`: no runs until a reload enables it.
    Paused,
    /// The loop has ended (shutdown).
    Stopped,
}

/// The outcome of the last fire.
#[derive(Debug, Clone)]
pub struct LastRun {
    /// When it was fired.
    pub started: DateTime<Utc>,
    /// When it ended.
    pub finished: DateTime<Utc>,
    /// `success`, `partial`, `failed` or `skipped_lease`.
    pub outcome: RunOutcome,
    /// The run's report (success or partial).
    pub report: Option<RunReport>,
    /// Why it failed, one line, no secrets.
    pub error: Option<String>,
}

/// The scheduler's state, published on a `watch` channel ([`Scheduler::status`]).
#[derive(Debug, Clone)]
pub struct SchedulerStatus {
    /// Last time the loop showed it was alive; refreshed every [`HEARTBEAT_INTERVAL`] while idle
    /// and while a run is in progress. Heartbeat-only refreshes do not wake `changed()`
    /// listeners; read it with `borrow()` on the watchdog's own interval.
    pub heartbeat: Instant,
    /// What the scheduler is doing.
    pub state: SchedulerState,
    /// The next fire time (`None` while paused or stopped).
    pub next_fire: Option<DateTime<Utc>>,
    /// The last fire's outcome.
    pub last_run: Option<LastRun>,
    /// When the last run ended with `success` or `partial`.
    pub last_success: Option<DateTime<Utc>>,
    /// Whether the database answered at the last fire (`None` before the first).
    pub database_reachable: Option<bool>,
    /// Fires handled since start (runs, lease skips and failures).
    pub fires: u64,
    /// Fire times that passed during a run and were merged into one catch-up run.
    pub fires_coalesced: u64,
}

impl SchedulerStatus {
    fn new(next_fire: Option<DateTime<Utc>>, paused: bool) -> Self {
        Self {
            heartbeat: Instant::now(),
            state: if paused {
                SchedulerState::Paused
            } else {
                SchedulerState::Idle
            },
            next_fire,
            last_run: None,
            last_success: None,
            database_reachable: None,
            fires: 0,
            fires_coalesced: 0,
        }
    }

    /// One line for systemd's `STATUS=`: the last run's figures and the next fire time.
    pub fn summary(&self) -> String {
        let state = match self.state {
            SchedulerState::Idle => "cleanup idle".to_owned(),
            SchedulerState::Running { started } => {
                format!("cleanup running since {}", started.format("%H:%M:%SZ"))
            }
            SchedulerState::Paused => "cleanup paused (cleanup.enabled = false)".to_owned(),
            SchedulerState::Stopped => "cleanup stopped".to_owned(),
        };
        let last = match &self.last_run {
            None => "no run yet".to_owned(),
            Some(run) => {
                let at = run.finished.format("%H:%M:%SZ");
                match (&run.report, &run.error) {
                    (Some(r), _) => format!(
                        "last run {at} {}: {} tombstoned, {} lock timeouts, backlog {}, {:.1}s",
                        run.outcome.label(),
                        r.rows_tombstoned,
                        r.lock_timeouts,
                        r.backlog_rows,
                        r.duration.as_secs_f64()
                    ),
                    (None, Some(e)) => format!("last run {at} {}: {e}", run.outcome.label()),
                    (None, None) => format!("last run {at} {}", run.outcome.label()),
                }
            }
        };
        match self.next_fire {
            Some(next) => format!("{state}; {last}; next {}", next.format("%H:%M:%SZ")),
            None => format!("{state}; {last}"),
        }
    }
}

/// The cleanup scheduler. Build it with [`Scheduler::new`], keep a [`Scheduler::status`]
/// receiver, and spawn [`Scheduler::run`].
pub struct Scheduler {
    db: DatabaseConfig,
    settings: watch::Receiver<Arc<Config>>,
    metrics: Arc<Metrics>,
    status: watch::Sender<SchedulerStatus>,
}

impl Scheduler {
    /// A scheduler connecting with `db`, reading `cleanup` and `retention` settings from the
    /// latest value of `settings` (send a new `Arc<Config>` on SIGHUP), and feeding `metrics`.
    pub fn new(
        db: DatabaseConfig,
        settings: watch::Receiver<Arc<Config>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let config = settings.borrow().clone();
        let next = next_fire(&config, Utc::now());
        let (status, _) = watch::channel(SchedulerStatus::new(next, !config.cleanup.enabled));
        Self {
            db,
            settings,
            metrics,
            status,
        }
    }

    /// The scheduler's status; `changed()` fires on every state change (not on heartbeats).
    pub fn status(&self) -> watch::Receiver<SchedulerStatus> {
        self.status.subscribe()
    }

    /// Runs until `shutdown` is cancelled; a run in progress stops after its current batch.
    /// Never fails: a database outage is logged, counted (`cleanup_runs_total{outcome="failed"}`,
    /// `db_errors_total`) and retried at the next fire time.
    pub async fn run(self, shutdown: CancellationToken) {
        let Scheduler {
            db,
            mut settings,
            metrics,
            status,
        } = self;
        let mut settings_open = true;
        let mut config = settings.borrow_and_update().clone();
        let mut next = next_fire(&config, Utc::now());
        tracing::info!(schedule = %config.cleanup.schedule, enabled = config.cleanup.enabled, "cleanup scheduler started");
        loop {
            publish_waiting(&status, &metrics, next);
            // Wait for the fire time, proving liveness every heartbeat and taking reloads.
            let fired_at = loop {
                beat(&status);
                let now = Utc::now();
                if let Some(at) = next.filter(|at| *at <= now) {
                    break at;
                }
                let wait = next
                    .and_then(|at| (at - now).to_std().ok())
                    .map_or(HEARTBEAT_INTERVAL, |d| d.min(HEARTBEAT_INTERVAL));
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => {
                        stop(&status, &metrics);
                        return;
                    }
                    changed = settings.changed(), if settings_open => {
                        if changed.is_err() {
                            // The sender is gone: keep the last settings for good.
                            settings_open = false;
                            continue;
                        }
                        let new = settings.borrow_and_update().clone();
                        if new.cleanup.schedule != config.cleanup.schedule
                            || new.cleanup.enabled != config.cleanup.enabled
                        {
                            next = next_fire(&new, Utc::now());
                            tracing::info!(schedule = %new.cleanup.schedule, enabled = new.cleanup.enabled, "cleanup schedule reloaded");
                        }
                        config = new;
                        publish_waiting(&status, &metrics, next);
                    }
                    _ = tokio::time::sleep(wait) => {}
                }
            };

            status.send_modify(|s| {
                s.state = SchedulerState::Running { started: fired_at };
                s.heartbeat = Instant::now();
            });
            let last = {
                let run = fire(&db, &config, &metrics, &shutdown);
                tokio::pin!(run);
                let mut heartbeat = tokio::time::interval(HEARTBEAT_INTERVAL);
                loop {
                    tokio::select! {
                        last = &mut run => break last,
                        _ = heartbeat.tick() => beat(&status),
                    }
                }
            };
            let reachable = last.database_reachable;
            status.send_modify(|s| {
                s.heartbeat = Instant::now();
                s.fires += 1;
                s.database_reachable = Some(reachable);
                if matches!(last.outcome, RunOutcome::Success | RunOutcome::Partial) {
                    s.last_success = Some(last.finished);
                }
                s.last_run = Some(last.record);
            });
            if shutdown.is_cancelled() {
                stop(&status, &metrics);
                return;
            }

            if settings_open && settings.has_changed().unwrap_or(false) {
                config = settings.borrow_and_update().clone();
            }
            let now = Utc::now();
            let missed = missed_fires(&config.cleanup.schedule, fired_at, now);
            if missed > 0 && config.cleanup.enabled {
                // Fire times that passed while the run went on: ONE catch-up run, right away.
                Meter::new(Some(&metrics)).fires_coalesced(missed);
                status.send_modify(|s| s.fires_coalesced += missed);
                tracing::info!(
                    missed,
                    "fire times passed during the run; coalesced into one catch-up run"
                );
                next = Some(now);
            } else {
                next = next_fire(&config, now);
            }
        }
    }
}

/// The next fire time after `now`, or `None` while cleanup is disabled.
fn next_fire(config: &Config, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    if config.cleanup.enabled {
        config.cleanup.schedule.next_after(now)
    } else {
        None
    }
}

/// Fire times `t` with `fired_at < t <= now` (capped).
pub fn missed_fires(schedule: &Schedule, fired_at: DateTime<Utc>, now: DateTime<Utc>) -> u64 {
    let mut missed = 0;
    let mut cursor = fired_at;
    while missed < MAX_MISSED_FIRES_COUNTED {
        match schedule.next_after(cursor) {
            Some(t) if t <= now => {
                missed += 1;
                cursor = t;
            }
            _ => break,
        }
    }
    missed
}

/// The heartbeat, without waking `changed()` listeners.
fn beat(status: &watch::Sender<SchedulerStatus>) {
    status.send_if_modified(|s| {
        s.heartbeat = Instant::now();
        false
    });
}

fn publish_waiting(
    status: &watch::Sender<SchedulerStatus>,
    metrics: &Metrics,
    next: Option<DateTime<Utc>>,
) {
    Meter::new(Some(metrics)).next_run(next);
    status.send_modify(|s| {
        s.heartbeat = Instant::now();
        s.next_fire = next;
        s.state = if next.is_some() {
            SchedulerState::Idle
        } else {
            SchedulerState::Paused
        };
    });
}

fn stop(status: &watch::Sender<SchedulerStatus>, metrics: &Metrics) {
    Meter::new(Some(metrics)).next_run(None);
    status.send_modify(|s| {
        s.state = SchedulerState::Stopped;
        s.next_fire = None;
    });
    tracing::info!("cleanup scheduler stopped");
}

struct Fired {
    record: LastRun,
    outcome: RunOutcome,
    finished: DateTime<Utc>,
    database_reachable: bool,
}

/// One fire: take the lease, run one pass, release the lease. Every outcome is counted here or
/// by `run_once`; nothing is returned as an error.
async fn fire(
    db: &DatabaseConfig,
    config: &Config,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Fired {
    let started = Utc::now();
    let done = |outcome: RunOutcome,
                report: Option<RunReport>,
                error: Option<String>,
                database_reachable: bool| {
        let finished = Utc::now();
        Fired {
            record: LastRun {
                started,
                finished,
                outcome,
                report,
                error,
            },
            outcome,
            finished,
            database_reachable,
        }
    };
    // On a standby or a read-only database every batch would fail with 25006: skip, say why.
    match cleanup::server_refuses_writes(db, &config.cleanup).await {
        Ok(None) => {}
        Ok(Some(reason)) => {
            Meter::new(Some(metrics)).skipped_read_only();
            tracing::warn!(reason, "cleanup run skipped: the server refuses writes");
            return done(
                RunOutcome::SkippedReadOnly,
                None,
                Some(format!("skipped: {reason}")),
                true,
            );
        }
        Err(e) => {
            Meter::new(Some(metrics)).failed(&e);
            let error = e.summary();
            tracing::warn!(error = %error, "cleanup run failed; next try at the next fire time");
            return done(RunOutcome::Failed, None, Some(error), !e.is_unavailable());
        }
    }
    // Counts skips and failures, sets tombstoned_cleanup_lease_held, records the run.
    let result = cleanup::run_leased(
        db,
        &config.cleanup,
        &config.retention,
        RunLimits::default(),
        shutdown,
        Some(metrics),
    )
    .await;
    match result {
        Ok(LeasedRun::Skipped(_)) => done(RunOutcome::SkippedLease, None, None, true),
        Ok(LeasedRun::Ran(report)) => done(report.outcome, Some(report), None, true),
        Ok(LeasedRun::Stopped) => done(
            RunOutcome::Partial,
            None,
            Some("stopped before the run took the lease".to_owned()),
            true,
        ),
        Err(e) => {
            // run_once counted it; reporting it is ours.
            let error = e.summary();
            tracing::warn!(error = %error, "cleanup run failed; next try at the next fire time");
            done(RunOutcome::Failed, None, Some(error), !e.is_unavailable())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 2, h, m, s).single().unwrap()
    }

    #[test]
    fn missed_fires_counts_fire_times_after_the_fired_one_up_to_now() {
        let every_five = Schedule::parse("*/5 * * * *").unwrap();
        // Fired at 12:00, run ended 12:17: 12:05, 12:10, 12:15 passed.
        assert_eq!(missed_fires(&every_five, at(12, 0, 0), at(12, 17, 0)), 3);
        // Ended exactly on a fire time: it counts as passed.
        assert_eq!(missed_fires(&every_five, at(12, 0, 0), at(12, 5, 0)), 1);
        // Short run: nothing missed.
        assert_eq!(missed_fires(&every_five, at(12, 0, 0), at(12, 4, 59)), 0);
    }

    #[test]
    fn missed_fires_is_capped() {
        let every_second = Schedule::parse("* * * * * *").unwrap();
        assert_eq!(
            missed_fires(&every_second, at(0, 0, 0), at(23, 59, 59)), // 86 399 fire times
            MAX_MISSED_FIRES_COUNTED
        );
    }

    #[test]
    fn summary_shows_state_last_run_and_next_fire() {
        let mut s = SchedulerStatus::new(Some(at(12, 5, 0)), false);
        assert_eq!(s.summary(), "cleanup idle; no run yet; next 12:05:00Z");
        s.last_run = Some(LastRun {
            started: at(12, 0, 0),
            finished: at(12, 0, 1),
            outcome: RunOutcome::Failed,
            report: None,
            error: Some("cannot open the cleanup database session".into()),
        });
        assert_eq!(
            s.summary(),
            "cleanup idle; last run 12:00:01Z failed: cannot open the cleanup database session; \
             next 12:05:00Z"
        );
        s.state = SchedulerState::Paused;
        s.next_fire = None;
        assert!(s.summary().starts_with("cleanup paused"));
    }
}

//! `tombstoned serve`: start-up checks, the long-running tasks (cleanup scheduler, HTTP API,
//! outbox relay, operations listener, systemd notifications), and the signals that reload and
//! stop them.
//!
//! Start-up order is what makes `READY=1` honest: configuration loaded, database reachable,
//! schema current, both listeners bound — only then readiness. Shutdown runs the other way: stop
//! accepting API requests and drain them (bounded), let the cleaner finish or roll back its
//! current batch and release its lease, let the outbox relay's deliveries in flight finish
//! (bounded by `outbox.shutdown_grace`, then abandoned: their leases expire and they are sent
//! again), and close the metrics listener last so the final scrapes still work.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::cli::Exit;
use crate::config::Config;
use crate::db::{self, migrations};
use crate::http::{self, ApiState};
use crate::metrics::Metrics;
use crate::ops_server::{self, OpsState};
use crate::outbox::Relay;
use crate::readiness::ReadinessProbe;
use crate::scheduler::{Scheduler, SchedulerState, SchedulerStatus};
use crate::systemd::Notifier;

/// How long in-flight API requests may take to finish after SIGTERM.
const API_DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the readiness probe refreshes on its own (it also feeds the watchdog); never less
/// often than the watchdog pings.
const READINESS_REFRESH: Duration = Duration::from_secs(5);
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
/// On top of `outbox.shutdown_grace`: how long the relay may take to release what it leased but
/// did not send and to record what just finished (a few bounded statements).
const RELAY_STOP_SLACK: Duration = Duration::from_secs(30);

/// Runs the daemon until SIGTERM or SIGINT. `config_path` is re-read on SIGHUP.
pub async fn serve(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<Exit> {
    let notifier = Notifier::from_env();
    let metrics = Arc::new(Metrics::new().context("cannot register the metrics")?);

    // Database reachable and schema current, or no start at all (exit 69; systemd retries).
    {
        let session = db::connect(&config.database, "serve").await?;
        let status = migrations::status(&session.client, &config.database.schema).await?;
        if let Some(problem) = status.problem() {
            return Err(migrations::SchemaNotCurrent(problem).into());
        }
    }

    // Bind both listeners before announcing readiness; a taken port is a configuration error.
    let ops_listener = ops_server::bind(config.metrics.listen).await?;
    let api = if config.api.enabled {
        let state = ApiState::new(&config, metrics.clone())?;
        let listener = tokio::net::TcpListener::bind(config.api.listen)
            .await
            .map_err(|source| ListenError {
                key: "api.listen",
                addr: config.api.listen,
                source,
            })?;
        Some((state, listener))
    } else {
        None
    };
    // The relay reads its secret and CA files now: an unusable one is a configuration error
    // (exit 64) before readiness, not a relay failing in the background.
    let relay = if config.outbox.enabled {
        Some(Relay::new(
            &config.database,
            &config.outbox,
            "outbox-relay",
            Some(metrics.clone()),
        )?)
    } else {
        None
    };

    let stop_work = CancellationToken::new(); // API, scheduler and outbox relay
    let stop_ops = CancellationToken::new(); // metrics listener, probe, watchdog: last
    let readiness = Arc::new(ReadinessProbe::new(config.database.clone()));
    let mut ops_state = OpsState::new(metrics.clone(), readiness.clone());
    if let Some((state, _)) = &api {
        ops_state = ops_state.with_pool(state.pool().clone());
    }
    let ops_task = tokio::spawn(ops_server::serve_metrics(
        ops_listener,
        ops_state,
        stop_ops.clone(),
    ));

    let api_state = api.as_ref().map(|(state, _)| state.clone());
    let api_task: Option<JoinHandle<Result<(), http::ApiError>>> =
        api.map(|(state, listener)| tokio::spawn(http::serve(listener, state, stop_work.clone())));

    let (config_tx, config_rx) = watch::channel(Arc::new(config.clone()));
    let scheduler = Scheduler::new(config.database.clone(), config_rx, metrics.clone());
    let scheduler_status = scheduler.status();
    let scheduler_task = tokio::spawn(scheduler.run(stop_work.clone()));
    let relay_task = relay.map(|relay| tokio::spawn(relay.run(stop_work.clone())));

    let status_task = tokio::spawn(publish_status(
        notifier.clone(),
        scheduler_status.clone(),
        stop_ops.clone(),
    ));
    readiness.check().await; // a fresh "database reachable" for the watchdog's first look
    let refresh_every = notifier
        .watchdog_interval()
        .map_or(READINESS_REFRESH, |ping| ping.min(READINESS_REFRESH));
    let refresh_task = readiness.spawn_refresh(refresh_every, stop_ops.clone());
    let watchdog_task = notifier.watchdog_timeout().and_then(|timeout| {
        let health = WatchdogHealth {
            status: scheduler_status.clone(),
            readiness: readiness.clone(),
            config: config_tx.subscribe(),
            database_outage_tolerance: database_outage_tolerance(timeout),
            started: Instant::now(),
            run: Mutex::new(RunClock::default()),
            failing: Mutex::new(None),
        };
        notifier.spawn_watchdog(move || health.check(), stop_ops.clone())
    });

    notifier.ready(&ready_line(&config, &scheduler_status.borrow()));
    tracing::info!(
        database = %config.database.url,
        schema = %config.database.schema,
        api = %if config.api.enabled { config.api.listen.to_string() } else { "disabled".into() },
        metrics = %config.metrics.listen,
        cleanup = %if config.cleanup.enabled { config.cleanup.schedule.to_string() } else { "disabled".into() },
        outbox = %if config.outbox.enabled { config.outbox.endpoint_display() } else { "disabled".into() },
        "tombstoned ready"
    );

    // Signals: SIGHUP reloads; the first SIGTERM/SIGINT stops gracefully, a second exits at once.
    let mut term = unix_signal(SignalKind::terminate())?;
    let mut int = unix_signal(SignalKind::interrupt())?;
    let mut hup = unix_signal(SignalKind::hangup())?;
    let mut current = Arc::new(config);
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => {
                notifier.reloading();
                current = reload(config_path.as_deref(), &current, &config_tx, api_state.as_ref());
                notifier.ready(&ready_line(&current, &scheduler_status.borrow()));
            }
        }
    }

    tracing::info!(
        "shutting down: draining API requests, finishing the current cleanup batch and the \
         outbox deliveries in flight"
    );
    notifier.stopping();
    readiness.mark_shutting_down();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: exiting at once");
        std::process::exit(Exit::Interrupted as i32);
    });
    stop_work.cancel();
    if let Some(task) = api_task {
        match tokio::time::timeout(API_DRAIN_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %format!("{e:#}"), "HTTP server failed"),
            Ok(Err(e)) => tracing::error!(error = %e, "HTTP server task failed"),
            Err(_) => tracing::warn!(
                timeout = ?API_DRAIN_TIMEOUT,
                "in-flight API requests did not finish in time; closing them"
            ),
        }
    }
    if let Err(e) = scheduler_task.await {
        tracing::error!(error = %e, "cleanup scheduler task failed");
    }
    if let Some(task) = relay_task {
        // Cancelled with the rest above, so its grace has been running meanwhile.
        let bound = current.outbox.shutdown_grace + RELAY_STOP_SLACK;
        match tokio::time::timeout(bound, task).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "outbox relay task failed"),
            Err(_) => tracing::warn!(
                timeout = ?bound,
                "the outbox relay did not stop in time; its leased events are sent again when \
                 their leases expire"
            ),
        }
    }
    stop_ops.cancel();
    for task in [Some(status_task), Some(refresh_task), watchdog_task]
        .into_iter()
        .flatten()
    {
        let _ = task.await;
    }
    match ops_task.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %format!("{e:#}"), "metrics listener failed"),
        Err(e) => tracing::error!(error = %e, "metrics listener task failed"),
    }
    tracing::info!("tombstoned stopped");
    Ok(Exit::Success)
}

/// A listener could not be bound: a configuration problem (exit status 64).
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({key})")]
pub struct ListenError {
    /// The configuration key naming the address.
    pub key: &'static str,
    /// The address.
    pub addr: std::net::SocketAddr,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

fn unix_signal(kind: SignalKind) -> anyhow::Result<Signal> {
    signal(kind).with_context(|| {
        format!(
            "cannot install a handler for signal {}",
            kind.as_raw_value()
        )
    })
}

fn ready_line(config: &Config, status: &SchedulerStatus) -> String {
    let api = if config.api.enabled {
        format!("api on {}", config.api.listen)
    } else {
        "api disabled".to_owned()
    };
    format!("{api}; {}", status.summary())
}

/// Mirrors every scheduler state change into systemd's `STATUS=`.
async fn publish_status(
    notifier: Notifier,
    mut status: watch::Receiver<SchedulerStatus>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = status.changed() => {
                if changed.is_err() {
                    return; // the scheduler is gone
                }
                let line = status.borrow_and_update().summary();
                notifier.status(&line);
            }
        }
    }
}

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
/// batches, so on top of it come the connections of the lease and the run, the pause before the
/// check, and a few statements that may each take `statement_timeout` — the batch in flight
/// (twice when it times out on a lock and is re-run with SKIP LOCKED), the backlog count and
/// the lease release.
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
struct WatchdogHealth {
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
    fn check(&self) -> bool {
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

/// SIGHUP: re-read the configuration file. An invalid file keeps the running configuration.
/// Settings that need new connections or sockets are reported and take effect at restart.
fn reload(
    path: Option<&std::path::Path>,
    current: &Arc<Config>,
    config_tx: &watch::Sender<Arc<Config>>,
    api: Option<&ApiState>,
) -> Arc<Config> {
    let started = Instant::now();
    let new = match Config::load(path, &[]) {
        Ok(new) => new,
        Err(e) => {
            tracing::error!(
                error = %format!("{e:#}"),
                "configuration reload rejected; keeping the running configuration"
            );
            return current.clone();
        }
    };
    let mut needs_restart = Vec::new();
    if new.database.url.expose() != current.database.url.expose() {
        needs_restart.push("database.url");
    }
    if new.database.schema != current.database.schema {
        needs_restart.push("database.schema");
    }
    if new.database.pool_size != current.database.pool_size {
        needs_restart.push("database.pool_size");
    }
    if new.database.connect_timeout != current.database.connect_timeout {
        needs_restart.push("database.connect_timeout");
    }
    if new.api.enabled != current.api.enabled {
        needs_restart.push("api.enabled");
    }
    if new.api.listen != current.api.listen {
        needs_restart.push("api.listen");
    }
    if new.metrics.listen != current.metrics.listen {
        needs_restart.push("metrics.listen");
    }
    if new.outbox != current.outbox {
        needs_restart.push("outbox.*");
    }
    if !needs_restart.is_empty() {
        tracing::warn!(
            keys = %needs_restart.join(", "),
            "these settings changed but take effect only after a restart"
        );
    }
    // What can change safely is applied; the rest keeps its running value until restart.
    let mut applied = new.clone();
    applied.database = current.database.clone();
    applied.api.enabled = current.api.enabled;
    applied.api.listen = current.api.listen;
    applied.metrics = current.metrics.clone();
    applied.outbox = current.outbox.clone();
    let applied = Arc::new(applied);
    if let Some(api) = api {
        if let Err(e) = api.reload(&applied) {
            tracing::error!(
                error = %format!("{e:#}"),
                "API reload failed; the previous tokens stay in force"
            );
        }
    }
    config_tx.send_replace(applied.clone());
    tracing::info!(elapsed = ?started.elapsed(), "configuration reloaded");
    applied
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        // Shipped defaults: max_run_time 4m, statement_timeout 30s, connect_timeout 5s, no pause.
        Config::load_from(None, Vec::new(), &[]).unwrap()
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

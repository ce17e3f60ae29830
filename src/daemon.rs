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
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::connections::ConnectionLimits;
use crate::db;
use crate::fd_budget::{self, FdPlan};
use crate::http::{self, ApiState};
use crate::metrics::Metrics;
use crate::ops::listener::{self, OpsServerError, OpsState};
use crate::ops::readiness::ReadinessProbe;
use crate::ops::systemd::Notifier;
use crate::ops::watchdog::WatchdogHealth;
use crate::outbox::Relay;
use crate::scheduler::{Scheduler, SchedulerStatus};
use crate::schema::{self, Needs};
use crate::signals::GracefulStop;
use crate::telemetry;

/// How long in-flight API requests may take to finish after SIGTERM.
const API_DRAIN_TIMEOUT: Duration = Duration::from_secs(15);
/// How often the readiness probe refreshes on its own (it also feeds the watchdog); never less
/// often than the watchdog pings.
const READINESS_REFRESH: Duration = Duration::from_secs(5);
/// How long shutdown waits for the cleanup scheduler: a run's stop grace, a bounded lease
/// release, and slack. With the API drain and the relay's bound it stays well inside the unit's
/// `TimeoutStopSec=45s`.
const SCHEDULER_STOP_BOUND: Duration = Duration::from_secs(10);

/// On top of `outbox.shutdown_grace`: how long the relay may take to release what it leased but
/// did not send and to record what just finished (a few bounded statements).
const RELAY_STOP_SLACK: Duration = Duration::from_secs(30);

/// Runs the daemon until SIGTERM or SIGINT. `config_path` is re-read on SIGHUP.
///
/// What it starts, in order: every step before `announce_ready` can still refuse the start.
pub async fn serve(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let notifier = Notifier::from_env();
    let metrics = Arc::new(Metrics::new().context("cannot register the metrics")?);
    let traces = start_tracing(&config, &metrics)?;
    let api_state = open_api_pool(&config, &metrics)?;
    check_schema(&config).await?;
    check_replica_lag_visible(&config).await?;
    let fds = file_descriptor_budget(&config)?;
    let (ops_listener, api) = bind_listeners(&config, api_state).await?;
    let bound = Bound::of(&config, &ops_listener, api.as_ref());
    let relay = open_relay(&config, &metrics)?;
    let mut signals = install_signals()?;

    let stop = Stops::default();
    let readiness = readiness_probe(&config, api.as_ref().map(|(state, _)| state));
    let ops = start_ops_listener(ops_listener, &config, &fds, &metrics, &readiness, &stop);
    let api_state = api.as_ref().map(|(state, _)| state.clone());
    let api = start_api(api, &fds, &stop);
    let (config_tx, scheduler_status, scheduler) = start_scheduler(&config, &metrics, &stop);
    let relay = start_relay(relay, &stop);
    let health = start_health(&notifier, &scheduler_status, &readiness, &config_tx, &stop).await;

    announce_ready(&notifier, &config, &bound, &scheduler_status);
    let running = Running {
        notifier: &notifier,
        config_path: config_path.as_deref(),
        config_tx: &config_tx,
        api: api_state.as_ref(),
        scheduler_status: &scheduler_status,
        bound: &bound,
    };
    let current = running.until_stopped(&mut signals, config).await;

    let tasks = Tasks {
        api,
        scheduler,
        relay,
        health,
        ops,
        traces,
    };
    shut_down(tasks, &current, &notifier, &readiness, &stop).await;
    Ok(())
}

/// The two stops of shutdown: the work first, the operations listener last.
#[derive(Default)]
struct Stops {
    /// API, scheduler and outbox relay.
    work: CancellationToken,
    /// Metrics listener, probe, watchdog: last.
    ops: CancellationToken,
}

/// The tasks [`serve`] started, awaited by [`shut_down`] in their order.
struct Tasks {
    api: Option<JoinHandle<Result<(), http::ApiError>>>,
    scheduler: JoinHandle<()>,
    relay: Option<JoinHandle<()>>,
    /// The systemd status mirror, the readiness refresh and the watchdog.
    health: Vec<JoinHandle<()>>,
    ops: JoinHandle<Result<(), OpsServerError>>,
    /// The trace export, flushed once the work has stopped.
    traces: Option<telemetry::Tracing>,
}

/// Traces, when `[tracing]` names a collector: started first, so every request, run and
/// delivery is traced; spans dropped are counted in the daemon's metrics.
fn start_tracing(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Option<telemetry::Tracing>> {
    Ok(telemetry::start(
        &config.tracing,
        Some(metrics.trace_spans_dropped.clone()),
    )?)
}

/// The API's state, its pool opening its first connection in the background.
///
/// The API's pool opens its first connection while the start-up check below opens its own:
/// with a multi-host URL whose first host is silent, each pays `connect_timeout` on it side
/// by side, not one after the other, so the first request is served one `connect_timeout`
/// after start, not two. (Detached: bounded by the pool's own wait; the connection goes back
/// to the pool, or nowhere if the check fails and the process exits.)
fn open_api_pool(config: &Config, metrics: &Arc<Metrics>) -> anyhow::Result<Option<ApiState>> {
    Ok(if config.api.enabled {
        let state = ApiState::new(config, metrics.clone())?;
        let pool = state.pool().clone();
        tokio::spawn(async move { drop(pool.get().await) });
        Some(state)
    } else {
        None
    })
}

/// Database reachable and schema current, or no start at all (exit 69; systemd retries): a
/// PostgreSQL 15 or newer, the migrations this binary's, the SQL API's version one it knows, and, through a transaction
/// pooler, the claim's functions (V6) executable by the API's role.
async fn check_schema(config: &Config) -> anyhow::Result<()> {
    let session = db::connect(&config.database, "serve").await?;
    let api_through_functions =
        config.api.enabled && !config.database.pooler.keeps_prepared_statements();
    match schema::check(&session.conn(), Needs::serve(api_through_functions), None).await {
        Ok(_) => Ok(()),
        Err(e @ schema::CheckError::Db(_)) => Err(e.into()),
        Err(refused) => Err(anyhow::Error::new(refused).context("refusing to start")),
    }
}

/// A throttle the role cannot observe is refused now, once (exit 64), not at every run.
async fn check_replica_lag_visible(config: &Config) -> anyhow::Result<()> {
    crate::cleanup::check_replica_lag_visible(&config.database, &config.cleanup)
        .await
        .context("checking cleanup.max_replica_lag")
}

/// Binds both listeners before announcing readiness; a taken port is a configuration error.
async fn bind_listeners(
    config: &Config,
    api_state: Option<ApiState>,
) -> anyhow::Result<(TcpListener, Option<(ApiState, TcpListener)>)> {
    let ops_listener = listener::bind(config.metrics.listen).await?;
    let api = if let Some(state) = api_state {
        let listener = TcpListener::bind(config.api.listen)
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
    Ok((ops_listener, api))
}

/// What the listeners are bound to: the configured addresses, with the OS's port for port 0.
#[derive(Clone, Copy)]
struct Bound {
    api: Option<std::net::SocketAddr>,
    metrics: std::net::SocketAddr,
}

impl Bound {
    fn of(config: &Config, ops: &TcpListener, api: Option<&(ApiState, TcpListener)>) -> Self {
        Bound {
            api: api.map(|(_, l)| l.local_addr().unwrap_or(config.api.listen)),
            metrics: ops.local_addr().unwrap_or(config.metrics.listen),
        }
    }
}

/// The relay reads its secret and CA files now: an unusable one is a configuration error
/// (exit 64) before readiness, not a relay failing in the background.
fn open_relay(config: &Config, metrics: &Arc<Metrics>) -> anyhow::Result<Option<Relay>> {
    Ok(if config.outbox.enabled {
        Some(Relay::new(
            &config.database,
            &config.outbox,
            "outbox-relay",
            Some(metrics.clone()),
        )?)
    } else {
        None
    })
}

/// Signals: SIGHUP reloads; the first SIGTERM/SIGINT stops gracefully, a second exits at once.
/// Installed before /readyz can answer 200: a client that saw "ready" may signal at once, and
/// a signal that arrives before its handler would kill the process (SIGHUP's default). One
/// that arrives during the rest of start-up is acted on when the main loop begins.
fn install_signals() -> anyhow::Result<(CancellationToken, Signal)> {
    let signalled = CancellationToken::new();
    GracefulStop::install()?.spawn(
        signalled.clone(),
        Some(
            "shutting down: draining API requests, finishing the current cleanup batch and the \
             outbox deliveries in flight",
        ),
        "second signal: exiting at once",
    );
    let hup = signal(SignalKind::hangup()).context("cannot install a handler for SIGHUP")?;
    Ok((signalled, hup))
}

/// The readiness probe: the database, and with the API its pool and health.
fn readiness_probe(config: &Config, api: Option<&ApiState>) -> Arc<ReadinessProbe> {
    let readiness = ReadinessProbe::new(config.database.clone());
    Arc::new(match api {
        Some(state) => readiness.with_api(state.pool().clone(), state.health().clone()),
        None => readiness,
    })
}

/// The metrics and health listener, stopped last.
fn start_ops_listener(
    ops_listener: TcpListener,
    config: &Config,
    fds: &FdPlan,
    metrics: &Arc<Metrics>,
    readiness: &Arc<ReadinessProbe>,
    stop: &Stops,
) -> JoinHandle<Result<(), OpsServerError>> {
    // The API's state reports its pool's connections on /metrics (Metrics::observe_pool).
    let ops_state =
        OpsState::new(metrics.clone(), readiness.clone()).with_limits(ConnectionLimits {
            max_connections: fds.metrics_connections,
            header_read_timeout: config.metrics.header_read_timeout,
            idle_timeout: config.metrics.idle_timeout,
            drain_timeout: listener::REQUEST_DRAIN,
        });
    tokio::spawn(listener::serve_metrics(
        ops_listener,
        ops_state,
        stop.ops.clone(),
    ))
}

/// The HTTP API, with the connection cap the file descriptor budget left it.
fn start_api(
    api: Option<(ApiState, TcpListener)>,
    fds: &FdPlan,
    stop: &Stops,
) -> Option<JoinHandle<Result<(), http::ApiError>>> {
    api.map(|(state, listener)| {
        let limits = ConnectionLimits {
            max_connections: fds.api_connections,
            ..state.connection_limits()
        };
        tokio::spawn(http::serve_with_limits(
            listener,
            state,
            limits,
            stop.work.clone(),
        ))
    })
}

/// The cleanup scheduler, fed the configuration (and every reload) through a watch channel.
fn start_scheduler(
    config: &Config,
    metrics: &Arc<Metrics>,
    stop: &Stops,
) -> (
    watch::Sender<Arc<Config>>,
    watch::Receiver<SchedulerStatus>,
    JoinHandle<()>,
) {
    let (config_tx, config_rx) = watch::channel(Arc::new(config.clone()));
    let scheduler = Scheduler::new(config.database.clone(), config_rx, metrics.clone());
    let scheduler_status = scheduler.status();
    let scheduler_task = tokio::spawn(scheduler.run(stop.work.clone()));
    (config_tx, scheduler_status, scheduler_task)
}

/// The outbox relay, when enabled.
fn start_relay(relay: Option<Relay>, stop: &Stops) -> Option<JoinHandle<()>> {
    relay.map(|relay| tokio::spawn(relay.run(stop.work.clone())))
}

/// systemd's `STATUS=` mirror, a first readiness check, its periodic refresh and the watchdog.
async fn start_health(
    notifier: &Notifier,
    scheduler_status: &watch::Receiver<SchedulerStatus>,
    readiness: &Arc<ReadinessProbe>,
    config_tx: &watch::Sender<Arc<Config>>,
    stop: &Stops,
) -> Vec<JoinHandle<()>> {
    let status_task = tokio::spawn(publish_status(
        notifier.clone(),
        scheduler_status.clone(),
        stop.ops.clone(),
    ));
    readiness.check().await; // a fresh "database reachable" for the watchdog's first look
    let refresh_every = notifier
        .watchdog_interval()
        .map_or(READINESS_REFRESH, |ping| ping.min(READINESS_REFRESH));
    let refresh_task = readiness.spawn_refresh(refresh_every, stop.ops.clone());
    let watchdog_task = notifier.watchdog_timeout().and_then(|timeout| {
        let health = WatchdogHealth::new(
            scheduler_status.clone(),
            readiness.clone(),
            config_tx.subscribe(),
            timeout,
        );
        notifier.spawn_watchdog(move || health.check(), stop.ops.clone())
    });
    [Some(status_task), Some(refresh_task), watchdog_task]
        .into_iter()
        .flatten()
        .collect()
}

/// `READY=1` and the start-up line.
fn announce_ready(
    notifier: &Notifier,
    config: &Config,
    bound: &Bound,
    scheduler_status: &watch::Receiver<SchedulerStatus>,
) {
    let Bound {
        api: api_addr,
        metrics: metrics_addr,
    } = *bound;
    notifier.ready(&ready_line(api_addr, &scheduler_status.borrow()));
    tracing::info!(
        database = %config.database.url,
        schema = %config.database.schema,
        api = %api_addr.map_or_else(|| "disabled".to_owned(), |a| a.to_string()),
        metrics = %metrics_addr,
        cleanup = %if config.cleanup.enabled { config.cleanup.schedule.to_string() } else { "disabled".into() },
        outbox = %if config.outbox.enabled { config.outbox.endpoint_display() } else { "disabled".into() },
        tracing = %if config.tracing.enabled() { config.tracing.endpoint_display() } else { "off".into() },
        "tombstoned ready"
    );
}

/// What the main loop reloads.
struct Running<'a> {
    notifier: &'a Notifier,
    config_path: Option<&'a std::path::Path>,
    config_tx: &'a watch::Sender<Arc<Config>>,
    api: Option<&'a ApiState>,
    scheduler_status: &'a watch::Receiver<SchedulerStatus>,
    bound: &'a Bound,
}

impl Running<'_> {
    /// Reloads on every SIGHUP until the first SIGTERM/SIGINT; answers the configuration then
    /// running.
    async fn until_stopped(
        &self,
        (signalled, hup): &mut (CancellationToken, Signal),
        config: Config,
    ) -> Arc<Config> {
        let mut current = Arc::new(config);
        loop {
            tokio::select! {
                _ = signalled.cancelled() => break,
                _ = hup.recv() => {
                    self.notifier.reloading();
                    current = reload(self.config_path, &current, self.config_tx, self.api);
                    self.notifier.ready(&ready_line(self.bound.api, &self.scheduler_status.borrow()));
                }
            }
        }
        current
    }
}

/// Shutdown, the other way round: stop accepting API requests and drain them (bounded), let
/// the cleaner finish or roll back its batch, let the relay's deliveries in flight finish
/// (bounded), export the last trace spans (bounded), then the health tasks and the metrics
/// listener last.
async fn shut_down(
    tasks: Tasks,
    current: &Config,
    notifier: &Notifier,
    readiness: &ReadinessProbe,
    stop: &Stops,
) {
    notifier.stopping();
    readiness.mark_shutting_down();
    stop.work.cancel();
    if let Some(task) = tasks.api {
        match tokio::time::timeout(API_DRAIN_TIMEOUT, task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::error!(error = %db::error_text(&e), "HTTP server failed"),
            Ok(Err(e)) => tracing::error!(error = %e, "HTTP server task failed"),
            Err(_) => tracing::warn!(
                timeout = ?API_DRAIN_TIMEOUT,
                "in-flight API requests did not finish in time; closing them"
            ),
        }
    }
    // Bounded whatever the database does: the run gives its batch in flight STOP_GRACE, the
    // lease release is bounded too; past this the task is dropped (its sessions close, the
    // server rolls back and releases the lease when it hears of it).
    let mut scheduler_task = tasks.scheduler;
    match tokio::time::timeout(SCHEDULER_STOP_BOUND, &mut scheduler_task).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "cleanup scheduler task failed"),
        Err(_) => {
            scheduler_task.abort();
            tracing::warn!(
                timeout = ?SCHEDULER_STOP_BOUND,
                "the cleanup run did not stop in time; abandoned (the database rolls back its batch)"
            );
        }
    }
    if let Some(task) = tasks.relay {
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
    // The work's last spans, before the metrics listener goes (its count of drops included).
    if let Some(traces) = tasks.traces {
        traces.shutdown(telemetry::FLUSH_BOUND).await;
    }
    stop.ops.cancel();
    for task in tasks.health {
        let _ = task.await;
    }
    match tasks.ops.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %db::error_text(&e), "metrics listener failed"),
        Err(e) => tracing::error!(error = %e, "metrics listener task failed"),
    }
    tracing::info!("tombstoned stopped");
}

/// Fits both listeners' connection caps into `RLIMIT_NOFILE` next to the pool and a reserve
/// ([`fd_budget`]), and says what it chose.
fn file_descriptor_budget(config: &Config) -> Result<FdPlan, ConfigError> {
    let api_wanted = if config.api.enabled {
        config.api.max_connections
    } else {
        0
    };
    let metrics_wanted = config.metrics.max_connections;
    let plan =
        fd_budget::apply(api_wanted, metrics_wanted, config.database.pool_size).map_err(|e| {
            ConfigError::Invalid {
                key: "api.max_connections",
                reason: e.to_string(),
            }
        })?;
    if plan.lowered(api_wanted, metrics_wanted) {
        tracing::warn!(
            nofile = plan.limit,
            api_max_connections = plan.api_connections,
            metrics_max_connections = plan.metrics_connections,
            configured_api = api_wanted,
            configured_metrics = metrics_wanted,
            reserved = plan.reserved,
            "the connection caps do not fit RLIMIT_NOFILE next to the database pool: lowered \
             (raise LimitNOFILE= to keep the configured ones)"
        );
    } else {
        tracing::info!(
            nofile = plan.limit,
            raised_from = ?plan.raised_from,
            api_max_connections = plan.api_connections,
            metrics_max_connections = plan.metrics_connections,
            reserved = plan.reserved,
            "file descriptor budget"
        );
    }
    Ok(plan)
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

fn ready_line(api_addr: Option<std::net::SocketAddr>, status: &SchedulerStatus) -> String {
    let api = match api_addr {
        Some(addr) => format!("api on {addr}"),
        None => "api disabled".to_owned(),
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
                error = %db::error_text(&e),
                "configuration reload rejected; keeping the running configuration"
            );
            return current.clone();
        }
    };
    let needs_restart = current.restart_required_changes(&new);
    if !needs_restart.is_empty() {
        tracing::warn!(
            keys = %needs_restart.join(", "),
            "these settings changed but take effect only after a restart"
        );
    }
    // What can change safely is applied; the rest keeps its running value until restart.
    let applied = Arc::new(current.reloaded(new));
    telemetry::set_sample_ratio(applied.tracing.sample_ratio);
    // The API takes its settings all at once, with the tokens file: when that cannot be loaded,
    // none of them change, while the scheduler's below still do.
    let api_kept = match api.map(|api| api.reload(&applied)) {
        Some(Err(e)) => {
            tracing::error!(
                error = %db::error_text(&e),
                "API reload failed; the previous tokens stay in force"
            );
            true
        }
        Some(Ok(())) | None => false,
    };
    config_tx.send_replace(applied.clone());
    let mut not_applied: Vec<String> = needs_restart
        .iter()
        .map(|key| format!("{key} (at the next restart)"))
        .collect();
    if api_kept {
        not_applied.push(
            "the API's settings (its tokens, api.*, retention.replay_window for new claims): \
             the previous ones stay in force until a reload loads the tokens file"
                .to_owned(),
        );
        tracing::warn!(
            applied = "cleanup.* and retention.* for the next cleanup run",
            not_applied = %not_applied.join("; "),
            elapsed = ?started.elapsed(),
            "configuration reloaded in part: the API keeps its previous tokens and settings"
        );
    } else if not_applied.is_empty() {
        tracing::info!(elapsed = ?started.elapsed(), "configuration reloaded");
    } else {
        tracing::info!(
            not_applied = %not_applied.join("; "),
            elapsed = ?started.elapsed(),
            "configuration reloaded"
        );
    }
    applied
}

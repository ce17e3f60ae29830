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
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::connections::ConnectionLimits;
use crate::db::{self, migrations};
use crate::fd_budget::{self, FdPlan};
use crate::http::{self, ApiState};
use crate::metrics::Metrics;
use crate::ops::listener::{self, OpsState};
use crate::ops::readiness::ReadinessProbe;
use crate::ops::systemd::Notifier;
use crate::ops::watchdog::WatchdogHealth;
use crate::outbox::Relay;
use crate::scheduler::{Scheduler, SchedulerStatus};
use crate::signals::GracefulStop;
use crate::sql_api;

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
pub async fn serve(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<()> {
    let notifier = Notifier::from_env();
    let metrics = Arc::new(Metrics::new().context("cannot register the metrics")?);

    // The API's pool opens its first connection while the start-up check below opens its own:
    // with a multi-host URL whose first host is silent, each pays `connect_timeout` on it side
    // by side, not one after the other, so the first request is served one `connect_timeout`
    // after start, not two. (Detached: bounded by the pool's own wait; the connection goes back
    // to the pool, or nowhere if the check fails and the process exits.)
    let api_state = if config.api.enabled {
        let state = ApiState::new(&config, metrics.clone())?;
        let pool = state.pool().clone();
        tokio::spawn(async move { drop(pool.get().await) });
        Some(state)
    } else {
        None
    };
    // Database reachable and schema current, or no start at all (exit 69; systemd retries).
    {
        let session = db::connect(&config.database, "serve").await?;
        let status = migrations::status(&session.conn(), None).await?;
        if let Some(problem) = status.problem() {
            return Err(migrations::SchemaNotCurrent(problem).into());
        }
        if let Some(api_version) = sql_api::schema_version(&session.conn()).await? {
            sql_api::require_known(api_version)
                .map_err(|unknown| migrations::SchemaNotCurrent(unknown.to_string()))?;
        }
    }
    // A throttle the role cannot observe is refused now, once (exit 64), not at every run.
    crate::cleanup::check_replica_lag_visible(&config.database, &config.cleanup)
        .await
        .context("checking cleanup.max_replica_lag")?;

    let fds = file_descriptor_budget(&config)?;

    // Bind both listeners before announcing readiness; a taken port is a configuration error.
    let ops_listener = listener::bind(config.metrics.listen).await?;
    let api = if let Some(state) = api_state {
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
    // What the listeners are bound to: the configured addresses, with the OS's port for port 0.
    let metrics_addr = ops_listener.local_addr().unwrap_or(config.metrics.listen);
    let api_addr = api
        .as_ref()
        .map(|(_, l)| l.local_addr().unwrap_or(config.api.listen));
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

    // Signals: SIGHUP reloads; the first SIGTERM/SIGINT stops gracefully, a second exits at once.
    // Installed before /readyz can answer 200: a client that saw "ready" may signal at once, and
    // a signal that arrives before its handler would kill the process (SIGHUP's default). One
    // that arrives during the rest of start-up is acted on when the main loop begins.
    let signalled = CancellationToken::new();
    GracefulStop::install()?.spawn(
        signalled.clone(),
        Some(
            "shutting down: draining API requests, finishing the current cleanup batch and the \
             outbox deliveries in flight",
        ),
        "second signal: exiting at once",
    );
    let mut hup = signal(SignalKind::hangup()).context("cannot install a handler for SIGHUP")?;

    let stop_work = CancellationToken::new(); // API, scheduler and outbox relay
    let stop_ops = CancellationToken::new(); // metrics listener, probe, watchdog: last
    let readiness = ReadinessProbe::new(config.database.clone());
    let readiness = Arc::new(match &api {
        Some((state, _)) => readiness.with_api(state.pool().clone(), state.health().clone()),
        None => readiness,
    });
    // The API's state reports its pool's connections on /metrics (Metrics::observe_pool).
    let ops_state =
        OpsState::new(metrics.clone(), readiness.clone()).with_limits(ConnectionLimits {
            max_connections: fds.metrics_connections,
            header_read_timeout: config.metrics.header_read_timeout,
            idle_timeout: config.metrics.idle_timeout,
            drain_timeout: listener::REQUEST_DRAIN,
        });
    let ops_task = tokio::spawn(listener::serve_metrics(
        ops_listener,
        ops_state,
        stop_ops.clone(),
    ));

    let api_state = api.as_ref().map(|(state, _)| state.clone());
    let api_task: Option<JoinHandle<Result<(), http::ApiError>>> = api.map(|(state, listener)| {
        let limits = ConnectionLimits {
            max_connections: fds.api_connections,
            ..state.connection_limits()
        };
        tokio::spawn(http::serve_with_limits(
            listener,
            state,
            limits,
            stop_work.clone(),
        ))
    });

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
        let health = WatchdogHealth::new(
            scheduler_status.clone(),
            readiness.clone(),
            config_tx.subscribe(),
            timeout,
        );
        notifier.spawn_watchdog(move || health.check(), stop_ops.clone())
    });

    notifier.ready(&ready_line(api_addr, &scheduler_status.borrow()));
    tracing::info!(
        database = %config.database.url,
        schema = %config.database.schema,
        api = %api_addr.map_or_else(|| "disabled".to_owned(), |a| a.to_string()),
        metrics = %metrics_addr,
        cleanup = %if config.cleanup.enabled { config.cleanup.schedule.to_string() } else { "disabled".into() },
        outbox = %if config.outbox.enabled { config.outbox.endpoint_display() } else { "disabled".into() },
        "tombstoned ready"
    );

    let mut current = Arc::new(config);
    loop {
        tokio::select! {
            _ = signalled.cancelled() => break,
            _ = hup.recv() => {
                notifier.reloading();
                current = reload(config_path.as_deref(), &current, &config_tx, api_state.as_ref());
                notifier.ready(&ready_line(api_addr, &scheduler_status.borrow()));
            }
        }
    }

    notifier.stopping();
    readiness.mark_shutting_down();
    stop_work.cancel();
    if let Some(task) = api_task {
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
    let mut scheduler_task = scheduler_task;
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
        Ok(Err(e)) => tracing::error!(error = %db::error_text(&e), "metrics listener failed"),
        Err(e) => tracing::error!(error = %e, "metrics listener task failed"),
    }
    tracing::info!("tombstoned stopped");
    Ok(())
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

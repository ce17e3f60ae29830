//! The command line, the binary's edge: argument parsing, logging set-up, dispatch to one file
//! per command, and the mapping of every outcome to a documented exit status ([`Exit`]), with
//! the one place an error is printed. Only `main.rs` uses this module. What the commands call
//! never prints (the demo's story aside): reports come back here to be rendered.

mod check_config;
mod cleanup;
mod conformance;
#[cfg(feature = "demo")]
mod demo;
pub mod generate;
mod keys;
mod log_format;
mod migrate;
mod operations;
mod outbox;
mod progress;
mod serve;
mod status;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError, Override};
use crate::db::{self, DbError, ErrorClass};
use crate::exit::Exit;
use crate::schema::{self, migrations, Needs};
use crate::stdout::{self, StdoutError};

/// tombstoned: idempotency records that stay honest over time.
#[derive(Debug, Parser)]
#[command(name = "tombstoned", version, about, long_about = None,
          after_help = generate::exit_status_help())]
pub struct Cli {
    /// Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply.
    #[arg(long, global = true, env = "TOMBSTONED_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Whether `--config` was on the command line (not from TOMBSTONED_CONFIG): the demo
    /// refuses it.
    #[arg(skip)]
    pub config_on_command_line: bool,

    /// Log line format on stderr. The level comes from RUST_LOG (default: info). Inside a traced
    /// request or run (`[tracing]`), a line also carries its trace_id and span_id.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: cleanup scheduler, HTTP API and metrics.
    Serve,
    /// Run one cleanup pass now, then exit.
    Cleanup(CleanupArgs),
    /// Apply pending schema migrations, or list applied and pending ones.
    Migrate(MigrateArgs),
    /// Validate the configuration and print the next 5 cleanup fire times.
    CheckConfig,
    /// Show the cleanup lease, the last runs, the backlog and replication lag; a monitoring check.
    Status(StatusArgs),
    /// Start a throwaway PostgreSQL and the daemon, and walk through the protocol step by step.
    #[cfg(feature = "demo")]
    Demo(DemoArgs),
    /// Deliver outbox events as webhooks now, list undelivered ones, requeue dead letters.
    #[command(subcommand)]
    Outbox(outbox::OutboxCommand),
    /// Inspect idempotency keys: why a key answers what it answers.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Check that an HTTP endpoint keeps the idempotency contract: nine checks, one line each.
    #[command(long_about = conformance::LONG_ABOUT)]
    Conformance(conformance::ConformanceArgs),
    /// Grant operations of the SQL API to database roles, revoke them, list them and their
    /// history (with the configuration of the role that ran `migrate`).
    #[command(subcommand)]
    Operations(operations::OperationsCommand),
    /// Write the man pages or the shell completions (for packagers; see `dist/`).
    #[command(hide = true)]
    Generate(generate::GenerateArgs),
}

/// `tombstoned cleanup`
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Change nothing: report what a run would do, inside a READ ONLY transaction.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// With --dry-run: also print the plan of the batch query (EXPLAIN).
    #[arg(long)]
    pub explain: bool,
    /// Rows per batch (overrides cleanup.batch_size).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_size: Option<u32>,
    /// Stop after this many batches; the backlog left is reported.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_batches: Option<u64>,
    /// No progress line on a terminal (there is none anyway when stderr is not a terminal,
    /// with --json, or under systemd).
    #[arg(long)]
    pub quiet: bool,
}

/// `tombstoned status`
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the status as JSON.
    #[arg(long)]
    pub json: bool,
    /// Exit 2 when the last successful cleanup run finished longer ago than this (or none is
    /// recorded), e.g. "2h".
    #[arg(long, value_name = "DURATION", value_parser = parse_max_age)]
    pub max_age: Option<std::time::Duration>,
}

fn parse_max_age(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("not a duration ({e}), e.g. \"90m\""))
}

/// `tombstoned migrate`
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// List applied and pending migrations; change nothing.
    #[arg(long)]
    pub status: bool,
    /// No progress line on a terminal while a migration runs (there is none anyway when stderr
    /// is not a terminal, or under systemd).
    #[arg(long)]
    pub quiet: bool,
}

/// `tombstoned demo`
#[cfg(feature = "demo")]
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Leave the throwaway cluster and daemon running at the end (until Ctrl-C).
    #[arg(long)]
    pub keep: bool,
    /// The daemon's replay window (retention.replay_window), 1s to 1h; the story waits that
    /// long for the record to expire. With --keep, e.g. 60s, long enough to follow the README's
    /// curl walkthrough by hand against the daemon left running.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = demo_window)]
    pub replay_window: std::time::Duration,
    // The global `--config`, hidden here: an argument of the demo's own with the same id keeps
    // clap from copying the global one into the demo's help and man page (the completions list
    // hidden flags too). Its value is the global one's, TOMBSTONED_CONFIG included, so the
    // refusal reads `Cli::config_on_command_line`, not this.
    /// Refused (exit 64): the demo writes its own configuration.
    #[arg(long, hide = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
}

/// `demo --replay-window`: a humantime duration from 1 s to 1 h.
#[cfg(feature = "demo")]
fn demo_window(text: &str) -> Result<std::time::Duration, String> {
    let window = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if (std::time::Duration::from_secs(1)..=std::time::Duration::from_secs(3600)).contains(&window)
    {
        Ok(window)
    } else {
        Err("must be from 1s to 1h".to_owned())
    }
}

/// Parses the process arguments, runs the command, and returns the exit status.
pub fn main() -> ExitCode {
    let parsed = <Cli as clap::CommandFactory>::command()
        .try_get_matches()
        .and_then(|matches| {
            let mut cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches)?;
            cli.config_on_command_line =
                matches.value_source("config") == Some(clap::parser::ValueSource::CommandLine);
            Ok(cli)
        });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Success.into() // --help, --version
            };
        }
    };
    // The demo's story is on stdout; its own logs (migrations applied, ...) would interleave.
    #[cfg(feature = "demo")]
    let default_level = if matches!(cli.command, Command::Demo(_)) {
        "warn"
    } else {
        "info"
    };
    #[cfg(not(feature = "demo"))]
    let default_level = "info";
    init_logging(cli.log_format, default_level);
    match run(cli) {
        Ok(exit) => exit.into(),
        // The reader of our output went away (`| head`): nothing more to say, to anyone.
        Err(e) if stdout_closed(&e) => Exit::Success.into(),
        Err(e) => {
            say(&format!("error: {}", db::error_text(e.as_ref())));
            exit_for(&e).into()
        }
    }
}

/// One line of the edge's own on stderr, `tombstoned: ` first (logs go there too; a progress
/// line drawn there is lifted out of its way, as for a log line). When stderr is gone as well
/// there is nowhere left to say so.
fn say(line: &str) {
    let _ = progress::LogWriter.write_all(format!("tombstoned: {line}\n").as_bytes());
}

/// Whether `e` is (or was caused by) standard output's reader going away.
fn stdout_closed(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|cause| cause.downcast_ref::<StdoutError>())
        .any(StdoutError::is_closed_pipe)
}

fn init_logging(format: LogFormat, default_level: &str) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colours only for a person at a terminal, never into journald or a log file.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(progress::LogWriter);
    // Each line carries the current span's ids once tracing is on (log_format).
    match format {
        LogFormat::Text => builder
            .map_event_format(log_format::WithTraceIds::text)
            .finish()
            .with(driver_cap())
            .init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .map_event_format(log_format::WithTraceIds::json)
            .finish()
            .with(driver_cap())
            .init(),
    }
}

/// tokio-postgres logs every statement's parameters at debug level (idempotency keys, request
/// fields, metadata): its events above `info` never reach the log, whatever RUST_LOG says.
fn driver_cap<S: tracing::Subscriber>() -> impl tracing_subscriber::Layer<S> {
    tracing_subscriber::filter::filter_fn(|meta| {
        !(meta.target().starts_with("tokio_postgres") && *meta.level() > tracing::Level::INFO)
    })
}

/// Classifies a failure into the documented exit status by the typed errors in its chain.
pub fn exit_for(e: &anyhow::Error) -> Exit {
    for cause in e.chain() {
        if cause.is::<ConfigError>() || cause.is::<crate::conformance::PlanError>() {
            return Exit::Usage;
        }
        if let Some(e) = cause.downcast_ref::<crate::conformance::ConformanceError>() {
            return match e {
                crate::conformance::ConformanceError::Unreachable { .. } => Exit::Unavailable,
                crate::conformance::ConformanceError::Client(_) => Exit::Software,
            };
        }
        if cause.is::<db::connect::ConnectError>() {
            return Exit::Unavailable;
        }
        // tracing.ca_file or a header the exporter cannot send: the operator's to fix.
        if cause.is::<crate::telemetry::TelemetryError>() {
            return Exit::Usage;
        }
        // Before the database error inside it: a role without the grants is the operator's.
        if let Some(e) = cause.downcast_ref::<crate::keys::KeysError>() {
            return match (e.is_usage(), e.class()) {
                (true, _) => Exit::Usage,
                (false, Some(ErrorClass::Unavailable)) => Exit::Unavailable,
                (false, _) => Exit::Software,
            };
        }
        if let Some(e) = cause.downcast_ref::<crate::outbox::OutboxError>() {
            if e.is_configuration() {
                return Exit::Usage;
            }
        }
        // A grant the operator asked for that cannot be made as asked.
        if let Some(e) = cause.downcast_ref::<crate::operations::OperationsError>() {
            if e.is_usage() {
                return Exit::Usage;
            }
        }
        // cleanup.max_replica_lag with a role that cannot see the lag: the operator's to fix.
        if let Some(e) = cause.downcast_ref::<crate::cleanup::CleanupError>() {
            if e.is_configuration() {
                return Exit::Usage;
            }
        }
        if let Some(db) = cause.downcast_ref::<DbError>() {
            return match db.class() {
                ErrorClass::Unavailable => Exit::Unavailable,
                _ => Exit::Software,
            };
        }
        if let Some(pg) = cause.downcast_ref::<tokio_postgres::Error>() {
            return match db::classify(pg) {
                ErrorClass::Unavailable => Exit::Unavailable,
                _ => Exit::Software,
            };
        }
        // A listener that cannot bind, or an unusable tokens file, is the operator's to fix.
        if cause.is::<crate::daemon::ListenError>() || cause.is::<crate::auth::TokensError>() {
            return Exit::Usage;
        }
        if let Some(crate::ops::listener::OpsServerError::Bind { .. }) = cause.downcast_ref() {
            return Exit::Usage;
        }
        // ApiError::Tokens is transparent: its TokensError is not in the chain of causes.
        if let Some(crate::http::ApiError::Config { .. } | crate::http::ApiError::Tokens(_)) =
            cause.downcast_ref()
        {
            return Exit::Usage;
        }
        if let Some(
            crate::status::StatusError::SchemaNotCurrent(_)
            | crate::status::StatusError::UnsupportedServer(_),
        ) = cause.downcast_ref()
        {
            return Exit::Unavailable;
        }
        if cause.is::<schema::SchemaNotCurrent>() {
            return Exit::Unavailable;
        }
        if let Some(failed) = cause.downcast_ref::<schema::CheckError>() {
            return match failed {
                schema::CheckError::NotCurrent(_) | schema::CheckError::Unsupported(_) => {
                    Exit::Unavailable
                }
                schema::CheckError::Db(db) if db.class() == ErrorClass::Unavailable => {
                    Exit::Unavailable
                }
                schema::CheckError::Db(_) => Exit::Software,
            };
        }

        // The configuration points migrate at a transaction pooler: the operator's to fix.
        if let Some(migrations::MigrationError::TransactionPooler) = cause.downcast_ref() {
            return Exit::Usage;
        }
        if let Some(migrations::MigrationError::Unsupported(_)) = cause.downcast_ref() {
            return Exit::Unavailable;
        }
        #[cfg(feature = "demo")]
        if let Some(crate::pg_cluster::ClusterError::BinariesNotFound { .. }) = cause.downcast_ref()
        {
            return Exit::Unavailable;
        }
    }
    Exit::Software
}

/// `n` and the noun that agrees with it: "1 batch", "0 batches", "2 batches".
pub(crate) fn count(n: impl std::fmt::Display, one: &str, many: &str) -> String {
    let n = n.to_string();
    let noun = if n == "1" { one } else { many };
    format!("{n} {noun}")
}

/// Connects and refuses a server or a schema that is not this binary's (not PostgreSQL 15 or
/// newer; migrations pending, unknown or diverging) in one line, exit 69 as `serve`, before a
/// command's first statement would fail on a missing table. Every failure, a refusal included,
/// is said in the command's own words: `context` first.
async fn require_current_schema(
    db: &crate::config::DatabaseConfig,
    purpose: &'static str,
    context: &'static str,
) -> anyhow::Result<()> {
    connect_current(db, purpose, context).await.map(drop)
}

/// [`require_current_schema`], keeping the session it checked on for the command's work.
async fn connect_current(
    db: &crate::config::DatabaseConfig,
    purpose: &'static str,
    context: &'static str,
) -> anyhow::Result<db::Session> {
    let session = db::connect(db, purpose).await.context(context)?;
    // The command's own words, a refusal included ("cannot list the outbox: 2 migration(s)
    // pending …"): `serve`'s is "refusing to start".
    schema::check(&session.conn(), Needs::MIGRATIONS, None)
        .await
        .map_err(|e| anyhow::Error::new(e).context(context))?;
    Ok(session)
}

/// `work` with traces exported as `[tracing]` says (`cleanup`, `outbox deliver`): started
/// before it, flushed after it within [`crate::telemetry::FLUSH_BOUND`], whatever it returned.
async fn traced(
    config: &Config,
    work: impl std::future::Future<Output = anyhow::Result<Exit>>,
) -> anyhow::Result<Exit> {
    let traces = crate::telemetry::start(&config.tracing, None)?;
    let exit = work.await;
    if let Some(traces) = traces {
        traces.shutdown(crate::telemetry::FLUSH_BOUND).await;
    }
    exit
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The runtime of `cleanup`: one thread. A run is a chain of round trips, each batch sent when
/// the previous one's answer is in, and its workers are futures of one task: nothing runs in
/// parallel on the client. On one thread the answer wakes the engine on the thread that read it
/// (one wake-up per batch; the worker-thread runtime hopped between threads, ~14 context
/// switches per batch, each one a scheduling delay on the critical path of a loaded machine),
/// and no worker threads are started.
fn single_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<Exit> {
    let mut overrides = Vec::new();
    if let Command::Cleanup(args) = &cli.command {
        if let Some(n) = args.batch_size {
            overrides.push(Override {
                section: "cleanup",
                key: "batch_size",
                value: toml::Value::Integer(i64::from(n)),
            });
        }
    }
    if let Command::Generate(args) = &cli.command {
        let mut written = String::new();
        for path in generate::run(<Cli as clap::CommandFactory>::command(), args)? {
            written.push_str(&format!("wrote {}\n", path.display()));
        }
        stdout::print(&written)?;
        return Ok(Exit::Success);
    }
    // A client of any service: no configuration of ours is read.
    if let Command::Conformance(args) = &cli.command {
        return runtime()?.block_on(conformance::run(args));
    }
    #[cfg(feature = "demo")]
    if let Command::Demo(args) = cli.command {
        // The demo makes its own configuration around a throwaway cluster: a --config would be
        // ignored, so it is refused (TOMBSTONED_CONFIG, set for other commands, is not asked of
        // this command line).
        if cli.config_on_command_line {
            say(
                "demo takes no --config: it writes its own configuration around a throwaway \
                 cluster (its `config` line names the file); run the other commands with yours",
            );
            return Ok(Exit::Usage);
        }
        return runtime()?.block_on(demo::run(args));
    }
    let config = Config::load(cli.config.as_deref(), &overrides)?;
    match cli.command {
        Command::CheckConfig => runtime()?.block_on(check_config::run(&config)),
        Command::Migrate(args) => runtime()?.block_on(migrate::run(&config, args)),
        Command::Cleanup(args) => single_thread_runtime()?.block_on(cleanup::run(&config, &args)),
        Command::Serve => runtime()?.block_on(serve::run(config, cli.config)),
        Command::Outbox(command) => runtime()?.block_on(outbox::run(&config, &command)),
        Command::Operations(command) => runtime()?.block_on(operations::run(&config, &command)),
        Command::Status(args) => runtime()?.block_on(status::run(&config, &args)),
        Command::Keys(command) => runtime()?.block_on(keys::run(&config, &command)),
        #[cfg(feature = "demo")]
        Command::Demo(_) => unreachable!("handled above"),
        Command::Generate(_) | Command::Conformance(_) => unreachable!("handled above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn counts_agree_with_their_noun() {
        assert_eq!(count(0_u64, "batch", "batches"), "0 batches");
        assert_eq!(count(1_i64, "batch", "batches"), "1 batch");
        assert_eq!(count(2_usize, "batch", "batches"), "2 batches");
        assert_eq!(
            count(11_u32, "dead letter", "dead letters"),
            "11 dead letters"
        );
        assert_eq!(count(-1_i64, "row", "rows"), "-1 rows");
    }

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every branch of [`exit_for`], and of the quiet end for a closed stdout.
    #[tokio::test]
    async fn every_kind_of_failure_maps_to_its_documented_exit_status() {
        use std::io;

        use crate::auth::TokensError;
        use crate::daemon::ListenError;
        use crate::http::ApiError;
        use crate::ops::listener::OpsServerError;
        #[cfg(feature = "demo")]
        use crate::pg_cluster::ClusterError;

        let io_error = || io::Error::new(io::ErrorKind::AddrInUse, "in use");
        let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
        let tokens_error = || TokensError::Parse {
            path: "tokens.toml".into(),
            message: "x".into(),
        };
        // A real refused connection (nothing listens on port 1) and a client-side error.
        let refused =
            tokio_postgres::connect("host=127.0.0.1 port=1 user=x", tokio_postgres::NoTls)
                .await
                .err()
                .expect("nothing listens on port 1");
        let client_side = "port=nine"
            .parse::<tokio_postgres::Config>()
            .expect_err("not a port");
        let cases: Vec<(&str, anyhow::Error, Exit)> = vec![
            (
                "configuration",
                ConfigError::Invalid {
                    key: "cleanup.batch_size",
                    reason: "x".into(),
                }
                .into(),
                Exit::Usage,
            ),
            (
                "configuration, with context",
                anyhow::Error::new(ConfigError::Invalid {
                    key: "cleanup.batch_size",
                    reason: "x".into(),
                })
                .context("loading"),
                Exit::Usage,
            ),
            (
                "pool wait timeout",
                DbError::Pool(deadpool_postgres::PoolError::Timeout(
                    deadpool_postgres::TimeoutType::Wait,
                ))
                .into(),
                Exit::Unavailable,
            ),
            (
                "pool cannot be built",
                DbError::BuildPool(deadpool_postgres::BuildError::NoRuntimeSpecified).into(),
                Exit::Software,
            ),
            (
                "driver: connection refused",
                anyhow::Error::new(refused).context("checking"),
                Exit::Unavailable,
            ),
            (
                "driver: client-side error",
                client_side.into(),
                Exit::Software,
            ),
            (
                "API listener",
                ListenError {
                    key: "api.listen",
                    addr,
                    source: io_error(),
                }
                .into(),
                Exit::Usage,
            ),
            ("tokens file", tokens_error().into(), Exit::Usage),
            (
                "tokens file, inside the API's error",
                ApiError::Tokens(tokens_error()).into(),
                Exit::Usage,
            ),
            (
                "API setting",
                ApiError::Config {
                    key: "api.default_currency",
                    reason: "x".into(),
                }
                .into(),
                Exit::Usage,
            ),
            (
                "API server",
                ApiError::Serve(io_error()).into(),
                Exit::Software,
            ),
            (
                "metrics listener bind",
                OpsServerError::Bind {
                    addr,
                    source: io_error(),
                }
                .into(),
                Exit::Usage,
            ),
            (
                "metrics listener serve",
                OpsServerError::Serve(io_error()).into(),
                Exit::Software,
            ),
            (
                "schema not current",
                schema::SchemaNotCurrent("1 migration pending".into()).into(),
                Exit::Unavailable,
            ),
            (
                "schema check: not current",
                schema::CheckError::from(schema::SchemaNotCurrent("unknown API".into())).into(),
                Exit::Unavailable,
            ),
            (
                "stdout failed otherwise",
                StdoutError(io::Error::from(io::ErrorKind::StorageFull)).into(),
                Exit::Software,
            ),
            (
                "cleanup.max_replica_lag without pg_monitor",
                anyhow::Error::new(crate::cleanup::CleanupError::ReplicaLagHidden {
                    role: "app".into(),
                })
                .context("checking cleanup.max_replica_lag"),
                Exit::Usage,
            ),
            (
                "conformance: a value it cannot use",
                crate::conformance::PlanError::Concurrency("1".into()).into(),
                Exit::Usage,
            ),
            (
                "conformance: the URL cannot be reached",
                crate::conformance::ConformanceError::Unreachable {
                    url: "http://127.0.0.1:1/".into(),
                    reason: "Connection refused".into(),
                }
                .into(),
                Exit::Unavailable,
            ),
            (
                "keys explain: an intent that is not JSON",
                anyhow::Error::new(crate::keys::KeysError::IntentNotJson("x".into()))
                    .context("cannot explain the key"),
                Exit::Usage,
            ),
            (
                "keys explain: the database did not answer",
                crate::keys::KeysError::Database {
                    step: "reading the key",
                    source: DbError::Timeout {
                        what: "the explain",
                        after: std::time::Duration::from_secs(1),
                    },
                }
                .into(),
                Exit::Unavailable,
            ),
            (
                "tracing: an unusable CA file",
                crate::telemetry::TelemetryError::CaFile {
                    path: "ca.pem".into(),
                    reason: "x".into(),
                }
                .into(),
                Exit::Usage,
            ),
            ("anything else", anyhow::anyhow!("boom"), Exit::Software),
        ];
        // The demo's throwaway cluster (feature `demo`).
        #[cfg(feature = "demo")]
        let cases = {
            let mut cases = cases;
            cases.extend([
                (
                    "no PostgreSQL binaries",
                    anyhow::Error::from(ClusterError::BinariesNotFound {
                        searched: "$PATH".to_owned(),
                    }),
                    Exit::Unavailable,
                ),
                (
                    "other cluster failure",
                    ClusterError::NoUnprivilegedUser.into(),
                    Exit::Software,
                ),
            ]);
            cases
        };
        for (name, error, exit) in &cases {
            assert_eq!(exit_for(error), *exit, "{name}: {error:#}");
            assert!(!stdout_closed(error), "{name}");
        }

        // The reader of stdout went away: quiet success, whatever wraps it.
        let closed = anyhow::Error::new(StdoutError(io::Error::from(io::ErrorKind::BrokenPipe)))
            .context("printing the report");
        assert!(stdout_closed(&closed));
        // A broken pipe to the database is not that.
        let database_pipe = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(!stdout_closed(&database_pipe));
    }
}

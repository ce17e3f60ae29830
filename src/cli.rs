//! The command line: argument parsing, logging set-up, dispatch to the commands, and the mapping
//! of every outcome to a documented exit status.
//!
//! | status | meaning |
//! |---|---|
//! | 0  | success |
//! | 64 | bad usage or configuration (EX_USAGE) |
//! | 69 | database unavailable, or its schema not current (EX_UNAVAILABLE) |
//! | 70 | internal error (EX_SOFTWARE) |
//! | 75 | temporary refusal: `cleanup` found another instance holding the cleanup lease (EX_TEMPFAIL) |
//! | 130 | a second SIGINT/SIGTERM during a graceful stop: exit at once, open transactions roll back |

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{Config, ConfigError, Override};
use crate::db::{self, migrations, DbError, ErrorClass};

/// Exit statuses, after sysexits.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0
    Success = 0,
    /// 64: bad usage or configuration.
    Usage = 64,
    /// 69: the database (or the PostgreSQL installation the demo needs) is unavailable.
    Unavailable = 69,
    /// 70: anything else.
    Software = 70,
    /// 75: try again later (`cleanup` while another instance holds the cleanup lease).
    TempFail = 75,
    /// 130: a second signal ended a graceful stop at once.
    Interrupted = 130,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// tombstoned: idempotency records that stay honest over time.
#[derive(Debug, Parser)]
#[command(name = "tombstoned", version, about, long_about = None)]
pub struct Cli {
    /// Configuration file (TOML). Without one, built-in defaults and TOMBSTONED_* variables apply.
    #[arg(long, global = true, env = "TOMBSTONED_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Log line format on stderr. The level comes from RUST_LOG (default: info).
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
    /// Start a throwaway PostgreSQL and the daemon, and walk through the protocol step by step.
    Demo(DemoArgs),
    /// Write the man pages or the shell completions (for packagers; see `dist/`).
    #[command(hide = true)]
    Generate(crate::generate::GenerateArgs),
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
}

/// `tombstoned migrate`
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// List applied and pending migrations; change nothing.
    #[arg(long)]
    pub status: bool,
}

/// `tombstoned demo`
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Leave the throwaway cluster and daemon running at the end (until Ctrl-C).
    #[arg(long)]
    pub keep: bool,
}

/// Parses the process arguments, runs the command, and returns the exit status.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
    let default_level = if matches!(cli.command, Command::Demo(_)) {
        "warn"
    } else {
        "info"
    };
    init_logging(cli.log_format, default_level);
    match run(cli) {
        Ok(exit) => exit.into(),
        Err(e) => {
            eprintln!("tombstoned: error: {}", one_line(&e));
            exit_for(&e).into()
        }
    }
}

/// The cause chain on one line. A server error contributes its severity, SQLSTATE and message
/// only: its DETAIL can quote row values (keys, tenants), which must not reach logs.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = match cause
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(tokio_postgres::Error::as_db_error)
        {
            Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
            None => cause.to_string(),
        };
        // Wrappers that print their source's text too would repeat it.
        if parts.last().is_some_and(|last| last.ends_with(&text)) {
            continue;
        }
        parts.push(text);
    }
    parts.join(": ").replace('\n', " ")
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
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.finish().with(driver_cap()).init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
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
        if cause.is::<ConfigError>() {
            return Exit::Usage;
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
        if let Some(crate::ops_server::OpsServerError::Bind { .. }) = cause.downcast_ref() {
            return Exit::Usage;
        }
        if let Some(crate::http::ApiError::Config { .. }) = cause.downcast_ref() {
            return Exit::Usage;
        }
        if cause.is::<migrations::SchemaNotCurrent>() {
            return Exit::Unavailable;
        }
        if let Some(crate::pg_cluster::ClusterError::BinariesNotFound) = cause.downcast_ref() {
            return Exit::Unavailable;
        }
    }
    Exit::Software
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
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
        for path in crate::generate::run(<Cli as clap::CommandFactory>::command(), args)? {
            println!("wrote {}", path.display());
        }
        return Ok(Exit::Success);
    }
    if let Command::Demo(args) = cli.command {
        // The demo makes its own configuration around a throwaway cluster.
        return runtime()?.block_on(crate::demo::run(args));
    }
    let config = Config::load(cli.config.as_deref(), &overrides)?;
    match cli.command {
        Command::CheckConfig => check_config(&config),
        Command::Migrate(args) => runtime()?.block_on(migrate(&config, args)),
        Command::Cleanup(args) => runtime()?.block_on(crate::cleanup::command(&config, &args)),
        Command::Serve => runtime()?.block_on(crate::daemon::serve(config, cli.config)),
        Command::Demo(_) | Command::Generate(_) => unreachable!("handled above"),
    }
}

fn check_config(config: &Config) -> anyhow::Result<Exit> {
    let origin = config
        .source
        .as_ref()
        .map_or("built-in defaults and environment".to_owned(), |p| {
            p.display().to_string()
        });
    println!("configuration OK ({origin})");
    println!(
        "database: {} (schema {}, pool {} connections)",
        config.database.url, config.database.schema, config.database.pool_size
    );
    let purge = config.retention.purge_tombstones_after.map_or(
        "off (tombstones are kept forever)".to_owned(),
        |d| {
            format!(
                "after {} (purged keys can be used again)",
                humantime::format_duration(d)
            )
        },
    );
    println!(
        "retention: replay window {}, purge {purge}",
        humantime::format_duration(config.retention.replay_window)
    );
    let c = &config.cleanup;
    println!(
        "cleanup: {}, batches of {}, lock_timeout {}, statement_timeout {}, on_locked {:?}, \
         max_run_time {}",
        if c.enabled { "enabled" } else { "disabled" },
        c.batch_size,
        humantime::format_duration(c.lock_timeout),
        humantime::format_duration(c.statement_timeout),
        c.on_locked,
        humantime::format_duration(c.max_run_time),
    );
    println!(
        "api: {} on {}; metrics on {}",
        if config.api.enabled {
            "enabled"
        } else {
            "disabled"
        },
        config.api.listen,
        config.metrics.listen
    );
    let now = chrono::Utc::now();
    println!(
        "next 5 cleanup runs for {:?} (UTC):",
        c.schedule.expression()
    );
    for t in c.schedule.upcoming(now, 5) {
        let wait = (t - now).to_std().unwrap_or_default();
        let wait = std::time::Duration::from_secs(wait.as_secs());
        println!(
            "  {}  ({}, in {})",
            t.format("%Y-%m-%dT%H:%M:%SZ"),
            t.format("%a"),
            humantime::format_duration(wait)
        );
    }
    Ok(Exit::Success)
}

async fn migrate(config: &Config, args: MigrateArgs) -> anyhow::Result<Exit> {
    if args.status {
        let session = db::connect(&config.database, "migrate").await?;
        let status = migrations::status(&session.client, &config.database.schema).await?;
        for m in &status.applied {
            println!(
                "applied   V{}__{} ({})",
                m.version,
                m.name,
                m.applied_on.as_deref().unwrap_or("?")
            );
        }
        for m in &status.pending {
            println!("pending   V{}__{}", m.version, m.name);
        }
        for m in &status.divergent {
            println!(
                "DIVERGENT V{}__{} (file changed after it was applied)",
                m.version, m.name
            );
        }
        for m in &status.unknown {
            println!(
                "UNKNOWN   V{}__{} (applied by a newer tombstoned)",
                m.version, m.name
            );
        }
        match status.problem() {
            None => println!("schema {} is current", config.database.schema),
            Some(p) => println!("{p}"),
        }
        return Ok(Exit::Success);
    }
    let applied = migrations::migrate(&config.database).await?;
    if applied.is_empty() {
        println!("schema {} is already current", config.database.schema);
    }
    for m in applied {
        println!("applied V{}__{}", m.version, m.name);
    }
    Ok(Exit::Success)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn errors_map_to_documented_exit_codes() {
        let config_error = anyhow::Error::new(ConfigError::Invalid {
            key: "cleanup.batch_size",
            reason: "x".into(),
        });
        assert_eq!(exit_for(&config_error), Exit::Usage);
        let wrapped = config_error.context("loading");
        assert_eq!(exit_for(&wrapped), Exit::Usage);
        assert_eq!(exit_for(&anyhow::anyhow!("boom")), Exit::Software);
    }
}

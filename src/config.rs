//! Configuration: the TOML file, `TOMBSTONED_*` environment overrides and command-line overrides,
//! merged with the defaults and validated once into typed values the rest of the program trusts.
//!
//! Precedence, highest first: command-line flag > environment > file > defaults. The environment
//! names a key as `TOMBSTONED_<SECTION>__<KEY>` (e.g. `TOMBSTONED_CLEANUP__BATCH_SIZE=500`); the
//! database URL, highest first: `TOMBSTONED_DATABASE_URL`, `TOMBSTONED_DATABASE__URL`, the
//! conventional `DATABASE_URL`, the file's `database.url`, the default: any variable wins over the
//! file. Unknown keys, in the file or the environment, are errors that name the key.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::db::conninfo::ConnInfo;
use crate::db::credentials;
use crate::db::Pooler;
use crate::money::{Currency, CurrencyError};
use crate::outbox::settings::{self, RawOutbox};
use crate::schedule::Schedule;
use crate::toml_diagnostic::{describe, Stage};

pub use crate::outbox::settings::{MaxAttempts, OutboxConfig};

/// API semantic versions this build understands; the first is the newest.
pub const SUPPORTED_API_VERSIONS: &[&str] = &["2026-12-01"];

/// Why the configuration could not be loaded. Every variant names the file, variable or key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a key is unknown or has the wrong type.
    #[error("invalid configuration in {origin}: {message}")]
    Parse {
        /// The file, or "the environment and defaults" when there is no file.
        origin: String,
        /// Where (line, column, key) and what kind of mistake; never the line's text or a value,
        /// which may be the database password ([`crate::toml_diagnostic`]).
        message: String,
    },
    /// A `TOMBSTONED_<SECTION>__<KEY>` variable names no configuration key.
    #[error("unknown configuration key `{key}` (from environment variable {var})")]
    UnknownEnvKey {
        /// The environment variable.
        var: String,
        /// The key it maps to.
        key: String,
    },
    /// An environment value does not have the type of its key (the value is not repeated: it
    /// may be a secret set in the wrong variable).
    #[error("environment variable {var}: expected {expected}")]
    BadEnvValue {
        /// The environment variable.
        var: String,
        /// What the key takes.
        expected: &'static str,
    },
    /// A value parsed but is not acceptable.
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// The dotted key, e.g. `cleanup.lock_timeout`.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// Several values are not acceptable: each one's error, section by section, so one
    /// `check-config` names every mistake.
    #[error("{}", several(.0))]
    Several(Vec<ConfigError>),
}

fn several(problems: &[ConfigError]) -> String {
    let all: Vec<String> = problems.iter().map(ToString::to_string).collect();
    format!("{} problems: {}", problems.len(), all.join("; "))
}

/// What validation found wrong so far. A refused value is replaced by its default so the keys
/// after it are still checked; a check that combines keys runs only when they were all valid.
#[derive(Default)]
pub(crate) struct Problems(Vec<ConfigError>);

impl Problems {
    /// The checked value, or `fallback` after recording why it was refused.
    pub(crate) fn take<T>(&mut self, checked: Result<T, ConfigError>, fallback: T) -> T {
        checked.unwrap_or_else(|e| {
            self.0.push(e);
            fallback
        })
    }

    pub(crate) fn push(&mut self, e: ConfigError) {
        self.0.push(e);
    }

    fn count(&self) -> usize {
        self.0.len()
    }

    /// The value when nothing was wrong; one problem as itself; several as [`ConfigError::Several`].
    fn finish<T>(mut self, value: T) -> Result<T, ConfigError> {
        match self.0.len() {
            0 => Ok(value),
            1 => Err(self.0.remove(0)),
            _ => Err(ConfigError::Several(self.0)),
        }
    }
}

/// The validated configuration. [`Config::default`] is what loading no file and no environment
/// gives; each section's defaults are written next to its fields.
///
/// Each field says whether a reload (SIGHUP) applies it or it needs a restart;
/// [`Config::restart_required_changes`] is the one place that decides, and a unit test holds it
/// to these docs.
#[derive(Debug, Clone, Default)]
pub struct Config {
    /// `[database]`
    pub database: DatabaseConfig,
    /// `[retention]`
    pub retention: RetentionConfig,
    /// `[cleanup]`
    pub cleanup: CleanupConfig,
    /// `[api]`
    pub api: ApiConfig,
    /// `[metrics]`
    pub metrics: MetricsConfig,
    /// `[outbox]`. Reload: needs a restart (every key: the relay runs with the settings it
    /// started with).
    pub outbox: OutboxConfig,
    /// The file this was loaded from, if any.
    pub source: Option<PathBuf>,
    /// Where `database.url` came from (`check-config` says it).
    pub database_url_origin: DatabaseUrlOrigin,
}

/// Where `database.url` came from; the variants in precedence order, highest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DatabaseUrlOrigin {
    /// `TOMBSTONED_DATABASE_URL`.
    TombstonedDatabaseUrl,
    /// `TOMBSTONED_DATABASE__URL`, the key's generic variable.
    SectionVariable,
    /// The conventional `DATABASE_URL`.
    DatabaseUrl,
    /// `database.url` in the configuration file.
    File,
    /// Nothing set one: the built-in default.
    #[default]
    Default,
}

impl DatabaseUrlOrigin {
    /// How `check-config` names it: "from DATABASE_URL", "the built-in default", ...
    pub fn describe(self) -> &'static str {
        match self {
            Self::TombstonedDatabaseUrl => "from TOMBSTONED_DATABASE_URL",
            Self::SectionVariable => "from TOMBSTONED_DATABASE__URL",
            Self::DatabaseUrl => "from DATABASE_URL",
            Self::File => "from the file's database.url",
            Self::Default => "the built-in default",
        }
    }
}

/// `[database]`: where the records live. Every key needs a restart: sessions and the pool are
/// opened with them.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// The connection URL or key=value string; printed only redacted.
    /// Default: `postgresql://tombstoned@localhost/app`. Reload: needs a restart.
    pub url: DatabaseUrl,
    /// PostgreSQL schema holding every object tombstoned creates; a plain lower-case identifier.
    /// Default: `tombstoned`. Reload: needs a restart.
    pub schema: String,
    /// Connections in the API pool. Default: 16. Reload: needs a restart.
    pub pool_size: usize,
    /// Bound on establishing one connection, per host (a `connect_timeout` in the URL wins).
    /// Default: 5s. Reload: needs a restart.
    pub connect_timeout: Duration,
    /// `database.password_file`: the password is read from it at each new connection.
    /// Default: none. Reload: needs a restart.
    pub password_file: Option<PathBuf>,
    /// What sits between tombstoned and PostgreSQL: `none`, `session` or `transaction` (a
    /// transaction-mode pooler: unnamed statements only). Default: `none`. Reload: needs a
    /// restart.
    pub pooler: Pooler,
}

/// The default database URL: a local database named like the usual application's.
const DEFAULT_DATABASE_URL: &str = "postgresql://tombstoned@localhost/app";

impl Default for DatabaseConfig {
    fn default() -> Self {
        Self {
            url: DatabaseUrl::parse(DEFAULT_DATABASE_URL)
                .expect("the built-in default URL parses (a unit test checks it)"),
            schema: "tombstoned".into(),
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            password_file: None,
            pooler: Pooler::None,
        }
    }
}

/// `[retention]`: how long responses are replayable, and whether tombstones ever go.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// A stored response is replayable this long after its claim.
    /// Default: 24h. Reload: applied (to claims made after it).
    pub replay_window: Duration,
    /// Delete tombstones this long after they expired, reopening their keys; `None` keeps them.
    /// Default: `off`. Reload: applied (next cleanup run).
    pub purge_tombstones_after: Option<Duration>,
    /// Delete delivered outbox events this long after their delivery; `None` keeps them.
    /// Default: `off`. Reload: applied (next cleanup run).
    pub outbox_keep_delivered: Option<Duration>,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            replay_window: Duration::from_secs(24 * 3600),
            purge_tombstones_after: None,
            outbox_keep_delivered: None,
        }
    }
}

/// What a cleanup batch does with a row another transaction has locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLocked {
    /// Wait for the holder, at most `cleanup.lock_timeout`.
    Wait,
    /// Leave the row for a later run (`SKIP LOCKED`).
    Skip,
}

impl OnLocked {
    /// The value as the file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnLocked::Wait => "wait",
            OnLocked::Skip => "skip",
        }
    }
}

/// `[cleanup]`: the tombstoning worker. Every key is applied by a reload (from the next run;
/// `enabled = false` pauses scheduling, a run in progress finishes).
#[derive(Debug, Clone, PartialEq)]
pub struct CleanupConfig {
    /// Whether `serve` schedules cleanup runs. Default: true. Reload: applied.
    pub enabled: bool,
    /// When runs fire (UTC). Default: `*/5 * * * *`. Reload: applied (next fire time).
    pub schedule: Schedule,
    /// Rows per batch transaction. Default: 1000. Reload: applied.
    pub batch_size: u32,
    /// How long a batch waits for a row lock (FOR SHARE replay readers).
    /// Default: 5s. Reload: applied.
    pub lock_timeout: Duration,
    /// Bound on every statement of a batch. Default: 30s. Reload: applied.
    pub statement_timeout: Duration,
    /// Wait for locked rows or skip them. Default: `wait`. Reload: applied.
    pub on_locked: OnLocked,
    /// A run stops starting batches after this long. Default: 4m. Reload: applied.
    pub max_run_time: Duration,
    /// Sleep between batches, to throttle. Default: 0s. Reload: applied.
    pub pause_between_batches: Duration,
    /// Runs kept in the `cleanup_runs` history (the oldest are deleted as new ones are written).
    /// Default: 100. Reload: applied.
    pub history_runs: u32,
    /// Before each batch, wait while a standby's replay position is more than this many bytes
    /// of WAL behind the primary's (`pg_stat_replication`); `None` never waits. Needs a role
    /// that sees the lag (pg_monitor). Default: `off`. Reload: applied (next run).
    pub max_replica_lag: Option<u64>,
    /// The most rows a run changes per second, the waits spread between batches; `None` is no
    /// cap. Default: `off`. Reload: applied (next run).
    pub max_rows_per_second: Option<u32>,
    /// Sessions that tombstone one run's due rows at once, each over its own slice of the due
    /// deadlines (1..=[`MAX_CLEANUP_WORKERS`]). Default: 1. Reload: applied (next run).
    pub workers: u32,
}

/// The most `cleanup.workers` a run may use: each is a database session of its own (on top of
/// the run's own session and `database.pool_size`), and beyond the server's cores more sessions
/// only contend for them.
pub const MAX_CLEANUP_WORKERS: u32 = 16;

/// The default cleanup schedule: every five minutes.
const DEFAULT_CLEANUP_SCHEDULE: &str = "*/5 * * * *";

impl Default for CleanupConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            schedule: Schedule::parse(DEFAULT_CLEANUP_SCHEDULE)
                .expect("the built-in default schedule parses (a unit test checks it)"),
            batch_size: 1000,
            lock_timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(30),
            on_locked: OnLocked::Wait,
            max_run_time: Duration::from_secs(4 * 60),
            pause_between_batches: Duration::ZERO,
            history_runs: 100,
            max_replica_lag: None,
            max_rows_per_second: None,
            workers: 1,
        }
    }
}

/// `[api]`: the claim/replay HTTP endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiConfig {
    /// Whether `serve` starts the HTTP API. Default: true. Reload: needs a restart.
    pub enabled: bool,
    /// Address the API listens on. Default: `127.0.0.1:8080`. Reload: needs a restart.
    pub listen: SocketAddr,
    /// How long a claim waits on an in-flight owner of the same key before answering 409.
    /// Default: 2s. Reload: applied.
    pub claim_lock_timeout: Duration,
    /// Largest accepted request body. Default: 16384. Reload: applied.
    pub max_body_bytes: usize,
    /// The currency used when a request names none, parsed once at load.
    /// Default: `CNY`. Reload: applied.
    pub default_currency: Currency,
    /// API version used when a request sends no `Api-Version` header.
    /// Default: the newest of [`SUPPORTED_API_VERSIONS`]. Reload: applied.
    pub default_api_version: String,
    /// Sustained requests per second allowed per principal. Default: 50. Reload: applied.
    pub rate_limit_per_second: u32,
    /// Requests a principal may send in a burst. Default: 100. Reload: applied.
    pub rate_limit_burst: u32,
    /// The bearer-token file, resolved against the configuration file's directory.
    /// Default: `tokens.toml`. Reload: applied (and re-read at every reload).
    pub tokens_file: PathBuf,
    /// Open connections the API listener keeps at most. Default: 1024. Reload: needs a restart.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers (and, for a POST, its body).
    /// Default: 10s. Reload: needs a restart.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open without a request. Default: 60s. Reload: needs a
    /// restart.
    pub idle_timeout: Duration,
}

/// The default currency of orders that name none.
const DEFAULT_CURRENCY: &str = "CNY";

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            claim_lock_timeout: Duration::from_secs(2),
            max_body_bytes: 16384,
            default_currency: Currency::parse(DEFAULT_CURRENCY)
                .expect("the built-in default currency exists (a unit test checks it)"),
            default_api_version: SUPPORTED_API_VERSIONS[0].into(),
            rate_limit_per_second: 50,
            rate_limit_burst: 100,
            tokens_file: PathBuf::from("tokens.toml"),
            max_connections: 1024,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// `[metrics]`: the Prometheus and health listener. Every key needs a restart: the listener is
/// bound and configured at start-up.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// Address serving `/metrics`, `/healthz` and `/readyz`.
    /// Default: `127.0.0.1:9187`. Reload: needs a restart.
    pub listen: SocketAddr,
    /// Open connections the metrics listener keeps at most. Default: 64. Reload: needs a
    /// restart.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers. Default: 10s. Reload: needs a
    /// restart.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open without a request. Default: 60s. Reload: needs a
    /// restart.
    pub idle_timeout: Duration,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9187)),
            max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// A database connection string that never prints its password.
#[derive(Clone)]
pub struct DatabaseUrl {
    raw: String,
    conninfo: ConnInfo,
    parsed: tokio_postgres::Config,
}

impl DatabaseUrl {
    /// Parses a `postgresql://` URL or a libpq key=value string, with libpq's grammar and
    /// parameters (see [`crate::db::conninfo`]). The error never quotes a value.
    pub fn parse(raw: &str) -> Result<Self, ConfigError> {
        let conninfo = ConnInfo::parse(raw).map_err(|e| ConfigError::Invalid {
            key: "database.url",
            reason: e.to_string(),
        })?;
        let parsed = crate::db::connect::driver_config(&conninfo);
        Ok(Self {
            raw: raw.to_owned(),
            conninfo,
            parsed,
        })
    }

    /// The parsed connection string.
    pub fn conninfo(&self) -> &ConnInfo {
        &self.conninfo
    }

    /// The startup parameters and hosts as the driver takes them.
    pub fn pg_config(&self) -> &tokio_postgres::Config {
        &self.parsed
    }

    /// The string exactly as configured. Contains the password, if any: never log it.
    pub fn expose(&self) -> &str {
        &self.raw
    }
}

/// Printed from the parsed structure, the password masked whatever its spelling.
impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.conninfo, f)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DatabaseUrl({self})")
    }
}

/// A connection string with its passwords masked, re-printed from its parsed form; a string
/// that does not parse is not shown at all.
pub fn redact_url(raw: &str) -> String {
    match ConnInfo::parse(raw) {
        Ok(c) => c.to_string(),
        Err(_) => "(a connection string that does not parse; not shown)".to_owned(),
    }
}

/// A value set on the command line, which beats every other source.
#[derive(Debug, Clone)]
pub struct Override {
    /// Section name, e.g. `cleanup`.
    pub section: &'static str,
    /// Key name, e.g. `batch_size`.
    pub key: &'static str,
    /// The value, typed as the key is in the file.
    pub value: toml::Value,
}

// ---- raw (file-shaped) configuration -------------------------------------------------------

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawConfig {
    database: RawDatabase,
    retention: RawRetention,
    cleanup: RawCleanup,
    api: RawApi,
    metrics: RawMetrics,
    outbox: RawOutbox,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawDatabase {
    url: String,
    schema: String,
    pool_size: i64,
    connect_timeout: String,
    password_file: String,
    // A string, validated below: a parse error would not be allowed to quote the value.
    pooler: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawRetention {
    replay_window: String,
    purge_tombstones_after: String,
    outbox_keep_delivered: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawCleanup {
    enabled: bool,
    schedule: String,
    batch_size: i64,
    lock_timeout: String,
    statement_timeout: String,
    // A string, validated below: a parse error would not be allowed to quote the value.
    on_locked: String,
    max_run_time: String,
    pause_between_batches: String,
    history_runs: i64,
    // "off" or a size such as "64MB".
    max_replica_lag: String,
    max_rows_per_second: RawLimit,
    workers: i64,
}

/// A limit the file writes as a number or as `"off"` (an environment variable always arrives as
/// text, and is read the same way).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum RawLimit {
    Number(i64),
    Text(String),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawApi {
    enabled: bool,
    listen: String,
    claim_lock_timeout: String,
    max_body_bytes: i64,
    default_currency: String,
    default_api_version: String,
    rate_limit_per_second: i64,
    rate_limit_burst: i64,
    tokens_file: String,
    max_connections: i64,
    header_read_timeout: String,
    idle_timeout: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawMetrics {
    listen: String,
    max_connections: i64,
    header_read_timeout: String,
    idle_timeout: String,
}

/// The raw (file-shaped) defaults are the typed defaults written out as the file would write
/// them: one set of literals, in the typed sections' `Default` impls.
fn duration_text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn optional_duration_text(d: Option<Duration>) -> String {
    d.map_or_else(|| "off".to_owned(), duration_text)
}

fn integer<T: TryInto<i64>>(n: T) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

impl Default for RawDatabase {
    fn default() -> Self {
        let d = DatabaseConfig::default();
        Self {
            url: d.url.expose().to_owned(),
            schema: d.schema,
            pool_size: integer(d.pool_size),
            connect_timeout: duration_text(d.connect_timeout),
            password_file: d
                .password_file
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            pooler: d.pooler.as_str().to_owned(),
        }
    }
}

impl Default for RawRetention {
    fn default() -> Self {
        let d = RetentionConfig::default();
        Self {
            replay_window: duration_text(d.replay_window),
            purge_tombstones_after: optional_duration_text(d.purge_tombstones_after),
            outbox_keep_delivered: optional_duration_text(d.outbox_keep_delivered),
        }
    }
}

impl Default for RawCleanup {
    fn default() -> Self {
        let d = CleanupConfig::default();
        Self {
            enabled: d.enabled,
            schedule: d.schedule.expression().to_owned(),
            batch_size: integer(d.batch_size),
            lock_timeout: duration_text(d.lock_timeout),
            statement_timeout: duration_text(d.statement_timeout),
            on_locked: d.on_locked.as_str().to_owned(),
            max_run_time: duration_text(d.max_run_time),
            pause_between_batches: duration_text(d.pause_between_batches),
            history_runs: integer(d.history_runs),
            max_replica_lag: d
                .max_replica_lag
                .map_or_else(|| "off".to_owned(), byte_size_text),
            max_rows_per_second: d.max_rows_per_second.map_or_else(
                || RawLimit::Text("off".to_owned()),
                |n| RawLimit::Number(integer(n)),
            ),
            workers: integer(d.workers),
        }
    }
}

impl Default for RawApi {
    fn default() -> Self {
        let d = ApiConfig::default();
        Self {
            enabled: d.enabled,
            listen: d.listen.to_string(),
            claim_lock_timeout: duration_text(d.claim_lock_timeout),
            max_body_bytes: integer(d.max_body_bytes),
            default_currency: d.default_currency.code().to_owned(),
            default_api_version: d.default_api_version,
            rate_limit_per_second: integer(d.rate_limit_per_second),
            rate_limit_burst: integer(d.rate_limit_burst),
            tokens_file: d.tokens_file.display().to_string(),
            max_connections: integer(d.max_connections),
            header_read_timeout: duration_text(d.header_read_timeout),
            idle_timeout: duration_text(d.idle_timeout),
        }
    }
}

impl Default for RawMetrics {
    fn default() -> Self {
        let d = MetricsConfig::default();
        Self {
            listen: d.listen.to_string(),
            max_connections: integer(d.max_connections),
            header_read_timeout: duration_text(d.header_read_timeout),
            idle_timeout: duration_text(d.idle_timeout),
        }
    }
}

// ---- loading -------------------------------------------------------------------------------

impl Config {
    /// Loads the configuration from the process environment and an optional file.
    pub fn load(path: Option<&Path>, overrides: &[Override]) -> Result<Self, ConfigError> {
        Self::load_from(path, std::env::vars(), overrides)
    }

    /// Loads the configuration from an explicit environment (tests pass their own).
    pub fn load_from(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &[Override],
    ) -> Result<Self, ConfigError> {
        let (mut table, origin, text) = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                let table: toml::Table =
                    text.parse()
                        .map_err(|e: toml::de::Error| ConfigError::Parse {
                            origin: path.display().to_string(),
                            message: describe(&e, Some(&text), Stage::Syntax).to_string(),
                        })?;
                (table, path.display().to_string(), Some(text))
            }
            None => (
                toml::Table::new(),
                "the environment and defaults".to_owned(),
                None,
            ),
        };
        let database_url_origin = apply_env(&mut table, env)?;
        for o in overrides {
            section_mut(&mut table, o.section).insert(o.key.to_owned(), o.value.clone());
        }
        let raw: RawConfig =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    // Read the file alone again for the line and column when the mistake is in
                    // it; otherwise it came from the environment or a flag: the key says which.
                    let problem = text
                        .as_deref()
                        .and_then(|text| {
                            let e = toml::from_str::<RawConfig>(text).err()?;
                            Some(describe(&e, Some(text), Stage::Types))
                        })
                        .unwrap_or_else(|| describe(&e, None, Stage::Types));
                    ConfigError::Parse {
                        origin,
                        message: problem.to_string(),
                    }
                })?;
        let base_dir = path
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let mut config = validate(raw, &base_dir)?;
        config.source = path.map(Path::to_path_buf);
        config.database_url_origin = database_url_origin;
        Ok(config)
    }

    /// The keys whose value differs in `new` but takes effect only after a restart, in file
    /// order: the database connection (sessions and the pool are opened with it), the listen
    /// addresses (bound at start-up) and whether the API runs at all. Everything else is applied
    /// by a reload; [`Config::reloaded`] keeps exactly these at their running value.
    pub fn restart_required_changes(&self, new: &Config) -> Vec<&'static str> {
        let (old, db) = (self, &self.database);
        [
            ("database.url", db.url.expose() != new.database.url.expose()),
            ("database.schema", db.schema != new.database.schema),
            ("database.pool_size", db.pool_size != new.database.pool_size),
            (
                "database.connect_timeout",
                db.connect_timeout != new.database.connect_timeout,
            ),
            (
                "database.password_file",
                db.password_file != new.database.password_file,
            ),
            ("database.pooler", db.pooler != new.database.pooler),
            ("api.enabled", old.api.enabled != new.api.enabled),
            ("api.listen", old.api.listen != new.api.listen),
            (
                "api.max_connections",
                old.api.max_connections != new.api.max_connections,
            ),
            (
                "api.header_read_timeout",
                old.api.header_read_timeout != new.api.header_read_timeout,
            ),
            (
                "api.idle_timeout",
                old.api.idle_timeout != new.api.idle_timeout,
            ),
            ("metrics.listen", old.metrics.listen != new.metrics.listen),
            (
                "metrics.max_connections",
                old.metrics.max_connections != new.metrics.max_connections,
            ),
            (
                "metrics.header_read_timeout",
                old.metrics.header_read_timeout != new.metrics.header_read_timeout,
            ),
            (
                "metrics.idle_timeout",
                old.metrics.idle_timeout != new.metrics.idle_timeout,
            ),
            ("outbox.*", old.outbox != new.outbox),
        ]
        .into_iter()
        .filter_map(|(key, changed)| changed.then_some(key))
        .collect()
    }

    /// What a reload applies: `new`, except the settings [`Config::restart_required_changes`]
    /// names, which keep their running value (`self`'s) until the restart.
    pub fn reloaded(&self, new: Config) -> Config {
        Config {
            database: self.database.clone(),
            database_url_origin: self.database_url_origin,
            api: ApiConfig {
                enabled: self.api.enabled,
                listen: self.api.listen,
                max_connections: self.api.max_connections,
                header_read_timeout: self.api.header_read_timeout,
                idle_timeout: self.api.idle_timeout,
                ..new.api
            },
            metrics: self.metrics.clone(),
            outbox: self.outbox.clone(),
            ..new
        }
    }
}

fn section_mut<'t>(table: &'t mut toml::Table, section: &str) -> &'t mut toml::Table {
    let entry = table
        .entry(section.to_owned())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if !entry.is_table() {
        // A scalar where a section belongs; replacing it lets deserialisation report the key.
        *entry = toml::Value::Table(toml::Table::new());
    }
    match entry {
        toml::Value::Table(t) => t,
        _ => unreachable!("replaced by a table just above"),
    }
}

/// Applies `TOMBSTONED_<SECTION>__<KEY>` and the database URL variables onto the file's table;
/// answers where `database.url` now comes from.
fn apply_env(
    table: &mut toml::Table,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<DatabaseUrlOrigin, ConfigError> {
    let file_has_url = table
        .get("database")
        .and_then(|d| d.as_table())
        .is_some_and(|d| d.contains_key("url"));
    let mut section_url = false;
    let defaults = toml::Table::try_from(RawConfig::default()).map_err(|e| ConfigError::Parse {
        origin: "built-in defaults".into(),
        message: e.to_string(),
    })?;
    let mut database_url = None;
    let mut generic_url = None;
    // Later entries win, as in a process environment; iterating in name order makes error
    // reports deterministic.
    let vars: std::collections::BTreeMap<String, String> = env.into_iter().collect();
    for (var, value) in vars {
        match var.as_str() {
            "TOMBSTONED_DATABASE_URL" => {
                database_url = Some(value);
                continue;
            }
            "DATABASE_URL" => {
                generic_url = Some(value);
                continue;
            }
            _ => {}
        }
        let Some(rest) = var.strip_prefix("TOMBSTONED_") else {
            continue;
        };
        let Some((section, key)) = rest.split_once("__") else {
            continue; // TOMBSTONED_CONFIG, TOMBSTONED_PG_BIN, ... are not configuration keys
        };
        let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
        section_url |= section == "database" && key == "url";
        let Some(default) = defaults
            .get(&section)
            .and_then(|s| s.as_table())
            .and_then(|s| s.get(&key))
        else {
            return Err(ConfigError::UnknownEnvKey {
                var,
                key: format!("{section}.{key}"),
            });
        };
        let typed = match default {
            toml::Value::Integer(_) => {
                toml::Value::Integer(value.trim().parse().map_err(|_| {
                    ConfigError::BadEnvValue {
                        var: var.clone(),
                        expected: "an integer",
                    }
                })?)
            }
            toml::Value::Float(_) => {
                toml::Value::Float(value.trim().parse().map_err(|_| ConfigError::BadEnvValue {
                    var: var.clone(),
                    expected: "a number",
                })?)
            }
            toml::Value::Boolean(_) => match value.trim() {
                "true" => toml::Value::Boolean(true),
                "false" => toml::Value::Boolean(false),
                _ => {
                    return Err(ConfigError::BadEnvValue {
                        var,
                        expected: "true or false",
                    })
                }
            },
            _ => toml::Value::String(value),
        };
        section_mut(table, &section).insert(key, typed);
    }
    // TOMBSTONED_DATABASE__URL was applied above; TOMBSTONED_DATABASE_URL beats it, and the
    // generic DATABASE_URL beats the file (the environment wins over the file) but not a
    // tombstoned-specific variable.
    let db = section_mut(table, "database");
    Ok(if let Some(url) = database_url {
        db.insert("url".into(), toml::Value::String(url));
        DatabaseUrlOrigin::TombstonedDatabaseUrl
    } else if section_url {
        DatabaseUrlOrigin::SectionVariable
    } else if let Some(url) = generic_url {
        db.insert("url".into(), toml::Value::String(url));
        DatabaseUrlOrigin::DatabaseUrl
    } else if file_has_url {
        DatabaseUrlOrigin::File
    } else {
        DatabaseUrlOrigin::Default
    })
}

// ---- validation ----------------------------------------------------------------------------

/// The longest `retention.replay_window` and `retention.purge_tombstones_after`: 5,000 years.
/// A replay deadline is `now()` plus the window and a purge bound `now()` minus the delay; both
/// must stay inside PostgreSQL's timestamps (4713 BC to 294276 AD; beyond, every claim fails with
/// 22008) and chrono's (up to 262143 AD, for reading them back). 5,000 years keeps both
/// directions inside until the year 6700, without a check that depends on today's date.
pub const MAX_RETENTION: Duration = Duration::from_secs(5_000 * 31_557_600);

/// Every duration setting: humantime syntax, and countable in microseconds by PostgreSQL (a
/// bigint, or an interval's microsecond field), which caps any duration at ~292,000 years.
pub(crate) fn duration(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| ConfigError::Invalid {
        key,
        reason: format!("{text:?} is not a duration ({e}); write e.g. \"250ms\", \"5s\", \"24h\""),
    })?;
    if i64::try_from(d.as_micros()).is_err() {
        return Err(ConfigError::Invalid {
            key,
            reason: format!(
                "{text:?} is longer than PostgreSQL can count in microseconds (~292,000 years)"
            ),
        });
    }
    Ok(d)
}

/// A retention duration: positive and at most [`MAX_RETENTION`].
fn retention_duration(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let d = positive(key, text)?;
    if d > MAX_RETENTION {
        return Err(ConfigError::Invalid {
            key,
            reason: format!(
                "{text:?} is longer than {}: now() plus or minus it must stay inside \
                 PostgreSQL's timestamps (4713 BC to 294276 AD)",
                humantime::format_duration(MAX_RETENTION)
            ),
        });
    }
    Ok(d)
}

/// A duration PostgreSQL will take as a timeout: at least 1 ms (0 would mean "wait forever").
fn timeout(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let d = duration(key, text)?;
    if d < Duration::from_millis(1) {
        return Err(ConfigError::Invalid {
            key,
            reason: format!("{text:?} must be at least 1ms: zero would disable the bound"),
        });
    }
    if d > Duration::from_millis(i32::MAX as u64) {
        return Err(ConfigError::Invalid {
            key,
            reason: format!("{text:?} is longer than PostgreSQL accepts (~24 days)"),
        });
    }
    Ok(d)
}

pub(crate) fn positive(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let d = duration(key, text)?;
    if d.is_zero() {
        return Err(ConfigError::Invalid {
            key,
            reason: "must be greater than zero".into(),
        });
    }
    Ok(d)
}

pub(crate) fn in_range<T: TryFrom<i64>>(
    key: &'static str,
    v: i64,
    min: i64,
    max: i64,
) -> Result<T, ConfigError> {
    if v < min || v > max {
        return Err(ConfigError::Invalid {
            key,
            reason: format!("{v} is outside {min}..={max}"),
        });
    }
    T::try_from(v).map_err(|_| ConfigError::Invalid {
        key,
        reason: format!("{v} does not fit"),
    })
}

/// The units of a byte size, as PostgreSQL's own settings write them (`64MB` in
/// postgresql.conf is 64 × 1024² bytes, so it is here too); the IEC spellings mean the same.
const BYTE_UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("kB", 1 << 10),
    ("KB", 1 << 10),
    ("KiB", 1 << 10),
    ("MB", 1 << 20),
    ("MiB", 1 << 20),
    ("GB", 1 << 30),
    ("GiB", 1 << 30),
    ("TB", 1 << 40),
    ("TiB", 1 << 40),
];

/// A byte size: a whole number and a unit of [`BYTE_UNITS`] (`"64MB"`, `"1GiB"`, `"512kB"`,
/// `"1048576B"`), spaces allowed between them; at least 1 byte. Hand-parsed rather than with a
/// crate: the common ones read `MB` as 10⁶, where a PostgreSQL operator means 2²⁰.
pub(crate) fn byte_size(key: &'static str, text: &str) -> Result<u64, ConfigError> {
    let invalid = |why: &str| ConfigError::Invalid {
        key,
        reason: format!(
            "{text:?} {why}; write a whole number and a unit, e.g. \"64MB\", \"1GB\" (B, kB, \
             MB, GB, TB: powers of 1024, as in postgresql.conf; KiB, MiB, GiB, TiB the same)"
        ),
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let unit = unit.trim_start();
    if digits.is_empty() {
        return Err(invalid("does not start with a number"));
    }
    let Some(&(_, factor)) = BYTE_UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(invalid("has no known unit"));
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        // PostgreSQL computes lag as numeric but we read it as bigint: keep within i64.
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(|| invalid("is too large"))?;
    if bytes == 0 {
        return Err(invalid("must be at least 1 byte"));
    }
    Ok(bytes)
}

/// `"off"`, or a [`byte_size`].
fn optional_byte_size(key: &'static str, text: &str) -> Result<Option<u64>, ConfigError> {
    if text.trim().eq_ignore_ascii_case("off") {
        Ok(None)
    } else {
        byte_size(key, text).map(Some)
    }
}

/// A byte size as the file writes it: the largest unit that divides it exactly (`"64MB"`).
pub fn byte_size_text(bytes: u64) -> String {
    for (unit, factor) in [
        ("TB", 1u64 << 40),
        ("GB", 1 << 30),
        ("MB", 1 << 20),
        ("kB", 1 << 10),
    ] {
        if bytes >= factor && bytes % factor == 0 {
            return format!("{}{unit}", bytes / factor);
        }
    }
    format!("{bytes}B")
}

/// `"off"`, or a whole number in `min..=max` (written as a number or as text).
fn optional_limit<T: TryFrom<i64>>(
    key: &'static str,
    raw: &RawLimit,
    min: i64,
    max: i64,
) -> Result<Option<T>, ConfigError> {
    let n = match raw {
        RawLimit::Number(n) => *n,
        RawLimit::Text(text) if text.trim().eq_ignore_ascii_case("off") => return Ok(None),
        RawLimit::Text(text) => text.trim().parse().map_err(|_| ConfigError::Invalid {
            key,
            reason: format!("{text:?} is neither a whole number nor \"off\""),
        })?,
    };
    in_range(key, n, min, max).map(Some)
}

fn pooler(text: &str) -> Result<Pooler, ConfigError> {
    Pooler::parse(text).ok_or_else(|| ConfigError::Invalid {
        key: "database.pooler",
        reason: format!("{text:?} is not \"none\", \"session\" or \"transaction\""),
    })
}

fn on_locked(text: &str) -> Result<OnLocked, ConfigError> {
    match text {
        "wait" => Ok(OnLocked::Wait),
        "skip" => Ok(OnLocked::Skip),
        _ => Err(ConfigError::Invalid {
            key: "cleanup.on_locked",
            reason: format!("{text:?} is neither \"wait\" nor \"skip\""),
        }),
    }
}

fn socket_addr(key: &'static str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| ConfigError::Invalid {
        key,
        reason: format!("{text:?} is not an IP:port address, e.g. \"127.0.0.1:8080\""),
    })
}

/// `api.default_currency`: an ISO 4217 code with a minor unit, any case, spaces around allowed.
fn default_currency(text: &str) -> Result<Currency, ConfigError> {
    let code = text.trim().to_ascii_uppercase();
    Currency::parse(&code).map_err(|e| ConfigError::Invalid {
        key: "api.default_currency",
        reason: match e {
            CurrencyError::NoMinorUnit => {
                format!("{code} has no minor unit (not a currency orders can use)")
            }
            CurrencyError::Unknown => format!("{text:?} is not an ISO 4217 code"),
        },
    })
}

/// A schema name we can splice into DDL after quoting: lower-case letters, digits, underscores.
fn schema_name(text: &str) -> Result<String, ConfigError> {
    let ok = !text.is_empty()
        && text.len() <= 63
        && text.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !text.starts_with("pg_");
    if ok {
        Ok(text.to_owned())
    } else {
        Err(ConfigError::Invalid {
            key: "database.schema",
            reason: format!(
                "{text:?} must be 1-63 lower-case letters, digits or underscores, \
                 start with a letter or underscore, and not start with pg_"
            ),
        })
    }
}

/// `database.password_file`, resolved against the configuration file's directory, checked
/// now (readable, owner-only, not empty) so a bad file is a configuration error (exit 64). It is
/// read again at each new connection.
fn password_file(text: &str, base_dir: &Path) -> Result<Option<PathBuf>, ConfigError> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    let path = base_dir.join(text);
    credentials::read_password_file(&path).map_err(|e| ConfigError::Invalid {
        key: "database.password_file",
        reason: e.to_string(),
    })?;
    Ok(Some(path))
}

/// The validate step: every raw value checked and typed, every problem gathered.
fn validate(raw: RawConfig, base_dir: &Path) -> Result<Config, ConfigError> {
    let RawConfig {
        database,
        retention,
        cleanup,
        api,
        metrics,
        outbox,
    } = raw;
    let mut problems = Problems::default();
    let p = &mut problems;

    let d = DatabaseConfig::default();
    let url = DatabaseUrl::parse(&database.url);
    let url_ok = url.is_ok();
    let mut database = DatabaseConfig {
        url: p.take(url, d.url),
        schema: p.take(schema_name(&database.schema), d.schema),
        pool_size: p.take(
            in_range("database.pool_size", database.pool_size, 1, 1000),
            d.pool_size,
        ),
        connect_timeout: p.take(
            positive("database.connect_timeout", &database.connect_timeout),
            d.connect_timeout,
        ),
        password_file: p.take(password_file(&database.password_file, base_dir), None),
        pooler: p.take(pooler(&database.pooler), d.pooler),
    };
    if url_ok {
        // A connect_timeout in the URL (libpq's meaning: seconds, at least 2) wins, resolved
        // once here so every bound derived from the timeout agrees with the one connections use.
        if let Some(t) = database.url.conninfo().connect_timeout() {
            database.connect_timeout = t;
        }
        // The TLS files are read now too, so a missing or unreadable certificate is a
        // configuration error; they are read again at each new connection.
        if let Err(e) = crate::db::tls::TlsPlan::resolve(database.url.conninfo())
            .and_then(|plan| plan.client_config(database.url.conninfo()))
        {
            p.push(ConfigError::Invalid {
                key: "database.url",
                reason: e.to_string(),
            });
        }
        if database.password_file.is_some() && database.url.conninfo().password().is_some() {
            p.push(ConfigError::Invalid {
                key: "database.password_file",
                reason: "database.url also holds a password; keep the password in one place \
                         (remove it from the URL)"
                    .into(),
            });
        }
    }

    let d = RetentionConfig::default();
    let purge = retention.purge_tombstones_after.trim();
    let keep_delivered = retention.outbox_keep_delivered.trim();
    let retention = RetentionConfig {
        replay_window: p.take(
            retention_duration("retention.replay_window", &retention.replay_window),
            d.replay_window,
        ),
        purge_tombstones_after: if purge.eq_ignore_ascii_case("off") {
            None
        } else {
            p.take(
                retention_duration("retention.purge_tombstones_after", purge).map(Some),
                d.purge_tombstones_after,
            )
        },
        outbox_keep_delivered: if keep_delivered.eq_ignore_ascii_case("off") {
            None
        } else {
            p.take(
                positive("retention.outbox_keep_delivered", keep_delivered).map(Some),
                d.outbox_keep_delivered,
            )
        },
    };

    let d = CleanupConfig::default();
    let before = p.count();
    let lock_timeout = p.take(
        timeout("cleanup.lock_timeout", &cleanup.lock_timeout),
        d.lock_timeout,
    );
    let statement_timeout = p.take(
        timeout("cleanup.statement_timeout", &cleanup.statement_timeout),
        d.statement_timeout,
    );
    let timeouts_ok = p.count() == before;
    let cleanup = CleanupConfig {
        enabled: cleanup.enabled,
        schedule: p.take(
            Schedule::parse(&cleanup.schedule).map_err(|e| ConfigError::Invalid {
                key: "cleanup.schedule",
                reason: e.to_string(),
            }),
            d.schedule,
        ),
        batch_size: p.take(
            in_range("cleanup.batch_size", cleanup.batch_size, 1, 100_000),
            d.batch_size,
        ),
        lock_timeout,
        statement_timeout,
        on_locked: p.take(on_locked(&cleanup.on_locked), d.on_locked),
        max_run_time: p.take(
            positive("cleanup.max_run_time", &cleanup.max_run_time),
            d.max_run_time,
        ),
        pause_between_batches: p.take(
            duration(
                "cleanup.pause_between_batches",
                &cleanup.pause_between_batches,
            ),
            d.pause_between_batches,
        ),
        history_runs: p.take(
            in_range("cleanup.history_runs", cleanup.history_runs, 1, 100_000),
            d.history_runs,
        ),
        max_replica_lag: p.take(
            optional_byte_size("cleanup.max_replica_lag", &cleanup.max_replica_lag),
            d.max_replica_lag,
        ),
        max_rows_per_second: p.take(
            optional_limit(
                "cleanup.max_rows_per_second",
                &cleanup.max_rows_per_second,
                1,
                10_000_000,
            ),
            d.max_rows_per_second,
        ),
        workers: p.take(
            in_range(
                "cleanup.workers",
                cleanup.workers,
                1,
                i64::from(MAX_CLEANUP_WORKERS),
            ),
            d.workers,
        ),
    };
    if timeouts_ok && cleanup.lock_timeout >= cleanup.statement_timeout {
        p.push(ConfigError::Invalid {
            key: "cleanup.lock_timeout",
            reason: format!(
                "{} must be shorter than cleanup.statement_timeout ({}), or lock waits end as \
                 statement timeouts and the batch cannot isolate the held row",
                humantime::format_duration(cleanup.lock_timeout),
                humantime::format_duration(cleanup.statement_timeout)
            ),
        });
    }

    let d = ApiConfig::default();
    let default_currency = p.take(default_currency(&api.default_currency), d.default_currency);
    if !SUPPORTED_API_VERSIONS.contains(&api.default_api_version.as_str()) {
        p.push(ConfigError::Invalid {
            key: "api.default_api_version",
            reason: format!(
                "{:?} is not a supported version (supported: {})",
                api.default_api_version,
                SUPPORTED_API_VERSIONS.join(", ")
            ),
        });
    }
    let before = p.count();
    let api_listen = p.take(socket_addr("api.listen", &api.listen), d.listen);
    let api_listen_ok = p.count() == before;
    let api = ApiConfig {
        enabled: api.enabled,
        listen: api_listen,
        claim_lock_timeout: p.take(
            timeout("api.claim_lock_timeout", &api.claim_lock_timeout),
            d.claim_lock_timeout,
        ),
        max_body_bytes: p.take(
            in_range("api.max_body_bytes", api.max_body_bytes, 256, 16 << 20),
            d.max_body_bytes,
        ),
        default_currency,
        default_api_version: api.default_api_version,
        rate_limit_per_second: p.take(
            in_range(
                "api.rate_limit_per_second",
                api.rate_limit_per_second,
                1,
                1_000_000,
            ),
            d.rate_limit_per_second,
        ),
        rate_limit_burst: p.take(
            in_range("api.rate_limit_burst", api.rate_limit_burst, 1, 1_000_000),
            d.rate_limit_burst,
        ),
        tokens_file: base_dir.join(&api.tokens_file),
        max_connections: p.take(
            in_range("api.max_connections", api.max_connections, 1, 1_000_000),
            d.max_connections,
        ),
        header_read_timeout: p.take(
            timeout("api.header_read_timeout", &api.header_read_timeout),
            d.header_read_timeout,
        ),
        idle_timeout: p.take(
            timeout("api.idle_timeout", &api.idle_timeout),
            d.idle_timeout,
        ),
    };

    let d = MetricsConfig::default();
    let before = p.count();
    let metrics_listen = p.take(socket_addr("metrics.listen", &metrics.listen), d.listen);
    let metrics_listen_ok = p.count() == before;
    let metrics = MetricsConfig {
        listen: metrics_listen,
        max_connections: p.take(
            in_range(
                "metrics.max_connections",
                metrics.max_connections,
                1,
                1_000_000,
            ),
            d.max_connections,
        ),
        header_read_timeout: p.take(
            timeout("metrics.header_read_timeout", &metrics.header_read_timeout),
            d.header_read_timeout,
        ),
        idle_timeout: p.take(
            timeout("metrics.idle_timeout", &metrics.idle_timeout),
            d.idle_timeout,
        ),
    };
    // Port 0 twice is two ports the OS picks, not one address twice.
    if api_listen_ok
        && metrics_listen_ok
        && api.enabled
        && api.listen == metrics.listen
        && api.listen.port() != 0
    {
        p.push(ConfigError::Invalid {
            key: "metrics.listen",
            reason: format!("{} is also api.listen", metrics.listen),
        });
    }

    let outbox = settings::validate(outbox, base_dir, p);

    problems.finish(Config {
        database,
        retention,
        cleanup,
        api,
        metrics,
        outbox,
        source: None,
        database_url_origin: DatabaseUrlOrigin::Default,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shipped_example_is_valid_and_matches_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tombstoned.toml");
        let c = Config::load_from(Some(&path), env(&[]), &[]).unwrap();
        let d = Config::load_from(None, env(&[]), &[]).unwrap();
        assert_eq!(c.cleanup, d.cleanup);
        assert_eq!(c.retention, d.retention);
        assert_eq!(c.database.schema, "tombstoned");
        assert_eq!(c.database.pool_size, 16);
        assert_eq!(c.cleanup.batch_size, 1000);
        assert_eq!(c.cleanup.schedule.expression(), "*/5 * * * *");
        assert_eq!(c.retention.replay_window, Duration::from_secs(24 * 3600));
        assert_eq!(c.retention.purge_tombstones_after, None);
        assert_eq!(c.retention.outbox_keep_delivered, None);
        assert_eq!(c.outbox, d.outbox);
        assert_eq!(
            c.api.tokens_file,
            path.parent().unwrap().join("tokens.toml")
        );
        assert_eq!(c.api.default_currency.code(), "CNY");
        assert_eq!(c.metrics, d.metrics);
        assert_eq!(
            (
                c.api.max_connections,
                c.api.header_read_timeout,
                c.api.idle_timeout
            ),
            (1024, Duration::from_secs(10), Duration::from_secs(60))
        );
        assert_eq!(
            (
                d.api.max_connections,
                d.api.header_read_timeout,
                d.api.idle_timeout
            ),
            (1024, Duration::from_secs(10), Duration::from_secs(60))
        );
    }

    #[test]
    fn precedence_is_flag_then_env_then_file_then_default() {
        let f = file("[cleanup]\nbatch_size = 10\nlock_timeout = \"1s\"\n");
        let flag = Override {
            section: "cleanup",
            key: "batch_size",
            value: toml::Value::Integer(30),
        };
        let c = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
        assert_eq!(c.cleanup.batch_size, 10, "file beats default");
        assert_eq!(
            c.cleanup.statement_timeout,
            Duration::from_secs(30),
            "default"
        );
        let e = env(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "20")]);
        let c = Config::load_from(Some(f.path()), e.clone(), &[]).unwrap();
        assert_eq!(c.cleanup.batch_size, 20, "env beats file");
        assert_eq!(c.cleanup.lock_timeout, Duration::from_secs(1), "file kept");
        let c = Config::load_from(Some(f.path()), e, &[flag]).unwrap();
        assert_eq!(c.cleanup.batch_size, 30, "flag beats env");
        let twice = env(&[
            ("TOMBSTONED_CLEANUP__BATCH_SIZE", "9"),
            ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ]);
        let c = Config::load_from(None, twice, &[]).unwrap();
        assert_eq!(
            c.cleanup.batch_size, 10,
            "a later entry wins, as in an environment"
        );
    }

    #[test]
    fn database_url_sources() {
        use DatabaseUrlOrigin as O;
        let f = file("[database]\nurl = \"postgresql://file@h/db\"\n");
        let no_url = file("[database]\nschema = \"t\"\n");
        let generic = ("DATABASE_URL", "postgresql://generic@h/db");
        let sectioned = ("TOMBSTONED_DATABASE__URL", "postgresql://sectioned@h/db");
        let specific = ("TOMBSTONED_DATABASE_URL", "postgresql://specific@h/db");
        // Highest first: TOMBSTONED_DATABASE_URL, TOMBSTONED_DATABASE__URL, DATABASE_URL (the
        // environment wins over the file, twelve-factor), the file, the default.
        let default = DEFAULT_DATABASE_URL;
        type Case<'a> = (Option<&'a Path>, &'a [(&'a str, &'a str)], &'a str, O);
        let cases: [Case; 7] = [
            (Some(f.path()), &[], "postgresql://file@h/db", O::File),
            (
                Some(f.path()),
                &[generic],
                "postgresql://generic@h/db",
                O::DatabaseUrl,
            ),
            (
                Some(f.path()),
                &[generic, sectioned],
                "postgresql://sectioned@h/db",
                O::SectionVariable,
            ),
            (
                Some(f.path()),
                &[generic, sectioned, specific],
                "postgresql://specific@h/db",
                O::TombstonedDatabaseUrl,
            ),
            (
                None,
                &[generic],
                "postgresql://generic@h/db",
                O::DatabaseUrl,
            ),
            (None, &[], default, O::Default),
            (Some(no_url.path()), &[], default, O::Default),
        ];
        for (path, pairs, url, origin) in cases {
            let c = Config::load_from(path, env(pairs), &[]).unwrap();
            assert_eq!(c.database.url.expose(), url, "{path:?} {pairs:?}");
            assert_eq!(c.database_url_origin, origin, "{path:?} {pairs:?}");
        }
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let f = file("[cleanup]\nbatchsize = 10\n");
        let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
        assert!(e.to_string().contains("batchsize"), "{e}");
        let f = file("[cleanups]\nbatch_size = 10\n");
        let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
        assert!(e.to_string().contains("cleanups"), "{e}");
        let e = Config::load_from(None, env(&[("TOMBSTONED_CLEANUP__BATCHSIZE", "1")]), &[])
            .unwrap_err();
        assert!(e.to_string().contains("cleanup.batchsize"), "{e}");
        assert!(
            e.to_string().contains("TOMBSTONED_CLEANUP__BATCHSIZE"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (
                "[cleanup]\nlock_timeout = \"5 parsecs\"\n",
                "cleanup.lock_timeout",
            ),
            ("[cleanup]\nlock_timeout = \"0s\"\n", "cleanup.lock_timeout"),
            ("[cleanup]\nlock_timeout = \"1m\"\n", "cleanup.lock_timeout"),
            (
                "[cleanup]\nschedule = \"every 5 minutes\"\n",
                "cleanup.schedule",
            ),
            ("[cleanup]\nschedule = \"* * * * 9\"\n", "cleanup.schedule"),
            ("[cleanup]\nbatch_size = 0\n", "cleanup.batch_size"),
            ("[cleanup]\non_locked = \"maybe\"\n", "maybe"),
            (
                "[retention]\npurge_tombstones_after = \"never\"\n",
                "purge_tombstones_after",
            ),
            (
                "[database]\nschema = \"Robert'); DROP\"\n",
                "database.schema",
            ),
            (
                "[api]\ndefault_currency = \"ZZZ\"\n",
                "api.default_currency",
            ),
            (
                "[api]\ndefault_currency = \"XAU\"\n",
                "api.default_currency",
            ),
            (
                "[api]\ndefault_api_version = \"1999-01-01\"\n",
                "api.default_api_version",
            ),
            ("[api]\nlisten = \"localhost\"\n", "api.listen"),
            ("[api]\nmax_connections = 0\n", "api.max_connections"),
            ("[api]\nidle_timeout = \"0s\"\n", "api.idle_timeout"),
            (
                "[metrics]\nheader_read_timeout = \"0s\"\n",
                "metrics.header_read_timeout",
            ),
            ("[cleanup]\nbatch_size = \"ten\"\n", "batch_size"),
        ];
        for (text, needle) in cases {
            let f = file(text);
            let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
        let e = Config::load_from(
            None,
            env(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "lots")]),
            &[],
        )
        .unwrap_err();
        assert!(e.to_string().contains("expected an integer"), "{e}");
    }

    /// `(key, change)` for every setting, built from typed values: what a reload would see
    /// when exactly that key changed in the file.
    type Change = (&'static str, fn(&mut Config));

    fn one_change_per_key() -> Vec<Change> {
        vec![
            ("database.url", |c| {
                c.database.url = DatabaseUrl::parse("postgresql://other@h/db").unwrap()
            }),
            ("database.schema", |c| c.database.schema = "other".into()),
            ("database.pool_size", |c| c.database.pool_size = 3),
            ("database.connect_timeout", |c| {
                c.database.connect_timeout = Duration::from_secs(9)
            }),
            ("database.password_file", |c| {
                c.database.password_file = Some("/run/pw".into())
            }),
            ("database.pooler", |c| {
                c.database.pooler = Pooler::Transaction
            }),
            ("retention.replay_window", |c| {
                c.retention.replay_window = Duration::from_secs(3600)
            }),
            ("retention.purge_tombstones_after", |c| {
                c.retention.purge_tombstones_after = Some(Duration::from_secs(86400))
            }),
            ("retention.outbox_keep_delivered", |c| {
                c.retention.outbox_keep_delivered = Some(Duration::from_secs(86400))
            }),
            ("cleanup.enabled", |c| c.cleanup.enabled = false),
            ("cleanup.schedule", |c| {
                c.cleanup.schedule = Schedule::parse("0 * * * *").unwrap()
            }),
            ("cleanup.batch_size", |c| c.cleanup.batch_size = 7),
            ("cleanup.history_runs", |c| c.cleanup.history_runs = 3),
            ("cleanup.max_replica_lag", |c| {
                c.cleanup.max_replica_lag = Some(1 << 20)
            }),
            ("cleanup.max_rows_per_second", |c| {
                c.cleanup.max_rows_per_second = Some(100)
            }),
            ("cleanup.workers", |c| c.cleanup.workers = 2),
            ("cleanup.lock_timeout", |c| {
                c.cleanup.lock_timeout = Duration::from_secs(1)
            }),
            ("cleanup.statement_timeout", |c| {
                c.cleanup.statement_timeout = Duration::from_secs(60)
            }),
            ("cleanup.on_locked", |c| {
                c.cleanup.on_locked = OnLocked::Skip
            }),
            ("cleanup.max_run_time", |c| {
                c.cleanup.max_run_time = Duration::from_secs(60)
            }),
            ("cleanup.pause_between_batches", |c| {
                c.cleanup.pause_between_batches = Duration::from_secs(1)
            }),
            ("api.enabled", |c| c.api.enabled = false),
            ("api.listen", |c| {
                c.api.listen = SocketAddr::from(([127, 0, 0, 1], 1))
            }),
            ("api.claim_lock_timeout", |c| {
                c.api.claim_lock_timeout = Duration::from_secs(3)
            }),
            ("api.max_body_bytes", |c| c.api.max_body_bytes = 256),
            ("api.default_currency", |c| {
                c.api.default_currency = Currency::parse("JPY").unwrap()
            }),
            ("api.default_api_version", |c| {
                c.api.default_api_version = "0000-00-00".into()
            }),
            ("api.rate_limit_per_second", |c| {
                c.api.rate_limit_per_second = 1
            }),
            ("api.rate_limit_burst", |c| c.api.rate_limit_burst = 1),
            ("api.tokens_file", |c| {
                c.api.tokens_file = "other.toml".into()
            }),
            ("api.max_connections", |c| c.api.max_connections = 7),
            ("api.header_read_timeout", |c| {
                c.api.header_read_timeout = Duration::from_secs(3)
            }),
            ("api.idle_timeout", |c| {
                c.api.idle_timeout = Duration::from_secs(3)
            }),
            ("metrics.listen", |c| {
                c.metrics.listen = SocketAddr::from(([127, 0, 0, 1], 2))
            }),
            ("metrics.max_connections", |c| c.metrics.max_connections = 7),
            ("metrics.header_read_timeout", |c| {
                c.metrics.header_read_timeout = Duration::from_secs(3)
            }),
            ("metrics.idle_timeout", |c| {
                c.metrics.idle_timeout = Duration::from_secs(3)
            }),
            ("outbox.*", |c| c.outbox.batch_size = 7),
        ]
    }

    /// The keys whose field docs in this file say "Reload: needs a restart", in file order.
    fn documented_restart_keys() -> Vec<String> {
        let source = include_str!("config.rs");
        let mut keys = Vec::new();
        for (section, name) in [
            ("database", "DatabaseConfig"),
            ("retention", "RetentionConfig"),
            ("cleanup", "CleanupConfig"),
            ("api", "ApiConfig"),
            ("metrics", "MetricsConfig"),
            ("config", "Config"),
        ] {
            let start = source.find(&format!("pub struct {name} {{")).unwrap();
            let end = start + source[start..].find("\n}\n").unwrap();
            let mut doc = String::new();
            for line in source[start..end].lines().skip(1) {
                let line = line.trim();
                if let Some(text) = line.strip_prefix("///") {
                    doc.push_str(text);
                    doc.push(' ');
                    continue;
                }
                let Some(field) = line.strip_prefix("pub ").and_then(|l| l.split(':').next())
                else {
                    continue;
                };
                let doc = std::mem::take(&mut doc);
                let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
                if section == "config" {
                    if field == "outbox" {
                        assert!(doc.contains("Reload: needs a restart"), "outbox: {doc}");
                        keys.push("outbox.*".to_owned());
                    }
                    continue;
                }
                assert!(
                    doc.contains("Default: "),
                    "{section}.{field} names no default"
                );
                let restart = doc.contains("Reload: needs a restart");
                assert!(
                    restart || doc.contains("Reload: applied"),
                    "{section}.{field} says neither whether a reload applies it"
                );
                if restart {
                    keys.push(format!("{section}.{field}"));
                }
            }
        }
        keys
    }

    #[test]
    fn restart_required_changes_is_what_the_field_docs_say() {
        let running = Config::default();
        let changes = one_change_per_key();
        let documented = documented_restart_keys();
        assert_eq!(documented.len(), 16, "{documented:?}");
        for (key, change) in &changes {
            let mut new = running.clone();
            change(&mut new);
            let expected: Vec<&str> = if documented.iter().any(|d| d == key) {
                vec![key]
            } else {
                vec![]
            };
            assert_eq!(running.restart_required_changes(&new), expected, "{key}");
            // A reload keeps the restart-only value and applies the rest.
            let applied = running.reloaded(new.clone());
            assert!(
                running.restart_required_changes(&applied).is_empty(),
                "{key}"
            );
            if expected.is_empty() {
                assert_eq!(format!("{applied:?}"), format!("{new:?}"), "{key}");
            }
        }
        // Every field is covered by a change above.
        let fields: usize = documented_field_count();
        assert_eq!(
            changes.len(),
            fields + 1,
            "one change per key, outbox as one"
        );
    }

    fn documented_field_count() -> usize {
        let source = include_str!("config.rs");
        [
            "DatabaseConfig",
            "RetentionConfig",
            "CleanupConfig",
            "ApiConfig",
            "MetricsConfig",
        ]
        .iter()
        .map(|name| {
            let start = source.find(&format!("pub struct {name} {{")).unwrap();
            let end = start + source[start..].find("\n}\n").unwrap();
            source[start..end]
                .lines()
                .filter(|l| l.trim_start().starts_with("pub "))
                .count()
                - 1
        })
        .sum()
    }

    #[test]
    fn a_reload_names_and_keeps_every_restart_only_setting() {
        let running = Config::default();
        let mut new = running.clone();
        let mut restart_keys = Vec::new();
        for (key, change) in one_change_per_key() {
            change(&mut new);
            let mut alone = running.clone();
            change(&mut alone);
            if !running.restart_required_changes(&alone).is_empty() {
                restart_keys.push(key);
            }
        }
        assert_eq!(running.restart_required_changes(&new), restart_keys);
        assert!(running
            .restart_required_changes(&running.clone())
            .is_empty());

        let applied = running.reloaded(new);
        assert!(running.restart_required_changes(&applied).is_empty());
        assert_eq!(applied.cleanup.batch_size, 7);
        assert_eq!(applied.retention.replay_window, Duration::from_secs(3600));
        assert_eq!(applied.api.claim_lock_timeout, Duration::from_secs(3));
        assert_eq!(applied.api.default_currency.code(), "JPY");
    }

    #[test]
    fn loading_nothing_gives_the_typed_defaults() {
        let loaded = Config::load_from(None, env(&[]), &[]).unwrap();
        assert_eq!(format!("{loaded:?}"), format!("{:?}", Config::default()));
        // And the raw defaults read back as the typed ones, key by key, through the same
        // validation a file takes.
        let raw = toml::to_string(&RawConfig::default()).unwrap();
        let f = file(&raw);
        let from_file = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
        let from_file = Config {
            source: None,
            database_url_origin: DatabaseUrlOrigin::Default,
            api: ApiConfig {
                tokens_file: PathBuf::from("tokens.toml"),
                ..from_file.api
            },
            ..from_file
        };
        assert_eq!(format!("{from_file:?}"), format!("{:?}", Config::default()));
    }

    #[test]
    fn validation_names_every_problem_at_once() {
        let f = file(
            "[database]\npool_size = 0\n[cleanup]\nbatch_size = 0\nlock_timeout = \"0s\"\n\
             [api]\ndefault_currency = \"ZZZ\"\nlisten = \"localhost\"\n",
        );
        let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
        let ConfigError::Several(problems) = &e else {
            panic!("{e:?}")
        };
        let keys: Vec<&str> = problems
            .iter()
            .map(|p| match p {
                ConfigError::Invalid { key, .. } => *key,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            keys,
            [
                "database.pool_size",
                "cleanup.lock_timeout",
                "cleanup.batch_size",
                "api.default_currency",
                "api.listen"
            ]
        );
        let shown = e.to_string();
        assert!(
            shown.starts_with("5 problems: invalid value for `database.pool_size`"),
            "{shown}"
        );
        // A combined check does not pile onto a key already refused.
        assert!(
            !shown.contains("shorter than cleanup.statement_timeout"),
            "{shown}"
        );
        // One problem stays the error it always was.
        let f = file("[cleanup]\nbatch_size = 0\n");
        let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Invalid {
                    key: "cleanup.batch_size",
                    ..
                }
            ),
            "{e:?}"
        );
    }

    #[test]
    fn durations_postgresql_cannot_hold_are_refused_naming_the_key() {
        for (text, key) in [
            (
                "[retention]\nreplay_window = \"300000years\"\n",
                "retention.replay_window",
            ),
            (
                "[retention]\nreplay_window = \"5001years\"\n",
                "retention.replay_window",
            ),
            (
                "[retention]\npurge_tombstones_after = \"7000years\"\n",
                "retention.purge_tombstones_after",
            ),
            (
                "[cleanup]\nmax_run_time = \"300000years\"\n",
                "cleanup.max_run_time",
            ),
            (
                "[cleanup]\npause_between_batches = \"300000years\"\n",
                "cleanup.pause_between_batches",
            ),
            (
                "[database]\nconnect_timeout = \"300000years\"\n",
                "database.connect_timeout",
            ),
        ] {
            let f = file(text);
            match Config::load_from(Some(f.path()), env(&[]), &[]) {
                Err(e @ ConfigError::Invalid { .. }) => {
                    assert!(e.to_string().contains(key), "{text:?}: {e}")
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        // The longest accepted retention, in both keys at once.
        let f = file(
            "[retention]\nreplay_window = \"5000years\"\npurge_tombstones_after = \"5000years\"\n",
        );
        let c = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
        assert_eq!(c.retention.replay_window, MAX_RETENTION);
        assert_eq!(c.retention.purge_tombstones_after, Some(MAX_RETENTION));
        // ... and what it means: now() + 5000 years (the deadline PostgreSQL computes) and
        // now() - 5000 years (the purge bound) are inside PostgreSQL's and chrono's range.
        let window = chrono::TimeDelta::from_std(MAX_RETENTION).unwrap();
        let now = chrono::Utc::now();
        use chrono::Datelike as _;
        // PostgreSQL: 4713 BC (year -4712 in chrono's astronomical numbering) to 294276 AD;
        // chrono: up to 262143 AD.
        assert!((now + window).year() < 262_143);
        assert!((now - window).year() > -4712);
    }

    #[test]
    fn parse_errors_never_quote_the_line_or_the_value() {
        let secret = "s3cret-Pa55";
        let texts = [
            // An unterminated string on the url line.
            format!("[database]\nurl = \"postgresql://u:{secret}@db/app\npool_size = 4\n"),
            // No quotes at all.
            format!("[database]\nurl = postgresql://u:{secret}@db/app\n"),
            // A bad escape inside the password.
            format!("[database]\nurl = \"postgresql://u:{secret}\\q@db/app\"\n"),
            // The wrong type for a key.
            format!("[database]\npool_size = \"{secret}\"\n"),
            format!("[database]\nurl = [\"{secret}\"]\n"),
            format!("[cleanup]\non_locked = {{ x = \"{secret}\" }}\n"),
        ];
        for text in &texts {
            let f = file(text);
            let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
            let shown = format!("{e} / {e:?}");
            assert!(!shown.contains(secret), "{text:?}: {shown}");
            assert!(matches!(e, ConfigError::Parse { .. }), "{text:?}: {shown}");
            assert!(shown.contains("line 2, column"), "{text:?}: {shown}");
        }
        let f = file(&texts[0]);
        let e = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("line 2, column 41, key `database.url`: invalid basic string"),
            "{e}"
        );
        // A mistake from the environment names the variable, not its value.
        for var in ["TOMBSTONED_DATABASE__POOL_SIZE", "TOMBSTONED_API__ENABLED"] {
            let e = Config::load_from(None, env(&[(var, secret)]), &[]).unwrap_err();
            assert!(e.to_string().contains(var), "{e}");
            assert!(!format!("{e} {e:?}").contains(secret), "{e}");
        }
    }

    #[test]
    fn byte_sizes_read_as_postgresql_writes_them() {
        let size = |t: &str| byte_size("cleanup.max_replica_lag", t);
        assert_eq!(size("64MB").unwrap(), 64 << 20);
        assert_eq!(size("64 MiB").unwrap(), 64 << 20);
        assert_eq!(size(" 1GB ").unwrap(), 1 << 30);
        assert_eq!(size("1GiB").unwrap(), 1 << 30);
        assert_eq!(size("512kB").unwrap(), 512 << 10);
        assert_eq!(size("2TB").unwrap(), 2 << 40);
        assert_eq!(size("100B").unwrap(), 100);
        for bad in [
            "64",
            "MB",
            "64 mb",
            "0MB",
            "-1MB",
            "1.5GB",
            "64 MB/s",
            "9999999999TB",
            "",
        ] {
            let e = size(bad).unwrap_err().to_string();
            assert!(e.contains("cleanup.max_replica_lag"), "{bad:?}: {e}");
            assert!(e.contains("e.g. \"64MB\""), "{bad:?}: {e}");
        }
        for n in [1u64, 1023, 1024, 64 << 20, 3 << 30, (1 << 40) + 1] {
            let text = byte_size_text(n);
            assert_eq!(size(&text).unwrap(), n, "{text}");
        }
        assert_eq!(byte_size_text(64 << 20), "64MB");
    }

    #[test]
    fn throttle_keys_are_off_by_default_and_read_from_file_and_environment() {
        let d = Config::load_from(None, env(&[]), &[]).unwrap().cleanup;
        assert_eq!((d.max_replica_lag, d.max_rows_per_second), (None, None));
        let f = file("[cleanup]\nmax_replica_lag = \"64MB\"\nmax_rows_per_second = 5000\n");
        let c = Config::load_from(Some(f.path()), env(&[]), &[])
            .unwrap()
            .cleanup;
        assert_eq!(c.max_replica_lag, Some(64 << 20));
        assert_eq!(c.max_rows_per_second, Some(5000));
        let c = Config::load_from(
            Some(f.path()),
            env(&[
                ("TOMBSTONED_CLEANUP__MAX_REPLICA_LAG", "1GB"),
                ("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "off"),
            ]),
            &[],
        )
        .unwrap()
        .cleanup;
        assert_eq!(c.max_replica_lag, Some(1 << 30));
        assert_eq!(c.max_rows_per_second, None);
        let c = Config::load_from(
            None,
            env(&[("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "250")]),
            &[],
        )
        .unwrap()
        .cleanup;
        assert_eq!(c.max_rows_per_second, Some(250));
        let f = file("[cleanup]\nmax_replica_lag = \"off\"\nmax_rows_per_second = \"off\"\n");
        let c = Config::load_from(Some(f.path()), env(&[]), &[])
            .unwrap()
            .cleanup;
        assert_eq!((c.max_replica_lag, c.max_rows_per_second), (None, None));
        for (text, key) in [
            (
                "[cleanup]\nmax_rows_per_second = 0\n",
                "cleanup.max_rows_per_second",
            ),
            (
                "[cleanup]\nmax_rows_per_second = \"fast\"\n",
                "cleanup.max_rows_per_second",
            ),
            (
                "[cleanup]\nmax_replica_lag = \"lots\"\n",
                "cleanup.max_replica_lag",
            ),
        ] {
            let e = Config::load_from(Some(file(text).path()), env(&[]), &[]).unwrap_err();
            assert!(e.to_string().contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn purge_accepts_a_duration() {
        let f = file("[retention]\npurge_tombstones_after = \"400d\"\n");
        let c = Config::load_from(Some(f.path()), env(&[]), &[]).unwrap();
        assert_eq!(
            c.retention.purge_tombstones_after,
            Some(Duration::from_secs(400 * 86400))
        );
    }

    #[test]
    fn passwords_never_print() {
        assert_eq!(
            redact_url("postgresql://u:s3cret@db:5432/app?sslmode=disable"),
            "postgresql://u:***@db:5432/app?sslmode=disable"
        );
        assert_eq!(
            redact_url("host=db user=u password=s3cret dbname=app"),
            "host=db user=u password=*** dbname=app"
        );
        assert_eq!(
            redact_url("postgresql://db/app?user=u&password=s3cret&sslmode=disable"),
            "postgresql://u:***@db/app?sslmode=disable"
        );
        assert!(!redact_url("postgresql://db/app?password=s3cret&x=1").contains("s3cret"));
        for raw in [
            "host=db password = s3cret",
            "host=db password= s3cret",
            "host=db password='s3 cret'",
            "host=db PASSWORD=s3cret",
        ] {
            assert!(!redact_url(raw).contains("s3"), "{raw}");
            let shown = match DatabaseUrl::parse(raw) {
                Ok(url) => format!("{url} {url:?}"),
                Err(e) => e.to_string(),
            };
            assert!(!shown.contains("s3"), "{raw}: {shown}");
        }
        let c = Config::load_from(
            None,
            env(&[("DATABASE_URL", "postgresql://u:s3cret@db/app")]),
            &[],
        )
        .unwrap();
        assert!(!format!("{c:?}").contains("s3cret"));
        assert!(!c.database.url.to_string().contains("s3cret"));
    }
}

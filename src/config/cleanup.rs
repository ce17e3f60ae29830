//! The `[cleanup]` section: the tombstoning worker's schedule, batches, timeouts, throttles and
//! workers; its file shape, defaults and validation.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::Schedule;
use crate::settings::{
    byte_size_text, duration, duration_text, in_range, integer, optional_byte_size,
    optional_duration_text, positive, timeout, ConfigError, Problems,
};

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
    /// Rows per batch transaction; with `batch_time`, the first batch's. Default: 1000.
    /// Reload: applied.
    pub batch_size: u32,
    /// `None` keeps every batch at `batch_size`; a duration aims each batch transaction (its
    /// lock hold) at that long: the next batch takes as many rows as the measured time per row
    /// says fit in it, at most twice the last batch's and at most [`MAX_BATCH_SIZE`].
    /// Default: `off`. Reload: applied (next run).
    pub batch_time: Option<Duration>,
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

/// The most rows one batch takes: the top of `cleanup.batch_size`'s range, and the ceiling a batch
/// sized by `cleanup.batch_time` grows to.
pub const MAX_BATCH_SIZE: u32 = 100_000;

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
            batch_time: None,
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

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawCleanup {
    enabled: bool,
    schedule: String,
    batch_size: i64,
    // "off" or a duration such as "50ms".
    batch_time: String,
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

impl Default for RawCleanup {
    fn default() -> Self {
        let d = CleanupConfig::default();
        Self {
            enabled: d.enabled,
            schedule: d.schedule.expression().to_owned(),
            batch_size: integer(d.batch_size),
            batch_time: optional_duration_text(d.batch_time),
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

/// `"off"`, or a duration of at least 1 ms.
fn optional_timeout(key: &'static str, text: &str) -> Result<Option<Duration>, ConfigError> {
    if text.trim().eq_ignore_ascii_case("off") {
        Ok(None)
    } else {
        timeout(key, text).map(Some)
    }
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

/// The section's validate step (see [`super::Config`]).
pub(super) fn validate(cleanup: RawCleanup, p: &mut Problems) -> CleanupConfig {
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
            in_range(
                "cleanup.batch_size",
                cleanup.batch_size,
                1,
                i64::from(MAX_BATCH_SIZE),
            ),
            d.batch_size,
        ),
        batch_time: p.take(
            optional_timeout("cleanup.batch_time", &cleanup.batch_time),
            d.batch_time,
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
    if let Some(batch_time) = cleanup.batch_time.filter(|_| timeouts_ok) {
        if batch_time >= cleanup.statement_timeout {
            p.push(ConfigError::Invalid {
                key: "cleanup.batch_time",
                reason: format!(
                    "{} must be shorter than cleanup.statement_timeout ({}): a batch aimed at \
                     the statement timeout would be cancelled by it",
                    humantime::format_duration(batch_time),
                    humantime::format_duration(cleanup.statement_timeout)
                ),
            });
        }
    }
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

    cleanup
}

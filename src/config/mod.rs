//! Configuration: the TOML file, `TOMBSTONED_*` environment overrides and command-line overrides,
//! merged with the defaults and validated once into typed values the rest of the program trusts.
//!
//! Precedence, highest first: command-line flag > environment > file > defaults. The environment
//! names a key as `TOMBSTONED_<SECTION>__<KEY>` (e.g. `TOMBSTONED_CLEANUP__BATCH_SIZE=500`); the
//! database URL, highest first: `TOMBSTONED_DATABASE_URL`, `TOMBSTONED_DATABASE__URL`, the
//! conventional `DATABASE_URL`, the file's `database.url`, the default: any variable wins over the
//! file. Unknown keys, in the file or the environment, are errors that name the key.
//!
//! Files, one per section and one for the merge: [`merge`](Config::load_from) (file,
//! environment and flags into one table, [`Override`], [`DatabaseUrlOrigin`]), `retention`,
//! `cleanup`, `api`, `metrics`, `outbox`, `tracing` (each section's type, defaults, file shape and
//! validation), `reload` (what a reload applies); the `[database]` section is the database
//! layer's own ([`crate::db::settings`]), and the validation vocabulary they share is the leaf
//! `crate::settings`. [`Config`] composes the sections and runs their checks in file order,
//! then the ones that combine sections.

use std::path::{Path, PathBuf};

mod api;
mod cleanup;
mod merge;
mod metrics;
mod outbox;
mod reload;
mod retention;
mod tracing;

pub use self::api::{ApiConfig, SUPPORTED_API_VERSIONS};
pub use self::cleanup::{CleanupConfig, OnLocked, MAX_BATCH_SIZE, MAX_CLEANUP_WORKERS};
pub use self::merge::{DatabaseUrlOrigin, Override};
pub use self::metrics::MetricsConfig;
pub(crate) use self::outbox::redacted_endpoint;
pub use self::outbox::{MaxAttempts, OutboxConfig};
pub use self::retention::{RetentionConfig, MAX_RETENTION};
pub use self::tracing::{ExportHeaders, Origin as TracingOrigin, TracingConfig, TracingOrigins};
pub use crate::db::settings::{redact_url, DatabaseConfig, DatabaseUrl};
pub use crate::settings::{byte_size_text, ConfigError};

use self::merge::RawConfig;
use crate::settings::Problems;

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
    /// `[tracing]`. Reload: `sample_ratio` is applied; every other key needs a restart (the
    /// exporter is built when `serve` starts).
    pub tracing: TracingConfig,
    /// The file this was loaded from, if any.
    pub source: Option<PathBuf>,
    /// Where `database.url` came from (`check-config` says it).
    pub database_url_origin: DatabaseUrlOrigin,
    /// Where `tracing.otlp_endpoint` and `tracing.service_name` came from: the file, OpenTelemetry's
    /// standard variables, or the defaults (`check-config` says it).
    pub tracing_origins: TracingOrigins,
}

/// The validate step: every raw value checked and typed, section by section in file order,
/// every problem gathered; then the checks that combine sections.
fn validate(raw: RawConfig, base_dir: &Path) -> Result<Config, ConfigError> {
    let RawConfig {
        database,
        retention,
        cleanup,
        api,
        metrics,
        outbox,
        tracing,
    } = raw;
    let mut problems = Problems::default();
    let p = &mut problems;

    let database = crate::db::settings::validate(database, base_dir, p);
    let retention = retention::validate(retention, p);
    let cleanup = cleanup::validate(cleanup, p);
    let (api, api_listen_ok) = api::validate(api, base_dir, p);
    let (metrics, metrics_listen_ok) = metrics::validate(metrics, p);
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

    let outbox = outbox::validate(outbox, base_dir, p);
    let tracing = tracing::validate(tracing, base_dir, p);

    problems.finish(Config {
        database,
        retention,
        cleanup,
        api,
        metrics,
        outbox,
        tracing,
        source: None,
        database_url_origin: DatabaseUrlOrigin::Default,
        tracing_origins: TracingOrigins::default(),
    })
}

#[cfg(test)]
mod tests;

//! `tombstoned check-config`: the configuration as understood, the roles still holding a
//! transitional grant of the SQL API's operations (when the database answers), and the next five
//! cleanup fire times.

use std::fmt::Write as _;

use crate::config::{Config, DatabaseConfig};
use crate::db;
use crate::exit::Exit;
use crate::stdout;

/// Prints the validated configuration; loading it, the tokens file and the webhook secret was
/// the check. The database is asked one thing, never failing the check: which roles still hold
/// a transitional grant.
pub(super) async fn run(config: &Config) -> anyhow::Result<Exit> {
    let mut out = String::new();
    let origin = config
        .source
        .as_ref()
        .map_or("built-in defaults and environment".to_owned(), |p| {
            p.display().to_string()
        });
    let _ = writeln!(out, "configuration OK ({origin})");
    let _ = writeln!(
        out,
        "database: {} ({}; schema {}, pool {})",
        config.database.url,
        config.database_url_origin.describe(),
        config.database.schema,
        super::count(config.database.pool_size, "connection", "connections")
    );
    for line in db::connection_summary(&config.database) {
        let _ = writeln!(out, "database {line}");
    }
    let _ = writeln!(
        out,
        "sql api: version {} (the functions `tombstoned migrate` installs in schema {}; serve \
         refuses a schema with another version, `tombstoned status` shows the schema's)",
        crate::schema::API_VERSION,
        config.database.schema
    );
    let _ = writeln!(
        out,
        "operations: {}",
        transitional_line(&config.database).await
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
    let _ = writeln!(
        out,
        "retention: replay window {}, purge {purge}",
        humantime::format_duration(config.retention.replay_window)
    );
    let c = &config.cleanup;
    let _ = writeln!(
        out,
        "cleanup: {}, batches of {}, lock_timeout {}, statement_timeout {}, on_locked {}, \
         max_run_time {}",
        if c.enabled { "enabled" } else { "disabled" },
        c.batch_time.map_or_else(
            || c.batch_size.to_string(),
            |target| format!(
                "{} rows at first, then sized to take about {} each (batch_time)",
                c.batch_size,
                humantime::format_duration(target)
            )
        ),
        humantime::format_duration(c.lock_timeout),
        humantime::format_duration(c.statement_timeout),
        c.on_locked.as_str(),
        humantime::format_duration(c.max_run_time),
    );
    let _ = writeln!(
        out,
        "cleanup throttles: max_replica_lag {}, max_rows_per_second {}",
        c.max_replica_lag.map_or("off".to_owned(), |bytes| format!(
            "{} (the role needs pg_monitor to see the lag: checked when serve and cleanup \
             start, which refuse the setting without it)",
            crate::config::byte_size_text(bytes)
        )),
        c.max_rows_per_second
            .map_or("off".to_owned(), |n| format!("{n} rows/s")),
    );
    let _ = if c.workers > 1 {
        writeln!(
            out,
            "cleanup workers: {} ({} database sessions during a run: the run's own and one per \
             worker, besides database.pool_size's)",
            c.workers,
            c.workers + 1,
        )
    } else {
        writeln!(
            out,
            "cleanup workers: 1 (one database session during a run, besides database.pool_size's)"
        )
    };
    let _ = writeln!(
        out,
        "cleanup lease: lasts {} from each renewal (2 x statement_timeout + \
         pause_between_batches + 30s); history keeps {}",
        humantime::format_duration(crate::cleanup::lease_ttl(c)),
        super::count(c.history_runs, "run", "runs"),
    );
    // The tokens file as `serve` reads it (only with the API on): refused the same way, exit 64.
    let api = if config.api.enabled {
        let tokens = crate::auth::TokenSet::load(&config.api.tokens_file)?;
        format!(
            "enabled on {} ({} in {})",
            config.api.listen,
            super::count(tokens.len(), "token", "tokens"),
            config.api.tokens_file.display()
        )
    } else {
        format!("disabled on {}", config.api.listen)
    };
    let _ = writeln!(out, "api: {api}; metrics on {}", config.metrics.listen);
    let _ = writeln!(out, "outbox: {}", super::outbox::check_line(config)?);
    let _ = writeln!(out, "tracing: {}", tracing_line(config)?);
    let now = chrono::Utc::now();
    let _ = writeln!(
        out,
        "next 5 cleanup runs for {:?} (UTC):",
        c.schedule.expression()
    );
    for t in c.schedule.upcoming(now, 5) {
        let wait = (t - now).to_std().unwrap_or_default();
        let wait = std::time::Duration::from_secs(wait.as_secs());
        let _ = writeln!(
            out,
            "  {}  ({}, in {})",
            t.format("%Y-%m-%dT%H:%M:%SZ"),
            t.format("%a"),
            humantime::format_duration(wait)
        );
    }
    stdout::print(&out)?;
    Ok(Exit::Success)
}

/// `[tracing]` as understood: off, or where spans go, as which service, sampled how, with which
/// headers (names only: their values are secrets). Fails (exit 64) on what `serve` would refuse
/// when it starts the exporter: an unusable CA file.
fn tracing_line(config: &Config) -> anyhow::Result<String> {
    let (t, origins) = (&config.tracing, &config.tracing_origins);
    if !t.enabled() {
        return Ok("off (set tracing.otlp_endpoint or OTEL_EXPORTER_OTLP_ENDPOINT to export OpenTelemetry traces)"
            .to_owned());
    }
    crate::telemetry::check(t)?;
    let headers = if t.headers.is_empty() {
        "no headers".to_owned()
    } else {
        format!(
            "{} {} (values not shown)",
            super::count(t.headers.len(), "header", "headers"),
            t.headers.names().join(", ")
        )
    };
    let trust = t.ca_file.as_ref().map_or(String::new(), |ca| {
        format!(", trusting {} alone", ca.display())
    });
    Ok(format!(
        "OTLP/HTTP to {}{} as service {:?}{}, sample ratio {} for new traces (an incoming traceparent's decision is kept), {headers}{trust}",
        t.endpoint_display(),
        origins.endpoint.describe(),
        t.service_name,
        origins.service_name.describe(),
        t.sample_ratio,
    ))
}

/// The roles still holding a transitional grant, or why that was not checked.
async fn transitional_line(database: &DatabaseConfig) -> String {
    let session = match db::connect(database, "check-config").await {
        Ok(session) => session,
        Err(e) => return format!("not checked ({})", db::error_text(&e)),
    };
    match crate::operations::transitional(&session.conn()).await {
        Ok(transitional) => transitional.describe(),
        Err(e) => format!("not checked ({})", db::error_text(&e)),
    }
}

//! What a reload (SIGHUP) applies and what waits for a restart: [`Config::restart_required_changes`]
//! is the one place that decides, and a unit test holds it to the fields' docs.

use super::{ApiConfig, Config, TracingConfig};

impl Config {
    /// The keys whose value differs in `new` but takes effect only after a restart, in file
    /// order: the database connection (sessions and the pool are opened with it), the listen
    /// addresses (bound at start-up), whether the API runs at all, the relay's settings and the
    /// trace exporter's (all but `tracing.sample_ratio`). Everything else is applied
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
            (
                "tracing.otlp_endpoint",
                old.tracing.otlp_endpoint != new.tracing.otlp_endpoint,
            ),
            (
                "tracing.service_name",
                old.tracing.service_name != new.tracing.service_name,
            ),
            (
                "tracing.headers",
                old.tracing.headers != new.tracing.headers,
            ),
            (
                "tracing.ca_file",
                old.tracing.ca_file != new.tracing.ca_file,
            ),
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
            tracing_origins: self.tracing_origins,
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
            tracing: TracingConfig {
                sample_ratio: new.tracing.sample_ratio,
                ..self.tracing.clone()
            },
            ..new
        }
    }
}

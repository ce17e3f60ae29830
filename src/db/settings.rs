//! The `[database]` section: where the records live and how sessions reach them — the URL
//! (printed only redacted), schema, pool size, connect timeout, password file and pooler — its
//! file shape, its defaults and its validation. It is the database layer's own: `db` opens
//! sessions with it, and `config` composes it with the other sections (naming it
//! `config::DatabaseConfig` as well). Every key needs a restart; each is documented in
//! `config/tombstoned.toml`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::conninfo::ConnInfo;
use super::credentials;
use super::Pooler;
use crate::settings::{duration_text, in_range, integer, positive, ConfigError, Problems};

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
pub(crate) const DEFAULT_DATABASE_URL: &str = "postgresql://tombstoned@localhost/app";

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
        let parsed = super::connect::driver_config(&conninfo);
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

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawDatabase {
    url: String,
    schema: String,
    pool_size: i64,
    connect_timeout: String,
    password_file: String,
    // A string, validated below: a parse error would not be allowed to quote the value.
    pooler: String,
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

fn pooler(text: &str) -> Result<Pooler, ConfigError> {
    Pooler::parse(text).ok_or_else(|| ConfigError::Invalid {
        key: "database.pooler",
        reason: format!("{text:?} is not \"none\", \"session\" or \"transaction\""),
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

/// The section's validate step: every value checked and typed, every problem recorded in `p`
/// (a refused value replaced by its default).
pub(crate) fn validate(database: RawDatabase, base_dir: &Path, p: &mut Problems) -> DatabaseConfig {
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
        if let Err(e) = super::tls::TlsPlan::resolve(database.url.conninfo())
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

    database
}

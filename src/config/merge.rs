//! The merge of the sources into one file-shaped table, highest first: command-line flag
//! ([`Override`]) > environment (`TOMBSTONED_<SECTION>__<KEY>`, and the database URL's own
//! variables, [`DatabaseUrlOrigin`]) > file > defaults; then the table read into each section's
//! raw (serde) shape, which [`super::validate`] checks. The one place that knows where a value
//! came from.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::api::RawApi;
use super::cleanup::RawCleanup;
use super::metrics::RawMetrics;
use super::outbox::RawOutbox;
use super::retention::RawRetention;
use super::tracing::{Origin, RawTracing, TracingOrigins};
use super::Config;
use crate::db::settings::RawDatabase;
use crate::settings::ConfigError;
use crate::toml_diagnostic::{describe, Stage};

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

/// The whole file's shape: one raw section each.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) database: RawDatabase,
    pub(super) retention: RawRetention,
    pub(super) cleanup: RawCleanup,
    pub(super) api: RawApi,
    pub(super) metrics: RawMetrics,
    pub(super) outbox: RawOutbox,
    pub(super) tracing: RawTracing,
}

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
        // Later entries win, as in a process environment; in name order, error reports are
        // deterministic.
        let env: std::collections::BTreeMap<String, String> = env.into_iter().collect();
        let database_url_origin = apply_env(&mut table, &env)?;
        let otel = apply_otel_env(&mut table, &env);
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
        let mut config = super::validate(raw, &base_dir)?;
        config.source = path.map(Path::to_path_buf);
        config.database_url_origin = database_url_origin;
        config.tracing_origins = otel;
        Ok(config)
    }
}

/// OpenTelemetry's standard variables, below the file (and its `TOMBSTONED_TRACING__*`
/// variables): `OTEL_EXPORTER_OTLP_ENDPOINT` (the base URL, `/v1/traces` appended, as the
/// specification says for OTLP/HTTP) and `OTEL_SERVICE_NAME`; an empty one counts as unset, as
/// the specification says. Answers where `tracing.otlp_endpoint` and `tracing.service_name` now
/// come from.
fn apply_otel_env(
    table: &mut toml::Table,
    vars: &std::collections::BTreeMap<String, String>,
) -> TracingOrigins {
    let tracing = section_mut(table, "tracing");
    let mut origin = |key: &str, var: &'static str| {
        // An empty value sets nothing, in the file as in the variables.
        if tracing
            .get(key)
            .and_then(toml::Value::as_str)
            .is_some_and(|v| !v.trim().is_empty())
        {
            return Origin::File;
        }
        match vars.get(var).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            Some(value) => {
                tracing.insert(key.to_owned(), toml::Value::String(value.to_owned()));
                Origin::OtelVariable(var)
            }
            None => Origin::Default,
        }
    };
    TracingOrigins {
        endpoint: origin("otlp_endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        service_name: origin("service_name", "OTEL_SERVICE_NAME"),
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
    vars: &std::collections::BTreeMap<String, String>,
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
    for (var, value) in vars.iter().map(|(k, v)| (k.clone(), v.clone())) {
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

//! The vocabulary every settings section validates with: [`ConfigError`] (each variant names
//! the file, variable or key), [`Problems`] (every refused value gathered, so one `check-config`
//! names them all), the value parsers the sections share (durations PostgreSQL can count,
//! timeouts, ranges, byte sizes, addresses) and the file-shaped text of a default. A leaf: it
//! names no module of the crate, so the module that owns a section (`db::settings` the
//! database's, `config/` the others) and `config`'s merge use it without naming each other.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

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

impl ConfigError {
    /// The keys of a `Several` made of `Invalid`s only, in the order reported (the tests'
    /// view of "every problem at once"); panics on any other shape.
    #[cfg(test)]
    pub(crate) fn invalid_keys(&self) -> Vec<&'static str> {
        let ConfigError::Several(problems) = self else {
            panic!("{self:?}")
        };
        problems
            .iter()
            .map(|p| match p {
                ConfigError::Invalid { key, .. } => *key,
                other => panic!("{other:?}"),
            })
            .collect()
    }
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

    pub(crate) fn count(&self) -> usize {
        self.0.len()
    }

    /// The value when nothing was wrong; one problem as itself; several as [`ConfigError::Several`].
    pub(crate) fn finish<T>(mut self, value: T) -> Result<T, ConfigError> {
        match self.0.len() {
            0 => Ok(value),
            1 => Err(self.0.remove(0)),
            _ => Err(ConfigError::Several(self.0)),
        }
    }
}

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

/// A duration PostgreSQL will take as a timeout: at least 1 ms (0 would mean "wait forever").
pub(crate) fn timeout(key: &'static str, text: &str) -> Result<Duration, ConfigError> {
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
pub(crate) fn optional_byte_size(
    key: &'static str,
    text: &str,
) -> Result<Option<u64>, ConfigError> {
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

pub(crate) fn socket_addr(key: &'static str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| ConfigError::Invalid {
        key,
        reason: format!("{text:?} is not an IP:port address, e.g. \"127.0.0.1:8080\""),
    })
}

/// The raw (file-shaped) defaults are the typed defaults written out as the file would write
/// them: one set of literals, in the typed sections' `Default` impls.
pub(crate) fn duration_text(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

pub(crate) fn optional_duration_text(d: Option<Duration>) -> String {
    d.map_or_else(|| "off".to_owned(), duration_text)
}

pub(crate) fn integer<T: TryInto<i64>>(n: T) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

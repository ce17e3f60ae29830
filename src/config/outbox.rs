//! The `[outbox]` configuration section: its file shape, its defaults, and its validation into
//! the typed [`OutboxConfig`] the relay (`crate::outbox`, which reads it from here) trusts.
//! Composed with the other sections by [`crate::config`]; every key is documented in
//! `config/tombstoned.toml`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::settings::{duration, in_range, positive, ConfigError, Problems};

/// How many failed attempts turn a permanently refused event into a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxAttempts {
    /// After this many attempts (counting every attempt of the event, whatever failed).
    Limit(u32),
    /// Never, except on 410 Gone.
    Forever,
}

impl MaxAttempts {
    /// Whether an event refused permanently on its `attempts`-th attempt becomes a dead letter.
    pub fn exhausted(self, attempts: u32) -> bool {
        match self {
            MaxAttempts::Limit(max) => attempts >= max,
            MaxAttempts::Forever => false,
        }
    }
}

impl fmt::Display for MaxAttempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MaxAttempts::Limit(n) => write!(f, "{n}"),
            MaxAttempts::Forever => f.write_str("forever"),
        }
    }
}

/// `[outbox]`: the relay that delivers `outbox_events` to a webhook endpoint. Every key needs a
/// restart of `serve` (the relay runs with the settings it started with); each
/// `tombstoned outbox` command reads them afresh.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxConfig {
    /// Whether `serve` runs the relay. `tombstoned outbox deliver` runs regardless.
    /// Default: false.
    pub enabled: bool,
    /// Where events are POSTed (`http` or `https`); required when enabled. Default: none.
    pub endpoint: Option<Url>,
    /// The file holding the shared `whsec_...` secret, resolved against the configuration
    /// file's directory; required when enabled. Default: none.
    pub secret_file: Option<PathBuf>,
    /// PEM certificates to trust instead of the system roots for an `https` endpoint.
    /// Default: none (the system roots).
    pub ca_file: Option<PathBuf>,
    /// Events leased by one pick transaction. Default: 100.
    pub batch_size: u32,
    /// HTTP deliveries in flight at once. Default: 4.
    pub concurrency: usize,
    /// Bound on one delivery attempt, connect to the end of the response. Default: 10s.
    pub request_timeout: Duration,
    /// How long a pick leases its events; at least twice `request_timeout`. Default: 60s.
    pub lease_duration: Duration,
    /// When a permanently refused event becomes a dead letter. Default: 10.
    pub max_attempts: MaxAttempts,
    /// The delay before the first retry; doubles per attempt. Default: 1s.
    pub backoff_initial: Duration,
    /// The longest delay between attempts. Default: 5m.
    pub backoff_max: Duration,
    /// Up to this fraction of each delay is taken off at random (0 = none, 1 = "full jitter").
    /// Default: 0.2.
    pub backoff_jitter: f64,
    /// How long the relay waits before looking again when nothing was due. Default: 1s.
    pub poll_interval: Duration,
    /// On shutdown, how long deliveries in flight may take before they are abandoned.
    /// Default: 5s.
    pub shutdown_grace: Duration,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            endpoint: None,
            secret_file: None,
            ca_file: None,
            batch_size: 100,
            concurrency: 4,
            request_timeout: Duration::from_secs(10),
            lease_duration: Duration::from_secs(60),
            max_attempts: MaxAttempts::Limit(10),
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(5 * 60),
            backoff_jitter: 0.2,
            poll_interval: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

impl OutboxConfig {
    /// The endpoint without user information, query or fragment (which may carry credentials):
    /// what logs and CLI output show.
    pub fn endpoint_display(&self) -> String {
        self.endpoint
            .as_ref()
            .map_or_else(|| "(not set)".to_owned(), redacted_endpoint)
    }
}

/// `scheme://host:port/path` of `url`, nothing that could be a credential.
pub fn redacted_endpoint(url: &Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(port) => format!("{}://{host}:{port}{}", url.scheme(), url.path()),
        None => format!("{}://{host}{}", url.scheme(), url.path()),
    }
}

/// `max_attempts` as the file has it: an integer, or the string "forever" (a string of digits
/// too, which is how an environment variable arrives).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawMaxAttempts {
    Number(i64),
    Text(String),
}

/// The `[outbox]` section as written in the file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawOutbox {
    enabled: bool,
    endpoint: String,
    secret_file: String,
    ca_file: String,
    batch_size: i64,
    concurrency: i64,
    request_timeout: String,
    lease_duration: String,
    max_attempts: RawMaxAttempts,
    backoff_initial: String,
    backoff_max: String,
    backoff_jitter: f64,
    poll_interval: String,
    shutdown_grace: String,
}

/// The file-shaped defaults, written out from [`OutboxConfig::default`].
impl Default for RawOutbox {
    fn default() -> Self {
        let d = OutboxConfig::default();
        let path = |p: Option<PathBuf>| p.map(|p| p.display().to_string()).unwrap_or_default();
        let text = |d: Duration| humantime::format_duration(d).to_string();
        Self {
            enabled: d.enabled,
            endpoint: d.endpoint.map(|u| u.to_string()).unwrap_or_default(),
            secret_file: path(d.secret_file),
            ca_file: path(d.ca_file),
            batch_size: i64::from(d.batch_size),
            concurrency: i64::try_from(d.concurrency).unwrap_or(i64::MAX),
            request_timeout: text(d.request_timeout),
            lease_duration: text(d.lease_duration),
            // A string so that TOMBSTONED_OUTBOX__MAX_ATTEMPTS=forever is accepted too.
            max_attempts: RawMaxAttempts::Text(d.max_attempts.to_string()),
            backoff_initial: text(d.backoff_initial),
            backoff_max: text(d.backoff_max),
            backoff_jitter: d.backoff_jitter,
            poll_interval: text(d.poll_interval),
            shutdown_grace: text(d.shutdown_grace),
        }
    }
}

fn optional_path(text: &str, base_dir: &Path) -> Option<PathBuf> {
    let text = text.trim();
    (!text.is_empty()).then(|| base_dir.join(text))
}

fn endpoint(text: &str) -> Result<Option<Url>, ConfigError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let invalid = |reason: String| ConfigError::Invalid {
        key: "outbox.endpoint",
        reason,
    };
    // The parser's message never quotes the URL, which may hold a password.
    let url = Url::parse(text).map_err(|e| invalid(format!("not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {:?}: only http and https are supported",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("the URL names no host".into()));
    }
    Ok(Some(url))
}

fn max_attempts(raw: &RawMaxAttempts) -> Result<MaxAttempts, ConfigError> {
    let number = match raw {
        RawMaxAttempts::Number(n) => *n,
        RawMaxAttempts::Text(t) if t.trim().eq_ignore_ascii_case("forever") => {
            return Ok(MaxAttempts::Forever)
        }
        RawMaxAttempts::Text(t) => t.trim().parse().map_err(|_| ConfigError::Invalid {
            key: "outbox.max_attempts",
            reason: format!("{t:?} is neither a number of attempts nor \"forever\""),
        })?,
    };
    Ok(MaxAttempts::Limit(in_range(
        "outbox.max_attempts",
        number,
        1,
        1_000_000,
    )?))
}

/// Validates the section into `problems`, like every other section: a refused value is
/// recorded and replaced by its default so the keys after it are still checked, and a check that
/// combines keys runs only when they were all valid. Relative paths are resolved against
/// `base_dir`.
pub(crate) fn validate(raw: RawOutbox, base_dir: &Path, problems: &mut Problems) -> OutboxConfig {
    let d = OutboxConfig::default();
    let p = problems;
    let request_timeout = positive("outbox.request_timeout", &raw.request_timeout).and_then(|t| {
        if t > Duration::from_secs(3600) {
            Err(ConfigError::Invalid {
                key: "outbox.request_timeout",
                reason: "must be at most 1h".into(),
            })
        } else {
            Ok(t)
        }
    });
    let request_timeout_ok = request_timeout.is_ok();
    let request_timeout = p.take(request_timeout, d.request_timeout);
    let lease_duration = positive("outbox.lease_duration", &raw.lease_duration);
    let lease_duration_ok = lease_duration.is_ok();
    let lease_duration = p.take(lease_duration, d.lease_duration);
    if request_timeout_ok && lease_duration_ok && lease_duration < request_timeout * 2 {
        p.push(ConfigError::Invalid {
            key: "outbox.lease_duration",
            reason: format!(
                "{} must be at least twice outbox.request_timeout ({}): a lease that ran out \
                 while its delivery was still in flight would let another relay send the same \
                 event at the same time",
                humantime::format_duration(lease_duration),
                humantime::format_duration(request_timeout)
            ),
        });
    }
    let backoff_initial = positive("outbox.backoff_initial", &raw.backoff_initial);
    let backoff_initial_ok = backoff_initial.is_ok();
    let backoff_initial = p.take(backoff_initial, d.backoff_initial);
    let backoff_max = positive("outbox.backoff_max", &raw.backoff_max).and_then(|max| {
        if max > Duration::from_secs(7 * 86_400) {
            Err(ConfigError::Invalid {
                key: "outbox.backoff_max",
                reason: "must be at most 7d".into(),
            })
        } else {
            Ok(max)
        }
    });
    let backoff_max_ok = backoff_max.is_ok();
    let backoff_max = p.take(backoff_max, d.backoff_max);
    if backoff_initial_ok && backoff_max_ok && backoff_max < backoff_initial {
        p.push(ConfigError::Invalid {
            key: "outbox.backoff_max",
            reason: format!(
                "{} is shorter than outbox.backoff_initial ({})",
                humantime::format_duration(backoff_max),
                humantime::format_duration(backoff_initial)
            ),
        });
    }
    let backoff_jitter = if (0.0..=1.0).contains(&raw.backoff_jitter) {
        raw.backoff_jitter
    } else {
        p.push(ConfigError::Invalid {
            key: "outbox.backoff_jitter",
            reason: format!("{} is outside 0.0..=1.0", raw.backoff_jitter),
        });
        d.backoff_jitter
    };
    let endpoint = p.take(endpoint(&raw.endpoint), d.endpoint.clone());
    let config = OutboxConfig {
        enabled: raw.enabled,
        secret_file: optional_path(&raw.secret_file, base_dir),
        ca_file: optional_path(&raw.ca_file, base_dir),
        batch_size: p.take(
            in_range("outbox.batch_size", raw.batch_size, 1, 10_000),
            d.batch_size,
        ),
        concurrency: p.take(
            in_range("outbox.concurrency", raw.concurrency, 1, 256),
            d.concurrency,
        ),
        request_timeout,
        lease_duration,
        max_attempts: p.take(max_attempts(&raw.max_attempts), d.max_attempts),
        backoff_initial,
        backoff_max,
        backoff_jitter,
        poll_interval: p.take(
            positive("outbox.poll_interval", &raw.poll_interval),
            d.poll_interval,
        ),
        shutdown_grace: p.take(
            duration("outbox.shutdown_grace", &raw.shutdown_grace),
            d.shutdown_grace,
        ),
        endpoint,
    };
    // Only a missing endpoint is reported here: one that was refused above already was.
    if config.enabled && config.endpoint.is_none() && raw.endpoint.trim().is_empty() {
        p.push(ConfigError::Invalid {
            key: "outbox.endpoint",
            reason: "required when outbox.enabled = true".into(),
        });
    }
    if config.enabled && config.secret_file.is_none() {
        p.push(ConfigError::Invalid {
            key: "outbox.secret_file",
            reason: "required when outbox.enabled = true".into(),
        });
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::io::Write;

    fn load(text: &str) -> Result<OutboxConfig, ConfigError> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        Config::load_from(Some(f.path()), Vec::new(), &[]).map(|c| c.outbox)
    }

    #[test]
    fn defaults_are_off_and_need_no_endpoint() {
        let c = Config::load_from(None, Vec::new(), &[]).unwrap().outbox;
        assert!(!c.enabled);
        assert_eq!(c.endpoint, None);
        assert_eq!(c.max_attempts, MaxAttempts::Limit(10));
        assert_eq!(c.lease_duration, Duration::from_secs(60));
        assert_eq!(c.endpoint_display(), "(not set)");
    }

    #[test]
    fn nonsense_is_refused_naming_the_key() {
        let cases = [
            (
                "[outbox]\nenabled = true\nsecret_file = \"s\"\n",
                "outbox.endpoint",
            ),
            (
                "[outbox]\nenabled = true\nendpoint = \"https://h/\"\n",
                "outbox.secret_file",
            ),
            ("[outbox]\nendpoint = \"ftp://h/x\"\n", "outbox.endpoint"),
            ("[outbox]\nendpoint = \"not a url\"\n", "outbox.endpoint"),
            (
                "[outbox]\nrequest_timeout = \"40s\"\nlease_duration = \"60s\"\n",
                "outbox.lease_duration",
            ),
            ("[outbox]\nmax_attempts = 0\n", "outbox.max_attempts"),
            (
                "[outbox]\nmax_attempts = \"often\"\n",
                "outbox.max_attempts",
            ),
            ("[outbox]\nbackoff_jitter = 1.5\n", "outbox.backoff_jitter"),
            (
                "[outbox]\nbackoff_initial = \"10s\"\nbackoff_max = \"1s\"\n",
                "outbox.backoff_max",
            ),
            ("[outbox]\nconcurrency = 0\n", "outbox.concurrency"),
            ("[outbox]\nbatch_size = 0\n", "outbox.batch_size"),
            ("[outbox]\npoll_interval = \"0s\"\n", "outbox.poll_interval"),
            ("[outbox]\nfrobnicate = 1\n", "frobnicate"),
        ];
        for (text, needle) in cases {
            let e = load(text).unwrap_err();
            assert!(e.to_string().contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn max_attempts_takes_a_number_or_forever_from_the_file_and_the_environment() {
        assert_eq!(
            load("[outbox]\nmax_attempts = 3\n").unwrap().max_attempts,
            MaxAttempts::Limit(3)
        );
        assert_eq!(
            load("[outbox]\nmax_attempts = \"forever\"\n")
                .unwrap()
                .max_attempts,
            MaxAttempts::Forever
        );
        let env = |v: &str| {
            Config::load_from(
                None,
                vec![("TOMBSTONED_OUTBOX__MAX_ATTEMPTS".to_owned(), v.to_owned())],
                &[],
            )
            .map(|c| c.outbox.max_attempts)
        };
        assert_eq!(env("forever").unwrap(), MaxAttempts::Forever);
        assert_eq!(env("7").unwrap(), MaxAttempts::Limit(7));
        assert!(MaxAttempts::Limit(3).exhausted(3));
        assert!(!MaxAttempts::Limit(3).exhausted(2));
        assert!(!MaxAttempts::Forever.exhausted(u32::MAX));
    }

    #[test]
    fn jitter_comes_from_the_environment_as_a_number() {
        let c = Config::load_from(
            None,
            vec![(
                "TOMBSTONED_OUTBOX__BACKOFF_JITTER".to_owned(),
                "0.5".to_owned(),
            )],
            &[],
        )
        .unwrap();
        assert_eq!(c.outbox.backoff_jitter, 0.5);
    }

    #[test]
    fn paths_are_relative_to_the_file_and_the_endpoint_prints_without_credentials() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(
            b"[outbox]\nenabled = true\nendpoint = \"https://u:pw@hooks.example:8443/in?token=x\"\n\
              secret_file = \"secret\"\nca_file = \"/etc/ca.pem\"\n",
        )
        .unwrap();
        let c = Config::load_from(Some(f.path()), Vec::new(), &[])
            .unwrap()
            .outbox;
        assert_eq!(
            c.secret_file.unwrap(),
            f.path().parent().unwrap().join("secret")
        );
        assert_eq!(c.ca_file.unwrap(), PathBuf::from("/etc/ca.pem"));
        assert_eq!(
            redacted_endpoint(c.endpoint.as_ref().unwrap()),
            "https://hooks.example:8443/in"
        );
    }

    #[test]
    fn every_outbox_problem_is_reported_at_once() {
        let e = load(
            "[outbox]\nenabled = true\nbatch_size = 0\nbackoff_jitter = 1.5\n\
             request_timeout = \"40s\"\nlease_duration = \"60s\"\n",
        )
        .unwrap_err();
        let keys = e.invalid_keys();
        assert_eq!(
            keys,
            [
                "outbox.lease_duration",
                "outbox.backoff_jitter",
                "outbox.batch_size",
                "outbox.endpoint",
                "outbox.secret_file",
            ]
        );
        // With the other sections' problems, in one list.
        let e = load("[cleanup]\nbatch_size = 0\n[outbox]\nconcurrency = 0\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("2 problems: invalid value for `cleanup.batch_size`"),
            "{e}"
        );
        assert!(e.to_string().contains("outbox.concurrency"), "{e}");
        // A refused endpoint is not also reported as missing.
        let e = load("[outbox]\nenabled = true\nendpoint = \"ftp://h/\"\nsecret_file = \"s\"\n")
            .unwrap_err();
        assert!(
            matches!(
                e,
                ConfigError::Invalid {
                    key: "outbox.endpoint",
                    ..
                }
            ),
            "{e}"
        );
    }
}

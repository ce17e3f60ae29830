//! The `[api]` section: the claim/replay HTTP endpoint's listener, limits and defaults; its file
//! shape, defaults and validation.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::money::{Currency, CurrencyError};
use crate::settings::{
    duration_text, in_range, integer, socket_addr, timeout, ConfigError, Problems,
};

/// API semantic versions this build understands; the first is the newest.
pub const SUPPORTED_API_VERSIONS: &[&str] = &["2026-12-01"];

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

#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawApi {
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

/// The section's validate step (see [`super::Config`]), and whether `api.listen` itself was
/// valid (the check that combines it with `metrics.listen` runs only then).
pub(super) fn validate(api: RawApi, base_dir: &Path, p: &mut Problems) -> (ApiConfig, bool) {
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

    (api, api_listen_ok)
}

//! libpq connection strings: both forms libpq accepts (`postgresql://` URLs and `key=value`
//! strings), parsed with libpq's grammar and meaning into [`ConnInfo`], and printed back from
//! that structure with the password masked (never by rewriting the raw text).
//!
//! Parse errors name the parameter and never quote a value that could be a password.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::{percent_decode_str, utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// Why a connection string was refused. The texts name the parameter, never a secret value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnInfoError {
    /// A `key=value` string has a key without `=`.
    #[error("missing \"=\" after {0} in the connection string")]
    MissingEquals(String),
    /// A single-quoted value is not closed.
    #[error("unterminated quoted string in the connection string")]
    UnterminatedQuote,
    /// A parameter libpq does not know (libpq refuses them too; names are lower-case).
    #[error("unknown connection parameter \"{key}\"{hint}")]
    UnknownKey {
        /// The key as written (shown only when it looks like a parameter name).
        key: String,
        /// A suggestion, or empty.
        hint: String,
    },
    /// A parameter libpq knows but tombstoned does not implement.
    #[error("connection parameter \"{key}\" is not supported by tombstoned{why}")]
    Unsupported {
        /// The key.
        key: &'static str,
        /// Why, or empty.
        why: String,
    },
    /// A value that is not one the parameter takes.
    #[error("invalid value for connection parameter \"{key}\": {reason}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// Why (quotes the value only for parameters that cannot hold a secret).
        reason: String,
    },
    /// A URL that does not follow libpq's URI syntax (or a string with a NUL character).
    #[error("invalid connection string: {0}")]
    BadUrl(String),
    /// Parameters that contradict each other.
    #[error("{0}")]
    Inconsistent(String),
}

/// A secret string (password): compared and cloned like a string, never printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// What libpq's `sslmode` means (see the README's "Connecting to PostgreSQL").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// Plaintext first; TLS if the server refuses plaintext.
    Allow,
    /// TLS if the server offers it, plaintext otherwise (the default).
    Prefer,
    /// TLS, certificate not checked (unless a root certificate is configured: then verify-ca).
    Require,
    /// TLS, certificate chain checked against the root certificates, host name not.
    VerifyCa,
    /// TLS, chain and host name checked.
    VerifyFull,
}

impl SslMode {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    fn parse(v: &str) -> Option<Self> {
        Some(match v {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `sslrootcert`: a PEM file, or the operating system's roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of CA certificates.
    File(PathBuf),
    /// `system`: the operating system's trusted roots.
    System,
}

/// `channel_binding` (SCRAM-SHA-256-PLUS over TLS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelBinding {
    /// Never.
    Disable,
    /// When TLS and the server offer it (the default).
    Prefer,
    /// Fail unless the server authenticates with channel binding.
    Require,
}

impl ChannelBinding {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelBinding::Disable => "disable",
            ChannelBinding::Prefer => "prefer",
            ChannelBinding::Require => "require",
        }
    }
}

/// `target_session_attrs`: which servers of a multi-host list are acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetSessionAttrs {
    /// Any server (the default).
    Any,
    /// `SHOW transaction_read_only` is off.
    ReadWrite,
    /// `SHOW transaction_read_only` is on.
    ReadOnly,
    /// Not in recovery.
    Primary,
    /// In recovery.
    Standby,
    /// A standby if any answers, else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    /// The libpq spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }
}

/// `load_balance_hosts`: try hosts in order, or shuffled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadBalanceHosts {
    /// In the order written (the default).
    Disable,
    /// In a random order, per connection.
    Random,
}

/// A TLS protocol version for `ssl_min_protocol_version` / `ssl_max_protocol_version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// `TLSv1` (rustls speaks 1.2 and 1.3 only).
    V1_0,
    /// `TLSv1.1`.
    V1_1,
    /// `TLSv1.2`.
    V1_2,
    /// `TLSv1.3`.
    V1_3,
}

impl TlsVersion {
    fn parse(v: &str) -> Option<Self> {
        Some(match v {
            "TLSv1" => TlsVersion::V1_0,
            "TLSv1.1" => TlsVersion::V1_1,
            "TLSv1.2" => TlsVersion::V1_2,
            "TLSv1.3" => TlsVersion::V1_3,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            TlsVersion::V1_0 => "TLSv1",
            TlsVersion::V1_1 => "TLSv1.1",
            TlsVersion::V1_2 => "TLSv1.2",
            TlsVersion::V1_3 => "TLSv1.3",
        }
    }
}

/// Which of libpq's two forms a string was written in (it is printed back in the same form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `postgresql://...` or `postgres://...`.
    Url,
    /// `key=value ...`.
    KeyValue,
}

/// Where one connection attempt goes: a TCP host or a Unix-socket directory, and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// What to connect to.
    pub host: HostKind,
    /// `hostaddr`: the IP address to connect to instead of resolving `host`.
    pub hostaddr: Option<IpAddr>,
    /// The port (also names the Unix socket file).
    pub port: u16,
}

/// A host: a name or address reached over TCP, or a directory holding a Unix socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostKind {
    /// A host name or IP address.
    Tcp(String),
    /// A Unix-socket directory (a `host` starting with `/`, or no host at all).
    Unix(PathBuf),
}

impl Target {
    /// The name certificates are checked against, pgpass is matched with, and errors show:
    /// the host, else the hostaddr.
    pub fn name(&self) -> String {
        match (&self.host, self.hostaddr) {
            (HostKind::Tcp(h), _) if !h.is_empty() => h.clone(),
            (_, Some(addr)) => addr.to_string(),
            (HostKind::Tcp(h), None) => h.clone(),
            (HostKind::Unix(dir), None) => dir.display().to_string(),
        }
    }

    /// The Unix socket file, for a Unix target.
    pub fn socket_path(&self) -> Option<PathBuf> {
        match (&self.host, self.hostaddr) {
            (HostKind::Unix(dir), None) => Some(dir.join(format!(".s.PGSQL.{}", self.port))),
            _ => None,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(path) = self.socket_path() {
            return write!(f, "{}", path.display());
        }
        let name = self.name();
        if name.contains(':') {
            write!(f, "[{name}]:{}", self.port)
        } else {
            write!(f, "{name}:{}", self.port)
        }
    }
}

/// The Unix-socket directory used when no host is given, as libpq's Debian build does
/// (`/var/run/postgresql`); upstream's `/tmp` when that directory does not exist.
pub fn default_socket_dir() -> PathBuf {
    let debian = PathBuf::from("/var/run/postgresql");
    if debian.is_dir() {
        debian
    } else {
        PathBuf::from("/tmp")
    }
}

/// libpq's default port.
pub const DEFAULT_PORT: u16 = 5432;

/// A parsed connection string. Every field keeps whether the parameter was given, so it
/// prints back as written (in canonical order) and defaults are applied where it is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    form: Form,
    p: Params,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Params {
    host: Option<Vec<String>>,
    hostaddr: Option<Vec<Option<IpAddr>>>,
    port: Option<Vec<Option<u16>>>,
    user: Option<String>,
    password: Option<Secret>,
    passfile: Option<PathBuf>,
    dbname: Option<String>,
    application_name: Option<String>,
    fallback_application_name: Option<String>,
    connect_timeout: Option<i64>,
    options: Option<String>,
    client_encoding: Option<String>,
    sslmode: Option<SslMode>,
    sslrootcert: Option<RootCert>,
    sslcert: Option<PathBuf>,
    sslkey: Option<PathBuf>,
    sslpassword: Option<Secret>,
    sslsni: Option<bool>,
    sslcompression: Option<bool>,
    ssl_min_protocol_version: Option<TlsVersion>,
    ssl_max_protocol_version: Option<Option<TlsVersion>>,
    sslnegotiation: Option<()>,
    gssencmode: Option<&'static str>,
    channel_binding: Option<ChannelBinding>,
    target_session_attrs: Option<TargetSessionAttrs>,
    keepalives: Option<bool>,
    keepalives_idle: Option<u32>,
    keepalives_interval: Option<u32>,
    keepalives_count: Option<u32>,
    tcp_user_timeout: Option<u32>,
    load_balance_hosts: Option<LoadBalanceHosts>,
}

/// Every parameter tombstoned accepts, in the order they are printed.
const KEYS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "passfile",
    "dbname",
    "application_name",
    "fallback_application_name",
    "connect_timeout",
    "options",
    "client_encoding",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslsni",
    "sslcompression",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "sslnegotiation",
    "gssencmode",
    "channel_binding",
    "target_session_attrs",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "load_balance_hosts",
];

/// libpq parameters tombstoned refuses, with why.
const UNSUPPORTED: &[(&str, &str)] = &[
    (
        "service",
        "; write the parameters of the service into database.url",
    ),
    ("krbsrvname", " (no GSSAPI/Kerberos support)"),
    ("gsslib", " (no GSSAPI/Kerberos support)"),
    ("gssdelegation", " (no GSSAPI/Kerberos support)"),
    ("requirepeer", ""),
    ("require_auth", ""),
    ("sslcrl", ""),
    ("sslcrldir", ""),
    ("sslcertmode", ""),
    ("sslkeylogfile", ""),
    ("replication", ""),
    ("min_protocol_version", ""),
    ("max_protocol_version", ""),
    ("oauth_issuer", ""),
    ("oauth_client_id", ""),
    ("oauth_client_secret", ""),
    ("oauth_scope", ""),
];

fn known_key(key: &str) -> Option<&'static str> {
    KEYS.iter().copied().find(|k| *k == key)
}

/// Whether `key` can hold a secret, so its value is never quoted in an error.
fn is_secret_key(key: &str) -> bool {
    matches!(key, "password" | "sslpassword")
}

/// Shows an unknown key only when it looks like a parameter name (it could be a stray
/// password otherwise), with a hint for the upper-case spelling of a known key.
fn unknown_key(key: &str) -> ConnInfoError {
    let looks_like_a_name = !key.is_empty()
        && key.len() <= 40
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    let lower = key.to_ascii_lowercase();
    let hint = match known_key(&lower) {
        Some(k) if k != key => format!(" (parameter names are lower-case: \"{k}\")"),
        _ => String::new(),
    };
    ConnInfoError::UnknownKey {
        key: if looks_like_a_name {
            key.to_owned()
        } else {
            "(not shown: it is not a parameter name)".to_owned()
        },
        hint,
    }
}

fn bad(key: &'static str, reason: impl Into<String>) -> ConnInfoError {
    ConnInfoError::BadValue {
        key,
        reason: reason.into(),
    }
}

/// libpq's integer parsing: optional surrounding whitespace, optional sign, digits.
fn parse_int(key: &'static str, value: &str) -> Result<i64, ConnInfoError> {
    value
        .trim()
        .parse::<i64>()
        .map_err(|_| bad(key, "not an integer".to_owned()))
}

fn parse_nonneg(key: &'static str, value: &str) -> Result<u32, ConnInfoError> {
    let n = parse_int(key, value)?;
    u32::try_from(n).map_err(|_| bad(key, format!("{n} is out of range")))
}

fn parse_bool01(key: &'static str, value: &str) -> Result<bool, ConnInfoError> {
    match value {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(bad(key, "expected 0 or 1".to_owned())),
    }
}

fn one_of<T: Copy>(
    key: &'static str,
    value: &str,
    choices: &[(&str, T)],
) -> Result<T, ConnInfoError> {
    choices
        .iter()
        .find(|(name, _)| *name == value)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            bad(key, format!("expected one of: {}", names.join(", ")))
        })
}

impl Params {
    /// Stores one parameter, validating its value. Later values replace earlier ones.
    fn set(&mut self, key: &str, value: &str) -> Result<(), ConnInfoError> {
        let Some(k) = known_key(key) else {
            if let Some((k, why)) = UNSUPPORTED.iter().find(|(k, _)| *k == key) {
                return Err(ConnInfoError::Unsupported {
                    key: k,
                    why: (*why).to_owned(),
                });
            }
            return Err(unknown_key(key));
        };
        let string = || Some(value.to_owned());
        match k {
            "host" => self.host = Some(value.split(',').map(str::to_owned).collect()),
            "hostaddr" => {
                let addrs = value
                    .split(',')
                    .map(|a| {
                        let a = a.trim();
                        if a.is_empty() {
                            Ok(None)
                        } else {
                            a.parse::<IpAddr>()
                                .map(Some)
                                .map_err(|_| bad(k, "not an IP address".to_owned()))
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.hostaddr = Some(addrs);
            }
            "port" => {
                let ports = value
                    .split(',')
                    .map(|p| {
                        let p = p.trim();
                        if p.is_empty() {
                            return Ok(None);
                        }
                        match p.parse::<u16>() {
                            Ok(n) if n > 0 => Ok(Some(n)),
                            _ => Err(bad(k, "not a port number".to_owned())),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                self.port = Some(ports);
            }
            "user" => self.user = string(),
            "password" => self.password = Some(Secret::new(value)),
            "passfile" => self.passfile = Some(PathBuf::from(value)),
            "dbname" => self.dbname = string(),
            "application_name" => self.application_name = string(),
            "fallback_application_name" => self.fallback_application_name = string(),
            "connect_timeout" => self.connect_timeout = Some(parse_int(k, value)?),
            "options" => self.options = string(),
            "client_encoding" => {
                let normalised = value.to_ascii_lowercase().replace(['-', '_'], "");
                if !matches!(normalised.as_str(), "utf8" | "unicode" | "auto") {
                    return Err(bad(k, "tombstoned always talks UTF8".to_owned()));
                }
                self.client_encoding = string();
            }
            "sslmode" => {
                self.sslmode = Some(SslMode::parse(value).ok_or_else(|| {
                    bad(
                        k,
                        "expected disable, allow, prefer, require, verify-ca or \
                             verify-full"
                            .to_owned(),
                    )
                })?);
            }
            "sslrootcert" => {
                self.sslrootcert = Some(if value == "system" {
                    RootCert::System
                } else {
                    RootCert::File(PathBuf::from(value))
                });
            }
            "sslcert" => self.sslcert = Some(PathBuf::from(value)),
            "sslkey" => self.sslkey = Some(PathBuf::from(value)),
            "sslpassword" => self.sslpassword = Some(Secret::new(value)),
            "sslsni" => self.sslsni = Some(parse_bool01(k, value)?),
            "sslcompression" => self.sslcompression = Some(parse_bool01(k, value)?),
            "ssl_min_protocol_version" => {
                self.ssl_min_protocol_version =
                    Some(TlsVersion::parse(value).ok_or_else(|| {
                        bad(k, "expected TLSv1, TLSv1.1, TLSv1.2 or TLSv1.3".to_owned())
                    })?);
            }
            "ssl_max_protocol_version" => {
                self.ssl_max_protocol_version = Some(if value.is_empty() {
                    None
                } else {
                    Some(TlsVersion::parse(value).ok_or_else(|| {
                        bad(
                            k,
                            "expected TLSv1, TLSv1.1, TLSv1.2, TLSv1.3 or empty".to_owned(),
                        )
                    })?)
                });
            }
            "sslnegotiation" => match value {
                "postgres" => self.sslnegotiation = Some(()),
                "direct" => {
                    return Err(ConnInfoError::Unsupported {
                        key: "sslnegotiation",
                        why: " with the value direct (use postgres, the default)".to_owned(),
                    })
                }
                _ => return Err(bad(k, "expected postgres".to_owned())),
            },
            "gssencmode" => {
                self.gssencmode = Some(match value {
                    "disable" => "disable",
                    "prefer" => "prefer",
                    "require" => {
                        return Err(ConnInfoError::Unsupported {
                            key: "gssencmode",
                            why: " with the value require (no GSSAPI support)".to_owned(),
                        })
                    }
                    _ => return Err(bad(k, "expected disable or prefer".to_owned())),
                });
            }
            "channel_binding" => {
                self.channel_binding = Some(one_of(
                    k,
                    value,
                    &[
                        ("disable", ChannelBinding::Disable),
                        ("prefer", ChannelBinding::Prefer),
                        ("require", ChannelBinding::Require),
                    ],
                )?);
            }
            "target_session_attrs" => {
                self.target_session_attrs = Some(one_of(
                    k,
                    value,
                    &[
                        ("any", TargetSessionAttrs::Any),
                        ("read-write", TargetSessionAttrs::ReadWrite),
                        ("read-only", TargetSessionAttrs::ReadOnly),
                        ("primary", TargetSessionAttrs::Primary),
                        ("standby", TargetSessionAttrs::Standby),
                        ("prefer-standby", TargetSessionAttrs::PreferStandby),
                    ],
                )?);
            }
            "keepalives" => self.keepalives = Some(parse_int(k, value)? != 0),
            "keepalives_idle" => self.keepalives_idle = Some(parse_nonneg(k, value)?),
            "keepalives_interval" => self.keepalives_interval = Some(parse_nonneg(k, value)?),
            "keepalives_count" => self.keepalives_count = Some(parse_nonneg(k, value)?),
            "tcp_user_timeout" => self.tcp_user_timeout = Some(parse_nonneg(k, value)?),
            "load_balance_hosts" => {
                self.load_balance_hosts = Some(one_of(
                    k,
                    value,
                    &[
                        ("disable", LoadBalanceHosts::Disable),
                        ("random", LoadBalanceHosts::Random),
                    ],
                )?);
            }
            _ => unreachable!("every key of KEYS has an arm"),
        }
        Ok(())
    }

    /// The value of `key` as it would be written (None when not set).
    fn get(&self, key: &str) -> Option<String> {
        fn join<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
            items.iter().map(f).collect::<Vec<_>>().join(",")
        }
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        match key {
            "host" => self.host.as_ref().map(|h| h.join(",")),
            "hostaddr" => self
                .hostaddr
                .as_ref()
                .map(|a| join(a, |x| x.map(|ip| ip.to_string()).unwrap_or_default())),
            "port" => self
                .port
                .as_ref()
                .map(|p| join(p, |x| x.map(|n| n.to_string()).unwrap_or_default())),
            "user" => self.user.clone(),
            "password" => self.password.as_ref().map(|s| s.expose().to_owned()),
            "passfile" => path(&self.passfile),
            "dbname" => self.dbname.clone(),
            "application_name" => self.application_name.clone(),
            "fallback_application_name" => self.fallback_application_name.clone(),
            "connect_timeout" => self.connect_timeout.map(|n| n.to_string()),
            "options" => self.options.clone(),
            "client_encoding" => self.client_encoding.clone(),
            "sslmode" => self.sslmode.map(|m| m.as_str().to_owned()),
            "sslrootcert" => self.sslrootcert.as_ref().map(|r| match r {
                RootCert::System => "system".to_owned(),
                RootCert::File(p) => p.display().to_string(),
            }),
            "sslcert" => path(&self.sslcert),
            "sslkey" => path(&self.sslkey),
            "sslpassword" => self.sslpassword.as_ref().map(|s| s.expose().to_owned()),
            "sslsni" => self.sslsni.map(|b| if b { "1" } else { "0" }.to_owned()),
            "sslcompression" => self
                .sslcompression
                .map(|b| if b { "1" } else { "0" }.to_owned()),
            "ssl_min_protocol_version" => {
                self.ssl_min_protocol_version.map(|v| v.as_str().to_owned())
            }
            "ssl_max_protocol_version" => self
                .ssl_max_protocol_version
                .map(|v| v.map(TlsVersion::as_str).unwrap_or_default().to_owned()),
            "sslnegotiation" => self.sslnegotiation.map(|()| "postgres".to_owned()),
            "gssencmode" => self.gssencmode.map(str::to_owned),
            "channel_binding" => self.channel_binding.map(|c| c.as_str().to_owned()),
            "target_session_attrs" => self.target_session_attrs.map(|t| t.as_str().to_owned()),
            "keepalives" => self
                .keepalives
                .map(|b| if b { "1" } else { "0" }.to_owned()),
            "keepalives_idle" => self.keepalives_idle.map(|n| n.to_string()),
            "keepalives_interval" => self.keepalives_interval.map(|n| n.to_string()),
            "keepalives_count" => self.keepalives_count.map(|n| n.to_string()),
            "tcp_user_timeout" => self.tcp_user_timeout.map(|n| n.to_string()),
            "load_balance_hosts" => self.load_balance_hosts.map(|l| {
                match l {
                    LoadBalanceHosts::Disable => "disable",
                    LoadBalanceHosts::Random => "random",
                }
                .to_owned()
            }),
            _ => None,
        }
    }

    /// Cross-parameter checks, after every parameter is stored; normalises what libpq treats
    /// as "not given" (a port list of empty entries, a single empty host).
    fn finish(mut self) -> Result<Self, ConnInfoError> {
        if self
            .port
            .as_ref()
            .is_some_and(|p| p.iter().all(Option::is_none))
        {
            self.port = None;
        }
        if self
            .host
            .as_ref()
            .is_some_and(|h| h.len() == 1 && h[0].is_empty())
        {
            self.host = None;
        }
        if self
            .hostaddr
            .as_ref()
            .is_some_and(|a| a.len() == 1 && a[0].is_none())
        {
            self.hostaddr = None;
        }
        let hosts = self.host.as_ref().map(Vec::len);
        let addrs = self.hostaddr.as_ref().map(Vec::len);
        if let (Some(h), Some(a)) = (hosts, addrs) {
            if h != a {
                return Err(ConnInfoError::Inconsistent(format!(
                    "could not match {a} host addresses (hostaddr) to {h} host names (host)"
                )));
            }
        }
        let targets = hosts.or(addrs).unwrap_or(1);
        if let Some(p) = self.port.as_ref().map(Vec::len) {
            if p != 1 && p != targets {
                return Err(ConnInfoError::Inconsistent(format!(
                    "could not match {p} port numbers to {targets} hosts"
                )));
            }
        }
        if self.sslrootcert == Some(RootCert::System) {
            if let Some(mode) = self.sslmode.filter(|m| *m != SslMode::VerifyFull) {
                return Err(ConnInfoError::Inconsistent(format!(
                    "weak sslmode \"{mode}\" may not be used with sslrootcert=system (use \
                     \"verify-full\"), as libpq requires"
                )));
            }
        }
        if let Some(Some(max)) = self.ssl_max_protocol_version {
            if self.ssl_min_protocol_version.is_some_and(|min| min > max) {
                return Err(ConnInfoError::Inconsistent(
                    "ssl_min_protocol_version is above ssl_max_protocol_version".into(),
                ));
            }
            if max < TlsVersion::V1_2 {
                return Err(bad(
                    "ssl_max_protocol_version",
                    "tombstoned speaks TLSv1.2 and TLSv1.3 only",
                ));
            }
        }
        Ok(self)
    }
}

// ---- key=value form ------------------------------------------------------------------------

/// Splits a libpq `key=value` string: whitespace between pairs and around `=`, values in
/// single quotes or bare, `\` escaping the next character in both.
fn parse_key_value(s: &str) -> Result<Params, ConnInfoError> {
    let mut params = Params::default();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            break;
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| *c != '=' && !c.is_whitespace()) {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            // A word without "=" is often the second half of an unquoted password with a
            // space in it: name it only when it is a parameter name.
            return Err(ConnInfoError::MissingEquals(match known_key(&key) {
                Some(k) => format!("\"{k}\""),
                None => "a word that is not a parameter name (quote values with spaces: \
                         key='a b')"
                    .to_owned(),
            }));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    None => return Err(ConnInfoError::UnterminatedQuote),
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => return Err(ConnInfoError::UnterminatedQuote),
                    },
                    Some('\'') => break,
                    Some(c) => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(escaped) = chars.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        params.set(&key, &value)?;
    }
    Ok(params)
}

fn quote_value(value: &str) -> String {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\');
    if plain {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

// ---- URL form ------------------------------------------------------------------------------

/// Characters left as they are in URL components we print; everything else is %-encoded.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn decode(part: &'static str, raw: &str) -> Result<String, ConnInfoError> {
    let bytes = raw.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3);
            match hex {
                Some(h) if h.iter().all(u8::is_ascii_hexdigit) => {
                    if h == b"00" {
                        return Err(ConnInfoError::BadUrl(format!(
                            "forbidden value %00 in the percent-encoded {part}"
                        )));
                    }
                    i += 3;
                }
                _ => {
                    return Err(ConnInfoError::BadUrl(format!(
                        "invalid percent-encoding in the {part}"
                    )))
                }
            }
        } else {
            i += 1;
        }
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| ConnInfoError::BadUrl(format!("the {part} is not UTF-8 once decoded")))
}

fn parse_url(s: &str) -> Result<Params, ConnInfoError> {
    let rest = s
        .strip_prefix("postgresql://")
        .or_else(|| s.strip_prefix("postgres://"))
        .ok_or_else(|| ConnInfoError::BadUrl("not a postgresql:// URL".into()))?;
    let mut params = Params::default();
    // libpq looks for the user-info designator up to the first '/' (not '?').
    let mut rest = rest;
    if let Some(at) = rest
        .find(['@', '/'])
        .filter(|i| rest.as_bytes()[*i] == b'@')
    {
        let userinfo = &rest[..at];
        let (user, password) = match userinfo.find(':') {
            Some(colon) => (&userinfo[..colon], Some(&userinfo[colon + 1..])),
            None => (userinfo, None),
        };
        if !user.is_empty() {
            params.set("user", &decode("user name", user)?)?;
        }
        if let Some(pw) = password.filter(|p| !p.is_empty()) {
            params.set("password", &decode("password", pw)?)?;
        }
        rest = &rest[at + 1..];
    }
    // Host list: host[:port][,host[:port]]..., IPv6 addresses in brackets.
    let mut hosts = String::new();
    let mut ports = String::new();
    loop {
        let host;
        if let Some(after) = rest.strip_prefix('[') {
            let close = after.find(']').ok_or_else(|| {
                ConnInfoError::BadUrl("missing \"]\" after an IPv6 host address".into())
            })?;
            host = &after[..close];
            if host.is_empty() {
                return Err(ConnInfoError::BadUrl("empty IPv6 host address".into()));
            }
            rest = &after[close + 1..];
            if !(rest.is_empty() || rest.starts_with([':', '/', '?', ','])) {
                return Err(ConnInfoError::BadUrl(
                    "unexpected character after an IPv6 host address".into(),
                ));
            }
        } else {
            let end = rest.find([':', '/', '?', ',']).unwrap_or(rest.len());
            host = &rest[..end];
            rest = &rest[end..];
        }
        hosts.push_str(host);
        if let Some(after) = rest.strip_prefix(':') {
            let end = after.find(['/', '?', ',']).unwrap_or(after.len());
            ports.push_str(&after[..end]);
            rest = &after[end..];
        }
        match rest.strip_prefix(',') {
            Some(after) => {
                rest = after;
                hosts.push(',');
                ports.push(',');
            }
            None => break,
        }
    }
    if !hosts.is_empty() {
        params.set("host", &decode("host", &hosts)?)?;
    }
    if !ports.is_empty() {
        params.set("port", &decode("port", &ports)?)?;
    }
    if let Some(after) = rest.strip_prefix('/') {
        let end = after.find('?').unwrap_or(after.len());
        if end > 0 {
            params.set("dbname", &decode("database name", &after[..end])?)?;
        }
        rest = &after[end..];
    }
    if let Some(query) = rest.strip_prefix('?') {
        for pair in query.split('&') {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(ConnInfoError::BadUrl(
                    "missing key/value separator \"=\" in a query parameter".into(),
                ));
            };
            if value.contains('=') {
                return Err(ConnInfoError::BadUrl(
                    "extra key/value separator \"=\" in a query parameter (write %3D)".into(),
                ));
            }
            let key = decode("query parameter name", key)?;
            let value = decode("query parameter value", value)?;
            // libpq's JDBC compatibility: ssl=true means sslmode=require.
            if key == "ssl" && value == "true" {
                params.set("sslmode", "require")?;
            } else {
                params.set(&key, &value)?;
            }
        }
    } else if !rest.is_empty() {
        return Err(ConnInfoError::BadUrl(
            "unexpected characters after the host list".into(),
        ));
    }
    Ok(params)
}

fn encode(s: &str) -> String {
    utf8_percent_encode(s, COMPONENT).to_string()
}

fn encode_host(h: &str) -> String {
    if h.contains(':') {
        // An IPv6 address: brackets, colons kept (libpq decodes what is inside).
        let inner: String = h.split(':').map(encode).collect::<Vec<_>>().join(":");
        format!("[{inner}]")
    } else {
        encode(h)
    }
}

impl ConnInfo {
    /// Parses either form, as libpq does: a string starting with `postgresql://` or
    /// `postgres://` is a URL, anything else a `key=value` string.
    pub fn parse(s: &str) -> Result<Self, ConnInfoError> {
        if s.contains('\0') {
            // libpq reads C strings: it could never see what follows.
            return Err(ConnInfoError::BadUrl(
                "the connection string contains a NUL character".into(),
            ));
        }
        let (form, params) = if s.starts_with("postgresql://") || s.starts_with("postgres://") {
            (Form::Url, parse_url(s)?)
        } else {
            (Form::KeyValue, parse_key_value(s)?)
        };
        Ok(ConnInfo {
            form,
            p: params.finish()?,
        })
    }

    /// The form it was written in.
    pub fn form(&self) -> Form {
        self.form
    }

    /// Renders the connection string; `reveal` decides whether secrets are printed or masked
    /// as `***`.
    fn render(&self, reveal: bool) -> String {
        let value = |key: &str| -> Option<String> {
            let v = self.p.get(key)?;
            Some(if is_secret_key(key) && !reveal {
                "***".to_owned()
            } else {
                v
            })
        };
        match self.form {
            Form::KeyValue => KEYS
                .iter()
                .filter_map(|k| value(k).map(|v| format!("{k}={}", quote_value(&v))))
                .collect::<Vec<_>>()
                .join(" "),
            Form::Url => self.render_url(reveal),
        }
    }

    fn render_url(&self, reveal: bool) -> String {
        let p = &self.p;
        let mut out = String::from("postgresql://");
        let mut query: Vec<(&str, String)> = Vec::new();
        let mut in_query = |k: &'static str, v: String| query.push((k, v));
        let masked = |s: &Secret| {
            if reveal {
                encode(s.expose())
            } else {
                "***".to_owned()
            }
        };
        let user_in_authority = p.user.as_deref().is_none_or(|u| !u.is_empty());
        let password_in_authority = p.password.as_ref().is_none_or(|s| !s.expose().is_empty());
        let mut userinfo = String::new();
        if let Some(u) = p.user.as_deref().filter(|_| user_in_authority) {
            userinfo.push_str(&encode(u));
        } else if let Some(u) = &p.user {
            in_query("user", u.clone());
        }
        match &p.password {
            Some(s) if password_in_authority => {
                userinfo.push(':');
                userinfo.push_str(&masked(s));
            }
            Some(_) => in_query("password", String::new()),
            None => {}
        }
        if !userinfo.is_empty() {
            out.push_str(&userinfo);
            out.push('@');
        }
        // Hosts and ports in the authority when it can say exactly what they are.
        let hosts = p.host.as_ref();
        let ports = p.port.as_ref();
        let authority_ok = match (hosts, ports) {
            (Some(h), Some(pt)) => h.len() == pt.len() && (h.len() > 1 || !h[0].is_empty()),
            (Some(h), None) => h.len() > 1 || !h[0].is_empty(),
            (None, Some(pt)) => pt.len() == 1,
            (None, None) => true,
        };
        if authority_ok {
            let n = hosts.map_or(1, Vec::len);
            let parts: Vec<String> = (0..n)
                .map(|i| {
                    let h = hosts.map(|h| encode_host(&h[i])).unwrap_or_default();
                    match ports.and_then(|pt| pt[i]) {
                        Some(port) => format!("{h}:{port}"),
                        None => h,
                    }
                })
                .collect();
            out.push_str(&parts.join(","));
        } else {
            if let Some(h) = p.get("host") {
                in_query("host", h);
            }
            if let Some(pt) = p.get("port") {
                in_query("port", pt);
            }
        }
        match p.dbname.as_deref() {
            Some(db) if !db.is_empty() => {
                out.push('/');
                out.push_str(&encode(db));
            }
            Some(_) => in_query("dbname", String::new()),
            None => {}
        }
        for k in KEYS {
            if matches!(*k, "host" | "port" | "user" | "password" | "dbname") {
                continue;
            }
            if let Some(v) = p.get(k) {
                in_query(k, v);
            }
        }
        if !query.is_empty() {
            let rendered: Vec<String> = query
                .into_iter()
                .map(|(k, v)| {
                    let v = if is_secret_key(k) && !reveal && !v.is_empty() {
                        "***".to_owned()
                    } else {
                        encode(&v)
                    };
                    format!("{k}={v}")
                })
                .collect();
            out.push('?');
            out.push_str(&rendered.join("&"));
        }
        out
    }

    /// The connection string with its secrets. Never log it.
    pub fn to_string_with_secrets(&self) -> String {
        self.render(true)
    }

    // ---- effective values ------------------------------------------------------------------

    /// Where to connect, in the order written (before any load balancing).
    pub fn targets(&self) -> Vec<Target> {
        let p = &self.p;
        let n = p
            .host
            .as_ref()
            .map(Vec::len)
            .or(p.hostaddr.as_ref().map(Vec::len))
            .unwrap_or(1);
        (0..n)
            .map(|i| {
                let host = p.host.as_ref().map(|h| h[i].clone()).unwrap_or_default();
                let hostaddr = p.hostaddr.as_ref().and_then(|a| a[i]);
                let port = p
                    .port
                    .as_ref()
                    .and_then(|pt| if pt.len() == 1 { pt[0] } else { pt[i] })
                    .unwrap_or(DEFAULT_PORT);
                let host = if host.starts_with('/') {
                    HostKind::Unix(PathBuf::from(host))
                } else if host.is_empty() && hostaddr.is_none() {
                    HostKind::Unix(default_socket_dir())
                } else {
                    HostKind::Tcp(host)
                };
                Target {
                    host,
                    hostaddr,
                    port,
                }
            })
            .collect()
    }

    /// `user`, if given.
    pub fn user(&self) -> Option<&str> {
        self.p.user.as_deref()
    }

    /// `password`, if given.
    pub fn password(&self) -> Option<&Secret> {
        self.p.password.as_ref()
    }

    /// `passfile`, if given.
    pub fn passfile(&self) -> Option<&std::path::Path> {
        self.p.passfile.as_deref()
    }

    /// `dbname`, if given.
    pub fn dbname(&self) -> Option<&str> {
        self.p.dbname.as_deref()
    }

    /// `application_name`, else `fallback_application_name`, if either is given.
    pub fn application_name(&self) -> Option<&str> {
        self.p.application_name.as_deref()
    }

    /// `fallback_application_name`, if given.
    pub fn fallback_application_name(&self) -> Option<&str> {
        self.p.fallback_application_name.as_deref()
    }

    /// `options` (sent as given; tombstoned adds nothing of its own to it).
    pub fn options(&self) -> Option<&str> {
        self.p.options.as_deref()
    }

    /// `connect_timeout` with libpq's meaning: none for zero or less, and at least 2 s.
    pub fn connect_timeout(&self) -> Option<Duration> {
        match self.p.connect_timeout {
            // Capped at ~24 days, the longest timeout tombstoned accepts anywhere.
            Some(n) if n > 0 => Some(Duration::from_secs(n.clamp(2, 2_000_000).unsigned_abs())),
            _ => None,
        }
    }

    /// The effective sslmode: as given; else `verify-full` with `sslrootcert=system` (libpq
    /// 16); else `prefer`.
    pub fn sslmode(&self) -> SslMode {
        match (self.p.sslmode, &self.p.sslrootcert) {
            (Some(m), _) => m,
            (None, Some(RootCert::System)) => SslMode::VerifyFull,
            (None, _) => SslMode::Prefer,
        }
    }

    /// `sslrootcert`, if given.
    pub fn sslrootcert(&self) -> Option<&RootCert> {
        self.p.sslrootcert.as_ref()
    }

    /// `sslcert`, if given.
    pub fn sslcert(&self) -> Option<&std::path::Path> {
        self.p.sslcert.as_deref()
    }

    /// `sslkey`, if given.
    pub fn sslkey(&self) -> Option<&std::path::Path> {
        self.p.sslkey.as_deref()
    }

    /// `sslpassword`, if given.
    pub fn sslpassword(&self) -> Option<&Secret> {
        self.p.sslpassword.as_ref()
    }

    /// `sslsni` (default on).
    pub fn sslsni(&self) -> bool {
        self.p.sslsni.unwrap_or(true)
    }

    /// The TLS versions allowed: (`ssl_min_protocol_version` default TLSv1.2, max or none).
    pub fn tls_versions(&self) -> (TlsVersion, Option<TlsVersion>) {
        (
            self.p.ssl_min_protocol_version.unwrap_or(TlsVersion::V1_2),
            self.p.ssl_max_protocol_version.flatten(),
        )
    }

    /// `channel_binding` (default prefer).
    pub fn channel_binding(&self) -> ChannelBinding {
        self.p.channel_binding.unwrap_or(ChannelBinding::Prefer)
    }

    /// `target_session_attrs` (default any).
    pub fn target_session_attrs(&self) -> TargetSessionAttrs {
        self.p
            .target_session_attrs
            .unwrap_or(TargetSessionAttrs::Any)
    }

    /// `load_balance_hosts` (default disable).
    pub fn load_balance_hosts(&self) -> LoadBalanceHosts {
        self.p
            .load_balance_hosts
            .unwrap_or(LoadBalanceHosts::Disable)
    }

    /// `keepalives` (default on).
    pub fn keepalives(&self) -> bool {
        self.p.keepalives.unwrap_or(true)
    }

    /// `keepalives_idle`, when given and not zero.
    pub fn keepalives_idle(&self) -> Option<Duration> {
        nonzero_secs(self.p.keepalives_idle)
    }

    /// `keepalives_interval`, when given and not zero.
    pub fn keepalives_interval(&self) -> Option<Duration> {
        nonzero_secs(self.p.keepalives_interval)
    }

    /// `keepalives_count`, when given and not zero.
    pub fn keepalives_count(&self) -> Option<u32> {
        self.p.keepalives_count.filter(|n| *n > 0)
    }

    /// `tcp_user_timeout` (milliseconds), when given and not zero.
    pub fn tcp_user_timeout(&self) -> Option<Duration> {
        self.p
            .tcp_user_timeout
            .filter(|n| *n > 0)
            .map(|ms| Duration::from_millis(u64::from(ms)))
    }
}

fn nonzero_secs(v: Option<u32>) -> Option<Duration> {
    v.filter(|n| *n > 0)
        .map(|s| Duration::from_secs(u64::from(s)))
}

impl std::str::FromStr for ConnInfo {
    type Err = ConnInfoError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ConnInfo::parse(s)
    }
}

/// The connection string with passwords masked as `***`.
impl fmt::Display for ConnInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> ConnInfo {
        ConnInfo::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn err(s: &str) -> String {
        ConnInfo::parse(s).unwrap_err().to_string()
    }

    fn tcp(h: &str, port: u16) -> Target {
        Target {
            host: HostKind::Tcp(h.into()),
            hostaddr: None,
            port,
        }
    }

    #[test]
    fn key_value_quoting_escapes_and_spaces() {
        let c = parse(r"host=db  user = u   password= 'x' dbname='my db'");
        assert_eq!(c.user(), Some("u"));
        assert!(
            ConnInfo::parse(r"password='it''s'").is_err(),
            "libpq: no '' escape"
        );
        let c = parse(r"password='it\'s a \\ secret' dbname='my db' user=a\ b");
        assert_eq!(c.password().unwrap().expose(), r"it's a \ secret");
        assert_eq!(c.dbname(), Some("my db"));
        assert_eq!(c.user(), Some("a b"));
        let c = parse("password= X user=u");
        assert_eq!(c.password().unwrap().expose(), "X");
        let c = parse("password= user=u");
        assert_eq!(
            c.password().unwrap().expose(),
            "user=u",
            "libpq: value after ="
        );
        let c = parse("password='' user=u");
        assert_eq!(c.password().unwrap().expose(), "");
        let c = parse("  host=a\thost=b\n");
        assert_eq!(c.targets(), vec![tcp("b", 5432)], "later wins");
        let c = parse("");
        assert_eq!(c.targets().len(), 1);
    }

    #[test]
    fn key_value_errors_name_the_key_never_the_value() {
        let e = err("host=db PASSWORD=hunter2");
        assert!(
            e.contains("\"PASSWORD\"") && e.contains("lower-case"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
        let e = err("host=db password hunter2");
        assert!(e.contains("missing \"=\" after \"password\""), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = err("host=db password='hunter2");
        assert!(e.contains("unterminated"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
        let e = err("host=db hunter2!@# user=x");
        assert!(!e.contains("hunter2"), "{e}");
        let e = err("passwd=hunter2");
        assert!(e.contains("\"passwd\"") && !e.contains("hunter2"), "{e}");
        let e = err("sslmode=requre");
        assert!(e.contains("sslmode") && e.contains("verify-full"), "{e}");
        assert!(!e.contains("requre"), "values are never quoted: {e}");
        let e = err("password=two words user=u");
        assert!(e.contains("missing") && !e.contains("words"), "{e}");
        let e = err("krbsrvname=x");
        assert!(e.contains("not supported"), "{e}");
        let e = err("port=54x32");
        assert!(e.contains("port"), "{e}");
        let e = err("port=70000");
        assert!(e.contains("port"), "{e}");
    }

    #[test]
    fn urls_with_userinfo_hosts_ipv6_ports_and_query() {
        let c = parse("postgresql://us%40er:p%40ss%3Aw0rd@h1:5433,[::1]:5434,h3/my%20db?sslmode=verify-full&application_name=x%26y");
        assert_eq!(c.user(), Some("us@er"));
        assert_eq!(c.password().unwrap().expose(), "p@ss:w0rd");
        assert_eq!(c.dbname(), Some("my db"));
        assert_eq!(c.sslmode(), SslMode::VerifyFull);
        assert_eq!(c.application_name(), Some("x&y"));
        assert_eq!(
            c.targets(),
            vec![tcp("h1", 5433), tcp("::1", 5434), tcp("h3", 5432)]
        );
        let c = parse("postgres://h?port=6000&password=s");
        assert_eq!(c.targets(), vec![tcp("h", 6000)]);
        assert_eq!(c.password().unwrap().expose(), "s");
        let c = parse("postgresql://u:a@h/db?password=b");
        assert_eq!(c.password().unwrap().expose(), "b", "the query wins");
        let c = parse("postgresql://%2Fvar%2Frun%2Fpg:5433/db");
        assert_eq!(
            c.targets()[0].socket_path(),
            Some(PathBuf::from("/var/run/pg/.s.PGSQL.5433"))
        );
        let c = parse("postgresql:///db?host=/tmp");
        assert_eq!(c.targets()[0].host, HostKind::Unix(PathBuf::from("/tmp")));
        let c = parse("postgresql://h/db?ssl=true");
        assert_eq!(c.sslmode(), SslMode::Require);
        let c = parse("postgresql://");
        assert_eq!(c.targets().len(), 1);
    }

    #[test]
    fn url_errors_never_echo_the_password() {
        for (url, needle) in [
            ("postgresql://u:hunter2%zz@h/db", "percent"),
            ("postgresql://u:hunter2%00@h/db", "%00"),
            ("postgresql://h/db?PASSWORD=hunter2", "PASSWORD"),
            ("postgresql://h/db?password", "separator"),
            ("postgresql://h/db?password=hunter2=x", "extra"),
            ("postgresql://[::1/db", "]"),
            ("postgresql://h/db?foo=hunter2", "\"foo\""),
        ] {
            let e = err(url);
            assert!(e.contains(needle), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
    }

    #[test]
    fn multi_host_ports_and_hostaddr() {
        let c = parse("host=h1,h2 port=5432,5433");
        assert_eq!(c.targets(), vec![tcp("h1", 5432), tcp("h2", 5433)]);
        let c = parse("host=h1,h2,h3 port=6000");
        assert!(c.targets().iter().all(|t| t.port == 6000));
        assert!(err("host=h1,h2,h3 port=1,2").contains("3 hosts"));
        let c = parse("host=db.example hostaddr=10.0.0.5");
        assert_eq!(c.targets()[0].hostaddr, Some("10.0.0.5".parse().unwrap()));
        assert_eq!(c.targets()[0].name(), "db.example");
        let c = parse("hostaddr=10.0.0.5,10.0.0.6");
        assert_eq!(c.targets().len(), 2);
        assert_eq!(c.targets()[1].name(), "10.0.0.6");
        assert!(err("host=a,b hostaddr=10.0.0.1").contains("hostaddr"));
        assert!(err("hostaddr=not-an-ip").contains("hostaddr"));
        let c = parse("host=/run/postgresql,h2");
        assert_eq!(
            c.targets()[0].host,
            HostKind::Unix(PathBuf::from("/run/postgresql"))
        );
        assert_eq!(c.targets()[1], tcp("h2", 5432));
        let c = parse("host=,h2 port=,5433");
        assert!(matches!(c.targets()[0].host, HostKind::Unix(_)));
        assert_eq!(c.targets()[1], tcp("h2", 5433));
    }

    #[test]
    fn every_parameter_parses_and_means_what_libpq_says() {
        let c = parse(
            "host=h port=1 user=u password=p passfile=/pp dbname=d application_name=a \
             fallback_application_name=f connect_timeout=1 options='-c x=y' \
             client_encoding=UTF8 sslmode=verify-ca sslrootcert=/ca.pem sslcert=/c.pem \
             sslkey=/k.pem sslpassword=kp sslsni=0 sslcompression=0 \
             ssl_min_protocol_version=TLSv1.2 ssl_max_protocol_version=TLSv1.3 \
             sslnegotiation=postgres gssencmode=disable channel_binding=require \
             target_session_attrs=read-write keepalives=1 keepalives_idle=7 \
             keepalives_interval=3 keepalives_count=4 tcp_user_timeout=9000 \
             load_balance_hosts=random",
        );
        assert_eq!(c.passfile(), Some(std::path::Path::new("/pp")));
        assert_eq!(
            c.connect_timeout(),
            Some(Duration::from_secs(2)),
            "1 means 2"
        );
        assert_eq!(c.options(), Some("-c x=y"));
        assert_eq!(c.sslmode(), SslMode::VerifyCa);
        assert_eq!(
            c.sslrootcert(),
            Some(&RootCert::File(PathBuf::from("/ca.pem")))
        );
        assert_eq!(c.sslcert(), Some(std::path::Path::new("/c.pem")));
        assert_eq!(c.sslkey(), Some(std::path::Path::new("/k.pem")));
        assert_eq!(c.sslpassword().unwrap().expose(), "kp");
        assert!(!c.sslsni());
        assert_eq!(c.tls_versions(), (TlsVersion::V1_2, Some(TlsVersion::V1_3)));
        assert_eq!(c.channel_binding(), ChannelBinding::Require);
        assert_eq!(c.target_session_attrs(), TargetSessionAttrs::ReadWrite);
        assert!(c.keepalives());
        assert_eq!(c.keepalives_idle(), Some(Duration::from_secs(7)));
        assert_eq!(c.keepalives_interval(), Some(Duration::from_secs(3)));
        assert_eq!(c.keepalives_count(), Some(4));
        assert_eq!(c.tcp_user_timeout(), Some(Duration::from_millis(9000)));
        assert_eq!(c.load_balance_hosts(), LoadBalanceHosts::Random);
        assert_eq!(c.fallback_application_name(), Some("f"));
        for attrs in ["any", "read-only", "primary", "standby", "prefer-standby"] {
            parse(&format!("target_session_attrs={attrs}"));
        }
        for mode in ["disable", "allow", "prefer", "require"] {
            assert_eq!(parse(&format!("sslmode={mode}")).sslmode().as_str(), mode);
        }
        assert_eq!(parse("").sslmode(), SslMode::Prefer, "libpq's default");
        assert_eq!(parse("connect_timeout=0").connect_timeout(), None);
        assert!(!parse("keepalives=0").keepalives());
        assert!(err("client_encoding=LATIN1").contains("UTF8"));
        assert!(err("sslnegotiation=direct").contains("not supported"));
        assert!(err("gssencmode=require").contains("not supported"));
        assert!(err("ssl_max_protocol_version=TLSv1.1").contains("TLSv1.2"));
    }

    #[test]
    fn sslrootcert_system_implies_verify_full_and_refuses_weaker_modes() {
        assert_eq!(parse("sslrootcert=system").sslmode(), SslMode::VerifyFull);
        assert_eq!(
            parse("sslrootcert=system sslmode=verify-full").sslmode(),
            SslMode::VerifyFull
        );
        for weak in ["disable", "prefer", "require", "verify-ca"] {
            let e = err(&format!("sslrootcert=system sslmode={weak}"));
            assert!(e.contains("weak sslmode"), "{e}");
        }
    }

    #[test]
    fn display_masks_every_spelling_of_the_password() {
        for (raw, secret) in [
            ("host=db user=u password=s3cret dbname=app", "s3cret"),
            ("host=db password = s3cret", "s3cret"),
            ("host=db password= s3cret", "s3cret"),
            ("host=db password='s3 cret'", "s3 cret"),
            ("host=db sslpassword=s3cret", "s3cret"),
            (
                "postgresql://u:s3cret@db:5432/app?sslmode=disable",
                "s3cret",
            ),
            (
                "postgresql://db/app?user=u&password=s3cret&sslmode=disable",
                "s3cret",
            ),
            ("postgresql://u:s3%20cret@db/app", "s3 cret"),
            ("postgresql://u:s3%20cret@db/app", "s3%20cret"),
        ] {
            let c = parse(raw);
            let shown = c.to_string();
            let debug = format!("{c:?}");
            assert!(!shown.contains(secret), "{raw}: {shown}");
            assert!(!debug.contains(secret), "{raw}: {debug}");
            assert!(shown.contains("***"), "{raw}: {shown}");
        }
        assert_eq!(
            parse("postgresql://u:s3cret@db:5432/app?sslmode=disable").to_string(),
            "postgresql://u:***@db:5432/app?sslmode=disable"
        );
        assert_eq!(
            parse("host=db user=u password=s3cret dbname=app").to_string(),
            "host=db user=u password=*** dbname=app"
        );
    }

    /// One valid value for each key, and a few awkward ones for the free-text keys.
    fn value_for(key: &'static str) -> BoxedStrategy<String> {
        let text = proptest::string::string_regex("[a-zA-Z0-9 '\\\\@:/?&=%#,.é~*+-]{0,12}")
            .unwrap_or_else(|e| panic!("{e}"));
        let no_comma = proptest::string::string_regex("[a-zA-Z0-9 '\\\\@:/?&=%#.é~*+-]{0,10}")
            .unwrap_or_else(|e| panic!("{e}"));
        let pick = |xs: &'static [&'static str]| {
            proptest::sample::select(xs).prop_map(str::to_owned).boxed()
        };
        match key {
            "host" => proptest::collection::vec(no_comma, 1..4)
                .prop_map(|v| v.join(","))
                .boxed(),
            "hostaddr" => pick(&["10.0.0.1", "::1", "127.0.0.1,::1", "fe80::2"]),
            "port" => pick(&["5432", "1", "65535"]),
            "connect_timeout" => pick(&["0", "3", "-1", "10"]),
            "client_encoding" => pick(&["UTF8", "utf-8"]),
            "sslmode" => pick(&["disable", "allow", "prefer", "require", "verify-ca"]),
            "sslrootcert" => pick(&["/etc/ca.pem", "root ca.pem"]),
            "sslsni" | "sslcompression" => pick(&["0", "1"]),
            "ssl_min_protocol_version" => pick(&["TLSv1", "TLSv1.2"]),
            "ssl_max_protocol_version" => pick(&["", "TLSv1.3"]),
            "sslnegotiation" => pick(&["postgres"]),
            "gssencmode" => pick(&["disable", "prefer"]),
            "channel_binding" => pick(&["disable", "prefer", "require"]),
            "target_session_attrs" => pick(&["any", "read-write", "prefer-standby"]),
            "keepalives" => pick(&["0", "1"]),
            "keepalives_idle" | "keepalives_interval" | "keepalives_count" | "tcp_user_timeout" => {
                pick(&["0", "5", "120"])
            }
            "load_balance_hosts" => pick(&["disable", "random"]),
            _ => text.boxed(),
        }
    }

    fn conninfo() -> impl Strategy<Value = ConnInfo> {
        let keys = proptest::sample::subsequence(KEYS.to_vec(), 0..KEYS.len());
        (keys, any::<bool>())
            .prop_flat_map(|(keys, url)| {
                let values: Vec<_> = keys.iter().map(|k| value_for(k)).collect();
                (Just(keys), values, Just(url))
            })
            .prop_filter_map("inconsistent combination", |(keys, values, url)| {
                let mut p = Params::default();
                for (k, v) in keys.iter().zip(&values) {
                    p.set(k, v).ok()?;
                }
                // A port per host, sometimes.
                if let Some(h) = &p.host {
                    if p.port.as_ref().is_some_and(|pt| pt.len() != 1) || h.len() % 2 == 0 {
                        p.port = Some((0..h.len()).map(|i| Some(5000 + i as u16)).collect());
                    }
                }
                if p.hostaddr.is_some() && p.host.is_some() {
                    p.hostaddr = None;
                }
                let p = p.finish().ok()?;
                Some(ConnInfo {
                    form: if url { Form::Url } else { Form::KeyValue },
                    p,
                })
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn printing_then_parsing_gives_the_same_parameters(c in conninfo()) {
            let text = c.to_string_with_secrets();
            let back = ConnInfo::parse(&text);
            prop_assert_eq!(back.as_ref().ok(), Some(&c), "{} -> {:?}", text, back);
            // Masked printing parses too, to the same thing but the secrets.
            let masked = ConnInfo::parse(&c.to_string());
            prop_assert!(masked.is_ok(), "{}", c);
        }

        #[test]
        fn the_password_never_prints(pw in "[a-zA-Z0-9]{8,16}", url in any::<bool>()) {
            let raw = if url {
                format!("postgresql://u:{pw}@h/db?sslpassword={pw}")
            } else {
                format!("host=h password='{pw}' sslpassword={pw}")
            };
            let c = ConnInfo::parse(&raw).unwrap();
            prop_assert!(!c.to_string().contains(&pw));
            let debug = format!("{c:?}");
            prop_assert!(!debug.contains(&pw));
        }

        #[test]
        fn garbage_never_panics_and_errors_never_echo_a_password(
            s in "[a-z=' \\\\%@:/?&,\\[\\]]{0,40}"
        ) {
            let raw = format!("{s} password=Zq8xYw4k");
            if let Err(e) = ConnInfo::parse(&raw) {
                prop_assert!(!e.to_string().contains("Zq8xYw4k"), "{}", e);
            }
        }
    }
}

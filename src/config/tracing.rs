//! The `[tracing]` section: OpenTelemetry traces exported over OTLP/HTTP (protobuf), off unless
//! an endpoint is set; its file shape, defaults and validation into the typed [`TracingConfig`]
//! that `crate::telemetry` starts the exporter with. The standard `OTEL_EXPORTER_OTLP_ENDPOINT`
//! and `OTEL_SERVICE_NAME` are read by the merge ([`super::merge`]), below the file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::settings::{ConfigError, Problems};

/// The OTLP/HTTP path of traces under the base endpoint (the specification's per-signal path).
pub const TRACES_PATH: &str = "v1/traces";

/// `[tracing]`. `sample_ratio` is applied by a reload; every other key needs a restart (the
/// exporter is built when `serve` starts).
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL (`http` or `https`), e.g. `http://127.0.0.1:4318`;
    /// spans are POSTed to `<base>/v1/traces`. Unset: tracing is off. Default: none, or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` when the file (and `TOMBSTONED_TRACING__OTLP_ENDPOINT`) set
    /// none. Reload: needs a restart.
    pub otlp_endpoint: Option<Url>,
    /// `service.name` of every span. Default: `tombstoned`, or `OTEL_SERVICE_NAME` when the file
    /// sets none. Reload: needs a restart.
    pub service_name: String,
    /// The fraction of new traces recorded (0.0 to 1.0); a request that comes with a sampled
    /// `traceparent` is recorded whatever it says, one with an unsampled one never
    /// (parent-based). Default: 1.0. Reload: applied.
    pub sample_ratio: f64,
    /// HTTP headers sent with every export (a collector's credentials). Never shown: only their
    /// names are. Default: none. Reload: needs a restart.
    pub headers: ExportHeaders,
    /// PEM certificates to trust instead of the system roots for an `https` endpoint, resolved
    /// against the configuration file's directory. Default: none. Reload: needs a restart.
    pub ca_file: Option<PathBuf>,
}

/// Where `tracing.otlp_endpoint` and `tracing.service_name` came from (`check-config` says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TracingOrigins {
    /// `otlp_endpoint`'s.
    pub endpoint: Origin,
    /// `service_name`'s.
    pub service_name: Origin,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "tombstoned".to_owned(),
            sample_ratio: 1.0,
            headers: ExportHeaders::default(),
            ca_file: None,
        }
    }
}

/// Where a `[tracing]` value came from, in precedence order, highest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// The file, or its `TOMBSTONED_TRACING__*` variable.
    File,
    /// The OpenTelemetry standard variable (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`).
    OtelVariable(&'static str),
    /// Nothing set it.
    #[default]
    Default,
}

impl Origin {
    /// How `check-config` says it: "", "from OTEL_SERVICE_NAME".
    pub fn describe(self) -> String {
        match self {
            Origin::OtelVariable(var) => format!(" (from {var})"),
            Origin::File | Origin::Default => String::new(),
        }
    }
}

impl TracingConfig {
    /// Whether traces are exported at all.
    pub fn enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
    }

    /// Where spans are POSTed: the base endpoint with `/v1/traces` appended to its path (kept as
    /// it is when it already ends so).
    pub fn traces_url(&self) -> Option<Url> {
        let mut url = self.otlp_endpoint.clone()?;
        let path = url.path().trim_end_matches('/').to_owned();
        if !path.ends_with(&format!("/{TRACES_PATH}")) {
            url.set_path(&format!("{path}/{TRACES_PATH}"));
        }
        Some(url)
    }

    /// The endpoint without user information, query or fragment: what logs and `check-config`
    /// show.
    pub fn endpoint_display(&self) -> String {
        self.traces_url()
            .as_ref()
            .map_or_else(|| "(not set)".to_owned(), super::redacted_endpoint)
    }
}

/// The export's extra headers: names in the clear, values secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ExportHeaders(Vec<(String, String)>);

impl ExportHeaders {
    /// The headers, name and value, for the exporter only.
    pub fn expose(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The names, in order: what may be shown.
    pub fn names(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for ExportHeaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(n, _)| (n, "(redacted)")))
            .finish()
    }
}

/// `headers` as written: a table of name = value in the file; from the environment
/// (`TOMBSTONED_TRACING__HEADERS`) the text `name=value,name=value` of
/// `OTEL_EXPORTER_OTLP_HEADERS`, values percent-decoded.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum RawHeaders {
    Table(BTreeMap<String, String>),
    Text(String),
}

/// The `[tracing]` section as written in the file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct RawTracing {
    pub(super) otlp_endpoint: String,
    pub(super) service_name: String,
    sample_ratio: f64,
    headers: RawHeaders,
    ca_file: String,
}

impl Default for RawTracing {
    fn default() -> Self {
        let d = TracingConfig::default();
        Self {
            otlp_endpoint: String::new(),
            service_name: d.service_name,
            sample_ratio: d.sample_ratio,
            headers: RawHeaders::Table(BTreeMap::new()),
            ca_file: String::new(),
        }
    }
}

fn endpoint(text: &str) -> Result<Option<Url>, ConfigError> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let invalid = |reason: String| ConfigError::Invalid {
        key: "tracing.otlp_endpoint",
        reason,
    };
    // The parser's message never quotes the URL, which may hold a credential.
    let url = Url::parse(text).map_err(|e| invalid(format!("not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {:?}: OTLP/HTTP takes http or https",
            url.scheme()
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("the URL names no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() || url.query().is_some() {
        return Err(invalid(
            "credentials belong in tracing.headers, not in the URL (no user, password or query)"
                .into(),
        ));
    }
    Ok(Some(url))
}

/// A header as HTTP takes it: a token name, a value of visible characters and spaces. Neither
/// is repeated in a refusal past its name: the value is a secret.
fn header(name: &str, value: &str) -> Result<(String, String), ConfigError> {
    let invalid = |reason: String| ConfigError::Invalid {
        key: "tracing.headers",
        reason,
    };
    let name = name.trim();
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Err(invalid(format!("{name:?} is not an HTTP header name")));
    }
    let value = value.trim();
    if !value
        .chars()
        .all(|c| c == ' ' || c == '\t' || c.is_ascii_graphic())
    {
        return Err(invalid(format!(
            "the value of {name} has characters an HTTP header cannot carry"
        )));
    }
    Ok((name.to_ascii_lowercase(), value.to_owned()))
}

fn headers(raw: &RawHeaders) -> Result<ExportHeaders, ConfigError> {
    let pairs: Vec<(String, String)> = match raw {
        RawHeaders::Table(table) => table
            .iter()
            .map(|(n, v)| header(n, v))
            .collect::<Result<_, _>>()?,
        RawHeaders::Text(text) => text
            .split(',')
            .filter(|part| !part.trim().is_empty())
            .map(|part| {
                let (name, value) = part.split_once('=').ok_or(ConfigError::Invalid {
                    key: "tracing.headers",
                    reason: "write name=value pairs separated by commas".into(),
                })?;
                let value = percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map_err(|_| ConfigError::Invalid {
                        key: "tracing.headers",
                        reason: format!("the value of {} is not UTF-8", name.trim()),
                    })?;
                header(name, &value)
            })
            .collect::<Result<_, _>>()?,
    };
    Ok(ExportHeaders(pairs))
}

/// The section's validate step (see [`super::Config`]): a refused value is recorded and replaced
/// by its default. Relative paths are resolved against `base_dir`.
pub(super) fn validate(raw: RawTracing, base_dir: &Path, p: &mut Problems) -> TracingConfig {
    let d = TracingConfig::default();
    let sample_ratio = if (0.0..=1.0).contains(&raw.sample_ratio) {
        raw.sample_ratio
    } else {
        p.push(ConfigError::Invalid {
            key: "tracing.sample_ratio",
            reason: format!("{} is outside 0.0..=1.0", raw.sample_ratio),
        });
        d.sample_ratio
    };
    let service_name = raw.service_name.trim();
    let service_name = if service_name.is_empty() || service_name.len() > 255 {
        p.push(ConfigError::Invalid {
            key: "tracing.service_name",
            reason: "must be 1 to 255 characters".into(),
        });
        d.service_name.clone()
    } else {
        service_name.to_owned()
    };
    let ca_file = raw.ca_file.trim();
    TracingConfig {
        otlp_endpoint: p.take(endpoint(&raw.otlp_endpoint), None),
        service_name,
        sample_ratio,
        headers: p.take(headers(&raw.headers), ExportHeaders::default()),
        ca_file: (!ca_file.is_empty()).then(|| base_dir.join(ca_file)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::io::Write;

    fn load_with_origins(
        text: &str,
        env: &[(&str, &str)],
    ) -> Result<(TracingConfig, TracingOrigins), ConfigError> {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
        Config::load_from(Some(f.path()), env, &[]).map(|c| (c.tracing, c.tracing_origins))
    }

    fn load(text: &str, env: &[(&str, &str)]) -> Result<TracingConfig, ConfigError> {
        load_with_origins(text, env).map(|(c, _)| c)
    }

    #[test]
    fn off_by_default() {
        let c = Config::load_from(None, Vec::new(), &[]).unwrap().tracing;
        assert!(!c.enabled());
        assert_eq!(c.service_name, "tombstoned");
        assert_eq!(c.sample_ratio, 1.0);
        assert_eq!(c.traces_url(), None);
        assert_eq!(c.endpoint_display(), "(not set)");
    }

    #[test]
    fn the_traces_path_is_appended_to_the_base_endpoint() {
        for (base, url) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            ("http://c:4318/", "http://c:4318/v1/traces"),
            ("https://c/otlp", "https://c/otlp/v1/traces"),
            ("https://c/otlp/v1/traces", "https://c/otlp/v1/traces"),
        ] {
            let (c, origins) =
                load_with_origins(&format!("[tracing]\notlp_endpoint = {base:?}\n"), &[]).unwrap();
            assert_eq!(c.traces_url().unwrap().as_str(), url, "{base}");
            assert_eq!(origins.endpoint, Origin::File);
        }
    }

    #[test]
    fn the_file_wins_over_the_otel_variables_which_win_over_the_defaults() {
        let otel = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env:4318"),
            ("OTEL_SERVICE_NAME", "from-env"),
        ];
        let (c, origins) = load_with_origins("", &otel).unwrap();
        assert_eq!(
            c.traces_url().unwrap().as_str(),
            "http://env:4318/v1/traces"
        );
        assert_eq!(c.service_name, "from-env");
        assert_eq!(
            origins.endpoint,
            Origin::OtelVariable("OTEL_EXPORTER_OTLP_ENDPOINT")
        );
        assert_eq!(
            origins.service_name,
            Origin::OtelVariable("OTEL_SERVICE_NAME")
        );
        let (c, origins) = load_with_origins(
            "[tracing]\notlp_endpoint = \"http://file:4318\"\nservice_name = \"from-file\"\n",
            &otel,
        )
        .unwrap();
        assert_eq!(c.traces_url().unwrap().host_str(), Some("file"));
        assert_eq!(c.service_name, "from-file");
        assert_eq!(origins.endpoint, Origin::File);
        // An empty variable is an unset one (the specification's rule).
        let c = load("", &[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]).unwrap();
        assert!(!c.enabled());
        // tombstoned's own variable is the file's key, above both.
        let c = load(
            "[tracing]\nservice_name = \"from-file\"\n",
            &[
                ("TOMBSTONED_TRACING__SERVICE_NAME", "mine"),
                ("OTEL_SERVICE_NAME", "from-env"),
            ],
        )
        .unwrap();
        assert_eq!(c.service_name, "mine");
    }

    #[test]
    fn headers_come_as_a_table_or_as_the_otlp_text_and_never_show_their_values() {
        let c = load(
            "[tracing]\notlp_endpoint = \"https://c\"\nheaders = { Authorization = \"Bearer s3cret\", x-team = \"a b\" }\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.headers.names(), ["authorization", "x-team"]);
        assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");
        let c = load(
            "",
            &[(
                "TOMBSTONED_TRACING__HEADERS",
                "authorization=Basic%20czNjcmV0,x-a=1",
            )],
        )
        .unwrap();
        let exposed: Vec<_> = c.headers.expose().collect();
        assert_eq!(exposed, [("authorization", "Basic czNjcmV0"), ("x-a", "1")]);
    }

    #[test]
    fn nonsense_is_refused_naming_the_key_and_never_the_secret() {
        for (text, key) in [
            ("[tracing]\nsample_ratio = 1.5\n", "tracing.sample_ratio"),
            ("[tracing]\nsample_ratio = -0.1\n", "tracing.sample_ratio"),
            (
                "[tracing]\notlp_endpoint = \"grpc://c:4317\"\n",
                "tracing.otlp_endpoint",
            ),
            (
                "[tracing]\notlp_endpoint = \"not a url\"\n",
                "tracing.otlp_endpoint",
            ),
            (
                "[tracing]\notlp_endpoint = \"https://u:s3cret@c/\"\n",
                "tracing.otlp_endpoint",
            ),
            ("[tracing]\nservice_name = \"\"\n", "tracing.service_name"),
            (
                "[tracing]\nheaders = { \"bad name\" = \"s3cret\" }\n",
                "tracing.headers",
            ),
            (
                "[tracing]\nheaders = { authorization = \"s3cret\\u0007x\" }\n",
                "tracing.headers",
            ),
            ("[tracing]\nfrobnicate = 1\n", "frobnicate"),
        ] {
            let e = load(text, &[]).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?}: {e}");
            assert!(!e.contains("s3cret"), "{text:?}: {e}");
        }
    }
}

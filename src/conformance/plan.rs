//! What a conformance run is asked to do, validated once into values the checks trust: the URL
//! and method, the two body templates, the headers (credentials), the key header, the
//! concurrency and the expiry to wait for — or a [`PlanError`] naming the flag that is wrong.

use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use reqwest::{Method, Url};

use super::body::Template;

/// The fewest and the most requests `concurrent` sends at once (`--concurrency`).
pub const CONCURRENCY_RANGE: std::ops::RangeInclusive<usize> = 2..=32;
/// `--concurrency` when not given.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// The longest `--expiry`: `expired` polls at most [`EXPIRY_POLLS`] times within it, so a longer
/// window would poll too rarely to say when the 410 came.
pub const MAX_EXPIRY: Duration = Duration::from_secs(3600);
/// How many times at most `expired` asks before its `--expiry` is over: once a second, or less
/// often for an expiry longer than this many seconds.
pub const EXPIRY_POLLS: u32 = 240;

/// The command line's values, as given.
#[derive(Debug, Clone, Default)]
pub struct RawPlan {
    /// The endpoint's URL.
    pub url: String,
    /// `--method`.
    pub method: String,
    /// `--body`.
    pub body: String,
    /// `--other-body`.
    pub other_body: String,
    /// `--header`, each `Name: value`.
    pub headers: Vec<String>,
    /// `--other-principal-header`, each `Name: value`.
    pub other_principal_headers: Vec<String>,
    /// `--key-header`.
    pub key_header: String,
    /// `--key-optional`.
    pub key_optional: bool,
    /// `--concurrency`.
    pub concurrency: String,
    /// `--expiry`.
    pub expiry: Option<String>,
}

/// A validated run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The endpoint.
    pub url: Url,
    /// Its method.
    pub method: Method,
    /// The request (`--body`).
    pub body: Template,
    /// Another intent (`--other-body`).
    pub other_body: Template,
    /// Sent with every request (`--header`).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Replace the headers of the same name for `scoped` (`--other-principal-header`).
    pub other_principal_headers: Vec<(HeaderName, HeaderValue)>,
    /// The idempotency key's header.
    pub key_header: HeaderName,
    /// Whether the service may answer a request without a key (`--key-optional`).
    pub key_optional: bool,
    /// How many requests `concurrent` sends at once.
    pub concurrency: usize,
    /// How long after its first answer a key is answered 410 at the latest (`--expiry`).
    pub expiry: Option<Duration>,
}

/// A value on the command line that cannot be used: a usage error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// Not an absolute http(s) URL.
    #[error("the URL {given:?} is not an http:// or https:// URL: {reason}")]
    Url {
        /// As given.
        given: String,
        /// Why.
        reason: String,
    },
    /// Not a method token.
    #[error("--method {0:?} is not an HTTP method")]
    Method(String),
    /// `--body` or `--other-body` is not JSON (with `{{uuid}}` replaced).
    #[error("{flag} is not JSON ({reason}); `{{{{uuid}}}}` may stand inside strings only")]
    Json {
        /// The flag.
        flag: &'static str,
        /// serde_json's account.
        reason: String,
    },
    /// `--other-body` says what `--body` says.
    #[error("--other-body is the same intent as --body: give a request that differs in a business field (e.g. the amount)")]
    SameIntent,
    /// A header that is not `Name: value`.
    #[error("{flag} {given:?} is not `Name: value` ({reason})")]
    Header {
        /// The flag.
        flag: &'static str,
        /// As given.
        given: String,
        /// Why.
        reason: &'static str,
    },
    /// `--key-header` is not a header name.
    #[error("--key-header {0:?} is not a header name")]
    KeyHeader(String),
    /// `--concurrency` out of range.
    #[error("--concurrency {0:?}: give a whole number from 2 to 32")]
    Concurrency(String),
    /// `--expiry` is not a duration, or too long.
    #[error("--expiry {given:?}: {reason}")]
    Expiry {
        /// As given.
        given: String,
        /// Why.
        reason: String,
    },
}

impl Plan {
    /// Validates `raw`.
    pub fn new(raw: &RawPlan) -> Result<Plan, PlanError> {
        let url = Url::parse(&raw.url).map_err(|e| PlanError::Url {
            given: raw.url.clone(),
            reason: e.to_string(),
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(PlanError::Url {
                given: raw.url.clone(),
                reason: format!("the scheme is {:?}", url.scheme()),
            });
        }
        let method = Method::from_bytes(raw.method.as_bytes())
            .map_err(|_| PlanError::Method(raw.method.clone()))?;
        let template = |flag: &'static str, text: &str| {
            Template::new(text).map_err(|e| PlanError::Json {
                flag,
                reason: e.to_string(),
            })
        };
        let body = template("--body", &raw.body)?;
        let other_body = template("--other-body", &raw.other_body)?;
        let probe = uuid::Uuid::nil();
        if body.value(probe) == other_body.value(probe) {
            return Err(PlanError::SameIntent);
        }
        let headers = parse_headers("--header", &raw.headers)?;
        let other_principal_headers =
            parse_headers("--other-principal-header", &raw.other_principal_headers)?;
        let key_header = HeaderName::from_bytes(raw.key_header.trim().as_bytes())
            .map_err(|_| PlanError::KeyHeader(raw.key_header.clone()))?;
        let concurrency = raw
            .concurrency
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|n| CONCURRENCY_RANGE.contains(n))
            .ok_or_else(|| PlanError::Concurrency(raw.concurrency.clone()))?;
        let expiry = raw.expiry.as_deref().map(parse_expiry).transpose()?;
        Ok(Plan {
            url,
            method,
            body,
            other_body,
            headers,
            other_principal_headers,
            key_header,
            key_optional: raw.key_optional,
            concurrency,
            expiry,
        })
    }

    /// The headers the other principal sends: `--header`, each replaced by the
    /// `--other-principal-header` of the same name, and those of other names added.
    pub fn other_principal(&self) -> Vec<(HeaderName, HeaderValue)> {
        let replaced =
            |name: &HeaderName| self.other_principal_headers.iter().any(|(n, _)| n == name);
        self.headers
            .iter()
            .filter(|(name, _)| !replaced(name))
            .chain(self.other_principal_headers.iter())
            .cloned()
            .collect()
    }

    /// How long `expired` waits between two requests.
    pub fn expiry_interval(&self) -> Duration {
        self.expiry.map_or(Duration::from_secs(1), |e| {
            (e / EXPIRY_POLLS).max(Duration::from_secs(1))
        })
    }
}

fn parse_headers(
    flag: &'static str,
    given: &[String],
) -> Result<Vec<(HeaderName, HeaderValue)>, PlanError> {
    given
        .iter()
        .map(|text| {
            let bad = |reason| PlanError::Header {
                flag,
                given: text.clone(),
                reason,
            };
            let (name, value) = text.split_once(':').ok_or_else(|| bad("no colon"))?;
            let name = HeaderName::from_bytes(name.trim().as_bytes())
                .map_err(|_| bad("not a header name before the colon"))?;
            let value = HeaderValue::from_str(value.trim())
                .map_err(|_| bad("the value holds a character a header cannot"))?;
            Ok((name, value))
        })
        .collect()
}

fn parse_expiry(text: &str) -> Result<Duration, PlanError> {
    let bad = |reason: String| PlanError::Expiry {
        given: text.to_owned(),
        reason,
    };
    let expiry = humantime::parse_duration(text.trim())
        .map_err(|e| bad(format!("not a duration ({e}), e.g. \"30s\"")))?;
    if expiry.is_zero() || expiry > MAX_EXPIRY {
        return Err(bad("give a duration from 1s to 1h".to_owned()));
    }
    Ok(expiry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawPlan {
        RawPlan {
            url: "http://127.0.0.1:8080/v1/orders".into(),
            method: "POST".into(),
            body: r#"{"request_id": "{{uuid}}", "amount": "100.00"}"#.into(),
            other_body: r#"{"request_id": "{{uuid}}", "amount": "120.00"}"#.into(),
            headers: vec!["Authorization: Bearer a".into(), "X-Tenant: acme".into()],
            other_principal_headers: vec!["Authorization: Bearer b".into()],
            key_header: "Idempotency-Key".into(),
            key_optional: false,
            concurrency: "8".into(),
            expiry: Some("30s".into()),
        }
    }

    #[test]
    fn a_valid_command_line_is_a_plan() {
        let plan = Plan::new(&raw()).unwrap();
        assert_eq!(plan.method, Method::POST);
        assert_eq!(plan.concurrency, 8);
        assert_eq!(plan.expiry, Some(Duration::from_secs(30)));
        assert_eq!(plan.expiry_interval(), Duration::from_secs(1));
        let other: Vec<String> = plan
            .other_principal()
            .iter()
            .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
            .collect();
        assert_eq!(other, ["x-tenant: acme", "authorization: Bearer b"]);
        let hour = Plan::new(&RawPlan {
            expiry: Some("1h".into()),
            ..raw()
        })
        .unwrap();
        assert_eq!(hour.expiry_interval(), Duration::from_secs(15));
    }

    #[test]
    fn each_bad_value_is_named() {
        let cases: Vec<(RawPlan, &str)> = vec![
            (
                RawPlan {
                    url: "127.0.0.1:8080/x".into(),
                    ..raw()
                },
                "is not an http:// or https:// URL",
            ),
            (
                RawPlan {
                    url: "ftp://host/x".into(),
                    ..raw()
                },
                "the scheme is \"ftp\"",
            ),
            (
                RawPlan {
                    method: "PO ST".into(),
                    ..raw()
                },
                "--method \"PO ST\" is not an HTTP method",
            ),
            (
                RawPlan {
                    body: "{\"a\":".into(),
                    ..raw()
                },
                "--body is not JSON (EOF while parsing",
            ),
            (
                RawPlan {
                    other_body: "{{uuid}}".into(),
                    ..raw()
                },
                "--other-body is not JSON",
            ),
            (
                RawPlan {
                    other_body: r#"{"amount": "100.00", "request_id": "{{uuid}}"}"#.into(),
                    ..raw()
                },
                "--other-body is the same intent as --body",
            ),
            (
                RawPlan {
                    headers: vec!["Authorization Bearer a".into()],
                    ..raw()
                },
                "--header \"Authorization Bearer a\" is not `Name: value` (no colon)",
            ),
            (
                RawPlan {
                    other_principal_headers: vec!["Bad Name: x".into()],
                    ..raw()
                },
                "--other-principal-header \"Bad Name: x\" is not `Name: value`",
            ),
            (
                RawPlan {
                    key_header: "Idempotency Key".into(),
                    ..raw()
                },
                "--key-header",
            ),
            (
                RawPlan {
                    concurrency: "1".into(),
                    ..raw()
                },
                "--concurrency \"1\": give a whole number from 2 to 32",
            ),
            (
                RawPlan {
                    concurrency: "many".into(),
                    ..raw()
                },
                "--concurrency \"many\"",
            ),
            (
                RawPlan {
                    expiry: Some("soon".into()),
                    ..raw()
                },
                "--expiry \"soon\": not a duration",
            ),
            (
                RawPlan {
                    expiry: Some("2h".into()),
                    ..raw()
                },
                "give a duration from 1s to 1h",
            ),
        ];
        for (raw, says) in cases {
            let error = Plan::new(&raw).unwrap_err().to_string();
            assert!(error.contains(says), "{error:?} should say {says:?}");
            assert!(!error.contains('\n'), "one line: {error:?}");
        }
    }
}

//! What a conformance run found: one [`CheckReport`] per check, in the checks' order, each with
//! its result, what it expected, what it got and every request it sent with the answer; the
//! summary. `tombstoned conformance` renders it as its report lines or as its `--json` document
//! (this type, serialised) and maps it to the exit status.

use serde::{Serialize, Serializer};

/// The result of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    /// The service kept the rule.
    Pass,
    /// It did not (or gave no answer to judge).
    Fail,
    /// Not run: a flag it needs was not given, or an earlier check left nothing to check.
    Skip,
}

/// One header as sent or received. Credentials (`Authorization`, every `--header` and
/// `--other-principal-header`) are recorded as [`REDACTED`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Header {
    /// Its name, as sent (lower case as received).
    pub name: String,
    /// Its value (lossy UTF-8), or [`REDACTED`].
    pub value: String,
}

/// What a credential's value is recorded as.
pub const REDACTED: &str = "[redacted]";

/// A request as sent.
#[derive(Debug, Clone, Serialize)]
pub struct Sent {
    /// The method.
    pub method: String,
    /// The URL.
    pub url: String,
    /// The headers, in the order they were given to the client (credentials redacted).
    pub headers: Vec<Header>,
    /// The body, exactly as sent.
    pub body: String,
}

/// An answer, read whole (up to the run's bound on an answer's size).
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The headers, in the order received.
    pub headers: Vec<Header>,
    /// The body, byte for byte (rendered as lossy UTF-8 in the JSON document).
    #[serde(serialize_with = "lossy_text")]
    pub body: Vec<u8>,
}

fn lossy_text<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&String::from_utf8_lossy(bytes))
}

impl Answer {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value.as_str())
    }

    /// Whether it carries `Idempotent-Replayed: true`.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    }

    /// Whether its `Content-Type` is `application/problem+json` (RFC 9457; parameters aside).
    pub fn is_problem(&self) -> bool {
        self.header("content-type").is_some_and(|v| {
            v.split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .eq_ignore_ascii_case("application/problem+json")
        })
    }

    /// Its `Location`.
    pub fn location(&self) -> Option<&str> {
        self.header("location")
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoAnswer {
    /// No connection could be made (refused, no such host, TLS handshake, connect timeout).
    #[error("cannot connect: {0}")]
    Unreachable(String),
    /// Connected, but the answer did not come (whole) in time or broke off.
    #[error("no answer: {0}")]
    Failed(String),
    /// The answer's body is larger than the run reads.
    #[error("the answer's body is larger than {0} bytes")]
    TooLarge(usize),
    /// Not sent: the run's request budget is spent.
    #[error("not sent: the run's budget of {0} requests is spent")]
    Budget(usize),
    /// Not sent: the run's time limit has passed.
    #[error("not sent: the run's time limit ({0}) has passed")]
    RunTimeout(String),
}

fn display<S: Serializer>(error: &Option<NoAnswer>, serializer: S) -> Result<S::Ok, S::Error> {
    match error {
        Some(e) => serializer.serialize_str(&e.to_string()),
        None => serializer.serialize_none(),
    }
}

/// A request and what came back.
#[derive(Debug, Clone, Serialize)]
pub struct Exchange {
    /// The request.
    pub request: Sent,
    /// The answer, if one came.
    pub answer: Option<Answer>,
    /// Why none came.
    #[serde(serialize_with = "display")]
    pub error: Option<NoAnswer>,
}

/// One check's result.
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    /// Its name (`first`, `replay`, ...).
    pub name: &'static str,
    /// Pass, fail or skip.
    pub result: Outcome,
    /// What the rule requires (for a failure: the part that was not met).
    pub expected: String,
    /// What the service answered (for a skip: why the check did not run).
    pub got: String,
    /// Every request the check sent, in order, with its answer.
    pub requests: Vec<Exchange>,
}

/// How many checks passed, failed and were skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Summary {
    /// Passed.
    pub passed: usize,
    /// Failed.
    pub failed: usize,
    /// Skipped.
    pub skipped: usize,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The URL checked.
    pub url: String,
    /// The method used.
    pub method: String,
    /// Every check, in order.
    pub checks: Vec<CheckReport>,
    /// The counts.
    pub summary: Summary,
    /// How many requests the run sent.
    pub requests_sent: usize,
}

impl Report {
    /// The report of `checks`, counted.
    pub fn new(
        url: String,
        method: String,
        checks: Vec<CheckReport>,
        requests_sent: usize,
    ) -> Self {
        let mut summary = Summary::default();
        for check in &checks {
            match check.result {
                Outcome::Pass => summary.passed += 1,
                Outcome::Fail => summary.failed += 1,
                Outcome::Skip => summary.skipped += 1,
            }
        }
        Report {
            url,
            method,
            checks,
            summary,
            requests_sent,
        }
    }

    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.summary.failed > 0
    }
}

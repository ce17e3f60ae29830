//! `tombstoned conformance URL --body JSON --other-body JSON [...]`: the flags, validated into a
//! [`Plan`] by the service; the run; its report rendered as one line per check and the summary
//! (or the `--json` document); exit 0 when nothing failed, 1 when a check failed, 64 for a value
//! it cannot use, 69 when the URL cannot be reached at all. Needs no configuration file.

use clap::Args;

use crate::conformance::{self, CheckReport, Outcome, Plan, RawPlan, Report};
use crate::exit::Exit;
use crate::stdout;

/// The man page's and `--help`'s description of the command.
pub const LONG_ABOUT: &str = "\
Check that a running HTTP endpoint keeps the idempotency contract, from outside: nine checks, in \
this order, each printed as one line (PASS name; FAIL name: expected ..., got ...; or SKIP name: \
why), then the line N passed, M failed, K skipped.

first: a fresh key gets a final answer (2xx, or a 4xx other than 400, 401, 403, 404, 409, 422 \
and 429), not marked replayed; it is remembered. replay: the same key and body get the same \
status, the same body byte for byte, Idempotent-Replayed: true, and the same Location if the \
first answer had one. replay_reordered: the same, for the body with its object members \
reordered and its whitespace changed at every level (every value's text kept). key_reused: the \
key with --other-body gets 422 application/problem+json with no identifier or value of the first \
answer in it. concurrent: --concurrency requests with one fresh key, released together, get \
exactly one answer not marked replayed; every other is a byte-for-byte replay of it, or a 409 \
with Retry-After that, retried after it, ends as one. missing_key: a request without the key \
header gets a 400 problem (skipped with --key-optional, provided it gets a first answer). \
invalid_key: an empty key and a key of 256 characters get a 400 problem each. scoped (with \
--other-principal-header): the first key and body sent as another principal never get the first \
principal's answer, but a fresh first answer or a refusal naming nothing of it. expired (with \
--expiry): the first key and body, asked about once a second, get replays and then, within \
--expiry of the first answer, 410 application/problem+json (with the first answer's Location) - \
never a fresh execution; then --other-body with the key still gets 422.

Keys are fresh random UUIDs per check. {{uuid}} in a body is replaced by a fresh UUID per key, \
the same in every request with that key, so business ids stay unique and the command can run \
against a live service again and again. Bounded: every request has 10 s, the whole run 2 min \
plus --expiry; it sends at most 500 requests and reads at most 1 MiB of an answer; a 409 is \
retried at most 5 times, after its Retry-After (at most 30 s).

The --json document lists, for every check, its name, result, expected, got and every request \
it sent (method, URL, headers, body) with the answer (status, headers, body), then the summary. \
The values of Authorization and of every --header and --other-principal-header are written as \
[redacted] there: they are credentials. Bodies are shown as sent and received.

Exit status: 0 when no check failed, 1 when one did, 64 for a value it cannot use (a body that \
is not JSON, a header that is not Name: value, a URL, duration or number it cannot use), 69 when \
the URL cannot be reached at all.";

/// `tombstoned conformance`
#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// The endpoint to check, e.g. http://127.0.0.1:8080/v1/orders.
    #[arg(value_name = "URL")]
    pub url: String,
    /// The request (JSON). {{uuid}} in it is replaced by a fresh UUID per key, the same in every
    /// request with that key: give the business id that way, e.g. '{"request_id": "{{uuid}}",
    /// ...}'.
    #[arg(long, value_name = "JSON")]
    pub body: String,
    /// Another intent for the same endpoint (JSON, the same placeholders), e.g. the request with
    /// another amount.
    #[arg(long, value_name = "JSON")]
    pub other_body: String,
    /// The method of every request.
    #[arg(long, value_name = "METHOD", default_value = "POST")]
    pub method: String,
    /// A header sent with every request, e.g. 'Authorization: Bearer ...' (repeatable). Its value
    /// is a credential: [redacted] in --json.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// Credentials of another principal of the same tenant for scoped, replacing the --header
    /// of the same name (repeatable; [redacted] in --json). Without it, scoped is skipped.
    #[arg(long = "other-principal-header", value_name = "NAME: VALUE")]
    pub other_principal_headers: Vec<String>,
    /// The idempotency key's header.
    #[arg(long, value_name = "NAME", default_value = "Idempotency-Key")]
    pub key_header: String,
    /// The service answers requests without a key: missing_key is skipped, provided such a
    /// request gets a first answer.
    #[arg(long)]
    pub key_optional: bool,
    /// How many requests concurrent sends at once, 2 to 32.
    #[arg(long, value_name = "N", default_value = "8")]
    pub concurrency: String,
    /// How long after its first answer a key is answered 410 at the latest (the replay window
    /// plus the cleanup's delay), e.g. 30s, at most 1h; expired asks about once a second until
    /// then. Without it, expired is skipped.
    #[arg(long, value_name = "DURATION")]
    pub expiry: Option<String>,
    /// Print one JSON document instead: every check with its name, result, expected, got and
    /// requests (credentials [redacted]), and the summary.
    #[arg(long)]
    pub json: bool,
}

impl ConformanceArgs {
    fn raw(&self) -> RawPlan {
        RawPlan {
            url: self.url.clone(),
            method: self.method.clone(),
            body: self.body.clone(),
            other_body: self.other_body.clone(),
            headers: self.headers.clone(),
            other_principal_headers: self.other_principal_headers.clone(),
            key_header: self.key_header.clone(),
            key_optional: self.key_optional,
            concurrency: self.concurrency.clone(),
            expiry: self.expiry.clone(),
        }
    }
}

/// Runs `tombstoned conformance`.
pub(super) async fn run(args: &ConformanceArgs) -> anyhow::Result<Exit> {
    let plan = Plan::new(&args.raw())?;
    let report = conformance::run(&plan).await?;
    if args.json {
        stdout::print(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        stdout::print(&render(&report))?;
    }
    Ok(if report.failed() {
        Exit::ChecksFailed
    } else {
        Exit::Success
    })
}

/// `PASS name`, `FAIL name: expected …, got …` or `SKIP name: why`.
fn line(check: &CheckReport) -> String {
    match check.result {
        Outcome::Pass => format!("PASS {}", check.name),
        Outcome::Fail => format!(
            "FAIL {}: expected {}, got {}",
            check.name, check.expected, check.got
        ),
        Outcome::Skip => format!("SKIP {}: {}", check.name, check.got),
    }
}

/// One line per check, then `N passed, M failed, K skipped`.
fn render(report: &Report) -> String {
    let mut out = String::new();
    for check in &report.checks {
        out.push_str(&line(check));
        out.push('\n');
    }
    let s = report.summary;
    out.push_str(&format!(
        "{} passed, {} failed, {} skipped\n",
        s.passed, s.failed, s.skipped
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{
        CONCURRENCY_RANGE, DEFAULT_CONCURRENCY, MAX_ANSWER_BYTES, MAX_PENDING_RETRIES,
        MAX_REQUESTS, MAX_RETRY_AFTER, REQUEST_TIMEOUT, RUN_TIMEOUT,
    };

    fn check(name: &'static str, result: Outcome, expected: &str, got: &str) -> CheckReport {
        CheckReport {
            name,
            result,
            expected: expected.to_owned(),
            got: got.to_owned(),
            requests: Vec::new(),
        }
    }

    #[test]
    fn the_report_is_one_line_per_check_and_the_summary() {
        let report = Report::new(
            "http://127.0.0.1:1/x".into(),
            "POST".into(),
            vec![
                check("first", Outcome::Pass, "a final answer", "201"),
                check(
                    "replay",
                    Outcome::Fail,
                    "Idempotent-Replayed: true",
                    "201 without it",
                ),
                check(
                    "scoped",
                    Outcome::Skip,
                    "never",
                    "give --other-principal-header",
                ),
            ],
            3,
        );
        assert_eq!(
            render(&report),
            "PASS first\n\
             FAIL replay: expected Idempotent-Replayed: true, got 201 without it\n\
             SKIP scoped: give --other-principal-header\n\
             1 passed, 1 failed, 1 skipped\n"
        );
        assert!(report.failed());
    }

    /// The description states the bounds the code has.
    #[test]
    fn the_description_states_the_bounds() {
        let secs = |d: std::time::Duration| d.as_secs();
        for stated in [
            format!("every request has {} s", secs(REQUEST_TIMEOUT)),
            format!("the whole run {} min", secs(RUN_TIMEOUT) / 60),
            format!("at most {MAX_REQUESTS} requests"),
            format!("at most {} MiB of an answer", MAX_ANSWER_BYTES >> 20),
            format!("retried at most {MAX_PENDING_RETRIES} times"),
            format!("(at most {} s)", secs(MAX_RETRY_AFTER)),
        ] {
            assert!(LONG_ABOUT.contains(&stated), "{stated}");
        }
        assert_eq!(DEFAULT_CONCURRENCY, 8);
        assert_eq!(CONCURRENCY_RANGE, 2..=32);
        let names: Vec<&str> = crate::conformance::CHECKS.to_vec();
        let mut at = 0;
        for name in names {
            let found = LONG_ABOUT[at..]
                .find(&format!("{name}:"))
                .or_else(|| LONG_ABOUT[at..].find(&format!("{name} (")))
                .unwrap_or_else(|| panic!("{name} described in order"));
            at += found;
        }
    }
}

//! `tombstoned conformance`: whether any HTTP endpoint keeps the idempotency contract, checked
//! from outside against the running service — a retry never executes twice, a key reused for
//! another intent is refused, the answer replays byte for byte, and after the window the key
//! still never buys anything else. [`run`] sends the nine checks of [`CHECKS`] in order
//! (`checks`), through a client with explicit bounds (`client`: [`REQUEST_TIMEOUT`],
//! [`RUN_TIMEOUT`], [`MAX_REQUESTS`]), from a validated [`Plan`] (`plan`), with the bodies of
//! `body`, and returns a typed [`Report`] (`report`). It prints nothing: `cli::conformance`
//! renders the report and maps it to the exit status.

mod body;
mod checks;
mod client;
mod plan;
mod report;

pub use body::{IDENTIFIER_MIN_CHARS, PLACEHOLDER};
pub use checks::{CHECKS, MAX_KEY_CHARS};
pub use client::{
    CONNECT_TIMEOUT, MAX_ANSWER_BYTES, MAX_PENDING_RETRIES, MAX_REQUESTS, MAX_RETRY_AFTER,
    REQUEST_TIMEOUT, RUN_TIMEOUT,
};
pub use plan::{
    Plan, PlanError, RawPlan, CONCURRENCY_RANGE, DEFAULT_CONCURRENCY, EXPIRY_POLLS, MAX_EXPIRY,
};
pub use report::{
    Answer, CheckReport, Exchange, Header, NoAnswer, Outcome, Report, Sent, Summary, REDACTED,
};

/// Why a run could not judge the service at all.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    /// The first request could not connect (refused, no such host, TLS, connect timeout).
    #[error("cannot reach {url}: {reason}")]
    Unreachable {
        /// The URL.
        url: String,
        /// The innermost cause.
        reason: String,
    },
    /// The HTTP client could not be built (its TLS set-up).
    #[error("cannot set up the HTTP client")]
    Client(#[source] reqwest::Error),
}

/// Runs every check of `plan` against its URL, in [`CHECKS`]' order.
#[tracing::instrument(skip_all, fields(url = %plan.url))]
pub async fn run(plan: &Plan) -> Result<Report, ConformanceError> {
    let client = client::Client::new(plan).map_err(ConformanceError::Client)?;
    let mut run = checks::Run::new(plan, client.clone());
    let first = run
        .first()
        .await
        .map_err(|reason| ConformanceError::Unreachable {
            url: plan.url.to_string(),
            reason,
        })?;
    let checks = vec![
        first,
        run.replay().await,
        run.replay_reordered().await,
        run.key_reused().await,
        run.concurrent().await,
        run.missing_key().await,
        run.invalid_key().await,
        run.scoped().await,
        run.expired().await,
    ];
    for check in &checks {
        tracing::debug!(check = check.name, result = ?check.result, "conformance check");
    }
    Ok(Report::new(
        plan.url.to_string(),
        plan.method.to_string(),
        checks,
        client.sent(),
    ))
}

//! The HTTP side of a conformance run, and its bounds: every request has a timeout, the whole
//! run has one, at most [`MAX_REQUESTS`] requests are sent and at most [`MAX_ANSWER_BYTES`] of
//! an answer are read; redirects are not followed (the answer itself is judged). Each request
//! comes back as an [`Exchange`] with its credentials redacted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, Url};
use tokio::time::Instant;

use super::plan::Plan;
use super::report::{Answer, Exchange, Header, NoAnswer, Sent, REDACTED};

/// How long one request may take, connecting and reading the whole answer included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole run may take, on top of its `--expiry`.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(120);
/// The most requests one run sends: every check with its retries fits (`concurrent` at 32, each
/// 409 retried [`MAX_PENDING_RETRIES`] times, `expired` polling 240 times) with room to spare.
pub const MAX_REQUESTS: usize = 500;
/// The most bytes of one answer's body that are read.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The longest `Retry-After` honoured as given; a longer one is waited for this long.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(30);
/// How often a request answered "in progress" (409 with `Retry-After`) is sent again.
pub const MAX_PENDING_RETRIES: usize = 5;

/// A request to send: its headers (the key's included) and body; method and URL are the run's.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// The headers, in order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// The body.
    pub body: String,
}

/// The run's HTTP client: one connection pool, the run's deadline and its request count.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    url: Url,
    method: Method,
    deadline: Instant,
    run_timeout: Duration,
    sent: Arc<AtomicUsize>,
    /// Header names whose values are credentials.
    secret: Arc<Vec<HeaderName>>,
}

impl Client {
    /// The client of `plan`'s run, whose clock starts now.
    pub fn new(plan: &Plan) -> Result<Client, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(*super::plan::CONCURRENCY_RANGE.end())
            .user_agent(concat!(
                "tombstoned-conformance/",
                env!("CARGO_PKG_VERSION")
            ))
            .build()?;
        let mut secret = vec![AUTHORIZATION];
        for (name, _) in plan.headers.iter().chain(&plan.other_principal_headers) {
            if !secret.contains(name) {
                secret.push(name.clone());
            }
        }
        let run_timeout = RUN_TIMEOUT + plan.expiry.unwrap_or_default();
        Ok(Client {
            http,
            url: plan.url.clone(),
            method: plan.method.clone(),
            deadline: Instant::now() + run_timeout,
            run_timeout,
            sent: Arc::new(AtomicUsize::new(0)),
            secret: Arc::new(secret),
        })
    }

    /// How many requests went out so far.
    pub fn sent(&self) -> usize {
        self.sent.load(Ordering::Relaxed)
    }

    fn out_of_time(&self) -> NoAnswer {
        NoAnswer::RunTimeout(humantime::format_duration(self.run_timeout).to_string())
    }

    /// Sends `out` with a `Content-Type: application/json` unless it names one; returns the
    /// exchange, whatever happened.
    pub async fn send(&self, out: Outgoing) -> Exchange {
        let mut headers = out.headers;
        if !headers.iter().any(|(name, _)| name == CONTENT_TYPE) {
            headers.push((CONTENT_TYPE, HeaderValue::from_static("application/json")));
        }
        let request = Sent {
            method: self.method.to_string(),
            url: self.url.to_string(),
            headers: headers
                .iter()
                .map(|(name, value)| Header {
                    name: name.to_string(),
                    value: if self.secret.contains(name) {
                        REDACTED.to_owned()
                    } else {
                        String::from_utf8_lossy(value.as_bytes()).into_owned()
                    },
                })
                .collect(),
            body: out.body.clone(),
        };
        let outcome = self.exchange(headers, out.body).await;
        let (answer, error) = match outcome {
            Ok(answer) => (Some(answer), None),
            Err(e) => (None, Some(e)),
        };
        Exchange {
            request,
            answer,
            error,
        }
    }

    async fn exchange(
        &self,
        headers: Vec<(HeaderName, HeaderValue)>,
        body: String,
    ) -> Result<Answer, NoAnswer> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.out_of_time());
        }
        // Counted before sending, so that concurrent senders cannot pass the budget together.
        if self.sent.fetch_add(1, Ordering::Relaxed) >= MAX_REQUESTS {
            self.sent.fetch_sub(1, Ordering::Relaxed);
            return Err(NoAnswer::Budget(MAX_REQUESTS));
        }
        let mut request = self
            .http
            .request(self.method.clone(), self.url.clone())
            .timeout(left.min(REQUEST_TIMEOUT))
            .body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let mut response = request.send().await.map_err(|e| failure(&e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(name, value)| Header {
                name: name.to_string(),
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
            })
            .collect();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| failure(&e))? {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(NoAnswer::TooLarge(MAX_ANSWER_BYTES));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// Waits `wait`; refused when the run's deadline would come first (then it waits for
    /// nothing: the run is over).
    pub async fn pause(&self, wait: Duration) -> Result<(), NoAnswer> {
        let until = Instant::now() + wait;
        if until >= self.deadline {
            return Err(self.out_of_time());
        }
        tokio::time::sleep_until(until).await;
        Ok(())
    }
}

/// What went wrong, in the words of the innermost cause ("Connection refused (os error 111)"),
/// and whether a connection was made at all.
fn failure(error: &reqwest::Error) -> NoAnswer {
    let mut innermost: &dyn std::error::Error = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    let text = if error.is_timeout() {
        format!("timed out ({innermost})")
    } else {
        innermost.to_string()
    };
    if error.is_connect() {
        NoAnswer::Unreachable(text)
    } else {
        NoAnswer::Failed(text)
    }
}

/// The wait a `Retry-After` asks for (seconds or an HTTP date), at most [`MAX_RETRY_AFTER`].
pub fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    let wait = match value.parse::<u64>() {
        Ok(seconds) => Duration::from_secs(seconds),
        Err(_) => {
            let at = httpdate::parse_http_date(value).ok()?;
            at.duration_since(std::time::SystemTime::now())
                .unwrap_or_default()
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_or_a_date_and_is_capped() {
        assert_eq!(retry_after("1"), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(" 0 "), Some(Duration::ZERO));
        assert_eq!(retry_after("3600"), Some(MAX_RETRY_AFTER));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO),
            "a date in the past: now"
        );
        let soon = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(20));
        let wait = retry_after(&soon).unwrap();
        assert!(
            wait > Duration::from_secs(15) && wait <= Duration::from_secs(20),
            "{wait:?}"
        );
        assert_eq!(retry_after("soon"), None);
        assert_eq!(retry_after("-1"), None);
    }
}

//! One delivery over HTTP(S) in the Standard Webhooks convention (standardwebhooks.com):
//! the shared secret, the signature, and the POST with its bounded wait.
//!
//! ```text
//! POST <outbox.endpoint>
//! content-type: application/json
//! webhook-id: <event_id>                       the same on every attempt: the dedup key
//! webhook-timestamp: <unix seconds of this attempt>
//! webhook-signature: v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>
//! traceparent: <the delivery's span, W3C>      only for an event stored with a trace context
//!
//! <the event's JSON body: super::Event::body>
//! ```
//!
//! The secret file holds `whsec_<base64 of 24 to 64 random bytes>`, the convention's form; the
//! HMAC key is the decoded bytes. Redirects are not followed (a redirect would resend a signed
//! body somewhere the configuration does not name); TLS is verified against the system roots,
//! or against `outbox.ca_file` alone when it is set.

use std::fmt;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use reqwest::Url;
use sha2::Sha256;

use super::{Event, OutboxError};
use crate::config::OutboxConfig;

/// The prefix of a Standard Webhooks secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// How much of a response body is read (and discarded) so the connection can be reused.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Why a secret file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// It could not be read.
    #[error("cannot read it")]
    Read(#[source] std::io::Error),
    /// Group or others have some access to it.
    #[error(
        "its mode {mode:04o} gives group or others access; the secret signs every delivery: \
         chmod 600 (or 400) it"
    )]
    Exposed {
        /// The permission bits.
        mode: u32,
    },
    /// The text is not `whsec_<base64>` of 24 to 64 bytes.
    #[error("{0}")]
    Format(&'static str),
}

/// The shared signing key. Never printed.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    /// Reads `path`, refusing a file group or others can access.
    pub fn load(path: &Path) -> Result<Self, SecretError> {
        let mode = std::fs::metadata(path)
            .map_err(SecretError::Read)?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(SecretError::Exposed {
                mode: mode & 0o7777,
            });
        }
        let text = std::fs::read_to_string(path).map_err(SecretError::Read)?;
        Self::parse(&text)
    }

    /// Parses `whsec_<base64>` (surrounding whitespace ignored).
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let encoded = text
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(SecretError::Format(
                "it does not start with whsec_ (the Standard Webhooks secret form)",
            ))?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|_| SecretError::Format("the part after whsec_ is not valid base64"))?;
        if !(24..=64).contains(&key.len()) {
            return Err(SecretError::Format(
                "the secret must decode to 24 to 64 bytes (e.g. `openssl rand -base64 32`)",
            ));
        }
        Ok(Secret { key })
    }

    /// `v1,<base64 HMAC-SHA256 over "id.timestamp.body">`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        let tag = mac.finalize().into_bytes();
        format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(tag)
        )
    }
}

/// What the endpoint did with one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// It answered with this status.
    Status(u16),
    /// No complete answer within `outbox.request_timeout`: outcome unknown.
    Timeout,
    /// No connection, a TLS failure, or the connection broke; the reason on one line.
    Connection(String),
}

impl AttemptResult {
    /// The status, when there was an answer.
    pub fn status(&self) -> Option<u16> {
        match self {
            AttemptResult::Status(s) => Some(*s),
            _ => None,
        }
    }

    /// A one-line reason for `last_error` (no URL, no body).
    pub fn reason(&self) -> String {
        match self {
            AttemptResult::Status(s) => {
                let text = reqwest::StatusCode::from_u16(*s)
                    .ok()
                    .and_then(|c| c.canonical_reason())
                    .unwrap_or("");
                format!("HTTP {s} {text}").trim_end().to_owned()
            }
            AttemptResult::Timeout => "no answer within outbox.request_timeout".to_owned(),
            AttemptResult::Connection(reason) => reason.clone(),
        }
    }
}

/// One attempt and how long it took.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// What happened.
    pub result: AttemptResult,
    /// From sending to the end of the response (or the failure).
    pub duration: Duration,
}

/// The HTTP client of the relay: endpoint, secret, timeouts and TLS trust, ready to send.
#[derive(Clone)]
pub struct WebhookClient {
    http: reqwest::Client,
    endpoint: Url,
    secret: Secret,
    timeout: Duration,
}

impl fmt::Debug for WebhookClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookClient")
            .field(
                "endpoint",
                &crate::config::redacted_endpoint(&self.endpoint),
            )
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl WebhookClient {
    /// Builds the client from `[outbox]`: reads the secret file (refusing an exposed one) and
    /// the CA file, if any.
    pub fn new(config: &OutboxConfig) -> Result<Self, OutboxError> {
        let endpoint = config.endpoint.clone().ok_or(OutboxError::NotConfigured {
            key: "outbox.endpoint",
        })?;
        let secret_path = config
            .secret_file
            .as_deref()
            .ok_or(OutboxError::NotConfigured {
                key: "outbox.secret_file",
            })?;
        let secret = Secret::load(secret_path).map_err(|source| OutboxError::Secret {
            path: secret_path.to_owned(),
            source,
        })?;
        let mut builder = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tombstoned/", env!("CARGO_PKG_VERSION")))
            .pool_max_idle_per_host(config.concurrency);
        if let Some(ca_file) = &config.ca_file {
            let pem = std::fs::read(ca_file).map_err(|e| OutboxError::CaFile {
                path: ca_file.clone(),
                reason: e.to_string(),
            })?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| OutboxError::CaFile {
                    path: ca_file.clone(),
                    reason: "no PEM certificate in it".into(),
                })?;
            builder = builder.tls_certs_only(certificates);
        }
        Ok(WebhookClient {
            http: builder.build().map_err(OutboxError::Client)?,
            endpoint,
            secret,
            timeout: config.request_timeout,
        })
    }

    /// POSTs `event`, signed, and waits at most `outbox.request_timeout` for the whole answer.
    /// Never opens or touches a database transaction. `traceparent`: the delivery's span, sent
    /// as W3C Trace Context so the receiver continues the trace (outside the signature: it
    /// differs per attempt, and a receiver that ignores it loses nothing).
    pub async fn deliver(&self, event: &Event, traceparent: Option<&str>) -> Attempt {
        let started = Instant::now();
        let body = event.body();
        let id = event.event_id.to_string();
        let timestamp = chrono::Utc::now().timestamp();
        let signature = self.secret.sign(&id, timestamp, &body);
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature);
        if let Some(traceparent) = traceparent {
            request = request.header("traceparent", traceparent);
        }
        let request = request.body(body);
        let exchange = async {
            let mut response = request.send().await?;
            let status = response.status().as_u16();
            // Read (a bounded amount of) the body so the connection can serve the next event; a
            // failure here does not change what the status said.
            let mut read = 0;
            while let Ok(Some(chunk)) = response.chunk().await {
                read += chunk.len();
                if read > MAX_RESPONSE_BYTES {
                    break;
                }
            }
            Ok::<u16, reqwest::Error>(status)
        };
        // reqwest's own timeout covers the exchange; the outer one is a backstop a little later.
        let result =
            match tokio::time::timeout(self.timeout + Duration::from_millis(100), exchange).await {
                Ok(Ok(status)) => AttemptResult::Status(status),
                Ok(Err(e)) if e.is_timeout() => AttemptResult::Timeout,
                Ok(Err(e)) => AttemptResult::Connection(reason(e)),
                Err(_) => AttemptResult::Timeout,
            };
        Attempt {
            result,
            duration: started.elapsed(),
        }
    }
}

/// The error and its causes on one line, without the URL (which may carry credentials).
fn reason(e: reqwest::Error) -> String {
    crate::db::error_text(&e.without_url())
}

#[cfg(test)]
mod tests {
    use super::*;

    // The example of the Standard Webhooks specification (and of its reference libraries).
    const SPEC_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const SPEC_TIMESTAMP: i64 = 1614265330;
    const SPEC_BODY: &str = r#"{"test": 2432232314}"#;
    const SPEC_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    #[test]
    fn signature_matches_the_specification_example() {
        let secret = Secret::parse(SPEC_SECRET).unwrap();
        assert_eq!(
            secret.sign(SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY.as_bytes()),
            SPEC_SIGNATURE
        );
        assert_eq!(format!("{secret:?}"), "Secret(***)");
    }

    #[test]
    fn secrets_in_another_form_are_refused() {
        for bad in [
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_not*base64",
            "whsec_c2hvcnQ=",
        ] {
            assert!(Secret::parse(bad).is_err(), "{bad}");
        }
        assert!(Secret::parse(&format!("  {SPEC_SECRET}\n")).is_ok());
    }

    #[test]
    fn an_exposed_secret_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, SPEC_SECRET).unwrap();
        for (mode, ok) in [(0o600, true), (0o400, true), (0o640, false), (0o604, false)] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(Secret::load(&path).is_ok(), ok, "{mode:o}");
        }
        let e = Secret::load(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(e, SecretError::Read(_)));
    }

    #[test]
    fn reasons_are_one_line_without_bodies() {
        assert_eq!(
            AttemptResult::Status(503).reason(),
            "HTTP 503 Service Unavailable"
        );
        assert_eq!(AttemptResult::Status(599).reason(), "HTTP 599");
        assert_eq!(AttemptResult::Timeout.status(), None);
    }
}

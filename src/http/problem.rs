//! RFC 9457 problem details: every error the API answers with, in one table ([`ProblemType`]),
//! and their `application/problem+json` rendering. docs/api.md and docs/openapi.json list the
//! same table; a test keeps them equal.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

/// Prefix of every problem `type` URI (a tag URI, RFC 4151: stable, not dereferenceable; the
/// types are documented in docs/api.md under their short names).
pub const TYPE_PREFIX: &str = "tag:tombstoned,2026:problem:";

/// The media type of problem documents.
pub const PROBLEM_JSON: &str = "application/problem+json";

macro_rules! problem_types {
    ($($variant:ident => ($status:literal, $name:literal, $title:literal),)*) => {
        /// Every problem type the API can answer with.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ProblemType {
            $(
                #[doc = $title]
                $variant,
            )*
        }

        impl ProblemType {
            /// All of them, in documentation order.
            pub const ALL: &'static [ProblemType] = &[$(ProblemType::$variant,)*];

            /// The HTTP status.
            pub fn status(self) -> u16 {
                match self { $(ProblemType::$variant => $status,)* }
            }

            /// The short name (the end of the `type` URI).
            pub fn name(self) -> &'static str {
                match self { $(ProblemType::$variant => $name,)* }
            }

            /// The `title`: fixed per type.
            pub fn title(self) -> &'static str {
                match self { $(ProblemType::$variant => $title,)* }
            }
        }
    };
}

problem_types! {
    InvalidIdempotencyKey => (400, "invalid-idempotency-key", "The Idempotency-Key header is missing or invalid"),
    UnsupportedApiVersion => (400, "unsupported-api-version", "The Api-Version header names an unsupported version"),
    MalformedJson => (400, "malformed-json", "The body is not an acceptable JSON object"),
    ValidationFailed => (400, "validation-failed", "One or more fields are invalid"),
    Unauthenticated => (401, "unauthenticated", "A valid bearer token is required"),
    PermissionDenied => (403, "permission-denied", "The token lacks the permission this request needs"),
    OrderNotFound => (404, "order-not-found", "No such order"),
    IdempotencyKeyNotFound => (404, "idempotency-key-not-found", "No such idempotency key in your scope"),
    RouteNotFound => (404, "route-not-found", "No such route"),
    MethodNotAllowed => (405, "method-not-allowed", "Method not allowed on this route"),
    RequestInProgress => (409, "request-in-progress", "A request with this idempotency key is in progress"),
    DuplicateRequestId => (409, "duplicate-request-id", "This request_id already has a different order"),
    ReplayWindowExpired => (410, "replay-window-expired", "The replay window of this idempotency key is over"),
    PayloadTooLarge => (413, "payload-too-large", "The request body is too large"),
    UnsupportedMediaType => (415, "unsupported-media-type", "The body must be application/json"),
    IdempotencyKeyReused => (422, "idempotency-key-reused", "This idempotency key was used for a different request"),
    ApprovalLimitExceeded => (422, "approval-limit-exceeded", "The amount exceeds your approval limit"),
    RateLimited => (429, "rate-limited", "Too many requests"),
    InternalError => (500, "internal-error", "Internal error"),
    DatabaseUnavailable => (503, "database-unavailable", "The database is unavailable"),
    OutcomeUnknown => (503, "outcome-unknown", "The outcome of this request is unknown"),
}

impl ProblemType {
    /// The full `type` URI.
    pub fn uri(self) -> String {
        format!("{TYPE_PREFIX}{}", self.name())
    }
}

/// One problem response: type, detail, extension members and extra headers.
#[derive(Debug, Clone)]
pub struct Problem {
    /// The type.
    pub kind: ProblemType,
    /// Human-readable explanation of this occurrence.
    pub detail: String,
    /// Extension members (`errors`, `order_id`, `order_url`, ...).
    pub extensions: Map<String, Value>,
    /// `Retry-After` in seconds.
    pub retry_after: Option<u64>,
    /// Whether to answer with `Connection: close` (the rest of the request cannot be trusted).
    pub close: bool,
}

impl Problem {
    /// A problem of `kind` with a detail.
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
            extensions: Map::new(),
            retry_after: None,
            close: false,
        }
    }

    /// Answers with `Connection: close`.
    pub fn close_connection(mut self) -> Self {
        self.close = true;
        self
    }

    /// Adds an extension member.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extensions.insert(key.to_owned(), value.into());
        self
    }

    /// Sets `Retry-After` (seconds).
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The problem document.
    pub fn to_json(&self) -> Value {
        let mut doc = Map::new();
        doc.insert("type".into(), self.kind.uri().into());
        doc.insert("title".into(), self.kind.title().into());
        doc.insert("status".into(), self.kind.status().into());
        doc.insert("detail".into(), self.detail.clone().into());
        for (k, v) in &self.extensions {
            doc.insert(k.clone(), v.clone());
        }
        Value::Object(doc)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = self.to_json().to_string();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.kind == ProblemType::Unauthenticated {
            headers.insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"tombstoned\""),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_statuses_are_errors() {
        let names: HashSet<_> = ProblemType::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), ProblemType::ALL.len());
        for p in ProblemType::ALL {
            assert!((400..600).contains(&p.status()), "{p:?}");
            assert!(p.uri().ends_with(p.name()));
        }
    }
}

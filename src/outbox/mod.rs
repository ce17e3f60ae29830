//! The outbox relay: delivers every `outbox_events` row to a webhook endpoint at least once, in
//! order per business object, with the event's id as the receiver's deduplication key
//! (docs/protocol.md, "Outbox"; README "Outbox delivery").
//!
//! One delivery, as the database sees it:
//!
//! 1. **Pick** — one statement, so one short transaction ([`sql::PICK`]): the oldest due events
//!    (`created_at` order) whose every lower-sequence event of the same order is delivered, locked
//!    `FOR UPDATE SKIP LOCKED` so relays never wait on each other, and leased: `locked_by` = this
//!    relay's instance id, `locked_until` = now + `outbox.lease_duration`, `attempts + 1`. It
//!    commits before anything is sent.
//! 2. **Send** — the HTTP POST ([`webhook`]), with no transaction open, bounded by
//!    `outbox.request_timeout`. The lease outlasts it (validated: at least twice the timeout), so
//!    no other relay picks the event while it is in flight.
//! 3. **Record** — one guarded statement: delivered (2xx), retry later with backoff, or dead
//!    letter ([`policy`]); it applies only while `locked_by` and `attempts` still name this lease.
//!
//! A relay that dies between 2 and 3 leaves the lease to expire; the event is then sent again
//! with the same `webhook-id`. That is the at-least-once window, and why receivers deduplicate
//! on that id in the same transaction as their own change.
//!
//! Modules (the `[outbox]` section is `config`'s: [`OutboxConfig`]): [`sql`] (every statement), [`webhook`]
//! (Standard Webhooks signing and the HTTP client), [`policy`] (what an answer means, backoff),
//! [`relay`] (one pass, the one-shot drain and the `serve` loop), [`inspect`] (listing, requeue,
//! dry run and counts). The relay never prints; `tombstoned outbox` does (`crate::outbox_cli`).

pub mod inspect;
pub mod policy;
pub mod relay;
pub mod sql;
pub mod webhook;

use std::path::PathBuf;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use uuid::Uuid;

use crate::db::{DbError, ErrorClass};

pub use crate::config::{MaxAttempts, OutboxConfig};
pub use inspect::{EventState, EventSummary, OutboxCounts, RequeueReport, RequeueTarget};
pub use policy::{Decision, DeliveryOutcome};
pub use relay::{PassReport, Relay, Tally};
pub use webhook::{Attempt, AttemptResult, Secret, SecretError, WebhookClient};

/// Why the relay (or an outbox command) could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// A key the operation needs is not set.
    #[error("{key} is not set")]
    NotConfigured {
        /// The dotted key.
        key: &'static str,
    },
    /// The webhook secret file is missing, unsafe or malformed.
    #[error("cannot use the webhook secret file {path} (outbox.secret_file)")]
    Secret {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: SecretError,
    },
    /// The CA file cannot be read or holds no certificate.
    #[error("cannot use outbox.ca_file {path}: {reason}")]
    CaFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The HTTP client could not be built (TLS set-up).
    #[error("cannot build the webhook HTTP client")]
    Client(#[source] reqwest::Error),
    /// The relay's database session could not be opened.
    #[error("cannot open the outbox database session")]
    Connect(#[source] DbError),
    /// A statement failed.
    #[error("outbox relay failed while {step}")]
    Database {
        /// What the relay was doing.
        step: &'static str,
        /// The database error.
        #[source]
        source: DbError,
    },
}

impl OutboxError {
    /// True for problems the operator fixes in the configuration (exit status 64).
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            OutboxError::NotConfigured { .. }
                | OutboxError::Secret { .. }
                | OutboxError::CaFile { .. }
                | OutboxError::Client(_)
        )
    }

    /// The database error's class, when there is one.
    pub fn class(&self) -> Option<ErrorClass> {
        match self {
            OutboxError::Connect(e) | OutboxError::Database { source: e, .. } => Some(e.class()),
            _ => None,
        }
    }

    /// The SQLSTATE class for `tombstoned_db_errors_total`, when a database error is behind it.
    pub fn sqlstate_class(&self) -> Option<&str> {
        match self {
            OutboxError::Connect(e) | OutboxError::Database { source: e, .. } => {
                Some(e.sqlstate_class())
            }
            _ => None,
        }
    }

    fn query(step: &'static str) -> impl FnOnce(tokio_postgres::Error) -> OutboxError {
        move |e| OutboxError::Database {
            step,
            source: DbError::Query(e),
        }
    }
}

/// One event as the relay sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// The stable identity: `webhook-id`, the receivers' deduplication key.
    pub event_id: Uuid,
    /// The tenant the business object belongs to.
    pub tenant_id: String,
    /// The business object: an order (the endpoint's events) or, for events enqueued through
    /// the SQL API's `enqueue_event`, an aggregate of the caller's own.
    pub subject: Subject,
    /// e.g. `order.created`.
    pub event_type: String,
    /// The event's place among its subject's events, from 1.
    pub sequence: i32,
    /// The event's data (for `order.created`: the order and the request's metadata).
    pub payload: serde_json::Value,
    /// When the event (and the business change) committed.
    pub created_at: DateTime<Utc>,
    /// Attempts including the one this lease is for.
    pub attempts: i32,
    /// The database role that inserted it (its session_user): the service that called
    /// `enqueue_event`, or the daemon's role for the endpoint's order events; `None` for events
    /// enqueued before schema V8.
    pub sender: Option<String>,
    /// The trace context the event was enqueued in, a W3C `traceparent` (V9): the request's for
    /// the endpoint's order events, `tombstoned.traceparent`'s for `enqueue_event`'s. The
    /// delivery's span continues that trace and the webhook carries its `traceparent`; `None`:
    /// delivered as before V9, no `traceparent` header. Never in the signed body.
    pub traceparent: Option<String>,
}

/// What an event is about: exactly one of the two (`outbox_events_one_subject`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// `order_id`: an order of the built-in endpoint.
    Order(Uuid),
    /// `aggregate_id`: whatever the `enqueue_event` caller sequences its events by.
    Aggregate(String),
}

impl Subject {
    fn from_columns(order_id: Option<Uuid>, aggregate_id: Option<String>) -> Self {
        match (order_id, aggregate_id) {
            (Some(order), _) => Subject::Order(order),
            // The check constraint makes (None, None) impossible; an empty aggregate id is
            // refused by its length check, so it cannot be confused with a real one.
            (None, aggregate) => Subject::Aggregate(aggregate.unwrap_or_default()),
        }
    }

    /// The order, for order events.
    pub fn order_id(&self) -> Option<Uuid> {
        match self {
            Subject::Order(id) => Some(*id),
            Subject::Aggregate(_) => None,
        }
    }

    /// The aggregate, for `enqueue_event`'s events.
    pub fn aggregate_id(&self) -> Option<&str> {
        match self {
            Subject::Order(_) => None,
            Subject::Aggregate(id) => Some(id),
        }
    }
}

/// The JSON body of a delivery; field order is fixed, so every attempt sends the same bytes.
/// An order event names `order_id`, an aggregate's event `aggregate_id`, never both.
#[derive(Serialize)]
struct Body<'a> {
    event_id: Uuid,
    #[serde(rename = "type")]
    event_type: &'a str,
    sequence: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    order_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aggregate_id: Option<&'a str>,
    tenant_id: &'a str,
    sender: Option<&'a str>,
    created_at: String,
    data: &'a serde_json::Value,
}

impl Event {
    /// The request body (README "Outbox delivery" documents it):
    /// `{"event_id", "type", "sequence", "order_id", "tenant_id", "sender", "created_at", "data"}`,
    /// with `aggregate_id` in place of `order_id` for an aggregate's event. The signature covers
    /// all of it, `sender` included: a receiver may authorise by it.
    pub fn body(&self) -> Vec<u8> {
        let body = Body {
            event_id: self.event_id,
            event_type: &self.event_type,
            sequence: self.sequence,
            order_id: self.subject.order_id(),
            aggregate_id: self.subject.aggregate_id(),
            tenant_id: &self.tenant_id,
            sender: self.sender.as_deref(),
            created_at: self.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
            data: &self.payload,
        };
        // Serialising a struct of strings, integers and a `Value` cannot fail.
        serde_json::to_vec(&body).unwrap_or_default()
    }

    fn from_row(row: &tokio_postgres::Row) -> Result<Self, tokio_postgres::Error> {
        Ok(Event {
            event_id: row.try_get("event_id")?,
            tenant_id: row.try_get("tenant_id")?,
            subject: Subject::from_columns(row.try_get("order_id")?, row.try_get("aggregate_id")?),
            event_type: row.try_get("event_type")?,
            sequence: row.try_get("sequence")?,
            payload: row.try_get("payload")?,
            created_at: row.try_get("created_at")?,
            attempts: row.try_get("attempts")?,
            sender: row.try_get("sender")?,
            traceparent: row.try_get("traceparent")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_names_identity_type_sequence_order_and_data() {
        let event = Event {
            event_id: Uuid::from_u128(1),
            tenant_id: "acme".into(),
            subject: Subject::Order(Uuid::from_u128(2)),
            event_type: "order.created".into(),
            sequence: 1,
            payload: serde_json::json!({"order": {"item": "book"}, "metadata": {}}),
            created_at: DateTime::from_timestamp(1_800_000_000, 123_456_000).unwrap(),
            attempts: 3,
            sender: Some("tombstoned".into()),
            traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        };
        let text = String::from_utf8(event.body()).unwrap();
        assert_eq!(
            text,
            "{\"event_id\":\"00000000-0000-0000-0000-000000000001\",\"type\":\"order.created\",\
             \"sequence\":1,\"order_id\":\"00000000-0000-0000-0000-000000000002\",\
             \"tenant_id\":\"acme\",\"sender\":\"tombstoned\",\
             \"created_at\":\"2027-01-15T08:00:00.123456Z\",\
             \"data\":{\"metadata\":{},\"order\":{\"item\":\"book\"}}}"
        );
        assert_eq!(
            event.body(),
            event.body(),
            "every attempt sends the same bytes"
        );
    }
}

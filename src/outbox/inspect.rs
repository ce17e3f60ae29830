//! Looking at the outbox and putting dead letters back: the counts behind the gauges and the dry
//! runs, the listing of undelivered events, what a delivery run would send now, and requeue.
//! Read-only functions run in a READ ONLY transaction; none of them sends anything.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use uuid::Uuid;

use super::{sql, OutboxError};
use crate::config::DatabaseConfig;
use crate::db::{self, Conn};

/// Where an undelivered event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventState {
    /// Waiting for its first attempt or its next one.
    Pending,
    /// Leased by a relay right now (a delivery may be in flight).
    InFlight,
    /// Delivered.
    Delivered,
    /// Given up on; `tombstoned outbox requeue` puts it back.
    DeadLetter,
}

impl EventState {
    /// The name shown by the CLI.
    pub fn label(self) -> &'static str {
        match self {
            EventState::Pending => "pending",
            EventState::InFlight => "in_flight",
            EventState::Delivered => "delivered",
            EventState::DeadLetter => "dead_letter",
        }
    }
}

/// One event as operators see it: no payload (it can hold personal data), its delivery history.
#[derive(Debug, Clone, Serialize)]
pub struct EventSummary {
    /// The `webhook-id`.
    pub event_id: Uuid,
    /// e.g. `order.created`.
    pub event_type: String,
    /// Its order (the endpoint's events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_id: Option<Uuid>,
    /// Its aggregate (events enqueued through the SQL API's `enqueue_event`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_id: Option<String>,
    /// Its place in its order's or aggregate's sequence.
    pub sequence: i32,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// Attempts so far.
    pub attempts: i32,
    /// Not sent again before this.
    pub next_attempt_at: DateTime<Utc>,
    /// When the last attempt ended.
    pub last_attempt_at: Option<DateTime<Utc>>,
    /// Its HTTP status (none: timeout or connection error).
    pub last_status: Option<i16>,
    /// Why it failed, one line.
    pub last_error: Option<String>,
    /// Where it stands.
    pub state: EventState,
}

impl EventSummary {
    fn from_row(row: &Row, now: DateTime<Utc>) -> Result<Self, tokio_postgres::Error> {
        let locked_until: Option<DateTime<Utc>> = row.try_get("locked_until")?;
        let published_at: Option<DateTime<Utc>> = row.try_get("published_at")?;
        let dead_lettered_at: Option<DateTime<Utc>> = row.try_get("dead_lettered_at")?;
        let state = if published_at.is_some() {
            EventState::Delivered
        } else if dead_lettered_at.is_some() {
            EventState::DeadLetter
        } else if locked_until.is_some_and(|t| t > now) {
            EventState::InFlight
        } else {
            EventState::Pending
        };
        Ok(EventSummary {
            event_id: row.try_get("event_id")?,
            event_type: row.try_get("event_type")?,
            order_id: row.try_get("order_id")?,
            aggregate_id: row.try_get("aggregate_id")?,
            sequence: row.try_get("sequence")?,
            created_at: row.try_get("created_at")?,
            attempts: row.try_get("attempts")?,
            next_attempt_at: row.try_get("next_attempt_at")?,
            last_attempt_at: row.try_get("last_attempt_at")?,
            last_status: row.try_get("last_status")?,
            last_error: row.try_get("last_error")?,
            state,
        })
    }
}

/// The outbox at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OutboxCounts {
    /// Events neither delivered nor dead letters (in flight included).
    pub pending: u64,
    /// Of those, leased by a relay right now.
    pub in_flight: u64,
    /// Dead letters.
    pub dead_letters: u64,
    /// When the oldest pending event was created.
    pub oldest_pending_created_at: Option<DateTime<Utc>>,
    /// How old it is (0 when nothing is pending).
    #[serde(rename = "oldest_pending_age_seconds", serialize_with = "seconds")]
    pub oldest_pending_age: Duration,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Reads [`OutboxCounts`] on `client`.
pub async fn counts(client: &Conn<'_>) -> Result<OutboxCounts, tokio_postgres::Error> {
    let row = client.query_one(sql::COUNTS, &[]).await?;
    let oldest: Option<DateTime<Utc>> = row.try_get("oldest_pending")?;
    let now: DateTime<Utc> = row.try_get("now")?;
    Ok(OutboxCounts {
        pending: count(row.try_get("pending")?),
        in_flight: count(row.try_get("in_flight")?),
        dead_letters: count(row.try_get("dead_letters")?),
        oldest_pending_created_at: oldest,
        oldest_pending_age: oldest
            .and_then(|t| (now - t).to_std().ok())
            .unwrap_or_default(),
    })
}

/// How many events are due now (what a delivery run started now attempts, before
/// `--max-events`), read on `client` without locking anything.
pub async fn due_count(client: &Conn<'_>) -> Result<u64, tokio_postgres::Error> {
    let row = client.query_one(sql::DUE_COUNT, &[]).await?;
    Ok(count(row.try_get(0)?))
}

/// What `tombstoned outbox deliver` would send now.
#[derive(Debug, Clone, Serialize)]
pub struct DeliveryPreview {
    /// The outbox at the time of the preview.
    pub counts: OutboxCounts,
    /// The events a run would attempt, oldest first (capped by the run's `--max-events`).
    pub would_send: Vec<EventSummary>,
}

async fn read_only<T>(
    db: &DatabaseConfig,
    purpose: &str,
    read: impl AsyncFnOnce(&Conn<'_>) -> Result<T, tokio_postgres::Error>,
) -> Result<T, OutboxError> {
    let session = db::connect(db, purpose)
        .await
        .map_err(OutboxError::Connect)?;
    // Simple-protocol BEGIN/ROLLBACK: nothing kept on the session. If a read fails, the session
    // is dropped with the transaction open, which ends it.
    session
        .client
        .batch_execute(sql::READ_ONLY_BEGIN)
        .await
        .map_err(OutboxError::query("starting a read-only transaction"))?;
    let value = read(&session.conn())
        .await
        .map_err(OutboxError::query("reading the outbox"))?;
    session
        .client
        .batch_execute(sql::READ_ONLY_END)
        .await
        .map_err(OutboxError::query("ending a read-only transaction"))?;
    Ok(value)
}

/// The dry run of a delivery run: the counts and the events due now (at most `limit`), read in
/// one READ ONLY snapshot. Nothing is locked, leased, sent or changed.
pub async fn preview(db: &DatabaseConfig, limit: u32) -> Result<DeliveryPreview, OutboxError> {
    read_only(db, "outbox-dry-run", async |tx| {
        let counts = counts(tx).await?;
        let now = tx.query_one(sql::NOW, &[]).await?.try_get(0)?;
        let rows = tx.query(sql::DUE_NOW, &[&i64::from(limit)]).await?;
        let would_send = rows
            .iter()
            .map(|r| EventSummary::from_row(r, now))
            .collect::<Result<_, _>>()?;
        Ok(DeliveryPreview { counts, would_send })
    })
    .await
}

/// Undelivered events (pending and dead letters, or only dead letters), oldest first.
pub async fn list(
    db: &DatabaseConfig,
    dead_letters_only: bool,
    limit: u32,
) -> Result<(OutboxCounts, Vec<EventSummary>), OutboxError> {
    read_only(db, "outbox-admin", async |tx| {
        let counts = counts(tx).await?;
        let now = tx.query_one(sql::NOW, &[]).await?.try_get(0)?;
        let rows = tx
            .query(
                sql::LIST_UNDELIVERED,
                &[&dead_letters_only, &i64::from(limit)],
            )
            .await?;
        let events = rows
            .iter()
            .map(|r| EventSummary::from_row(r, now))
            .collect::<Result<_, _>>()?;
        Ok((counts, events))
    })
    .await
}

/// Which dead letters to requeue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequeueTarget {
    /// These events (those that are not dead letters are reported, not changed).
    Events(Vec<Uuid>),
    /// Every dead letter.
    AllDeadLetters,
}

/// What a requeue did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequeueReport {
    /// Dead letters made pending again (due now, attempts counted from 0).
    pub requeued: Vec<Uuid>,
    /// Named events that were not dead letters (unknown, pending or delivered): unchanged.
    pub not_dead_letters: Vec<Uuid>,
}

/// Puts dead letters back into delivery, in one short statement.
pub async fn requeue(
    db: &DatabaseConfig,
    target: &RequeueTarget,
) -> Result<RequeueReport, OutboxError> {
    let session = db::connect(db, "outbox-admin")
        .await
        .map_err(OutboxError::Connect)?;
    let rows = match target {
        RequeueTarget::Events(ids) => session.conn().query(sql::REQUEUE_EVENTS, &[ids]).await,
        RequeueTarget::AllDeadLetters => session.conn().query(sql::REQUEUE_ALL, &[]).await,
    }
    .map_err(OutboxError::query("requeueing dead letters"))?;
    let mut requeued = rows
        .iter()
        .map(|r| r.try_get::<_, Uuid>(0))
        .collect::<Result<Vec<_>, _>>()
        .map_err(OutboxError::query("requeueing dead letters"))?;
    requeued.sort_unstable();
    let not_dead_letters = match target {
        RequeueTarget::Events(ids) => ids
            .iter()
            .filter(|id| requeued.binary_search(id).is_err())
            .copied()
            .collect(),
        RequeueTarget::AllDeadLetters => Vec::new(),
    };
    Ok(RequeueReport {
        requeued,
        not_dead_letters,
    })
}

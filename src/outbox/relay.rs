//! The relay: one pass ([`Relay::deliver_once`]: pick and lease, send with no transaction
//! open, record), the one-shot run of `tombstoned outbox deliver` ([`Relay::drain`]), and the
//! loop inside `serve` ([`Relay::run`]), with its gauges, reconnects and bounded shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::policy::{self, Decision, DeliveryOutcome};
use super::webhook::{AttemptResult, WebhookClient};
use super::{inspect, sql, Event, OutboxError};
use crate::config::{DatabaseConfig, OutboxConfig};
use crate::db::pipeline::{self, PipelineFailure};
use crate::db::{self, Conn, ErrorClass, Param, Session};
use crate::metrics::Metrics;
use crate::telemetry::{Attribute, Kind, Span};

/// Bound on every relay statement. They touch one index range and a few rows.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on waiting for a row lock when recording (only a relay whose lease expired, or an
/// operator's requeue, could hold one).
const LOCK_TIMEOUT: Duration = Duration::from_secs(2);
/// Backstop: the server ends any transaction of a relay session left open this long. The relay's
/// transactions are one pipelined round trip each, so this never fires unless a bug would
/// otherwise hold locks across a delivery.
const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);
/// The gauges are refreshed at most this often.
const GAUGE_REFRESH: Duration = Duration::from_secs(1);
/// The longest wait between reconnection attempts after database failures.
const MAX_FAILURE_PAUSE: Duration = Duration::from_secs(30);

/// What a pass (or a one-shot run of several passes) did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PassReport {
    /// Events leased.
    pub picked: u64,
    /// Answered 2xx and recorded delivered.
    pub delivered: u64,
    /// Scheduled for another attempt (failed status, timeout or connection error).
    pub retried: u64,
    /// Of those, attempts that timed out: the receiver may have applied them.
    pub timeouts: u64,
    /// Now dead letters.
    pub dead_lettered: u64,
    /// Cut off by shutdown mid-delivery; sent again once their lease expires.
    pub abandoned: u64,
    /// Leased but never sent (shutdown, or too late in the lease to start), released at once.
    pub released: u64,
    /// Attempted, but the result could not be recorded (the lease had passed to another relay,
    /// or the database failed): such an event is sent again once its lease expires.
    pub unrecorded: u64,
}

/// A run's [`PassReport`] so far, added to as each event is handled: what a progress line reads
/// while [`Relay::drain_watched`] runs.
#[derive(Debug, Default)]
pub struct Tally(std::sync::Mutex<PassReport>);

impl Tally {
    /// The run's report as it stands now.
    pub fn get(&self) -> PassReport {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn add(&self, report: &PassReport) {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .add(report);
    }
}

impl PassReport {
    /// Events whose delivery ended one way or another (delivered, retry scheduled,
    /// dead-lettered, not recorded, abandoned): what a run has gone through.
    pub fn attempted(&self) -> u64 {
        self.delivered + self.retried + self.dead_lettered + self.unrecorded + self.abandoned
    }

    fn add(&mut self, other: &PassReport) {
        self.picked += other.picked;
        self.delivered += other.delivered;
        self.retried += other.retried;
        self.timeouts += other.timeouts;
        self.dead_lettered += other.dead_lettered;
        self.abandoned += other.abandoned;
        self.released += other.released;
        self.unrecorded += other.unrecorded;
    }

    /// True when every event attempted was delivered (or there was nothing to do).
    pub fn all_delivered(&self) -> bool {
        self.retried == 0 && self.dead_lettered == 0 && self.abandoned == 0 && self.unrecorded == 0
    }
}

/// What became of one leased event.
enum Handled {
    Released,
    Abandoned,
    Attempted {
        decision: Decision,
        timeout: bool,
        recorded: Result<bool, OutboxError>,
    },
}

/// A relay instance: the database it reads, the endpoint it sends to, and its lease identity.
pub struct Relay {
    db: DatabaseConfig,
    config: OutboxConfig,
    client: WebhookClient,
    instance: String,
    purpose: &'static str,
    metrics: Option<Arc<Metrics>>,
    /// Every relay transaction's settings ([`sql::SETTINGS`]): statement, lock and
    /// idle-in-transaction timeouts, as text.
    timeouts: [String; 3],
    /// Held while a pipelined transaction is on the wire: deliveries run concurrently on one
    /// session, and two pipelines interleaved would mix their BEGINs and COMMITs.
    turn: tokio::sync::Mutex<()>,
}

impl Relay {
    /// Builds the relay from the configuration (reads the secret and CA files). `purpose` names
    /// its session: `application_name = tombstoned/<purpose>` in `pg_stat_activity`.
    pub fn new(
        db: &DatabaseConfig,
        config: &OutboxConfig,
        purpose: &'static str,
        metrics: Option<Arc<Metrics>>,
    ) -> Result<Self, OutboxError> {
        Ok(Relay {
            db: db.clone(),
            config: config.clone(),
            client: WebhookClient::new(config)?,
            instance: crate::instance::instance_id(),
            purpose,
            metrics,
            timeouts: [
                millis(STATEMENT_TIMEOUT),
                millis(LOCK_TIMEOUT),
                millis(IDLE_IN_TRANSACTION_TIMEOUT),
            ],
            turn: tokio::sync::Mutex::new(()),
        })
    }

    /// This relay's lease identity (`locked_by`): host, process id and a random suffix.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Opens the relay's own session. Nothing is set on it: every relay statement is a
    /// transaction that sets its timeouts itself ([`Relay::transaction`]).
    pub async fn connect(&self) -> Result<Session, OutboxError> {
        db::connect(&self.db, self.purpose)
            .await
            .map_err(OutboxError::Connect)
    }

    /// `BEGIN; SETTINGS; statement; COMMIT` pipelined on `conn`, one transaction at a time on
    /// the session; the statement's rows.
    async fn transaction(
        &self,
        conn: &Conn<'_>,
        statement: &'static str,
        params: &[&dyn Param],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let settings: [&dyn Param; 3] = [&self.timeouts[0], &self.timeouts[1], &self.timeouts[2]];
        let _turn = self.turn.lock().await;
        pipeline::query(conn, sql::SETTINGS, &settings, statement, params)
            .await
            .map_err(|failure: PipelineFailure| failure.error)
    }

    /// [`Relay::transaction`], for a statement whose changed-row count is the result.
    async fn transaction_execute(
        &self,
        conn: &Conn<'_>,
        statement: &'static str,
        params: &[&dyn Param],
    ) -> Result<u64, tokio_postgres::Error> {
        let settings: [&dyn Param; 3] = [&self.timeouts[0], &self.timeouts[1], &self.timeouts[2]];
        let _turn = self.turn.lock().await;
        pipeline::execute(conn, sql::SETTINGS, &settings, statement, params)
            .await
            .map_err(|failure: PipelineFailure| failure.error)
    }

    /// One pass on `session` (from [`Relay::connect`]): lease up to `limit` due events,
    /// send them (at most `outbox.concurrency` at once, no transaction open), record each
    /// result. After `shutdown`, nothing new is sent: leased events not yet sent are released,
    /// deliveries in flight get `outbox.shutdown_grace` and are then abandoned.
    pub async fn deliver_once(
        &self,
        session: &Session,
        limit: u32,
        shutdown: &CancellationToken,
    ) -> Result<PassReport, OutboxError> {
        self.pass(&session.conn(), limit, &[], shutdown, None)
            .await
            .map(|(report, _)| report)
    }

    /// The one-shot run (`tombstoned outbox deliver`): passes until nothing is due, at most
    /// `max_events` events, each attempted at most once in the run. Events that fail are left
    /// scheduled for their retry.
    pub async fn drain(
        &self,
        max_events: Option<u64>,
        shutdown: &CancellationToken,
    ) -> Result<PassReport, OutboxError> {
        self.drain_watched(max_events, shutdown, None).await
    }

    /// [`Relay::drain`], adding each event's outcome to `tally` as it is handled (and each pass's
    /// leases as they are taken), so a caller can show the run while it goes on.
    pub async fn drain_watched(
        &self,
        max_events: Option<u64>,
        shutdown: &CancellationToken,
        tally: Option<&Tally>,
    ) -> Result<PassReport, OutboxError> {
        let session = self.connect().await?;
        let mut total = PassReport::default();
        let mut seen: Vec<Uuid> = Vec::new();
        while !shutdown.is_cancelled() {
            let left = max_events.map_or(u64::MAX, |max| max.saturating_sub(total.picked));
            let limit = u32::try_from(left.min(u64::from(self.config.batch_size))).unwrap_or(1);
            if limit == 0 {
                break;
            }
            let (report, picked) = self
                .pass(&session.conn(), limit, &seen, shutdown, tally)
                .await?;
            total.add(&report);
            if picked.is_empty() {
                break;
            }
            seen.extend(picked);
        }
        Ok(total)
    }

    /// The relay inside `serve`: passes back to back while there is work, `outbox.poll_interval`
    /// apart when there is none, reconnecting after database failures, until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        tracing::info!(
            endpoint = %self.config.endpoint_display(),
            instance = %self.instance,
            concurrency = self.config.concurrency,
            "outbox relay started"
        );
        let mut session: Option<Session> = None;
        let mut failures = 0u32;
        let mut gauges_at: Option<Instant> = None;
        while !shutdown.is_cancelled() {
            if session.as_ref().is_none_or(Session::is_closed) {
                match self.connect().await {
                    Ok(s) => session = Some(s),
                    Err(e) => {
                        failures += 1;
                        self.failed(&e, failures);
                        pause(failure_pause(failures, &self.config), &shutdown).await;
                        continue;
                    }
                }
            }
            let Some(open) = session.as_ref() else {
                continue;
            };
            if gauges_at.is_none_or(|t| t.elapsed() >= GAUGE_REFRESH) {
                gauges_at = Some(Instant::now());
                if let Err(e) = self.refresh_gauges(&open.conn()).await {
                    tracing::debug!(error = %crate::db::error_text(&e), "outbox gauges not refreshed");
                }
            }
            match self
                .deliver_once(open, self.config.batch_size, &shutdown)
                .await
            {
                Ok(report) => {
                    failures = 0;
                    if report.picked < u64::from(self.config.batch_size) {
                        pause(self.config.poll_interval, &shutdown).await;
                    }
                }
                Err(e) => {
                    failures += 1;
                    self.failed(&e, failures);
                    if e.class() == Some(ErrorClass::Unavailable) {
                        session = None;
                    }
                    pause(failure_pause(failures, &self.config), &shutdown).await;
                }
            }
        }
        tracing::info!("outbox relay stopped");
    }

    fn failed(&self, e: &OutboxError, failures: u32) {
        if let (Some(m), Some(class)) = (&self.metrics, e.sqlstate_class()) {
            m.db_error(class);
        }
        tracing::warn!(
            error = %crate::db::error_text(e),
            consecutive_failures = failures,
            "outbox relay pass failed; retrying"
        );
    }

    async fn refresh_gauges(&self, client: &Conn<'_>) -> Result<(), tokio_postgres::Error> {
        let Some(m) = &self.metrics else {
            return Ok(());
        };
        let counts = inspect::counts(client).await?;
        m.outbox_backlog_events
            .set(i64::try_from(counts.pending).unwrap_or(i64::MAX));
        m.outbox_dead_letters
            .set(i64::try_from(counts.dead_letters).unwrap_or(i64::MAX));
        m.outbox_oldest_undelivered_age_seconds
            .set(counts.oldest_pending_age.as_secs_f64());
        Ok(())
    }

    /// One pass; also returns the ids it leased. With `tally`, each event's outcome is added to
    /// it as soon as the event is handled.
    async fn pass(
        &self,
        client: &Conn<'_>,
        limit: u32,
        exclude: &[Uuid],
        shutdown: &CancellationToken,
        tally: Option<&Tally>,
    ) -> Result<(PassReport, Vec<Uuid>), OutboxError> {
        if shutdown.is_cancelled() {
            return Ok((PassReport::default(), Vec::new()));
        }
        let lease = &self.config.lease_duration;
        let lease_micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
        // Measured before the pick is sent, so before the server's now() that starts the lease.
        let picked_at = Instant::now();
        let rows = self
            .transaction(
                client,
                sql::PICK,
                &[
                    &self.instance,
                    &lease_micros,
                    &i64::from(limit),
                    &exclude.to_vec(),
                ],
            )
            .await
            .map_err(OutboxError::query("leasing due events"))?;
        let mut events = rows
            .iter()
            .map(Event::from_row)
            .collect::<Result<Vec<_>, _>>()
            .map_err(OutboxError::query("reading leased events"))?;
        events.sort_by_key(|e| e.created_at);
        let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
        let mut report = PassReport {
            picked: events.len() as u64,
            ..PassReport::default()
        };
        if events.is_empty() {
            return Ok((report, ids));
        }
        // A delivery must start early enough to end (request_timeout) well inside the lease, so
        // no other relay can pick the event while it may still be in flight. The lease is at
        // least twice the timeout, so at least half a timeout is left to start in.
        let timeout = self.config.request_timeout;
        let start_by = picked_at + lease.saturating_sub(timeout + timeout / 2);
        if let Some(tally) = tally {
            tally.add(&PassReport {
                picked: report.picked,
                ..PassReport::default()
            });
        }
        let mut handled = futures::stream::iter(events)
            .map(|event| self.handle(client, event, start_by, shutdown))
            .buffer_unordered(self.config.concurrency);
        let mut first_error = None;
        while let Some(handled) = handled.next().await {
            let mut one = PassReport::default();
            match handled {
                Handled::Released => one.released += 1,
                Handled::Abandoned => one.abandoned += 1,
                Handled::Attempted {
                    decision,
                    timeout,
                    recorded,
                } => match recorded {
                    Ok(true) => match decision {
                        Decision::Delivered => one.delivered += 1,
                        Decision::Retry(_) => {
                            one.retried += 1;
                            one.timeouts += u64::from(timeout);
                        }
                        Decision::DeadLetter => one.dead_lettered += 1,
                    },
                    Ok(false) => one.unrecorded += 1,
                    Err(e) => {
                        one.unrecorded += 1;
                        first_error.get_or_insert(e);
                    }
                },
            }
            report.add(&one);
            if let Some(tally) = tally {
                tally.add(&one);
            }
        }
        tracing::debug!(?report, "outbox pass finished");
        match first_error {
            Some(e) => Err(e),
            None => Ok((report, ids)),
        }
    }

    /// Sends one leased event and records the result.
    async fn handle(
        &self,
        client: &Conn<'_>,
        event: Event,
        start_by: Instant,
        shutdown: &CancellationToken,
    ) -> Handled {
        if shutdown.is_cancelled() || Instant::now() >= start_by {
            if let Err(e) = self.release(client, &event).await {
                // Not released: the lease expires on its own.
                tracing::debug!(event_id = %event.event_id, error = %crate::db::error_text(&e), "lease not released");
            }
            return Handled::Released;
        }
        let span = self.delivery_span(&event);
        let handled = span
            .in_scope(self.attempt(client, event, shutdown, &span))
            .await;
        span.end();
        handled
    }

    /// The delivery's HTTP client span (tracing on): in the trace the event was enqueued in and
    /// linked to where it was enqueued, when it was stored with a context; a trace of its own
    /// otherwise. The event's id, type and attempt number; the endpoint without credentials.
    fn delivery_span(&self, event: &Event) -> Span {
        Span::following(event.traceparent.as_deref(), "POST", Kind::Client, || {
            let mut attributes = vec![
                Attribute::new("http.request.method", "POST"),
                Attribute::new("url.full", self.config.endpoint_display()),
                Attribute::new("tombstoned.outbox.event_id", event.event_id.to_string()),
                Attribute::new("tombstoned.outbox.event_type", event.event_type.clone()),
                Attribute::new("tombstoned.outbox.attempt", i64::from(event.attempts)),
            ];
            if let Some(url) = &self.config.endpoint {
                attributes.push(Attribute::new(
                    "server.address",
                    url.host_str().unwrap_or_default().to_owned(),
                ));
                if let Some(port) = url.port_or_known_default() {
                    attributes.push(Attribute::new("server.port", i64::from(port)));
                }
            }
            if event.attempts > 1 {
                attributes.push(Attribute::new(
                    "http.request.resend_count",
                    i64::from(event.attempts - 1),
                ));
            }
            attributes
        })
    }

    /// One attempt of a leased event, inside its `span`: the POST (with the span's `traceparent`
    /// when the event has a stored context: an event without one goes out exactly as before
    /// traces), then the result recorded.
    async fn attempt(
        &self,
        client: &Conn<'_>,
        event: Event,
        shutdown: &CancellationToken,
        span: &Span,
    ) -> Handled {
        let grace_over = async {
            shutdown.cancelled().await;
            tokio::time::sleep(self.config.shutdown_grace).await;
        };
        let traceparent = event.traceparent.as_ref().and_then(|_| span.traceparent());
        let attempt = tokio::select! {
            attempt = self.client.deliver(&event, traceparent.as_deref()) => attempt,
            () = grace_over => {
                span.fail("abandoned");
                self.count(DeliveryOutcome::Abandoned, None);
                tracing::info!(
                    event_id = %event.event_id,
                    "delivery abandoned at shutdown; it is sent again when its lease expires"
                );
                return Handled::Abandoned;
            }
        };
        let attempts = u32::try_from(event.attempts).unwrap_or(u32::MAX);
        let (decision, outcome) =
            policy::decide(&attempt.result, attempts, &self.config, rand::random());
        self.count(outcome, Some(attempt.duration));
        span.set(|| {
            let mut attributes = vec![Attribute::new("tombstoned.outbox.outcome", outcome.label())];
            if let Some(status) = attempt.result.status() {
                attributes.push(Attribute::new(
                    "http.response.status_code",
                    i64::from(status),
                ));
            }
            attributes
        });
        match &attempt.result {
            AttemptResult::Status(status) if *status >= 400 => span.fail(status.to_string()),
            AttemptResult::Status(_) => {}
            AttemptResult::Timeout => span.fail("timeout"),
            AttemptResult::Connection(_) => span.fail("connection"),
        }
        let recorded = self
            .record(client, &event, &decision, &attempt.result)
            .await;
        let recorded_ok = matches!(recorded, Ok(true));
        let status = attempt.result.status();
        match (&decision, outcome) {
            (Decision::Delivered, _) => tracing::debug!(
                event_id = %event.event_id,
                event_type = %event.event_type,
                sequence = event.sequence,
                attempts,
                status,
                seconds = attempt.duration.as_secs_f64(),
                recorded = recorded_ok,
                "event delivered"
            ),
            (Decision::DeadLetter, _) => tracing::warn!(
                event_id = %event.event_id,
                event_type = %event.event_type,
                attempts,
                status,
                reason = %attempt.result.reason(),
                recorded = recorded_ok,
                "event moved to the dead letters; `tombstoned outbox requeue` puts it back"
            ),
            (Decision::Retry(delay), outcome) => tracing::info!(
                event_id = %event.event_id,
                event_type = %event.event_type,
                attempts,
                outcome = outcome.label(),
                status,
                reason = %attempt.result.reason(),
                retry_in = %humantime::format_duration(*delay),
                recorded = recorded_ok,
                "delivery failed; retry scheduled"
            ),
        }
        match &recorded {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                event_id = %event.event_id,
                "the lease had passed to another relay; this attempt's result is not recorded"
            ),
            Err(e) => tracing::warn!(
                event_id = %event.event_id,
                error = %crate::db::error_text(e),
                "cannot record the delivery result; the event is sent again when its lease expires"
            ),
        }
        Handled::Attempted {
            decision,
            timeout: attempt.result == AttemptResult::Timeout,
            recorded,
        }
    }

    /// Records the decision under the lease guard; `Ok(false)` when the lease is no longer ours.
    async fn record(
        &self,
        client: &Conn<'_>,
        event: &Event,
        decision: &Decision,
        result: &AttemptResult,
    ) -> Result<bool, OutboxError> {
        let status: Option<i16> = result.status().and_then(|s| i16::try_from(s).ok());
        let reason = result.reason();
        let guard: [&dyn Param; 3] = [&event.event_id, &self.instance, &event.attempts];
        let rows = match decision {
            Decision::Delivered => {
                self.transaction_execute(
                    client,
                    sql::RECORD_DELIVERED,
                    &[guard[0], guard[1], guard[2], &status],
                )
                .await
            }
            Decision::Retry(delay) => {
                let micros = i64::try_from(delay.as_micros()).unwrap_or(i64::MAX);
                self.transaction_execute(
                    client,
                    sql::RECORD_RETRY,
                    &[guard[0], guard[1], guard[2], &status, &reason, &micros],
                )
                .await
            }
            Decision::DeadLetter => {
                self.transaction_execute(
                    client,
                    sql::RECORD_DEAD_LETTER,
                    &[guard[0], guard[1], guard[2], &status, &reason],
                )
                .await
            }
        }
        .map_err(OutboxError::query("recording a delivery result"))?;
        Ok(rows == 1)
    }

    async fn release(&self, client: &Conn<'_>, event: &Event) -> Result<(), OutboxError> {
        self.transaction_execute(
            client,
            sql::RELEASE_UNATTEMPTED,
            &[&event.event_id, &self.instance, &event.attempts],
        )
        .await
        .map_err(OutboxError::query("releasing an unsent event"))?;
        Ok(())
    }

    fn count(&self, outcome: DeliveryOutcome, took: Option<Duration>) {
        if let Some(m) = &self.metrics {
            m.outbox_deliveries
                .with_label_values(&[outcome.label()])
                .inc();
            if let Some(took) = took {
                m.outbox_delivery_duration.observe(took.as_secs_f64());
            }
        }
    }
}

/// Sleeps `d`, cut short by shutdown.
async fn pause(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        () = tokio::time::sleep(d) => {}
        () = shutdown.cancelled() => {}
    }
}

/// After `failures` database failures in a row: the poll interval doubled per failure, capped.
fn failure_pause(failures: u32, config: &OutboxConfig) -> Duration {
    let doublings = failures.saturating_sub(1).min(10);
    config
        .poll_interval
        .saturating_mul(1 << doublings)
        .min(MAX_FAILURE_PAUSE)
        .max(config.poll_interval.min(MAX_FAILURE_PAUSE))
}

fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_pauses_grow_from_the_poll_interval_to_a_cap() {
        let c = OutboxConfig::default();
        assert_eq!(failure_pause(1, &c), Duration::from_secs(1));
        assert_eq!(failure_pause(3, &c), Duration::from_secs(4));
        assert_eq!(failure_pause(50, &c), MAX_FAILURE_PAUSE);
    }

    #[test]
    fn a_report_is_all_delivered_only_without_failures() {
        let mut r = PassReport {
            picked: 2,
            delivered: 2,
            ..PassReport::default()
        };
        assert!(r.all_delivered());
        r.add(&PassReport {
            picked: 1,
            retried: 1,
            ..PassReport::default()
        });
        assert_eq!(r.picked, 3);
        assert!(!r.all_delivered());
    }
}

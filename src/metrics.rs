//! Prometheus metrics: every series tombstoned exports, in one registry of its own, and their
//! text rendering. Label values are closed sets (outcomes, routes, SQLSTATE classes): never keys,
//! tokens, bodies or tenant names.

use std::sync::{Arc, PoisonError, RwLock};

use crate::db::Pool;
use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Outcomes of a cleanup run (`tombstoned_cleanup_runs_total{outcome}`).
pub const RUN_OUTCOMES: &[&str] = &[
    "success",
    "failed",
    "skipped_lease",
    "skipped_read_only",
    "partial",
];
/// Why a cleanup run waited (`tombstoned_cleanup_throttled_seconds_total{reason}`).
pub const THROTTLE_REASONS: &[&str] = &["replica_lag", "rate"];
/// Outcomes of a cleanup batch (`tombstoned_cleanup_batches_total{outcome}`).
pub const BATCH_OUTCOMES: &[&str] = &["committed", "lock_timeout", "retried", "failed"];
/// Outcomes of a claim (`tombstoned_claims_total{outcome}`).
pub const CLAIM_OUTCOMES: &[&str] = &[
    "created",
    "replayed",
    "key_reused",
    "in_progress",
    "expired",
    "duplicate_request",
    "rejected",
    "invalid",
];

/// The outcome of one webhook delivery (`tombstoned_outbox_deliveries_total{outcome}`), one per
/// `outbox::policy::DeliveryOutcome`.
pub const OUTBOX_DELIVERY_OUTCOMES: &[&str] = &[
    "delivered",
    "retryable_status",
    "permanent_status",
    "dead_lettered",
    "timeout",
    "connection_error",
    "abandoned",
];

/// The two HTTP listeners (`tombstoned_http_connections*{listener}`).
pub const LISTENERS: &[&str] = &["api", "metrics"];
/// Why the server closed a connection (`tombstoned_http_connections_closed_total{reason}`).
pub const CONNECTION_CLOSE_REASONS: &[&str] = &[
    "idle_timeout",
    "header_timeout",
    "evicted",
    "refused",
    "shutdown",
];

/// Every metric handle. Cheap to share behind an `Arc`.
pub struct Metrics {
    registry: Registry,

    /// `tombstoned_cleanup_runs_total{outcome}`: runs by outcome (see [`RUN_OUTCOMES`]).
    pub cleanup_runs: IntCounterVec,
    /// `tombstoned_cleanup_rows_tombstoned_total`
    pub cleanup_rows_tombstoned: IntCounter,
    /// `tombstoned_cleanup_batches_total{outcome}` (see [`BATCH_OUTCOMES`]).
    pub cleanup_batches: IntCounterVec,
    /// `tombstoned_cleanup_lock_timeouts_total`: batches rolled back on 55P03.
    pub cleanup_lock_timeouts: IntCounter,
    /// `tombstoned_cleanup_fires_coalesced_total`: fire times missed during a long run.
    pub cleanup_fires_coalesced: IntCounter,
    /// `tombstoned_cleanup_batch_duration_seconds`
    pub cleanup_batch_duration: Histogram,
    /// `tombstoned_cleanup_run_duration_seconds`
    pub cleanup_run_duration: Histogram,
    /// `tombstoned_cleanup_backlog_rows`: due but not tombstoned at the end of the last run.
    pub cleanup_backlog_rows: IntGauge,
    /// `tombstoned_cleanup_oldest_due_age_seconds`: how overdue the oldest due row is.
    pub cleanup_oldest_due_age_seconds: prometheus::Gauge,
    /// `tombstoned_cleanup_last_success_timestamp_seconds`
    pub cleanup_last_success_timestamp_seconds: prometheus::Gauge,
    /// `tombstoned_cleanup_next_run_timestamp_seconds`
    pub cleanup_next_run_timestamp_seconds: prometheus::Gauge,
    /// `tombstoned_cleanup_lease_held`: 1 while this instance holds the single-runner lease.
    pub cleanup_lease_held: IntGauge,
    /// `tombstoned_tombstones_purged_total`
    pub tombstones_purged: IntCounter,
    /// `tombstoned_cleanup_throttled_seconds_total{reason}`: seconds runs spent waiting, by
    /// [`THROTTLE_REASONS`].
    pub cleanup_throttled_seconds: prometheus::CounterVec,
    /// `tombstoned_replica_lag_bytes{application_name}`: each standby's replay lag as the
    /// cleaner last read it (only while `cleanup.max_replica_lag` is on). Its label is the one
    /// not from a closed set: standbys are few (`max_wal_senders`), and one that disappears from
    /// `pg_stat_replication` is dropped at the next read.
    pub replica_lag_bytes: IntGaugeVec,

    /// `tombstoned_http_requests_total{route,method,status}`
    pub http_requests: IntCounterVec,
    /// `tombstoned_http_request_duration_seconds{route}`
    pub http_request_duration: HistogramVec,
    /// `tombstoned_claims_total{outcome}` (see [`CLAIM_OUTCOMES`]).
    pub claims: IntCounterVec,
    /// `tombstoned_http_connections{listener}`: connections open now.
    pub http_connections: IntGaugeVec,
    /// `tombstoned_http_connection_limit{listener}`: the cap in force (after the file-descriptor
    /// budget).
    pub http_connection_limit: IntGaugeVec,
    /// `tombstoned_http_connections_closed_total{listener,reason}` (see
    /// [`CONNECTION_CLOSE_REASONS`]); connections the client closed are not counted.
    pub http_connections_closed: IntCounterVec,

    /// `tombstoned_http_requests_in_flight`: API requests received and not yet answered.
    pub http_requests_in_flight: IntGauge,

    /// `tombstoned_db_pool_connections{state}` and `tombstoned_db_pool_waiting`: read from the
    /// pool at each scrape.
    db_pool_connections: PoolConnections,
    /// `tombstoned_db_errors_total{sqlstate_class}`
    pub db_errors: IntCounterVec,

    /// `tombstoned_outbox_backlog_events`: events neither delivered nor dead letters.
    pub outbox_backlog_events: IntGauge,
    /// `tombstoned_outbox_oldest_undelivered_age_seconds`: age of the oldest of those.
    pub outbox_oldest_undelivered_age_seconds: prometheus::Gauge,
    /// `tombstoned_outbox_deliveries_total{outcome}` (see [`OUTBOX_DELIVERY_OUTCOMES`]).
    pub outbox_deliveries: IntCounterVec,
    /// `tombstoned_outbox_delivery_duration_seconds`: one HTTP attempt.
    pub outbox_delivery_duration: Histogram,
    /// `tombstoned_outbox_dead_letters`: events the relay gave up on, until requeued.
    pub outbox_dead_letters: IntGauge,
    /// `tombstoned_outbox_events_deleted_total`: delivered events deleted by retention.
    pub outbox_events_deleted: IntCounter,

    /// `tombstoned_trace_spans_dropped_total`: trace spans never exported (the export queue
    /// full, the collector down, slow or refusing), counted by `crate::telemetry`'s export.
    pub trace_spans_dropped: IntCounter,
}

fn counter(r: &Registry, name: &str, help: &str) -> Result<IntCounter, prometheus::Error> {
    let c = IntCounter::new(name, help)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn counter_vec(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    let c = IntCounterVec::new(Opts::new(name, help), labels)?;
    r.register(Box::new(c.clone()))?;
    Ok(c)
}

fn gauge(r: &Registry, name: &str, help: &str) -> Result<prometheus::Gauge, prometheus::Error> {
    let g = prometheus::Gauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn int_gauge(r: &Registry, name: &str, help: &str) -> Result<IntGauge, prometheus::Error> {
    let g = IntGauge::new(name, help)?;
    r.register(Box::new(g.clone()))?;
    Ok(g)
}

fn histogram(
    r: &Registry,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> Result<Histogram, prometheus::Error> {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))?;
    r.register(Box::new(h.clone()))?;
    Ok(h)
}

const BATCH_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
const RUN_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 240.0, 600.0,
];
const DELIVERY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

impl Metrics {
    /// Creates and registers every metric, with the closed label sets pre-initialised so that
    /// every series exists (at zero) from the first scrape on.
    pub fn new() -> Result<Self, prometheus::Error> {
        let r = Registry::new();
        let m = Metrics {
            cleanup_runs: counter_vec(
                &r,
                "tombstoned_cleanup_runs_total",
                "Cleanup runs by outcome: success, failed, skipped_lease (another instance held \
                 the lease), skipped_read_only (the server refuses writes), partial (stopped by \
                 max_run_time, --max-batches, shutdown or a lost lease with rows still due).",
                &["outcome"],
            )?,
            cleanup_rows_tombstoned: counter(
                &r,
                "tombstoned_cleanup_rows_tombstoned_total",
                "Idempotency records turned into tombstones.",
            )?,
            cleanup_batches: counter_vec(
                &r,
                "tombstoned_cleanup_batches_total",
                "Cleanup batch transactions by outcome: committed, lock_timeout (rolled back on \
                 55P03), retried (40P01/40001), failed.",
                &["outcome"],
            )?,
            cleanup_lock_timeouts: counter(
                &r,
                "tombstoned_cleanup_lock_timeouts_total",
                "Cleanup batches rolled back because a row lock wait exceeded \
                 cleanup.lock_timeout.",
            )?,
            cleanup_fires_coalesced: counter(
                &r,
                "tombstoned_cleanup_fires_coalesced_total",
                "Scheduled fire times that passed while a run was still going and were merged \
                 into the next run.",
            )?,
            cleanup_batch_duration: histogram(
                &r,
                "tombstoned_cleanup_batch_duration_seconds",
                "Duration of one cleanup batch transaction, BEGIN to COMMIT or ROLLBACK.",
                BATCH_BUCKETS,
            )?,
            cleanup_run_duration: histogram(
                &r,
                "tombstoned_cleanup_run_duration_seconds",
                "Duration of one cleanup run.",
                RUN_BUCKETS,
            )?,
            cleanup_backlog_rows: int_gauge(
                &r,
                "tombstoned_cleanup_backlog_rows",
                "Records due but not yet tombstoned, counted at the end of the last run.",
            )?,
            cleanup_oldest_due_age_seconds: gauge(
                &r,
                "tombstoned_cleanup_oldest_due_age_seconds",
                "How long past its replay deadline the oldest due record was at the end of the \
                 last run (0 when none is due).",
            )?,
            cleanup_last_success_timestamp_seconds: gauge(
                &r,
                "tombstoned_cleanup_last_success_timestamp_seconds",
                "Unix time of the end of the last successful cleanup run.",
            )?,
            cleanup_next_run_timestamp_seconds: gauge(
                &r,
                "tombstoned_cleanup_next_run_timestamp_seconds",
                "Unix time of the next scheduled cleanup run.",
            )?,
            cleanup_lease_held: int_gauge(
                &r,
                "tombstoned_cleanup_lease_held",
                "1 while this instance holds the single-runner cleanup lease.",
            )?,
            tombstones_purged: counter(
                &r,
                "tombstoned_tombstones_purged_total",
                "Tombstones deleted by the retention purge (their keys can be used again).",
            )?,
            cleanup_throttled_seconds: {
                let c = prometheus::CounterVec::new(
                    Opts::new(
                        "tombstoned_cleanup_throttled_seconds_total",
                        "Seconds cleanup runs spent waiting between batches, by reason: \
                         replica_lag (a standby replayed more than cleanup.max_replica_lag \
                         behind), rate (cleanup.max_rows_per_second).",
                    ),
                    &["reason"],
                )?;
                r.register(Box::new(c.clone()))?;
                c
            },
            replica_lag_bytes: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "tombstoned_replica_lag_bytes",
                        "Bytes of WAL each standby's replay position was behind the primary's, \
                         as the cleaner last read pg_stat_replication (with \
                         cleanup.max_replica_lag on).",
                    ),
                    &["application_name"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            http_requests: counter_vec(
                &r,
                "tombstoned_http_requests_total",
                "HTTP requests by route template, method and status code.",
                &["route", "method", "status"],
            )?,
            http_request_duration: {
                let h = HistogramVec::new(
                    HistogramOpts::new(
                        "tombstoned_http_request_duration_seconds",
                        "HTTP request duration by route template.",
                    )
                    .buckets(HTTP_BUCKETS.to_vec()),
                    &["route"],
                )?;
                r.register(Box::new(h.clone()))?;
                h
            },
            claims: counter_vec(
                &r,
                "tombstoned_claims_total",
                "POST /v1/orders outcomes: created, replayed, key_reused, in_progress, expired, \
                 duplicate_request, rejected (business rule), invalid (validation).",
                &["outcome"],
            )?,
            http_requests_in_flight: int_gauge(
                &r,
                "tombstoned_http_requests_in_flight",
                "API requests received and not yet answered.",
            )?,
            http_connections: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "tombstoned_http_connections",
                        "Open HTTP connections by listener: api, metrics.",
                    ),
                    &["listener"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            http_connection_limit: {
                let g = IntGaugeVec::new(
                    Opts::new(
                        "tombstoned_http_connection_limit",
                        "The connection cap in force per listener (max_connections, or less when \
                         the file-descriptor limit cannot hold it).",
                    ),
                    &["listener"],
                )?;
                r.register(Box::new(g.clone()))?;
                g
            },
            http_connections_closed: counter_vec(
                &r,
                "tombstoned_http_connections_closed_total",
                "HTTP connections the server closed, by listener and reason: idle_timeout, \
                 header_timeout (a request's headers did not arrive in time), evicted (the \
                 longest idle one, to make room at the cap), refused (at the cap with none \
                 idle), shutdown.",
                &["listener", "reason"],
            )?,
            db_pool_connections: {
                let c = PoolConnections {
                    gauge: IntGaugeVec::new(
                        Opts::new(
                            "tombstoned_db_pool_connections",
                            "API pool connections by state: in_use, idle, max.",
                        ),
                        &["state"],
                    )?,
                    waiting: IntGauge::new(
                        "tombstoned_db_pool_waiting",
                        "API requests waiting for a connection of the API pool (all in use), at \
                         the scrape.",
                    )?,
                    pool: Arc::new(RwLock::new(None)),
                };
                r.register(Box::new(c.clone()))?;
                c
            },
            db_errors: counter_vec(
                &r,
                "tombstoned_db_errors_total",
                "Database errors by SQLSTATE class (e.g. 55 lock_not_available, 23 integrity, \
                 08 connection; connection when the socket failed without a SQLSTATE).",
                &["sqlstate_class"],
            )?,
            outbox_backlog_events: int_gauge(
                &r,
                "tombstoned_outbox_backlog_events",
                "Outbox events neither delivered nor dead letters, as this instance's relay last \
                 counted them (0 where the relay is off).",
            )?,
            outbox_oldest_undelivered_age_seconds: gauge(
                &r,
                "tombstoned_outbox_oldest_undelivered_age_seconds",
                "Age of the oldest outbox event that is neither delivered nor a dead letter (0 \
                 when there is none).",
            )?,
            outbox_deliveries: counter_vec(
                &r,
                "tombstoned_outbox_deliveries_total",
                "Outbox delivery attempts by outcome: delivered (2xx), retryable_status (5xx, \
                 408, 429, 3xx), permanent_status (other 4xx, attempts left), dead_lettered (410, \
                 or a permanent 4xx at outbox.max_attempts), timeout (outcome unknown), \
                 connection_error, abandoned (cut off by shutdown).",
                &["outcome"],
            )?,
            outbox_delivery_duration: histogram(
                &r,
                "tombstoned_outbox_delivery_duration_seconds",
                "Duration of one outbox delivery attempt, request sent to response read.",
                DELIVERY_BUCKETS,
            )?,
            outbox_dead_letters: int_gauge(
                &r,
                "tombstoned_outbox_dead_letters",
                "Outbox events the relay gave up on, until `tombstoned outbox requeue`.",
            )?,
            outbox_events_deleted: counter(
                &r,
                "tombstoned_outbox_events_deleted_total",
                "Delivered outbox events deleted by retention (retention.outbox_keep_delivered).",
            )?,
            trace_spans_dropped: counter(
                &r,
                "tombstoned_trace_spans_dropped_total",
                "Trace spans dropped instead of exported ([tracing]): the export queue was full, \
                 or the collector was down, too slow or refused them. Requests never wait for it.",
            )?,
            registry: r,
        };
        for o in RUN_OUTCOMES {
            m.cleanup_runs.with_label_values(&[o]);
        }
        for o in BATCH_OUTCOMES {
            m.cleanup_batches.with_label_values(&[o]);
        }
        for reason in THROTTLE_REASONS {
            m.cleanup_throttled_seconds.with_label_values(&[reason]);
        }
        for o in CLAIM_OUTCOMES {
            m.claims.with_label_values(&[o]);
        }
        for listener in LISTENERS {
            m.http_connections.with_label_values(&[listener]);
            m.http_connection_limit.with_label_values(&[listener]);
            for reason in CONNECTION_CLOSE_REASONS {
                m.http_connections_closed
                    .with_label_values(&[listener, reason]);
            }
        }
        for o in OUTBOX_DELIVERY_OUTCOMES {
            m.outbox_deliveries.with_label_values(&[o]);
        }
        let build_info = IntGaugeVec::new(
            Opts::new(
                "tombstoned_build_info",
                "Always 1; the version label says which build is running.",
            ),
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        m.registry.register(Box::new(build_info))?;
        m.registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))?;
        Ok(m)
    }

    /// Reports `pool`'s connections as `tombstoned_db_pool_connections{state}` from now on,
    /// read at each scrape (the API's pool; a later call replaces the pool reported).
    pub fn observe_pool(&self, pool: &Pool) {
        *self
            .db_pool_connections
            .pool
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(pool.clone());
    }

    /// Sets `tombstoned_replica_lag_bytes` to the standbys just read (`(application_name,
    /// bytes)`), dropping the series of standbys no longer listed or with no known position.
    pub fn set_replica_lags<'a>(&self, lags: impl IntoIterator<Item = (&'a str, u64)>) {
        // Two standbys may share a name: the series shows the one further behind.
        let mut current = std::collections::BTreeMap::<&str, u64>::new();
        for (name, bytes) in lags {
            let entry = current.entry(name).or_default();
            *entry = (*entry).max(bytes);
        }
        for family in self.replica_lag_bytes.collect() {
            for metric in family.get_metric() {
                for label in metric.get_label() {
                    if !current.contains_key(label.value()) {
                        let _ = self.replica_lag_bytes.remove_label_values(&[label.value()]);
                    }
                }
            }
        }
        for (name, bytes) in current {
            self.replica_lag_bytes
                .with_label_values(&[name])
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// Records a database error under its SQLSTATE class.
    pub fn db_error(&self, sqlstate_class: &str) {
        self.db_errors.with_label_values(&[sqlstate_class]).inc();
    }

    /// The registry, for tests and for adding collectors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::new();
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

/// `tombstoned_db_pool_connections{state}`, a collector that reads the pool's status when it is
/// gathered: the figures are never staler than the scrape, and no request has to refresh them.
/// Clones share the gauge and the pool (one is registered, one is kept to set the pool).
#[derive(Clone)]
struct PoolConnections {
    gauge: IntGaugeVec,
    waiting: IntGauge,
    pool: Arc<RwLock<Option<Pool>>>,
}

impl PoolConnections {
    /// The one place the pool's status becomes the gauge: in use, idle, and the maximum.
    fn record(&self, status: deadpool_postgres::Status) {
        let set = |state: &str, value: usize| {
            self.gauge
                .with_label_values(&[state])
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        set("in_use", status.size.saturating_sub(status.available));
        set("idle", status.available);
        set("max", status.max_size);
        self.waiting
            .set(i64::try_from(status.waiting).unwrap_or(i64::MAX));
    }
}

impl Collector for PoolConnections {
    fn desc(&self) -> Vec<&Desc> {
        let mut descs = self.gauge.desc();
        descs.extend(self.waiting.desc());
        descs
    }

    /// The connections by state only once a pool is observed; the waiting count always (0
    /// without a pool), so a dashboard's panel has a series from the start.
    fn collect(&self) -> Vec<MetricFamily> {
        let pool = self.pool.read().unwrap_or_else(PoisonError::into_inner);
        match pool.as_ref() {
            Some(pool) => {
                self.record(pool.status());
                let mut families = self.gauge.collect();
                families.extend(self.waiting.collect());
                families
            }
            None => self.waiting.collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_prefixed_and_exists_from_the_start() {
        let m = Metrics::new().unwrap();
        let text = m.render().unwrap();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                line.starts_with("tombstoned_") || line.starts_with("process_"),
                "{line}"
            );
        }
        for needle in [
            "tombstoned_cleanup_runs_total{outcome=\"skipped_lease\"} 0",
            "tombstoned_claims_total{outcome=\"key_reused\"} 0",
            "tombstoned_cleanup_rows_tombstoned_total 0",
            "tombstoned_outbox_deliveries_total{outcome=\"timeout\"} 0",
            "tombstoned_outbox_dead_letters 0",
            "tombstoned_http_requests_in_flight 0",
            "tombstoned_db_pool_waiting 0",
            "tombstoned_build_info{version=",
            "tombstoned_cleanup_throttled_seconds_total{reason=\"replica_lag\"} 0",
            "tombstoned_cleanup_throttled_seconds_total{reason=\"rate\"} 0",
            "tombstoned_trace_spans_dropped_total 0",
        ] {
            assert!(text.contains(needle), "missing {needle}");
        }
    }

    #[test]
    fn replica_lag_series_follow_the_standbys_last_read() {
        let m = Metrics::new().unwrap();
        m.set_replica_lags([("a", 10), ("b", 20)]);
        let text = m.render().unwrap();
        assert!(text.contains("tombstoned_replica_lag_bytes{application_name=\"a\"} 10"));
        assert!(text.contains("tombstoned_replica_lag_bytes{application_name=\"b\"} 20"));
        m.set_replica_lags([("b", 5)]);
        let text = m.render().unwrap();
        assert!(!text.contains("application_name=\"a\""), "{text}");
        assert!(text.contains("tombstoned_replica_lag_bytes{application_name=\"b\"} 5"));
        m.set_replica_lags([]);
        assert!(!m
            .render()
            .unwrap()
            .contains("tombstoned_replica_lag_bytes{"));
    }

    #[tokio::test]
    async fn pool_connections_are_read_when_scraped() {
        let m = Metrics::new().unwrap();
        assert!(!m
            .render()
            .unwrap()
            .contains("tombstoned_db_pool_connections{"));
        let config = crate::config::Config::default();
        // Built lazily: no connection is opened.
        let pool = crate::db::pool(
            &config.database,
            "test",
            4,
            std::time::Duration::from_secs(1),
        )
        .unwrap();
        m.observe_pool(&pool);
        let text = m.render().unwrap();
        for line in [
            "tombstoned_db_pool_connections{state=\"in_use\"} 0",
            "tombstoned_db_pool_connections{state=\"idle\"} 0",
            "tombstoned_db_pool_connections{state=\"max\"} 4",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        pool.resize(2);
        assert!(m
            .render()
            .unwrap()
            .lines()
            .any(|l| l == "tombstoned_db_pool_connections{state=\"max\"} 2"));
    }
}

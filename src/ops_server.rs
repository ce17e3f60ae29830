//! The operations listener (`metrics.listen`): `GET /metrics` (Prometheus text exposition),
//! `GET /healthz` (the process answers) and `GET /readyz` (database reachable, schema current).
//!
//! It is separate from the API listener so that scrapes and probes keep working when the API is
//! saturated or disabled, and so it can stay on a private address.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use deadpool_postgres::Pool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::readiness::{Readiness, ReadinessProbe};

/// The content type of `/metrics`: Prometheus text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// A failure of the operations listener.
#[derive(Debug, thiserror::Error)]
pub enum OpsServerError {
    /// The listen address could not be bound (in use, not local, no permission).
    #[error("cannot listen on {addr} (metrics.listen)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Accepting or serving connections failed.
    #[error("the metrics listener failed")]
    Serve(#[source] std::io::Error),
}

/// What the listener's handlers read. Cheap to clone.
#[derive(Clone)]
pub struct OpsState {
    metrics: Arc<Metrics>,
    readiness: Arc<ReadinessProbe>,
    pool: Option<Pool>,
}

impl OpsState {
    /// State serving `metrics` and answering `/readyz` from `readiness`.
    pub fn new(metrics: Arc<Metrics>, readiness: Arc<ReadinessProbe>) -> Self {
        OpsState {
            metrics,
            readiness,
            pool: None,
        }
    }

    /// Reports this pool's connections as `tombstoned_db_pool_connections{state}` at each
    /// scrape (the API's pool).
    pub fn with_pool(mut self, pool: Pool) -> Self {
        self.pool = Some(pool);
        self
    }
}

/// Sets `tombstoned_db_pool_connections{state="in_use"|"idle"|"max"}` and
/// `tombstoned_db_pool_waiting` from a pool's status.
pub fn record_pool_status(metrics: &Metrics, status: deadpool_postgres::Status) {
    let gauge = |state: &str, value: usize| {
        metrics
            .db_pool_connections
            .with_label_values(&[state])
            .set(i64::try_from(value).unwrap_or(i64::MAX));
    };
    gauge("in_use", status.size.saturating_sub(status.available));
    gauge("idle", status.available);
    gauge("max", status.max_size);
    metrics
        .db_pool_waiting
        .set(i64::try_from(status.waiting).unwrap_or(i64::MAX));
}

/// The routes: `/metrics`, `/healthz`, `/readyz`; anything else is 404.
pub fn router(state: OpsState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Binds the listen address (before `READY=1`, so a port conflict fails start-up).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, OpsServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| OpsServerError::Bind { addr, source })
}

/// Serves the operations routes on `listener` until `shutdown` is cancelled, then lets requests
/// in flight finish (each is short: a render, or a readiness check bounded by its timeout).
pub async fn serve_metrics(
    listener: TcpListener,
    state: OpsState,
    shutdown: CancellationToken,
) -> Result<(), OpsServerError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "metrics and health listener started");
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(OpsServerError::Serve)
}

async fn metrics(State(state): State<OpsState>) -> Response {
    if let Some(pool) = &state.pool {
        record_pool_status(&state.metrics, pool.status());
    }
    match state.metrics.render() {
        Ok(text) => (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(METRICS_CONTENT_TYPE),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            ],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::error!(error = %e, "cannot render metrics");
            plain(StatusCode::INTERNAL_SERVER_ERROR, "cannot render metrics\n")
        }
    }
}

async fn healthz() -> Response {
    plain(StatusCode::OK, "ok\n")
}

async fn readyz(State(state): State<OpsState>) -> Response {
    match state.readiness.check().await {
        Readiness::Ready => plain(StatusCode::OK, "ready\n"),
        Readiness::NotReady(reason) => plain(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        ),
    }
}

fn plain(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body.into(),
    )
        .into_response()
}

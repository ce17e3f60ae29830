//! The operations listener (`metrics.listen`): `GET /metrics` (Prometheus text exposition),
//! `GET /healthz` (the process answers) and `GET /readyz` (database reachable, schema current).
//!
//! It is separate from the API listener so that scrapes and probes keep working when the API is
//! saturated or disabled, and so it can stay on a private address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::db::Pool;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::connections::{self, ConnectionLimits, ListenerName};
use crate::metrics::Metrics;
use crate::ops::readiness::{Readiness, ReadinessProbe};

/// The content type of `/metrics`: Prometheus text exposition format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = prometheus::TEXT_FORMAT;

/// How long requests in flight at shutdown may take (a render, or a readiness check bounded at
/// 2 s) before their connections are dropped.
pub const REQUEST_DRAIN: Duration = Duration::from_secs(5);

/// The `[metrics]` defaults (`max_connections = 64`, `header_read_timeout = "10s"`,
/// `idle_timeout = "60s"`), until [`OpsState::with_limits`] sets the configured ones.
pub const DEFAULT_LIMITS: ConnectionLimits = ConnectionLimits {
    max_connections: 64,
    header_read_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(60),
    drain_timeout: REQUEST_DRAIN,
};

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
    limits: ConnectionLimits,
}

impl OpsState {
    /// State serving `metrics` and answering `/readyz` from `readiness`.
    pub fn new(metrics: Arc<Metrics>, readiness: Arc<ReadinessProbe>) -> Self {
        OpsState {
            metrics,
            readiness,
            limits: DEFAULT_LIMITS,
        }
    }

    /// The listener's connection bounds (`metrics.max_connections`, `metrics.header_read_timeout`,
    /// `metrics.idle_timeout`, after the file-descriptor budget).
    pub fn with_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Reports this pool's connections as `tombstoned_db_pool_connections{state}` at each
    /// scrape ([`Metrics::observe_pool`]; the API's state does so for its own pool).
    pub fn with_pool(self, pool: Pool) -> Self {
        self.metrics.observe_pool(&pool);
        self
    }
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

/// Serves the operations routes on `listener` within the state's connection bounds
/// ([`crate::connections`]) until `shutdown` is cancelled, then closes idle and half-sent
/// connections at once and lets requests in flight finish (each is short: a render, or a
/// readiness check bounded by its timeout), at most [`REQUEST_DRAIN`].
pub async fn serve_metrics(
    listener: TcpListener,
    state: OpsState,
    shutdown: CancellationToken,
) -> Result<(), OpsServerError> {
    let limits = state.limits;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            %addr,
            max_connections = limits.max_connections,
            "metrics and health listener started"
        );
    }
    let metrics = Arc::clone(&state.metrics);
    connections::serve(
        listener,
        router(state),
        limits,
        ListenerName::Metrics,
        Some(metrics),
        shutdown,
    )
    .await;
    Ok(())
}

async fn metrics(State(state): State<OpsState>) -> Response {
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

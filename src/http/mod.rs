//! The HTTP API (`POST /v1/orders`, `GET /v1/orders/{order_id}`,
//! `GET /v1/idempotency-keys/{key}`): shared state and its reload, the router, and the server with
//! graceful shutdown. The protocol itself lives in [`crate::claim`]; this module authenticates,
//! validates, rate-limits, maps outcomes to RFC 9457 answers and meters every request.
//!
//! Wiring (the daemon):
//!
//! ```no_run
//! # async fn demo(config: tombstoned::config::Config, metrics: std::sync::Arc<tombstoned::metrics::Metrics>) -> anyhow::Result<()> {
//! use tombstoned::http::{self, ApiState};
//! let state = ApiState::new(&config, metrics)?;
//! let listener = tokio::net::TcpListener::bind(config.api.listen).await?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! // on SIGHUP, with the newly loaded config:  state.reload(&new_config)
//! http::serve(listener, state, shutdown.clone()).await?;
//! # Ok(()) }
//! ```

mod dispatch;
mod handlers;
mod key_gate;
mod middleware;
pub mod problem;
mod run_to_end;
mod state;

use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::connections::{self, ConnectionLimits, ListenerName};

pub use key_gate::MAX_IN_FLIGHT_PER_KEY;
pub use state::ApiState;

use crate::auth::TokensError;
use crate::db::DbError;

/// Why the API could not start, reload or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The tokens file is unreadable or invalid (on reload the previous tokens stay in force).
    #[error(transparent)]
    Tokens(#[from] TokensError),
    /// A setting the configuration accepted is not usable by the API.
    #[error("invalid value for `{key}`: {reason}")]
    Config {
        /// The dotted key.
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// The connection pool could not be built.
    #[error("cannot build the API connection pool")]
    Pool(#[source] DbError),
    /// The server's accept loop failed.
    #[error("the HTTP server failed")]
    Serve(#[source] std::io::Error),
}

/// One documented route: method, path template (as in the OpenAPI document) and every status its
/// handler can answer with. 405 (wrong method) and the fallback's 404 are global.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteSpec {
    /// HTTP method.
    pub method: &'static str,
    /// Path template, e.g. `/v1/orders/{order_id}`.
    pub path: &'static str,
    /// `METHOD path`: the name of its requests' server spans (OpenTelemetry's HTTP server
    /// conventions), written out so a traced request allocates no name.
    pub span_name: &'static str,
    /// Every status the handler can return.
    pub statuses: &'static [u16],
}

/// Every route the router serves. docs/openapi.json documents exactly these (a test checks).
pub const ROUTES: &[RouteSpec] = &[
    RouteSpec {
        method: "POST",
        path: "/v1/orders",
        span_name: "POST /v1/orders",
        statuses: &[
            200, 201, 400, 401, 403, 409, 410, 413, 415, 422, 429, 500, 503,
        ],
    },
    RouteSpec {
        method: "GET",
        path: "/v1/orders/{order_id}",
        span_name: "GET /v1/orders/{order_id}",
        statuses: &[200, 401, 403, 404, 429, 500, 503],
    },
    RouteSpec {
        method: "GET",
        path: "/v1/idempotency-keys/{key}",
        span_name: "GET /v1/idempotency-keys/{key}",
        statuses: &[200, 400, 401, 403, 404, 429, 500, 503],
    },
];

/// The route label used in metrics for requests that match no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// The router: the three routes, problem+json fallbacks for unknown paths (404) and methods
/// (405), and the metrics/logging middleware around everything.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/orders", post(handlers::create_order_route))
        .route("/v1/orders/{order_id}", get(handlers::get_order))
        .route("/v1/idempotency-keys/{key}", get(handlers::get_key_status))
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .fallback(handlers::route_not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::track,
        ))
        .with_state(state)
}

/// How long requests in flight at shutdown may take to finish before their connections are
/// dropped (the daemon's whole API drain, claims included, is bounded at 15 s, well inside the
/// unit's `TimeoutStopSec=45s`).
pub const REQUEST_DRAIN: Duration = Duration::from_secs(10);

/// Serves the API on `listener` with the connection bounds of the configuration it was built
/// from (`api.max_connections`, `api.header_read_timeout`, `api.idle_timeout`); see
/// [`serve_with_limits`].
pub async fn serve(
    listener: TcpListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    let limits = state.connection_limits();
    serve_with_limits(listener, state, limits, shutdown).await
}

/// Serves the API on `listener` within `limits` ([`crate::connections`]) until `shutdown` is
/// cancelled, then stops accepting, closes idle and half-sent connections, lets in-flight
/// requests finish (at most `limits.drain_timeout`), and waits for every claim transaction
/// whose request was abandoned (its client went away, or its connection was closed at the end of
/// the drain) to end.
pub async fn serve_with_limits(
    listener: TcpListener,
    state: ApiState,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(
            %addr,
            max_connections = limits.max_connections,
            header_read_timeout = ?limits.header_read_timeout,
            idle_timeout = ?limits.idle_timeout,
            "API listener started"
        );
    }
    let app = dispatch::Api::new(state.clone());
    connections::serve(
        listener,
        app,
        limits,
        ListenerName::Api,
        Some(state.metrics().clone()),
        shutdown,
    )
    .await;
    state.drain_claims().await;
    Ok(())
}

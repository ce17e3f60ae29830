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

mod handlers;
mod middleware;
pub mod problem;
mod state;

use axum::routing::{get, post};
use axum::serve::ListenerExt as _;
use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
    /// Every status the handler can return.
    pub statuses: &'static [u16],
}

/// Every route the router serves. docs/openapi.json documents exactly these (a test checks).
pub const ROUTES: &[RouteSpec] = &[
    RouteSpec {
        method: "POST",
        path: "/v1/orders",
        statuses: &[
            200, 201, 400, 401, 403, 409, 410, 413, 415, 422, 429, 500, 503,
        ],
    },
    RouteSpec {
        method: "GET",
        path: "/v1/orders/{order_id}",
        statuses: &[200, 401, 403, 404, 429, 500, 503],
    },
    RouteSpec {
        method: "GET",
        path: "/v1/idempotency-keys/{key}",
        statuses: &[200, 400, 401, 403, 404, 429, 500, 503],
    },
];

/// The route label used in metrics for requests that match no route.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// The router: the three routes, problem+json fallbacks for unknown paths (404) and methods
/// (405), and the metrics/logging middleware around everything.
pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/orders", post(handlers::create_order))
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

/// Serves the API on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// in-flight requests finish (connections close as their requests complete), and waits for every
/// claim transaction spawned by a request — including those whose client went away — to end.
/// Bounding the drain is the caller's choice (wrap this future in a timeout).
pub async fn serve(
    listener: TcpListener,
    state: ApiState,
    shutdown: CancellationToken,
) -> Result<(), ApiError> {
    let app = router(state.clone());
    // Responses are small and written at once; without NODELAY a keep-alive client could see
    // delayed-ACK stalls.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await;
    state.drain_claims().await;
    result.map_err(ApiError::Serve)
}

//! The API's shared state: the connection pool, the metrics, and the reloadable part (tokens,
//! rate limiter, claim settings, request limits) swapped as one snapshot on reload.

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::db::Pool;
use governor::{DefaultKeyedRateLimiter, Quota};
use tokio_util::task::TaskTracker;

use super::key_gate::KeyGate;
use super::ApiError;
use crate::auth::TokenSet;
use crate::claim::ClaimSettings;
use crate::config::{Config, DatabaseConfig};
use crate::connections::ConnectionLimits;
use crate::db;
use crate::metrics::Metrics;
use crate::ops::request_health::RequestHealth;
use crate::order_request::RequestDefaults;

/// Per-principal rate limiter, keyed by `tenant NUL principal`.
pub(crate) type Limiter = DefaultKeyedRateLimiter<Arc<str>>;

/// Everything a reload may change, replaced as a whole so a request sees one consistent set.
pub(crate) struct Live {
    pub tokens: Arc<TokenSet>,
    pub limiter: Arc<Limiter>,
    pub rate: (u32, u32),
    pub claim: ClaimSettings,
    pub max_body_bytes: usize,
    pub defaults: RequestDefaults,
    pub default_api_version: String,
    pub tokens_file: PathBuf,
    /// How long a POST body may take to arrive (`api.header_read_timeout` again).
    pub body_read_timeout: std::time::Duration,
}

struct Inner {
    pool: Pool,
    /// The pool's database: the schema statements name and how they are sent (restart-only).
    database: Arc<DatabaseConfig>,
    metrics: Arc<Metrics>,
    live: RwLock<Arc<Live>>,
    tasks: TaskTracker,
    keys: KeyGate,
    connection_limits: ConnectionLimits,
    health: Arc<RequestHealth>,
}

/// The API's state: cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct ApiState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").finish_non_exhaustive()
    }
}

impl ApiState {
    /// Builds the pool (`database.pool_size` connections, opened lazily; a request waits at most
    /// `database.connect_timeout` for one; each carries the claim's session settings,
    /// [`ClaimSettings::session_settings`]) and loads the tokens file.
    pub fn new(config: &Config, metrics: Arc<Metrics>) -> Result<ApiState, ApiError> {
        let live = build_live(config, None)?;
        let pool = db::pool_carrying(
            &config.database,
            "api",
            config.database.pool_size,
            config.database.connect_timeout,
            live.claim.session_settings(),
        )
        .map_err(ApiError::Pool)?;
        metrics.observe_pool(&pool);
        // Every documented (route, method, status) exists at 0 from the first scrape on, so that
        // the first 429 or 503 after a start shows in rate() and increase() (a series that
        // appears at 1 looks like no increase).
        for route in super::ROUTES {
            for status in route.statuses {
                metrics.http_requests.with_label_values(&[
                    route.path,
                    route.method,
                    &status.to_string(),
                ]);
            }
        }
        tracing::info!(
            tokens = live.tokens.len(),
            file = %live.tokens_file.display(),
            "API tokens loaded"
        );
        Ok(ApiState {
            inner: Arc::new(Inner {
                pool,
                database: Arc::new(config.database.clone()),
                metrics,
                live: RwLock::new(Arc::new(live)),
                tasks: TaskTracker::new(),
                keys: KeyGate::default(),
                health: Arc::default(),
                connection_limits: ConnectionLimits {
                    max_connections: config.api.max_connections,
                    header_read_timeout: config.api.header_read_timeout,
                    idle_timeout: config.api.idle_timeout,
                    drain_timeout: super::REQUEST_DRAIN,
                },
            }),
        })
    }

    /// Re-reads the tokens file and applies every setting that can change safely:
    /// `api.claim_lock_timeout`, `api.max_body_bytes`, `api.default_currency`,
    /// `api.default_api_version`, `api.rate_limit_per_second`/`_burst` (the limiter restarts
    /// only when they change), `api.tokens_file`, `retention.replay_window`. All or nothing: when
    /// the tokens file is broken the previous tokens *and* settings stay and the error is
    /// returned for logging. `api.listen` and `database.*` need a restart; the daemon names
    /// the ones that changed ([`Config::restart_required_changes`]).
    pub fn reload(&self, config: &Config) -> Result<(), ApiError> {
        let current = self.live();
        let live = build_live(config, Some(&current))?;
        tracing::info!(
            tokens = live.tokens.len(),
            file = %live.tokens_file.display(),
            "API configuration reloaded"
        );
        let mut slot = match self.inner.live.write() {
            Ok(guard) => guard,
            // A panic while holding the lock cannot leave a half-written Arc: take it over.
            Err(poisoned) => poisoned.into_inner(),
        };
        // Every pooled session, idle or in use, carries the new lock timeout before its next
        // statement (at its next checkout); a claim also makes its own session carry the
        // settings it runs with, should a request straddle the reload.
        self.inner
            .pool
            .manager()
            .set_session_settings(live.claim.session_settings());
        *slot = Arc::new(live);
        Ok(())
    }

    /// The API's connection pool.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// The database the pool connects to (its `schema` and `pooler` as at start-up).
    pub fn database(&self) -> &Arc<DatabaseConfig> {
        &self.inner.database
    }

    /// What requests experienced of the database, for readiness.
    pub fn health(&self) -> &Arc<RequestHealth> {
        &self.inner.health
    }

    /// The metrics the API feeds.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    /// The current snapshot of reloadable settings.
    pub(crate) fn live(&self) -> Arc<Live> {
        match self.inner.live.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Tracks claim transactions whose requests were abandoned before they ended (finished in
    /// the background, awaited at shutdown).
    pub(crate) fn tasks(&self) -> &TaskTracker {
        &self.inner.tasks
    }

    /// The API listener's connection bounds, as configured.
    pub fn connection_limits(&self) -> ConnectionLimits {
        self.inner.connection_limits
    }

    /// Claims in flight per scope and key.
    pub(crate) fn keys(&self) -> &KeyGate {
        &self.inner.keys
    }

    /// Waits until every claim transaction its request abandoned has ended.
    pub async fn drain_claims(&self) {
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
        self.inner.tasks.reopen();
    }
}

fn build_live(config: &Config, current: Option<&Live>) -> Result<Live, ApiError> {
    let api = &config.api;
    let tokens = Arc::new(TokenSet::load(&api.tokens_file)?);
    let rate = (api.rate_limit_per_second, api.rate_limit_burst);
    let limiter = match current {
        Some(c) if c.rate == rate => Arc::clone(&c.limiter),
        _ => Arc::new(Limiter::keyed(quota(rate))),
    };
    Ok(Live {
        tokens,
        limiter,
        rate,
        claim: ClaimSettings {
            lock_timeout: api.claim_lock_timeout,
            replay_window: config.retention.replay_window,
        },
        max_body_bytes: api.max_body_bytes,
        defaults: RequestDefaults {
            currency: api.default_currency,
        },
        default_api_version: api.default_api_version.clone(),
        tokens_file: api.tokens_file.clone(),
        body_read_timeout: api.header_read_timeout,
    })
}

fn quota((per_second, burst): (u32, u32)) -> Quota {
    let per_second = NonZeroU32::new(per_second).unwrap_or(NonZeroU32::MIN);
    let burst = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
    Quota::per_second(per_second).allow_burst(burst)
}

//! Readiness: the database answers and its schema is exactly what this binary expects. This is
//! what `/readyz` reports and what the watchdog can read.
//!
//! The check runs on one dedicated session (`application_name = tombstoned/readiness`), kept
//! open between checks and reopened after a failure, so it neither competes with the API for
//! pooled connections nor opens a connection per probe. Checks are single-flight and their
//! result is reused for a short while: however many probes arrive at once, at most one check
//! talks to the database, and each is bounded by a timeout (client side, and as
//! `statement_timeout` server side so a stuck check does not linger in the database).
//!
//! A dedicated session answering proves little about what requests experience, so with the API
//! running ([`ReadinessProbe::with_api`]) a check also judges the API's side:
//!
//! - one pooled connection is checked out and answers `SELECT 1`, each within the check's bound.
//!   When the pool's open connections went silent (a lost NAT entry, a partition behind a proxy)
//!   while new ones would work, that is what finds it: the silent connection is discarded and
//!   the idle ones retired with it, so the pool heals by reconnecting — and until it has, the
//!   service is not ready. A pool whose connections all hang stays not ready, and the watchdog
//!   (which reads [`ReadinessProbe::last_ready_age`]) stops vouching after its tolerance;
//! - resource exhaustion (SQLSTATE class 53, e.g. 53100 disk full) that requests met within
//!   [`crate::ops::request_health::EXHAUSTION_HOLD`]: a read answers while every write fails;
//! - the server refuses writes (`pg_is_in_recovery()` or `transaction_read_only`, read on the
//!   probe's session): a standby, a demoted primary, or `default_transaction_read_only = on`.
//!
//! The last two are reported not ready so a load balancer drains the instance, but they do not
//! stop the watchdog: the database answers, and restarting the daemon would not help.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::db::Pool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::DatabaseConfig;
use crate::db::{self, DbError, ErrorClass, Session};
use crate::ops::request_health::RequestHealth;
use crate::schema::{self, CheckError, Needs};

/// Default bound on one check, connecting included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time a check's result is reused before the database is asked again.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(1);

/// The `application_name` purpose of the probe's session.
const PURPOSE: &str = "readiness";

/// The answer of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The database answers and the schema is current.
    Ready,
    /// Not ready, and why.
    NotReady(NotReady),
}

impl Readiness {
    /// True for [`Readiness::Ready`].
    pub fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready)
    }
}

/// Why the service is not ready. The texts are one line, safe to show to anyone who can reach
/// the metrics listener (the database URL in them is redacted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// No connection could be made, or it broke.
    #[error("database unreachable: {0}")]
    DatabaseUnreachable(String),
    /// The database answered the check with an error (permissions, a statement timeout, ...).
    #[error("database check failed: {0}")]
    DatabaseError(String),
    /// The check did not finish in time.
    #[error("database did not answer within {0:?}")]
    TimedOut(Duration),
    /// The server refuses writes: a standby (`pg_is_in_recovery()`), or a read-only database.
    #[error("database is read-only ({0}): claims cannot be made here")]
    ReadOnly(&'static str),
    /// Requests met resource exhaustion (SQLSTATE class 53) recently.
    #[error("database out of resources: SQLSTATE {code} {ago_secs} s ago")]
    ResourcesExhausted {
        /// The SQLSTATE (`53100` disk full, ...).
        code: String,
        /// How long ago, in whole seconds.
        ago_secs: u64,
    },
    /// A pooled connection failed or did not answer in time.
    #[error("API connection pool unhealthy: {0}")]
    PoolUnhealthy(String),
    /// No pooled connection was free within the check's bound: every one is in use (load) or
    /// held by requests waiting on a silent database (they end at their deadlines).
    #[error("API connection pool busy: {0}")]
    PoolBusy(String),
    /// The server is not PostgreSQL 15 or newer (`crate::schema::server`).
    #[error("database server not supported: {0}")]
    UnsupportedServer(String),
    /// Migrations are pending, unknown to this binary, or differ from it.
    #[error("schema not current: {0}")]
    SchemaNotCurrent(String),
    /// Shutdown has begun; stop sending traffic here.
    #[error("shutting down")]
    ShuttingDown,
}

/// Checks readiness against the database; share it as `Arc<ReadinessProbe>`.
pub struct ReadinessProbe {
    database: DatabaseConfig,
    timeout: Duration,
    max_age: Duration,
    /// Held for the whole of a check: the single flight.
    state: tokio::sync::Mutex<ProbeState>,
    /// When a check last found the service ready (read synchronously by the watchdog).
    last_ready_at: Mutex<Option<Instant>>,
    shutting_down: AtomicBool,
    /// The API's pool and what its requests experienced, when the API runs.
    api: Option<(Pool, Arc<RequestHealth>)>,
}

#[derive(Default)]
struct ProbeState {
    session: Option<Session>,
    last: Option<(Instant, Readiness)>,
}

impl std::fmt::Debug for ReadinessProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadinessProbe")
            .field("database", &self.database.url)
            .field("schema", &self.database.schema)
            .field("timeout", &self.timeout)
            .field("max_age", &self.max_age)
            .finish()
    }
}

impl ReadinessProbe {
    /// A probe for `database`, with [`DEFAULT_TIMEOUT`] and [`DEFAULT_MAX_AGE`]. Connects lazily,
    /// on the first check.
    pub fn new(database: DatabaseConfig) -> Self {
        ReadinessProbe {
            database,
            timeout: DEFAULT_TIMEOUT,
            max_age: DEFAULT_MAX_AGE,
            state: tokio::sync::Mutex::new(ProbeState::default()),
            last_ready_at: Mutex::new(None),
            shutting_down: AtomicBool::new(false),
            api: None,
        }
    }

    /// Also judges the API's side (module docs): its `pool` and the `health` its requests
    /// record.
    pub fn with_api(mut self, pool: Pool, health: Arc<RequestHealth>) -> Self {
        self.api = Some((pool, health));
        self
    }

    /// Bounds one check (connecting included).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long a result is reused; `Duration::ZERO` asks the database every time (still one
    /// check at a time).
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = max_age;
        self
    }

    /// From now on every check answers [`NotReady::ShuttingDown`] without asking the database:
    /// call it when shutdown begins, so load balancers stop sending requests while in-flight
    /// ones drain.
    pub fn mark_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// How long ago a check last found the service ready; `None` if none ever did. Synchronous
    /// and cheap, for the watchdog's health function (keep checks coming with
    /// [`ReadinessProbe::spawn_refresh`]).
    pub fn last_ready_age(&self) -> Option<Duration> {
        let at = *self
            .last_ready_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        at.map(|at| at.elapsed())
    }

    /// Checks readiness: the recent result when there is one, otherwise one bounded check
    /// (waiting for a check already in flight rather than starting another). A result is not
    /// reused once the session it came from has closed (a server restart, a terminated backend):
    /// that is news the next check must hear.
    pub async fn check(&self) -> Readiness {
        if self.shutting_down.load(Ordering::Acquire) {
            return Readiness::NotReady(NotReady::ShuttingDown);
        }
        let mut state = self.state.lock().await;
        let session_lost = state.session.as_ref().is_some_and(Session::is_closed);
        if let Some((at, readiness)) = &state.last {
            if at.elapsed() < self.max_age && !session_lost {
                return readiness.clone();
            }
        }
        let readiness =
            match tokio::time::timeout(self.timeout, self.query(&mut state.session)).await {
                Ok(Ok((schema_problem, read_only))) => match schema_problem {
                    Some(problem) => Readiness::NotReady(problem),
                    None => match read_only {
                        Some(why) => Readiness::NotReady(NotReady::ReadOnly(why)),
                        None => self.api_side().await,
                    },
                },
                Ok(Err(e)) => {
                    // Discarded: reconnect next time; cheaper to reason about than deciding which
                    // errors left the session usable.
                    state.session = None;
                    let reason = db::error_text(&e);
                    Readiness::NotReady(if e.class() == ErrorClass::Unavailable {
                        NotReady::DatabaseUnreachable(reason)
                    } else {
                        NotReady::DatabaseError(reason)
                    })
                }
                Err(_) => {
                    // The session may be stuck mid-statement; dropping it closes the socket.
                    state.session = None;
                    Readiness::NotReady(NotReady::TimedOut(self.timeout))
                }
            };
        let now = Instant::now();
        if readiness.is_ready()
            || matches!(
                readiness,
                Readiness::NotReady(
                    NotReady::ReadOnly(_)
                        | NotReady::ResourcesExhausted { .. }
                        | NotReady::PoolBusy(_)
                )
            )
        {
            // The database answered: what the watchdog needs. A restart cures neither a
            // read-only server nor a full disk, and a busy pool is load (or requests that end at
            // their deadlines, after which the next check meets the silent connections).
            *self
                .last_ready_at
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(now);
        }
        log_transition(state.last.as_ref().map(|(_, r)| r), &readiness);
        state.last = Some((now, readiness.clone()));
        readiness
    }

    /// Runs a check every `every` until `shutdown`, so [`ReadinessProbe::last_ready_age`] stays
    /// current even when nothing scrapes `/readyz`.
    pub fn spawn_refresh(
        self: &Arc<Self>,
        every: Duration,
        shutdown: CancellationToken,
    ) -> JoinHandle<()> {
        let probe = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                probe.check().await;
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(every) => {}
                }
            }
        })
    }

    /// The API's side of a check (module docs); [`Readiness::Ready`] without the API.
    async fn api_side(&self) -> Readiness {
        let Some((pool, health)) = &self.api else {
            return Readiness::Ready;
        };
        if let Some((code, ago)) = health.recently_exhausted() {
            return Readiness::NotReady(NotReady::ResourcesExhausted {
                code,
                ago_secs: ago.as_secs(),
            });
        }
        match probe_pool(pool, self.timeout).await {
            Ok(()) => Readiness::Ready,
            Err(reason) => Readiness::NotReady(reason),
        }
    }

    /// What is wrong with the schema (`None`: it is current), and why the server refuses writes
    /// if it does.
    #[tracing::instrument(level = "debug", skip_all, fields(schema = %self.database.schema))]
    async fn query(
        &self,
        session: &mut Option<Session>,
    ) -> Result<(Option<NotReady>, Option<&'static str>), DbError> {
        if session.as_ref().is_some_and(Session::is_closed) {
            *session = None;
        }
        let session = match session {
            Some(session) => session,
            None => session.insert(db::connect(&self.database, PURPOSE).await?),
        };
        // Server-side bound too, a little under the client's, so a check stuck behind a lock is
        // cancelled in the database instead of waiting there after we gave up. Transaction-local:
        // nothing stays set on a session a pooler hands on.
        let statement_timeout = db::sql::duration_setting(self.timeout * 3 / 4);
        let conn = session.conn();
        let schema_problem =
            match schema::check(&conn, Needs::MIGRATIONS, Some(&statement_timeout)).await {
                Ok(_) => None,
                Err(CheckError::NotCurrent(not_current)) => {
                    Some(NotReady::SchemaNotCurrent(not_current.0))
                }
                Err(CheckError::Unsupported(server)) => {
                    Some(NotReady::UnsupportedServer(server.to_string()))
                }
                Err(CheckError::Db(e)) => return Err(e),
            };
        let row = conn
            .query_one(db::sql::READ_ONLY_CHECK, &[])
            .await
            .map_err(DbError::Query)?;
        let read_only = if row.try_get::<_, bool>(0)? {
            Some("pg_is_in_recovery(): a standby")
        } else if row.try_get::<_, bool>(1)? {
            Some("transaction_read_only = on")
        } else {
            None
        };
        Ok((schema_problem, read_only))
    }
}

/// One pooled connection, checked out and answering `SELECT 1`, each within `bound`. A
/// connection that fails is discarded; one that stays silent is discarded along with every idle
/// one (opened the same way, over the same path: as suspect), so the pool reconnects.
async fn probe_pool(pool: &Pool, bound: Duration) -> Result<(), NotReady> {
    let busy = || {
        NotReady::PoolBusy(format!(
            "no pooled connection free within {}",
            humantime::format_duration(bound)
        ))
    };
    // Busy only when every connection is in use; a wait that ran out while a connection was
    // being opened means opening one failed to finish: unhealthy.
    let all_in_use = || {
        let status = pool.status();
        status.size >= status.max_size && status.available == 0
    };
    let client = match tokio::time::timeout(bound, pool.get()).await {
        Ok(Ok(client)) => client,
        Ok(Err(deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait))) => {
            return Err(busy())
        }
        Err(_) if all_in_use() => return Err(busy()),
        Err(_) => {
            return Err(NotReady::PoolUnhealthy(format!(
                "no pooled connection could be opened within {}",
                humantime::format_duration(bound)
            )))
        }
        Ok(Err(e)) => return Err(NotReady::PoolUnhealthy(db::error_text(&DbError::Pool(e)))),
    };
    match db::deadline::within(
        bound,
        "a ping on a pooled connection",
        client.simple_query(db::sql::PING),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => {
            db::discard(client);
            Err(NotReady::PoolUnhealthy(db::error_text(&DbError::Query(e))))
        }
        Err(timeout) => {
            db::discard(client);
            let retired = db::retire_idle(pool);
            tracing::warn!(
                retired,
                "a pooled connection is silent; discarded with the idle ones"
            );
            Err(NotReady::PoolUnhealthy(db::error_text(&timeout)))
        }
    }
}

fn log_transition(before: Option<&Readiness>, after: &Readiness) {
    match (before, after) {
        (Some(Readiness::Ready) | None, Readiness::NotReady(reason)) => {
            tracing::warn!(%reason, "not ready");
        }
        (Some(Readiness::NotReady(_)) | None, Readiness::Ready) => tracing::info!("ready"),
        (Some(Readiness::NotReady(old)), Readiness::NotReady(new)) if old != new => {
            tracing::warn!(reason = %new, "still not ready");
        }
        _ => {}
    }
}

//! Database plumbing, in one place: the connection settings every session gets and the opening
//! of pools and dedicated sessions (here), [`Session`], how statements are sent
//! ([`statement`], per [`Pooler`]), the classification of failures by SQLSTATE ([`ErrorClass`],
//! never by message text), the client-side bounds on every call ([`deadline`]), the one error
//! text safe to show anywhere ([`error_text`]). Plumbing only: which schema the binary needs is
//! `crate::schema`'s.

pub mod connect;
pub mod conninfo;
pub mod credentials;
pub mod deadline;
mod error;
mod error_text;
pub mod pipeline;
pub mod pooled;
pub mod pooler;
mod session;
pub mod settings;
pub mod sql;
pub mod statement;
pub mod tls;

pub use error::{
    classify, sqlstate_class, violated_constraint, DbError, ErrorClass, LEASE_LOST, WRONG_ISOLATION,
};
pub use error_text::error_text;
pub use pooled::{Object, Pool, PooledSession, SessionSettings};
pub use pooler::Pooler;
pub use session::Session;
pub use settings::{DatabaseConfig, DatabaseUrl};
pub use statement::{Conn, Param};

use std::time::Duration;

use deadpool_postgres::{ManagerConfig, RecyclingMethod, Runtime};

use pooled::SessionManager;

/// The startup parameters for one purpose: the connection string's, plus our
/// `application_name` (visible in `pg_stat_activity`), and the connect timeout and keepalives
/// (for tools connecting with this configuration directly). Nothing else: no `options` (PgBouncer
/// refuses the parameter), so no `search_path` — statements name the schema
/// ([`sql::qualify`]). Hosts, TLS and the password of tombstoned's own sessions are decided per
/// attempt by [`connector`].
pub fn pg_config(db: &DatabaseConfig, purpose: &str) -> tokio_postgres::Config {
    let conninfo = db.url.conninfo();
    let mut pg = connect::driver_config(conninfo);
    if conninfo.application_name().is_none() {
        pg.application_name(format!("tombstoned/{purpose}"));
    }
    let settings = connect::ConnectSettings::derive(conninfo, db.connect_timeout);
    pg.connect_timeout(settings.connect_timeout);
    if let Some(k) = settings.keepalives {
        pg.keepalives(true);
        pg.keepalives_idle(k.idle);
        pg.keepalives_interval(k.interval);
        pg.keepalives_retries(k.retries);
    }
    pg
}

/// The connector every session for `purpose` is opened with (see [`connect::Connector`]).
pub fn connector(db: &DatabaseConfig, purpose: &str) -> connect::Connector {
    connect::Connector::new(
        db.url.conninfo().clone(),
        pg_config(db, purpose),
        db.password_file.clone(),
        connect::ConnectSettings::derive(db.url.conninfo(), db.connect_timeout),
    )
}

/// What `check-config` says about connecting: hosts in order, TLS, where the password comes
/// from (never the password), and `database.pooler`.
pub fn connection_summary(db: &DatabaseConfig) -> Vec<String> {
    let conninfo = db.url.conninfo();
    let settings = connect::ConnectSettings::derive(conninfo, db.connect_timeout);
    let hosts: Vec<String> = conninfo.targets().iter().map(ToString::to_string).collect();
    let mut lines = vec![format!(
        "hosts (in order{}): {}; target_session_attrs {}; connect_timeout {} per host",
        match conninfo.load_balance_hosts() {
            conninfo::LoadBalanceHosts::Disable => "",
            conninfo::LoadBalanceHosts::Random => ", shuffled per connection",
        },
        hosts.join(", "),
        conninfo.target_session_attrs().as_str(),
        humantime::format_duration(settings.connect_timeout),
    )];
    lines.push(match tls::TlsPlan::resolve(conninfo) {
        Ok(plan) => format!(
            "TLS: {}; channel_binding {}",
            plan.describe(),
            conninfo.channel_binding().as_str()
        ),
        Err(e) => format!("TLS: not usable: {e}"),
    });
    let source = credentials::password_source(conninfo, db.password_file.as_deref());
    let missing = match &source {
        credentials::PasswordSource::Pgpass(path) if !path.exists() => {
            " (it does not exist: no password)"
        }
        _ => "",
    };
    lines.push(format!("password: from {source}{missing}"));
    lines.push(format!("pooler: {}", db.pooler.describe()));
    lines
}

/// Builds a pool of at most `size` sessions; waiting for a free session is bounded by `wait`,
/// opening one by the time it takes to try every host (hosts x connect timeout). Connections
/// are opened lazily, so building never touches the network. Its sessions carry no settings of
/// their own until a caller gives them some ([`PooledSession::carry`]).
pub fn pool(
    db: &DatabaseConfig,
    purpose: &str,
    size: usize,
    wait: Duration,
) -> Result<Pool, DbError> {
    build_pool(db, purpose, size, wait, None)
}

/// [`pool`] whose every session carries `settings` session-wide from the moment it opens (and
/// the pool's new settings from its first checkout after
/// [`pooled::SessionManager::set_session_settings`]). Through a transaction pooler
/// (`database.pooler = "transaction"`) nothing is set on a session: it is [`pool`].
pub fn pool_carrying(
    db: &DatabaseConfig,
    purpose: &str,
    size: usize,
    wait: Duration,
    settings: SessionSettings,
) -> Result<Pool, DbError> {
    let settings = db.pooler.keeps_session_state().then_some(settings);
    build_pool(db, purpose, size, wait, settings)
}

fn build_pool(
    db: &DatabaseConfig,
    purpose: &str,
    size: usize,
    wait: Duration,
    session_settings: Option<SessionSettings>,
) -> Result<Pool, DbError> {
    let connector = connector(db, purpose);
    // A little over the connector's own bound, so its error (which names each host's
    // failure) arrives before the pool's bare timeout.
    let create = connector
        .worst_case()
        .saturating_add(Duration::from_millis(500));
    let manager = SessionManager::new(
        pg_config(db, purpose),
        connector,
        ManagerConfig {
            // Fast: a connection the driver saw close is dropped; a statement that fails on a
            // broken connection marks it closed, so the next checkout opens a fresh one.
            recycling_method: RecyclingMethod::Fast,
        },
        session_settings,
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(wait))
        .create_timeout(Some(create))
        .recycle_timeout(Some(db.connect_timeout))
        .build()
        .map_err(DbError::BuildPool)
}

/// Takes a pooled connection out of circulation after an error: nobody can tell what state an
/// unexpected error (or a lost connection) left its session in, so it is closed instead of being
/// handed to the next request. (A dedicated [`Session`] is discarded by dropping it.)
pub fn discard(client: Object) {
    drop(Object::take(client));
}

/// Closes every idle connection of `pool` (those in use are judged by their own calls); returns
/// how many. Called when a call on a pooled connection timed out: the idle ones were opened the
/// same way and have sat on the same network path, so they are as suspect, and a fresh
/// connection costs one handshake while a silent one costs a request its whole deadline.
pub fn retire_idle(pool: &Pool) -> usize {
    pool.retain(|_, _| false).removed.len()
}

/// Opens a dedicated session.
pub async fn connect(db: &DatabaseConfig, purpose: &str) -> Result<Session, DbError> {
    let connected = connector(db, purpose)
        .connect()
        .await
        .map_err(|source| DbError::Connect { source })?;
    tracing::debug!(
        purpose,
        server = %connected.server.target,
        tls = connected.server.tls,
        "database session opened"
    );
    Ok(Session::new(
        connected.client,
        connected.task,
        db.schema.clone(),
        db.pooler,
    ))
}

//! Database plumbing, in one place: the connection settings every session gets and the opening
//! of pools and dedicated sessions (here), [`Session`], the classification of failures by
//! SQLSTATE ([`ErrorClass`], never by message text), the one error text safe to show anywhere
//! ([`error_text`]), and [`migrations`].

mod error;
mod error_text;
pub mod migrations;
pub mod pipeline;
mod session;
pub mod sql;

pub use error::{classify, sqlstate_class, violated_constraint, DbError, ErrorClass};
pub use error_text::error_text;
pub use session::Session;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::config::DatabaseConfig;

/// The connection settings for one purpose: the configured URL, plus our `application_name`
/// (visible in `pg_stat_activity`), the connect timeout, TCP keepalives so a dead peer is
/// noticed, and `search_path` set to the configured schema at connection start-up.
pub fn pg_config(db: &DatabaseConfig, purpose: &str) -> tokio_postgres::Config {
    let mut pg = db.url.pg_config().clone();
    if pg.get_application_name().is_none() {
        pg.application_name(format!("tombstoned/{purpose}"));
    }
    pg.connect_timeout(db.connect_timeout);
    pg.keepalives(true);
    pg.keepalives_idle(Duration::from_secs(30));
    pg.keepalives_interval(Duration::from_secs(10));
    pg.keepalives_retries(3);
    // The schema name was validated as a plain lower-case identifier; no quoting needed.
    let search_path = format!("-c search_path={}", db.schema);
    let options = match pg.get_options() {
        Some(existing) if !existing.trim().is_empty() => format!("{existing} {search_path}"),
        _ => search_path,
    };
    pg.options(options);
    pg
}

/// Builds a pool of at most `size` sessions; waiting for a free session is bounded by `wait`.
/// Connections are opened lazily, so building never touches the network.
pub fn pool(
    db: &DatabaseConfig,
    purpose: &str,
    size: usize,
    wait: Duration,
) -> Result<Pool, DbError> {
    let manager = Manager::from_config(
        pg_config(db, purpose),
        NoTls,
        ManagerConfig {
            // Fast: a connection the driver saw close is dropped; a statement that fails on a
            // broken connection marks it closed, so the next checkout opens a fresh one.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(wait))
        .create_timeout(Some(db.connect_timeout))
        .recycle_timeout(Some(db.connect_timeout))
        .build()
        .map_err(DbError::BuildPool)
}

/// Takes a pooled connection out of circulation after an error: nobody can tell what state an
/// unexpected error (or a lost connection) left its session in, so it is closed instead of being
/// handed to the next request. (A dedicated [`Session`] is discarded by dropping it.)
pub fn discard(client: deadpool_postgres::Object) {
    drop(deadpool_postgres::Object::take(client));
}

/// Opens a dedicated session.
pub async fn connect(db: &DatabaseConfig, purpose: &str) -> Result<Session, DbError> {
    let (client, connection) = pg_config(db, purpose)
        .connect(NoTls)
        .await
        .map_err(|source| DbError::Connect {
            target: db.url.to_string(),
            source,
        })?;
    let task = tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "database connection ended");
        }
    });
    Ok(Session::new(client, task))
}

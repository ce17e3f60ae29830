//! The single-runner lease: a session-level advisory lock, held on a dedicated session
//! (`tombstoned/cleanup-lease`) for the duration of one run, so that of several daemons sharing a
//! database (an HA pair) at most one cleans at a time.
//!
//! It saves work, nothing more: correctness never depends on it. Two runs at once are safe (every
//! batch locks rows in primary-key order and re-checks them after locking). If the lease session
//! dies mid-run the lock is released by the server and another instance may start while this run
//! finishes its current batch; that is the same safe overlap.

use super::CleanupError;
use crate::config::DatabaseConfig;
use crate::db::{self, Pooler, Session};

/// The advisory-lock key text for a schema: `tombstoned:cleanup:<schema>`, so two deployments in
/// different schemas of one database do not exclude each other. Hashed by the server with
/// `hashtextextended(key, 0)` (in `pg_locks`: locktype `advisory`, objsubid 1, classid and objid
/// the high and low halves of that bigint). The holder is easiest found by its application
/// name, `tombstoned/cleanup-lease`, in `pg_stat_activity`.
pub fn lease_key(schema: &str) -> String {
    format!("tombstoned:cleanup:{schema}")
}

/// A held lease. Release it with [`Lease::release`]; dropping it closes the session, which
/// releases the lock too.
pub struct Lease {
    session: Session,
    key: String,
    /// False through a transaction pooler, where no advisory lock is taken (see
    /// [`Lease::try_acquire`]).
    locked: bool,
}

impl Lease {
    /// Tries to take the lease without waiting: `Ok(None)` when another session holds it.
    #[tracing::instrument(skip_all, fields(schema = %db.schema))]
    pub async fn try_acquire(db: &DatabaseConfig) -> Result<Option<Lease>, CleanupError> {
        let session = db::connect(db, "cleanup-lease")
            .await
            .map_err(CleanupError::Connect)?;
        let key = lease_key(&db.schema);
        if db.pooler == Pooler::Transaction {
            // A session-level advisory lock would stay on whichever server connection the pooler
            // gave this statement, held for nobody. Runs may then overlap, which is safe.
            tracing::warn!(
                "database.pooler = \"transaction\": the advisory-lock cleanup lease is not taken, \
                 so cleanup runs of several instances may overlap (safe, only wasteful)"
            );
            return Ok(Some(Lease {
                session,
                key,
                locked: false,
            }));
        }
        let acquired: bool = session
            .conn()
            .query_one(db::sql::ADVISORY_TRY_LOCK, &[&key])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(CleanupError::query("taking the cleanup lease"))?;
        Ok(acquired.then_some(Lease {
            session,
            key,
            locked: true,
        }))
    }

    /// Releases the lock and closes the session.
    #[tracing::instrument(skip_all)]
    pub async fn release(self) -> Result<(), CleanupError> {
        if !self.locked {
            return Ok(());
        }
        self.session
            .conn()
            .query_one(db::sql::ADVISORY_UNLOCK, &[&self.key])
            .await
            .map_err(CleanupError::query("releasing the cleanup lease"))?;
        Ok(())
    }
}

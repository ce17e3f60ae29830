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

/// The server-side work of a lease call is a lock function that never waits; the client gives it
/// this (plus [`db::deadline::SLACK`]) before taking the database for silent.
const LEASE_CALL_BOUND: std::time::Duration = std::time::Duration::from_secs(2);

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
        let acquired: bool = super::bounded(LEASE_CALL_BOUND, "taking the cleanup lease", async {
            session
                .conn()
                .query_one(db::sql::ADVISORY_TRY_LOCK, &[&key])
                .await?
                .try_get(0)
        })
        .await?;
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
        // Bounded: on a silent database this must not hold up a stop; dropping the session
        // (on return) releases the lock anyway once the server notices.
        super::bounded(
            LEASE_CALL_BOUND,
            "releasing the cleanup lease",
            self.session
                .conn()
                .query_one(db::sql::ADVISORY_UNLOCK, &[&self.key]),
        )
        .await?;
        Ok(())
    }
}

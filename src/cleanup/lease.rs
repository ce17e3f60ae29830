//! The single-runner lease: a row of `cleanup_lease` (migration V3) with an expiry on the
//! database clock, so that of several instances sharing a database (an HA pair, daemons behind a
//! load balancer, a timer-driven `tombstoned cleanup`) at most one cleans at a time.
//!
//! * **Taken** by one statement ([`sql::ACQUIRE_LEASE`]): inserted, or taken over once expired.
//! * **Renewed** inside every batch transaction ([`sql::RENEW_LEASE`], run by the batch
//!   engine through [`crate::db::pipeline::Guard`]): when another run has taken the lease, the
//!   renewal fails with SQLSTATE TS001, the batch rolls back whole and the run stops
//!   (`stopped_by = "lease_lost"`). So a batch commits only while its run holds the lease.
//!   With `cleanup.workers > 1` the run renews it from its own session, a third of its length
//!   apart, while each worker's batches only check it ([`sql::LEASE_HELD`], no row lock: renewing
//!   in every worker's batch would make the workers take turns on the lease row).
//! * **Released** at the end of the run, in the same statement that records the run in the
//!   history ([`super::history`]).
//!
//! A lease is free once it expires ([`lease_ttl`] after its last renewal) or once the server
//! session that last took or renewed it has ended ([`sql::ACQUIRE_LEASE`]): a run holds it on its
//! own session only, so a crashed holder (or one on a failed-over primary) is replaced at the
//! next fire, and one whose session the server still believes alive at the expiry.
//! Through a transaction-mode pooler nothing depends on the server connection: every statement
//! is a transaction of its own.
//!
//! The lease saves work and keeps the schedule's "one at a time"; correctness never depended on
//! it (two runs at once are safe, see [`crate::cleanup`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;

use super::{sql, CleanupError};
use crate::config::CleanupConfig;
use crate::db::pipeline;
use crate::db::statement::Ready;
use crate::db::{self, Conn, DbError, ErrorClass, Param};

/// The client-side bound on releasing the lease (one indexed UPDATE that never waits long).
const LEASE_CALL_BOUND: Duration = Duration::from_secs(2);

/// The cleaner's row in `cleanup_lease` (the table is per schema, so is the lease).
pub const LEASE_NAME: &str = "cleanup";

/// Slack in [`lease_ttl`] for round trips, connection set-up, retry back-off and a loaded host.
const LEASE_TTL_MARGIN: Duration = Duration::from_secs(30);

/// The longest lease [`lease_ttl`] gives, whatever the settings: a crashed holder blocks the
/// others at most this long.
const LEASE_TTL_CAP: Duration = Duration::from_secs(24 * 3600);

/// How long a take or a renewal holds the lease: `2 × cleanup.statement_timeout +
/// cleanup.pause_between_batches + 30 s` (at most 24 h). 90 s with the defaults.
///
/// Between two renewals a live run spends at most one batch statement (bounded by
/// `statement_timeout`; its lock waits by `lock_timeout`, which is shorter), the COMMIT, the
/// pause, and the next transaction's settings and renewal; before its first batch, the cutoff
/// and the preparing of its statements. The second `statement_timeout` and the margin cover
/// those short statements, round trips and a deadlock retry's back-off (under 1 s), so a live
/// run never loses the lease between renewals. A run that expires anyway (a stalled host) is
/// only at risk of another instance taking over, and then its next batch stops it.
pub fn lease_ttl(cleanup: &CleanupConfig) -> Duration {
    cleanup
        .statement_timeout
        .saturating_mul(2)
        .saturating_add(cleanup.pause_between_batches)
        .saturating_add(LEASE_TTL_MARGIN)
        .min(LEASE_TTL_CAP)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The lease, held by one run. Renewed by that run's batches; released (and the run recorded)
/// by the run that took it ([`super::run_leased`]), with its record in the history.
#[derive(Debug, Clone)]
pub struct Lease {
    holder: String,
    ttl_ms: i64,
    acquired_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
}

impl Lease {
    /// Tries to take the lease on `client`, for holder `holder` (see
    /// [`crate::instance::instance_id`]), without waiting for another run's lease: `Ok(None)`
    /// while it holds the lease (or, when its lease has just expired, while its batch keeps the
    /// row locked past `cleanup.lock_timeout`: it is renewing, clearly alive). One short
    /// transaction of one statement.
    #[tracing::instrument(skip_all, fields(%holder))]
    pub async fn try_acquire(
        conn: &Conn<'_>,
        cleanup: &CleanupConfig,
        holder: &str,
    ) -> Result<Option<Lease>, CleanupError> {
        let ttl_ms = millis(lease_ttl(cleanup));
        let row = short_transaction(
            conn,
            cleanup,
            sql::ACQUIRE_LEASE,
            &[&LEASE_NAME, &holder, &ttl_ms],
        )
        .await;
        let row = match row {
            Ok(row) => row,
            Err(e) if e.class() == ErrorClass::LockNotAvailable => return Ok(None),
            Err(e) => {
                return Err(CleanupError::Database {
                    step: "taking the cleanup lease",
                    source: e,
                })
            }
        };
        let Some(row) = row else {
            return Ok(None);
        };
        let acquired_at = row
            .try_get(0)
            .map_err(CleanupError::query("taking the cleanup lease"))?;
        let expires_at = row
            .try_get(1)
            .map_err(CleanupError::query("taking the cleanup lease"))?;
        Ok(Some(Lease {
            holder: holder.to_owned(),
            ttl_ms,
            acquired_at,
            expires_at,
        }))
    }

    /// Who holds it: `<host>:<pid>:<run token>`.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// When it was taken (database clock).
    pub fn acquired_at(&self) -> DateTime<Utc> {
        self.acquired_at
    }

    /// Until when the take made it last (each renewal extends it).
    pub fn expires_at(&self) -> DateTime<Utc> {
        self.expires_at
    }

    /// How long each take or renewal makes it last ([`lease_ttl`]).
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(u64::try_from(self.ttl_ms).unwrap_or(0))
    }

    /// Releases the lease if this holder still has it (`expires_at = now()`), without recording
    /// a run: for a holder that did not run (tools, tests). A run releases it with its record.
    pub async fn release(&self, conn: &Conn<'_>) -> Result<bool, CleanupError> {
        super::bounded(
            LEASE_CALL_BOUND,
            "releasing the cleanup lease",
            conn.execute(sql::RELEASE_LEASE, &[&LEASE_NAME, &self.holder]),
        )
        .await
        .map(|n| n > 0)
    }

    /// [`sql::RENEW_LEASE`], prepared on `client`: the batch engine runs it in every batch.
    pub(super) async fn prepare_renewal(
        &self,
        conn: &Conn<'_>,
        cleanup: &CleanupConfig,
    ) -> Result<Ready, CleanupError> {
        super::bounded(
            cleanup.statement_timeout,
            "preparing the lease renewal",
            conn.prepare(
                sql::RENEW_LEASE,
                &db::statement::types_of(&self.renewal_params()),
            ),
        )
        .await
    }

    /// The renewal's parameters.
    pub(super) fn renewal_params(&self) -> [&dyn Param; 3] {
        [&LEASE_NAME, &self.holder, &self.ttl_ms]
    }

    /// [`sql::LEASE_HELD`], prepared on a worker's session: the guard of every batch of a run
    /// with several workers (they check the lease; the run renews it, [`Lease::renew`]).
    pub(super) async fn prepare_check(
        &self,
        conn: &Conn<'_>,
        cleanup: &CleanupConfig,
    ) -> Result<Ready, CleanupError> {
        super::bounded(
            cleanup.statement_timeout,
            "preparing the lease check",
            conn.prepare(
                sql::LEASE_HELD,
                &db::statement::types_of(&self.check_params()),
            ),
        )
        .await
    }

    /// The check's parameters.
    pub(super) fn check_params(&self) -> [&dyn Param; 2] {
        [&LEASE_NAME, &self.holder]
    }

    /// Renews the lease in a transaction of its own, for code that waits between batches longer
    /// than a batch takes (a throttle): `Err` with [`ErrorClass::LeaseLost`] when another run
    /// has it.
    pub async fn renew(
        &self,
        conn: &Conn<'_>,
        cleanup: &CleanupConfig,
    ) -> Result<(), CleanupError> {
        short_transaction(conn, cleanup, sql::RENEW_LEASE, &self.renewal_params())
            .await
            .map(drop)
            .map_err(|source| CleanupError::Database {
                step: "renewing the cleanup lease",
                source,
            })
    }
}

/// `statement` alone in a pipelined transaction with the cleaner's lock and statement timeouts
/// (transaction-local, nothing is left on the session): its first row, if any.
pub(super) async fn short_transaction(
    conn: &Conn<'_>,
    cleanup: &CleanupConfig,
    statement: &'static str,
    params: &[&dyn Param],
) -> Result<Option<Row>, DbError> {
    let lock_timeout = db::sql::duration_setting(cleanup.lock_timeout);
    let statement_timeout = db::sql::duration_setting(cleanup.statement_timeout);
    let settings: [&dyn Param; 2] = [&lock_timeout, &statement_timeout];
    // The client waits a little beyond the server's bound, then takes the database for silent.
    let rows = db::deadline::within(
        db::deadline::beyond(cleanup.statement_timeout),
        "a cleanup lease or history statement",
        pipeline::query(conn, sql::LEASE_SETTINGS, &settings, statement, params),
    )
    .await?
    .map_err(|failure| DbError::Query(failure.error))?;
    Ok(rows.into_iter().next())
}

/// The lease row as `tombstoned status` and a skipped `tombstoned cleanup` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseState {
    /// Whether it is held now (`expires_at` in the future, database clock).
    pub held: bool,
    /// The holder, or the last one once released or expired.
    pub holder: String,
    /// The server process of its last take or renewal.
    pub holder_pid: Option<i32>,
    /// Its `application_name`.
    pub holder_application_name: Option<String>,
    /// When that holder took it.
    pub acquired_at: DateTime<Utc>,
    /// When it last renewed it.
    pub renewed_at: DateTime<Utc>,
    /// Until when it is held (the release time, once released).
    pub expires_at: DateTime<Utc>,
    /// The database clock when this was read.
    pub read_at: DateTime<Utc>,
}

impl LeaseState {
    /// Reads the lease (`None`: never taken in this schema).
    pub async fn read(conn: &Conn<'_>) -> Result<Option<LeaseState>, tokio_postgres::Error> {
        let Some(row) = conn.query_opt(sql::LEASE_STATE, &[&LEASE_NAME]).await? else {
            return Ok(None);
        };
        Ok(Some(LeaseState {
            holder: row.try_get("holder")?,
            holder_pid: row.try_get("holder_pid")?,
            holder_application_name: row.try_get("holder_application_name")?,
            acquired_at: row.try_get("acquired_at")?,
            renewed_at: row.try_get("renewed_at")?,
            expires_at: row.try_get("expires_at")?,
            held: row.try_get("held")?,
            read_at: row.try_get("now")?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn cleanup(env: &[(&str, &str)]) -> CleanupConfig {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load_from(None, env, &[]).unwrap().cleanup
    }

    #[test]
    fn the_ttl_covers_two_statements_a_pause_and_a_margin() {
        assert_eq!(lease_ttl(&cleanup(&[])), Duration::from_secs(90));
        let slow = cleanup(&[
            ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "2m"),
            ("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "10s"),
        ]);
        assert_eq!(lease_ttl(&slow), Duration::from_secs(240 + 10 + 30));
        let absurd = cleanup(&[("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "300years")]);
        assert_eq!(lease_ttl(&absurd), LEASE_TTL_CAP);
    }
}

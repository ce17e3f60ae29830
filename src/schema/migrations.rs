//! Schema migrations: the plain `.sql` files of `migrations/`, embedded at compile time and
//! applied by refinery inside the configured schema, serialised across processes by an
//! advisory lock so two `migrate` runs at once are safe; and the comparison of a database's
//! history with them ([`status`]). The one place of the crate that names the migration files
//! and refinery (`tests/architecture.rs` checks it).
//!
//! The migration files name no schema; the migrate session alone sets its `search_path` to the
//! configured schema (it is a dedicated session, closed after the run). That, the advisory lock
//! held across the run and refinery's transaction per migration are session state a
//! transaction-mode pooler does not keep, so `migrate` refuses to run through one
//! ([`MigrationError::TransactionPooler`]).

use std::time::{Duration, Instant};

use super::sql;
use crate::db::{self, Conn, DatabaseConfig, DbError, Pooler, Session};

mod embedded {
    #![allow(missing_docs)]
    refinery::embed_migrations!("migrations");
}

/// The history table refinery keeps, inside the configured schema.
pub const HISTORY_TABLE: &str = "schema_history";

/// A migration failure.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// Connecting or a bookkeeping statement failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// refinery refused or a migration's SQL failed (the migration's transaction rolled back).
    #[error("migration failed")]
    Apply(#[source] refinery::Error),
    /// The server is not one this binary works on: nothing was written.
    #[error(transparent)]
    Unsupported(#[from] super::UnsupportedServer),
    /// `database.pooler = "transaction"`: migrations need a session of their own.
    #[error(
        "migrate needs a session of its own (an advisory lock, search_path and refinery's \
         transactions span statements), which database.pooler = \"transaction\" does not give: \
         run it with a database.url that connects directly or through a session-mode pooler, \
         and database.pooler = \"none\" or \"session\""
    )]
    TransactionPooler,
}

impl From<tokio_postgres::Error> for MigrationError {
    fn from(e: tokio_postgres::Error) -> Self {
        MigrationError::Db(DbError::Query(e))
    }
}

/// One migration, as embedded in this binary and/or recorded in the database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationInfo {
    /// `V<version>__...`
    pub version: i32,
    /// The part of the file name after `__`.
    pub name: String,
    /// When it was applied (refinery's RFC 3339 text), if it was.
    pub applied_on: Option<String>,
}

/// The schema's state relative to this binary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationStatus {
    /// Applied and known to this binary.
    pub applied: Vec<MigrationInfo>,
    /// Known to this binary, not yet applied.
    pub pending: Vec<MigrationInfo>,
    /// Applied, but unknown to this binary (the database was migrated by a newer version).
    pub unknown: Vec<MigrationInfo>,
    /// Applied, but this binary's file has a different checksum (edited after release).
    pub divergent: Vec<MigrationInfo>,
}

impl MigrationStatus {
    /// True when the schema is exactly what this binary expects.
    pub fn is_current(&self) -> bool {
        self.pending.is_empty() && self.unknown.is_empty() && self.divergent.is_empty()
    }

    /// One sentence saying what is wrong, for `serve` and `/readyz`; `None` when current.
    pub fn problem(&self) -> Option<String> {
        let list = |m: &[MigrationInfo]| {
            m.iter()
                .map(|m| format!("V{}__{}", m.version, m.name))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if !self.divergent.is_empty() {
            Some(format!(
                "applied migrations differ from this binary's: {}",
                list(&self.divergent)
            ))
        } else if !self.unknown.is_empty() {
            Some(format!(
                "the schema has migrations this binary does not know ({}); upgrade tombstoned",
                list(&self.unknown)
            ))
        } else if !self.pending.is_empty() {
            Some(format!(
                "{} migration(s) pending ({}); run `tombstoned migrate` first",
                self.pending.len(),
                list(&self.pending)
            ))
        } else {
            None
        }
    }
}

fn runner() -> refinery::Runner {
    let mut runner = embedded::migrations::runner();
    runner.set_migration_table_name(HISTORY_TABLE);
    runner
}

/// The migrations this binary carries, oldest first (`applied_on` is `None`).
pub fn known() -> Vec<MigrationInfo> {
    runner().get_migrations().iter().map(info).collect()
}

/// A migration file as this binary knows it (not applied: no time).
fn info(m: &refinery::Migration) -> MigrationInfo {
    MigrationInfo {
        version: m.version(),
        name: m.name().to_owned(),
        applied_on: None,
    }
}

/// Applies every pending migration; returns the ones applied now (empty when already current).
pub async fn migrate(db: &DatabaseConfig) -> Result<Vec<MigrationInfo>, MigrationError> {
    apply(db, runner()).await
}

/// Applies the pending migrations up to and including `version`, as the release that ended at
/// `version` would have: what the upgrade tests start from.
pub async fn migrate_to(
    db: &DatabaseConfig,
    version: i32,
) -> Result<Vec<MigrationInfo>, MigrationError> {
    apply(db, runner().set_target(refinery::Target::Version(version))).await
}

async fn apply(
    db: &DatabaseConfig,
    runner: refinery::Runner,
) -> Result<Vec<MigrationInfo>, MigrationError> {
    if db.pooler == Pooler::Transaction {
        return Err(MigrationError::TransactionPooler);
    }
    let mut session = db::connect(db, "migrate").await?;
    apply_on(&mut session, db, runner).await
}

/// The migration run on `session` (the migrate session, dedicated).
async fn apply_on(
    session: &mut Session,
    db: &DatabaseConfig,
    runner: refinery::Runner,
) -> Result<Vec<MigrationInfo>, MigrationError> {
    // Before anything is written: a schema half made on a server the daemon will refuse helps
    // nobody.
    if let Some(server) = super::server::unsupported(&session.conn(), None).await? {
        return Err(server.into());
    }
    let client = &mut session.client;
    // Same key for every process migrating this schema; released when the session ends even
    // if we crash half way.
    let lock_key = format!("tombstoned:migrate:{}", db.schema);
    client.execute(sql::ADVISORY_LOCK, &[&lock_key]).await?;
    // The identifier was validated ([a-z_][a-z0-9_]*); DDL cannot take it as a parameter.
    client
        .batch_execute(&sql::create_schema(&db.schema))
        .await?;
    // The migration files name no schema: this session (and no other) resolves them in it.
    client
        .batch_execute(&sql::set_search_path(&db.schema))
        .await?;
    let report = runner
        .run_async(client)
        .await
        .map_err(MigrationError::Apply)?;
    client.execute(sql::ADVISORY_UNLOCK, &[&lock_key]).await?;
    Ok(report.applied_migrations().iter().map(info).collect())
}

/// What a migration run is doing, as a second session sees it ([`migrate_watched`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationActivity {
    /// The migration running: the first pending one the history does not have yet (`None`:
    /// before the first, e.g. waiting for another `migrate`'s advisory lock, or after the last).
    pub migration: Option<MigrationInfo>,
    /// Its place among the migrations this run applies (1-based), and how many that is.
    pub step: (usize, usize),
    /// How long it has been running (since this watcher first saw it).
    pub running_for: Duration,
    /// Its index build, when PostgreSQL reports one (`pg_stat_progress_create_index`).
    pub index_build: Option<IndexBuild>,
    /// The strong table locks it holds: "AccessExclusiveLock on tombstoned.idempotency_records".
    pub holds: Vec<String>,
    /// The lock it waits for, and who holds it.
    pub waits: Option<LockWait>,
}

/// An index build in progress, as `pg_stat_progress_create_index` reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexBuild {
    /// The index (its oid while its creation is uncommitted), when known.
    pub index: Option<String>,
    /// The table.
    pub table: Option<String>,
    /// The phase: "building index: scanning table", "building index: loading tuples in tree", ...
    pub phase: String,
    /// Blocks to scan, and scanned.
    pub blocks: (i64, i64),
    /// Tuples to load, and loaded (where the phase counts them).
    pub tuples: (i64, i64),
}

/// A lock the migration waits for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockWait {
    /// What: a relation's name, or the lock type (`advisory`: another `migrate`;
    /// `transactionid`: a row another transaction holds).
    pub what: String,
    /// The mode asked for.
    pub mode: String,
    /// The sessions holding it up (`pg_blocking_pids`).
    pub blocked_by: Vec<i32>,
}

/// [`migrate`], telling `watch` every `every` what the run is doing, read from a second session
/// ([`MigrationActivity`]; `tombstoned migrate` on a terminal shows it). Without a second
/// session (it cannot be opened), the run goes on unwatched. The migrations applied are the same
/// as [`migrate`]'s, on the same kind of session.
pub async fn migrate_watched(
    db: &DatabaseConfig,
    every: Duration,
    mut watch: impl FnMut(&MigrationActivity),
) -> Result<Vec<MigrationInfo>, MigrationError> {
    if db.pooler == Pooler::Transaction {
        return Err(MigrationError::TransactionPooler);
    }
    let mut session = db::connect(db, "migrate").await?;
    let pid = session.backend_pid().await?;
    let watcher = match db::connect(db, "migrate-watch").await {
        Ok(watcher) => watcher,
        Err(e) => {
            tracing::debug!(error = %db::error_text(&e), "migration not watched");
            return apply_on(&mut session, db, runner()).await;
        }
    };
    let pending = match status(&watcher.conn(), None).await {
        Ok(status) => status.pending,
        Err(_) => known(),
    };
    let work = apply_on(&mut session, db, runner());
    tokio::pin!(work);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut current: Option<(i32, Instant)> = None;
    loop {
        tokio::select! {
            done = &mut work => return done,
            _ = tick.tick() => {
                match activity(&watcher.conn(), pid, &pending, &mut current).await {
                    Ok(activity) => watch(&activity),
                    Err(e) => tracing::debug!(error = %db::error_text(&e), "migration activity not read"),
                }
            }
        }
    }
}

/// What the migrate session `pid` is doing now, `pending` the migrations it applies; `current`
/// keeps which one ran at the last look and since when.
async fn activity(
    conn: &Conn<'_>,
    pid: i32,
    pending: &[MigrationInfo],
    current: &mut Option<(i32, Instant)>,
) -> Result<MigrationActivity, DbError> {
    let applied: Vec<i32> = match conn.query_one(sql::HISTORY_EXISTS, &[]).await?.try_get(0)? {
        true => conn
            .query(sql::HISTORY, &[])
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?,
        false => Vec::new(),
    };
    let running = pending
        .iter()
        .enumerate()
        .find(|(_, m)| !applied.contains(&m.version));
    let mut report = MigrationActivity {
        step: (running.map_or(pending.len(), |(i, _)| i + 1), pending.len()),
        migration: running.map(|(_, m)| m.clone()),
        ..MigrationActivity::default()
    };
    let since = match (running, *current) {
        (Some((_, m)), Some((version, since))) if version == m.version => since,
        (Some((_, m)), _) => {
            let now = Instant::now();
            *current = Some((m.version, now));
            now
        }
        (None, _) => Instant::now(),
    };
    report.running_for = since.elapsed();
    let seen = session_activity(conn, pid).await?;
    report.index_build = seen.index_build;
    report.holds = seen.holds;
    report.waits = seen.waits;
    Ok(report)
}

/// What session `pid` is doing, as `conn` (a session of the same role, or of one that sees
/// every session) sees it: its index build, the strong table locks it holds, the lock it waits
/// for ([`sql::MIGRATION_ACTIVITY`]); `migration`, `step` and `running_for` are left empty
/// (the history tells those, [`migrate_watched`]).
pub async fn session_activity(conn: &Conn<'_>, pid: i32) -> Result<MigrationActivity, DbError> {
    let Some(row) = conn.query_opt(sql::MIGRATION_ACTIVITY, &[&pid]).await? else {
        return Ok(MigrationActivity::default());
    };
    let index_build = match row.try_get::<_, Option<String>>("phase")? {
        Some(phase) => Some(IndexBuild {
            index: row.try_get("index_name")?,
            table: row.try_get("table_name")?,
            phase,
            blocks: (
                row.try_get::<_, Option<i64>>("blocks_total")?.unwrap_or(0),
                row.try_get::<_, Option<i64>>("blocks_done")?.unwrap_or(0),
            ),
            tuples: (
                row.try_get::<_, Option<i64>>("tuples_total")?.unwrap_or(0),
                row.try_get::<_, Option<i64>>("tuples_done")?.unwrap_or(0),
            ),
        }),
        None => None,
    };
    let holds = row.try_get("holds")?;
    let waits = match row.try_get::<_, Option<String>>("waits_locktype")? {
        Some(locktype) => {
            let relation: Option<String> = row.try_get("waits_relation")?;
            Some(LockWait {
                what: relation.unwrap_or(locktype),
                mode: row
                    .try_get::<_, Option<String>>("waits_mode")?
                    .unwrap_or_default(),
                blocked_by: row.try_get("blocked_by")?,
            })
        }
        None => None,
    };
    Ok(MigrationActivity {
        index_build,
        holds,
        waits,
        ..MigrationActivity::default()
    })
}

/// Compares the database's history (read on `conn`, in its schema) with the migrations embedded
/// in this binary. Read-only. With `statement_timeout` (as [`db::sql::duration_setting`]
/// renders it), each read is a transaction with that server-side bound, set transaction-local.
pub async fn status(
    conn: &Conn<'_>,
    statement_timeout: Option<&str>,
) -> Result<MigrationStatus, DbError> {
    let read = |template: &'static str| super::read(conn, statement_timeout, template, &[]);
    let exists = read(sql::HISTORY_EXISTS).await?;
    let exists: bool = match exists.first() {
        Some(row) => row.try_get(0)?,
        None => false,
    };
    let mut recorded = Vec::new();
    if exists {
        for row in read(sql::HISTORY).await? {
            let version: i32 = row.try_get(0)?;
            let name: Option<String> = row.try_get(1)?;
            let applied_on: Option<String> = row.try_get(2)?;
            let checksum: Option<String> = row.try_get(3)?;
            recorded.push((version, name.unwrap_or_default(), applied_on, checksum));
        }
    }
    let mut status = MigrationStatus::default();
    let embedded = runner();
    for m in embedded.get_migrations() {
        let known = info(m);
        match recorded.iter().find(|r| r.0 == known.version) {
            None => status.pending.push(known),
            Some((_, _, applied_on, checksum)) => {
                let info = MigrationInfo {
                    applied_on: applied_on.clone(),
                    ..known
                };
                if checksum.as_deref() == Some(m.checksum().to_string().as_str()) {
                    status.applied.push(info);
                } else {
                    status.divergent.push(info);
                }
            }
        }
    }
    for (version, name, applied_on, _) in recorded {
        if !embedded
            .get_migrations()
            .iter()
            .any(|m| m.version() == version)
        {
            status.unknown.push(MigrationInfo {
                version,
                name,
                applied_on,
            });
        }
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_history_reads_name_the_table_refinery_keeps() {
        let table = format!("{{schema}}.{HISTORY_TABLE}");
        assert!(sql::HISTORY.contains(&table), "{}", sql::HISTORY);
        assert!(
            sql::HISTORY_EXISTS.contains(&table),
            "{}",
            sql::HISTORY_EXISTS
        );
    }
}

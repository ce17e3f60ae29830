//! What `tombstoned status` reads from the configured database, in one READ ONLY snapshot: the
//! cleanup lease, the run history, the backlog, record counts (exact on a small table, else
//! estimated from the statistics, with their age), replication lag per
//! standby, the outbox backlog and the roles still holding a transitional grant of the SQL API's
//! operations — and the health verdict a monitoring check needs ([`StatusReport::stale`]).
//! Nothing here prints; `src/cli/status.rs` renders it. What a feature owns, the feature reads
//! (the lease, the history, the rows due, the outbox counts, the schema's check, the grants);
//! `status` composes them, and reads itself only what no feature does (the record counts, the
//! standbys).

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::cleanup::sql::{DRY_RUN_BEGIN as READ_ONLY_SNAPSHOT, DRY_RUN_END as END_SNAPSHOT};
use crate::cleanup::{Due, LeaseState, RecordedRun};
use crate::config::DatabaseConfig;
use crate::db::{self, Conn, DbError};
use crate::schema::{self, CheckError, Needs};

/// How many recent runs the report lists.
pub const RECENT_RUNS: i64 = 10;

/// Why the status could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The database could not be reached.
    #[error("cannot open the status session")]
    Connect(#[source] DbError),
    /// The schema is not at this binary's version (migrations pending or unknown).
    #[error("the schema is not current: {0}")]
    SchemaNotCurrent(String),
    /// The server is not one this binary works on.
    #[error(transparent)]
    UnsupportedServer(crate::schema::UnsupportedServer),
    /// A read failed.
    #[error("cannot read the status ({step})")]
    Read {
        /// What was being read.
        step: &'static str,
        /// The database error.
        #[source]
        source: DbError,
    },
}

fn read_error(step: &'static str) -> impl FnOnce(tokio_postgres::Error) -> StatusError {
    move |e| StatusError::Read {
        step,
        source: DbError::Query(e),
    }
}

/// Rows due now and the oldest of them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Backlog {
    /// Live records whose replay deadline has passed (exact count, through the due index).
    pub due_rows: i64,
    /// The earliest replay deadline among them.
    pub oldest_due_deadline: Option<DateTime<Utc>>,
    /// How long ago that was, in seconds.
    pub oldest_due_age_seconds: Option<f64>,
}

/// Below this many pages (8 KiB each: 32 MiB, some 45 000 live records or 140 000 tombstones at
/// BENCHMARKS.md's scenario 5 sizes) `status` counts the records; above, it estimates them.
///
/// Why a size, and that one: counting is `Aggregate -> Seq Scan` over the whole heap
/// ([`sql::COUNT_RECORDS`]; there is no index on `expired` to count tombstones through, and the
/// due index alone would still read an entry per live record), so its cost is the table's pages —
/// on 50 M records (BENCHMARKS.md's scenario 7) tens of GiB read by a command an operator or a
/// monitoring check runs at will. The estimate costs a few catalogue rows whatever the table
/// holds, but on a small table it is wrong in the way that matters most: statistics taken on
/// the empty table (migration V5 ends with an ANALYZE) say 0 while rows exist, until autovacuum
/// analyses it again — after 50 + 10 % of its rows have changed. The size that decides is
/// `pg_relation_size`, the heap file's length now (no row read; not the statistics, which may
/// be as old as the error they would hide). Measured here: a heap of 1385 pages (11 MB, 18 000
/// records) counted in 1.6 ms from shared buffers (`EXPLAIN (ANALYZE, BUFFERS)`, PostgreSQL 15).
pub const COUNT_BELOW_PAGES: i64 = 4096;

/// How [`RecordCounts`] were made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CountMethod {
    /// Counted in the snapshot: exact (the table is below [`COUNT_BELOW_PAGES`]).
    Counted,
    /// Estimated from the statistics (`reltuples` of the table and of its due index) as of
    /// `statistics_at`.
    Statistics,
}

/// Live records and tombstones: counted when the table is small ([`COUNT_BELOW_PAGES`]), else
/// estimated from the table's and its due index's statistics (`reltuples`, as of the last VACUUM
/// or ANALYZE), since counting them would read the whole table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordCounts {
    /// Live records: counted, or the entries of `idempotency_records_due_idx` (`WHERE NOT
    /// expired`); `None`: estimated, and the table was never analysed (nor vacuumed).
    pub live_estimate: Option<i64>,
    /// Tombstones: counted, or the table's rows less the live ones (`idempotency_records_purge_idx`
    /// is a BRIN index since V5 and counts no rows); `None`: estimated, never analysed.
    pub tombstones_estimate: Option<i64>,
    /// Counted or estimated.
    pub method: CountMethod,
    /// When the statistics an estimate comes from were taken (the last VACUUM or ANALYZE, by
    /// hand or by autovacuum); `None` when counted, or never taken.
    pub statistics_at: Option<DateTime<Utc>>,
    /// The table's heap, in pages of 8 KiB (`pg_relation_size`), when read.
    pub table_pages: i64,
}

/// One standby as `pg_stat_replication` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Standby {
    /// Its `application_name`.
    pub application_name: String,
    /// Its address (`None`: a Unix socket).
    pub client_addr: Option<String>,
    /// `streaming`, `catchup`, ...
    pub state: Option<String>,
    /// `async`, `sync`, `quorum`, `potential`.
    pub sync_state: Option<String>,
    /// `replay_lag` in seconds (`None`: idle standby, nothing to replay).
    pub replay_lag_seconds: Option<f64>,
}

/// Replication as far as this role may see it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replication {
    /// Whether this role sees the details of `pg_stat_replication` (superuser, or a member of
    /// `pg_read_all_stats`, e.g. through `pg_monitor`).
    pub visible: bool,
    /// The standbys (empty when not visible).
    pub standbys: Vec<Standby>,
}

/// The outbox backlog, as the relay's own reader counts it ([`crate::outbox::inspect::counts`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxBacklog {
    /// Events neither delivered nor dead letters.
    pub pending: i64,
    /// When the oldest pending event was created.
    pub oldest_pending_created_at: Option<DateTime<Utc>>,
    /// Dead letters (`tombstoned outbox requeue` puts them back).
    pub dead_letters: i64,
}

/// Everything `tombstoned status` shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatusReport {
    /// The configured schema.
    pub schema: String,
    /// Its SQL API version (`api_version()`, [`crate::schema::api`]); `None` when this role may not
    /// call it.
    pub api_version: Option<i32>,
    /// The database clock when the snapshot was taken; every age is relative to it.
    pub read_at: DateTime<Utc>,
    /// The cleanup lease (`None`: never taken).
    pub lease: Option<LeaseState>,
    /// The newest run that ended `success` or `partial`.
    pub last_success: Option<RecordedRun>,
    /// Seconds since `last_success` finished.
    pub last_success_age_seconds: Option<f64>,
    /// The newest runs, newest first (at most [`RECENT_RUNS`]).
    pub recent_runs: Vec<RecordedRun>,
    /// Rows due now.
    pub backlog: Backlog,
    /// Record counts: exact on a small table, else estimated.
    pub records: RecordCounts,
    /// Standbys and their lag.
    pub replication: Replication,
    /// The outbox backlog. Always there: `status` reads only a current schema, which has the
    /// relay's columns (an `Option` so the JSON keeps the shape it had when they could be
    /// missing).
    pub outbox: Option<OutboxBacklog>,
    /// The roles still holding the transitional grant of every operation but `create-order`
    /// (from the upgrade to V8; [`crate::operations`]); `None` when this role may not read the
    /// grants.
    pub transitional_grants: Option<Vec<String>>,
}

impl StatusReport {
    /// `Some(reason)` when the last successful run is older than `max_age`, or none is
    /// recorded: the condition `tombstoned status --max-age` exits 2 for.
    pub fn stale(&self, max_age: Duration) -> Option<String> {
        let Some(age) = self.last_success_age_seconds else {
            return Some("no successful cleanup run is recorded".to_owned());
        };
        let age = Duration::from_secs_f64(age.max(0.0));
        (age > max_age).then(|| {
            format!(
                "the last successful cleanup run finished {} ago, more than {}",
                humantime::format_duration(Duration::from_secs(age.as_secs())),
                humantime::format_duration(max_age)
            )
        })
    }
}

/// The statements `status` reads with (schema-qualified ones through [`Conn`], which renders
/// `{schema}`).
mod sql {
    /// The records table's heap in pages now (the file's length: no row read), and its
    /// statistics: the due index's `reltuples` (live records) and the table's less those
    /// (tombstones; the purge index is BRIN since V5, whose `reltuples` counts block ranges);
    /// whether it was ever analysed or vacuumed (an index built on the empty table says 0, not -1,
    /// until then: never analysed is the table's `reltuples` at -1, PostgreSQL 14 on, or no pages
    /// recorded and no VACUUM or ANALYZE in its statistics); and when they were last taken.
    pub(super) const RECORD_STATISTICS: &str = "\
SELECT pg_relation_size(t.oid) / current_setting('block_size')::bigint,
       d.reltuples::bigint,
       greatest(t.reltuples - d.reltuples, 0)::bigint,
       t.reltuples >= 0
       AND NOT (t.relpages = 0
                AND coalesce(s.last_vacuum, s.last_autovacuum,
                             s.last_analyze, s.last_autoanalyze) IS NULL),
       greatest(s.last_vacuum, s.last_autovacuum, s.last_analyze, s.last_autoanalyze)
FROM pg_class t
JOIN pg_namespace n ON n.oid = t.relnamespace
JOIN pg_class d ON d.relnamespace = n.oid AND d.relname = 'idempotency_records_due_idx'
LEFT JOIN pg_stat_all_tables s ON s.relid = t.oid
WHERE n.nspname = $1 AND t.relname = 'idempotency_records'";

    /// Live records and tombstones, counted: one sequential scan of the heap (see
    /// `COUNT_BELOW_PAGES` for when it runs).
    pub(super) const COUNT_RECORDS: &str = "\
SELECT count(*) FILTER (WHERE NOT expired), count(*) FILTER (WHERE expired)
FROM {schema}.idempotency_records";

    pub(super) const REPLICATION_VISIBLE: &str = "\
SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')
FROM pg_roles WHERE rolname = current_user";

    pub(super) const STANDBYS: &str = "\
SELECT coalesce(application_name, ''), client_addr::text, state, sync_state,
       extract(epoch FROM replay_lag)::float8
FROM pg_stat_replication
ORDER BY application_name, client_addr";
}

impl RecordCounts {
    /// The table's size and statistics; then, below `count_below_pages`, the counts themselves.
    async fn read(
        client: &Conn<'_>,
        schema: &str,
        count_below_pages: i64,
    ) -> Result<Self, StatusError> {
        let get = || read_error("the record statistics");
        let row = client
            .query_one(sql::RECORD_STATISTICS, &[&schema])
            .await
            .map_err(get())?;
        let table_pages: i64 = row.try_get(0).map_err(get())?;
        if table_pages < count_below_pages {
            let get = || read_error("the record counts");
            let counted = client
                .query_one(sql::COUNT_RECORDS, &[])
                .await
                .map_err(get())?;
            return Ok(RecordCounts {
                live_estimate: Some(counted.try_get(0).map_err(get())?),
                tombstones_estimate: Some(counted.try_get(1).map_err(get())?),
                method: CountMethod::Counted,
                statistics_at: None,
                table_pages,
            });
        }
        let live: i64 = row.try_get(1).map_err(get())?;
        let tombstones: i64 = row.try_get(2).map_err(get())?;
        let analysed: Option<bool> = row.try_get(3).map_err(get())?;
        // -1, or a table never vacuumed or analysed: unknown.
        let known = |n: i64| (n >= 0 && analysed == Some(true)).then_some(n);
        Ok(RecordCounts {
            live_estimate: known(live),
            tombstones_estimate: known(tombstones),
            method: CountMethod::Statistics,
            statistics_at: row.try_get(4).map_err(get())?,
            table_pages,
        })
    }
}

fn age_seconds(now: DateTime<Utc>, then: DateTime<Utc>) -> f64 {
    (now - then).num_milliseconds() as f64 / 1000.0
}

/// Reads the status of `db`'s schema in one READ ONLY, REPEATABLE READ transaction (one
/// snapshot: the figures agree with each other). Changes nothing, takes no lock beyond the
/// snapshot's. Counts the records below [`COUNT_BELOW_PAGES`].
pub async fn read(db: &DatabaseConfig) -> Result<StatusReport, StatusError> {
    read_counting_below(db, COUNT_BELOW_PAGES).await
}

/// [`read`], counting the records when their table has fewer than `count_below_pages` pages (the
/// tests lower it to see both ways on a few rows).
pub async fn read_counting_below(
    db: &DatabaseConfig,
    count_below_pages: i64,
) -> Result<StatusReport, StatusError> {
    let session = db::connect(db, "status")
        .await
        .map_err(StatusError::Connect)?;
    let conn = session.conn();
    // Outside the snapshot: a role that may not call api_version() (42501) must not abort it.
    let current =
        schema::check(&conn, Needs::STATUS, None)
            .await
            .map_err(|failed| match failed {
                CheckError::NotCurrent(not_current) => StatusError::SchemaNotCurrent(not_current.0),
                CheckError::Unsupported(server) => StatusError::UnsupportedServer(server),
                CheckError::Db(source) => StatusError::Read {
                    step: "the schema",
                    source,
                },
            })?;
    // Simple-protocol BEGIN/ROLLBACK (nothing kept on the session, fine through any pooler).
    session
        .client
        .batch_execute(READ_ONLY_SNAPSHOT)
        .await
        .map_err(read_error("starting a read-only transaction"))?;
    let report = read_in(&conn, &db.schema, current.api_version, count_below_pages).await?;
    session
        .client
        .batch_execute(END_SNAPSHOT)
        .await
        .map_err(read_error("ending the read-only transaction"))?;
    Ok(report)
}

async fn read_in(
    client: &Conn<'_>,
    schema: &str,
    api_version: Option<i32>,
    count_below_pages: i64,
) -> Result<StatusReport, StatusError> {
    let due = Due::read(client).await.map_err(read_error("the backlog"))?;
    let read_at = due.at;
    let backlog = Backlog {
        due_rows: i64::try_from(due.rows).unwrap_or(i64::MAX),
        oldest_due_deadline: due.oldest_deadline,
        oldest_due_age_seconds: due.oldest_deadline.map(|t| age_seconds(read_at, t)),
    };

    let lease = LeaseState::read(client)
        .await
        .map_err(read_error("the cleanup lease"))?;
    let recent_runs = RecordedRun::recent(client, RECENT_RUNS)
        .await
        .map_err(read_error("the run history"))?;
    let last_success = RecordedRun::last_successful(client)
        .await
        .map_err(read_error("the run history"))?;
    let last_success_age_seconds = last_success
        .as_ref()
        .map(|r| age_seconds(read_at, r.finished_at));

    let records = RecordCounts::read(client, schema, count_below_pages).await?;

    let visible: bool = client
        .query_opt(sql::REPLICATION_VISIBLE, &[])
        .await
        .map_err(read_error("the replication view"))?
        .map(|r| r.try_get::<_, Option<bool>>(0))
        .transpose()
        .map_err(read_error("the replication view"))?
        .flatten()
        .unwrap_or(false);
    let mut standbys = Vec::new();
    if visible {
        for row in client
            .query(sql::STANDBYS, &[])
            .await
            .map_err(read_error("the replication view"))?
        {
            let get = |e| read_error("the replication view")(e);
            standbys.push(Standby {
                application_name: row.try_get(0).map_err(get)?,
                client_addr: row.try_get(1).map_err(get)?,
                state: row.try_get(2).map_err(get)?,
                sync_state: row.try_get(3).map_err(get)?,
                replay_lag_seconds: row.try_get(4).map_err(get)?,
            });
        }
    }

    let outbox = crate::outbox::inspect::counts(client)
        .await
        .map_err(read_error("the outbox backlog"))?;
    let outbox = OutboxBacklog {
        pending: i64::try_from(outbox.pending).unwrap_or(i64::MAX),
        oldest_pending_created_at: outbox.oldest_pending_created_at,
        dead_letters: i64::try_from(outbox.dead_letters).unwrap_or(i64::MAX),
    };

    let transitional_grants = match crate::operations::transitional(client)
        .await
        .map_err(read_error("the operation grants"))?
    {
        crate::operations::Transitional::Roles(roles) => Some(roles),
        crate::operations::Transitional::NotInstalled
        | crate::operations::Transitional::NotVisible => None,
    };

    Ok(StatusReport {
        schema: schema.to_owned(),
        api_version,
        read_at,
        lease,
        last_success,
        last_success_age_seconds,
        recent_runs,
        backlog,
        records,
        replication: Replication { visible, standbys },
        outbox: Some(outbox),
        transitional_grants,
    })
}

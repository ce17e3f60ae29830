//! `tombstoned cleanup --dry-run`: what a run started now would do, read inside one READ ONLY
//! transaction (REPEATABLE READ, so every figure comes from the same snapshot). Changes nothing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::run::purge_before;
use super::throttle::ReplicaLag;
use super::{report, sql, CleanupError};
use crate::config::{CleanupConfig, DatabaseConfig, OnLocked, RetentionConfig};
use crate::db::{self, Conn};
use crate::outbox::{inspect, OutboxCounts};

/// The records due now: what a run started now would tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// The database clock (the transaction's start): a run's cutoff, were it starting now.
    pub at: DateTime<Utc>,
    /// Live records whose replay deadline is at or before it (exact, through the due index).
    pub rows: u64,
    /// The earliest replay deadline among them.
    pub oldest_deadline: Option<DateTime<Utc>>,
}

impl Due {
    /// Reads the records due at the database clock of `client`'s transaction (`now()`), as the
    /// dry run and `tombstoned status` show them.
    pub async fn read(client: &Conn<'_>) -> Result<Due, tokio_postgres::Error> {
        let at: DateTime<Utc> = client.query_one(sql::CUTOFF, &[]).await?.try_get(0)?;
        let due = client.query_one(sql::DUE_AT, &[&at]).await?;
        Ok(Due {
            at,
            rows: count(due.try_get(0)?),
            oldest_deadline: due.try_get(1)?,
        })
    }
}

/// Rows due for one tenant or operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DueCount {
    /// The tenant id or operation name.
    pub name: String,
    /// Rows due at the cutoff.
    pub rows_due: u64,
}

/// What the retention purge would delete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgePreview {
    /// Tombstones that expired at or before this instant are candidates.
    pub purge_before: DateTime<Utc>,
    /// How many there are.
    pub tombstones_to_purge: u64,
}

/// The outbox as the dry run saw it, and what outbox retention would delete.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxPreview {
    /// Events neither delivered nor dead letters, dead letters, and the oldest pending event.
    #[serde(flatten)]
    pub counts: OutboxCounts,
    /// Delivered events still stored.
    pub delivered: u64,
    /// Events delivered at or before this instant are retention candidates (`None`:
    /// `retention.outbox_keep_delivered` is off, or no retention settings were given).
    pub delete_before: Option<DateTime<Utc>>,
    /// How many there are (dead letters and undelivered events never are).
    pub events_to_delete: Option<u64>,
}

/// The standbys as the dry run saw them, and the throttle settings a real run would keep to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicaPreview {
    /// `cleanup.max_replica_lag` in bytes (`None`: off).
    pub max_replica_lag_bytes: Option<u64>,
    /// `cleanup.max_rows_per_second` (`None`: off).
    pub max_rows_per_second: Option<u32>,
    /// Whether this role sees the replay positions, the role, and every walsender's lag.
    #[serde(flatten)]
    pub lag: ReplicaLag,
    /// Whether a run started now would wait for a standby before its first batch.
    pub would_wait: bool,
}

/// One worker's share of a run started now (`cleanup.workers`): its slice of the due deadlines
/// and the rows due in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerSlice {
    /// First deadline of the slice, inclusive (`None`: from the beginning).
    pub from: Option<DateTime<Utc>>,
    /// Last deadline of the slice, inclusive.
    pub to: DateTime<Utc>,
    /// Rows due in it.
    pub rows_due: u64,
}

/// What a dry run found. Durations serialise as seconds.
#[derive(Debug, Clone, Serialize)]
pub struct DryRunReport {
    /// The database clock at the dry run; a real run started right after uses its own.
    pub cutoff: DateTime<Utc>,
    /// Rows due at the cutoff: what a real run would tombstone.
    pub rows_due: u64,
    /// `cleanup.batch_size`.
    pub batch_size: u32,
    /// Batches a real run would take (`ceil(rows_due / batch_size)`).
    pub batches_needed: u64,
    /// The oldest due deadline.
    pub oldest_due_deadline: Option<DateTime<Utc>>,
    /// How far past its deadline that row is.
    #[serde(
        rename = "oldest_due_overdue_seconds",
        serialize_with = "report::optional_seconds"
    )]
    pub oldest_due_overdue: Option<Duration>,
    /// The tenants with the most rows due (at most 10).
    pub top_tenants: Vec<DueCount>,
    /// The operations with the most rows due (at most 10).
    pub top_operations: Vec<DueCount>,
    /// `cleanup.workers`.
    pub workers: u32,
    /// How a run started now would split the due rows between its workers (one slice per
    /// worker that would run: fewer than `workers` when few rows are due or many share one
    /// deadline).
    pub worker_slices: Vec<WorkerSlice>,
    /// Tombstones in total.
    pub tombstones: u64,
    /// Records not yet expired (due or not).
    pub live_records: u64,
    /// The retention purge's candidates, when purge is configured.
    pub purge: Option<PurgePreview>,
    /// The outbox: pending events, dead letters, delivered events and retention candidates.
    pub outbox: OutboxPreview,
    /// The standbys' replay lag (`pg_stat_replication`) and the throttle settings.
    pub replicas: ReplicaPreview,
    /// `EXPLAIN` of the batch statement for the first batch (with `--explain`).
    pub plan: Option<String>,
}

/// Reports what a cleanup run started now would do, without purge figures.
pub async fn dry_run(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
    explain: bool,
) -> Result<DryRunReport, CleanupError> {
    dry_run_with_purge(db, cleanup, None, explain).await
}

/// At most how many statements a dry run's read sends (settings, cutoff, counts, tops, totals,
/// purge and outbox previews, the replica lag, the plans with `--explain`, the workers' split and
/// one count per worker): its client-side bound is that many `cleanup.statement_timeout`s.
const DRY_RUN_STATEMENTS: u32 = 17 + crate::config::MAX_CLEANUP_WORKERS;

/// [`dry_run`], plus what the retention purge would delete when `retention` configures it.
#[tracing::instrument(skip_all, fields(schema = %db.schema))]
pub async fn dry_run_with_purge(
    db: &DatabaseConfig,
    cleanup: &CleanupConfig,
    retention: Option<&RetentionConfig>,
    explain: bool,
) -> Result<DryRunReport, CleanupError> {
    let session = db::connect(db, "cleanup-dry-run")
        .await
        .map_err(CleanupError::Connect)?;
    // Simple-protocol BEGIN/ROLLBACK: no statement kept on the session. If a read fails, the
    // session is dropped with the transaction open, which ends it.
    let bound = cleanup.statement_timeout;
    super::bounded(
        bound,
        "starting the dry run",
        session.client.batch_execute(sql::DRY_RUN_BEGIN),
    )
    .await?;
    // Every statement of the read is bounded by statement_timeout on the server; the client
    // bounds the whole read by that many of them, so a silent database fails it.
    let report = super::bounded(
        bound.saturating_mul(DRY_RUN_STATEMENTS),
        "running the dry run",
        Box::pin(read(&session.conn(), cleanup, retention, explain)),
    )
    .await?;
    // Nothing was written; rolling back says so.
    super::bounded(
        bound,
        "ending the dry run",
        session.client.batch_execute(sql::DRY_RUN_END),
    )
    .await?;
    Ok(report)
}

async fn read(
    client: &Conn<'_>,
    cleanup: &CleanupConfig,
    retention: Option<&RetentionConfig>,
    explain: bool,
) -> Result<DryRunReport, tokio_postgres::Error> {
    let timeout = db::sql::duration_setting(cleanup.statement_timeout);
    let lock_timeout = db::sql::duration_setting(cleanup.lock_timeout);
    // The batch transaction's settings, so the plan shown is the plan a batch gets.
    client
        .query_one(sql::BATCH_SETTINGS, &[&lock_timeout, &timeout])
        .await?;
    let Due {
        at: cutoff,
        rows: rows_due,
        oldest_deadline: oldest_due_deadline,
    } = Due::read(client).await?;
    let worker_slices = if cleanup.workers > 1 {
        let mut slices = Vec::new();
        for range in super::workers::split_due_in(client, cleanup.workers, cutoff).await? {
            let row = client
                .query_one(sql::DUE_IN_RANGE, &[&range.from, &range.to])
                .await?;
            slices.push(WorkerSlice {
                from: range.from,
                to: range.to,
                rows_due: count(row.try_get(0)?),
            });
        }
        slices
    } else {
        vec![WorkerSlice {
            from: None,
            to: cutoff,
            rows_due,
        }]
    };
    let top_tenants = top(client, sql::DRY_RUN_TOP_TENANTS, cutoff).await?;
    let top_operations = top(client, sql::DRY_RUN_TOP_OPERATIONS, cutoff).await?;
    let totals = client.query_one(sql::DRY_RUN_TOTALS, &[]).await?;

    let purge = match retention.and_then(|r| r.purge_tombstones_after) {
        Some(after) => match purge_before(cutoff, after) {
            Some(purge_before) => {
                let n: i64 = client
                    .query_one(sql::DRY_RUN_PURGEABLE, &[&purge_before])
                    .await?
                    .try_get(0)?;
                Some(PurgePreview {
                    purge_before,
                    tombstones_to_purge: count(n),
                })
            }
            None => None,
        },
        None => None,
    };

    let keep_delivered = retention.and_then(|r| r.outbox_keep_delivered);
    let delete_before = keep_delivered.and_then(|keep| purge_before(cutoff, keep));
    let events_to_delete = match delete_before {
        Some(before) => Some(count(
            client
                .query_one(sql::DRY_RUN_OUTBOX_DELETABLE, &[&before])
                .await?
                .try_get(0)?,
        )),
        None => None,
    };
    let outbox = OutboxPreview {
        counts: inspect::counts(client).await?,
        delivered: count(
            client
                .query_one(sql::DRY_RUN_OUTBOX_DELIVERED, &[])
                .await?
                .try_get(0)?,
        ),
        delete_before,
        events_to_delete,
    };

    let lag = ReplicaLag::from_rows(&client.query(sql::REPLICA_LAG, &[]).await?)?;
    let replicas = ReplicaPreview {
        max_replica_lag_bytes: cleanup.max_replica_lag,
        max_rows_per_second: cleanup.max_rows_per_second,
        would_wait: cleanup
            .max_replica_lag
            .is_some_and(|limit| lag.over(limit).is_some()),
        lag,
    };

    let plan = if explain {
        // Plain EXPLAIN: it plans without executing, which a READ ONLY transaction allows.
        let statement = match cleanup.on_locked {
            OnLocked::Wait => sql::TOMBSTONE_BATCH,
            OnLocked::Skip => sql::TOMBSTONE_BATCH_SKIP_LOCKED,
        };
        let no_cursor: Option<DateTime<Utc>> = None;
        let limit = i64::from(cleanup.batch_size);
        let explain = format!("EXPLAIN {}", client.text(statement));
        let lines = client
            .query_rendered(&explain, &[&cutoff, &no_cursor, &cutoff, &limit])
            .await?;
        let mut text = String::new();
        for line in lines {
            text.push_str(line.try_get::<_, &str>(0)?);
            text.push('\n');
        }
        Some(text)
    } else {
        None
    };

    let batch = u64::from(cleanup.batch_size.max(1));
    Ok(DryRunReport {
        cutoff,
        rows_due,
        batch_size: cleanup.batch_size,
        batches_needed: rows_due.div_ceil(batch),
        oldest_due_deadline,
        oldest_due_overdue: oldest_due_deadline.and_then(|d| (cutoff - d).to_std().ok()),
        top_tenants,
        top_operations,
        workers: cleanup.workers,
        worker_slices,
        tombstones: count(totals.try_get(0)?),
        live_records: count(totals.try_get(1)?),
        purge,
        outbox,
        replicas,
        plan,
    })
}

async fn top(
    client: &Conn<'_>,
    statement: &'static str,
    cutoff: DateTime<Utc>,
) -> Result<Vec<DueCount>, tokio_postgres::Error> {
    client
        .query(statement, &[&cutoff])
        .await?
        .iter()
        .map(|row| {
            Ok(DueCount {
                name: row.try_get(0)?,
                rows_due: count(row.try_get(1)?),
            })
        })
        .collect()
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

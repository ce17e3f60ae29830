//! Parallel cleanup (`cleanup.workers`, issue 13 target 3) against a real PostgreSQL: four
//! workers next to replay readers holding `FOR SHARE` locks in several workers' slices wait for
//! them side by side, never deadlock, tombstone every due row exactly once, and leave the table
//! exactly as one worker does; the report, the metrics and the lease cover the whole run.

use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::{self, LeasedRun, RunLimits, RunReport, StopReason};
use tombstoned::config::Config;
use tombstoned::metrics::Metrics;

use crate::cleanup_support::*;
use crate::harness::TestDb;

/// Batches of 10, and lock waits long enough that only the test decides when they end.
const PATIENT: &[(&str, &str)] = &[
    ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
    ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s"),
    ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s"),
];

const DUE_ROWS: i64 = 400;

/// The due rows (by deadline) the replay readers hold: one in each quarter, so one in each of
/// four workers' slices.
const HELD: [i64; 4] = [50, 150, 250, 350];

async fn seed(db: &TestDb) -> Client {
    let client = db.client().await;
    seed_live(&client, "due", DUE_ROWS, DUE).await;
    seed_live(&client, "later", 100, NOT_DUE).await;
    client
}

async fn deadlocks(observer: &Client) -> i64 {
    observer
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    observer
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn tombstones(observer: &Client) -> i64 {
    observer
        .query_one(
            "SELECT count(*) FROM idempotency_records WHERE expired",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

async fn leased(config: &Config, metrics: Option<&Metrics>) -> LeasedRun {
    leased_run(config, metrics).await.expect("cleanup run")
}

/// One worker with the same readers, released one at a time as the cleaner reaches each: the
/// reference the four workers are compared with.
async fn one_worker_reference(on_locked: &str) -> (RunReport, String) {
    let db = TestDb::new().await;
    let observer = seed(&db).await;
    let mut readers = Vec::new();
    for n in HELD {
        let pk = nth_live(&observer, n).await;
        readers.push(Reader::lock(&db, &pk, "FOR SHARE").await.0);
    }
    let mut env = PATIENT.to_vec();
    env.push(("TOMBSTONED_CLEANUP__ON_LOCKED", on_locked));
    let config = db.config_with(&env);
    let cleaner = tokio::spawn(async move { run(&config).await });
    if on_locked == "wait" {
        for reader in readers.drain(..) {
            wait_until_cleaner_waits(&observer).await;
            reader.commit().await;
        }
    }
    let report = cleaner.await.unwrap();
    for reader in readers {
        reader.commit().await;
    }
    (report, checksum_without_expiry_time(&observer).await)
}

#[tokio::test]
async fn four_workers_wait_for_replays_side_by_side_never_deadlock_and_match_one_worker() {
    let db = TestDb::new().await;
    let observer = seed(&db).await;
    let deadlocks_before = deadlocks(&observer).await;
    let mut readers = Vec::new();
    for n in HELD {
        let pk = nth_live(&observer, n).await;
        let (reader, body) = Reader::lock(&db, &pk, "FOR SHARE").await;
        assert!(body.is_some(), "the replay reads the full body");
        readers.push((reader, pk));
    }
    let mut env = PATIENT.to_vec();
    env.push(("TOMBSTONED_CLEANUP__WORKERS", "4"));
    let config = db.config_with(&env);
    let metrics = std::sync::Arc::new(Metrics::new().unwrap());
    let cleaner = {
        let (config, metrics) = (config.clone(), metrics.clone());
        tokio::spawn(async move { leased(&config, Some(&metrics)).await })
    };

    // All four workers wait at once, each on the row held in its own slice: they run side by
    // side, on sessions of their own, and none waits for another.
    wait_until_sessions_wait(&observer, "tombstoned/cleanup", 4).await;
    assert_eq!(
        sessions(&observer, "tombstoned/cleanup").await,
        5,
        "the run's own session and one per worker"
    );
    // The lease is held once, by this run; another run is turned away.
    let state = lease_state(&observer).await.expect("lease row");
    assert!(state.held, "{state:?}");
    assert!(matches!(leased(&config, None).await, LeasedRun::Skipped(_)));
    let lease_rows: i64 = observer
        .query_one("SELECT count(*) FROM tombstoned.cleanup_lease", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(lease_rows, 1);
    // Every row but the four held ones (and the rows behind them in their slices) may be done;
    // none of the held ones is.
    for (reader, pk) in &readers {
        assert!(!is_tombstone(&reader.client, pk).await);
    }
    for (reader, _) in readers.drain(..) {
        reader.commit().await;
    }

    let LeasedRun::Ran(report) = cleaner.await.unwrap() else {
        panic!("the run was skipped");
    };
    assert_eq!(report.workers, 4);
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert_eq!(report.rows_tombstoned, DUE_ROWS as u64);
    assert_eq!(report.lock_timeouts, 0);
    assert_eq!(report.rows_skipped, 0);
    assert_eq!(report.backlog_rows, 0);
    assert_eq!(report.retries, 0, "no deadlock (40P01) was retried");
    // Every due row tombstoned exactly once: the workers' counts add up to the tombstones
    // there are, and the rows not due were left alone.
    assert_eq!(tombstones(&observer).await, DUE_ROWS);
    assert_eq!(counts(&observer).await, (DUE_ROWS, 100));
    // Four slices of 100 in batches of 10.
    assert_eq!(report.batches, 40);
    assert_eq!(deadlocks(&observer).await - deadlocks_before, 0);

    // The metrics count every worker's batches and rows: each worker's pass ends with one
    // empty batch.
    assert_eq!(metrics.cleanup_rows_tombstoned.get(), DUE_ROWS as u64);
    let committed = metrics
        .cleanup_batches
        .with_label_values(&["committed"])
        .get();
    assert_eq!(committed, report.batches + 4);
    assert_eq!(metrics.cleanup_batch_duration.get_sample_count(), committed);
    assert_eq!(
        metrics.cleanup_runs.with_label_values(&["success"]).get(),
        1
    );
    assert_eq!(metrics.cleanup_lease_held.get(), 0);
    assert_lease_free(&observer).await;
    wait_until_gone(&observer, "tombstoned/cleanup").await;

    // The same table, the same readers, one worker: the same result, byte for byte but the
    // tombstoning time.
    let (one, one_checksum) = one_worker_reference("wait").await;
    assert_eq!(one.workers, 1);
    assert_eq!(
        (one.rows_tombstoned, one.lock_timeouts, one.rows_skipped),
        (
            report.rows_tombstoned,
            report.lock_timeouts,
            report.rows_skipped
        )
    );
    assert_eq!(checksum_without_expiry_time(&observer).await, one_checksum);
}

#[tokio::test]
async fn four_workers_in_skip_mode_pass_over_held_rows_as_one_worker_does() {
    let db = TestDb::new().await;
    let observer = seed(&db).await;
    let mut readers = Vec::new();
    for n in HELD {
        let pk = nth_live(&observer, n).await;
        readers.push(Reader::lock(&db, &pk, "FOR SHARE").await.0);
    }
    let mut env = PATIENT.to_vec();
    env.push(("TOMBSTONED_CLEANUP__WORKERS", "4"));
    env.push(("TOMBSTONED_CLEANUP__ON_LOCKED", "skip"));
    let report = run(&db.config_with(&env)).await;
    for reader in readers {
        reader.commit().await;
    }
    assert_eq!(report.workers, 4);
    assert_eq!(report.rows_tombstoned, DUE_ROWS as u64 - 4);
    assert_eq!(report.rows_skipped, 4);
    assert_eq!(report.backlog_rows, 4);
    assert_eq!(report.lock_timeouts, 0);

    let (one, one_checksum) = one_worker_reference("skip").await;
    assert_eq!(
        (one.rows_tombstoned, one.rows_skipped, one.backlog_rows),
        (
            report.rows_tombstoned,
            report.rows_skipped,
            report.backlog_rows
        )
    );
    assert_eq!(checksum_without_expiry_time(&observer).await, one_checksum);
}

#[tokio::test]
async fn the_dry_run_says_how_the_workers_would_split_the_due_rows() {
    let db = TestDb::new().await;
    let observer = seed(&db).await;
    let config = db.config_with(&[("TOMBSTONED_CLEANUP__WORKERS", "4")]);
    let dry = cleanup::dry_run(&config.database, &config.cleanup, false)
        .await
        .unwrap();
    assert_eq!(dry.workers, 4);
    let split: Vec<u64> = dry.worker_slices.iter().map(|w| w.rows_due).collect();
    assert_eq!(split, vec![100, 100, 100, 100]);
    assert_eq!(
        counts(&observer).await,
        (0, DUE_ROWS + 100),
        "nothing changed"
    );
}

#[tokio::test]
async fn a_stop_reaches_every_worker_and_max_batches_counts_them_all() {
    let db = TestDb::new().await;
    seed(&db).await;
    let mut env = PATIENT.to_vec();
    env.push(("TOMBSTONED_CLEANUP__WORKERS", "4"));
    let config = db.config_with(&env);
    let report = run_with(
        &config,
        RunLimits {
            max_batches: Some(6),
        },
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(report.stopped_by, StopReason::MaxBatches);
    // Each worker checks the shared count before its next batch: at most one batch in flight
    // per worker past the limit.
    assert!(
        (6..=6 + 3).contains(&report.batches),
        "{} batches",
        report.batches
    );
    assert_eq!(
        report.rows_tombstoned + report.backlog_rows,
        DUE_ROWS as u64
    );
}

#[tokio::test]
async fn the_rate_cap_holds_for_the_whole_run_and_the_run_renews_the_lease_while_workers_work() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "slow", 60, DUE).await;
    // The lease lasts 2 x 2s + 30s = 34s and is renewed every ~11.3s; the cap makes the run
    // last at least (60 - 5) / 4 = 13.75 s, whatever the number of workers.
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__WORKERS", "2"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "5"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "1s"),
        ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "2s"),
        ("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "4"),
    ]);
    let cleaner = {
        let config = config.clone();
        tokio::spawn(async move { leased(&config, None).await })
    };
    // The run's own session takes the lease and renews it while the workers work.
    let deadline = std::time::Instant::now() + 2 * BARRIER;
    let taken = loop {
        if let Some(state) = lease_state(&observer).await.filter(|s| s.held) {
            break state;
        }
        assert!(std::time::Instant::now() < deadline, "lease never taken");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let renewed = loop {
        let state = lease_state(&observer).await.expect("lease row");
        if state.renewed_at > taken.renewed_at {
            break state;
        }
        assert!(
            state.held,
            "the run ended before renewing its lease: {state:?}"
        );
        assert!(std::time::Instant::now() < deadline, "lease never renewed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(renewed.holder, taken.holder);
    assert_eq!(
        renewed.holder_pid, taken.holder_pid,
        "renewed from the run's session, not a worker's"
    );
    let LeasedRun::Ran(report) = cleaner.await.unwrap() else {
        panic!("the run was skipped");
    };
    assert_eq!(report.workers, 2);
    assert_eq!(report.rows_tombstoned, 60);
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert!(
        report.duration >= std::time::Duration::from_secs_f64(13.75),
        "two workers kept to the run's cap together: {:?}",
        report.duration
    );
    assert!(report.throttled_rate > std::time::Duration::ZERO);
    assert_lease_free(&observer).await;
}

//! The cleanup engine against a real PostgreSQL, with real concurrent sessions: the ten cases of
//! issue 3 (the scheduler's are in `scheduler.rs`), plus batch cost, plan shape, skip mode, the
//! isolation of a held row, limits, shutdown and connection loss.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::{self, sql, RunLimits, RunOutcome, StopReason};
use tombstoned::db::sql::qualify;
use tombstoned::metrics::Metrics;

use crate::cleanup_support::*;
use crate::harness::{binary, TestDb};

/// Batches of 10, and lock waits long enough that only the test decides when they end.
const PATIENT: &[(&str, &str)] = &[
    ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
    ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s"),
    ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s"),
];

/// Issue 3, test 1.
#[tokio::test]
async fn cleaner_waits_for_a_for_share_replay_reader_and_the_tombstone_keeps_the_identity() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "a", 30, DUE).await;
    let held = nth_live(&observer, 14).await;
    let before = observer
        .query_one(
            "SELECT tenant_id, principal_id, operation, idempotency_key, fingerprint, status_code,
                    order_id, created_at, replay_deadline, response_body::text
             FROM idempotency_cards WHERE idempotency_key = $1",
            &[&held.idempotency_key],
        )
        .await
        .unwrap();
    let full_body: String = before.get(9);
    assert!(full_body.len() > 350, "realistic body: {}", full_body.len());

    let (reader, body) = Reader::lock(&db, &held, "FOR SHARE").await;
    assert_eq!(body.as_deref(), Some(full_body.as_str()));
    let config = db.config_with(PATIENT);
    let cleaner = tokio::spawn(async move { run(&config).await });
    wait_until_cleaner_waits(&observer).await;

    // The cleaner is blocked on the reader's row; the reader still reads the full body.
    let again: Option<String> = reader
        .client
        .query_one(
            "SELECT response_body::text FROM idempotency_records WHERE idempotency_key = $1",
            &[&held.idempotency_key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(again.as_deref(), Some(full_body.as_str()));
    assert!(!cleaner.is_finished());
    reader.commit().await;

    let report = cleaner.await.unwrap();
    assert_eq!(report.rows_tombstoned, 30);
    assert_eq!(report.lock_timeouts, 0);
    assert_eq!(report.backlog_rows, 0);
    assert_eq!(report.outcome, RunOutcome::Success);

    let after = observer
        .query_one(
            "SELECT tenant_id, principal_id, operation, idempotency_key, fingerprint, status_code,
                    order_id, created_at, replay_deadline, response_body::text, expired,
                    expired_at IS NOT NULL
             FROM idempotency_cards WHERE idempotency_key = $1",
            &[&held.idempotency_key],
        )
        .await
        .unwrap();
    for i in 0..4 {
        assert_eq!(
            before.get::<_, String>(i),
            after.get::<_, String>(i),
            "scope/key column {i}"
        );
    }
    assert_eq!(
        before.get::<_, Vec<u8>>(4),
        after.get::<_, Vec<u8>>(4),
        "fingerprint"
    );
    assert_eq!(
        before.get::<_, i16>(5),
        after.get::<_, i16>(5),
        "status code"
    );
    assert_eq!(
        before.get::<_, uuid::Uuid>(6),
        after.get::<_, uuid::Uuid>(6),
        "order id"
    );
    for i in [7, 8] {
        assert_eq!(
            before.get::<_, chrono::DateTime<chrono::Utc>>(i),
            after.get::<_, chrono::DateTime<chrono::Utc>>(i),
            "created_at / replay_deadline"
        );
    }
    assert_eq!(after.get::<_, Option<String>>(9), None, "body cleared");
    assert!(after.get::<_, bool>(10), "expired");
    assert!(after.get::<_, bool>(11), "expired_at set");
}

/// Issue 3, test 2.
#[tokio::test]
async fn a_row_held_past_lock_timeout_rolls_back_its_batch_whole_and_a_later_run_finishes_it() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "b", 50, DUE).await;
    // Deadline rank 12: the second batch of 10.
    let held = nth_live(&observer, 12).await;
    let held_before = row_text(&observer, &held).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    // Long enough for the barrier below and the three reads after it to finish inside the first
    // wait even on a loaded machine.
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "5s"),
    ]);
    let cleaner = {
        let config = config.clone();
        tokio::spawn(async move {
            let metrics = Metrics::new().unwrap();
            let report = cleanup::run_once(
                &config.database,
                &config.cleanup,
                &config.retention,
                RunLimits::default(),
                &CancellationToken::new(),
                Some(&metrics),
            )
            .await
            .unwrap();
            (report, metrics.cleanup_lock_timeouts.get())
        })
    };
    wait_until_cleaner_waits(&observer).await;
    // While the second batch waits: the first batch is committed, nothing of the second is.
    let waiting_batch_began: chrono::DateTime<chrono::Utc> = observer
        .query_one(
            "SELECT xact_start FROM pg_stat_activity
             WHERE application_name = 'tombstoned/cleanup' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let second_batch_done: i64 = observer
        .query_one(
            "SELECT count(*) FILTER (WHERE expired) FROM (
                 SELECT expired FROM idempotency_records ORDER BY replay_deadline OFFSET 10 LIMIT 10
             ) AS second_batch",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(second_batch_done, 0);
    assert_eq!(
        counts(&observer).await.0,
        10,
        "only the first batch committed"
    );

    let (report, lock_timeouts_metric) = cleaner.await.unwrap();
    // Timed out once in the main pass, once more when the run came back to the row.
    assert_eq!(report.lock_timeouts, 2);
    assert_eq!(lock_timeouts_metric, 2);
    assert_eq!(
        report.rows_tombstoned, 49,
        "every other due row in the same run"
    );
    assert_eq!(report.rows_skipped, 1);
    assert_eq!(report.backlog_rows, 1);
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert_eq!(
        row_text(&observer, &held).await,
        held_before,
        "held row untouched"
    );
    // The timed-out transaction left nothing: the rest of its batch was tombstoned by a later
    // transaction (expired_at is the tombstoning transaction's start).
    let early: i64 = observer
        .query_one(
            "SELECT count(*) FROM idempotency_records WHERE expired AND expired_at <= $1
               AND replay_deadline > (SELECT replay_deadline FROM idempotency_records
                                      ORDER BY replay_deadline OFFSET 9 LIMIT 1)
               AND replay_deadline < (SELECT replay_deadline FROM idempotency_records
                                      ORDER BY replay_deadline OFFSET 20 LIMIT 1)",
            &[&waiting_batch_began],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(early, 0, "a row of the rolled-back batch was committed");

    reader.commit().await;
    let later = run(&config).await;
    assert_eq!(later.rows_tombstoned, 1);
    assert_eq!(later.backlog_rows, 0);
    assert!(is_tombstone(&observer, &held).await);
}

/// The adaptive part of a lock timeout: one held row costs one timeout, the rest of its batch
/// is tombstoned at once (SKIP LOCKED), and the row is retried at the end of the same run.
#[tokio::test]
async fn a_held_row_is_isolated_after_one_timeout_and_retried_later_in_the_same_run() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "iso", 300, DUE).await;
    let held = nth_live(&observer, 150).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    // Long enough for the test to release the row during the second wait even on a loaded
    // machine.
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "100"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "8s"),
    ]);
    let cleaner = tokio::spawn(async move { run(&config).await });
    // Main pass: waits, times out, isolates the row, tombstones the 299 others ...
    let deadline = std::time::Instant::now() + BARRIER;
    while counts(&observer).await.0 < 299 {
        assert!(
            std::time::Instant::now() < deadline,
            "the others were never tombstoned"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // ... then comes back to it and waits again: release it now.
    wait_until_cleaner_waits(&observer).await;
    reader.commit().await;
    let report = cleaner.await.unwrap();
    assert_eq!(report.lock_timeouts, 1);
    assert_eq!(report.rows_tombstoned, 300);
    assert_eq!(report.rows_skipped, 0);
    assert_eq!(report.backlog_rows, 0);
    // 3 full batches, the isolating one, and the final pass over the held row's range.
    assert!(report.batches <= 5, "{} batches", report.batches);
    assert!(is_tombstone(&observer, &held).await);
}

/// Issue 3, test 3: why replay must read `FOR SHARE`.
#[tokio::test]
async fn a_for_key_share_holder_does_not_block_the_cleaner() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "c", 20, DUE).await;
    let held = nth_live(&observer, 3).await;
    let (reader, body) = Reader::lock(&db, &held, "FOR KEY SHARE").await;
    assert!(body.is_some());
    // Had the cleaner needed to wait, it would time out (and this would fail) within 2 s.
    let config = db.config_with(&[("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "2s")]);
    let report = run(&config).await;
    assert_eq!(report.lock_timeouts, 0);
    assert_eq!(report.rows_tombstoned, 20);
    // The reader's transaction is still open, yet its record is already a tombstone: a replay
    // that read under FOR KEY SHARE could be tombstoned under its feet.
    let now: Option<String> = reader
        .client
        .query_one(
            "SELECT response_body::text FROM idempotency_records WHERE idempotency_key = $1",
            &[&held.idempotency_key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(now, None);
    reader.commit().await;
}

/// Issue 3, test 4.
#[tokio::test]
async fn two_cleaners_at_once_without_the_lease_neither_deadlock_nor_differ_from_one() {
    async fn seed(db: &TestDb) -> tokio_postgres::Client {
        let c = db.client().await;
        seed_live(&c, "due", 3000, DUE).await;
        seed_live(&c, "later", 300, NOT_DUE).await;
        c
    }
    let settings = [
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "50"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s"),
        ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s"),
    ];

    let one = TestDb::new().await;
    let one_client = seed(&one).await;
    let alone = run(&one.config_with(&settings)).await;
    assert_eq!(alone.rows_tombstoned, 3000);

    let two = TestDb::new().await;
    let observer = seed(&two).await;
    // Hold the oldest due row so both cleaners are provably inside their first batch together.
    let oldest = nth_live(&observer, 0).await;
    let (reader, _) = Reader::lock(&two, &oldest, "FOR SHARE").await;
    let config = two.config_with(&settings);
    let first = {
        let config = config.clone();
        tokio::spawn(async move { run(&config).await })
    };
    let second = tokio::spawn(async move { run(&config).await });
    wait_until_sessions_wait(&observer, "tombstoned/cleanup", 2).await;
    reader.commit().await;
    let (a, b) = (first.await.unwrap(), second.await.unwrap());

    assert_eq!(
        a.retries + b.retries,
        0,
        "a deadlock or serialization failure happened"
    );
    assert_eq!(a.rows_tombstoned + b.rows_tombstoned, 3000, "each row once");
    assert_eq!(a.backlog_rows + b.backlog_rows, 0);
    assert_eq!(
        checksum_without_expiry_time(&observer).await,
        checksum_without_expiry_time(&one_client).await,
        "two cleaners must leave exactly what one leaves"
    );
}

/// Issue 3, test 5.
#[tokio::test]
async fn rows_not_due_are_untouched_and_old_tombstones_keep_their_expired_at() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", 100, DUE).await;
    seed_live(&client, "notdue", 100, NOT_DUE).await;
    seed_tombstones(&client, "old", 50, "2021-06-01T00:00:00Z").await;
    let not_due = checksum_of(&client, "notdue").await;
    let old = checksum_of(&client, "old").await;

    let report = run(&db.config_with(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "30")])).await;
    assert_eq!(report.rows_tombstoned, 100);
    assert_eq!(checksum_of(&client, "notdue").await, not_due);
    assert_eq!(checksum_of(&client, "old").await, old);
    let old_expiry: i64 = client
        .query_one(
            "SELECT count(*) FROM idempotency_records
             WHERE idempotency_key LIKE '%-old-%' AND expired_at = '2021-06-01T00:00:00Z'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(old_expiry, 50);
    assert_eq!(counts(&client).await, (150, 100));
}

/// Issue 3, test 6 (library and CLI).
#[tokio::test]
async fn dry_run_changes_no_byte_and_counts_exactly_what_a_real_run_tombstones() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", 120, DUE).await;
    seed_live(&client, "notdue", 30, NOT_DUE).await;
    seed_tombstones(&client, "old", 20, "2021-06-01T00:00:00Z").await;
    let config = db.config_with(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "50")]);
    let before = checksum(&client).await;

    let dry = cleanup::dry_run(&config.database, &config.cleanup, true)
        .await
        .unwrap();
    assert_eq!(dry.rows_due, 120);
    assert_eq!(dry.batches_needed, 3);
    assert_eq!(dry.tombstones, 20);
    assert_eq!(dry.live_records, 150);
    assert_eq!(
        dry.oldest_due_deadline.unwrap().to_rfc3339(),
        "2020-01-01T00:00:00.001+00:00"
    );
    assert!(dry.oldest_due_overdue.unwrap() > Duration::from_secs(86_400 * 365));
    assert_eq!(dry.top_tenants.len(), 3);
    assert_eq!(dry.top_tenants.iter().map(|t| t.rows_due).sum::<u64>(), 120);
    assert_eq!(dry.top_operations[0].name, "create-order");
    assert!(dry.purge.is_none());
    let plan = dry.plan.as_deref().unwrap();
    assert!(
        plan.contains("Nested Loop") && plan.contains("Tid Scan"),
        "{plan}"
    );

    let output = tokio::process::Command::new(binary())
        .args(["cleanup", "--dry-run", "--json", "--explain"])
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .env("TOMBSTONED_CLEANUP__BATCH_SIZE", "50")
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["rows_due"], 120);
    assert_eq!(json["batches_needed"], 3);
    assert!(json["plan"].as_str().unwrap().contains("Nested Loop"));
    let human = tokio::process::Command::new(binary())
        .args(["cleanup", "--dry-run"])
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(human.status.success());
    let text = String::from_utf8(human.stdout).unwrap();
    assert!(text.contains("rows due          120"), "{text}");

    assert_eq!(checksum(&client).await, before, "the dry run changed data");
    let real = run(&config).await;
    assert_eq!(real.rows_tombstoned, dry.rows_due);
}

/// Issue 3, test 7.
#[tokio::test]
async fn a_tombstoned_key_never_reopens() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "k", 5, DUE).await;
    run(&db.config()).await;
    let keys = client
        .query(
            "SELECT tenant_id, principal_id, operation, idempotency_key FROM idempotency_cards",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(keys.len(), 5);
    for k in keys {
        let (t, p, o, key): (String, String, String, String) =
            (k.get(0), k.get(1), k.get(2), k.get(3));
        let claimed = client
            .query(
                "INSERT INTO idempotency_records (scope_id,
                     idempotency_key, fingerprint, replay_deadline)
                 VALUES (ensure_scope($1, $2, $3), $4, sha256('another purchase'),
                         now() + interval '1 day')
                 ON CONFLICT (scope_id, idempotency_key) DO NOTHING
                 RETURNING idempotency_key",
                &[&t, &p, &o, &key],
            )
            .await
            .unwrap();
        assert!(claimed.is_empty(), "key {key} reopened");
    }
    assert_eq!(counts(&client).await, (5, 0));
}

/// Issue 3, test 8.
#[tokio::test]
async fn sigkill_mid_run_leaves_no_half_batch_and_the_next_run_completes() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "kill", 100, DUE).await;
    // Rank 55: batches 1-5 commit, batch 6 locks rows up to this one and waits.
    let held = nth_live(&observer, 55).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    let command = |db: &TestDb| {
        let mut c = tokio::process::Command::new(binary());
        c.arg("cleanup")
            .env("TOMBSTONED_DATABASE_URL", &db.url)
            .env("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")
            .env("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s")
            .env("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        c
    };
    let mut child = command(&db).spawn().unwrap();
    wait_until_cleaner_waits(&observer).await;
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let status = child.wait().await.unwrap();
    assert!(!status.success());
    // The orphaned backend gets the row once the reader is done. The batch's COMMIT was
    // pipelined with it (one round trip per batch), so it is already in the server's input and
    // batch 6 commits whole; had the kill come before the COMMIT was sent, the backend would
    // find its client gone and roll batch 6 back whole. Never half of it. The lease session ends
    // with its socket.
    reader.commit().await;
    wait_until_gone(&observer, "tombstoned/cleanup").await;
    let (tombstones, _) = counts(&observer).await;
    assert!(
        tombstones == 50 || tombstones == 60,
        "five committed batches, and the sixth whole or not at all: {tombstones}"
    );
    assert_eq!(tombstones % 10, 0, "a batch was half applied");

    // The killed run's lease row names a session that has ended: the next run takes it at once.
    let status = command(&db).status().await.unwrap();
    assert!(status.success());
    assert_eq!(counts(&observer).await, (100, 0));
}

/// Issue 3, test 9.
#[tokio::test]
async fn purge_is_off_by_default_and_then_deletes_only_tombstones_older_than_configured() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_tombstones(&client, "ancient", 20, "2000-01-01T00:00:00Z").await;
    let recent = (chrono::Utc::now() - chrono::TimeDelta::days(1)).to_rfc3339();
    seed_tombstones(&client, "recent", 15, &recent).await;
    seed_live(&client, "due", 10, DUE).await;
    seed_live(&client, "notdue", 10, NOT_DUE).await;

    let default = run(&db.config()).await;
    assert_eq!(default.tombstones_purged, 0);
    assert_eq!(default.purge_before, None);
    assert_eq!(
        counts(&client).await,
        (45, 10),
        "no tombstone goes without a policy"
    );

    let config = db.config_with(&[
        ("TOMBSTONED_RETENTION__PURGE_TOMBSTONES_AFTER", "30days"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "7"),
    ]);
    let dry = cleanup::dry_run_with_purge(
        &config.database,
        &config.cleanup,
        Some(&config.retention),
        false,
    )
    .await
    .unwrap();
    assert_eq!(dry.purge.as_ref().unwrap().tombstones_to_purge, 20);
    let purging = run(&config).await;
    assert_eq!(purging.tombstones_purged, 20);
    assert_eq!(purging.purge_batches, 3);
    assert!(purging.purge_before.is_some());
    assert_eq!(counts(&client).await, (25, 10));
    assert_eq!(checksum_of(&client, "ancient").await, "empty");
    // The documented consequence: a purged key can be claimed again.
    let reopened = client
        .query(
            "INSERT INTO idempotency_records (scope_id,
                 idempotency_key, fingerprint, replay_deadline)
             SELECT ensure_scope('tenant-1', 'principal-1', 'create-order'),
                    substr(md5('ancient' || 1), 1, 16) || '-ancient-1', sha256('x'), now()
             ON CONFLICT (scope_id, idempotency_key) DO NOTHING
             RETURNING 1",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(reopened.len(), 1);
}

/// Cost of finding a batch follows the batch, not the tombstones: `EXPLAIN (ANALYZE, BUFFERS)`
/// of one batch with 10 and with 100 tombstones per due row.
#[tokio::test]
async fn batch_cost_follows_the_batch_not_the_tombstones() {
    const DUE_ROWS: i64 = 500;
    const BATCH: i64 = 100;
    let mut figures = Vec::new();
    for ratio in [10, 100] {
        let db = TestDb::new().await;
        let client = db.client().await;
        seed_tombstones(&client, "t", DUE_ROWS * ratio, "2021-01-01T00:00:00Z").await;
        seed_live(&client, "due", DUE_ROWS, DUE).await;
        seed_live(&client, "notdue", DUE_ROWS, NOT_DUE).await;
        client
            .batch_execute("VACUUM ANALYZE idempotency_records")
            .await
            .unwrap();
        client.batch_execute("BEGIN").await.unwrap();
        client
            .query_one(sql::BATCH_SETTINGS, &[&"5s", &"30s"])
            .await
            .unwrap();
        let cutoff: chrono::DateTime<chrono::Utc> =
            client.query_one("SELECT now()", &[]).await.unwrap().get(0);
        let no_cursor: Option<chrono::DateTime<chrono::Utc>> = None;
        let plan: serde_json::Value = client
            .query_one(
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
                    qualify(sql::TOMBSTONE_BATCH, "tombstoned")
                ),
                &[&cutoff, &no_cursor, &cutoff, &BATCH],
            )
            .await
            .unwrap()
            .get(0);
        client.batch_execute("ROLLBACK").await.unwrap();
        let top = &plan[0]["Plan"];
        let buffers = |node: &serde_json::Value| {
            node["Shared Hit Blocks"].as_i64().unwrap()
                + node["Shared Read Blocks"].as_i64().unwrap()
        };
        let scan = find(top, &|n| n["Index Name"] == "idempotency_records_due_idx")
            .expect("the pick uses the due index");
        figures.push((ratio, buffers(top), buffers(scan)));
        eprintln!(
            "{ratio} tombstones per due row ({} tombstones): batch of {BATCH} touched {} \
             buffers, the due-index pick {}",
            DUE_ROWS * ratio,
            buffers(top),
            buffers(scan)
        );
    }
    let (_, total_10, pick_10) = figures[0];
    let (_, total_100, pick_100) = figures[1];
    // Ten times the tombstones: the pick costs the same; the whole batch at most a B-tree level
    // more per row (new primary-key entries), not ten times more.
    assert!(pick_100 <= pick_10 + 2, "pick: {pick_10} -> {pick_100}");
    assert!(
        total_100 * 10 <= total_10 * 13,
        "batch: {total_10} -> {total_100} buffers"
    );
    assert!(
        total_100 <= BATCH * 20,
        "{total_100} buffers for {BATCH} rows"
    );
}

fn find<'a>(
    node: &'a serde_json::Value,
    pred: &dyn Fn(&serde_json::Value) -> bool,
) -> Option<&'a serde_json::Value> {
    if pred(node) {
        return Some(node);
    }
    node["Plans"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|child| find(child, pred))
}

/// The batch statements lock in primary-key order: the UPDATE/DELETE is a nested loop whose
/// outer side is the picked rows sorted by the primary key, and whose inner side fetches by ctid.
#[tokio::test]
async fn batch_plans_lock_rows_in_primary_key_order() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "p", 2000, DUE).await;
    seed_tombstones(&client, "t", 2000, "2021-01-01T00:00:00Z").await;
    client
        .batch_execute("ANALYZE idempotency_records")
        .await
        .unwrap();
    let cutoff: chrono::DateTime<chrono::Utc> =
        client.query_one("SELECT now()", &[]).await.unwrap().get(0);
    for (statement, operation) in [
        (sql::TOMBSTONE_BATCH, "Update"),
        (sql::PURGE_BATCH, "Delete"),
    ] {
        let plan = batch_plan(&client, statement, cutoff).await;
        let modify = find(&plan[0]["Plan"], &|n| n["Operation"] == operation).unwrap();
        let join = &modify["Plans"][0];
        assert_eq!(join["Node Type"], "Nested Loop", "{plan:#}");
        let outer = &join["Plans"][0];
        let inner = &join["Plans"][1];
        let sort = find(outer, &|n| n["Node Type"] == "Sort").expect("outer side sorted");
        assert_eq!(
            sort["Sort Key"],
            serde_json::json!(["picked.scope_id", "picked.idempotency_key"]),
            "{plan:#}"
        );
        assert_eq!(inner["Node Type"], "Tid Scan", "{plan:#}");
    }
    // The SKIP LOCKED variants count the rows they passed over within the batch's own key range:
    // both bounds must be index conditions, or every batch would count the whole backlog.
    for statement in [
        sql::TOMBSTONE_BATCH_SKIP_LOCKED,
        sql::PURGE_BATCH_SKIP_LOCKED,
    ] {
        let plan = batch_plan(&client, statement, cutoff).await;
        let count = find(&plan[0]["Plan"], &|n| {
            n["Index Cond"].as_str().is_some_and(|c| c.contains("last"))
        })
        .unwrap_or_else(|| panic!("passed-over count not bounded by the index: {plan:#}"));
        let cond = count["Index Cond"].as_str().unwrap();
        assert!(cond.contains(">="), "{cond}");
        assert!(
            count["Filter"].as_str().is_none_or(|f| !f.contains("last")),
            "{count:#}"
        );
    }
}

/// `on_locked = "skip"`: held rows are passed over without waiting and counted.
#[tokio::test]
async fn skip_mode_never_waits_and_leaves_held_rows_for_the_next_run() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "s", 40, DUE).await;
    // One in the middle of a batch, one the last of a batch by deadline.
    let middle = nth_live(&observer, 15).await;
    let boundary = nth_live(&observer, 9).await;
    let (reader_a, _) = Reader::lock(&db, &middle, "FOR SHARE").await;
    let (reader_b, _) = Reader::lock(&db, &boundary, "FOR SHARE").await;
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__ON_LOCKED", "skip"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s"),
        ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s"),
    ]);
    let report = run(&config).await;
    assert!(report.duration < Duration::from_secs(30), "it waited");
    assert_eq!(report.lock_timeouts, 0);
    assert_eq!(report.rows_tombstoned, 38);
    assert_eq!(report.rows_skipped, 2);
    assert_eq!(report.backlog_rows, 2);
    assert_eq!(report.outcome, RunOutcome::Success);
    assert!(!is_tombstone(&observer, &middle).await);
    let dry = cleanup::dry_run(&config.database, &config.cleanup, true)
        .await
        .unwrap();
    assert_eq!(dry.rows_due, 2);
    assert!(
        dry.plan.unwrap().contains("LockRows"),
        "skip mode plans SKIP LOCKED"
    );
    reader_a.commit().await;
    reader_b.commit().await;
    let next = run(&config).await;
    assert_eq!(next.rows_tombstoned, 2);
    assert_eq!(next.rows_skipped, 0);
    assert_eq!(next.backlog_rows, 0);
}

/// Shutdown is honoured between batches: the batch in flight commits, no new one starts.
#[tokio::test]
async fn shutdown_lets_the_current_batch_commit_and_starts_no_other() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "sd", 50, DUE).await;
    let held = nth_live(&observer, 25).await; // third batch
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    let config = db.config_with(PATIENT);
    let shutdown = CancellationToken::new();
    let cleaner = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { run_with(&config, RunLimits::default(), &shutdown).await })
    };
    wait_until_cleaner_waits(&observer).await;
    shutdown.cancel();
    reader.commit().await;
    let report = cleaner.await.unwrap();
    assert_eq!(report.stopped_by, StopReason::Shutdown);
    assert_eq!(report.rows_tombstoned, 30, "the third batch finished");
    assert_eq!(report.backlog_rows, 20);
    assert_eq!(report.outcome, RunOutcome::Partial);
    assert_eq!(counts(&observer).await.0, 30);
}

/// `--max-batches`, `cleanup.max_run_time` and `cleanup.pause_between_batches`.
#[tokio::test]
async fn run_limits_stop_early_and_report_the_backlog() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "lim", 50, DUE).await;
    let config = db.config_with(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")]);
    let report = run_with(
        &config,
        RunLimits {
            max_batches: Some(2),
        },
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(report.stopped_by, StopReason::MaxBatches);
    assert_eq!((report.rows_tombstoned, report.batches), (20, 2));
    assert_eq!(report.backlog_rows, 30);
    assert_eq!(
        report.oldest_due_deadline.unwrap().to_rfc3339(),
        "2020-01-01T00:00:00.021+00:00"
    );
    assert!(report.oldest_due_age.unwrap() > Duration::from_secs(86_400 * 365));
    assert_eq!(report.outcome, RunOutcome::Partial);

    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ("TOMBSTONED_CLEANUP__MAX_RUN_TIME", "1ms"),
        ("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "20ms"),
    ]);
    let report = run(&config).await;
    assert_eq!(report.stopped_by, StopReason::MaxRunTime);
    assert_eq!(
        report.rows_tombstoned, 10,
        "one batch, then the clock ran out"
    );
    assert_eq!(report.backlog_rows, 20);

    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "100ms"),
    ]);
    let report = run(&config).await;
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert_eq!(report.rows_tombstoned, 20);
    assert!(
        report.duration >= Duration::from_millis(200),
        "{:?}",
        report.duration
    );
    assert_eq!(report.outcome, RunOutcome::Success);
}

/// `cleanup.batch_time`: each batch is sized from the time per row the run's batches took —
/// growing at most twofold per batch while they take far less than the target, shrinking when
/// they take more — and every due row is still tombstoned once.
#[tokio::test]
async fn batch_time_sizes_each_batch_from_the_measured_time_per_row() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "grow", 3000, DUE).await;
    // A batch of a few hundred rows takes milliseconds, far under 20 s: each batch doubles,
    // 100 + 200 + 400 + 800 + 1500 (of 1600) = 3000 in 5 batches, where batch_size alone takes 30.
    let report = run(&db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "100"),
        ("TOMBSTONED_CLEANUP__BATCH_TIME", "20s"),
    ]))
    .await;
    assert_eq!((report.rows_tombstoned, report.batches), (3000, 5));
    assert_eq!(report.outcome, RunOutcome::Success);

    seed_live(&client, "shrink", 2000, DUE).await;
    // Tombstoning 1000 rows takes milliseconds, far over 1 ms: the next batch takes a fraction
    // of 1000 rows, so the 2000 take more than the 2 batches batch_size alone would.
    let report = run(&db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "1000"),
        ("TOMBSTONED_CLEANUP__BATCH_TIME", "1ms"),
    ]))
    .await;
    assert_eq!(report.rows_tombstoned, 2000);
    assert!(report.batches > 2, "{} batches", report.batches);
    assert_eq!(counts(&client).await, (5000, 0));
}

/// Losing the connection fails the run with a typed, classified error; the next run reconnects.
#[tokio::test]
async fn connection_loss_fails_the_run_cleanly_and_the_next_run_reconnects() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "cl", 30, DUE).await;
    let held = nth_live(&observer, 15).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    let config = db.config_with(PATIENT);
    let metrics = std::sync::Arc::new(Metrics::new().unwrap());
    let cleaner = {
        let config = config.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            cleanup::run_once(
                &config.database,
                &config.cleanup,
                &config.retention,
                RunLimits::default(),
                &CancellationToken::new(),
                Some(&metrics),
            )
            .await
        })
    };
    wait_until_cleaner_waits(&observer).await;
    observer
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = 'tombstoned/cleanup' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    let error = cleaner.await.unwrap().expect_err("the run must fail");
    assert!(error.is_unavailable(), "{error:?}");
    assert!(error.summary().contains("57P01"), "{}", error.summary());
    assert_eq!(
        tombstoned::cli::exit_for(&anyhow::Error::new(error)),
        tombstoned::exit::Exit::Unavailable
    );
    assert_eq!(metrics.cleanup_runs.with_label_values(&["failed"]).get(), 1);
    assert_eq!(counts(&observer).await.0, 10, "only the committed batch");
    reader.commit().await;
    let report = run(&config).await;
    assert_eq!(report.rows_tombstoned, 20);
}

/// `run_once` feeds the cleanup metrics.
#[tokio::test]
async fn a_run_feeds_its_metrics() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "m", 25, DUE).await;
    let config = db.config_with(&[("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")]);
    let metrics = Metrics::new().unwrap();
    cleanup::run_once(
        &config.database,
        &config.cleanup,
        &config.retention,
        RunLimits::default(),
        &CancellationToken::new(),
        Some(&metrics),
    )
    .await
    .unwrap();
    assert_eq!(metrics.cleanup_rows_tombstoned.get(), 25);
    // Three batches with rows and the empty one that ends the run.
    assert_eq!(
        metrics
            .cleanup_batches
            .with_label_values(&["committed"])
            .get(),
        4
    );
    assert_eq!(metrics.cleanup_batch_duration.get_sample_count(), 4);
    assert_eq!(
        metrics.cleanup_runs.with_label_values(&["success"]).get(),
        1
    );
    assert_eq!(metrics.cleanup_run_duration.get_sample_count(), 1);
    assert_eq!(metrics.cleanup_backlog_rows.get(), 0);
    assert!(metrics.cleanup_last_success_timestamp_seconds.get() > 1.7e9);
}

/// The CLI run: summary and JSON, exit 0; with the lease held elsewhere, exit 75 and no work.
#[tokio::test]
async fn cli_run_prints_its_report_and_respects_the_lease() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "cli", 30, DUE).await;
    let config = db.config();
    let holder = db.client().await;
    let lease = take_lease(&holder, &config, "other-host:4242:0badcafe").await;
    let held = tokio::process::Command::new(binary())
        .arg("cleanup")
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert_eq!(held.status.code(), Some(75), "{held:?}");
    assert!(String::from_utf8_lossy(&held.stderr).contains("holds the cleanup lease"));
    assert!(held.stdout.is_empty(), "{held:?}");
    // --json answers this outcome too (issue 27): the same exit and stderr line, and an object.
    let held_json = tokio::process::Command::new(binary())
        .args(["cleanup", "--json"])
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert_eq!(held_json.status.code(), Some(75), "{held_json:?}");
    let lease_line = |stderr: &[u8]| {
        String::from_utf8_lossy(stderr)
            .lines()
            .filter(|l| l.starts_with("tombstoned: ") && l.contains("holds the cleanup lease"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(lease_line(&held_json.stderr), lease_line(&held.stderr));
    assert_eq!(lease_line(&held.stderr).len(), 1, "{held:?}");
    let skipped: serde_json::Value =
        serde_json::from_slice(&held_json.stdout).unwrap_or_else(|e| panic!("{e}: {held_json:?}"));
    assert_eq!(skipped["outcome"], "skipped_lease", "{skipped}");
    assert_eq!(skipped["schema"], SCHEMA, "{skipped}");
    assert_eq!(
        skipped["lease"]["holder"], "other-host:4242:0badcafe",
        "{skipped}"
    );
    assert_eq!(skipped["lease"]["held"], true, "{skipped}");
    assert_eq!(counts(&client).await.0, 0);
    assert!(lease
        .release(&tombstoned::db::Conn::dedicated(
            &holder,
            SCHEMA,
            tombstoned::db::Pooler::None
        ))
        .await
        .unwrap());

    let json = tokio::process::Command::new(binary())
        .args([
            "cleanup",
            "--json",
            "--batch-size",
            "7",
            "--max-batches",
            "2",
        ])
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(json.status.success(), "{json:?}");
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["rows_tombstoned"], 14);
    assert_eq!(report["stopped_by"], "max_batches");
    assert_eq!(report["backlog_rows"], 16);
    assert_eq!(report["outcome"], "partial");

    let text = tokio::process::Command::new(binary())
        .arg("cleanup")
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(text.status.success(), "{text:?}");
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("rows tombstoned   16"), "{text}");
    assert!(text.contains("backlog left      0 rows"), "{text}");

    let explain = tokio::process::Command::new(binary())
        .args(["cleanup", "--explain"])
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert_eq!(explain.status.code(), Some(64));
}

/// An unreachable database is exit status 69 for a run and for a dry run.
#[tokio::test]
async fn cli_exits_69_when_the_database_is_unreachable() {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("host=127.0.0.1 port={closed_port} user=nobody dbname=nothing");
    for args in [&["cleanup"][..], &["cleanup", "--dry-run"][..]] {
        let output = tokio::process::Command::new(binary())
            .args(args)
            .env("TOMBSTONED_DATABASE_URL", &url)
            .output()
            .await
            .unwrap();
        assert_eq!(output.status.code(), Some(69), "{args:?}: {output:?}");
    }
}

/// The JSON plan of a batch statement as a batch transaction would run it (its settings applied),
/// for a whole-table batch of 1000 at `cutoff`.
async fn batch_plan(
    client: &tokio_postgres::Client,
    statement: &'static str,
    cutoff: chrono::DateTime<chrono::Utc>,
) -> serde_json::Value {
    let no_cursor: Option<chrono::DateTime<chrono::Utc>> = None;
    client.batch_execute("BEGIN").await.unwrap();
    client
        .query_one(sql::BATCH_SETTINGS, &[&"5s", &"30s"])
        .await
        .unwrap();
    let plan = client
        .query_one(
            &format!("EXPLAIN (FORMAT JSON) {}", qualify(statement, "tombstoned")),
            &[&cutoff, &no_cursor, &cutoff, &1000i64],
        )
        .await
        .unwrap()
        .get(0);
    client.batch_execute("ROLLBACK").await.unwrap();
    plan
}

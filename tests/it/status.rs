//! `tombstoned status` against a real PostgreSQL: the text and JSON reports of a database with
//! runs, a held lease and a backlog; `--max-age` both ways; an unreachable database.

use std::process::Output;

use serde_json::Value;

use crate::cleanup_support::*;
use crate::harness::{binary, TestDb};

async fn tombstoned(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(binary())
        .args(args)
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", url)
        .env("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "2s")
        .env("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")
        .output()
        .await
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[tokio::test]
async fn status_shows_the_lease_the_runs_and_the_backlog_as_text_and_json() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "st", 30, DUE).await;
    seed_live(&observer, "later", 5, NOT_DUE).await;
    let ran = tombstoned(&db.url, &["cleanup", "--max-batches", "1"]).await;
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let holder = db.client().await;
    let lease = take_lease(&holder, &db.config(), "other-host:4242:0badcafe").await;

    let text = tombstoned(&db.url, &["status"]).await;
    assert_eq!(text.status.code(), Some(0), "{text:?}");
    let out = stdout(&text);
    assert!(out.contains("schema tombstoned"), "{out}");
    assert!(
        out.contains("lease         held by other-host:4242:0badcafe"),
        "{out}"
    );
    assert!(
        out.contains("backlog       20 rows due, the oldest since 2020-01-01"),
        "{out}"
    );
    assert!(out.contains("last success  "), "{out}");
    assert!(out.contains("10 rows tombstoned"), "{out}");
    assert!(out.contains("health        not checked"), "{out}");
    assert!(
        out.contains("outbox        0 pending, 0 dead letters"),
        "{out}"
    );
    let run_line = out
        .lines()
        .find(|l| l.contains(" partial "))
        .unwrap_or_else(|| panic!("no run line: {out}"));
    assert!(run_line.contains("max_batches"), "{run_line}");

    let json = tombstoned(&db.url, &["status", "--json", "--max-age", "1h"]).await;
    assert_eq!(json.status.code(), Some(0), "{json:?}");
    let doc: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["schema"], "tombstoned");
    assert_eq!(doc["health"], "ok");
    assert_eq!(doc["max_age_seconds"], 3600.0);
    assert_eq!(doc["lease"]["held"], true);
    assert_eq!(doc["lease"]["holder"], "other-host:4242:0badcafe");
    assert_eq!(doc["backlog"]["due_rows"], 20);
    assert!(doc["backlog"]["oldest_due_age_seconds"].as_f64().unwrap() > 1e8);
    let runs = doc["recent_runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["outcome"], "partial");
    assert_eq!(runs[0]["stopped_by"], "max_batches");
    assert_eq!(runs[0]["rows_tombstoned"], 10);
    assert_eq!(runs[0]["backlog_rows"], 20);
    assert_eq!(doc["last_success"]["run_id"], runs[0]["run_id"]);
    assert!(doc["last_success_age_seconds"].as_f64().unwrap() >= 0.0);
    assert!(doc["records"].get("live_estimate").is_some());
    assert_eq!(doc["outbox"]["pending"], 0);
    assert_eq!(doc["outbox"]["dead_letters"], 0);
    // The test role is a superuser: the view is visible, and no standby is connected.
    assert_eq!(doc["replication"]["visible"], true);
    assert_eq!(doc["replication"]["standbys"], Value::Array(vec![]));

    // Reading the status changed nothing: the lease is still the other holder's.
    assert_eq!(
        lease_state(&observer).await.unwrap().holder,
        "other-host:4242:0badcafe"
    );
    assert!(lease
        .release(&tombstoned::db::Conn::dedicated(
            &holder,
            SCHEMA,
            tombstoned::db::Pooler::None
        ))
        .await
        .unwrap());
}

#[tokio::test]
async fn max_age_exits_2_when_the_last_success_is_too_old_or_missing() {
    let db = TestDb::new().await;
    let observer = db.client().await;

    let none = tombstoned(&db.url, &["status", "--max-age", "1h"]).await;
    assert_eq!(none.status.code(), Some(2), "{none:?}");
    assert!(stdout(&none).contains("STALE: no successful cleanup run is recorded"));
    let unchecked = tombstoned(&db.url, &["status"]).await;
    assert_eq!(unchecked.status.code(), Some(0));
    // Without --max-age nothing was checked: JSON says so, as the text does (issue 27).
    let unchecked = tombstoned(&db.url, &["status", "--json"]).await;
    assert_eq!(unchecked.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&unchecked.stdout).unwrap();
    assert_eq!(doc["health"], "not_checked", "{doc}");
    assert_eq!(doc["max_age_seconds"], Value::Null, "{doc}");
    assert_eq!(doc["problem"], Value::Null, "{doc}");

    seed_live(&observer, "age", 5, DUE).await;
    let ran = tombstoned(&db.url, &["cleanup"]).await;
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let fresh = tombstoned(&db.url, &["status", "--max-age", "1h"]).await;
    assert_eq!(fresh.status.code(), Some(0), "{fresh:?}");
    assert!(stdout(&fresh).contains("health        OK"));

    // The run two hours back: stale for one hour, fine for three.
    observer
        .execute(
            "UPDATE tombstoned.cleanup_runs
             SET started_at = started_at - interval '2 hours',
                 finished_at = finished_at - interval '2 hours'",
            &[],
        )
        .await
        .unwrap();
    let stale = tombstoned(&db.url, &["status", "--max-age", "1h", "--json"]).await;
    assert_eq!(stale.status.code(), Some(2), "{stale:?}");
    let doc: Value = serde_json::from_slice(&stale.stdout).unwrap();
    assert_eq!(doc["health"], "stale");
    assert!(
        doc["problem"]
            .as_str()
            .unwrap()
            .starts_with("the last successful cleanup run finished 2h"),
        "{doc}"
    );
    let lenient = tombstoned(&db.url, &["status", "--max-age", "3h"]).await;
    assert_eq!(lenient.status.code(), Some(0), "{lenient:?}");

    let bad = tombstoned(&db.url, &["status", "--max-age", "soon"]).await;
    assert_eq!(bad.status.code(), Some(64));
}

#[tokio::test]
async fn an_unreachable_database_exits_69_with_one_line() {
    let out = tombstoned("postgresql://nobody@127.0.0.1:1/none", &["status"]).await;
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("tombstoned: error: cannot read the status"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

/// The record figures are right on a small table: counted, even where the statistics are stale
/// (an ANALYZE of the empty table, as migration V5 ends with, says 0 while rows exist; issue 42
/// item 8). Above `status::COUNT_BELOW_PAGES` they are the statistics' estimates, marked as such
/// with their age, and `unknown` while the table was never analysed. The switch is seen on a few
/// rows by lowering the threshold to one page, through the library's `read_counting_below`.
#[tokio::test]
async fn record_counts_are_exact_on_a_small_table_and_estimates_with_their_age_above() {
    use tombstoned::status::{read_counting_below, CountMethod, COUNT_BELOW_PAGES};
    let db = TestDb::new().await;
    let observer = db.client().await;
    // The statistics of the empty table, then rows: what the demo's database looks like (and no
    // autovacuum to refresh them while the test reads).
    observer
        .batch_execute(
            "ALTER TABLE tombstoned.idempotency_records SET (autovacuum_enabled = false);
             ANALYZE tombstoned.idempotency_records",
        )
        .await
        .unwrap();
    seed_live(&observer, "est", 40, NOT_DUE).await;
    seed_tombstones(&observer, "est-gone", 10, DUE).await;
    let database = db.config().database;

    let text = tombstoned(&db.url, &["status"]).await;
    assert_eq!(text.status.code(), Some(0), "{text:?}");
    let out = stdout(&text);
    assert!(
        out.contains("\nrecords       40 live, 10 tombstones (counted)\n"),
        "{out}"
    );
    let json = tombstoned(&db.url, &["status", "--json"]).await;
    let doc: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(doc["records"]["live_estimate"], 40, "{doc}");
    assert_eq!(doc["records"]["tombstones_estimate"], 10, "{doc}");
    assert_eq!(doc["records"]["method"], "counted", "{doc}");
    assert_eq!(doc["records"]["statistics_at"], Value::Null, "{doc}");
    let pages = doc["records"]["table_pages"].as_i64().unwrap();
    assert!((1..COUNT_BELOW_PAGES).contains(&pages), "{doc}");

    // One page below the table: estimated, and the statistics taken on the empty table say so.
    let estimated = read_counting_below(&database, pages).await.unwrap().records;
    assert_eq!(estimated.method, CountMethod::Statistics);
    assert_eq!(estimated.live_estimate, Some(0), "{estimated:?}");
    let stale_at = estimated.statistics_at.expect("the ANALYZE above");
    // Counting below one page more than the table has: counted again.
    let counted = read_counting_below(&database, pages + 1)
        .await
        .unwrap()
        .records;
    assert_eq!(counted.method, CountMethod::Counted);
    assert_eq!(
        (counted.live_estimate, counted.tombstones_estimate),
        (Some(40), Some(10))
    );

    // Fresh statistics: the estimates follow, with their new time.
    observer
        .batch_execute("ANALYZE tombstoned.idempotency_records")
        .await
        .unwrap();
    let estimated = read_counting_below(&database, 1).await.unwrap().records;
    assert_eq!(
        (estimated.live_estimate, estimated.tombstones_estimate),
        (Some(40), Some(10))
    );
    assert!(estimated.statistics_at.unwrap() > stale_at, "{estimated:?}");

    // A table never analysed (a fresh database's statistics are empty): unknown, not ~0.
    let fresh = TestDb::new().await;
    seed_live(&fresh.client().await, "never", 5, NOT_DUE).await;
    let never = read_counting_below(&fresh.config().database, 1)
        .await
        .unwrap()
        .records;
    assert_eq!(never.method, CountMethod::Statistics);
    assert_eq!(
        (
            never.live_estimate,
            never.tombstones_estimate,
            never.statistics_at
        ),
        (None, None, None),
        "{never:?}"
    );
}

//! The single-runner cleanup lease as a row (migration V3) and the run history, against a real
//! PostgreSQL: concurrent takers, renewal by a non-holder, expiry, a lease stolen between
//! batches, two `tombstoned cleanup` processes taking turns, the bounded history, a failed run's
//! record, and the in-place upgrade to V3.

use tokio_postgres::Client;
use tombstoned::cleanup::{self, LeasedRun, RecordedRun, RunOutcome, StopReason};
use tombstoned::db::{migrations, ErrorClass};

use crate::cleanup_support::*;
use crate::harness::{binary, wait_until_lock_wait, TestDb};

const PATIENT: &[(&str, &str)] = &[
    ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s"),
    ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s"),
    ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
];

async fn pid(client: &Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

async fn history(observer: &Client) -> Vec<RecordedRun> {
    RecordedRun::recent(
        &tombstoned::db::Conn::dedicated(observer, SCHEMA, tombstoned::db::Pooler::None),
        1000,
    )
    .await
    .unwrap()
}

/// Two takers blocked on the same expired lease row, released at once: exactly one wins. And
/// on a table with no row yet, of eight takers at once exactly one wins.
#[tokio::test]
async fn of_concurrent_takers_exactly_one_wins() {
    let db = TestDb::new().await;
    let config = db.config_with(PATIENT);
    let observer = db.client().await;

    // The eight queue together behind an uncommitted insert of the row by the test, which then
    // rolls back: released at once onto a table with no row.
    let inserter = db.client().await;
    inserter.batch_execute("BEGIN").await.unwrap();
    inserter
        .execute(
            "INSERT INTO tombstoned.cleanup_lease
                 (name, holder, holder_pid, acquired_at, renewed_at, expires_at)
             VALUES ('cleanup', 'test', pg_backend_pid(), now(), now(), now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap();
    let mut fresh = Vec::new();
    for i in 0..8 {
        let client = db.client().await;
        let taker_pid = pid(&client).await;
        let cleanup = config.cleanup.clone();
        fresh.push(tokio::spawn(async move {
            let won = cleanup::Lease::try_acquire(
                &tombstoned::db::Conn::dedicated(&client, SCHEMA, tombstoned::db::Pooler::None),
                &cleanup,
                &format!("fresh:{i}:0"),
            )
            .await
            .unwrap()
            .is_some();
            // Kept open until every taker has tried: a holder whose session ended holds nothing.
            (won, client)
        }));
        wait_until_lock_wait(&observer, taker_pid, BARRIER).await;
    }
    inserter.batch_execute("ROLLBACK").await.unwrap();
    let mut won = 0;
    let mut sessions = Vec::new();
    for taker in fresh {
        let (taken, client) = taker.await.unwrap();
        won += usize::from(taken);
        sessions.push(client);
    }
    assert_eq!(won, 1, "takers of a lease that never existed");

    // An expired lease, its row locked by a third session while both takers queue on it.
    expire_lease(&observer).await;
    let blocker = db.client().await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            "SELECT 1 FROM tombstoned.cleanup_lease WHERE name = 'cleanup' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let mut takers = Vec::new();
    for name in ["a:1:0", "b:2:0"] {
        let client = db.client().await;
        let taker_pid = pid(&client).await;
        let cleanup = config.cleanup.clone();
        takers.push(tokio::spawn(async move {
            let lease = cleanup::Lease::try_acquire(
                &tombstoned::db::Conn::dedicated(&client, SCHEMA, tombstoned::db::Pooler::None),
                &cleanup,
                name,
            )
            .await
            .unwrap();
            (lease.map(|l| l.holder().to_owned()), client)
        }));
        wait_until_lock_wait(&observer, taker_pid, BARRIER).await;
    }
    blocker.batch_execute("COMMIT").await.unwrap();
    let mut winners = Vec::new();
    for taker in takers {
        let (winner, client) = taker.await.unwrap();
        winners.extend(winner);
        sessions.push(client);
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let state = lease_state(&observer).await.unwrap();
    assert!(state.held);
    assert_eq!(state.holder, winners[0]);
}

/// Renewal by a holder whose lease was taken over fails with `LeaseLost`; a held lease is not
/// taken; an expired one is, by the next taker.
#[tokio::test]
async fn renewal_by_a_non_holder_fails_and_an_expired_lease_is_taken() {
    let db = TestDb::new().await;
    let config = db.config();
    let (a, b) = (db.client().await, db.client().await);
    let first = take_lease(&a, &config, "host-a:1:aaaaaaaa").await;
    assert!(
        cleanup::Lease::try_acquire(
            &tombstoned::db::Conn::dedicated(&b, SCHEMA, tombstoned::db::Pooler::None),
            &config.cleanup,
            "host-b:2:bbbbbbbb"
        )
        .await
        .unwrap()
        .is_none(),
        "a held lease was taken"
    );
    first
        .renew(
            &tombstoned::db::Conn::dedicated(&a, SCHEMA, tombstoned::db::Pooler::None),
            &config.cleanup,
        )
        .await
        .unwrap();

    expire_lease(&a).await;
    let second = take_lease(&b, &config, "host-b:2:bbbbbbbb").await;
    assert!(second.expires_at() > second.acquired_at());
    let err = first
        .renew(
            &tombstoned::db::Conn::dedicated(&a, SCHEMA, tombstoned::db::Pooler::None),
            &config.cleanup,
        )
        .await
        .unwrap_err();
    assert_eq!(err.class(), ErrorClass::LeaseLost, "{}", err.summary());
    assert!(
        !first
            .release(&tombstoned::db::Conn::dedicated(
                &a,
                SCHEMA,
                tombstoned::db::Pooler::None
            ))
            .await
            .unwrap(),
        "released another's lease"
    );
    second
        .renew(
            &tombstoned::db::Conn::dedicated(&b, SCHEMA, tombstoned::db::Pooler::None),
            &config.cleanup,
        )
        .await
        .unwrap();
    let state = lease_state(&a).await.unwrap();
    assert!(state.held);
    assert_eq!(state.holder, "host-b:2:bbbbbbbb");
    assert!(second
        .release(&tombstoned::db::Conn::dedicated(
            &b,
            SCHEMA,
            tombstoned::db::Pooler::None
        ))
        .await
        .unwrap());
    assert_lease_free(&a).await;
}

/// A leased run: the lease is held while it runs, released at its end, and the run is recorded.
/// Then the lease is stolen while a batch waits: the batch after the theft rolls back (nothing
/// of it applies) and the run stops with `lease_lost`, leaving the thief's lease alone.
#[tokio::test]
async fn a_batch_whose_lease_was_stolen_rolls_back_and_the_run_stops() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let config = db.config_with(
        &[
            PATIENT,
            &[("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "100ms")],
        ]
        .concat(),
    );

    seed_live(&observer, "one", 20, DUE).await;
    let Ok(LeasedRun::Ran(report)) = leased_run(&config, None).await else {
        panic!("the lease was free")
    };
    assert_eq!(report.rows_tombstoned, 20);
    assert_lease_free(&observer).await;
    let runs = history(&observer).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].outcome, "success");
    assert_eq!(runs[0].stopped_by.as_deref(), Some("finished"));
    assert_eq!((runs[0].rows_tombstoned, runs[0].batches), (20, 2));
    assert_eq!(runs[0].backlog_rows, Some(0));
    assert!(runs[0].started_at <= runs[0].finished_at);

    seed_live(&observer, "steal", 100, DUE).await;
    // Batches 1-3 commit; batch 4 renews the lease (locking its row) and waits on rank 35.
    let held = nth_live(&observer, 35).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    let run = tokio::spawn({
        let config = config.clone();
        async move { leased_run(&config, None).await }
    });
    wait_until_cleaner_waits(&observer).await;
    // The thief queues on the lease row behind batch 4 and takes the lease when it commits.
    let thief = db.client().await;
    let thief_pid = pid(&thief).await;
    let steal = tokio::spawn(async move {
        let stolen = thief
            .execute(
                "UPDATE tombstoned.cleanup_lease
                 SET holder = 'thief:1:00000000', holder_pid = pg_backend_pid(),
                     acquired_at = now(), renewed_at = now(),
                     expires_at = now() + interval '1 hour'
                 WHERE name = 'cleanup'",
                &[],
            )
            .await
            .unwrap();
        (stolen, thief)
    });
    wait_until_lock_wait(&observer, thief_pid, BARRIER).await;
    reader.commit().await;
    let (stolen, _thief) = steal.await.unwrap();
    assert_eq!(stolen, 1);

    let Ok(LeasedRun::Ran(report)) = run.await.unwrap() else {
        panic!("the run did not start")
    };
    assert_eq!(report.stopped_by, StopReason::LeaseLost);
    assert_eq!(report.outcome, RunOutcome::Partial);
    // Batch 4 committed before the theft; the first batch after it rolled back whole.
    assert!(
        report.rows_tombstoned >= 40 && report.rows_tombstoned < 100,
        "{}",
        report.rows_tombstoned
    );
    assert_eq!(report.rows_tombstoned % 10, 0);
    assert_eq!(
        counts(&observer).await.0,
        20 + report.rows_tombstoned as i64
    );
    // The thief's lease stands; the run is recorded as stopped by the lost lease.
    let state = lease_state(&observer).await.unwrap();
    assert!(state.held);
    assert_eq!(state.holder, "thief:1:00000000");
    let last = &history(&observer).await[0];
    assert_eq!(last.stopped_by.as_deref(), Some("lease_lost"));
    assert_eq!(last.outcome, "partial");
    assert_eq!(last.rows_tombstoned, report.rows_tombstoned as i64);
}

/// Two `tombstoned cleanup` processes, each run again and again: never two runs at once (their
/// recorded [started, finished] intervals never overlap), every run that did not get the lease
/// exits 75 having done nothing, and the history stays bounded with both writing.
#[tokio::test]
async fn two_cleanup_processes_take_turns_and_the_history_stays_bounded() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "turns", 600, DUE).await;
    let db_url = db.url.clone();
    let run = move |history_runs: &'static str| {
        let url = db_url.clone();
        async move {
            tokio::process::Command::new(binary())
                .args(["cleanup", "--max-batches", "4"])
                .env("TOMBSTONED_DATABASE_URL", &url)
                .env("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")
                // Each run holds the lease for its 4 batches' pauses (300 ms), far longer than a
                // process takes to start: the other instance's runs meet it.
                .env("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "100ms")
                .env("TOMBSTONED_CLEANUP__HISTORY_RUNS", history_runs)
                .output()
                .await
                .unwrap()
        }
    };
    let instance = |history_runs| {
        let run = run.clone();
        tokio::spawn(async move {
            let mut codes = Vec::new();
            for _ in 0..6 {
                codes.push(run(history_runs).await.status.code());
            }
            codes
        })
    };
    let (a, b) = (instance("100"), instance("100"));
    let codes: Vec<Option<i32>> = [a.await.unwrap(), b.await.unwrap()].concat();
    assert!(
        codes.iter().all(|c| matches!(c, Some(0) | Some(75))),
        "{codes:?}"
    );
    let ran = codes.iter().filter(|c| **c == Some(0)).count();
    // They really overlapped: some run found the other's lease and was turned away.
    assert!(
        codes.contains(&Some(75)),
        "no run was turned away: {codes:?}"
    );

    let runs = history(&observer).await;
    assert_eq!(runs.len(), ran, "every run that got the lease is recorded");
    let mut intervals: Vec<_> = runs.iter().map(|r| (r.started_at, r.finished_at)).collect();
    intervals.sort();
    for pair in intervals.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "two runs overlapped: {pair:?}");
    }
    let recorded: i64 = runs.iter().map(|r| r.rows_tombstoned).sum();
    assert_eq!(recorded, counts(&observer).await.0);
    assert_lease_free(&observer).await;

    // Bounded: with cleanup.history_runs = 3, the next runs (two instances) trim to the newest 3.
    let (a, b) = (instance("3"), instance("3"));
    let more = [a.await.unwrap(), b.await.unwrap()].concat();
    assert!(more.contains(&Some(0)), "{more:?}");
    let runs = history(&observer).await;
    assert_eq!(runs.len(), 3, "{runs:?}");
    let newest: i64 = observer
        .query_one("SELECT max(run_id) FROM tombstoned.cleanup_runs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(runs[0].run_id, newest);
}

/// A run whose connection is killed mid-batch is recorded (on a new session) as failed, with what
/// committed before and its error on one line; its lease is released.
#[tokio::test]
async fn a_failed_run_is_recorded_with_its_one_line_error() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let config = db.config_with(PATIENT);
    seed_live(&observer, "fail", 100, DUE).await;
    let held = nth_live(&observer, 35).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    let run = tokio::spawn({
        let config = config.clone();
        async move { leased_run(&config, None).await }
    });
    wait_until_cleaner_waits(&observer).await;
    observer
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = 'tombstoned/cleanup' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    let error = run.await.unwrap().unwrap_err();
    reader.commit().await;
    assert!(error.is_unavailable(), "{}", error.summary());

    let runs = history(&observer).await;
    assert_eq!(runs.len(), 1);
    let failed = &runs[0];
    assert_eq!(failed.outcome, "failed");
    assert_eq!(failed.stopped_by, None);
    assert_eq!((failed.rows_tombstoned, failed.batches), (30, 3));
    assert_eq!(failed.backlog_rows, None);
    let text = failed.error.as_deref().unwrap();
    assert!(
        text.starts_with("cleanup failed while running a tombstone batch"),
        "{text}"
    );
    assert!(!text.contains('\n'), "{text}");
    assert_lease_free(&observer).await;
}

/// V3 applies in place on a database at V2 holding data: nothing existing changes, and a
/// leased run works right after.
#[tokio::test]
async fn v3_upgrades_a_populated_database_in_place() {
    let db = TestDb::empty().await;
    let config = db.config();
    let mut client = db.client().await;
    // At V2: what a database migrated by the previous release looks like.
    assert_eq!(
        crate::schema_support::migrate_to(&mut client, 2).await,
        [1, 2]
    );
    seed_live_before_v5(&client, "old", 50, DUE).await;
    seed_live_before_v5(&client, "later", 20, NOT_DUE).await;
    let before = checksum(&client).await;

    // V3 alone, as the release that introduced it applied it (V4 adds a column, which changes
    // the rows' text form; its own upgrade test is in sql_api.rs).
    assert_eq!(crate::schema_support::migrate_to(&mut client, 3).await, [3]);
    assert_eq!(checksum(&client).await, before, "V3 changed existing rows");
    let applied = migrations::migrate(&config.database).await.unwrap();
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(3)
    );
    assert!(migrations::status(
        &tombstoned::db::Conn::dedicated(&client, SCHEMA, tombstoned::db::Pooler::None),
        None
    )
    .await
    .unwrap()
    .is_current());

    let Ok(LeasedRun::Ran(report)) = leased_run(&config, None).await else {
        panic!("no leased run after the upgrade")
    };
    assert_eq!(report.rows_tombstoned, 50);
    assert_eq!(history(&client).await.len(), 1);
}

//! The cleanup scheduler against a real PostgreSQL: coalescing of fire times missed during a long
//! run, the single-runner lease, database outages, configuration reloads and shutdown.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, Timelike, Utc};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::RunOutcome;
use tombstoned::config::Config;
use tombstoned::metrics::Metrics;
use tombstoned::scheduler::{Scheduler, SchedulerState, SchedulerStatus};

use crate::cleanup_support::*;
use crate::harness::{config_for, TestDb};

/// A scheduler on `config`, running until the returned token is cancelled.
struct Running {
    settings: watch::Sender<Arc<Config>>,
    status: watch::Receiver<SchedulerStatus>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn start(config: Config) -> Running {
    let metrics = Arc::new(Metrics::new().unwrap());
    let (settings, receiver) = watch::channel(Arc::new(config.clone()));
    let scheduler = Scheduler::new(config.database.clone(), receiver, metrics.clone());
    let status = scheduler.status();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(scheduler.run(shutdown.clone()));
    Running {
        settings,
        status,
        metrics,
        shutdown,
        task,
    }
}

impl Running {
    /// Waits (on status changes, not sleeps) until `pred` holds.
    async fn until(
        &mut self,
        what: &str,
        pred: impl Fn(&SchedulerStatus) -> bool,
    ) -> SchedulerStatus {
        let status = &mut self.status;
        tokio::time::timeout(BARRIER, async {
            loop {
                {
                    let s = status.borrow_and_update();
                    if pred(&s) {
                        return s.clone();
                    }
                }
                status
                    .changed()
                    .await
                    .expect("scheduler dropped its status");
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the scheduler never got to: {what}"))
    }

    fn runs(&self, outcome: &str) -> u64 {
        self.metrics
            .cleanup_runs
            .with_label_values(&[outcome])
            .get()
    }

    async fn stop(self) -> SchedulerStatus {
        self.shutdown.cancel();
        tokio::time::timeout(BARRIER, self.task)
            .await
            .expect("the scheduler did not stop")
            .unwrap();
        let status = self.status.borrow().clone();
        assert_eq!(status.state, SchedulerState::Stopped);
        status
    }
}

/// Issue 3, test 10 (coalescing).
#[tokio::test]
async fn fire_times_missed_during_a_long_run_are_coalesced_into_one_catch_up_run() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "co", 20, DUE).await;
    let held = nth_live(&observer, 5).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    // Three consecutive fire times, the first at least 3 s away; then nothing for a minute.
    let first = Utc::now() + TimeDelta::seconds(3);
    let s = first.second();
    let schedule = format!("{},{},{} * * * * *", s, (s + 1) % 60, (s + 2) % 60);
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__SCHEDULE", &schedule),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s"),
        ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s"),
    ]);
    let mut running = start(config);

    // The first fire's run blocks on the held row ...
    wait_until_cleaner_waits(&observer).await;
    let running_status = running
        .until("running", |s| {
            matches!(s.state, SchedulerState::Running { .. })
        })
        .await;
    let SchedulerState::Running { started } = running_status.state else {
        unreachable!()
    };
    // ... while the next two fire times pass (the schedule's clock, not a hopeful sleep).
    let two_more = started + TimeDelta::milliseconds(2200);
    while Utc::now() < two_more {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sessions(&observer, "tombstoned/cleanup").await,
        1,
        "runs overlapped"
    );
    // The lease row names this process's running run (it used to be a lease session).
    let lease = lease_state(&observer).await.expect("lease row");
    assert!(lease.held, "{lease:?}");
    assert!(
        lease.holder.contains(&format!(":{}:", std::process::id())),
        "{lease:?}"
    );
    assert_eq!(running.metrics.cleanup_lease_held.get(), 1);
    reader.commit().await;

    // The long run ends; ONE catch-up run follows at once; the next fire is a minute away.
    let after = running.until("two runs", |s| s.fires == 2).await;
    assert_eq!(after.fires_coalesced, 2);
    assert_eq!(running.metrics.cleanup_fires_coalesced.get(), 2);
    assert_eq!(running.runs("success"), 2);
    let last = after.last_run.as_ref().unwrap();
    assert_eq!(last.outcome, RunOutcome::Success);
    assert!(
        last.started < started + TimeDelta::seconds(30),
        "catch-up ran late"
    );
    let idle = running
        .until("idle again", |s| s.state == SchedulerState::Idle)
        .await;
    assert!(
        idle.next_fire.unwrap() > Utc::now() + TimeDelta::seconds(30),
        "missed fires were queued, not coalesced: next {:?}",
        idle.next_fire
    );
    assert_eq!(idle.fires, 2);
    assert_eq!(running.metrics.cleanup_lease_held.get(), 0);
    assert_eq!(counts(&observer).await.0, 20);
    running.stop().await;
}

/// Issue 3, test 10 (lease).
#[tokio::test]
async fn a_fire_is_skipped_and_recorded_while_another_session_holds_the_lease() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "ls", 10, DUE).await;
    let holder = db.client().await;
    let config = db.config_with(&[("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *")]);
    let lease = take_lease(&holder, &config, "other-host:4242:0badcafe").await;
    let mut running = start(config);

    let skipped = running
        .until("a lease skip", |s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.outcome == RunOutcome::SkippedLease)
        })
        .await;
    assert!(running.runs("skipped_lease") >= 1);
    assert_eq!(running.runs("success"), 0);
    assert_eq!(skipped.database_reachable, Some(true));
    assert_eq!(skipped.last_success, None);
    assert_eq!(
        counts(&observer).await.0,
        0,
        "a skipped fire must not clean"
    );

    assert_eq!(
        lease_state(&observer).await.unwrap().holder,
        "other-host:4242:0badcafe",
        "a skipped fire must not take the lease"
    );
    assert!(lease
        .release(&tombstoned::db::Conn::dedicated(
            &holder,
            SCHEMA,
            tombstoned::db::Pooler::None
        ))
        .await
        .unwrap());
    let ran = running
        .until("a run after the lease is free", |s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.outcome == RunOutcome::Success)
        })
        .await;
    assert!(ran.last_success.is_some());
    assert_eq!(counts(&observer).await.0, 10);
    running.stop().await;
}

/// A database outage never stops the scheduler: each fire fails, is counted, and the next fire
/// tries again.
#[tokio::test]
async fn a_database_outage_is_counted_and_retried_at_every_fire() {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("host=127.0.0.1 port={closed_port} user=nobody dbname=nothing");
    let config = config_for(
        &url,
        &[
            ("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *"),
            ("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "1s"),
        ],
    );
    let mut running = start(config);
    let status = running.until("two failed fires", |s| s.fires >= 2).await;
    assert_eq!(status.database_reachable, Some(false));
    let last = status.last_run.as_ref().unwrap();
    assert_eq!(last.outcome, RunOutcome::Failed);
    assert!(
        last.error.as_deref().unwrap().contains("cannot open"),
        "{:?}",
        last.error
    );
    assert!(running.runs("failed") >= 2);
    assert!(
        running
            .metrics
            .db_errors
            .with_label_values(&["connection"])
            .get()
            >= 2
    );
    assert!(status.next_fire.is_some());
    assert!(status.heartbeat.elapsed() < Duration::from_secs(5));
    assert!(status.summary().contains("failed"), "{}", status.summary());
    running.stop().await;
}

/// SIGHUP reloads reach the scheduler: disabled pauses it, enabling resumes it, and the new
/// batch size applies to the next run.
#[tokio::test]
async fn reloads_pause_resume_and_resize_the_next_run() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "rl", 20, DUE).await;
    let paused = db.config_with(&[
        ("TOMBSTONED_CLEANUP__ENABLED", "false"),
        ("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *"),
    ]);
    let mut running = start(paused.clone());
    let status = running
        .until("paused", |s| s.state == SchedulerState::Paused)
        .await;
    assert_eq!(status.next_fire, None);
    assert_eq!(
        running.metrics.cleanup_next_run_timestamp_seconds.get(),
        0.0
    );
    assert!(status.summary().contains("paused"));

    let enabled = db.config_with(&[
        ("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "7"),
    ]);
    running.settings.send(Arc::new(enabled)).unwrap();
    let ran = running.until("a run", |s| s.fires >= 1).await;
    let report = ran.last_run.as_ref().unwrap().report.as_ref().unwrap();
    assert_eq!((report.rows_tombstoned, report.batches), (20, 3));
    assert!(running.metrics.cleanup_next_run_timestamp_seconds.get() > 1.7e9);

    running.settings.send(Arc::new(paused)).unwrap();
    running
        .until("paused again", |s| s.state == SchedulerState::Paused)
        .await;
    running.stop().await;
}

/// Shutdown during a run: the batch in flight commits, the loop ends.
#[tokio::test]
async fn shutdown_during_a_run_lets_the_batch_finish_and_ends_the_loop() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "st", 30, DUE).await;
    let held = nth_live(&observer, 15).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    let running = start(db.config_with(&[
        ("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "60s"),
        ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "120s"),
    ]));
    wait_until_cleaner_waits(&observer).await;
    running.shutdown.cancel();
    reader.commit().await;
    let metrics = running.metrics.clone();
    let status = running.stop().await;
    let last = status.last_run.unwrap();
    assert_eq!(last.outcome, RunOutcome::Partial);
    assert_eq!(last.report.unwrap().rows_tombstoned, 20);
    assert_eq!(
        metrics.cleanup_runs.with_label_values(&["partial"]).get(),
        1
    );
    assert_eq!(counts(&observer).await.0, 20);
    wait_until_gone(&observer, "tombstoned/cleanup").await;
    assert_lease_free(&observer).await;
}

/// Two schedulers (two daemons' worth) on one database, firing every second with runs longer
/// than that: they take turns. The run history shows no two runs at once, every tombstone is
/// accounted for by a recorded run, and after both stop nothing holds the lease.
#[tokio::test]
async fn two_schedulers_on_one_database_never_clean_at_the_same_time() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "pair", 3000, DUE).await;
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *"),
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "20ms"),
        ("TOMBSTONED_CLEANUP__MAX_RUN_TIME", "1500ms"),
    ]);
    let (first, second) = (start(config.clone()), start(config));

    // Barrier on the history itself: wait until four runs are recorded.
    let deadline = std::time::Instant::now() + BARRIER * 3;
    loop {
        let recorded: i64 = observer
            .query_one("SELECT count(*) FROM tombstoned.cleanup_runs", &[])
            .await
            .unwrap()
            .get(0);
        if recorded >= 4 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "only {recorded} runs");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let skipped = first.runs("skipped_lease") + second.runs("skipped_lease");
    first.stop().await;
    second.stop().await;

    let runs = tombstoned::cleanup::RecordedRun::recent(
        &tombstoned::db::Conn::dedicated(&observer, SCHEMA, tombstoned::db::Pooler::None),
        1000,
    )
    .await
    .unwrap();
    let mut intervals: Vec<_> = runs.iter().map(|r| (r.started_at, r.finished_at)).collect();
    intervals.sort();
    for pair in intervals.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "two runs overlapped: {pair:?}");
    }
    assert!(runs.iter().all(|r| r.outcome != "failed"), "{runs:?}");
    let recorded: i64 = runs.iter().map(|r| r.rows_tombstoned).sum();
    assert_eq!(recorded, counts(&observer).await.0);
    assert_lease_free(&observer).await;
    // Runs of 1.5 s fired every second by two schedulers: some fires found the lease taken.
    assert!(skipped >= 1, "no fire was ever skipped");
}

/// Issue 12 (failover, bullet 3): on a server that refuses writes (here
/// `default_transaction_read_only`, the same 25006 a standby gives) the scheduler does not start
/// a run: each fire is counted as `skipped_read_only` with the reason, nothing fails, nothing is
/// attempted; once writable again, the next fire cleans.
#[tokio::test]
async fn a_fire_is_skipped_with_its_reason_while_the_database_is_read_only() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "ro", 10, DUE).await;
    observer
        .batch_execute(&format!(
            "ALTER DATABASE {} SET default_transaction_read_only = on",
            db.name
        ))
        .await
        .unwrap();
    let mut running = start(db.config_with(&[("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *")]));
    let skipped = running
        .until("a read-only skip", |s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.outcome == RunOutcome::SkippedReadOnly)
        })
        .await;
    let error = skipped.last_run.as_ref().and_then(|r| r.error.clone());
    assert!(
        error.as_deref().is_some_and(|e| e.contains("read-only")),
        "{error:?}"
    );
    assert!(running.runs("skipped_read_only") >= 1);
    assert_eq!(running.runs("failed"), 0);
    assert_eq!(counts(&observer).await.0, 0, "nothing was tombstoned");

    observer
        .batch_execute(&format!(
            "ALTER DATABASE {} RESET default_transaction_read_only",
            db.name
        ))
        .await
        .unwrap();
    running
        .until("a run after the flip back", |s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.outcome == RunOutcome::Success)
        })
        .await;
    assert_eq!(counts(&observer).await.0, 10);
    running.stop().await;
}

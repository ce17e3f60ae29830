//! Injected faults against the real daemon, each a test: SIGKILL during cleanup batches and
//! during a burst of claims; PostgreSQL restarted and stopped under load; the cleaner's and the
//! API's backends terminated mid-transaction; a replay reader holding `FOR SHARE` far past
//! `cleanup.lock_timeout` while thousands of rows are due. (The connection dying during COMMIT,
//! both ways, is `tests/it/api_commit_loss.rs`.) Every barrier is something observed — a session
//! waiting on a lock in `pg_stat_activity`, an answer, a metric — never a sleep.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_postgres::Client;

use crate::cleanup_support::{
    counts, nth_live, seed_live, wait_until_cleaner_waits, wait_until_gone,
    wait_until_sessions_wait, Reader, DUE,
};
use crate::daemon::{connect, sample, Daemon, DaemonSpec, OwnCluster};
use crate::harness::TestDb;
use crate::ledger::{self, Answer, CheckOptions, DbState, Kind, Ledger, Monitor, SharedPool};
use crate::load::{self, Api, LoadSpec, Mix};

const BOUND: Duration = Duration::from_secs(30);

/// md5 over every record's identity (everything but the body and the expiry columns).
async fn identity_checksum(client: &Client) -> (i64, String) {
    let row = client
        .query_one(
            "SELECT count(*), coalesce(md5(string_agg(concat_ws('|', tenant_id, principal_id,
                 operation, idempotency_key, encode(fingerprint, 'hex'), status_code, order_id,
                 created_at, replay_deadline), ',' ORDER BY tenant_id, principal_id, operation,
                 idempotency_key)), 'empty')
             FROM idempotency_cards",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Polls `probe` until it returns true; panics after `within`.
pub(crate) async fn until<F, Fut>(what: &str, within: Duration, mut probe: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if probe().await {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The load running in the background until `stop` is set.
struct Background {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    ledger: Arc<Ledger>,
    pool: SharedPool,
    api: Api,
}

impl Background {
    fn start(daemon: &Daemon, clients: usize, mix: Mix, tag: &str) -> Background {
        let api = Api::new(&daemon.api, Duration::from_secs(20));
        let ledger = Arc::new(Ledger::default());
        let pool: SharedPool = Default::default();
        let stop = Arc::new(AtomicBool::new(false));
        let spec = LoadSpec {
            clients,
            mix,
            seed: 7,
            tag: tag.into(),
        };
        let task = tokio::spawn({
            let (api, ledger, pool, stop) =
                (api.clone(), ledger.clone(), pool.clone(), stop.clone());
            async move { load::run(&api, &spec, &ledger, &pool, &stop).await }
        });
        Background {
            stop,
            task,
            ledger,
            pool,
            api,
        }
    }

    /// Answers matching `pred` so far.
    fn count(&self, pred: impl Fn(&ledger::Exchange) -> bool) -> usize {
        self.ledger.count(pred)
    }

    async fn stop(self) -> (Arc<Ledger>, SharedPool, Api) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap();
        (self.ledger, self.pool, self.api)
    }
}

fn is_status(e: &ledger::Exchange, status: u16, problem: &str) -> bool {
    matches!(&e.answer, Answer::Reply(r) if r.status == status
        && (problem.is_empty() || r.problem() == problem)
        && !r.replayed)
}

fn created_after(e: &ledger::Exchange, t: SystemTime) -> bool {
    e.sent_at >= t && is_status(e, 201, "")
}

/// Fault 1a: SIGKILL while a cleanup batch is open (it has updated part of its rows and waits
/// on a row a replay reader holds). The batch applies whole or not at all; after a restart the daemon's
/// next run finishes the work and no record's identity changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_a_cleanup_batch_leaves_no_half_batch_and_the_restart_finishes() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "kill", 2000, DUE).await;
    let before = identity_checksum(&observer).await;
    // Rank 1234: batches of 100 commit up to rank 1199; the 13th waits on this row.
    let held = nth_live(&observer, 1234).await;
    let (reader, body) = Reader::lock(&db, &held, "FOR SHARE").await;
    let mut daemon = Daemon::start(
        DaemonSpec::new(&db.url)
            .set("cleanup", "batch_size", "100")
            .set("cleanup", "lock_timeout", "\"60s\"")
            .set("cleanup", "statement_timeout", "\"120s\""),
    )
    .await;
    wait_until_cleaner_waits(&observer).await;
    daemon.sigkill().await;
    reader.commit().await;
    // The orphaned batch gets the row. Its COMMIT was pipelined with it (one round trip per
    // batch), so it is already in the server's input and the 13th batch commits whole; had the
    // kill come before the COMMIT was sent, the backend would find its client gone and roll the
    // batch back whole. Never part of it.
    wait_until_gone(&observer, "tombstoned/cleanup").await;
    wait_until_gone(&observer, "tombstoned/cleanup-lease").await;
    let (tombstones, live) = counts(&observer).await;
    assert!(
        (tombstones, live) == (1200, 800) || (tombstones, live) == (1300, 700),
        "12 committed batches, and the 13th whole or not at all: {tombstones} tombstones"
    );
    assert!(body.is_some());

    daemon.restart().await;
    let took = until(
        "the restarted daemon tombstones the rest",
        BOUND,
        || async { counts(&observer).await == (2000, 0) },
    )
    .await;
    assert_eq!(identity_checksum(&observer).await, before, "identity kept");
    let status = daemon.terminate().await;
    assert!(status.success());
    let thirteenth = if tombstones == 1300 {
        "committed whole"
    } else {
        "rolled back whole"
    };
    crate::publish_figures(
        "fault-sigkill-cleanup",
        &format!(
            "SIGKILL mid-batch: 2000 due rows, batches of 100; {tombstones} tombstoned after the \
             kill (12 whole batches, the 13th {thirteenth}), the restarted daemon finished the \
             other {live} in {took:?}\n"
        ),
    );
}

/// Fault 1b: SIGKILL during a burst of claims, some of them blocked inside their transaction
/// (the pipelined COMMIT already sent). The orphaned sessions may still commit; after a restart
/// every key's retry settles it, and every invariant holds: one order per key and request_id,
/// replays byte-identical, nothing created twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_during_a_burst_of_claims_then_retries_settle_every_key_exactly_once() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let mut daemon = Daemon::start(DaemonSpec::new(&db.url)).await;
    let load = Background::start(&daemon, 16, Mix::simple(), "kb");
    until("claims flow", BOUND, || async {
        load.count(|e| is_status(e, 201, "")) >= 100
    })
    .await;
    // Block the claims' order inserts: they wait inside their transactions.
    let locker = db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    wait_until_sessions_wait(&observer, "tombstoned/api", 4).await;
    let in_flight: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tombstoned/api'
               AND datname = current_database() AND wait_event_type = 'Lock'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    daemon.sigkill().await;
    let (ledger, pool, api) = load.stop().await;
    locker.batch_execute("COMMIT").await.unwrap();
    wait_until_gone(&observer, "tombstoned/api").await;

    daemon.restart().await;
    load::settle(&api, &ledger, &pool, Duration::from_secs(60)).await;
    let status = daemon.terminate().await;
    assert!(status.success());
    let state = DbState::load(&observer).await;
    let verdict = ledger::check(
        &ledger,
        &state,
        CheckOptions {
            allow_transport: true,
        },
    );
    // Keys the killed daemon never answered whose orphaned transaction committed anyway: their
    // first answer after the restart is a replay.
    let exchanges = ledger.exchanges.lock().unwrap();
    let orphan_commits = exchanges
        .iter()
        .filter(|e| e.kind == Kind::RetryAfterFault)
        .filter(|e| matches!(&e.answer, Answer::Reply(r) if r.status == 201 && r.replayed))
        .filter(|e| {
            !exchanges.iter().any(|o| {
                o.intent.key == e.intent.key
                    && o.kind != Kind::RetryAfterFault
                    && matches!(&o.answer, Answer::Reply(r) if r.status == 201)
            })
        })
        .count();
    drop(exchanges);
    crate::publish_figures(
        "fault-sigkill-claims",
        &format!(
            "SIGKILL during a burst of claims: 16 clients, {in_flight} claims blocked inside \
             their transaction at the kill; {orphan_commits} keys committed by orphaned \
             sessions and replayed on retry\n{}",
            verdict.figures()
        ),
    );
    verdict.assert_clean();
}

/// Fault 2: `pg_ctl restart -m fast`, then a stop of several seconds, under load. The daemon
/// stays up, answers 503 with Retry-After while the database is gone (and `/readyz` 503), comes
/// back within seconds of the server, and cleanup resumes at the next fire time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_and_outage_under_load_503_then_recovery_and_cleanup_resumes() {
    let pg = OwnCluster::start().await;
    let mut daemon = Daemon::start(
        DaemonSpec::new(&pg.url)
            .set("retention", "replay_window", "\"3s\"")
            .set("database", "connect_timeout", "\"1s\""),
    )
    .await;
    let mut mix = Mix::simple();
    mix.read = 10;
    let load = Background::start(&daemon, 8, mix, "pg");
    until("claims flow", BOUND, || async {
        load.count(|e| is_status(e, 201, "")) >= 100
    })
    .await;

    // 1. pg_ctl restart -m fast.
    pg.restart().await;
    let restarted = SystemTime::now();
    let restart_recovery = until("a claim succeeds after the restart", BOUND, || async {
        load.count(|e| created_after(e, restarted)) > 0
    })
    .await;
    assert!(daemon.alive());

    // 2. The server stops for a while.
    let failed_runs = || async {
        sample(
            &daemon.metrics().await,
            "tombstoned_cleanup_runs_total{outcome=\"failed\"}",
        )
    };
    let failed_before = failed_runs().await;
    pg.stop_server().await;
    let stopped = SystemTime::now();
    until(
        "503 database-unavailable while the server is down",
        BOUND,
        || async {
            load.count(|e| e.sent_at >= stopped && is_status(e, 503, "database-unavailable")) > 0
        },
    )
    .await;
    let ready = reqwest::get(format!("{}/readyz", daemon.ops))
        .await
        .unwrap();
    assert_eq!(ready.status(), 503, "/readyz while the database is down");
    // The scheduler fires into the outage, fails, and goes on.
    until("a cleanup fire fails during the outage", BOUND, || async {
        failed_runs().await > failed_before
    })
    .await;
    assert!(daemon.alive(), "the daemon stays up:\n{}", daemon.stderr());
    let successful_runs = || async {
        sample(
            &daemon.metrics().await,
            "tombstoned_cleanup_runs_total{outcome=\"success\"}",
        )
    };
    let successes_during_outage = successful_runs().await;
    pg.start_server().await;
    let started = SystemTime::now();
    let outage_recovery = until(
        "a claim succeeds after the server is back",
        BOUND,
        || async { load.count(|e| created_after(e, started)) > 0 },
    )
    .await;
    // Cleanup resumes: records that came due during the outage are tombstoned by the next runs.
    let observer = connect(&pg.url, "test").await;
    let cleanup_resumed = until("cleanup catches up after the outage", BOUND, || async {
        observer
            .query_one(
                "SELECT count(*) FROM idempotency_records
                 WHERE NOT expired AND replay_deadline < $1::timestamptz",
                &[&started],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
    })
    .await;
    until("a cleanup run succeeds after the outage", BOUND, || async {
        successful_runs().await > successes_during_outage
    })
    .await;
    let (ledger, pool, api) = load.stop().await;
    load::settle(&api, &ledger, &pool, Duration::from_secs(60)).await;
    let status = daemon.terminate().await;
    assert!(status.success(), "{}", daemon.stderr());
    let state = DbState::load(&observer).await;
    let verdict = ledger::check(&ledger, &state, CheckOptions::default());
    crate::publish_figures(
        "fault-postgres-restart",
        &format!(
            "pg_ctl restart -m fast and stop/start under load (8 clients): first new order \
             {restart_recovery:?} after the restart returned, {outage_recovery:?} after the \
             server was started again; records due during the outage tombstoned \
             {cleanup_resumed:?} after that\n{}",
            verdict.figures()
        ),
    );
    verdict.assert_clean();
    assert!(verdict.outcome("503 database-unavailable") > 0);
}

/// Fault 3a: the cleaner's backend terminated while its batch waits on a held row. The run
/// fails (counted), the batch rolls back whole, the daemon stays up, and the next fire
/// completes the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminating_the_cleaners_backend_mid_batch_fails_one_run_and_the_next_completes() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "term", 500, DUE).await;
    let held = nth_live(&observer, 260).await;
    let (reader, _) = Reader::lock(&db, &held, "FOR SHARE").await;
    let mut daemon = Daemon::start(
        DaemonSpec::new(&db.url)
            .set("cleanup", "batch_size", "50")
            .set("cleanup", "lock_timeout", "\"60s\"")
            .set("cleanup", "statement_timeout", "\"120s\""),
    )
    .await;
    wait_until_cleaner_waits(&observer).await;
    let terminated: bool = observer
        .query_one(
            "SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE application_name = 'tombstoned/cleanup' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    until("the run is counted as failed", BOUND, || async {
        daemon
            .metric("tombstoned_cleanup_runs_total{outcome=\"failed\"}")
            .await
            >= 1.0
    })
    .await;
    assert_eq!(counts(&observer).await, (250, 250), "5 whole batches");
    reader.commit().await;
    until("the next fire completes the work", BOUND, || async {
        counts(&observer).await == (500, 0)
    })
    .await;
    assert!(daemon.alive());
    assert!(daemon.terminate().await.success());
}

/// Fault 3b: API backends terminated while claims wait inside their transactions, five times
/// under load. Those claims answer 503 outcome-unknown (the COMMIT had been sent), the pool
/// replaces the dead sessions, retries settle every key exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminating_api_backends_mid_claim_is_503_outcome_unknown_and_retries_settle() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let mut daemon = Daemon::start(DaemonSpec::new(&db.url)).await;
    let load = Background::start(&daemon, 8, Mix::simple(), "tb");
    let mut terminated = 0_i64;
    for round in 0..5 {
        until("claims flow", BOUND, || async {
            load.count(|e| is_status(e, 201, "")) >= 50 * (round + 1)
        })
        .await;
        let locker = db.client().await;
        locker
            .batch_execute("BEGIN; LOCK TABLE orders IN SHARE MODE")
            .await
            .unwrap();
        wait_until_sessions_wait(&observer, "tombstoned/api", 2).await;
        let n: i64 = observer
            .query_one(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE application_name = 'tombstoned/api' AND datname = current_database()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        terminated += n;
        locker.batch_execute("COMMIT").await.unwrap();
    }
    until("claims flow again", BOUND, || async {
        load.count(|e| is_status(e, 201, "")) >= 300
    })
    .await;
    let (ledger, pool, api) = load.stop().await;
    load::settle(&api, &ledger, &pool, Duration::from_secs(60)).await;
    assert!(daemon.terminate().await.success());
    let state = DbState::load(&observer).await;
    let verdict = ledger::check(&ledger, &state, CheckOptions::default());
    crate::publish_figures(
        "fault-terminate-api",
        &format!(
            "pg_terminate_backend on API sessions, 5 rounds under load (8 clients), {terminated} \
             sessions terminated\n{}",
            verdict.figures()
        ),
    );
    verdict.assert_clean();
    assert!(
        verdict.outcome("503 outcome-unknown") > 0,
        "{}",
        verdict.figures()
    );
}

/// Fault 5: a replay reader holds `FOR SHARE` on one record for far longer than
/// `cleanup.lock_timeout` while 5,000 rows are due. The daemon's runs tombstone the other
/// 4,999 (one lock timeout, then the held row is passed over) while the reader still holds its
/// lock, the held row keeps its body until the reader is done, and the next run after that
/// tombstones it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replay_reader_holding_for_share_past_lock_timeout_does_not_stop_the_rest() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "held", 5000, DUE).await;
    let held = nth_live(&observer, 2500).await;
    let (reader, body) = Reader::lock(&db, &held, "FOR SHARE").await;
    let locked_at = Instant::now();
    let monitor = Monitor::start(
        connect(&db.url, "monitor").await,
        Duration::from_millis(200),
    );
    let mut daemon = Daemon::start(
        DaemonSpec::new(&db.url)
            .set("cleanup", "schedule", "\"*/2 * * * * *\"")
            .set("cleanup", "batch_size", "500")
            .set("cleanup", "lock_timeout", "\"1s\""),
    )
    .await;
    let took = until(
        "everything but the held row is tombstoned",
        BOUND,
        || async { counts(&observer).await == (4999, 1) },
    )
    .await;
    // Keep holding until the lock has been held ten lock_timeouts, with runs firing every 2 s,
    // and at least one more run has met the held row meanwhile.
    let runs = || async {
        let metrics = daemon.metrics().await;
        ["success", "partial", "failed"]
            .iter()
            .map(|o| {
                sample(
                    &metrics,
                    &format!("tombstoned_cleanup_runs_total{{outcome=\"{o}\"}}"),
                )
            })
            .sum::<f64>()
    };
    let runs_before = runs().await;
    while locked_at.elapsed() < Duration::from_secs(10) || runs().await <= runs_before {
        assert!(
            locked_at.elapsed() < Duration::from_secs(10) + BOUND,
            "no cleanup run fired while the row was held"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(counts(&observer).await, (4999, 1));
    let now: Option<String> = observer
        .query_one(
            "SELECT response_body::text FROM idempotency_cards
             WHERE (tenant_id, principal_id, operation, idempotency_key) = ($1, $2, $3, $4)",
            &[
                &held.tenant_id,
                &held.principal_id,
                &held.operation,
                &held.idempotency_key,
            ],
        )
        .await
        .unwrap()
        .get(0);
    assert!(body.is_some());
    assert_eq!(now, body, "the held record keeps its body while it is read");
    let metrics = daemon.metrics().await;
    let timeouts = sample(&metrics, "tombstoned_cleanup_lock_timeouts_total");
    assert!(timeouts >= 1.0, "{metrics}");
    reader.commit().await;
    until(
        "the next run tombstones the released row",
        BOUND,
        || async { counts(&observer).await == (5000, 0) },
    )
    .await;
    assert!(daemon.terminate().await.success());
    let monitor = monitor.stop().await;
    assert!(monitor.violations.is_empty(), "{:?}", monitor.violations);
    // It watched the whole time: a snapshot every 200 ms for more than 10 s, none failed.
    assert!(
        monitor.failed_snapshots.is_empty(),
        "{:?}",
        monitor.failed_snapshots
    );
    assert!(monitor.snapshots >= 10, "{} snapshots", monitor.snapshots);
    crate::publish_figures(
        "fault-held-row",
        &format!(
            "FOR SHARE held {:?} (lock_timeout 1 s) on 1 of 5000 due rows: the other 4999 \
             tombstoned {took:?} after the daemon started; lock timeouts counted: {timeouts}; \
             the held row tombstoned by the first run after its release\n",
            locked_at.elapsed()
        ),
    );
}

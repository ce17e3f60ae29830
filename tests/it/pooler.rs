//! tombstoned through a real PgBouncer (Debian's 1.18, which keeps no prepared statements in
//! transaction mode), once in session mode and once in transaction mode, with two server
//! connections per database so that clients share them: the API's claim/replay/conflict
//! scenarios, a cleanup run, a dry run, readiness and the outbox relay; afterwards no setting,
//! prepared statement or advisory lock is left on any server connection. Also: `migrate`
//! refuses a transaction pooler in one line, a transaction pooler configured as
//! `pooler = "none"` is named in the error, two daemons through the transaction pooler never
//! clean at the same time (the lease row), and a run of four cleanup workers shares the
//! transaction pooler's two server connections; and, on a cluster of its own, that claims
//! through the transaction pooler run the fused statement inside its function (V6), planned a
//! few times per server connection, not per request. The daemon connects through PgBouncer; the
//! tests' observer sessions connect directly.

use std::future::Future;
use std::pin::Pin;

use futures::future::join_all;
use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::{self, RunLimits};
use tombstoned::config::Config;
use tombstoned::ops::readiness::{Readiness, ReadinessProbe};
use tombstoned::outbox::Relay;
use tombstoned::schema::migrations::{self, MigrationError};

use crate::api::{
    scenario_after_tombstoning, scenario_create, scenario_duplicate_request_id,
    scenario_key_reused, scenario_reads, scenario_replay,
};
use crate::api_support::{order, TestApi, ALICE, BOB};
use crate::daemon_support::{self, Daemon, Spec};
use crate::harness::{config_for, TestDb};
use crate::outbox_support::{secret_file, Receiver};
use crate::pooler_support::{PgBouncer, PoolMode};

/// Server connections per database in transaction mode: fewer than the API's concurrent
/// claims, so clients share them.
const TRANSACTION_POOL_SIZE: u32 = 2;

/// In session mode each client keeps its server connection: room for the API's pool (8 here),
/// the readiness and relay sessions.
const SESSION_POOL_SIZE: u32 = 16;

/// The API's `database.pool_size` in these tests.
const API_POOL_SIZE: &str = "8";

fn pool_size(mode: PoolMode) -> u32 {
    match mode {
        PoolMode::Session => SESSION_POOL_SIZE,
        PoolMode::Transaction => TRANSACTION_POOL_SIZE,
    }
}

/// The configuration of `db` reached through `bouncer`, with `pooler` set and `env` on top.
fn through(bouncer: &PgBouncer, db: &TestDb, pooler: &str, env: &[(&str, &str)]) -> Config {
    let url = bouncer.url(&db.name);
    let mut vars = vec![
        ("TOMBSTONED_DATABASE_URL", url.as_str()),
        ("TOMBSTONED_DATABASE__POOLER", pooler),
        ("TOMBSTONED_DATABASE__POOL_SIZE", API_POOL_SIZE),
    ];
    vars.extend_from_slice(env);
    config_for(&db.url, &vars)
}

/// An in-process API server on a fresh database, connected through `bouncer`.
async fn api_through(bouncer: &PgBouncer, mode: PoolMode) -> TestApi {
    let db = TestDb::new().await;
    let url = bouncer.url(&db.name);
    TestApi::start_on(
        db,
        &[
            ("TOMBSTONED_DATABASE_URL", &url),
            ("TOMBSTONED_DATABASE__POOLER", mode.setting()),
            ("TOMBSTONED_DATABASE__POOL_SIZE", API_POOL_SIZE),
        ],
    )
    .await
}

type Scenario = for<'a> fn(&'a TestApi) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

/// The API test scenarios (tests/it/api.rs) this suite runs through the pooler.
fn scenarios() -> Vec<(&'static str, Scenario)> {
    vec![
        ("create", |api| Box::pin(scenario_create(api))),
        ("replay", |api| Box::pin(scenario_replay(api))),
        ("key reused", |api| Box::pin(scenario_key_reused(api))),
        ("duplicate request id", |api| {
            Box::pin(scenario_duplicate_request_id(api))
        }),
        ("reads", |api| Box::pin(scenario_reads(api))),
        ("after tombstoning", |api| {
            Box::pin(scenario_after_tombstoning(api))
        }),
    ]
}

/// The API scenarios, concurrent claims, a dry run, a cleanup run, readiness and the relay,
/// all through `bouncer`.
async fn suite(bouncer: &PgBouncer, mode: PoolMode) {
    for (name, scenario) in scenarios() {
        let api = api_through(bouncer, mode).await;
        eprintln!("pooler {mode:?}: scenario {name}");
        scenario(&api).await;
        api.stop().await;
    }

    // Concurrent claims (more than the pool's server connections): new keys, and one key
    // claimed by many requests at once.
    let api = api_through(bouncer, mode).await;
    let fresh = join_all((0..12).map(|i| {
        let api = &api;
        async move {
            api.post(
                BOB,
                &format!("burst-{i}"),
                &order(&format!("burst-req-{i}")),
            )
            .await
        }
    }))
    .await;
    for r in &fresh {
        r.expect(201);
    }
    let body = order("one-req");
    let same = join_all((0..8).map(|_| api.post(ALICE, "one-key", &body))).await;
    let mut order_ids = Vec::new();
    for r in &same {
        match r.status {
            201 => order_ids.push(r.json()["order_id"].as_str().unwrap().to_owned()),
            // Another request with the key was still in flight: retry later, nothing done.
            409 => assert_eq!(r.problem(), "request-in-progress", "{}", r.text),
            other => panic!("unexpected {other}: {}", r.text),
        }
    }
    order_ids.dedup();
    assert_eq!(order_ids.len(), 1, "one order for one key: {order_ids:?}");
    assert_eq!(api.counts().await, (13, 13, 13));

    // Everything claimed is due now: a dry run, a cleanup run (several batches), the relay.
    let observer = api.db.client().await;
    observer
        .execute(
            "UPDATE idempotency_records SET replay_deadline = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let config = through(
        bouncer,
        &api.db,
        mode.setting(),
        &[("TOMBSTONED_CLEANUP__BATCH_SIZE", "4")],
    );
    let preview = cleanup::dry_run(&config.database, &config.cleanup, true)
        .await
        .unwrap_or_else(|e| panic!("dry run through {mode:?}: {}", e.summary()));
    assert_eq!(preview.rows_due, 13);
    assert!(preview
        .plan
        .is_some_and(|p| p.contains("idempotency_records")));
    let never = CancellationToken::new();
    let report = cleanup::run_once(
        &config.database,
        &config.cleanup,
        &config.retention,
        RunLimits::default(),
        &never,
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("cleanup through {mode:?}: {}", e.summary()));
    assert_eq!(report.rows_tombstoned, 13);
    assert!(report.batches >= 4, "{report:?}");
    assert_eq!(report.backlog_rows, 0);
    let tombstones: i64 = observer
        .query_one(
            "SELECT count(*) FROM idempotency_records WHERE expired",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tombstones, 13);

    let probe = ReadinessProbe::new(config.database.clone());
    assert_eq!(probe.check().await, Readiness::Ready);

    let receiver = Receiver::start(&api.db).await;
    let (_secret_dir, secret) = secret_file();
    let secret = secret.display().to_string();
    let relay_config = through(
        bouncer,
        &api.db,
        mode.setting(),
        &[
            ("TOMBSTONED_OUTBOX__ENDPOINT", &receiver.url),
            ("TOMBSTONED_OUTBOX__SECRET_FILE", &secret),
        ],
    );
    let relay = Relay::new(
        &relay_config.database,
        &relay_config.outbox,
        "outbox-deliver",
        None,
    )
    .unwrap();
    let delivered = relay
        .drain(None, &never)
        .await
        .unwrap_or_else(|e| panic!("relay through {mode:?}: {e}"));
    assert_eq!(
        (delivered.picked, delivered.delivered),
        (13, 13),
        "{delivered:?}"
    );
    assert_eq!(receiver.stats().requests, 13);
    drop(relay);
    drop(probe);
    api.stop().await;
}

/// No setting, prepared statement (transaction mode) or advisory lock left behind.
async fn assert_nothing_left(bouncer: &PgBouncer, mode: PoolMode, db: &TestDb) {
    let states = bouncer.server_connection_state(&db.name).await;
    let mut pids: Vec<i32> = states.iter().map(|s| s.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(
        pids.len(),
        bouncer.pool_size as usize,
        "every server connection seen: {states:?}"
    );
    for state in &states {
        assert!(state.is_clean(), "{mode:?}: a setting was left: {state:?}");
        if mode == PoolMode::Transaction {
            assert_eq!(
                state.prepared_statements, 0,
                "a named statement outlived its transaction: {state:?}"
            );
        }
    }
    let observer = db.client().await;
    let locks: i64 = observer
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND a.datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(locks, 0, "an advisory lock was left");
}

async fn run_mode(mode: PoolMode) {
    let bouncer = PgBouncer::start(mode, pool_size(mode)).await;
    suite(&bouncer, mode).await;

    // The daemon itself through the pooler: it starts (schema check), /readyz is 200, a claim
    // and its replay work; then nothing is left on the server connections.
    let db = TestDb::new().await;
    let daemon = Daemon::start(
        Spec::new(&bouncer.url(&db.name))
            .env("TOMBSTONED_DATABASE__POOLER", mode.setting())
            .env("TOMBSTONED_DATABASE__POOL_SIZE", API_POOL_SIZE),
    )
    .await;
    daemon.ops_get("/readyz").await.expect(200);
    let first = daemon
        .create_order(daemon_support::ALICE, "daemon-key", &order("daemon-req"))
        .await;
    first.expect(201);
    let again = daemon
        .create_order(daemon_support::ALICE, "daemon-key", &order("daemon-req"))
        .await;
    again.expect(201);
    assert!(again.replayed());
    assert_eq!(again.text, first.text);
    if mode == PoolMode::Session {
        // Its sessions keep their server connections until they close.
        daemon.signal(nix::sys::signal::Signal::SIGTERM);
        let mut daemon = daemon;
        assert!(daemon.wait_exit(daemon_support::PATIENCE).await.success());
        assert_nothing_left(&bouncer, mode, &db).await;
    } else {
        // Checked while the daemon runs: between transactions it holds no server connection.
        assert_nothing_left(&bouncer, mode, &db).await;
        drop(daemon);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_works_through_pgbouncer_in_session_mode() {
    run_mode(PoolMode::Session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_works_through_pgbouncer_in_transaction_mode() {
    run_mode(PoolMode::Transaction).await;
}

#[tokio::test]
async fn migrate_refuses_a_transaction_pooler_in_one_line() {
    let db = TestDb::new().await;
    let config = config_for(&db.url, &[("TOMBSTONED_DATABASE__POOLER", "transaction")]);
    let error = migrations::migrate(&config.database).await.unwrap_err();
    assert!(
        matches!(error, MigrationError::TransactionPooler),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(!text.contains('\n'), "{text}");
    assert!(
        text.contains("directly") && text.contains("session-mode pooler"),
        "{text}"
    );
}

/// `pooler = "none"` in front of a transaction pooler: the API's named statements, prepared on
/// one server connection, are run on another. The error names `database.pooler`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_pooler_configured_as_none_is_named_in_the_error() {
    let bouncer = PgBouncer::start(PoolMode::Transaction, TRANSACTION_POOL_SIZE).await;
    let db = TestDb::new().await;
    let daemon =
        Daemon::start(Spec::new(&bouncer.url(&db.name)).env("TOMBSTONED_DATABASE__POOLER", "none"))
            .await;
    // Server connection 1 held by an open transaction: the daemon's first claim prepares its
    // statements on connection 2.
    let holder1 = bouncer.client(&db.name).await;
    holder1.simple_query("BEGIN; SELECT 1").await.unwrap();
    daemon
        .create_order(daemon_support::ALICE, "k1", &order("r1"))
        .await
        .expect(201);
    // Now connection 2 is held and 1 free: the next claim runs its named statements on 1.
    let holder2 = bouncer.client(&db.name).await;
    holder2.simple_query("BEGIN; SELECT 1").await.unwrap();
    holder1.simple_query("ROLLBACK").await.unwrap();
    let failed = daemon
        .create_order(daemon_support::ALICE, "k2", &order("r2"))
        .await;
    assert!(failed.status >= 500, "{}: {}", failed.status, failed.text);
    let line = daemon.wait_for_log(&["database.pooler"]).await;
    assert!(
        line.contains("26000") || line.contains("transaction"),
        "{line}"
    );
    holder2.simple_query("ROLLBACK").await.unwrap();
}

/// Two `serve` daemons, both through the transaction pooler (two server connections shared by
/// everything), each firing its cleaner every second with runs of up to 1.5 s: they never clean
/// at the same time. Observed from the run history both write (no two recorded runs overlap)
/// and from their metrics (some fires found the lease taken); the rows every run reports add up
/// to the tombstones in the table, and the lease is free after both stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_through_the_transaction_pooler_never_clean_at_the_same_time() {
    let bouncer = PgBouncer::start(PoolMode::Transaction, TRANSACTION_POOL_SIZE).await;
    let db = TestDb::new().await;
    let observer = db.client().await;
    crate::cleanup_support::seed_live(&observer, "pair", 3000, crate::cleanup_support::DUE).await;
    let spec = || {
        Spec::new(&bouncer.url(&db.name))
            .env("TOMBSTONED_DATABASE__POOLER", "transaction")
            .env("TOMBSTONED_DATABASE__POOL_SIZE", "4")
            .env("TOMBSTONED_CLEANUP__SCHEDULE", "* * * * * *")
            .env("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")
            .env("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "20ms")
            .env("TOMBSTONED_CLEANUP__MAX_RUN_TIME", "1500ms")
    };
    let mut first = Daemon::start(spec()).await;
    let mut second = Daemon::start(spec()).await;

    // Barrier on the history itself: wait until six runs are recorded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let recorded: i64 = observer
            .query_one("SELECT count(*) FROM tombstoned.cleanup_runs", &[])
            .await
            .unwrap()
            .get(0);
        if recorded >= 6 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {recorded} runs recorded\n{}\n{}",
            first.log(),
            second.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let skipped_series = "tombstoned_cleanup_runs_total{outcome=\"skipped_lease\"}";
    let skipped = first.metric(skipped_series).await.unwrap_or(0.0)
        + second.metric(skipped_series).await.unwrap_or(0.0);
    for daemon in [&mut first, &mut second] {
        daemon.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(daemon
            .wait_exit(std::time::Duration::from_secs(30))
            .await
            .success());
    }

    let runs = cleanup::RecordedRun::recent(
        &tombstoned::db::Conn::dedicated(&observer, "tombstoned", tombstoned::db::Pooler::None),
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
    // `<host>:<pid>:<run token>`: the processes that cleaned.
    let daemons: std::collections::HashSet<_> = runs
        .iter()
        .filter_map(|r| {
            r.instance
                .rsplit_once(':')
                .map(|(process, _)| process.to_owned())
        })
        .collect();
    let recorded: i64 = runs.iter().map(|r| r.rows_tombstoned).sum();
    let (tombstones, _) = crate::cleanup_support::counts(&observer).await;
    assert_eq!(recorded, tombstones);
    crate::cleanup_support::assert_lease_free(&observer).await;
    // Runs of 1.5 s fired every second by two daemons: some fires found the lease taken.
    assert!(skipped >= 1.0, "no fire was ever skipped");
    println!(
        "two daemons through PgBouncer (transaction mode, {TRANSACTION_POOL_SIZE} server \
         connections): {} runs by {} daemons, none overlapping, {skipped} fires skipped for the \
         lease, {tombstones} rows tombstoned",
        runs.len(),
        daemons.len()
    );
}

/// Parallel cleanup (`cleanup.workers = 4`) through a transaction pooler with two server
/// connections: five client sessions (the run's and four workers') share them, every due row is
/// tombstoned once, the lease is taken, checked and released, and nothing is left on a server
/// connection.
#[tokio::test]
async fn parallel_cleanup_through_a_transaction_pooler_leaves_nothing_behind() {
    let mode = PoolMode::Transaction;
    let bouncer = PgBouncer::start(mode, pool_size(mode)).await;
    let db = TestDb::new().await;
    let observer = db.client().await;
    crate::cleanup_support::seed_live(&observer, "par", 200, crate::cleanup_support::DUE).await;
    let config = through(
        &bouncer,
        &db,
        mode.setting(),
        &[
            ("TOMBSTONED_CLEANUP__WORKERS", "4"),
            ("TOMBSTONED_CLEANUP__BATCH_SIZE", "10"),
        ],
    );
    let preview = cleanup::dry_run(&config.database, &config.cleanup, false)
        .await
        .unwrap_or_else(|e| panic!("dry run: {}", e.summary()));
    assert_eq!(preview.worker_slices.len(), 4);
    let report = crate::cleanup_support::leased_report(&config).await;
    assert_eq!((report.workers, report.rows_tombstoned), (4, 200));
    assert_eq!(report.backlog_rows, 0);
    assert_eq!(crate::cleanup_support::counts(&observer).await, (200, 0));
    crate::cleanup_support::assert_lease_free(&observer).await;
    assert_nothing_left(&bouncer, mode, &db).await;
}

/// Whether the server binaries in `bin_dir` come with `library` (Debian's do with
/// pg_stat_statements; a bundled build may not).
fn has_library(bin_dir: &std::path::Path, library: &str) -> bool {
    let file = format!("{library}.so");
    bin_dir.parent().is_some_and(|root| {
        [root.join("lib"), root.join("lib/postgresql")]
            .iter()
            .any(|dir| dir.join(&file).is_file())
    })
}

/// Through PgBouncer in transaction mode the daemon's claims run the fused statement inside its
/// function (V6), whose plan PL/pgSQL keeps for the server connection: on a cluster of this test's
/// own (`track_functions = 'pl'`, and pg_stat_statements tracking nested statements with their
/// planning when the server has it), after claims, replays and a stored rejection through two
/// server connections, every owner attempt is one call of `endpoint_claim_order` (or
/// `endpoint_claim_rejected`), the daemon never sent the fused text itself, and the fused text
/// was planned far fewer times than it ran. Without pg_stat_statements the test fails: `.ci/run`
/// provides it on both PostgreSQL versions. Counts are read after the server connections closed
/// (their backends flush their statistics when they exit), behind a barrier on
/// `pg_stat_activity`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_through_the_transaction_pooler_run_the_fused_statement_planned_once_per_connection()
{
    use tombstoned::pg_cluster::{find_bin_dir, ClusterOptions, ThrowawayCluster};
    use tombstoned_testkit::cluster::ClusterOptionsTestExt as _;

    let bin_dir = find_bin_dir().unwrap_or_else(|e| panic!("server binaries: {e}"));
    assert!(
        has_library(&bin_dir, "pg_stat_statements"),
        "the server binaries in {} come without pg_stat_statements, which this test reads the \
         planning counts from (Debian: postgresql-contrib; .ci/run checks both versions have it)",
        bin_dir.display()
    );
    let options = ClusterOptions::for_tests()
        .set("track_functions", "pl")
        .set("shared_preload_libraries", "pg_stat_statements")
        .set("pg_stat_statements.track", "all")
        .set("pg_stat_statements.track_planning", "on");
    let cluster = tokio::task::spawn_blocking(move || ThrowawayCluster::start(&options))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    let server: tokio_postgres::Config = cluster.url("postgres").parse().unwrap();
    let connect = |dbname: &str| {
        let url = cluster.url(dbname);
        async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(async move {
                let _ = connection.await;
            });
            client
        }
    };
    let admin = connect("postgres").await;
    admin.batch_execute("CREATE DATABASE pooled").await.unwrap();
    admin
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .unwrap();
    migrations::migrate(&config_for(&cluster.url("pooled"), &[]).database)
        .await
        .unwrap();
    // The migration's CREATE FUNCTION statements hold the fused text too.
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    let observer = connect("pooled").await;

    let mode = PoolMode::Transaction;
    let bouncer = PgBouncer::start_for(&server, Some(&cluster), mode, TRANSACTION_POOL_SIZE)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let daemon = Daemon::start(
        Spec::new(&bouncer.url("pooled"))
            .env("TOMBSTONED_DATABASE__POOLER", mode.setting())
            .env("TOMBSTONED_DATABASE__POOL_SIZE", API_POOL_SIZE),
    )
    .await;
    const CLAIMS: usize = 40;
    const REPLAYS: usize = 10;
    for i in 0..CLAIMS {
        daemon
            .create_order(
                daemon_support::ALICE,
                &format!("fn-{i}"),
                &order(&format!("fn-req-{i}")),
            )
            .await
            .expect(201);
    }
    for i in 0..REPLAYS {
        let again = daemon
            .create_order(
                daemon_support::ALICE,
                &format!("fn-{i}"),
                &order(&format!("fn-req-{i}")),
            )
            .await;
        again.expect(201);
        assert!(again.replayed());
    }
    let mut big = order("fn-big");
    big["amount"] = serde_json::json!("5000.01");
    for _ in 0..2 {
        daemon
            .create_order(daemon_support::ALICE, "fn-big", &big)
            .await
            .expect(422);
    }
    // Its server connections close: their backends exit and flush their statistics.
    drop(daemon);
    drop(bouncer);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let others: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if others == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{others} backends still on the database"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }

    let calls = |function: &'static str| {
        let observer = &observer;
        async move {
            observer
                .query_opt(
                    "SELECT calls FROM pg_stat_user_functions WHERE funcname = $1",
                    &[&function],
                )
                .await
                .unwrap()
                .map_or(0, |row| row.get::<_, i64>(0))
        }
    };
    // Every owner attempt: the scope's first claim (answered "no scope yet", then claimed
    // again), the claims, the replays (answered by the same statement), the rejection and its
    // replay.
    let order_calls = calls("endpoint_claim_order").await;
    assert_eq!(order_calls, (1 + CLAIMS + REPLAYS) as i64);
    assert_eq!(calls("endpoint_claim_rejected").await, 2);

    let fused = |toplevel: bool| {
        let admin = &admin;
        async move {
            admin
                .query_one(
                    "SELECT coalesce(sum(calls), 0)::int8, coalesce(sum(plans), 0)::int8
                     FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                     WHERE d.datname = 'pooled' AND s.toplevel = $1
                       AND s.query LIKE '%ON CONFLICT (scope_id, idempotency_key) DO NOTHING%'
                       AND s.query LIKE '%new_order AS%'",
                    &[&toplevel],
                )
                .await
                .unwrap()
        }
    };
    let sent = fused(true).await;
    assert_eq!(
        sent.get::<_, i64>(0),
        0,
        "the daemon sent the fused statement itself"
    );
    let nested = fused(false).await;
    let (runs, plans): (i64, i64) = (nested.get(0), nested.get(1));
    assert_eq!(runs, order_calls, "the fused statement ran once per call");
    println!(
        "through PgBouncer ({TRANSACTION_POOL_SIZE} server connections): the fused statement ran \
         {runs} times inside endpoint_claim_order and was planned {plans} times"
    );
    assert!(
        plans * 2 < runs,
        "planned {plans} times for {runs} runs: not kept per server connection"
    );
}

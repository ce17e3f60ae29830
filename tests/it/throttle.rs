//! The cleaner's throttles against a real PostgreSQL (issue 12, "Replicas"): the rate cap
//! spreads a run over the time its rows must take; a wait ends at shutdown and at
//! `max_run_time`, and renews the lease when long; `cleanup.max_replica_lag` is refused, once and
//! in one clear line, for a role that cannot see the standbys' replay positions; everything works
//! through a transaction-mode pooler; and (issue 12, test 4) with a primary and a streaming
//! standby whose replay is paused, a run waits — holding no transaction — and finishes once
//! replay resumes, while without the setting it does not wait.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::{self, RunLimits, StopReason};
use tombstoned::metrics::Metrics;

use crate::cleanup_support::{counts, lease_state, leased_report, seed_live, DUE};
use crate::harness::{binary, server, TestDb};

fn throttled(metrics: &Metrics, reason: &str) -> f64 {
    metrics
        .cleanup_throttled_seconds
        .with_label_values(&[reason])
        .get()
}

#[tokio::test]
async fn the_rate_cap_spreads_a_run_over_the_time_its_rows_must_take() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", 300, DUE).await;
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "50"),
        ("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "100"),
    ]);
    let metrics = Metrics::new().unwrap();
    let began = Instant::now();
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
    let took = began.elapsed();
    assert_eq!(report.rows_tombstoned, 300);
    assert_eq!(report.batches, 6);
    assert_eq!(report.stopped_by, StopReason::Finished);
    // 300 rows at 100 rows/s: at least 3 s whatever the batches took (the pace is kept from the
    // first batch's start, the final empty batch waits too); the upper bound is for a loaded
    // machine, not a measurement.
    assert!(report.duration >= Duration::from_secs(3), "{report:?}");
    assert!(took < Duration::from_secs(3 + 45), "{took:?}");
    // Spread between the batches, as the database saw them commit: the sixth batch may begin
    // only once the first 250 rows are paid for (2.5 s after the first began; the margin is for
    // the first batch's BEGIN reaching the server after the pace started). Unthrottled, six
    // batches of 50 take a fraction of a second.
    let spread: f64 = client
        .query_one(
            "SELECT extract(epoch FROM max(expired_at) - min(expired_at))::float8,
                    count(DISTINCT expired_at)
             FROM idempotency_records WHERE expired",
            &[],
        )
        .await
        .map(|row| {
            assert_eq!(row.get::<_, i64>(1), 6, "one expired_at per batch");
            row.get(0)
        })
        .unwrap();
    assert!(spread >= 2.0, "batches committed within {spread} s");
    // The waits are counted as they happen, under reason="rate" only.
    let rate = throttled(&metrics, "rate");
    assert!(rate > 0.0, "{rate}");
    assert!(
        (rate - report.throttled_rate.as_secs_f64()).abs() < 1e-6,
        "{rate} vs {report:?}"
    );
    assert_eq!(throttled(&metrics, "replica_lag"), 0.0);
    assert_eq!(report.throttled_replica_lag, Duration::ZERO);
    assert_eq!(report.stopped_while_waiting_for, None);
}

/// A throttle's wait ends at once on shutdown, and at `cleanup.max_run_time`, and the report
/// says what the run was waiting for.
#[tokio::test]
async fn a_wait_is_cut_short_by_shutdown_and_by_max_run_time() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", 200, DUE).await;
    // After its first batch of 50 the run owes 50 s at 1 row/s.
    let slow = [
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "50"),
        ("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "1"),
    ];
    let config = db.config_with(&slow);
    let metrics = std::sync::Arc::new(Metrics::new().unwrap());
    let shutdown = CancellationToken::new();
    let run = {
        let (metrics, shutdown) = (metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            cleanup::run_once(
                &config.database,
                &config.cleanup,
                &config.retention,
                RunLimits::default(),
                &shutdown,
                Some(&metrics),
            )
            .await
        })
    };
    wait_for("the run waits", Duration::from_secs(60), || {
        throttled(&metrics, "rate") > 0.0
    })
    .await;
    let stopped_at = Instant::now();
    shutdown.cancel();
    let report = run.await.unwrap().unwrap();
    assert!(stopped_at.elapsed() < Duration::from_secs(10), "{report:?}");
    assert_eq!(report.stopped_by, StopReason::Shutdown);
    assert_eq!(
        report.stopped_while_waiting_for,
        Some(cleanup::ThrottleReason::Rate)
    );
    assert_eq!(report.rows_tombstoned, 50);
    assert_eq!(report.backlog_rows, 150);

    // max_run_time ends the wait too: a 2 s run instead of the 50 s the rows would owe.
    let config = db.config_with(&[slow[0], slow[1], ("TOMBSTONED_CLEANUP__MAX_RUN_TIME", "2s")]);
    let began = Instant::now();
    let report = crate::cleanup_support::run(&config).await;
    assert!(began.elapsed() >= Duration::from_secs(2), "{report:?}");
    assert!(began.elapsed() < Duration::from_secs(2 + 30), "{report:?}");
    assert_eq!(report.stopped_by, StopReason::MaxRunTime);
    assert_eq!(
        report.stopped_while_waiting_for,
        Some(cleanup::ThrottleReason::Rate)
    );
    assert_eq!(report.rows_tombstoned, 50);
}

/// A wait longer than a third of the lease renews it, without a batch: a throttled run never
/// loses its lease to waiting. The lease lasts 2 x 1 s + 30 s = 32 s here; the rate cap makes the
/// run wait ~16.7 s after its first batch of 50 rows (3 rows/s), so the renewal at ~10.7 s is
/// the wait's, not a batch's (the second batch starts at ~16.7 s).
#[tokio::test]
async fn a_long_wait_renews_the_lease_between_batches() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    seed_live(&observer, "due", 60, DUE).await;
    let config = db.config_with(&[
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "50"),
        ("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "3"),
        ("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "1s"),
        ("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "500ms"),
    ]);
    assert_eq!(cleanup::lease_ttl(&config.cleanup), Duration::from_secs(32));
    let run = tokio::spawn(async move { leased_report(&config).await });
    // Barrier: the lease renewed 10 s or more after it was taken.
    let deadline = Instant::now() + Duration::from_secs(60);
    let renewed_after = loop {
        if let Some(lease) = lease_state(&observer).await {
            let after = (lease.renewed_at - lease.acquired_at)
                .to_std()
                .unwrap_or_default();
            if after >= Duration::from_secs(10) {
                break after;
            }
        }
        assert!(Instant::now() < deadline, "no renewal during the wait");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        renewed_after < Duration::from_secs(16),
        "renewed {renewed_after:?} after the take: by the second batch, not during the wait"
    );
    let report = run.await.unwrap();
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert_eq!(report.rows_tombstoned, 60);
    assert!(
        report.throttled_rate >= Duration::from_secs(10),
        "{report:?}"
    );
}

/// Runs the binary with `args` against `url`, with extra `TOMBSTONED_*` variables; logs at warn,
/// so stderr holds what the edge prints.
async fn tombstoned(args: &[&str], url: &str, env: &[(&str, &str)]) -> Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut vars: Vec<(String, String)> = vec![
        ("TOMBSTONED_DATABASE_URL".into(), url.to_owned()),
        ("RUST_LOG".into(), "warn".into()),
    ];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            Command::new(binary())
                .args(&args)
                .env_clear()
                .envs(vars)
                .output()
                .unwrap()
        }),
    )
    .await
    .expect("the command ends")
    .unwrap()
}

/// The test database's connection string, as `role` (the throwaway cluster trusts local
/// connections).
fn url_as(db: &TestDb, role: &str) -> String {
    let mut config = server().clone();
    config.user(role);
    tombstoned_testkit::cluster::conninfo_for_database(&config, &db.name)
}

#[tokio::test]
async fn max_replica_lag_is_refused_once_for_a_role_that_cannot_see_the_lag() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    seed_live(&admin, "due", 20, DUE).await;
    // A role that can read and write every table but not other sessions' statistics.
    let role = format!("blind_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT pg_read_all_data, pg_write_all_data TO {role}"
        ))
        .await
        .unwrap();
    let url = url_as(&db, &role);
    let lag = [("TOMBSTONED_CLEANUP__MAX_REPLICA_LAG", "64MB")];

    for (command, extra) in [
        (vec!["cleanup"], vec![]),
        (
            vec!["serve"],
            vec![
                ("TOMBSTONED_API__ENABLED", "false"),
                ("TOMBSTONED_METRICS__LISTEN", "127.0.0.1:0"),
            ],
        ),
    ] {
        let env: Vec<(&str, &str)> = lag.iter().copied().chain(extra).collect();
        let output = tombstoned(&command, &url, &env).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(64), "{command:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{command:?}: said once, in one line:\n{stderr}"
        );
        for needle in [
            "tombstoned: error: ",
            "cleanup.max_replica_lag is set, but role",
            "pg_read_all_stats",
            &format!("GRANT pg_monitor TO \"{role}\""),
        ] {
            assert!(
                lines[0].contains(needle),
                "{command:?}: {needle:?} in {stderr}"
            );
        }
    }
    assert_eq!(counts(&admin).await, (0, 20), "nothing was cleaned");

    // Without the setting the same role cleans, and its dry run says it cannot see the lag.
    let config = crate::harness::config_for(&url, &[]);
    let dry = cleanup::dry_run(&config.database, &config.cleanup, false)
        .await
        .unwrap();
    assert!(!dry.replicas.lag.visible);
    assert_eq!(dry.replicas.lag.role, role);
    let output = tombstoned(&["cleanup", "--dry-run"], &url, &[]).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("replay lag not visible to role \"{role}\"")),
        "{stdout}"
    );

    // Granted pg_monitor, the setting is accepted and the run cleans (no standby: no wait).
    admin
        .batch_execute(&format!("GRANT pg_monitor TO {role}"))
        .await
        .unwrap();
    let config = crate::harness::config_for(&url, &lag);
    cleanup::check_replica_lag_visible(&config.database, &config.cleanup)
        .await
        .unwrap();
    let output = tombstoned(&["cleanup", "--json"], &url, &lag).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["rows_tombstoned"], 20, "{report}");
    assert_eq!(report["throttled_replica_lag_seconds"], 0.0, "{report}");
    assert_eq!(report["stopped_while_waiting_for"], serde_json::Value::Null);
    assert_eq!(counts(&admin).await, (20, 0));

    // The role is cluster-wide; leave none behind.
    drop(admin);
    let cluster_admin = server().connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(cluster_admin.1);
    let _ = cluster_admin
        .0
        .batch_execute(&format!(
            "DROP OWNED BY {role}; REVOKE pg_read_all_data, pg_write_all_data, pg_monitor \
             FROM {role}; DROP ROLE {role}"
        ))
        .await;
}

async fn connect(config: &tokio_postgres::Config) -> tokio_postgres::Client {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// Polls until `done` holds, every 50 ms; panics after `within`.
async fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Bytes the standby's replay lags behind the primary's insert position, read on the primary.
async fn lag_bytes(primary: &tokio_postgres::Client) -> i64 {
    primary
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), replay_lsn)::bigint
             FROM pg_stat_replication",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Issue 12, test 4: a primary and a streaming standby whose replay is paused. A run with
/// `cleanup.max_replica_lag` commits a batch, then waits — the throttled metric rises while the
/// database shows no further batch commit — and finishes once replay resumes; a run that meets
/// `max_run_time` while waiting says so (report and history); without the setting the same
/// kind of run does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waits_while_a_paused_standby_lags_and_finishes_once_it_replays() {
    use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
    use tombstoned_testkit::cluster::ClusterOptionsTestExt as _;
    use tombstoned_testkit::standby::{Replication, Standby, StandbyOptions};

    // A primary of its own: the shared cluster's other tests must not see this standby.
    let primary =
        tokio::task::spawn_blocking(|| ThrowawayCluster::start(&ClusterOptions::for_tests()))
            .await
            .unwrap()
            .unwrap();
    let standby = Standby::start(&primary, &StandbyOptions::new(Replication::Asynchronous))
        .await
        .unwrap();
    let admin = connect(&primary.url("postgres").parse().unwrap()).await;
    admin.batch_execute("CREATE DATABASE app").await.unwrap();
    let url = primary.url("app");
    tombstoned::schema::migrations::migrate(&crate::harness::config_for(&url, &[]).database)
        .await
        .unwrap();
    let mut app: tokio_postgres::Config = url.parse().unwrap();
    app.options("-c search_path=tombstoned");
    let client = connect(&app).await;
    const ROWS: i64 = 2000;
    const LIMIT: i64 = 64 << 10;
    let with_limit = [
        ("TOMBSTONED_CLEANUP__BATCH_SIZE", "500"),
        ("TOMBSTONED_CLEANUP__MAX_REPLICA_LAG", "64kB"),
    ];
    let pause_with_due_rows = |tag: &'static str| {
        let (client, admin, standby) = (&client, &admin, &standby);
        async move {
            seed_live(client, tag, ROWS, DUE).await;
            standby
                .catch_up(admin, Duration::from_secs(60))
                .await
                .unwrap();
            standby.pause_replay().await.unwrap();
        }
    };

    // 1. The run waits after its first batch, and goes on once replay resumes.
    pause_with_due_rows("first").await;
    let config = crate::harness::config_for(&url, &with_limit);
    let metrics = std::sync::Arc::new(Metrics::new().unwrap());
    let run = {
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
    // Barrier: the run is waiting once the metric has counted a wait.
    wait_for(
        "the run waits for the standby",
        Duration::from_secs(60),
        || throttled(&metrics, "replica_lag") > 0.0,
    )
    .await;
    let (tombstones, _) = counts(&client).await;
    assert!(tombstones > 0 && tombstones < ROWS, "{tombstones}");
    let seen = metrics
        .replica_lag_bytes
        .with_label_values(&[standby.application_name()])
        .get();
    assert!(seen > LIMIT, "the gauge shows the lag: {seen}");
    // Still waiting a second (two more polls) later, and no batch committed meanwhile; the
    // run's session holds no transaction open while it waits (each poll is a transaction of
    // microseconds; one held across the wait would be seen older than a second).
    let waited = throttled(&metrics, "replica_lag");
    let mut oldest_transaction = 0.0f64;
    while throttled(&metrics, "replica_lag") < waited + 1.5 {
        let row = admin
            .query_one(
                "SELECT count(*), max(extract(epoch FROM clock_timestamp() - xact_start))::float8
                 FROM pg_stat_activity WHERE application_name = 'tombstoned/cleanup'",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), 1, "the run's session");
        let age: Option<f64> = row.get(1);
        oldest_transaction = oldest_transaction.max(age.unwrap_or(0.0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        oldest_transaction < 1.0,
        "a transaction stayed open {oldest_transaction} s during the wait"
    );
    assert_eq!(counts(&client).await.0, tombstones, "no batch while over");
    assert!(!run.is_finished());
    assert!(lag_bytes(&admin).await > LIMIT);

    standby.resume_replay().await.unwrap();
    let report = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the run finishes once the standby replays")
        .unwrap()
        .unwrap();
    assert_eq!(report.rows_tombstoned, ROWS as u64);
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert_eq!(report.stopped_while_waiting_for, None);
    assert!(
        report.throttled_replica_lag >= Duration::from_secs(1),
        "{report:?}"
    );
    assert_eq!(counts(&client).await, (ROWS, 0));

    // 2. A run that reaches max_run_time while waiting ends with stopped_by = replica_lag, in
    // its report and in the run history.
    pause_with_due_rows("second").await;
    let short = crate::harness::config_for(
        &url,
        &[
            with_limit[0],
            with_limit[1],
            ("TOMBSTONED_CLEANUP__MAX_RUN_TIME", "3s"),
        ],
    );
    let began = Instant::now();
    let report = leased_report(&short).await;
    assert!(began.elapsed() >= Duration::from_secs(3));
    assert!(began.elapsed() < Duration::from_secs(3 + 45));
    assert_eq!(report.stopped_by, StopReason::ReplicaLag, "{report:?}");
    assert_eq!(
        report.stopped_while_waiting_for,
        Some(cleanup::ThrottleReason::ReplicaLag)
    );
    assert_eq!(report.outcome, cleanup::RunOutcome::Partial);
    assert!(report.rows_tombstoned < ROWS as u64);
    assert_eq!(report.backlog_rows, ROWS as u64 - report.rows_tombstoned);
    let recorded: Option<String> = client
        .query_one(
            "SELECT stopped_by FROM cleanup_runs ORDER BY run_id DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded.as_deref(), Some("replica_lag"));

    // The dry run shows the standby's lag, and that a run would wait for it.
    let dry = cleanup::dry_run(&short.database, &short.cleanup, false)
        .await
        .unwrap();
    assert!(dry.replicas.lag.visible);
    assert_eq!(dry.replicas.max_replica_lag_bytes, Some(LIMIT as u64));
    assert!(dry.replicas.would_wait);
    let [seen] = dry.replicas.lag.standbys.as_slice() else {
        panic!("{:?}", dry.replicas)
    };
    assert_eq!(seen.application_name, standby.application_name());
    assert!(seen.lag_bytes.is_some_and(|b| b > LIMIT as u64), "{seen:?}");

    // 3. Without the setting the same run does not wait: the standby is still paused and far
    // behind when it has finished.
    let plain = crate::harness::config_for(&url, &with_limit[..1]);
    let metrics = Metrics::new().unwrap();
    let report = cleanup::run_once(
        &plain.database,
        &plain.cleanup,
        &plain.retention,
        RunLimits::default(),
        &CancellationToken::new(),
        Some(&metrics),
    )
    .await
    .unwrap();
    assert_eq!(counts(&client).await, (2 * ROWS, 0));
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert_eq!(report.throttled_replica_lag, Duration::ZERO);
    assert_eq!(throttled(&metrics, "replica_lag"), 0.0);
    assert!(
        lag_bytes(&admin).await > LIMIT,
        "the standby was still behind"
    );
    standby.resume_replay().await.unwrap();
}

/// Through a transaction-mode PgBouncer (two server connections, shared): the start-up check,
/// every lag poll, the rate waits and the lease work, and no setting or prepared statement is
/// left on a server connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_throttles_work_through_a_transaction_pooler() {
    use crate::pooler_support::{PgBouncer, PoolMode};
    let bouncer = PgBouncer::start(PoolMode::Transaction, 2).await;
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", 100, DUE).await;
    let url = bouncer.url(&db.name);
    let config = crate::harness::config_for(
        &url,
        &[
            ("TOMBSTONED_DATABASE__POOLER", "transaction"),
            ("TOMBSTONED_CLEANUP__BATCH_SIZE", "20"),
            ("TOMBSTONED_CLEANUP__MAX_REPLICA_LAG", "64MB"),
            ("TOMBSTONED_CLEANUP__MAX_ROWS_PER_SECOND", "200"),
        ],
    );
    cleanup::check_replica_lag_visible(&config.database, &config.cleanup)
        .await
        .unwrap();
    let report = leased_report(&config).await;
    assert_eq!(report.rows_tombstoned, 100);
    assert_eq!(report.stopped_by, StopReason::Finished);
    assert!(report.duration >= Duration::from_millis(500), "{report:?}");
    assert!(report.throttled_rate > Duration::ZERO, "{report:?}");
    assert_eq!(
        report.throttled_replica_lag,
        Duration::ZERO,
        "no standby here"
    );
    for state in bouncer.server_connection_state(&db.name).await {
        assert!(state.is_clean(), "{state:?}");
    }
}

//! The metrics and health listener over real HTTP, against real PostgreSQL: `/readyz` follows
//! the database and the schema, concurrent probes share one check and one session, `/metrics`
//! is valid Prometheus text (checked by the real `promtool`) with the pool's connections.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tombstoned::db;
use tombstoned::metrics::Metrics;
use tombstoned::ops::listener::{OpsState, METRICS_CONTENT_TYPE};
use tombstoned::ops::readiness::ReadinessProbe;
use tombstoned::schema::migrations;

use crate::harness::{self, TestDb};
use crate::ops_support::{free_port, fresh_probe, get, prometheus_tool, RunningOps};

#[tokio::test]
async fn readyz_follows_the_schema_pending_then_current_then_unknown_to_this_binary() {
    let db = TestDb::empty().await;
    let config = db.config();
    let ops = RunningOps::start(OpsState::new(
        Arc::new(Metrics::new().unwrap()),
        fresh_probe(&config.database),
    ))
    .await;

    let (status, content_type, body) = get(&ops.url("/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(content_type, "text/plain; charset=utf-8");
    assert!(
        body.starts_with("not ready: schema not current: ") && body.contains("pending"),
        "{body}"
    );
    assert_eq!(body.lines().count(), 1, "one line: {body:?}");

    migrations::migrate(&config.database).await.unwrap();
    assert_eq!(
        get(&ops.url("/readyz")).await,
        (200, "text/plain; charset=utf-8".into(), "ready\n".into())
    );

    // A newer binary migrated the database further: this one is not ready for it.
    db.client()
        .await
        .execute(
            "INSERT INTO schema_history (version, name, applied_on, checksum) \
             VALUES ($1, $2, $3, $4)",
            &[&999_i32, &"from_the_future", &"2030-01-01T00:00:00Z", &"1"],
        )
        .await
        .unwrap();
    let (status, _, body) = get(&ops.url("/readyz")).await;
    assert_eq!(status, 503);
    assert!(body.contains("V999__from_the_future"), "{body}");

    // /healthz does not depend on the database.
    assert_eq!(get(&ops.url("/healthz")).await.0, 200);
    ops.stop().await.unwrap();
}

#[tokio::test]
async fn readyz_is_503_when_the_database_is_unreachable_and_healthz_stays_200() {
    let url = format!(
        "host=127.0.0.1 port={} user=nobody dbname=nothing",
        free_port()
    );
    let config = harness::config_for(&url, &[]);
    let ops = RunningOps::start(OpsState::new(
        Arc::new(Metrics::new().unwrap()),
        fresh_probe(&config.database),
    ))
    .await;

    let (status, _, body) = get(&ops.url("/readyz")).await;
    assert_eq!(status, 503);
    assert!(
        body.starts_with("not ready: database unreachable: "),
        "{body}"
    );
    assert_eq!(body.lines().count(), 1, "{body:?}");

    assert_eq!(
        get(&ops.url("/healthz")).await,
        (200, "text/plain; charset=utf-8".into(), "ok\n".into())
    );
    assert_eq!(get(&ops.url("/nothing-here")).await.0, 404);
    ops.stop().await.unwrap();
}

/// A readiness check stuck behind a lock (the schema history table locked ACCESS EXCLUSIVE by
/// the test, the check observed waiting in `pg_stat_activity`): 32 concurrent probes must not
/// open 32 sessions or queue 32 checks. They share one check on one session and all answer
/// within about one timeout.
#[tokio::test]
async fn concurrent_probes_share_one_check_on_one_session() {
    let db = TestDb::new().await;
    let config = db.config();
    // Long enough for the observer below to see the check wait on a loaded machine.
    let timeout = Duration::from_secs(4);
    let probe = Arc::new(
        ReadinessProbe::new(config.database.clone())
            .with_timeout(timeout)
            .with_max_age(Duration::from_secs(1)),
    );
    let ops = RunningOps::start(OpsState::new(Arc::new(Metrics::new().unwrap()), probe)).await;
    let observer = db.client().await;
    let readiness_sessions = || async {
        observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND application_name = 'tombstoned/readiness'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };

    let locker = db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE schema_history IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();

    let started = Instant::now();
    let probes: Vec<_> = (0..32)
        .map(|_| tokio::spawn(get_owned(ops.url("/readyz"))))
        .collect();
    harness::wait_until_app_lock_wait(&observer, "tombstoned/readiness", Duration::from_secs(10))
        .await;
    let mut most_sessions = 0;
    while !probes.iter().all(|p| p.is_finished()) {
        most_sessions = most_sessions.max(readiness_sessions().await);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "probes did not finish"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    for probe in probes {
        let (status, _, body) = probe.await.unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(body.starts_with("not ready: database "), "{body}");
    }
    assert_eq!(most_sessions, 1, "probes opened extra sessions");
    // Queued checks would take 32 x 4 s. Shared, they take one timeout, plus at most a second
    // for a probe that a loaded machine delivers after the first result aged out (max_age 1 s).
    assert!(
        elapsed < timeout * 3,
        "32 probes took {elapsed:?}: checks were queued, not shared"
    );

    locker.batch_execute("ROLLBACK").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&ops.url("/readyz")).await.0 != 200 {
        assert!(
            Instant::now() < deadline,
            "never ready after the lock was released"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(readiness_sessions().await, 1);
    ops.stop().await.unwrap();
}

async fn get_owned(url: String) -> (u16, String, String) {
    get(&url).await
}

#[tokio::test]
async fn readyz_is_503_once_shutdown_begins_and_the_listener_stops_on_cancel() {
    let db = TestDb::new().await;
    let probe = fresh_probe(&db.config().database);
    let ops = RunningOps::start(OpsState::new(
        Arc::new(Metrics::new().unwrap()),
        probe.clone(),
    ))
    .await;
    assert_eq!(get(&ops.url("/readyz")).await.0, 200);
    assert!(probe.last_ready_age().unwrap() < Duration::from_secs(10));

    probe.mark_shutting_down();
    assert_eq!(
        get(&ops.url("/readyz")).await,
        (
            503,
            "text/plain; charset=utf-8".into(),
            "not ready: shutting down\n".into()
        )
    );

    // A scraper keeps its connection open between scrapes; shutdown must not wait for it.
    let keep_alive = reqwest::Client::new();
    let response = keep_alive.get(ops.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();

    let addr = ops.addr;
    ops.stop().await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
}

/// `/metrics` answers in the Prometheus text format, reports the registered pool's connections,
/// and its real output passes `promtool check metrics` (the exposition linter).
#[tokio::test]
async fn metrics_are_valid_prometheus_text_with_pool_connections() {
    let promtool = prometheus_tool("promtool"); // first: a missing tool fails here, with advice
    let db = TestDb::new().await;
    let config = db.config();
    let metrics = Arc::new(Metrics::new().unwrap());
    let pool = db::pool(&config.database, "api", 4, Duration::from_secs(5)).unwrap();
    let held = pool.get().await.unwrap();
    let ops = RunningOps::start(
        OpsState::new(metrics.clone(), fresh_probe(&config.database)).with_pool(pool.clone()),
    )
    .await;
    metrics.cleanup_rows_tombstoned.inc_by(3);
    metrics.db_error("55");

    let (status, content_type, body) = get(&ops.url("/metrics")).await;
    assert_eq!(status, 200);
    assert_eq!(content_type, METRICS_CONTENT_TYPE);
    assert_eq!(content_type, "text/plain; version=0.0.4");
    for line in [
        "tombstoned_db_pool_connections{state=\"in_use\"} 1",
        "tombstoned_db_pool_connections{state=\"idle\"} 0",
        "tombstoned_db_pool_connections{state=\"max\"} 4",
        "tombstoned_cleanup_rows_tombstoned_total 3",
        "tombstoned_db_errors_total{sqlstate_class=\"55\"} 1",
    ] {
        assert!(body.lines().any(|l| l == line), "missing {line}:\n{body}");
    }
    assert!(body.contains("tombstoned_build_info{version=\""), "{body}");
    assert!(body.contains("process_resident_memory_bytes "), "{body}");

    // Returned to the pool: the next scrape says so.
    drop(held);
    let (_, _, body) = get(&ops.url("/metrics")).await;
    assert!(body
        .lines()
        .any(|l| l == "tombstoned_db_pool_connections{state=\"idle\"} 1"));

    promtool_check_metrics(&promtool, &body).await;
    ops.stop().await.unwrap();
}

async fn promtool_check_metrics(promtool: &std::path::Path, exposition: &str) {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run promtool");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(exposition.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("promtool finished")
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && report.trim().is_empty(),
        "promtool check metrics ({}):\n{report}",
        output.status
    );
}

/// The refresher keeps `last_ready_age` current without any `/readyz` traffic (what the
/// watchdog's health function reads), and stops on shutdown.
#[tokio::test]
async fn the_refresher_keeps_readiness_current_without_probes() {
    let db = TestDb::new().await;
    let probe = Arc::new(ReadinessProbe::new(db.config().database));
    assert_eq!(probe.last_ready_age(), None);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let task = probe.spawn_refresh(Duration::from_millis(50), shutdown.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while probe.last_ready_age().is_none() {
        assert!(Instant::now() < deadline, "the refresher never checked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the refresher stops on shutdown")
        .unwrap();
}

//! The real `tombstoned serve` as systemd and an operator see it: the sd_notify sequence on a
//! real datagram socket, the watchdog through a database outage (a cluster of the test's own),
//! SIGTERM during a cleanup run and during an in-flight claim, a second signal, SIGHUP reloads
//! (good and bad), and the log formats. Every wait polls what the daemon or PostgreSQL reports;
//! none sleeps hoping something happened.

use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use serde_json::Value;
use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned::schema::migrations;
use tombstoned_testkit::cluster::{ClusterOptionsTestExt as _, ClusterTestExt as _};

use crate::api_support::order;
use crate::cleanup_support::{counts, seed_live, wait_until_gone, wait_until_sessions_wait, DUE};
use crate::daemon_support::{
    killed_by, until_ready, Daemon, Message, NotifySocket, Spec, ALICE, BOB, PATIENCE,
};
use crate::harness::{binary, config_for, TestDb};

/// When the daemon sent each `WATCHDOG=1` (the kernel's receive timestamps: a stall of this test
/// process does not move them).
fn pings(messages: &[Message]) -> Vec<SystemTime> {
    messages
        .iter()
        .filter(|m| m.has("WATCHDOG=1"))
        .map(|m| m.sent)
        .collect()
}

fn gaps(times: &[SystemTime]) -> Vec<Duration> {
    times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unwrap_or_default())
        .collect()
}

/// Polls `attempt` every 50 ms until it returns `Some`, failing after [`PATIENCE`].
async fn eventually<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn notify_sequence_ready_after_listeners_status_after_a_run_watchdog_reload_stopping() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", 25, DUE).await;
    let notify = NotifySocket::bind();
    let (name, path) = notify.env();
    // WATCHDOG_PID is left unset: systemd sets it to the main PID, which a test cannot know
    // before spawning; unset means "the watchdog is this process's" (sd_watchdog_enabled(3)).
    let mut daemon = Daemon::spawn(
        Spec::new(&db.url)
            .config("[cleanup]\nschedule = \"* * * * * *\"")
            .env(name, path)
            .env("WATCHDOG_USEC", "2000000"),
    )
    .await;

    let before_ready = until_ready(&mut daemon, &notify).await;
    // At the moment READY=1 arrives both listeners accept connections, and the database is
    // reachable with the current schema.
    for port in [daemon.api_port, daemon.ops_port] {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap_or_else(|e| panic!("port {port} refused a connection at READY=1: {e}"));
    }
    let ready = daemon.ops_get("/readyz").await;
    assert_eq!((ready.status, ready.text.as_str()), (200, "ready\n"));
    let alive = daemon.ops_get("/healthz").await;
    assert_eq!((alive.status, alive.text.as_str()), (200, "ok\n"));
    let ready_message = before_ready.last().unwrap();
    let ready_status = ready_message.value("STATUS").unwrap();
    assert!(
        ready_status.starts_with(&format!("api on 127.0.0.1:{}; cleanup ", daemon.api_port)),
        "{ready_status}"
    );
    assert!(!before_ready.iter().any(|m| m.has("STOPPING=1")));

    // STATUS= carries the last run's figures once the scheduler has run.
    let until_run = notify
        .until(PATIENCE, |m| {
            m.value("STATUS")
                .is_some_and(|s| s.contains("success: 25 tombstoned, 0 lock timeouts, backlog 0"))
        })
        .await;
    let status = until_run
        .last()
        .unwrap()
        .value("STATUS")
        .unwrap()
        .to_owned();
    assert!(status.contains("; last run "), "{status}");
    assert!(status.contains("; next "), "{status}");
    assert_eq!(counts(&client).await, (25, 0));

    // WATCHDOG=1 at about half of WATCHDOG_USEC while healthy, never a gap of the full timeout.
    let window = notify.collect(Duration::from_secs(6)).await;
    let pinged = pings(&window);
    let gaps = gaps(&pinged);
    assert!(
        pinged.len() >= 4,
        "{} pings in 6 s: {window:#?}",
        pinged.len()
    );
    let mut sorted = gaps.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    assert!(
        median >= Duration::from_millis(800) && median <= Duration::from_millis(1300),
        "median ping interval {median:?}; gaps {gaps:?}"
    );
    assert!(
        sorted.last().unwrap() < &Duration::from_secs(2),
        "a gap reached the watchdog timeout: {gaps:?}"
    );

    // SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1 again.
    daemon.signal(Signal::SIGHUP);
    let reload = notify.until(PATIENCE, |m| m.has("READY=1")).await;
    let reloading = reload
        .iter()
        .find(|m| m.has("RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1 before READY=1: {reload:#?}"));
    let monotonic: u64 = reloading.value("MONOTONIC_USEC").unwrap().parse().unwrap();
    assert!(monotonic > 0);

    // SIGTERM: STOPPING=1, then exit 0.
    daemon.signal(Signal::SIGTERM);
    let stopping = notify.until(PATIENCE, |m| m.has("STOPPING=1")).await;
    assert!(!stopping.iter().any(|m| m.has("READY=1")), "{stopping:#?}");
    let status = daemon.wait_exit(PATIENCE).await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    let after = notify.collect(Duration::from_millis(200)).await;
    assert!(!after.iter().any(|m| m.has("READY=1")), "{after:#?}");
}

#[tokio::test]
async fn watchdog_meant_for_another_process_is_not_pinged() {
    let db = TestDb::new().await;
    let notify = NotifySocket::bind();
    let (name, path) = notify.env();
    let mut daemon = Daemon::spawn(
        Spec::new(&db.url)
            .env(name, path)
            .env("WATCHDOG_USEC", "1000000")
            .env("WATCHDOG_PID", "1"), // not the daemon: sd_watchdog_enabled(3) says "not ours"
    )
    .await;
    until_ready(&mut daemon, &notify).await;
    let window = notify.collect(Duration::from_millis(2500)).await;
    assert!(pings(&window).is_empty(), "{window:#?}");
    daemon.stop().await;
}

#[tokio::test]
async fn no_ready_when_the_database_is_down_or_the_schema_is_pending() {
    // (schema.rs checks the exit status and message of a pending schema; this is systemd's view.)
    let pending = TestDb::empty().await;
    for url in [
        pending.url.as_str(),
        "postgresql://nobody@127.0.0.1:1/none", // nothing listens on port 1
    ] {
        let notify = NotifySocket::bind();
        let (name, path) = notify.env();
        let mut daemon = Daemon::spawn(
            Spec::new(url)
                .config("[database]\nconnect_timeout = \"2s\"")
                .env(name, path)
                .env("WATCHDOG_USEC", "1000000"),
        )
        .await;
        let status = daemon.wait_exit(PATIENCE).await;
        assert_eq!(status.code(), Some(69), "{url}: {}", daemon.log());
        let sent = notify.collect(Duration::from_millis(200)).await;
        assert!(
            !sent.iter().any(|m| m.has("READY=1")),
            "{url}: READY=1 sent: {sent:#?}"
        );
    }
}

#[tokio::test]
async fn watchdog_rides_out_a_short_database_outage_withholds_pings_in_a_long_one_and_resumes() {
    // A cluster of this test's own: the shared one must stay up for the other tests.
    let cluster = tokio::task::spawn_blocking(|| {
        ThrowawayCluster::start(&ClusterOptions::for_tests()).expect("start a throwaway cluster")
    })
    .await
    .unwrap();
    let url = cluster.url("postgres");
    migrations::migrate(&config_for(&url, &[]).database)
        .await
        .unwrap();
    let notify = NotifySocket::bind();
    let (name, path) = notify.env();
    // WatchdogSec=1s: pings every 0.5 s; the outage tolerance is 10 timeouts = 10 s.
    let mut daemon = Daemon::spawn(
        Spec::new(&url)
            .config("[database]\nconnect_timeout = \"1s\"")
            .env(name, path)
            .env("WATCHDOG_USEC", "1000000"),
    )
    .await;
    until_ready(&mut daemon, &notify).await;
    let healthy = pings(&notify.collect(Duration::from_secs(2)).await);
    assert!(healthy.len() >= 3, "{healthy:?}");

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.stop_server().unwrap();
        cluster
    })
    .await
    .unwrap();
    let down_at = Instant::now();

    // Pings go on for most of the tolerance, then stop: wait for a silence of 3 s (6 intervals).
    let mut last_ping = down_at;
    loop {
        match notify.recv(Duration::from_secs(3)).await {
            Some(m) if m.has("WATCHDOG=1") => last_ping = m.at,
            Some(_) => {}
            None => break,
        }
        assert!(
            down_at.elapsed() < Duration::from_secs(30),
            "pings never stopped during the outage:\n{}",
            daemon.log()
        );
    }
    let rode_out = last_ping - down_at;
    // The last good check was at most ~2 s before `down_at` (stop, refresh, cache); pings stop
    // 10 s after it. Shorter would mean the outage was not ridden out, longer that it never ends.
    assert!(
        rode_out >= Duration::from_secs(5) && rode_out <= Duration::from_secs(13),
        "pings stopped {rode_out:?} into the outage (tolerance 10 s)"
    );
    daemon
        .wait_for_log(&["the watchdog stops vouching", "database has not answered"])
        .await;
    // The process is alive and says why it is not ready.
    assert!(daemon.is_running());
    assert_eq!(daemon.ops_get("/healthz").await.status, 200);
    let readyz = daemon.ops_get("/readyz").await;
    assert_eq!(readyz.status, 503);
    assert!(
        readyz.text.starts_with("not ready: database"),
        "{}",
        readyz.text
    );

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.start_server().unwrap();
        cluster
    })
    .await
    .unwrap();
    let up_at = Instant::now();
    let resumed = notify
        .until(Duration::from_secs(10), |m| m.has("WATCHDOG=1"))
        .await;
    let resumed_after = resumed.last().unwrap().at - up_at;
    assert!(resumed_after < Duration::from_secs(5), "{resumed_after:?}");
    daemon.wait_for_log(&["watchdog pings resumed"]).await;

    daemon.stop().await;
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

#[tokio::test]
async fn sigterm_during_a_cleanup_run_commits_whole_batches_releases_the_lease_and_exits_0() {
    const ROWS: i64 = 2000;
    const BATCH: i64 = 50;
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", ROWS, DUE).await;
    // 40 batches with a 250 ms pause after each: a run of ten seconds, so the signal below comes
    // while it runs even on a loaded machine.
    let mut daemon = Daemon::start(
        Spec::new(&db.url)
            .config(&format!(
                "[cleanup]\nschedule = \"* * * * * *\"\nbatch_size = {BATCH}\n\
                 pause_between_batches = \"250ms\""
            ))
            .env("RUST_LOG", "info,tombstoned::cleanup=debug"),
    )
    .await;

    // In progress: the cleaner's session is connected and batches have committed.
    let (tombstones, _) = eventually("three batches committed", || async {
        let c = counts(&client).await;
        (c.0 >= 3 * BATCH).then_some(c)
    })
    .await;
    assert!(tombstones < ROWS);
    let cleaners: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = 'tombstoned/cleanup' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(cleaners, 1);

    let signalled = Instant::now();
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(PATIENCE).await;
    let stop_took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(stop_took < Duration::from_secs(5), "{stop_took:?}");

    // No half batch: every batch tombstones exactly BATCH rows here (all due, none locked).
    let (tombstones, live) = counts(&client).await;
    assert_eq!(tombstones + live, ROWS);
    assert_eq!(tombstones % BATCH, 0, "{tombstones} tombstones");
    assert!(tombstones < ROWS, "the run should have been cut short");

    // The lease is free, and its sessions are gone.
    assert!(
        !tombstoned::cleanup::LeaseState::read(&tombstoned::db::Conn::dedicated(
            &client,
            "tombstoned",
            tombstoned::db::Pooler::None
        ))
        .await
        .unwrap()
        .expect("the run took the lease row")
        .held,
        "the cleanup lease is still held after shutdown"
    );
    wait_until_gone(&client, "tombstoned/cleanup").await;
    let advisory: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database
             WHERE l.locktype = 'advisory' AND d.datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(advisory, 0);

    // Logs: one info line for the run with its figures; one debug line per committed batch.
    let log = daemon.log();
    let finished: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cleanup run finished"))
        .collect();
    assert_eq!(finished.len(), 1, "{log}");
    for figure in [
        "INFO",
        &format!("rows_tombstoned={tombstones}"),
        &format!("batches={}", tombstones / BATCH),
        "outcome=\"partial\"",
        "stopped_by=\"shutdown\"",
    ] {
        assert!(finished[0].contains(figure), "{figure}: {}", finished[0]);
    }
    let batch_lines = log
        .lines()
        .filter(|l| l.contains("batch committed"))
        .inspect(|l| assert!(l.contains("DEBUG"), "{l}"))
        .count();
    assert_eq!(
        i64::try_from(batch_lines).unwrap(),
        tombstones / BATCH,
        "{log}"
    );
    assert!(log.contains("tombstoned stopped"), "{log}");

    // A later run (the one-shot, which needs the lease) completes the rest.
    let url = db.url.clone();
    let later = tokio::task::spawn_blocking(move || {
        std::process::Command::new(binary())
            .arg("cleanup")
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", url)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&later.stdout);
    assert_eq!(
        later.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&later.stderr)
    );
    assert!(
        stdout.contains(&format!("rows tombstoned   {}", ROWS - tombstones)),
        "{stdout}"
    );
    assert_eq!(counts(&client).await, (ROWS, 0));
}

/// A daemon whose claim of `key` (a replay) waits on a row lock the returned session holds.
struct BlockedClaim {
    daemon: Daemon,
    holder: tokio_postgres::Client,
    observer: tokio_postgres::Client,
    request: tokio::task::JoinHandle<Result<crate::api_support::Reply, reqwest::Error>>,
    first_body: String,
    _db: TestDb,
}

async fn blocked_claim(key: &'static str) -> BlockedClaim {
    let db = TestDb::new().await;
    let daemon =
        Daemon::start(Spec::new(&db.url).config("[api]\nclaim_lock_timeout = \"60s\"")).await;
    let body = order(key);
    let first = daemon.create_order(ALICE, key, &body).await;
    first.expect(201);

    // The cleaner's lock on the record (FOR UPDATE) makes the replay's FOR SHARE wait.
    let holder = db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT 1 FROM idempotency_records WHERE idempotency_key = $1 FOR UPDATE",
            &[&key],
        )
        .await
        .unwrap();
    let http = daemon.http.clone();
    let url = format!("{}/v1/orders", daemon.api);
    let request = tokio::spawn(async move {
        let response = http
            .post(url)
            .bearer_auth(ALICE)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
            .await?;
        Ok(crate::api_support::TestApi::reply(response).await)
    });
    let observer = db.client().await;
    wait_until_sessions_wait(&observer, "tombstoned/api", 1).await;
    BlockedClaim {
        daemon,
        holder,
        observer,
        request,
        first_body: first.text,
        _db: db,
    }
}

/// Waits until the daemon reports shutdown on `/readyz` (the metrics listener closes last).
async fn wait_shutting_down(daemon: &Daemon) {
    eventually("/readyz says shutting down", || async {
        let r = daemon.ops_get("/readyz").await;
        (r.status == 503 && r.text == "not ready: shutting down\n").then_some(())
    })
    .await;
}

#[tokio::test]
async fn sigterm_drains_an_in_flight_claim_which_completes_with_its_answer_then_exit_0() {
    let BlockedClaim {
        mut daemon,
        holder,
        request,
        first_body,
        ..
    } = blocked_claim("drain-1").await;

    daemon.signal(Signal::SIGTERM);
    wait_shutting_down(&daemon).await;
    // Stopped accepting: new API connections are refused while the claim drains.
    eventually("the API listener closed", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", daemon.api_port))
            .await
            .is_err()
            .then_some(())
    })
    .await;
    assert!(daemon.is_running(), "exited before the claim finished");
    assert!(!request.is_finished());

    holder.batch_execute("COMMIT").await.unwrap();
    let answer = request
        .await
        .unwrap()
        .expect("the drained request gets its answer");
    answer.expect(201);
    assert!(answer.replayed());
    assert_eq!(answer.text, first_body);
    let status = daemon.wait_exit(PATIENCE).await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(daemon.log().contains("shutting down"));
}

#[tokio::test]
async fn a_second_signal_during_the_drain_exits_at_once_with_130() {
    let BlockedClaim {
        mut daemon,
        holder,
        observer,
        request,
        ..
    } = blocked_claim("drain-2").await;

    daemon.signal(Signal::SIGTERM);
    wait_shutting_down(&daemon).await;
    let second = Instant::now();
    daemon.signal(Signal::SIGINT);
    let status = daemon.wait_exit(PATIENCE).await;
    assert_eq!(status.code(), Some(130), "{}", daemon.log());
    assert_eq!(killed_by(status), None);
    assert!(
        second.elapsed() < Duration::from_secs(3),
        "{:?}",
        second.elapsed()
    );
    // The client got no answer. The claim's backend notices its client is gone only when its
    // lock wait ends; then it rolls back and ends.
    assert!(request.await.unwrap().is_err());
    holder.batch_execute("COMMIT").await.unwrap();
    wait_until_gone(&observer, "tombstoned/api").await;
    assert!(daemon.log().contains("second signal: exiting at once"));
}

#[tokio::test]
async fn sighup_reloads_tokens_and_cleanup_settings_and_an_invalid_file_keeps_the_old_ones() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "due", 30, DUE).await;
    let daemon = Daemon::start(
        Spec::new(&db.url)
            .config("[cleanup]\nenabled = false")
            .flag("--log-format")
            .flag("json")
            .env("RUST_LOG", "info"),
    )
    .await;
    let next_run = "tombstoned_cleanup_next_run_timestamp_seconds";
    assert_eq!(daemon.metric(next_run).await, Some(0.0));
    let body = order("hup-1");
    daemon.create_order(ALICE, "hup-1", &body).await.expect(201);
    assert!(daemon
        .create_order(ALICE, "hup-1", &body)
        .await
        .expect(201)
        .replayed());

    // Revoke alice's orders:create (her entry is the first in the example file), enable the
    // cleaner every second with batches of 7, and reload.
    let tokens = std::fs::read_to_string(&daemon.tokens_path).unwrap();
    let full = "permissions = [\"orders:create\", \"orders:read\"]";
    assert!(tokens.contains(full));
    std::fs::write(
        &daemon.tokens_path,
        tokens.replacen(full, "permissions = [\"orders:read\"]", 1),
    )
    .unwrap();
    daemon.rewrite_config("[cleanup]\nenabled = true\nschedule = \"* * * * * *\"\nbatch_size = 7");
    daemon.signal(Signal::SIGHUP);

    // Her replay is refused from now on: permissions are checked on every request.
    eventually("alice's replay refused", || async {
        let r = daemon.create_order(ALICE, "hup-1", &body).await;
        (r.status == 403).then(|| assert_eq!(r.problem(), "permission-denied"))
    })
    .await;
    // The schedule: the next run is due within a second or two.
    let next = eventually("a next run time", || async {
        daemon.metric(next_run).await.filter(|t| *t > 0.0)
    })
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        next > now - 5.0 && next < now + 5.0,
        "next {next}, now {now}"
    );
    // The batch size: 30 rows in batches of 7 are 5 batches, reported on the run's log line.
    let run_line = daemon
        .wait_for_log(&["cleanup run finished", "\"rows_tombstoned\":30"])
        .await;
    let run: Value = serde_json::from_str(&run_line).unwrap();
    assert_eq!(run["level"], "INFO");
    assert_eq!(run["batches"], 5, "{run_line}");
    assert_eq!(run["outcome"], "success");
    assert_eq!(counts(&client).await.0, 30);
    daemon
        .create_order(BOB, "hup-2", &order("hup-2"))
        .await
        .expect(201);

    // An invalid file: refused with the reason, the running configuration stays.
    daemon.write_raw_config("[cleanup]\nenabled = true\nschedule = \"every tuesday\"\n");
    daemon.signal(Signal::SIGHUP);
    let rejected = daemon
        .wait_for_log(&["configuration reload rejected"])
        .await;
    let rejected: Value = serde_json::from_str(&rejected).unwrap();
    assert_eq!(rejected["level"], "ERROR");
    assert!(
        rejected["error"]
            .as_str()
            .unwrap()
            .contains("cleanup.schedule"),
        "{rejected}"
    );
    // Still serving with the old settings: replays, tokens, readiness, and runs every second.
    let success = "tombstoned_cleanup_runs_total{outcome=\"success\"}";
    let runs = daemon.metric(success).await.unwrap();
    eventually("another scheduled run", || async {
        (daemon.metric(success).await.unwrap() > runs).then_some(())
    })
    .await;
    assert!(daemon
        .create_order(BOB, "hup-2", &order("hup-2"))
        .await
        .expect(201)
        .replayed());
    daemon
        .create_order(ALICE, "hup-3", &order("hup-3"))
        .await
        .expect(403);
    assert_eq!(daemon.ops_get("/readyz").await.status, 200);

    let mut daemon = daemon;
    daemon.stop().await;

    // Every line is a JSON object; batch detail stays below info; no secrets or keys.
    let log = daemon.log();
    for line in log.lines() {
        let entry: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(entry["timestamp"].is_string(), "{line}");
        assert!(entry["message"].is_string(), "{line}");
        assert_ne!(entry["level"], "DEBUG", "{line}");
    }
    assert!(!log.contains("batch committed"));
    for secret in [ALICE, BOB, "hup-1", "hup-2", "hup-3", "reader@example.com"] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
    }
}

//! Database faults that are not outages (issue 17 items 1-4 and 10, issue 12's failover
//! bullets): a database that goes silent (through [`SilentProxy`]), a read-only database, and
//! terminated backends — against the real API server, the real binary and real PostgreSQL.

use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::future::join_all;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tombstoned::config::DatabaseUrl;
use tombstoned::ops::readiness::{NotReady, Readiness, ReadinessProbe};

use crate::api_support::{order, Reply, TestApi, ALICE};
use crate::cleanup_support::seed_live;
use crate::harness::{binary, TestDb};
use crate::silent_proxy::SilentProxy;

fn upstream_port(db: &TestDb) -> u16 {
    *db.config()
        .database
        .url
        .pg_config()
        .get_ports()
        .first()
        .unwrap()
}

/// An API server whose pool reaches the database through a [`SilentProxy`], warmed up with
/// one order. `claim_lock_timeout = 1s`: a claim's deadline is 2 x 1 s + 3 s + 2 s = 7 s.
async fn api_through_proxy(pool_size: &str) -> (TestApi, SilentProxy) {
    let db = TestDb::new().await;
    let upstream = upstream_port(&db);
    let proxy = SilentProxy::start(upstream).await;
    let url = proxy.url(&db.url, upstream);
    let api = TestApi::start_custom(
        db,
        &[
            ("TOMBSTONED_DATABASE__POOL_SIZE", pool_size),
            ("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "2s"),
            ("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "1s"),
        ],
        |config| config.database.url = DatabaseUrl::parse(&url).unwrap(),
    )
    .await;
    api.post(ALICE, "warm", &order("req-warm"))
        .await
        .expect(201);
    (api, proxy)
}

fn assert_unavailable_503(reply: &Reply) {
    assert_eq!(reply.status, 503, "{reply:?}");
    assert!(reply.header("retry-after").is_some(), "{reply:?}");
}

/// Item 1: in-flight POSTs during a silent outage are answered within their deadline (503 with
/// Retry-After, or the outcome-unknown 503 when their COMMIT had been sent) instead of waiting
/// for the outage; after it, the pool reconnects and POSTs succeed, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn posts_in_flight_during_a_silent_outage_get_a_503_within_their_deadline() {
    let (api, proxy) = api_through_proxy("4").await;
    proxy.silence_all();
    let began = Instant::now();
    let replies = join_all((0..8).map(|i| {
        let (api, key) = (&api, format!("silent-{i}"));
        async move {
            api.post(ALICE, &key, &order(&format!("req-silent-{i}")))
                .await
        }
    }))
    .await;
    let took = began.elapsed();
    for reply in &replies {
        assert_unavailable_503(reply);
    }
    // Deadline 7 s, plus pool waits (connect_timeout 2 s per attempt) for the 4 that queued
    // behind the silent ones; a generous margin for a loaded machine. Before: 77 s.
    assert!(took < Duration::from_secs(25), "answered after {took:?}");
    println!("8 POSTs on a silent database: all 503 + Retry-After within {took:?}");

    proxy.resume();
    let healed = Instant::now();
    let mut last = None;
    while healed.elapsed() < Duration::from_secs(20) {
        let reply = api.post(ALICE, "after-silence", &order("req-after")).await;
        if reply.status == 201 {
            println!("first 201 after the outage in {:?}", healed.elapsed());
            return;
        }
        assert_ne!(reply.status, 500, "{reply:?}");
        last = Some(reply);
    }
    panic!("no 201 within 20 s of the outage's end: {last:?}");
}

/// Item 2: only the already-open connections go silent (new ones would work). The daemon heals:
/// timed-out connections are discarded with their idle siblings, POSTs succeed again within a
/// bound, and readiness (which checks a pooled connection) says not ready meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn when_only_open_connections_go_silent_the_pool_heals_and_readiness_tells() {
    let (api, proxy) = api_through_proxy("4").await;
    // The probe's own session goes straight to the database: what it must notice is the pool.
    let probe = ReadinessProbe::new(api.db.config().database.clone())
        .with_max_age(Duration::ZERO)
        .with_api(api.state.pool().clone(), api.state.health().clone());
    assert_eq!(probe.check().await, Readiness::Ready);

    // Requests alone heal the pool: the first to meet a silent connection times out (503) and
    // retires the idle ones; the next open fresh connections.
    open_pooled_connections(&api, "a").await;
    proxy.silence_open();
    let silenced = Instant::now();
    let mut statuses = Vec::new();
    let mut i = 0;
    let healed = loop {
        i += 1;
        let reply = api
            .post(
                ALICE,
                &format!("heal-{i}"),
                &order(&format!("req-heal-{i}")),
            )
            .await;
        assert_ne!(reply.status, 500, "{reply:?}");
        statuses.push(reply.status);
        if reply.status == 201 {
            break silenced.elapsed();
        }
        assert_unavailable_503(&reply);
        assert!(
            silenced.elapsed() < Duration::from_secs(40),
            "never healed: {statuses:?}"
        );
    };
    // Before: every POST 503 for 70 s+ while /readyz said 200.
    assert!(
        healed < Duration::from_secs(25),
        "healed after {healed:?}: {statuses:?}"
    );
    println!("open connections silenced: POSTs {statuses:?}, healed in {healed:?}");

    // Readiness notices a silent pool (not ready, with the reason) and heals it too.
    open_pooled_connections(&api, "b").await;
    proxy.silence_open();
    match probe.check().await {
        Readiness::NotReady(NotReady::PoolUnhealthy(reason)) => {
            println!("readiness while the pool is silent: {reason}")
        }
        other => panic!("expected not ready (pool), got {other:?}"),
    }
    assert_eq!(probe.check().await, Readiness::Ready);
    api.post(ALICE, "after-probe", &order("req-after-probe"))
        .await
        .expect(201);
}

/// Concurrent POSTs, so that several pooled connections are open.
async fn open_pooled_connections(api: &TestApi, tag: &str) {
    let replies = join_all((0..4).map(|i| {
        let key = format!("open-{tag}-{i}");
        async move { api.post(ALICE, &key, &order(&key)).await }
    }))
    .await;
    replies
        .iter()
        .for_each(|r| assert_eq!(r.status, 201, "{r:?}"));
}

/// `tombstoned cleanup` against `url` with tight bounds; stderr to a file.
fn cleanup_command(url: &str, stderr: &std::path::Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(binary());
    command
        .args(["cleanup", "--batch-size", "20"])
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", url)
        .env("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "2s")
        .env("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "1s")
        .env("TOMBSTONED_CLEANUP__STATEMENT_TIMEOUT", "3s")
        .env("TOMBSTONED_CLEANUP__PAUSE_BETWEEN_BATCHES", "100ms")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(stderr).unwrap())
        .kill_on_drop(true);
    command
}

/// Item 3: `tombstoned cleanup` silenced before it starts (the start-up exchange never
/// answers) and mid-run exits with 69 and a one-line error within its bounds; SIGTERM on a
/// silent database is obeyed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shot_cleanup_on_a_silent_database_ends_within_its_bounds() {
    let db = TestDb::new().await;
    let upstream = upstream_port(&db);
    let proxy = SilentProxy::start(upstream).await;
    let url = proxy.url(&db.url, upstream);
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr");

    // Before start: connect_timeout covers the whole handshake (2 s per attempt).
    proxy.silence_all();
    let began = Instant::now();
    let status = cleanup_command(&url, &stderr).status().await.unwrap();
    let took = began.elapsed();
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert_eq!(status.code(), Some(69), "{log}");
    assert_eq!(log.trim().lines().count(), 1, "{log}");
    assert!(took < Duration::from_secs(15), "{took:?}");
    println!(
        "cleanup, silent before start: exit 69 in {took:?}: {}",
        log.trim()
    );

    // SIGTERM while silent: obeyed at once, with the documented status (130), long before
    // connect_timeout (2 s) would end the run with 69 by itself. Signalled once the proxy has
    // accepted the command's connection, i.e. while it waits for the silent handshake.
    let accepted = proxy.accepted();
    let mut child = cleanup_command(&url, &stderr).spawn().unwrap();
    proxy
        .wait_past(SilentProxy::accepted, accepted, "cleanup never connected")
        .await;
    let signalled = Instant::now();
    kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("cleanup obeys SIGTERM on a silent database")
        .unwrap();
    let took = signalled.elapsed();
    let log = std::fs::read_to_string(&stderr).unwrap();
    println!(
        "cleanup, SIGTERM while silent: exit {:?} in {took:?}",
        status.code()
    );
    assert_eq!(status.code(), Some(130), "{status:?}: {log}");
    assert!(took < Duration::from_secs(1), "{took:?}: {log}");

    // Mid-run: a run over many small batches, silenced once it has committed some.
    proxy.resume();
    seed_live(&db.client().await, "silent", 20_000, "2020-01-01T00:00:00Z").await;
    let observer = db.client().await;
    let mut child = cleanup_command(&url, &stderr).spawn().unwrap();
    let started = Instant::now();
    loop {
        let done: i64 = observer
            .query_one(
                "SELECT count(*) FROM idempotency_records WHERE expired",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if done >= 100 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the run made no progress"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.silence_all();
    let silenced = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("cleanup ends on a silent database (before: still running 45 s later)")
        .unwrap();
    let took = silenced.elapsed();
    let log = std::fs::read_to_string(&stderr).unwrap();
    assert_eq!(status.code(), Some(69), "{log}");
    assert_eq!(log.trim().lines().count(), 1, "{log}");
    // statement_timeout 3 s + 2 s slack, plus the lease release's bound and a loaded machine.
    assert!(took < Duration::from_secs(15), "{took:?}");
    println!(
        "cleanup, silenced mid-run: exit 69 in {took:?}: {}",
        log.trim()
    );
}

/// Makes `db` read-only (or writable again) the way an operator would without a failover,
/// `default_transaction_read_only` — per database, since the cluster is shared by concurrent
/// tests — and terminates its other sessions (57P01), so the API's pooled connections die
/// under it and the new ones see the setting.
async fn set_read_only(db: &TestDb, admin: &tokio_postgres::Client, on: bool) {
    let setting = if on {
        "SET default_transaction_read_only = on"
    } else {
        "RESET default_transaction_read_only"
    };
    admin
        .batch_execute(&format!("ALTER DATABASE {} {setting}", db.name))
        .await
        .unwrap();
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
}

/// POSTs until the answer is not a 503 (a connection terminated under the pool answers 503
/// once, then is gone), at most `tries` times; never a 500.
async fn post_past_evictions(
    api: &TestApi,
    key: &str,
    body: &serde_json::Value,
    tries: usize,
) -> Reply {
    let mut reply = api.post(ALICE, key, body).await;
    for _ in 1..tries {
        assert_ne!(reply.status, 500, "{reply:?}");
        if reply.status != 503 {
            break;
        }
        assert_unavailable_503(&reply);
        reply = api.post(ALICE, key, body).await;
    }
    assert_ne!(reply.status, 500, "{reply:?}");
    reply
}

/// Item 10 and the failover bullets: a read-only database (the same 25006 a demoted primary
/// gives) answers new claims 503 + Retry-After, replays of committed keys with the stored
/// answer, byte for byte, and key reuse / expired keys 422 / 410; readiness says not ready.
/// Terminated backends (57P01) are evicted; after the flip back, claims succeed without a
/// restart. Before: every POST 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_refuses_claims_but_answers_replays_and_heals_after() {
    let api = TestApi::start_with(&[("TOMBSTONED_DATABASE__POOL_SIZE", "2")]).await;
    let admin = api.db.client().await;
    let first = api.post(ALICE, "ro-committed", &order("req-ro-1")).await;
    first.expect(201);
    api.post(ALICE, "ro-expired", &order("req-ro-2"))
        .await
        .expect(201);
    admin
        .execute(
            "UPDATE idempotency_records SET replay_deadline = now() - interval '1 second'
             WHERE idempotency_key = 'ro-expired'",
            &[],
        )
        .await
        .unwrap();
    let probe = ReadinessProbe::new(api.db.config().database.clone())
        .with_max_age(Duration::ZERO)
        .with_api(api.state.pool().clone(), api.state.health().clone());
    assert_eq!(probe.check().await, Readiness::Ready);

    set_read_only(&api.db, &admin, true).await;
    let replay = post_past_evictions(&api, "ro-committed", &order("req-ro-1"), 4).await;
    replay.expect(201);
    assert!(replay.replayed(), "{replay:?}");
    assert_eq!(
        replay.text, first.text,
        "the replay is byte for byte the first answer"
    );
    post_past_evictions(&api, "ro-committed", &order("req-ro-other"), 4)
        .await
        .expect(422);
    post_past_evictions(&api, "ro-expired", &order("req-ro-2"), 4)
        .await
        .expect(410);
    for i in 0..3 {
        let claim = api.post(ALICE, "ro-new", &order("req-ro-new")).await;
        assert_unavailable_503(&claim);
        if i == 2 {
            println!("read-only: new claim {} {}", claim.status, claim.text);
        }
    }
    match probe.check().await {
        Readiness::NotReady(reason @ NotReady::ReadOnly(_)) => println!("readiness: {reason}"),
        other => panic!("expected not ready (read-only), got {other:?}"),
    }

    set_read_only(&api.db, &admin, false).await;
    post_past_evictions(&api, "ro-new", &order("req-ro-new"), 4)
        .await
        .expect(201);
    assert_eq!(probe.check().await, Readiness::Ready);
}

/// Item 4: `serve` whose scheduled cleaner is stuck on a silent database finishes SIGTERM well
/// within the unit's `TimeoutStopSec=45s`. Before: still running 40 s after "draining".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_a_cleaner_stuck_on_a_silent_database_stops_within_its_bound() {
    use crate::daemon_support::{Daemon, Spec};
    let db = TestDb::new().await;
    let upstream = upstream_port(&db);
    let proxy = SilentProxy::start(upstream).await;
    seed_live(&db.client().await, "stuck", 50_000, "2020-01-01T00:00:00Z").await;
    let mut daemon = Daemon::start(Spec::new(&proxy.url(&db.url, upstream)).config(
        "[database]\nconnect_timeout = \"2s\"\n\
             [cleanup]\nschedule = \"* * * * * *\"\nbatch_size = 20\n\
             pause_between_batches = \"100ms\"\nstatement_timeout = \"30s\"\n",
    ))
    .await;
    let observer = db.client().await;
    let started = Instant::now();
    loop {
        let done: i64 = observer
            .query_one(
                "SELECT count(*) FROM idempotency_records WHERE expired",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if done >= 100 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no run started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stalled = proxy.stalled();
    proxy.silence_all();
    // The run's next batch (at most pause_between_batches away) is now held by the proxy.
    proxy
        .wait_past(
            SilentProxy::stalled,
            stalled,
            "nothing was sent to the silent database",
        )
        .await;
    let signalled = Instant::now();
    daemon.signal(Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(40)).await;
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "{}", daemon.log());
    assert!(took < Duration::from_secs(30), "{took:?}: {}", daemon.log());
    println!("serve, cleaner stuck on a silent database: SIGTERM done in {took:?}");
}

/// Item 2, the watchdog's side: a pool whose connections all hang (new ones too) is not ready,
/// and the probe stops vouching for the database (`last_ready_age` keeps growing, so the
/// watchdog stops petting after its tolerance) although its own session answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_hangs_is_not_ready_and_stops_vouching_to_the_watchdog() {
    let (api, proxy) = api_through_proxy("2").await;
    let probe = ReadinessProbe::new(api.db.config().database.clone())
        .with_max_age(Duration::ZERO)
        .with_api(api.state.pool().clone(), api.state.health().clone());
    assert_eq!(probe.check().await, Readiness::Ready);
    proxy.silence_all();
    let silenced = Instant::now();
    for _ in 0..3 {
        match probe.check().await {
            Readiness::NotReady(NotReady::PoolUnhealthy(reason)) => println!("hung pool: {reason}"),
            other => panic!("expected not ready (pool), got {other:?}"),
        }
    }
    let age = probe.last_ready_age().unwrap();
    assert!(
        age >= silenced.elapsed() - Duration::from_millis(50),
        "{age:?}"
    );
    proxy.resume();
    assert_eq!(probe.check().await, Readiness::Ready);
    assert!(probe.last_ready_age().unwrap() < Duration::from_secs(1));
}

//! Hostile or careless clients and database states that are not outages, against the real
//! daemon (issue 17 items 5-9; figures in RELIABILITY.md, "Round 2"):
//!
//! * 1,500 idle connections and half-sent requests are closed by the idle and header-read
//!   timeouts;
//! * under `RLIMIT_NOFILE` 1024 (systemd's default soft limit), 1,100 idle connections leave
//!   `POST` and `/readyz` answering, without an accept-error flood;
//! * SIGTERM with a half-sent request on each port exits within seconds;
//! * 64 clients retrying 4 locked keys do not starve unrelated requests of the pool;
//! * a full disk (a tmpfs tablespace) answers 503 with `Retry-After`, then recovers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::cleanup_support::wait_until_sessions_wait;
use crate::daemon::{connect, sample, Daemon, DaemonSpec, OwnCluster, ALICE, BOB};
use crate::harness::TestDb;
use crate::ledger::Reply;

/// A valid order body.
fn order(request_id: &str) -> String {
    serde_json::json!({
        "request_id": request_id,
        "amount": "12.50",
        "item": "book",
        "recipient": "reader@example.com",
    })
    .to_string()
}

/// `host:port` of an `http://host:port` base.
fn address(base: &str) -> String {
    base.trim_start_matches("http://").to_owned()
}

/// Opens `n` connections that send nothing.
async fn open_idle(addr: &str, n: usize) -> Vec<(TcpStream, Instant)> {
    let mut sockets = Vec::with_capacity(n);
    for _ in 0..n {
        let socket = TcpStream::connect(addr).await.expect("connect");
        sockets.push((socket, Instant::now()));
    }
    sockets
}

/// Opens a connection and sends the start of a request, never its end.
async fn half_sent(addr: &str, start: &str) -> (TcpStream, Instant) {
    let mut socket = TcpStream::connect(addr).await.expect("connect");
    socket.write_all(start.as_bytes()).await.unwrap();
    (socket, Instant::now())
}

/// Reads until the server closes the connection (EOF or reset); how long after `since` that was,
/// or `None` if it stayed open `within`. Returns what was read too.
async fn closed_after(
    mut socket: TcpStream,
    since: Instant,
    within: Duration,
) -> (Option<Duration>, Vec<u8>) {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = since + within;
    loop {
        match tokio::time::timeout_at(deadline.into(), socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (Some(since.elapsed()), received),
            Ok(Ok(n)) => received.extend_from_slice(&buf[..n]),
            Err(_) => return (None, received),
        }
    }
}

/// Watches every socket for its close, concurrently.
async fn close_times(
    sockets: Vec<(TcpStream, Instant)>,
    within: Duration,
) -> Vec<Option<Duration>> {
    let watchers: Vec<_> = sockets
        .into_iter()
        .map(|(s, since)| tokio::spawn(async move { closed_after(s, since, within).await.0 }))
        .collect();
    let mut times = Vec::with_capacity(watchers.len());
    for w in watchers {
        times.push(w.await.unwrap());
    }
    times
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A client without connection reuse and with a deadline of its own.
fn client(deadline: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(deadline)
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

async fn post(http: &reqwest::Client, api: &str, token: &str, key: &str, body: String) -> Reply {
    let response = http
        .post(format!("{api}/v1/orders"))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap_or_else(|e| panic!("POST {key}: {e}"));
    Reply::read(response).await.unwrap()
}

// ---- items 5 and 7: timeouts and a bounded shutdown ------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_are_closed_by_their_timeouts() {
    const IDLE: Duration = Duration::from_secs(4);
    const HEADER: Duration = Duration::from_secs(1);
    const MARGIN: Duration = Duration::from_secs(4); // the machine is shared and loaded
    let db = TestDb::new().await;
    let spec = DaemonSpec::new(&db.url)
        .set("api", "max_connections", "2000")
        .set("api", "idle_timeout", "\"4s\"")
        .set("api", "header_read_timeout", "\"1s\"")
        .set("metrics", "idle_timeout", "\"4s\"")
        .set("metrics", "header_read_timeout", "\"1s\"");
    let daemon = Daemon::start(spec).await;
    let (api, ops) = (address(&daemon.api), address(&daemon.ops));

    // Every socket is watched from the moment it is open, so a close is timed when it happens
    // even while the requests below take their time on a loaded machine.
    let idle = tokio::spawn(close_times(open_idle(&api, 1500).await, IDLE + MARGIN));
    let half = tokio::spawn(close_times(
        vec![
            half_sent(&api, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Ty").await,
            half_sent(&ops, "GET /readyz HTTP/1.1\r\nHo").await,
        ],
        IDLE + MARGIN,
    ));
    // Headers complete, the body never: the API's body read is bounded by the same timeout.
    let (body_never, body_since) = half_sent(
        &api,
        &format!(
            "POST /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ALICE}\r\n\
             Idempotency-Key: body-never\r\nContent-Type: application/json\r\n\
             Content-Length: 200\r\n\r\n{{\"request_id\":"
        ),
    )
    .await;
    let body_answer = tokio::spawn(closed_after(body_never, body_since, IDLE + MARGIN));
    // A keep-alive connection after one complete request: idle from its response on.
    let mut kept = TcpStream::connect(&ops).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 512];
    let n = kept.read(&mut first).await.unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    let kept = tokio::spawn(close_times(vec![(kept, Instant::now())], IDLE + MARGIN));

    // The listeners keep serving meanwhile, HTTP/1.1 and h2c (prior knowledge) as before.
    let readyz = client(Duration::from_secs(5))
        .get(format!("{}/readyz", daemon.ops))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status(), 200);
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let r = h2
        .post(format!("{}/v1/orders", daemon.api))
        .bearer_auth(ALICE)
        .header("idempotency-key", "h2c-1")
        .header("content-type", "application/json")
        .body(order("h2c-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.version(), r.status().as_u16()),
        (reqwest::Version::HTTP_2, 201)
    );

    let (idle_times, half_times, kept_times) = (
        idle.await.unwrap(),
        half.await.unwrap(),
        kept.await.unwrap(),
    );
    let open = idle_times.iter().filter(|t| t.is_none()).count();
    assert_eq!(
        open,
        0,
        "{open} of 1500 idle connections still open after {:?}",
        IDLE + MARGIN
    );
    let mut idle_sorted: Vec<Duration> = idle_times.into_iter().flatten().collect();
    idle_sorted.sort();
    let tolerance = Duration::from_millis(50);
    assert!(
        idle_sorted[0] + tolerance >= IDLE,
        "an idle connection closed after {:?}, before the idle timeout",
        idle_sorted[0]
    );
    for t in half_times.iter().chain(&kept_times) {
        let t = t.expect("a half-sent request's or kept-alive connection is still open");
        assert!(t <= IDLE + MARGIN, "{t:?}");
    }
    for (what, t) in ["API", "metrics"].iter().zip(&half_times) {
        let t = t.unwrap();
        assert!(
            t + tolerance >= HEADER && t < IDLE,
            "half-sent request on the {what} port closed after {t:?}, not by the header timeout"
        );
    }
    let kept_time = kept_times[0].unwrap();
    assert!(kept_time + tolerance >= IDLE, "{kept_time:?}");
    let (body_time, body_reply) = body_answer.await.unwrap();
    let body_time = body_time.expect("a body that never came kept its connection open");
    let body_reply = String::from_utf8_lossy(&body_reply);
    assert!(
        body_reply.starts_with("HTTP/1.1 400") && body_reply.contains("malformed-json"),
        "{body_reply}"
    );
    assert!(body_time < IDLE, "{body_time:?}");

    let closed = |reason: &str| {
        format!("tombstoned_http_connections_closed_total{{listener=\"api\",reason=\"{reason}\"}}")
    };
    assert!(daemon.metric(&closed("idle_timeout")).await >= 1500.0);
    assert!(daemon.metric(&closed("header_timeout")).await >= 1.0);
    assert_eq!(
        daemon
            .metric("tombstoned_http_connections_closed_total{listener=\"metrics\",reason=\"header_timeout\"}")
            .await,
        1.0
    );
    crate::publish_figures(
        "hostile_timeouts",
        &format!(
            "idle and half-sent connections (idle_timeout 4 s, header_read_timeout 1 s)\n\
             1500 idle API connections: all closed, after {} (first) / {} (median) / {} (last)\n\
             half-sent request: API closed after {}, metrics after {}\n\
             body never sent: 400 malformed-json and closed after {}\n\
             keep-alive connection after one request: closed after {}\n",
            seconds(idle_sorted[0]),
            seconds(percentile(&idle_sorted, 0.5)),
            seconds(*idle_sorted.last().unwrap()),
            seconds(half_times[0].unwrap()),
            seconds(half_times[1].unwrap()),
            seconds(body_time),
            seconds(kept_time),
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_half_sent_requests_on_both_ports_exits_within_seconds() {
    /// The bound promised: well inside the unit's TimeoutStopSec=45s, and below the default
    /// header_read_timeout (10 s), so it is the shutdown that closes them, not the timeout.
    const BOUND: Duration = Duration::from_secs(5);
    let db = TestDb::new().await;
    let mut daemon = Daemon::start(DaemonSpec::new(&db.url)).await;
    let (api, ops) = (address(&daemon.api), address(&daemon.ops));
    let half_api = half_sent(&api, "POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Ty").await;
    let half_ops = half_sent(&ops, "GET /metrics HTTP/1.1\r\nHo").await;
    let idle = open_idle(&api, 20).await;
    let idle_ops = open_idle(&ops, 5).await;
    // Every connection reached the daemon's connection tasks: the API's 21, and the metrics
    // listener's 6 next to the scrape asking.
    let opened = Instant::now();
    loop {
        let metrics = daemon.metrics().await;
        let open = |listener: &str| {
            sample(
                &metrics,
                &format!("tombstoned_http_connections{{listener=\"{listener}\"}}"),
            )
        };
        if open("api") >= 21.0 && open("metrics") >= 7.0 {
            break;
        }
        assert!(
            opened.elapsed() < BOUND,
            "the daemon never registered every connection:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let started = Instant::now();
    let status = daemon.terminate().await;
    let took = started.elapsed();
    assert_eq!(status.code(), Some(0), "{}", daemon.stderr());
    assert!(took < BOUND, "SIGTERM took {took:?}:\n{}", daemon.stderr());
    drop((half_api, half_ops, idle, idle_ops));
    crate::publish_figures(
        "hostile_shutdown",
        &format!(
            "SIGTERM with a half-sent request on each port (+25 idle connections): exit 0 after {}\n",
            seconds(took)
        ),
    );
}

// ---- item 6: the file-descriptor limit -----------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_rlimit_nofile_1024_a_thousand_idle_connections_leave_post_and_readyz_answering() {
    let db = TestDb::new().await;
    let mut spec = DaemonSpec::new(&db.url);
    spec.nofile = Some(1024);
    let daemon = Daemon::start(spec).await;
    // Default caps (api 1024, metrics 64) do not fit next to the pool (16) and the reserve (64).
    let log = daemon.stderr();
    assert!(
        log.contains("lowered") && log.contains("api_max_connections=880"),
        "{log}"
    );
    assert_eq!(
        daemon
            .metric("tombstoned_http_connection_limit{listener=\"api\"}")
            .await,
        880.0
    );

    let api = address(&daemon.api);
    let started = Instant::now();
    let idle = open_idle(&api, 1100).await;
    let opened_in = started.elapsed();

    let http = client(Duration::from_secs(10));
    let mut post_times = Vec::new();
    let mut readyz_times = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        let r = post(
            &http,
            &daemon.api,
            ALICE,
            &format!("nofile-{i}"),
            order(&format!("nofile-{i}")),
        )
        .await;
        post_times.push(t.elapsed());
        assert_eq!(r.status, 201, "{}", r.text);
        let t = Instant::now();
        let r = http
            .get(format!("{}/readyz", daemon.ops))
            .send()
            .await
            .expect("/readyz answers");
        readyz_times.push(t.elapsed());
        assert_eq!(r.status(), 200);
    }
    let open = daemon
        .metric("tombstoned_http_connections{listener=\"api\"}")
        .await;
    assert!(open <= 880.0, "{open} API connections open");
    let evicted = daemon
        .metric("tombstoned_http_connections_closed_total{listener=\"api\",reason=\"evicted\"}")
        .await;
    let refused = daemon
        .metric("tombstoned_http_connections_closed_total{listener=\"api\",reason=\"refused\"}")
        .await;
    // Every idle connection beyond the cap made room for itself (or was turned away); the
    // POSTs' connections close after their answer, so the next finds a free slot.
    assert!(evicted + refused >= 1100.0 - 880.0, "{evicted} + {refused}");
    let fds = std::fs::read_dir(format!("/proc/{}/fd", daemon.pid()))
        .unwrap_or_else(|e| panic!("cannot count the daemon's descriptors: {e}"))
        .count();
    assert!(fds <= 1024 - 32, "{fds} descriptors open");
    let log = daemon.stderr();
    let accept_errors = log.matches("accept failed").count();
    assert!(
        accept_errors <= 2,
        "{accept_errors} accept errors logged:\n{log}"
    );
    assert!(!log.contains("Too many open files"), "{log}");
    drop(idle);
    post_times.sort();
    readyz_times.sort();
    crate::publish_figures(
        "hostile_nofile",
        &format!(
            "RLIMIT_NOFILE 1024: API cap 880 (logged), 1100 idle connections opened in {}\n\
             then 10 POSTs: all 201, max {}; 10 /readyz: all 200, max {}\n\
             API connections open {open}, evicted {evicted}, refused {refused}, daemon fds {fds}, \
             accept errors logged {accept_errors}\n",
            seconds(opened_in),
            seconds(*post_times.last().unwrap()),
            seconds(*readyz_times.last().unwrap()),
        ),
    );
}

// ---- item 8: a few hot keys ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_on_four_locked_keys_leave_the_pool_to_everyone_else() {
    const HOT: usize = 4;
    const CLIENTS: usize = 64;
    const RUN: Duration = Duration::from_secs(8);
    let db = TestDb::new().await;
    let daemon = Daemon::start(
        DaemonSpec::new(&db.url)
            .set("database", "pool_size", "16")
            .set("api", "claim_lock_timeout", "\"2s\"")
            .set("cleanup", "enabled", "false"),
    )
    .await;
    // Four keys claimed by open transactions: every request for them waits on the row lock.
    let holder = connect(&db.url, "test").await;
    // The scope committed first (V5): only the records are held.
    holder
        .batch_execute("SELECT ensure_scope('acme', 'alice', 'create-order')")
        .await
        .unwrap();
    holder.batch_execute("BEGIN").await.unwrap();
    for i in 0..HOT {
        holder
            .execute(
                "INSERT INTO idempotency_records (scope_id,
                     idempotency_key, fingerprint, status_code, response_body, replay_deadline)
                 VALUES (ensure_scope('acme', 'alice', 'create-order'), $1, $2, 201, '{}'::jsonb,
                         now() + interval '1 day')",
                &[&format!("hot-{i}"), &vec![0u8; 32]],
            )
            .await
            .unwrap();
    }

    let holder_observer = connect(&db.url, "test").await;
    let stop = Arc::new(AtomicBool::new(false));
    let hot_clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (api, stop) = (daemon.api.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let http = reqwest::Client::builder()
                    .timeout(Duration::from_secs(15))
                    .build()
                    .unwrap();
                let key = format!("hot-{}", c % HOT);
                let mut answers: Vec<(u16, String, Option<String>)> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = post(&http, &api, ALICE, &key, order(&key)).await;
                    let wait = r
                        .retry_after
                        .as_deref()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(1);
                    answers.push((r.status, r.problem(), r.retry_after.clone()));
                    // Honour Retry-After, as the clients did.
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                answers
            })
        })
        .collect();
    // The hot clients have taken what they can take: their claims wait on the held rows, at
    // least one session per hot key at once.
    wait_until_sessions_wait(&holder_observer, "tombstoned/api", HOT as i64).await;

    // Unrelated traffic: new keys from alice (same scope as the hot keys) and bob, and reads.
    let started = Instant::now();
    let http = client(Duration::from_secs(15));
    let mut post_times = Vec::new();
    let mut get_times = Vec::new();
    let mut statuses = Vec::new();
    let mut n = 0;
    while started.elapsed() < RUN {
        for token in [ALICE, BOB] {
            let key = format!("cold-{n}");
            n += 1;
            let t = Instant::now();
            let r = post(&http, &daemon.api, token, &key, order(&key)).await;
            post_times.push(t.elapsed());
            statuses.push(r.status);
            assert_eq!(
                r.status, 201,
                "unrelated POST {key}: {} {}",
                r.status, r.text
            );
            let location = r.location.clone().unwrap();
            let t = Instant::now();
            let g = http
                .get(format!("{}{location}", daemon.api))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            get_times.push(t.elapsed());
            assert_eq!(g.status(), 200);
            let t = Instant::now();
            let g = http
                .get(format!("{}/v1/idempotency-keys/{key}", daemon.api))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            get_times.push(t.elapsed());
            assert_eq!(g.status(), 200);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut hot_answers = Vec::new();
    for c in hot_clients {
        hot_answers.extend(c.await.unwrap());
    }
    holder.batch_execute("ROLLBACK").await.unwrap();

    // The hot keys: only "in progress" (or, at worst, "unavailable"), always with Retry-After.
    let mut hot_409 = 0;
    let mut hot_503 = 0;
    for (status, problem, retry_after) in &hot_answers {
        match (*status, problem.as_str()) {
            (409, "request-in-progress") => hot_409 += 1,
            (503, "database-unavailable") => hot_503 += 1,
            other => panic!("hot key answered {other:?}"),
        }
        assert!(
            retry_after.is_some(),
            "{status} {problem} without Retry-After"
        );
    }
    // The hot keys were really contended: beyond the owner and one waiter per key, the rest were
    // turned away at once.
    assert!(
        hot_409 > 0,
        "no hot request was refused: {} answers, {hot_503} x 503",
        hot_answers.len()
    );
    post_times.sort();
    get_times.sort();
    let (post_p50, post_p99, post_max) = (
        percentile(&post_times, 0.5),
        percentile(&post_times, 0.99),
        *post_times.last().unwrap(),
    );
    let get_max = *get_times.last().unwrap();
    // Without the per-key admission, the unrelated POSTs wait for the pool behind the waiters
    // (seconds, then 503); with it they wait for nobody.
    let bound = Duration::from_millis(1500);
    assert!(post_p99 < bound, "unrelated POST p99 {post_p99:?}");
    // Every read too, as the daemon timed it (its request histogram: a stall of this test
    // process cannot count, a read that waited for the pool cannot hide): all within 1 s.
    let metrics = daemon.metrics().await;
    for route in ["/v1/orders/{order_id}", "/v1/idempotency-keys/{key}"] {
        let series = |suffix: &str, le: &str| {
            sample(
                &metrics,
                &format!(
                    "tombstoned_http_request_duration_seconds_{suffix}{{route=\"{route}\"{le}}}"
                ),
            )
        };
        let (served, within) = (series("count", ""), series("bucket", ",le=\"1\""));
        assert!(
            served >= (get_times.len() / 2) as f64,
            "{route}: {served} served"
        );
        assert_eq!(
            within, served,
            "{route}: a read took over 1 s in the daemon"
        );
    }
    crate::publish_figures(
        "hostile_hot_keys",
        &format!(
            "64 clients on 4 locked keys (honouring Retry-After), pool 16, claim_lock_timeout 2 s, \
             {} s\n\
             hot keys: {} answers: {hot_409} x 409 request-in-progress, {hot_503} x 503, all with \
             Retry-After\n\
             unrelated: {} POSTs, all 201, p50 {} / p99 {} / max {}; {} GETs, all 200, max {}\n",
            RUN.as_secs(),
            hot_answers.len(),
            statuses.len(),
            seconds(post_p50),
            seconds(post_p99),
            seconds(post_max),
            get_times.len(),
            seconds(get_max),
        ),
    );
}

// ---- item 9: a full disk -------------------------------------------------------------------

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Result<Tmpfs, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("mount -t tmpfs failed: {status}"));
        }
        Ok(Tmpfs { dir })
    }

    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system of `path` with a file until it is full; returns the file.
fn fill(path: &std::path::Path) -> std::path::PathBuf {
    use std::io::Write as _;
    let filler = path.join("filler");
    let mut f = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let small = vec![0u8; 512];
    while f.write_all(&small).is_ok() {}
    let _ = f.sync_all();
    filler
}

/// The disk-full test cannot run here (not root, or no `mount -t tmpfs`, e.g. a container
/// without CAP_SYS_ADMIN): a failure under CI (`CI` set), whose figures RELIABILITY.md cites; a
/// skip, said on stderr, on a developer's machine.
fn cannot_run(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "a_full_disk_answers_503_with_retry_after_then_recovers cannot run under CI: {why}"
    );
    eprintln!("SKIPPED a_full_disk_answers_503_with_retry_after_then_recovers: {why}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_503_with_retry_after_then_recovers() {
    // /proc/self belongs to the process's effective user.
    let root = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if !root {
        cannot_run("mounting a tmpfs needs root");
        return;
    }
    let own = OwnCluster::start().await;
    let tmpfs = match Tmpfs::mount("2m") {
        Ok(t) => t,
        Err(e) => {
            cannot_run(&e);
            return;
        }
    };
    // The server runs as the postgres user (as root, pg_cluster drops to it): it must own the
    // tablespace directory.
    let space = tmpfs.path().join("space");
    std::fs::create_dir(&space).unwrap();
    let chown = std::process::Command::new("chown")
        .arg("postgres:postgres")
        .arg(tmpfs.path())
        .arg(&space)
        .status()
        .unwrap();
    assert!(chown.success());
    let admin = connect(&own.url, "test").await;
    admin
        .batch_execute(&format!(
            "CREATE TABLESPACE tiny LOCATION '{}'",
            space.display()
        ))
        .await
        .unwrap();
    admin
        .batch_execute("ALTER TABLE orders SET TABLESPACE tiny")
        .await
        .unwrap();

    let daemon = Daemon::start(DaemonSpec::new(&own.url).set("cleanup", "enabled", "false")).await;
    let http = client(Duration::from_secs(15));

    // Full before the first order: its insert must extend the (empty) table.
    let filler = fill(tmpfs.path());
    let mut answers = Vec::new();
    for i in 1..=20 {
        let key = format!("disk-{i}");
        let r = post(&http, &daemon.api, ALICE, &key, order(&key)).await;
        answers.push(r);
    }
    let full: Vec<_> = answers.iter().filter(|r| r.status != 201).collect();
    assert!(!full.is_empty(), "the full disk never showed");
    for r in &full {
        assert_eq!(
            (r.status, r.problem().as_str()),
            (503, "database-unavailable"),
            "{}",
            r.text
        );
        assert!(r.retry_after.is_some(), "503 without Retry-After");
        assert!(r.text.contains("out of resources"), "{}", r.text);
    }
    // Nothing was consumed: the key is unknown (a read, which the full disk does not stop).
    let status = http
        .get(format!("{}/v1/idempotency-keys/disk-1", daemon.api))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(status.status(), 404);
    let class_53 = daemon
        .metric("tombstoned_db_errors_total{sqlstate_class=\"53\"}")
        .await;
    assert!(class_53 >= full.len() as f64, "{class_53}");
    // Readiness reflects it, although a read-only probe succeeds (issue 17 item 9).
    let readyz = |http: reqwest::Client, ops: String| async move {
        let r = http.get(format!("{ops}/readyz")).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    // (A result is reused for up to 1 s: poll briefly.)
    let seen = std::time::Instant::now();
    let reason = loop {
        let (code, reason) = readyz(http.clone(), daemon.ops.clone()).await;
        if code == 503 {
            break reason;
        }
        assert!(
            seen.elapsed() < Duration::from_secs(5),
            "still ready: {reason}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        reason.contains("out of resources") && reason.contains("53100"),
        "{reason}"
    );
    println!("/readyz while the disk is full: '{reason}'");

    // Space again: the same keys now create their orders (nothing was consumed).
    std::fs::remove_file(&filler).unwrap();
    let retried = post(&http, &daemon.api, ALICE, "disk-1", order("disk-1")).await;
    assert_eq!(retried.status, 201, "{}", retried.text);
    assert!(!retried.replayed);
    // ... and readiness returns once no request has met class 53 for its hold (15 s).
    let freed = std::time::Instant::now();
    loop {
        let (code, reason) = readyz(http.clone(), daemon.ops.clone()).await;
        if code == 200 {
            println!(
                "/readyz: '{reason}' {:?} after space was freed",
                freed.elapsed()
            );
            break;
        }
        assert!(
            freed.elapsed() < Duration::from_secs(40),
            "still not ready: {reason}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = daemon.stderr();
    assert!(log.contains("out of resources"), "{log}");

    drop(daemon);
    drop(admin);
    drop(own);
    crate::publish_figures(
        "hostile_disk_full",
        &format!(
            "orders on a 2 MiB tmpfs tablespace, filled: {} of 20 POSTs 503 database-unavailable \
             with Retry-After (SQLSTATE class 53 counted {class_53}); after freeing space the \
             retry created its order\n",
            full.len()
        ),
    );
}

//! The three "create payment" services of `examples/` (issue 23), each run against a real
//! PostgreSQL and driven over real HTTP: the Python one (psycopg 3) and the Node one
//! (node-postgres) as processes, the Rust one (tokio-postgres) in-process through its library.
//! Each connects as a role with only the README's two GRANTs plus its own table, and meets the
//! daemon's real cleaner: create, lost response and retry, reuse refused, in flight (a holder
//! session owns the key; barriers on `pg_stat_activity`, never sleeps), the business id as the
//! second line of defence, tombstoned and then expired.
//!
//! The Python venv and the Node packages are made by `examples/setup` (pinned files, idempotent),
//! which each test runs first: a missing interpreter or package fails the test.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_postgres::config::Host;
use tokio_postgres::Client;

use crate::cleanup_support::run;
use crate::harness::{server, wait_until_app_lock_wait, TestDb};
use crate::ops_support::repo_root;

const TENANT: &str = "acme";
const PRINCIPAL: &str = "billing";
/// The bearer token of (acme, billing), and of another principal of the same tenant.
pub(crate) const TOKEN: &str = "token-acme-billing";
pub(crate) const OTHER_TOKEN: &str = "token-acme-audit";
const OPERATION: &str = "create-payment";
/// What the examples are started with: a claim waits this long for an in-flight owner (long
/// enough for the test to see a claim wait and end the holder inside it on a loaded machine).
const LOCK_TIMEOUT: &str = "5 seconds";
const PATIENCE: Duration = Duration::from_secs(60);

/// One of the three examples, or the same service on the clients' other adapter (Django beside
/// the Python example's FastAPI, Fastify beside the Node example's Express: each the client's
/// sample app of that adapter).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Example {
    Python,
    Node,
    Rust,
    Django,
    Fastify,
}

impl Example {
    fn name(self) -> &'static str {
        match self {
            Example::Python => "python",
            Example::Node => "node",
            Example::Rust => "rust",
            Example::Django => "django",
            Example::Fastify => "fastify",
        }
    }

    /// Its directory's `examples/setup` target.
    fn setup_target(self) -> &'static str {
        match self {
            Example::Django => "python",
            Example::Fastify => "node",
            other => other.name(),
        }
    }

    /// The `application_name` the example's sessions carry (the barrier looks for it).
    fn application_name(self) -> String {
        format!("payments-{}", self.name())
    }
}

/// A running example and what it needs to stay up.
pub(crate) struct Running {
    pub(crate) base: String,
    pub(crate) log: PathBuf,
    _child: Option<tokio::process::Child>,
    _server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

/// The role and connection URL of the service, with its table made from examples/payments.sql
/// and its operation granted.
pub(crate) async fn service_role(db: &TestDb) -> String {
    service_role_at(db, None).await
}

/// [`service_role`], its URL pointing at 127.0.0.1:`port` instead of the server when given (a
/// proxy in front of it, which reads the protocol in plaintext: no TLS).
async fn service_role_at(db: &TestDb, port: Option<u16>) -> String {
    let role = format!("pay_{}", db.name);
    let password = "example-password";
    let admin = db.client().await;
    let schema = std::fs::read_to_string(repo_root().join("examples/payments.sql")).unwrap();
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{password}';
             GRANT USAGE ON SCHEMA tombstoned TO {role};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tombstoned TO {role};
             SET search_path = public;
             {schema}
             ALTER TABLE payments OWNER TO {role};
             ALTER FUNCTION payment_body(payments) OWNER TO {role};
             RESET search_path;"
        ))
        .await
        .unwrap();
    // Its operation, granted as examples/README.md says (issue 36).
    crate::operations_support::grant(db, OPERATION, &role).await;
    let host = match server().get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        other => panic!("the examples' tests need a TCP server, not {other:?}"),
    };
    let server_port = server().get_ports().first().copied().unwrap_or(5432);
    match port {
        None => format!(
            "postgresql://{role}:{password}@{host}:{server_port}/{}",
            db.name
        ),
        Some(port) => format!(
            "postgresql://{role}:{password}@127.0.0.1:{port}/{}?sslmode=disable",
            db.name
        ),
    }
}

fn tokens() -> String {
    json!({
        TOKEN: {"tenant": TENANT, "principal": PRINCIPAL},
        OTHER_TOKEN: {"tenant": TENANT, "principal": "audit"},
    })
    .to_string()
}

/// `examples/setup <target>`: the venv or node_modules from the pinned files (a no-op when made).
pub(crate) fn setup(example: Example) {
    let target = example.setup_target();
    let status = std::process::Command::new(repo_root().join("examples/setup"))
        .arg(target)
        .status()
        .unwrap_or_else(|e| panic!("cannot run examples/setup: {e}"));
    assert!(
        status.success(),
        "examples/setup {target} failed ({status}): the {} example needs its interpreter and \
         packages",
        example.name()
    );
}

async fn start(example: Example, db: &TestDb, url: &str) -> Running {
    start_with_window(example, db, url, "1 hour").await
}

/// [`start`] with `replay_window` as the example's `REPLAY_WINDOW` (an interval, "3 seconds").
pub(crate) async fn start_with_window(
    example: Example,
    db: &TestDb,
    url: &str,
    replay_window: &str,
) -> Running {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("examples");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join(format!("{}-{}.log", example.name(), db.name));
    let (program, script) = match example {
        Example::Rust => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let settings =
                rust_payments::Settings::new(&tokens(), LOCK_TIMEOUT, replay_window).unwrap();
            let pool = rust_payments::pool(url).unwrap();
            let server = tokio::spawn(rust_payments::run(listener, pool, settings));
            return Running {
                base,
                log,
                _child: None,
                _server: Some(server),
            };
        }
        Example::Python | Example::Django => (
            repo_root().join("examples/python-payments/.venv/bin/python"),
            match example {
                Example::Django => "examples/python-payments/django_service.py",
                _ => "examples/python-payments/service.py",
            },
        ),
        Example::Node => (PathBuf::from("node"), "examples/node-payments/service.js"),
        Example::Fastify => (PathBuf::from("node"), "examples/node-payments/fastify.js"),
    };
    setup(example);
    let mut child = tokio::process::Command::new(&program)
        .arg(repo_root().join(script))
        .env("DATABASE_URL", url)
        .env("PAYMENTS_TOKENS", tokens())
        .env("PORT", "0")
        .env("CLAIM_LOCK_TIMEOUT", LOCK_TIMEOUT)
        .env("REPLAY_WINDOW", replay_window)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(PATIENCE, lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{example:?} did not start; see {}", log.display()))
        .unwrap()
        .unwrap_or_else(|| panic!("{example:?} exited; see {}", log.display()));
    let base = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{example:?} printed {first:?}"))
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Running {
        base,
        log,
        _child: Some(child),
        _server: None,
    }
}

/// One HTTP answer, whole.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    async fn of(response: reqwest::Response) -> Reply {
        Reply {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

async fn post(base: &str, token: &str, key: &str, body: &Value) -> Reply {
    let response = reqwest::Client::new()
        .post(format!("{base}/payments"))
        .bearer_auth(token)
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    Reply::of(response).await
}

async fn get(base: &str, token: &str, path: &str) -> Reply {
    let response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    Reply::of(response).await
}

/// The request body of `request_id` for `amount` EUR to ACME.
fn request(request_id: &str, amount: &str) -> Value {
    json!({"request_id": request_id, "amount": amount, "currency": "EUR", "payee": "ACME Ltd"})
}

/// The intent the examples fingerprint for [`request`] (examples/README.md).
fn intent(request_id: &str, amount_minor: i64) -> String {
    json!({"v": 1, "request_id": request_id, "amount_minor": amount_minor, "currency": "EUR",
           "payee": "ACME Ltd"})
    .to_string()
}

/// A session of the test that owns a key in an open transaction: an in-flight request.
struct Holder {
    client: Client,
}

impl Holder {
    async fn claim(db: &TestDb, key: &str, intent: &str) -> Holder {
        let client = db.client().await;
        client.batch_execute("BEGIN").await.unwrap();
        let outcome: String = client
            .query_one(
                "SELECT outcome FROM tombstoned.claim($1, $2, $3, $4,
                     tombstoned.fingerprint($5::text::jsonb), '1 hour', '2 seconds')",
                &[&TENANT, &PRINCIPAL, &OPERATION, &key, &intent],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(outcome, "owner");
        Holder { client }
    }

    async fn complete(&self, key: &str, body: &Value) -> String {
        self.client
            .query_one(
                "SELECT tombstoned.complete($1, $2, $3, $4, 201, $5, 'held-payment')",
                &[&TENANT, &PRINCIPAL, &OPERATION, &key, body],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn end(self, sql: &str) {
        self.client.batch_execute(sql).await.unwrap();
    }
}

/// Sends [`request`] of `request_id` under `key` while a holder owns the key; returns once the
/// example's claim is seen waiting for the holder's row lock (pg_stat_activity), with the
/// request still open.
async fn send_while_held(
    example: Example,
    base: &str,
    observer: &Client,
    key: &str,
    request_id: &str,
) -> tokio::task::JoinHandle<Reply> {
    let (base, key, body) = (
        base.to_owned(),
        key.to_owned(),
        request(request_id, "12.50"),
    );
    let request = tokio::spawn(async move { post(&base, TOKEN, &key, &body).await });
    wait_until_app_lock_wait(observer, &example.application_name(), PATIENCE).await;
    request
}

async fn count(admin: &Client, sql: &str, param: &str) -> i64 {
    admin.query_one(sql, &[&param]).await.unwrap().get(0)
}

/// Every case, on one example.
async fn exercise(example: Example) {
    let db = TestDb::new().await;
    let url = service_role(&db).await;
    let admin = db.client().await;
    let service = start(example, &db, &url).await;
    let base = service.base.as_str();
    let context = format!("{example:?} (its log: {})", service.log.display());
    let payments_of = "SELECT count(*) FROM public.payments WHERE request_id = $1";
    let records_of = "SELECT count(*) FROM idempotency_records WHERE idempotency_key = $1";

    // Unauthenticated: 401 before anything else.
    let stranger = post(base, "no-such-token", "k-1", &request("r-1", "12.50")).await;
    assert_eq!(stranger.status, 401, "{context}: {stranger:?}");

    // Refused by validation (three decimals in EUR): 400, and the key is not consumed.
    let bad = post(base, TOKEN, "k-1", &request("r-1", "12.505")).await;
    assert_eq!(bad.status, 400, "{context}: {bad:?}");
    assert_eq!(count(&admin, records_of, "k-1").await, 0, "{context}");

    // Create: 201 with complete's text; one payment, one event, the documented fingerprint.
    let created = post(base, TOKEN, "k-1", &request("r-1", "12.50")).await;
    assert_eq!(created.status, 201, "{context}: {created:?}");
    assert!(!created.replayed(), "{context}");
    let payment = created.json();
    assert_eq!(payment["amount_minor"], 1250, "{context}: {payment}");
    assert_eq!(payment["status"], "created", "{context}");
    let payment_id = payment["payment_id"].as_str().unwrap().to_owned();
    assert_eq!(
        created.header("location"),
        Some(format!("/payments/{payment_id}").as_str())
    );
    let stored = admin
        .query_one(
            "SELECT response_body::text, resource_id,
                    fingerprint = tombstoned.fingerprint($2::text::jsonb)
             FROM idempotency_records WHERE idempotency_key = $1",
            &[&"k-1", &intent("r-1", 1250)],
        )
        .await
        .unwrap();
    assert_eq!(
        stored.get::<_, String>(0).as_bytes(),
        created.body.as_slice(),
        "{context}: the first answer is the stored text"
    );
    assert_eq!(stored.get::<_, String>(1), payment_id, "{context}");
    assert!(stored.get::<_, bool>(2), "{context}: the documented intent");
    assert_eq!(count(&admin, payments_of, "r-1").await, 1, "{context}");
    let events = "SELECT count(*) FROM outbox_events
                  WHERE aggregate_id = $1 AND event_type = 'payment.created'";
    assert_eq!(count(&admin, events, &payment_id).await, 1, "{context}");

    // The response was lost; the retry (spelled otherwise: "12.5", the default currency left
    // out, a field that is not part of the intent) replays it byte for byte.
    let retry = json!({"payee": "ACME Ltd", "amount": "12.5", "request_id": "r-1", "trace": "t-9"});
    let replay = post(base, TOKEN, "k-1", &retry).await;
    assert_eq!(replay.status, 201, "{context}: {replay:?}");
    assert!(replay.replayed(), "{context}: {replay:?}");
    assert_eq!(replay.body, created.body, "{context}: byte-identical");
    let location = created.header("location").map(str::to_owned);
    assert_eq!(
        replay.header("location"),
        location.as_deref(),
        "{context}: the replay's Location"
    );
    assert_eq!(count(&admin, payments_of, "r-1").await, 1, "{context}");
    // Where Location leads: the payment, served.
    let shown = get(base, TOKEN, &format!("/payments/{payment_id}")).await;
    assert_eq!(shown.status, 200, "{context}: {shown:?}");
    assert_eq!(shown.json()["payment_id"], payment_id.as_str(), "{context}");

    // The key reused for another intent: 422, nothing of the stored answer.
    let reused = post(base, TOKEN, "k-1", &request("r-1", "13.00")).await;
    assert_eq!(reused.status, 422, "{context}: {reused:?}");
    assert!(!String::from_utf8_lossy(&reused.body).contains(&payment_id));

    // The business id, the second line of defence: the same request under a new key is the
    // same payment (a replay: 200, as the endpoint answers, this request created nothing);
    // another request or another principal with that request_id is a conflict that names
    // nothing of it. None of those keys is recorded.
    let again = post(base, TOKEN, "k-1-again", &request("r-1", "12.50")).await;
    assert_eq!(again.status, 200, "{context}: {again:?}");
    assert!(again.replayed(), "{context}");
    assert_eq!(again.body, created.body, "{context}");
    // Answered like a key's replay: the same Location.
    assert_eq!(
        again.header("location"),
        location.as_deref(),
        "{context}: the business id's replay carries Location"
    );
    for (token, key, amount) in [
        (TOKEN, "k-1-more", "99.00"),
        (OTHER_TOKEN, "k-1-audit", "12.50"),
    ] {
        let conflict = post(base, token, key, &request("r-1", amount)).await;
        assert_eq!(conflict.status, 409, "{context}: {conflict:?}");
        assert!(!String::from_utf8_lossy(&conflict.body).contains(&payment_id));
        assert_eq!(count(&admin, records_of, key).await, 0, "{context}");
    }
    assert_eq!(count(&admin, records_of, "k-1-again").await, 0, "{context}");
    assert_eq!(count(&admin, payments_of, "r-1").await, 1, "{context}");

    // In flight, the owner outlasts the claim's lock_timeout: 409 + Retry-After, nothing
    // written. Once the owner rolled back, the retry with the same key creates the payment.
    let holder = Holder::claim(&db, "k-busy", &intent("r-busy", 1250)).await;
    let waiting = send_while_held(example, base, &admin, "k-busy", "r-busy").await;
    let busy = waiting.await.unwrap();
    assert_eq!(busy.status, 409, "{context}: {busy:?}");
    assert!(busy.header("retry-after").is_some(), "{context}: {busy:?}");
    holder.end("ROLLBACK").await;
    assert_eq!(count(&admin, payments_of, "r-busy").await, 0, "{context}");
    let retried = post(base, TOKEN, "k-busy", &request("r-busy", "12.50")).await;
    assert_eq!(
        (retried.status, retried.replayed()),
        (201, false),
        "{context}"
    );

    // In flight, the owner commits while the example's claim waits: the example replays the
    // owner's answer.
    let holder = Holder::claim(&db, "k-wait", &intent("r-wait", 1250)).await;
    let held = holder
        .complete("k-wait", &json!({"payment_id": "held-payment"}))
        .await;
    let waiting = send_while_held(example, base, &admin, "k-wait", "r-wait").await;
    holder.end("COMMIT").await;
    let replayed = waiting.await.unwrap();
    assert_eq!(replayed.status, 201, "{context}: {replayed:?}");
    assert!(replayed.replayed(), "{context}");
    assert_eq!(replayed.body, held.as_bytes(), "{context}");
    assert_eq!(count(&admin, payments_of, "r-wait").await, 0, "{context}");

    // In flight, the owner rolls back while the example's claim waits: the example owns it.
    let holder = Holder::claim(&db, "k-roll", &intent("r-roll", 1250)).await;
    let waiting = send_while_held(example, base, &admin, "k-roll", "r-roll").await;
    holder.end("ROLLBACK").await;
    let owned = waiting.await.unwrap();
    assert_eq!((owned.status, owned.replayed()), (201, false), "{context}");
    assert_eq!(count(&admin, payments_of, "r-roll").await, 1, "{context}");

    // Every replay above committed right away: no session of the example is left in a
    // transaction (the cleaner would wait for its share lock).
    let open = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
                AND datname = current_database() AND state LIKE 'idle in transaction%'";
    assert_eq!(
        count(&admin, open, &example.application_name()).await,
        0,
        "{context}"
    );

    // Tombstoned, then expired: the window moved into the past, the real cleaner tombstones
    // the record, and the retry gets 410 naming the payment — never a second one.
    admin
        .execute(
            "UPDATE idempotency_records SET replay_deadline = clock_timestamp() - interval '1 s'
             WHERE idempotency_key = $1",
            &[&"k-1"],
        )
        .await
        .unwrap();
    let report = run(&db.config()).await;
    assert_eq!(report.rows_tombstoned, 1, "{context}: {report:?}");
    let tombstone: bool = admin
        .query_one(
            "SELECT expired AND response_body IS NULL FROM idempotency_records
             WHERE idempotency_key = $1",
            &[&"k-1"],
        )
        .await
        .unwrap()
        .get(0);
    assert!(tombstone, "{context}");
    let expired = post(base, TOKEN, "k-1", &request("r-1", "12.50")).await;
    assert_eq!(expired.status, 410, "{context}: {expired:?}");
    assert_eq!(
        expired.json()["payment_id"],
        payment_id.as_str(),
        "{context}"
    );
    // 410 names the resource where a GET finds it.
    assert_eq!(
        expired.header("location"),
        location.as_deref(),
        "{context}: {expired:?}"
    );
    let found = get(base, TOKEN, location.as_deref().unwrap_or("/")).await;
    assert_eq!(found.status, 200, "{context}: {found:?}");
    let reused = post(base, TOKEN, "k-1", &request("r-1", "13.00")).await;
    assert_eq!(
        reused.status, 422,
        "{context}: reuse stays refused after expiry"
    );
    assert_eq!(count(&admin, payments_of, "r-1").await, 1, "{context}");
}

/// Posts `body` under `key` while the answer is 503 with `Retry-After` (what a client told to
/// retry later does), at most a few times; the first other answer.
async fn retry_until_answered(base: &str, key: &str, body: &Value, context: &str) -> Reply {
    for _ in 0..5 {
        let reply = post(base, TOKEN, key, body).await;
        if reply.status != 503 {
            return reply;
        }
        assert!(
            reply.header("retry-after").is_some(),
            "{context}: {reply:?}"
        );
    }
    panic!("{context}: still 503 after 5 retries");
}

/// An answer the README's table gives for a database that cannot answer now: 503 with
/// `Retry-After` (retry with the same key).
fn assert_retry_later(reply: &Reply, context: &str) {
    assert_eq!(reply.status, 503, "{context}: {reply:?}");
    let after = reply.header("retry-after").unwrap_or_default();
    assert!(
        after.parse::<u32>().is_ok_and(|s| s >= 1),
        "{context}: Retry-After {after:?}"
    );
}

/// The 503 branches of one example, through a proxy between it and PostgreSQL: a commit whose
/// outcome is unknown (the connection cut after the server committed, before its answer: the
/// retry replays the payment made once), a database that does not answer (every connection
/// closed: nothing written, the retry once it is back creates the payment once), and a database
/// that refuses writes (SQLSTATE 25006 seen going through: nothing written, the key is not
/// consumed). The answers asserted are the README's (503 and `Retry-After`), not the examples'
/// wording.
async fn unavailable(example: Example) {
    use crate::api_commit_loss::{Cut, CuttingProxy};
    let db = TestDb::new().await;
    let upstream = server().get_ports().first().copied().unwrap_or(5432);
    let proxy = CuttingProxy::start(upstream, Cut::AfterCommit).await;
    let url = service_role_at(&db, Some(proxy.port)).await;
    let admin = db.client().await;
    let service = start(example, &db, &url).await;
    let base = service.base.as_str();
    let context = format!("{example:?} (its log: {})", service.log.display());
    let payments_of = "SELECT count(*) FROM public.payments WHERE request_id = $1";
    let records_of = "SELECT count(*) FROM idempotency_records WHERE idempotency_key = $1";
    let warm = post(base, TOKEN, "k-warm", &request("r-warm", "1.00")).await;
    assert_eq!(warm.status, 201, "{context}: {warm:?}");

    // The commit's answer lost: outcome unknown. It did commit: the retry replays it.
    proxy.arm();
    let lost = post(base, TOKEN, "k-lost", &request("r-lost", "2.00")).await;
    assert_retry_later(&lost, &context);
    assert_eq!(
        proxy.cuts(),
        1,
        "{context}: the connection was cut at COMMIT"
    );
    assert_eq!(count(&admin, payments_of, "r-lost").await, 1, "{context}");
    let stored: String = admin
        .query_one(
            "SELECT response_body::text FROM idempotency_records WHERE idempotency_key = $1",
            &[&"k-lost"],
        )
        .await
        .unwrap()
        .get(0);
    let retried = retry_until_answered(base, "k-lost", &request("r-lost", "2.00"), &context).await;
    assert_eq!(retried.status, 201, "{context}: {retried:?}");
    assert!(retried.replayed(), "{context}: {retried:?}");
    assert_eq!(retried.body, stored.as_bytes(), "{context}");
    assert_eq!(count(&admin, payments_of, "r-lost").await, 1, "{context}");

    // The database does not answer: 503, nothing written. Back, the retry creates it once.
    proxy.set_down(true);
    let down = post(base, TOKEN, "k-down", &request("r-down", "3.00")).await;
    assert_retry_later(&down, &context);
    assert_eq!(count(&admin, records_of, "k-down").await, 0, "{context}");
    proxy.set_down(false);
    let back = retry_until_answered(base, "k-down", &request("r-down", "3.00"), &context).await;
    assert_eq!((back.status, back.replayed()), (201, false), "{context}");
    assert_eq!(count(&admin, payments_of, "r-down").await, 1, "{context}");

    // The database refuses writes (as a standby does): a new instance of the example, whose
    // sessions are all read-only, answers 503 after the server's 25006; nothing is written,
    // and the key is still free for the instance that may write.
    let role = url
        .strip_prefix("postgresql://")
        .and_then(|rest| rest.split(':').next())
        .unwrap()
        .to_owned();
    let read_only = |on: bool| {
        format!(
            "ALTER ROLE {role} IN DATABASE {} {}",
            db.name,
            if on {
                "SET default_transaction_read_only = on"
            } else {
                "RESET default_transaction_read_only"
            }
        )
    };
    admin.batch_execute(&read_only(true)).await.unwrap();
    let standby = start(example, &db, &url).await;
    let errors_before = proxy.errors().len();
    let refused = post(&standby.base, TOKEN, "k-ro", &request("r-ro", "4.00")).await;
    assert_retry_later(&refused, &context);
    assert!(
        proxy.errors()[errors_before..].contains(&"25006".to_owned()),
        "{context}: the server refused a write: {:?}",
        proxy.errors()
    );
    assert_eq!(count(&admin, records_of, "k-ro").await, 0, "{context}");
    admin.batch_execute(&read_only(false)).await.unwrap();
    let written = retry_until_answered(base, "k-ro", &request("r-ro", "4.00"), &context).await;
    assert_eq!(
        (written.status, written.replayed()),
        (201, false),
        "{context}"
    );
    assert_eq!(count(&admin, payments_of, "r-ro").await, 1, "{context}");
}

#[tokio::test]
async fn python_payments_example_503s() {
    unavailable(Example::Python).await;
}

#[tokio::test]
async fn node_payments_example_503s() {
    unavailable(Example::Node).await;
}

#[tokio::test]
async fn rust_payments_example_503s() {
    unavailable(Example::Rust).await;
}

#[tokio::test]
async fn python_payments_example() {
    exercise(Example::Python).await;
}

#[tokio::test]
async fn node_payments_example() {
    exercise(Example::Node).await;
}

#[tokio::test]
async fn rust_payments_example() {
    exercise(Example::Rust).await;
}

#[tokio::test]
async fn django_payments_sample_app() {
    exercise(Example::Django).await;
}

#[tokio::test]
async fn fastify_payments_sample_app() {
    exercise(Example::Fastify).await;
}

/// The README shows the Python example's transaction as the file has it.
#[test]
fn readme_quotes_the_python_example() {
    let service =
        std::fs::read_to_string(repo_root().join("examples/python-payments/service.py")).unwrap();
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let quoted = service
        .split_once("# --- README begin\n")
        .and_then(|(_, rest)| rest.split_once("# --- README end\n"))
        .map(|(quoted, _)| quoted)
        .expect("service.py marks the part the README quotes");
    assert!(
        readme.contains(quoted),
        "README.md's section \"Use the protocol from your own service\" must quote \
         examples/python-payments/service.py between its README markers verbatim"
    );
}

#[tokio::test]
async fn django_payments_sample_app_503s() {
    unavailable(Example::Django).await;
}

#[tokio::test]
async fn fastify_payments_sample_app_503s() {
    unavailable(Example::Fastify).await;
}

/// examples/README.md's "Running one by hand": each app started with its command line there,
/// without `PORT`, listens on the port the line names (8081 Python, 8082 Node — beside the
/// daemon's 8080; a language's two apps share its port), as its first line says. The Rust one's
/// line is `cargo run`, which cannot run inside `cargo test` (the build directory's lock is
/// held): its `main.rs` default is compared.
#[tokio::test]
async fn each_example_starts_on_the_port_examples_readme_names() {
    let readme = std::fs::read_to_string(repo_root().join("examples/README.md")).unwrap();
    let line = regex::Regex::new(r"(?m)^(?<command>\S.*?)\s+# on (?<port>\d+)$").unwrap();
    let lines: Vec<(String, String)> = line
        .captures_iter(&readme)
        .map(|c| (c["command"].to_owned(), c["port"].to_owned()))
        .collect();
    let port_of = |script: &str| {
        lines
            .iter()
            .find(|(command, _)| command.contains(script))
            .unwrap_or_else(|| panic!("examples/README.md starts no {script} `# on PORT`"))
            .clone()
    };
    for (example, script) in [
        (Example::Python, "examples/python-payments/service.py"),
        (
            Example::Django,
            "examples/python-payments/django_service.py",
        ),
        (Example::Node, "examples/node-payments/service.js"),
        (Example::Fastify, "examples/node-payments/fastify.js"),
    ] {
        setup(example);
        let (command, port) = port_of(script);
        let mut child = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(format!("exec {command}"))
            .current_dir(repo_root())
            .env_remove("PORT")
            // Never reached: the examples connect on the first request.
            .env("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/none")
            .env("PAYMENTS_TOKENS", tokens())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{command}: no first line"))
            .unwrap();
        assert_eq!(
            first.as_deref(),
            Some(format!("listening on http://127.0.0.1:{port}").as_str()),
            "{command}: examples/README.md says {port} (None: it exited, the port taken on this machine?)"
        );
    }
    let (_, port) = port_of("cargo run -p rust-payments");
    let main =
        std::fs::read_to_string(repo_root().join("examples/rust-payments/src/main.rs")).unwrap();
    assert!(
        main.contains(&format!("env_or(\"PORT\", \"{port}\")")),
        "examples/rust-payments/src/main.rs's default PORT is not {port}"
    );
}

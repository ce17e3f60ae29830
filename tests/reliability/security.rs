//! Security properties of the real daemon process: a permission revoked in the tokens file and
//! reloaded by SIGHUP stops replays (and a broken file changes nothing); logs at debug level and
//! `/metrics` never contain a token, key, request_id, body fragment or the database password,
//! whatever route and failure a request takes.

use std::time::{Duration, Instant};

use serde_json::json;
use tombstoned::auth::token_digest_hex;

use crate::daemon::{connect, example_tokens, Daemon, DaemonSpec, ALICE, BOB};
use crate::harness::TestDb;
use crate::ledger::{Answer, Reply, Who};
use crate::load::Api;

const ALICE_WHO: Who = Who {
    token: ALICE,
    tenant: "acme",
    principal: "alice",
};
const BOB_WHO: Who = Who {
    token: BOB,
    tenant: "acme",
    principal: "bob",
};

fn reply(answer: Answer) -> Reply {
    match answer {
        Answer::Reply(r) => r,
        other => panic!("no answer: {other:?}"),
    }
}

/// Polls `request` until its answer satisfies `done` (a reload takes effect asynchronously).
async fn until_answer<F, Fut>(what: &str, mut request: F, done: impl Fn(&Reply) -> bool) -> Reply
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = reply(request().await);
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {r:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn order_body(request_id: &str) -> String {
    json!({"request_id": request_id, "amount": "100.00", "item": "book",
           "recipient": "reader@example.com"})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permission_revoked_by_sighup_stops_replays_and_a_broken_file_changes_nothing() {
    let db = TestDb::new().await;
    let mut daemon = Daemon::start(DaemonSpec::new(&db.url)).await;
    let api = Api::new(&daemon.api, Duration::from_secs(10));
    let first = reply(api.post(ALICE_WHO, "hup-1", order_body("hup-req-1")).await);
    assert_eq!(first.status, 201, "{}", first.text);

    let revoked = example_tokens().replacen(
        "permissions = [\"orders:create\", \"orders:read\"]\napproval_limit = \"5000.00 CNY\"",
        "permissions = [\"orders:read\"]\napproval_limit = \"5000.00 CNY\"",
        1,
    );
    assert_ne!(revoked, example_tokens());
    daemon.write_tokens(&revoked);
    daemon.sighup();
    let refused = until_answer(
        "the replay is refused after the reload",
        || api.post(ALICE_WHO, "hup-1", order_body("hup-req-1")),
        |r| r.status == 403,
    )
    .await;
    assert_eq!(refused.problem(), "permission-denied");
    assert!(!refused.text.contains("order_id") && !refused.replayed);
    let status = reply(api.get(ALICE_WHO, "/v1/idempotency-keys/hup-1").await);
    assert_eq!(status.status, 403);
    // Reading is still allowed: only orders:create was revoked.
    let location = first.location.clone().unwrap();
    assert_eq!(reply(api.get(ALICE_WHO, &location).await).status, 200);

    // A broken file is refused whole: the revocation stays, bob keeps working.
    daemon.write_tokens("[[token]]\nsha256 = \"not-hex\"\n");
    daemon.sighup();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !daemon.stderr().contains("API reload failed") {
        assert!(Instant::now() < deadline, "{}", daemon.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        reply(api.post(ALICE_WHO, "hup-1", order_body("hup-req-1")).await).status,
        403
    );
    assert_eq!(
        reply(api.post(BOB_WHO, "hup-b", order_body("hup-req-b")).await).status,
        201
    );

    // Restored: the replay is the original, byte for byte.
    daemon.write_tokens(&example_tokens());
    daemon.sighup();
    let back = until_answer(
        "the replay works again after restoring",
        || api.post(ALICE_WHO, "hup-1", order_body("hup-req-1")),
        |r| r.status == 201,
    )
    .await;
    assert!(back.replayed);
    assert_eq!(back.text, first.text);
    assert!(daemon.alive());
    assert!(daemon.terminate().await.success());
}

/// Tokens of this test: every one a secret that must never appear in logs or metrics.
const T_ALICE: &str = "tok-SECRET-alice-5f1c0a";
const T_READER: &str = "tok-SECRET-reader-77a0b2";
const T_SPAMMER: &str = "tok-SECRET-spammer-1b2d3c";
const T_GLOBEX: &str = "tok-SECRET-globex-9e3a4d";
const T_UNKNOWN: &str = "tok-SECRET-unknown-000000";
const DB_PASSWORD: &str = "db-SECRET-password-31x";

fn secret_tokens() -> String {
    let entry = |token: &str, tenant: &str, principal: &str, extra: &str| {
        format!(
            "[[token]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\nprincipal = \"{principal}\"\n{extra}\n\n",
            token_digest_hex(token)
        )
    };
    [
        entry(
            T_ALICE,
            "acme",
            "alice",
            "permissions = [\"orders:create\", \"orders:read\"]\napproval_limit = \"5000.00 CNY\"",
        ),
        entry(
            T_READER,
            "acme",
            "reader",
            "permissions = [\"orders:read\"]",
        ),
        entry(
            T_SPAMMER,
            "acme",
            "spammer",
            "permissions = [\"orders:create\"]",
        ),
        entry(
            T_GLOBEX,
            "globex",
            "gina",
            "permissions = [\"orders:create\", \"orders:read\"]",
        ),
    ]
    .concat()
}

const fn who(token: &'static str, tenant: &'static str, principal: &'static str) -> Who {
    Who {
        token,
        tenant,
        principal,
    }
}

/// Drives every route and every failure the API has through the real daemon with
/// `RUST_LOG=debug --log-format json`, then scans everything it logged and `/metrics` for every
/// secret used.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn logs_at_debug_and_metrics_never_contain_tokens_keys_or_bodies() {
    let db = TestDb::new().await;
    let mut spec = DaemonSpec::new(&format!("{} password={DB_PASSWORD}", db.url))
        .set("retention", "replay_window", "\"2s\"")
        .set("database", "pool_size", "1")
        .set("database", "connect_timeout", "\"1s\"")
        .set("api", "claim_lock_timeout", "\"10s\"")
        .set("api", "rate_limit_per_second", "1")
        .set("api", "rate_limit_burst", "100");
    spec.tokens = secret_tokens();
    spec.rust_log = "debug".into();
    spec.json_logs = true;
    let mut daemon = Daemon::start(spec).await;
    let api = Api::new(&daemon.api, Duration::from_secs(20));
    let alice = who(T_ALICE, "acme", "alice");
    let reader = who(T_READER, "acme", "reader");
    let spammer = who(T_SPAMMER, "acme", "spammer");
    let globex = who(T_GLOBEX, "globex", "gina");
    let unknown = who(T_UNKNOWN, "acme", "nobody");

    let body = |request_id: &str, amount: &str| {
        json!({"request_id": request_id, "amount": amount, "item": "item-SECRET-widget",
               "recipient": "recipient-SECRET@example.com",
               "metadata": {"note": "metadata-SECRET-note"}})
        .to_string()
    };
    let mut secrets: Vec<String> = [
        T_ALICE,
        T_READER,
        T_SPAMMER,
        T_GLOBEX,
        T_UNKNOWN,
        DB_PASSWORD,
        "key-SECRET-1",
        "key-SECRET-2",
        "key-SECRET-3",
        "key-SECRET-4",
        "key-SECRET-5",
        "key-SECRET-6",
        "key-SECRET-pool",
        "req-SECRET-1",
        "req-SECRET-4",
        "req-SECRET-5",
        "item-SECRET-widget",
        "recipient-SECRET",
        "metadata-SECRET-note",
        "malformed-SECRET-body",
        "SECRETCUR",
        "pad-SECRET",
        "plain-SECRET-text",
        "SECRET-version",
        "SECRET-route",
        "not-a-uuid-SECRET",
        "bad key SECRET",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut statuses = Vec::new();
    let post = |status: &mut Vec<u16>, r: Answer| {
        let r = reply(r);
        status.push(r.status);
        r
    };

    // 201, replay, key reused 422, duplicate request_id 200 and 409, approval limit 422 twice.
    let created = post(
        &mut statuses,
        api.post(alice, "key-SECRET-1", body("req-SECRET-1", "100.00"))
            .await,
    );
    assert_eq!(created.status, 201, "{}", created.text);
    let order_id = serde_json::from_str::<serde_json::Value>(&created.text).unwrap()["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    secrets.push(order_id.clone());
    for (key, request_id, amount) in [
        ("key-SECRET-1", "req-SECRET-1", "100.00"),
        ("key-SECRET-1", "req-SECRET-1", "101.00"),
        ("key-SECRET-2", "req-SECRET-1", "100.00"),
        ("key-SECRET-3", "req-SECRET-1", "102.00"),
        ("key-SECRET-4", "req-SECRET-4", "9000.00"),
        ("key-SECRET-4", "req-SECRET-4", "9000.00"),
    ] {
        post(
            &mut statuses,
            api.post(alice, key, body(request_id, amount)).await,
        );
    }
    // Reads: 200, 404 across tenants, 403, 404 for a bad id, 404 route, key status 200/404.
    let order_path = format!("/v1/orders/{order_id}");
    for (w, path) in [
        (alice, order_path.as_str()),
        (reader, order_path.as_str()),
        (globex, order_path.as_str()),
        (alice, "/v1/orders/not-a-uuid-SECRET"),
        (alice, "/v1/idempotency-keys/key-SECRET-1"),
        (globex, "/v1/idempotency-keys/key-SECRET-1"),
        (reader, "/v1/idempotency-keys/key-SECRET-1"),
        (alice, "/v1/idempotency-keys/bad%20key%20SECRET"),
        (alice, "/v1/SECRET-route"),
    ] {
        post(&mut statuses, api.get(w, path).await);
    }
    let raw =
        |token: &str, key: &str, content_type: &str, extra: Option<(&str, &str)>, body: String| {
            let mut request = api
                .http
                .post(format!("{}/v1/orders", api.base))
                .bearer_auth(token)
                .header("idempotency-key", key)
                .header("content-type", content_type);
            if let Some((k, v)) = extra {
                request = request.header(k, v);
            }
            let request = request.body(body);
            async move { crate::load::Api::answer_of(request.send().await).await }
        };
    // 400s, 401, 403, 405, 413, 415.
    post(
        &mut statuses,
        raw(
            T_ALICE,
            "bad key SECRET",
            "application/json",
            None,
            body("req-SECRET-5", "1.00"),
        )
        .await,
    );
    post(
        &mut statuses,
        raw(
            T_ALICE,
            "key-SECRET-5",
            "application/json",
            None,
            "{\"request_id\": \"malformed-SECRET-body\"".into(),
        )
        .await,
    );
    post(&mut statuses, raw(T_ALICE, "key-SECRET-5", "application/json", None,
        json!({"request_id": "req-SECRET-5", "amount": "1", "currency": "SECRETCUR", "item": "i", "recipient": "r"}).to_string()).await);
    post(
        &mut statuses,
        raw(
            T_ALICE,
            "key-SECRET-5",
            "application/json",
            Some(("api-version", "SECRET-version")),
            body("req-SECRET-5", "1.00"),
        )
        .await,
    );
    post(
        &mut statuses,
        raw(
            T_UNKNOWN,
            "key-SECRET-5",
            "application/json",
            None,
            body("req-SECRET-5", "1.00"),
        )
        .await,
    );
    post(
        &mut statuses,
        raw(
            T_READER,
            "key-SECRET-5",
            "application/json",
            None,
            body("req-SECRET-5", "1.00"),
        )
        .await,
    );
    post(
        &mut statuses,
        raw(
            T_ALICE,
            "key-SECRET-5",
            "text/plain",
            None,
            "plain-SECRET-text".into(),
        )
        .await,
    );
    post(
        &mut statuses,
        raw(
            T_ALICE,
            "key-SECRET-5",
            "application/json",
            None,
            json!({"request_id": "req-SECRET-5", "amount": "1", "item": "i", "recipient": "r",
               "metadata": {"pad": format!("pad-SECRET{}", "x".repeat(20_000))}})
            .to_string(),
        )
        .await,
    );
    let wrong_method = api
        .http
        .delete(format!("{}/v1/orders", api.base))
        .bearer_auth(T_ALICE)
        .header("idempotency-key", "key-SECRET-5")
        .send()
        .await
        .unwrap();
    statuses.push(wrong_method.status().as_u16());
    let _ = unknown;

    // 409 request-in-progress: a session holds the record past claim_lock_timeout.
    let holder = db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT 1 FROM idempotency_records WHERE idempotency_key = 'key-SECRET-1' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    post(
        &mut statuses,
        api.post(alice, "key-SECRET-1", body("req-SECRET-1", "100.00"))
            .await,
    );
    holder.batch_execute("ROLLBACK").await.unwrap();

    // 503 database-unavailable (the only pooled connection is busy past connect_timeout), then
    // 503 outcome-unknown (that claim's backend terminated while it waits).
    let locker = db.client().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let blocked = tokio::spawn({
        let api = api.clone();
        let b = body("req-SECRET-6", "1.00");
        async move { api.post(alice, "key-SECRET-6", b).await }
    });
    let observer = connect(&db.url, "observer").await;
    crate::cleanup_support::wait_until_sessions_wait(&observer, "tombstoned/api", 1).await;
    post(
        &mut statuses,
        api.post(alice, "key-SECRET-pool", body("req-SECRET-5", "1.00"))
            .await,
    );
    observer
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = 'tombstoned/api' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    post(&mut statuses, blocked.await.unwrap());
    locker.batch_execute("COMMIT").await.unwrap();
    secrets.push("req-SECRET-6".into());

    // 429: one principal over its budget.
    for _ in 0..120 {
        let r = reply(api.get(spammer, "/v1/idempotency-keys/key-SECRET-1").await);
        if r.status == 429 {
            statuses.push(429);
            break;
        }
    }
    // 410 once the 2-second window is over, after the cleaner has run (tombstoning at debug).
    let expired = until_answer(
        "the key expires",
        || api.post(alice, "key-SECRET-1", body("req-SECRET-1", "100.00")),
        |r| r.status == 410,
    )
    .await;
    statuses.push(expired.status);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !daemon.stderr().contains("batch committed") {
        assert!(
            Instant::now() < deadline,
            "the cleaner never logged a batch"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    statuses.sort_unstable();
    statuses.dedup();
    assert_eq!(
        statuses,
        [200, 201, 400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 429, 503],
        "every status the API has was exercised"
    );
    let metrics = daemon.metrics().await;
    assert!(daemon.terminate().await.success());
    let logs = daemon.stderr();

    // Debug logging really was on, in JSON, one object per line.
    let mut request_lines = 0;
    for line in logs.lines() {
        let entry: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        if entry["message"] == "request" {
            request_lines += 1;
        }
    }
    assert!(
        request_lines >= 30,
        "{request_lines} request lines:\n{logs}"
    );
    for secret in &secrets {
        for (what, text) in [("logs", &logs), ("/metrics", &metrics)] {
            if let Some(line) = text.lines().find(|l| l.contains(secret.as_str())) {
                panic!("{what} contain {secret:?}: {line}");
            }
        }
    }
}

//! The claim under concurrency, with real sessions and barriers observed in `pg_stat_activity`:
//! the commit race, the rollback race, the lock-timeout race, and the lost response.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt as _;
use tombstoned::fingerprint::Fingerprint;
use tombstoned::money::Currency;
use tombstoned::order_request::{parse_order, RequestDefaults};

use crate::api_support::{backend_pid, order, wait_until_api_blocked_by, TestApi, ALICE};
use crate::harness::wait_until_app_lock_wait;

const WAIT: Duration = Duration::from_secs(20);

/// The fingerprint the API computes for `body` (default currency CNY, default API version).
fn fingerprint_of(body: &serde_json::Value) -> Vec<u8> {
    let defaults = RequestDefaults {
        currency: Currency::parse("CNY").unwrap(),
    };
    let order = parse_order(body.to_string().as_bytes(), &defaults).unwrap();
    Fingerprint::of(&order, "2026-12-01")
        .unwrap()
        .as_bytes()
        .to_vec()
}

/// Another session that has claimed `key` for alice's `body` and not committed: an in-flight
/// owner, holding the record's row lock until the caller commits or rolls back.
async fn in_flight_owner(
    api: &TestApi,
    key: &str,
    body: &serde_json::Value,
    response_body: &str,
) -> tokio_postgres::Client {
    let owner = api.db.client().await;
    // The scope committed first (V5): only the record is held.
    owner
        .batch_execute("SELECT ensure_scope('acme', 'alice', 'create-order')")
        .await
        .unwrap();
    owner.batch_execute("BEGIN").await.unwrap();
    owner
        .execute(
            "INSERT INTO idempotency_records (scope_id,
                 idempotency_key, fingerprint, status_code, response_body, replay_deadline)
             VALUES (ensure_scope('acme', 'alice', 'create-order'), $1, $2, 201, $3::text::jsonb,
                     now() + interval '1 day')",
            &[&key, &fingerprint_of(body), &response_body],
        )
        .await
        .unwrap();
    owner
}

#[tokio::test]
async fn thirty_two_concurrent_identical_requests_create_exactly_one_order() {
    let api = Arc::new(TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "30s")]).await);
    // The first claims are held at the orders table (the test's SHARE lock) until every request
    // is either waiting in the database or answered, so they all overlap; then all go at once.
    let gate = api.db.client().await;
    gate.batch_execute("BEGIN; LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let answered = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(32));
    let requests: Vec<_> = (0..32)
        .map(|_| {
            let (api, barrier, answered) = (
                Arc::clone(&api),
                Arc::clone(&barrier),
                Arc::clone(&answered),
            );
            tokio::spawn(async move {
                barrier.wait().await;
                let reply = api.post(ALICE, "key-race", &order("req-race")).await;
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                reply
            })
        })
        .collect();
    let observer = api.db.client().await;
    let started = std::time::Instant::now();
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'tombstoned/api' AND datname = current_database()
                   AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        let answered = answered.load(std::sync::atomic::Ordering::SeqCst);
        if waiting >= 1 && waiting + answered == 32 {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "{waiting} claims waiting, {answered} answered"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gate.batch_execute("COMMIT").await.unwrap();
    let mut replies = Vec::new();
    for r in requests {
        replies.push(r.await.unwrap());
    }
    let created: Vec<_> = replies
        .iter()
        .filter(|r| r.status == 201 && !r.replayed())
        .collect();
    assert_eq!(created.len(), 1, "exactly one owner: {replies:#?}");
    assert!(
        replies.iter().any(|r| r.status == 409),
        "the requests overlapped, so some were turned away: {replies:#?}"
    );
    let original = &created[0].text;
    for r in &replies {
        match r.status {
            201 => assert_eq!(&r.text, original, "every replay is the original's bytes"),
            409 => {
                assert_eq!(r.problem(), "request-in-progress");
                assert!(r.header("retry-after").is_some());
            }
            other => panic!("unexpected {other}: {}", r.text),
        }
    }
    assert_eq!(
        api.counts().await,
        (1, 1, 1),
        "one record, one order, one event"
    );
}

#[tokio::test]
async fn the_waiting_request_becomes_the_owner_when_the_first_owner_rolls_back() {
    let api = TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "30s")]).await;
    let body = order("req-rb");
    // Another session claims the key and has not committed.
    let owner = in_flight_owner(&api, "key-rb", &body, "{}").await;
    let owner_pid = backend_pid(&owner).await;
    let waiter = tokio::spawn({
        let (http, base) = (api.http.clone(), api.base.clone());
        async move {
            TestApi::reply(
                http.post(format!("{base}/v1/orders"))
                    .bearer_auth(ALICE)
                    .header("idempotency-key", "key-rb")
                    .header("content-type", "application/json")
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    });
    let observer = api.db.client().await;
    wait_until_api_blocked_by(&observer, owner_pid, WAIT).await;
    owner.batch_execute("ROLLBACK").await.unwrap();
    let reply = waiter.await.unwrap();
    reply.expect(201);
    assert!(!reply.replayed(), "it ran the business itself");
    assert_eq!(api.counts().await, (1, 1, 1));
}

#[tokio::test]
async fn when_the_owners_business_insert_fails_the_waiting_loser_creates_the_order_once() {
    // A session holds an uncommitted order with the request_id, so the owner's order insert
    // waits on it and fails after claim_lock_timeout (55P03): the owner's whole transaction,
    // claim included, rolls back while a second request waits on the owner's claim.
    // The timeout bounds two steps the test must finish inside it (the second request queued
    // behind the owner; the test seeing it wait on the order and rolling back): 10 s, so a
    // loaded CI machine does not miss them (3 s once did).
    let api = Arc::new(TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "10s")]).await);
    let blocker = api.db.client().await;
    let blocker_pid = backend_pid(&blocker).await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            "INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                                 currency, item, quantity, recipient)
             VALUES (gen_random_uuid(), 'acme', 'bob', 'req-w', 1, 'CNY', 'x', 1, 'y')",
            &[],
        )
        .await
        .unwrap();
    let observer = api.db.client().await;
    let send = |api: &Arc<TestApi>| {
        let api = Arc::clone(api);
        tokio::spawn(async move { api.post(ALICE, "key-w", &order("req-w")).await })
    };
    let first = send(&api);
    let first_pid = wait_until_api_blocked_by(&observer, blocker_pid, WAIT).await;
    let second = send(&api);
    let second_pid = wait_until_api_blocked_by(&observer, first_pid, WAIT).await;
    assert_ne!(first_pid, second_pid);

    let first = first.await.unwrap();
    first.expect(409);
    assert_eq!(first.problem(), "request-in-progress");
    // The first owner rolled back; the second now owns the key and waits on the same order.
    let now_waiting = wait_until_api_blocked_by(&observer, blocker_pid, WAIT).await;
    assert_eq!(now_waiting, second_pid);
    blocker.batch_execute("ROLLBACK").await.unwrap();

    let second = second.await.unwrap();
    second.expect(201);
    assert!(!second.replayed(), "the loser ran the business itself");
    assert_eq!(api.counts().await, (1, 1, 1));
    let client = api.db.client().await;
    let principal: String = client
        .query_one(
            "SELECT principal_id FROM orders WHERE request_id = 'req-w'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(principal, "alice");
}

#[tokio::test]
async fn a_claim_blocked_past_claim_lock_timeout_gets_409_then_the_retry_replays() {
    // The test must see the claim wait before its lock timeout ends it: 2 s of margin.
    let api = TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "2s")]).await;
    let first = api.post(ALICE, "key-l", &order("req-l")).await;
    first.expect(201);

    // A row lock that conflicts with the replay's FOR SHARE, held past the claim lock timeout.
    let holder = api.db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .execute(
            "SELECT 1 FROM idempotency_records WHERE idempotency_key = 'key-l' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();
    let observer = api.db.client().await;
    let blocked = tokio::spawn({
        let (http, base) = (api.http.clone(), api.base.clone());
        async move {
            TestApi::reply(
                http.post(format!("{base}/v1/orders"))
                    .bearer_auth(ALICE)
                    .header("idempotency-key", "key-l")
                    .header("content-type", "application/json")
                    .body(order("req-l").to_string())
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    });
    wait_until_app_lock_wait(&observer, "tombstoned/api", WAIT).await;
    let r = blocked.await.unwrap();
    r.expect(409);
    assert_eq!(r.problem(), "request-in-progress");
    assert_eq!(r.header("retry-after"), Some("1"));
    let detail = r.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("pending") && detail.contains("same Idempotency-Key"),
        "{detail}"
    );

    holder.batch_execute("ROLLBACK").await.unwrap();
    let retry = api.post(ALICE, "key-l", &order("req-l")).await;
    retry.expect(201);
    assert!(retry.replayed());
    assert_eq!(retry.text, first.text);
    assert_eq!(api.counts().await, (1, 1, 1));
    assert!(api
        .metrics_text()
        .contains("tombstoned_claims_total{outcome=\"in_progress\"} 1"));
}

#[tokio::test]
async fn waiting_on_an_in_flight_owner_past_the_timeout_is_409_then_its_committed_result_replays() {
    let api = TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "300ms")]).await;
    let body = order("req-f");
    let owner = in_flight_owner(&api, "key-f", &body, r#"{"from": "owner"}"#).await;
    let r = api.post(ALICE, "key-f", &body).await;
    r.expect(409);
    assert_eq!(r.problem(), "request-in-progress");
    assert_eq!(api.counts().await, (0, 0, 0), "the waiter rolled back");
    owner.batch_execute("COMMIT").await.unwrap();
    let replay = api.post(ALICE, "key-f", &body).await;
    replay.expect(201);
    assert!(replay.replayed());
    assert_eq!(
        replay.text, r#"{"from": "owner"}"#,
        "the owner's committed result"
    );
}

#[tokio::test]
async fn a_response_lost_to_a_vanished_client_is_replayed_on_retry() {
    let api = TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "30s")]).await;
    // Hold the claim inside its transaction (orders locked against inserts) while the client
    // sends its request and goes away without reading anything.
    let holder = api.db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .batch_execute("LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let body = order("req-lost").to_string();
    let address = api.base.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "POST /v1/orders HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {ALICE}\r\n\
         Idempotency-Key: key-lost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let observer = api.db.client().await;
    wait_until_app_lock_wait(&observer, "tombstoned/api", WAIT).await;
    drop(socket); // the client is gone; the handler future is dropped with its connection
                  // Only once the server has observably dropped the request (it stopped counting it) does the
                  // holder let the claim go on: from there only the hand-off to a task of its own can finish
                  // it. (This is the scope's first claim: its first statement writes nothing and the claim
                  // must go on to insert the scope and claim again.)
    let in_flight =
        || crate::daemon_support::sample(&api.metrics_text(), "tombstoned_http_requests_in_flight");
    let deadline = std::time::Instant::now() + WAIT;
    while in_flight() != Some(0.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never noticed the client went away: in flight {:?}",
            in_flight()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        api.count("idempotency_records").await,
        0,
        "nothing committed before the holder let go"
    );
    holder.batch_execute("COMMIT").await.unwrap();

    // The abandoned claim still commits.
    let deadline = std::time::Instant::now() + WAIT;
    while api.count("idempotency_records").await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the claim never committed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let retry = api.post(ALICE, "key-lost", &order("req-lost")).await;
    retry.expect(201);
    assert!(retry.replayed(), "the retry gets the stored outcome");
    assert_eq!(api.counts().await, (1, 1, 1), "no second row anywhere");
}

#[tokio::test]
async fn an_exhausted_pool_answers_503_after_a_bounded_wait() {
    let api = Arc::new(
        TestApi::start_with(&[
            ("TOMBSTONED_DATABASE__POOL_SIZE", "1"),
            ("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "1s"),
            ("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "30s"),
        ])
        .await,
    );
    // The only pooled connection is held by a claim waiting on a table lock.
    let holder = api.db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    holder
        .batch_execute("LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let first = tokio::spawn({
        let api = Arc::clone(&api);
        async move { api.post(ALICE, "key-1", &order("req-1")).await }
    });
    let observer = api.db.client().await;
    wait_until_app_lock_wait(&observer, "tombstoned/api", WAIT).await;

    let started = std::time::Instant::now();
    let second = api.post(ALICE, "key-2", &order("req-2")).await;
    second.expect(503);
    assert_eq!(second.problem(), "database-unavailable");
    assert_eq!(second.header("retry-after"), Some("2"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the wait is bounded"
    );
    assert!(api
        .metrics_text()
        .contains("tombstoned_db_errors_total{sqlstate_class=\"pool_timeout\"} 1"));

    holder.batch_execute("COMMIT").await.unwrap();
    first.await.unwrap().expect(201);
    // The key of the refused request was not consumed.
    api.post(ALICE, "key-2", &order("req-2")).await.expect(201);
}

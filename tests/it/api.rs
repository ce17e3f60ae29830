//! The claim/replay endpoint over real HTTP against a real PostgreSQL: every row of the outcome
//! table in docs/protocol.md, the reads, authentication and isolation, reload and rate limits.

use serde_json::json;
use tombstoned::config::DatabaseUrl;
use tombstoned::http::ApiError;

use crate::api_support::{
    default_tokens, order, TestApi, ALICE, BOB, GLOBEX_ALICE, READER, WRITER,
};
use crate::harness::TestDb;

#[tokio::test]
async fn create_returns_201_with_location_and_writes_record_order_and_event_together() {
    scenario_create(&TestApi::start().await).await;
}

/// [`create_returns_201_with_location_and_writes_record_order_and_event_together`] on any server (the pooler tests run it through PgBouncer).
pub(crate) async fn scenario_create(api: &TestApi) {
    let r = api.post(ALICE, "key-1", &order("req-1")).await;
    r.expect(201);
    assert!(!r.replayed());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body = r.json();
    let order_id = body["order_id"].as_str().unwrap().to_owned();
    assert_eq!(
        r.header("location"),
        Some(format!("/v1/orders/{order_id}").as_str())
    );
    assert_eq!(body["request_id"], "req-1");
    assert_eq!(body["amount_minor"], 10000);
    assert_eq!(body["amount"], "100.00");
    assert_eq!(body["currency"], "CNY");
    assert_eq!(body["item"], "book");
    assert_eq!(body["quantity"], 1);
    assert_eq!(body["recipient"], "reader@example.com");
    assert_eq!(body["status"], "created");
    assert!(body["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(api.counts().await, (1, 1, 1));

    let client = api.db.client().await;
    let row = client
        .query_one(
            "SELECT r.status_code, r.response_body::text, r.order_id::text, r.expired,
                    r.replay_deadline - r.created_at, o.created_at = r.created_at,
                    e.event_type, e.payload->'order' = r.response_body, e.order_id::text
             FROM idempotency_records r JOIN orders o USING (order_id)
             JOIN outbox_events e USING (order_id)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i16>(0), 201);
    assert_eq!(
        row.get::<_, String>(1),
        r.text,
        "the response is the stored body"
    );
    assert_eq!(row.get::<_, String>(2), order_id);
    assert!(!row.get::<_, bool>(3));
    let window: String = client
        .query_one(
            "SELECT extract(epoch FROM replay_deadline - created_at)::text FROM idempotency_records",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        window, "86400.000000",
        "replay_deadline = claim time + replay_window"
    );
    assert!(
        row.get::<_, bool>(5),
        "order and record share the transaction's now()"
    );
    assert_eq!(row.get::<_, String>(6), "order.created");
    assert!(row.get::<_, bool>(7));
    assert_eq!(row.get::<_, String>(8), order_id);
}

#[tokio::test]
async fn replay_returns_the_stored_status_and_body_byte_for_byte() {
    scenario_replay(&TestApi::start().await).await;
}

/// [`replay_returns_the_stored_status_and_body_byte_for_byte`] on any server (the pooler tests run it through PgBouncer).
pub(crate) async fn scenario_replay(api: &TestApi) {
    let first = api.post(ALICE, "key-1", &order("req-1")).await;
    first.expect(201);
    // The same intent spelled differently: amount forms, field order, explicit defaults,
    // metadata, and headers (Api-Version given explicitly).
    let respellings = [
        json!({"request_id": "req-1", "amount": "100", "item": "book", "recipient": "reader@example.com"}),
        json!({"request_id": "req-1", "amount": "100.0", "item": "book", "recipient": "reader@example.com"}),
        json!({"recipient": "reader@example.com", "item": "book", "amount_minor": 10000, "request_id": "req-1"}),
        json!({"request_id": "req-1", "amount": "100.00", "currency": "cny", "quantity": 1,
               "item": "book", "recipient": "reader@example.com", "metadata": {"trace_id": "t-9"}}),
    ];
    for body in &respellings {
        let again = api.post(ALICE, "key-1", body).await;
        again.expect(201);
        assert!(again.replayed(), "{body}");
        assert_eq!(again.text, first.text, "byte-for-byte for {body}");
        assert_eq!(again.header("location"), first.header("location"));
        assert_eq!(again.header("content-type"), Some("application/json"));
    }
    let versioned = api
        .post_raw(
            Some(ALICE),
            &[
                ("idempotency-key", b"key-1"),
                ("content-type", b"application/json; charset=utf-8"),
                ("api-version", b"2026-12-01"),
            ],
            order("req-1").to_string().into_bytes(),
        )
        .await;
    versioned.expect(201);
    assert!(versioned.replayed());
    assert_eq!(versioned.text, first.text);
    assert_eq!(api.counts().await, (1, 1, 1), "nothing executed twice");
    let text = api.metrics_text();
    assert!(
        text.contains("tombstoned_claims_total{outcome=\"created\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tombstoned_claims_total{outcome=\"replayed\"} 5"),
        "{text}"
    );
}

#[tokio::test]
async fn same_key_with_a_different_intent_is_refused_and_never_sees_the_old_body() {
    scenario_key_reused(&TestApi::start().await).await;
}

/// [`same_key_with_a_different_intent_is_refused_and_never_sees_the_old_body`] on any server (the pooler tests run it through PgBouncer).
pub(crate) async fn scenario_key_reused(api: &TestApi) {
    let first = api.post(ALICE, "key-1", &order("req-1")).await;
    first.expect(201);
    let base = order("req-1");
    let changes = [
        ("request_id", json!("req-2")),
        ("amount", json!("100.01")),
        ("currency", json!("USD")),
        ("item", json!("pen")),
        ("quantity", json!(2)),
        ("recipient", json!("other@example.com")),
    ];
    for (field, value) in changes {
        let mut body = base.clone();
        body[field] = value;
        let r = api.post(ALICE, "key-1", &body).await;
        r.expect(422);
        assert_eq!(r.problem(), "idempotency-key-reused", "{field}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(
            !r.text.contains("order_id"),
            "no trace of the stored order: {}",
            r.text
        );
        assert!(!r.replayed());
    }
    assert_eq!(api.counts().await, (1, 1, 1));
}

/// Every record's replay window closed, then tombstoned by the real cleaner (one run).
async fn tombstone_all(api: &TestApi) {
    let client = api.db.client().await;
    let records = client
        .execute(
            "UPDATE idempotency_records SET replay_deadline = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let report = crate::cleanup_support::run(&api.db.config()).await;
    assert_eq!(report.rows_tombstoned, records, "{report:?}");
}

#[tokio::test]
async fn after_tombstoning_same_intent_is_410_with_the_order_url_and_another_intent_422() {
    scenario_after_tombstoning(&TestApi::start().await).await;
}

/// [`after_tombstoning_same_intent_is_410_with_the_order_url_and_another_intent_422`] on any server (the pooler tests run it through PgBouncer).
pub(crate) async fn scenario_after_tombstoning(api: &TestApi) {
    let first = api.post(ALICE, "key-1", &order("req-1")).await;
    first.expect(201);
    let order_id = first.json()["order_id"].as_str().unwrap().to_owned();
    tombstone_all(api).await;

    let again = api.post(ALICE, "key-1", &order("req-1")).await;
    again.expect(410);
    assert_eq!(again.problem(), "replay-window-expired");
    let problem = again.json();
    assert_eq!(problem["order_id"], order_id.as_str());
    assert_eq!(problem["order_url"], format!("/v1/orders/{order_id}"));
    assert!(problem.get("amount").is_none(), "no body after expiry");
    assert!(!again.replayed());
    assert_eq!(again.header("location"), first.header("location"));

    let mut changed = order("req-1");
    changed["amount"] = json!("1.00");
    let reused = api.post(ALICE, "key-1", &changed).await;
    reused.expect(422);
    assert_eq!(reused.problem(), "idempotency-key-reused");

    let status = api.get(Some(ALICE), "/v1/idempotency-keys/key-1").await;
    status.expect(200);
    let s = status.json();
    assert_eq!(s["state"], "expired");
    assert_eq!(s["status_code"], 201);
    assert_eq!(s["order_id"], order_id.as_str());
    assert!(s["expired_at"].is_string());
    assert_eq!(api.counts().await, (1, 1, 1), "never re-executed");
    // The order itself is still there to be looked up.
    api.get(Some(ALICE), &format!("/v1/orders/{order_id}"))
        .await
        .expect(200);
}

#[tokio::test]
async fn past_the_deadline_but_not_yet_tombstoned_is_already_410() {
    let api = TestApi::start().await;
    api.post(ALICE, "key-1", &order("req-1")).await.expect(201);
    let client = api.db.client().await;
    client
        .execute(
            "UPDATE idempotency_records SET replay_deadline = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    let r = api.post(ALICE, "key-1", &order("req-1")).await;
    r.expect(410);
    assert_eq!(r.problem(), "replay-window-expired");
    assert!(r.json()["order_url"].is_string());
    let s = api
        .get(Some(ALICE), "/v1/idempotency-keys/key-1")
        .await
        .json();
    assert_eq!(s["state"], "expired");
    assert!(s["expired_at"].is_null(), "not tombstoned yet");
}

#[tokio::test]
async fn a_short_replay_window_is_measured_on_the_database_clock() {
    let api = TestApi::start_with(&[("TOMBSTONED_RETENTION__REPLAY_WINDOW", "1s")]).await;
    api.post(ALICE, "key-1", &order("req-1")).await.expect(201);
    let client = api.db.client().await;
    let window: String = client
        .query_one(
            "SELECT (replay_deadline - created_at)::text FROM idempotency_records",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(window, "00:00:01");
}

#[tokio::test]
async fn an_existing_request_id_under_a_new_key_replays_for_its_owner_and_conflicts_otherwise() {
    scenario_duplicate_request_id(&TestApi::start().await).await;
}

/// [`an_existing_request_id_under_a_new_key_replays_for_its_owner_and_conflicts_otherwise`] on any server (the pooler tests run it through PgBouncer).
pub(crate) async fn scenario_duplicate_request_id(api: &TestApi) {
    let first = api.post(ALICE, "key-1", &order("req-1")).await;
    first.expect(201);

    // Same principal, same parameters, new key: that order, marked as a replay; key not recorded.
    let same = api.post(ALICE, "key-2", &order("req-1")).await;
    same.expect(200);
    assert!(same.replayed());
    assert_eq!(
        same.text, first.text,
        "the same representation, byte for byte"
    );
    assert_eq!(same.header("location"), first.header("location"));
    assert_eq!(api.counts().await, (1, 1, 1));
    api.get(Some(ALICE), "/v1/idempotency-keys/key-2")
        .await
        .expect(404);

    // Different parameters: conflict that reveals nothing.
    let mut changed = order("req-1");
    changed["amount"] = json!("5.00");
    let conflict = api.post(ALICE, "key-3", &changed).await;
    conflict.expect(409);
    assert_eq!(conflict.problem(), "duplicate-request-id");
    let order_id = first.json()["order_id"].as_str().unwrap().to_owned();
    assert!(!conflict.text.contains(&order_id));
    assert!(conflict.header("location").is_none());

    // Another principal of the tenant, identical parameters: still a conflict.
    let other = api.post(BOB, "key-1", &order("req-1")).await;
    other.expect(409);
    assert_eq!(other.problem(), "duplicate-request-id");
    assert!(!other.text.contains(&order_id));
    assert_eq!(api.counts().await, (1, 1, 1), "no key was recorded");

    // The rejected keys are free: a corrected request with them succeeds.
    api.post(ALICE, "key-3", &order("req-3")).await.expect(201);
    let text = api.metrics_text();
    assert!(
        text.contains("tombstoned_claims_total{outcome=\"duplicate_request\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("tombstoned_db_errors_total{sqlstate_class=\"23\"} 3"),
        "{text}"
    );
}

#[tokio::test]
async fn over_the_approval_limit_is_a_stored_422_replayed_like_a_success() {
    let api = TestApi::start().await;
    let mut big = order("req-big");
    big["amount"] = json!("5000.01");
    let first = api.post(ALICE, "key-big", &big).await;
    first.expect(422);
    assert_eq!(first.problem(), "approval-limit-exceeded");
    assert!(first.json()["detail"]
        .as_str()
        .unwrap()
        .contains("5000.00 CNY"));
    assert!(!first.replayed());
    assert_eq!(
        api.counts().await,
        (1, 0, 0),
        "a record, no order, no event"
    );

    let again = api.post(ALICE, "key-big", &big).await;
    again.expect(422);
    assert!(again.replayed());
    assert_eq!(again.text, first.text);
    assert_eq!(
        again.header("content-type"),
        Some("application/problem+json")
    );

    let status = api
        .get(Some(ALICE), "/v1/idempotency-keys/key-big")
        .await
        .json();
    assert_eq!(status["state"], "completed");
    assert_eq!(status["status_code"], 422);
    assert!(status["order_id"].is_null());

    // Exactly the limit is fine; a currency without a limit is refused; no limit at all is fine.
    let mut edge = order("req-edge");
    edge["amount"] = json!("5000.00");
    api.post(ALICE, "key-edge", &edge).await.expect(201);
    let mut yen = order("req-yen");
    yen["amount"] = json!("1");
    yen["currency"] = json!("JPY");
    let r = api.post(ALICE, "key-yen", &yen).await;
    r.expect(422);
    assert!(r.json()["detail"]
        .as_str()
        .unwrap()
        .contains("no approval limit in JPY"));
    let mut huge = order("req-huge");
    huge["amount"] = json!("99999999.00");
    api.post(BOB, "key-huge", &huge).await.expect(201);
    let text = api.metrics_text();
    assert!(
        text.contains("tombstoned_claims_total{outcome=\"rejected\"} 2"),
        "{text}"
    );
}

#[tokio::test]
async fn a_refused_request_does_not_consume_its_key() {
    let api = TestApi::start().await;
    let mut bad = order("req-1");
    bad["amount"] = json!("1.234");
    bad["quantity"] = json!(0);
    let r = api.post(ALICE, "key-1", &bad).await;
    r.expect(400);
    assert_eq!(r.problem(), "validation-failed");
    let mut fields: Vec<String> = r.json()["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap().to_owned())
        .collect();
    fields.sort();
    assert_eq!(fields, ["amount", "quantity"]);
    assert_eq!(api.counts().await, (0, 0, 0));
    api.post(ALICE, "key-1", &order("req-1")).await.expect(201);
}

#[tokio::test]
async fn authentication_and_permissions_are_checked_on_every_request() {
    let api = TestApi::start().await;
    let missing = api
        .post_raw(
            None,
            &[
                ("idempotency-key", b"k"),
                ("content-type", b"application/json"),
            ],
            order("r").to_string().into_bytes(),
        )
        .await;
    missing.expect(401);
    assert_eq!(missing.problem(), "unauthenticated");
    assert!(missing
        .header("www-authenticate")
        .unwrap()
        .starts_with("Bearer"));
    api.post("not-a-token", "k", &order("r")).await.expect(401);
    let basic = api
        .http
        .post(format!("{}/v1/orders", api.base))
        .basic_auth("acme", Some(ALICE))
        .header("idempotency-key", "k")
        .header("content-type", "application/json")
        .body(order("r").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status().as_u16(), 401);
    let denied = api.post(READER, "k", &order("r")).await;
    denied.expect(403);
    assert_eq!(denied.problem(), "permission-denied");
    assert!(denied.text.contains("orders:create"));

    let created = api.post(WRITER, "k", &order("r")).await;
    created.expect(201);
    let url = created.header("location").unwrap().to_owned();
    api.get(Some(WRITER), &url).await.expect(403);
    api.get(Some(READER), &url).await.expect(200);
    api.get(None, &url).await.expect(401);
    api.get(Some(READER), "/v1/idempotency-keys/k")
        .await
        .expect(403);
    assert_eq!(api.counts().await, (1, 1, 1));
}

#[tokio::test]
async fn tenants_and_principals_are_isolated() {
    let api = TestApi::start().await;
    let a = api.post(ALICE, "shared-key", &order("req-1")).await;
    a.expect(201);
    // The same key (and even the same request_id) in another tenant is another record.
    let g = api.post(GLOBEX_ALICE, "shared-key", &order("req-1")).await;
    g.expect(201);
    assert!(!g.replayed());
    assert_ne!(a.json()["order_id"], g.json()["order_id"]);
    // The same key from another principal of the same tenant is another record too (its
    // request_id must differ: request ids are unique per tenant).
    let b = api.post(BOB, "shared-key", &order("req-2")).await;
    b.expect(201);
    assert!(!b.replayed());
    assert_eq!(api.counts().await, (3, 3, 3));

    let a_url = a.header("location").unwrap().to_owned();
    let other_tenant = api.get(Some(GLOBEX_ALICE), &a_url).await;
    other_tenant.expect(404);
    assert_eq!(other_tenant.problem(), "order-not-found");
    // Orders are visible tenant-wide.
    api.get(Some(BOB), &a_url).await.expect(200);
    // Key status is per principal.
    let mine = api
        .get(Some(ALICE), "/v1/idempotency-keys/shared-key")
        .await
        .json();
    assert_eq!(mine["order_id"], a.json()["order_id"]);
    let theirs = api
        .get(Some(GLOBEX_ALICE), "/v1/idempotency-keys/shared-key")
        .await
        .json();
    assert_eq!(theirs["order_id"], g.json()["order_id"]);
    api.get(Some(BOB), "/v1/idempotency-keys/other")
        .await
        .expect(404);
}

#[tokio::test]
async fn the_order_and_key_status_reads() {
    scenario_reads(&TestApi::start().await).await;
}

/// [`the_order_and_key_status_reads`] on any server (the pooler tests run it through PgBouncer).
pub(crate) async fn scenario_reads(api: &TestApi) {
    let created = api.post(ALICE, "key/with:odd~chars", &order("req-1")).await;
    created.expect(201);
    let body = created.json();
    let got = api
        .get(Some(ALICE), created.header("location").unwrap())
        .await;
    got.expect(200);
    assert_eq!(got.json(), body, "GET shows the same order as the 201");

    let status = api
        .get(Some(ALICE), "/v1/idempotency-keys/key%2Fwith:odd~chars")
        .await;
    status.expect(200);
    let s = status.json();
    assert_eq!(s["idempotency_key"], "key/with:odd~chars");
    assert_eq!(s["operation"], "create-order");
    assert_eq!(s["state"], "completed");
    assert_eq!(s["status_code"], 201);
    assert_eq!(s["order_id"], body["order_id"]);
    assert!(s["created_at"].is_string() && s["replay_deadline"].is_string());
    assert!(s["expired_at"].is_null());
    assert!(
        !status.text.contains("reader@example.com"),
        "never the body"
    );

    let nf = api.get(Some(ALICE), "/v1/idempotency-keys/nope").await;
    nf.expect(404);
    assert_eq!(nf.problem(), "idempotency-key-not-found");
    let bad = api.get(Some(ALICE), "/v1/idempotency-keys/a%20b").await;
    bad.expect(400);
    assert_eq!(bad.problem(), "invalid-idempotency-key");
    let not_uuid = api.get(Some(ALICE), "/v1/orders/not-a-uuid").await;
    not_uuid.expect(404);
    assert_eq!(not_uuid.problem(), "order-not-found");
    api.get(
        Some(ALICE),
        "/v1/orders/0193a4c2-0000-7000-8000-000000000000",
    )
    .await
    .expect(404);
}

#[tokio::test]
async fn revoking_a_permission_by_reload_stops_replays() {
    let api = TestApi::start().await;
    let first = api.post(ALICE, "key-1", &order("req-1")).await;
    first.expect(201);
    let revoked = default_tokens().replacen(
        "permissions = [\"orders:create\", \"orders:read\"]\napproval_limit",
        "permissions = [\"orders:read\"]\napproval_limit",
        1,
    );
    assert_ne!(revoked, default_tokens());
    api.write_tokens(&revoked);
    // Not yet reloaded: the old set is in force.
    api.post(ALICE, "key-1", &order("req-1")).await.expect(201);
    api.reload().unwrap();
    let r = api.post(ALICE, "key-1", &order("req-1")).await;
    r.expect(403);
    assert!(!r.text.contains("order_id"));
    api.get(Some(ALICE), "/v1/idempotency-keys/key-1")
        .await
        .expect(403);

    // A broken file is refused as a whole and the previous set stays.
    api.write_tokens("[[token]]\nsha256 = \"nonsense\"\n");
    let e = api.reload().unwrap_err();
    assert!(matches!(e, ApiError::Tokens(_)), "{e}");
    api.post(ALICE, "key-1", &order("req-1")).await.expect(403);
    api.post(BOB, "key-b", &order("req-b")).await.expect(201);

    // Restored: replays work again.
    api.write_tokens(&default_tokens());
    api.reload().unwrap();
    let back = api.post(ALICE, "key-1", &order("req-1")).await;
    back.expect(201);
    assert!(back.replayed());
    assert_eq!(back.text, first.text);
}

#[tokio::test]
async fn reload_applies_settings() {
    let api = TestApi::start().await;
    let mut config = api.config.clone();
    config.api.max_body_bytes = 256;
    config.api.default_currency = tombstoned::money::Currency::parse("JPY").unwrap();
    api.state.reload(&config).unwrap();
    let mut padded = order("req-1");
    padded["metadata"] = json!({"pad": "x".repeat(300)});
    api.post(BOB, "k1", &padded).await.expect(413);
    let created = api
        .post(
            BOB,
            "k2",
            &json!({"request_id": "r2", "amount": "100",
        "item": "i", "recipient": "x"}),
        )
        .await;
    created.expect(201);
    assert_eq!(created.json()["currency"], "JPY");
    assert_eq!(created.json()["amount_minor"], 100);
}

#[tokio::test]
async fn the_rate_limit_is_per_principal() {
    let api = TestApi::start_with(&[
        ("TOMBSTONED_API__RATE_LIMIT_PER_SECOND", "1"),
        ("TOMBSTONED_API__RATE_LIMIT_BURST", "3"),
    ])
    .await;
    // The burst is spent by reads; then POSTs until one is limited. However slowly this test
    // runs, no more may pass than the burst plus what the rate refilled since the first request
    // (so a slow run admits a POST or two, and a limit that does not limit fails).
    let started = std::time::Instant::now();
    for i in 0..3 {
        api.get(Some(ALICE), &format!("/v1/idempotency-keys/k{i}"))
            .await
            .expect(404);
    }
    let mut created = 0;
    let limited = loop {
        let r = api
            .post(
                ALICE,
                &format!("key-{created}"),
                &order(&format!("req-{created}")),
            )
            .await;
        if r.status == 429 {
            break r;
        }
        r.expect(201);
        created += 1;
        let refilled = started.elapsed().as_secs();
        assert!(
            created <= refilled,
            "{} requests passed in {:?} at 1/s with a burst of 3",
            3 + created,
            started.elapsed()
        );
    };
    assert_eq!(limited.problem(), "rate-limited");
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    assert_eq!(
        api.counts().await,
        (created as i64, created as i64, created as i64),
        "a limited request touches nothing"
    );
    // Other principals have budgets of their own.
    api.post(BOB, "key-1", &order("req-1")).await.expect(201);
    // After the Retry-After it gave, alice has a token again.
    tokio::time::sleep(std::time::Duration::from_secs(retry)).await;
    api.post(ALICE, "key-limited", &order("req-limited"))
        .await
        .expect(201);
}

#[tokio::test]
async fn database_unreachable_is_503_with_retry_after() {
    // A port nothing listens on.
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let api = TestApi::start_custom(TestDb::new().await, &[], |config| {
        config.database.url = DatabaseUrl::parse(&format!(
            "host=127.0.0.1 port={port} user=nobody dbname=nothing connect_timeout=1"
        ))
        .unwrap();
        config.database.connect_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    let r = api.post(ALICE, "key-1", &order("req-1")).await;
    r.expect(503);
    assert_eq!(r.problem(), "database-unavailable");
    assert_eq!(r.header("retry-after"), Some("2"));
    let g = api.get(Some(ALICE), "/v1/idempotency-keys/key-1").await;
    g.expect(503);
    assert!(api
        .metrics_text()
        .contains("tombstoned_db_errors_total{sqlstate_class=\"connection\"}"));
}

#[tokio::test]
async fn metrics_use_route_templates_and_never_keys_or_tokens() {
    let api = TestApi::start().await;
    let created = api.post(ALICE, "secret-key-abc", &order("req-1")).await;
    created.expect(201);
    api.get(Some(ALICE), created.header("location").unwrap())
        .await;
    api.get(Some(ALICE), "/v1/idempotency-keys/secret-key-abc")
        .await;
    api.get(Some(ALICE), "/no/such/secret-key-abc")
        .await
        .expect(404);
    let wrong_method = api
        .http
        .delete(format!("{}/v1/orders", api.base))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_method.status().as_u16(), 405);
    assert!(wrong_method.headers().get("allow").is_some());
    let text = api.metrics_text();
    for line in [
        "tombstoned_http_requests_total{method=\"POST\",route=\"/v1/orders\",status=\"201\"} 1",
        "tombstoned_http_requests_total{method=\"GET\",route=\"/v1/orders/{order_id}\",status=\"200\"} 1",
        "tombstoned_http_requests_total{method=\"GET\",route=\"/v1/idempotency-keys/{key}\",status=\"200\"} 1",
        "tombstoned_http_requests_total{method=\"GET\",route=\"unmatched\",status=\"404\"} 1",
        "tombstoned_http_requests_total{method=\"DELETE\",route=\"/v1/orders\",status=\"405\"} 1",
        "tombstoned_http_request_duration_seconds_count{route=\"/v1/orders\"} 2",
        "tombstoned_db_pool_connections{state=\"max\"} 16",
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    let order_id = created.json()["order_id"].as_str().unwrap().to_owned();
    for secret in [
        "secret-key-abc",
        ALICE,
        order_id.as_str(),
        "reader@example.com",
    ] {
        assert!(!text.contains(secret), "metrics leak {secret}");
    }
    assert_eq!(created.header("cache-control"), Some("no-store"));
}

#[tokio::test]
async fn graceful_shutdown_returns() {
    let api = TestApi::start().await;
    api.post(ALICE, "key-1", &order("req-1")).await.expect(201);
    tokio::time::timeout(std::time::Duration::from_secs(10), api.stop())
        .await
        .expect("serve returns after shutdown");
}

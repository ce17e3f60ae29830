//! Security properties over real HTTP (in process) against a real PostgreSQL: SQL-injection
//! strings in every field, header, path parameter and even in tenant and principal names are
//! inert data; the token store holds digests only; tenants and principals see nothing of each
//! other's keys and orders. (The SIGHUP revocation and the log scan run against the real
//! daemon process, in `tests/reliability/security.rs`.)

use serde_json::json;
use tombstoned::auth::{token_digest_hex, TokenSet};

use crate::api_support::{default_tokens, order, TestApi, ALICE, BOB, GLOBEX_ALICE};

const EVIL_TOKEN: &str = "token-evil-tenant";
const EVIL_TENANT: &str = "acme'); DROP TABLE orders; --";
const EVIL_PRINCIPAL: &str = "p' OR '1'='1";

/// `'`-quoted SQL, comment, statement separators, a cast, a dollar quote, a backslash.
const INJECTIONS: [&str; 6] = [
    "x'); DROP TABLE orders; --",
    "' OR 1=1 --",
    "\"; DELETE FROM idempotency_records; --",
    "$$; TRUNCATE outbox_events; $$",
    "1'::int; SELECT pg_sleep(5); --",
    "\\'; UPDATE idempotency_records SET expired = true; --",
];

async fn tables(api: &TestApi) -> i64 {
    api.db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn sql_in_every_field_header_path_and_scope_name_is_inert_data() {
    let api = TestApi::start().await;
    let tables_before = tables(&api).await;
    api.write_tokens(&format!(
        "{}[[token]]\nsha256 = \"{}\"\ntenant = {}\nprincipal = {}\npermissions = [\"orders:create\", \"orders:read\"]\n",
        default_tokens(),
        token_digest_hex(EVIL_TOKEN),
        toml::Value::String(EVIL_TENANT.into()),
        toml::Value::String(EVIL_PRINCIPAL.into()),
    ));
    api.reload().unwrap();

    for (i, evil) in INJECTIONS.iter().enumerate() {
        let key = format!("k{i}{}", evil.replace(' ', "/**/"));
        let body = json!({
            "request_id": format!("{evil} #{i}"), "amount": "1.00", "item": evil,
            "recipient": evil, "metadata": {"q": evil, *evil: [evil]},
        });
        let created = api.post(EVIL_TOKEN, &key, &body).await;
        created.expect(201);
        let c = created.json();
        assert_eq!(c["item"], *evil);
        assert_eq!(c["recipient"], *evil);
        assert_eq!(c["request_id"], format!("{evil} #{i}"));
        let replay = api.post(EVIL_TOKEN, &key, &body).await;
        replay.expect(201);
        assert!(replay.replayed());
        assert_eq!(replay.text, created.text);
        let status_path: String = format!(
            "/v1/idempotency-keys/{}",
            key.bytes().map(|b| format!("%{b:02X}")).collect::<String>()
        );
        let status = api.get(Some(EVIL_TOKEN), &status_path).await;
        status.expect(200);
        assert_eq!(status.json()["idempotency_key"], key.as_str());
        api.get(Some(EVIL_TOKEN), created.header("location").unwrap())
            .await
            .expect(200);
        // Validated fields and headers refuse it as a value; nothing reaches SQL.
        let mut bad = order(&format!("req-bad-{i}"));
        bad["currency"] = json!(evil);
        bad["quantity"] = json!(evil);
        let r = api.post(EVIL_TOKEN, &format!("bad-{i}"), &bad).await;
        r.expect(400);
        assert_eq!(r.problem(), "validation-failed");
        let mut bad = order(&format!("req-bad-{i}"));
        bad["amount"] = json!(evil);
        api.post(EVIL_TOKEN, &format!("bad-{i}"), &bad)
            .await
            .expect(400);
        let r = api
            .post_raw(
                Some(EVIL_TOKEN),
                &[
                    ("idempotency-key", b"bad-version"),
                    ("content-type", b"application/json"),
                    ("api-version", evil.as_bytes()),
                ],
                order("req-v").to_string().into_bytes(),
            )
            .await;
        r.expect(400);
        assert_eq!(r.problem(), "unsupported-api-version");
        let path = format!(
            "/v1/orders/{}",
            evil.bytes()
                .map(|b| format!("%{b:02X}"))
                .collect::<String>()
        );
        api.get(Some(EVIL_TOKEN), &path).await.expect(404);
        api.post(evil, "k", &order("req-t")).await.expect(401);
    }

    // Stored verbatim, in the evil scope, and every table still there.
    let client = api.db.client().await;
    let rows = client
        .query(
            "SELECT DISTINCT tenant_id, principal_id FROM idempotency_cards",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), EVIL_TENANT);
    assert_eq!(rows[0].get::<_, String>(1), EVIL_PRINCIPAL);
    let n = INJECTIONS.len() as i64;
    assert_eq!(api.counts().await, (n, n, n));
    assert_eq!(tables(&api).await, tables_before);
    let expired: i64 = client
        .query_one(
            "SELECT count(*) FROM idempotency_records WHERE expired",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(expired, 0);
}

#[test]
fn the_token_store_holds_digests_only() {
    let tokens = ["plain-token-one-7f3a", "plain-token-two-19cd"];
    let text: String = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(
                "[[token]]\nsha256 = \"{}\"\ntenant = \"t\"\nprincipal = \"p{i}\"\npermissions = [\"orders:read\"]\n",
                token_digest_hex(t)
            )
        })
        .collect();
    let set = TokenSet::parse(&text, std::path::Path::new("tokens.toml")).unwrap();
    // Everything the store holds, as its Debug output shows it: digests, never the tokens.
    let shown = format!("{set:?}");
    for t in tokens {
        assert!(!text.contains(t), "the file holds no plain token");
        assert!(
            !shown.contains(t),
            "the store holds no plain token: {shown}"
        );
        assert!(set.authenticate(t).is_some());
    }
    // A digest is not a token: presenting the stored digest itself authenticates nobody.
    assert!(set.authenticate(&token_digest_hex(tokens[0])).is_none());
    // Lookups compare against every entry; which one matched is only known at the end.
    assert_eq!(set.authenticate(tokens[1]).unwrap().principal, "p1");
    assert!(set.authenticate("plain-token-one-7f3b").is_none());
    // The shipped example file: digests only (the example tokens appear in comments, as the
    // public examples they are documented to be).
    let shipped = include_str!("../../config/tokens.toml");
    for line in shipped.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(
            !line.contains("-token"),
            "plain token outside a comment: {line}"
        );
    }
}

#[tokio::test]
async fn another_tenant_or_principal_sees_nothing_of_a_key_or_order() {
    let api = TestApi::start().await;
    let a = api
        .post(ALICE, "only-in-acme-alice", &order("req-iso"))
        .await;
    a.expect(201);
    let a_order = a.json()["order_id"].as_str().unwrap().to_owned();
    let a_url = a.header("location").unwrap().to_owned();

    // Key status is scoped to (tenant, principal): another tenant, and another principal of the
    // same tenant, get 404 for a key that exists only in alice's scope.
    for token in [GLOBEX_ALICE, BOB] {
        let r = api
            .get(Some(token), "/v1/idempotency-keys/only-in-acme-alice")
            .await;
        r.expect(404);
        assert_eq!(r.problem(), "idempotency-key-not-found");
        assert!(!r.text.contains(&a_order));
    }
    // Another tenant gets 404 for the order, without any of its data.
    let r = api.get(Some(GLOBEX_ALICE), &a_url).await;
    r.expect(404);
    assert_eq!(r.problem(), "order-not-found");
    assert!(!r.text.contains("reader@example.com") && !r.text.contains("req-iso"));
    // The same key (and request_id) in the other tenant is a record of its own: created, not
    // replayed, another order.
    let g = api
        .post(GLOBEX_ALICE, "only-in-acme-alice", &order("req-iso"))
        .await;
    g.expect(201);
    assert!(!g.replayed());
    assert_ne!(g.json()["order_id"], a.json()["order_id"]);
    let mine = api
        .get(
            Some(GLOBEX_ALICE),
            "/v1/idempotency-keys/only-in-acme-alice",
        )
        .await;
    mine.expect(200);
    assert_eq!(mine.json()["order_id"], g.json()["order_id"]);
    // And a different intent with alice's key from bob is not a key reuse: bob's own record.
    let mut other = order("req-iso-bob");
    other["amount"] = json!("7.00");
    let b = api.post(BOB, "only-in-acme-alice", &other).await;
    b.expect(201);
    assert!(!b.replayed());
    assert_eq!(api.counts().await, (3, 3, 3));
}

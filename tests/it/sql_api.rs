//! The SQL API (issue 22): `claim`, `complete`, `lookup`, `enqueue_event`, `fingerprint` and
//! `api_version`, called by a role that has only the two GRANTs the README gives, inside the
//! caller's own transaction, against a real PostgreSQL — with real concurrent sessions and
//! barriers on `pg_stat_activity`, the real cleaner, the real relay and a real PgBouncer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, NoTls, Row};
use uuid::Uuid;

use crate::api_support::backend_pid;
use crate::cleanup_support::{run, wait_until_cleaner_waits};
use crate::daemon_support::{Daemon, Spec};
use crate::harness::{binary, server, wait_until_lock_wait, TestDb};
use crate::outbox_support::{outbox_section, secret_file, Receiver};
use crate::pooler_support::{PgBouncer, PoolMode};

const OPERATION: &str = "create-payment";
const TENANT: &str = "acme";
const PRINCIPAL: &str = "billing";
const PATIENCE: Duration = Duration::from_secs(30);

/// `claim`'s (and `lookup`'s) result columns, in order.
const CLAIM_COLUMNS: &str =
    "outcome, status_code, response_body, resource_id, replay_deadline, expired_at";

/// One row of `claim` or `lookup`.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    outcome: String,
    status_code: Option<i32>,
    response_body: Option<String>,
    resource_id: Option<String>,
    replay_deadline: Option<DateTime<Utc>>,
    expired_at: Option<DateTime<Utc>>,
}

impl Answer {
    fn from_row(row: &Row) -> Answer {
        Answer {
            outcome: row.get(0),
            status_code: row.get(1),
            response_body: row.get(2),
            resource_id: row.get(3),
            replay_deadline: row.get(4),
            expired_at: row.get(5),
        }
    }
}

/// The SQLSTATE of a failed call.
fn sqlstate(e: &tokio_postgres::Error) -> &str {
    e.code().map_or("(none)", SqlState::code)
}

/// A role with exactly the README's two GRANTs and its operation (and its own business table,
/// `shop.payments`, with a unique business id), and a session of it.
struct Service {
    client: Client,
    role: String,
}

impl Service {
    async fn create(db: &TestDb) -> Service {
        let role = format!("svc_{}", db.name);
        let admin = db.client().await;
        admin
            .batch_execute(&format!(
                "CREATE ROLE {role} LOGIN;
                 GRANT USAGE ON SCHEMA tombstoned TO {role};
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tombstoned TO {role};
                 CREATE SCHEMA IF NOT EXISTS shop;
                 CREATE TABLE IF NOT EXISTS shop.payments (
                     payment_id   text PRIMARY KEY,
                     tenant_id    text NOT NULL,
                     request_id   text NOT NULL UNIQUE,
                     amount_minor bigint NOT NULL);
                 GRANT USAGE ON SCHEMA shop TO {role};
                 GRANT SELECT, INSERT ON shop.payments TO {role};"
            ))
            .await
            .unwrap();
        // Its operation, as the README has the operator grant it (issue 36). On a schema from
        // before V8 the upgrade gives it a transitional grant instead.
        let granted: bool = admin
            .query_one(
                "SELECT to_regclass('tombstoned.operation_grants') IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if granted {
            crate::operations_support::grant(db, OPERATION, &role).await;
        }
        let client = Service::connect(db, &role).await;
        Service { client, role }
    }

    /// Another session of the same role.
    async fn connect(db: &TestDb, role: &str) -> Client {
        let mut config = server().clone();
        config.user(role);
        config.dbname(&db.name);
        config.application_name(format!("svc/{role}"));
        let (client, connection) = config.connect(NoTls).await.unwrap();
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }
}

/// `claim(...)` on `client` (a prepared statement; the pooler test uses unnamed ones).
async fn claim(
    client: &Client,
    key: &str,
    fingerprint: &[u8],
    window: &str,
    lock_timeout: &str,
) -> Result<Answer, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {CLAIM_COLUMNS} FROM tombstoned.claim($1, $2, $3, $4, $5, $6::text::interval, \
         $7::text::interval)"
    );
    let row = client
        .query_one(
            &sql,
            &[
                &TENANT,
                &PRINCIPAL,
                &OPERATION,
                &key,
                &fingerprint,
                &window,
                &lock_timeout,
            ],
        )
        .await?;
    Ok(Answer::from_row(&row))
}

/// `complete(...)`: the text to send as the first response.
async fn complete(
    client: &Client,
    key: &str,
    status: i32,
    body: &serde_json::Value,
    resource: Option<&str>,
) -> Result<String, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT tombstoned.complete($1, $2, $3, $4, $5, $6, $7)",
            &[
                &TENANT, &PRINCIPAL, &OPERATION, &key, &status, body, &resource,
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// `lookup(...)`: `None` for zero rows.
async fn lookup(
    client: &Client,
    key: &str,
    fingerprint: &[u8],
) -> Result<Option<Answer>, tokio_postgres::Error> {
    let sql = format!("SELECT {CLAIM_COLUMNS} FROM tombstoned.lookup($1, $2, $3, $4, $5)");
    let rows = client
        .query(&sql, &[&TENANT, &PRINCIPAL, &OPERATION, &key, &fingerprint])
        .await?;
    assert!(rows.len() <= 1, "lookup returned {} rows", rows.len());
    Ok(rows.first().map(Answer::from_row))
}

/// `fingerprint(intent)`.
async fn fingerprint(client: &Client, intent: &str) -> Vec<u8> {
    client
        .query_one("SELECT tombstoned.fingerprint($1::text::jsonb)", &[&intent])
        .await
        .unwrap()
        .get(0)
}

/// The owner's whole transaction, as a service writes it: claim, the business row, its event,
/// complete, commit. Returns complete's text.
async fn create_payment(client: &Client, key: &str, amount: i64) -> String {
    let intent = format!(r#"{{"amount_minor": {amount}, "currency": "EUR", "request": "{key}"}}"#);
    let fp = fingerprint(client, &intent).await;
    client.batch_execute("BEGIN").await.unwrap();
    let answer = claim(client, key, &fp, "1 hour", "2 seconds")
        .await
        .unwrap();
    assert_eq!(answer.outcome, "owner", "{answer:?}");
    let payment = format!("pay-{key}");
    client
        .execute(
            "INSERT INTO shop.payments (payment_id, tenant_id, request_id, amount_minor)
             VALUES ($1, $2, $3, $4)",
            &[&payment, &TENANT, &key, &amount],
        )
        .await
        .unwrap();
    client
        .query_one(
            "SELECT tombstoned.enqueue_event($1, $2, 'payment.created', $3)",
            &[
                &TENANT,
                &payment,
                &serde_json::json!({"amount_minor": amount}),
            ],
        )
        .await
        .unwrap();
    let body =
        serde_json::json!({"payment_id": payment, "amount_minor": amount, "status": "created"});
    let text = complete(client, key, 201, &body, Some(&payment))
        .await
        .unwrap();
    client.batch_execute("COMMIT").await.unwrap();
    text
}

fn intent_of(key: &str, amount: i64) -> String {
    format!(r#"{{"amount_minor": {amount}, "currency": "EUR", "request": "{key}"}}"#)
}

/// Moves a record's window into the past (as the admin), so the cleaner may take it.
async fn close_window(admin: &Client, key: &str) {
    admin
        .execute(
            "UPDATE idempotency_records SET replay_deadline = clock_timestamp() - interval '1 s'
             WHERE scope_id IN (SELECT scope_id FROM idempotency_scopes WHERE operation = $1)
               AND idempotency_key = $2",
            &[&OPERATION, &key],
        )
        .await
        .unwrap();
}

/// Test 1: every outcome, from a role with only the two GRANTs.
#[tokio::test]
async fn every_outcome_from_a_role_with_only_the_two_grants() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let svc = Service::create(&db).await;
    let c = &svc.client;

    // Owner: claim, business write, event, complete, commit; the text complete returned is the
    // first answer.
    let first = create_payment(c, "k-1", 1000).await;
    assert_eq!(
        first, r#"{"status": "created", "payment_id": "pay-k-1", "amount_minor": 1000}"#,
        "jsonb's text form"
    );
    let fp = fingerprint(c, &intent_of("k-1", 1000)).await;

    // Replay: byte for byte, in a transaction the caller commits right after.
    c.batch_execute("BEGIN").await.unwrap();
    let replay = claim(c, "k-1", &fp, "1 hour", "2 seconds").await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    assert_eq!(replay.outcome, "replay");
    assert_eq!(replay.status_code, Some(201));
    assert_eq!(replay.response_body.as_deref(), Some(first.as_str()));
    assert_eq!(replay.resource_id.as_deref(), Some("pay-k-1"));
    assert!(replay.replay_deadline.is_some() && replay.expired_at.is_none());

    // Another intent on the key: nothing of the stored answer.
    let other = fingerprint(c, &intent_of("k-1", 2000)).await;
    let reused = claim(c, "k-1", &other, "1 hour", "2 seconds")
        .await
        .unwrap();
    assert_eq!(
        reused,
        Answer {
            outcome: "key_reused".into(),
            status_code: None,
            response_body: None,
            resource_id: None,
            replay_deadline: None,
            expired_at: None,
        }
    );

    // lookup claims nothing and answers the same.
    assert_eq!(lookup(c, "k-1", &fp).await.unwrap(), Some(replay.clone()));
    assert_eq!(
        lookup(c, "k-1", &other).await.unwrap().map(|a| a.outcome),
        Some("key_reused".into())
    );
    assert_eq!(lookup(c, "never-used", &fp).await.unwrap(), None);
    let records: i64 = admin
        .query_one("SELECT count(*) FROM idempotency_records", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(records, 1, "lookup wrote nothing");

    // Window over, not yet tombstoned: 'expired' with the resource, no body, no expired_at.
    close_window(&admin, "k-1").await;
    let expired = claim(c, "k-1", &fp, "1 hour", "2 seconds").await.unwrap();
    assert_eq!(expired.outcome, "expired");
    assert_eq!(expired.resource_id.as_deref(), Some("pay-k-1"));
    assert_eq!((expired.status_code, expired.response_body), (None, None));
    assert_eq!(expired.expired_at, None);
    // The real cleaner tombstones it; then 'expired' carries expired_at, reuse stays refused.
    let report = run(&db.config()).await;
    assert_eq!(report.rows_tombstoned, 1);
    let tombstone = claim(c, "k-1", &fp, "1 hour", "2 seconds").await.unwrap();
    assert_eq!(tombstone.outcome, "expired");
    assert_eq!(tombstone.resource_id.as_deref(), Some("pay-k-1"));
    assert!(tombstone.expired_at.is_some(), "{tombstone:?}");
    assert_eq!(
        lookup(c, "k-1", &fp).await.unwrap(),
        Some(tombstone.clone())
    );
    assert_eq!(
        claim(c, "k-1", &other, "1 hour", "2 seconds")
            .await
            .unwrap()
            .outcome,
        "key_reused"
    );
    let row = admin
        .query_one(
            "SELECT expired, response_body IS NULL, resource_id, order_id IS NULL
             FROM idempotency_records WHERE idempotency_key = 'k-1'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, bool>(0),
            row.get::<_, bool>(1),
            row.get::<_, String>(2),
            row.get::<_, bool>(3)
        ),
        (true, true, "pay-k-1".to_owned(), true),
        "a tombstone keeps the resource"
    );

    // The fingerprint: key order and whitespace do not change it; a number's spelling does.
    let a = fingerprint(c, r#"{"a": 1, "b": [1, 2]}"#).await;
    assert_eq!(a.len(), 32);
    assert_eq!(a, fingerprint(c, r#"{ "b":[1,2],"a":1 }"#).await);
    assert_ne!(a, fingerprint(c, r#"{"a": 1.0, "b": [1, 2]}"#).await);
    assert_eq!(
        c.query_one("SELECT tombstoned.api_version()", &[])
            .await
            .unwrap()
            .get::<_, i32>(0),
        1
    );

    // And the role can touch no table of the schema.
    let tables: Vec<String> = admin
        .query(
            "SELECT tablename::text FROM pg_tables WHERE schemaname = 'tombstoned'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tables.len() >= 7, "{tables:?}");
    for table in &tables {
        let column: String = admin
            .query_one(
                "SELECT column_name::text FROM information_schema.columns
                 WHERE table_schema = 'tombstoned' AND table_name = $1 AND is_identity = 'NO'
                 ORDER BY ordinal_position LIMIT 1",
                &[table],
            )
            .await
            .unwrap()
            .get(0);
        for statement in [
            format!("SELECT * FROM tombstoned.{table}"),
            format!("INSERT INTO tombstoned.{table} DEFAULT VALUES"),
            format!("UPDATE tombstoned.{table} SET {column} = {column}"),
            format!("DELETE FROM tombstoned.{table}"),
        ] {
            let e = c.batch_execute(&statement).await.unwrap_err();
            assert_eq!(sqlstate(&e), "42501", "{statement}: {e}");
        }
    }
}

/// Test 2: two sessions on one key, the second waiting (a Lock wait observed) on the first.
#[tokio::test]
async fn a_waiting_claim_replays_after_commit_owns_after_rollback_and_times_out_with_55p03() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let svc = Service::create(&db).await;
    crate::operations_support::grant(&db, "op", &svc.role).await;
    let first = &svc.client;
    let second = Service::connect(&db, &svc.role).await;
    let waiter_pid = backend_pid(&second).await;
    let fp = fingerprint(first, &intent_of("race", 10)).await;
    let body = serde_json::json!({"payment_id": "pay-race"});

    // Owner commits while the other waits: the waiter replays what it committed.
    for (owner_ends, waiter_outcome) in [("COMMIT", "replay"), ("ROLLBACK", "owner")] {
        let key = format!("race-{owner_ends}");
        first.batch_execute("BEGIN").await.unwrap();
        assert_eq!(
            claim(first, &key, &fp, "1 hour", "2 s")
                .await
                .unwrap()
                .outcome,
            "owner"
        );
        let sent = complete(first, &key, 201, &body, Some("pay-race"))
            .await
            .unwrap();
        second.batch_execute("BEGIN").await.unwrap();
        let waiting = {
            let key = key.clone();
            let fp = fp.clone();
            let second = &second;
            async move { claim(second, &key, &fp, "1 hour", "30 s").await }
        };
        let (answer, ()) = tokio::join!(waiting, async {
            wait_until_lock_wait(&observer, waiter_pid, PATIENCE).await;
            first.batch_execute(owner_ends).await.unwrap();
        });
        let answer = answer.unwrap();
        assert_eq!(answer.outcome, waiter_outcome, "{owner_ends}: {answer:?}");
        if owner_ends == "COMMIT" {
            assert_eq!(answer.response_body.as_deref(), Some(sent.as_str()));
            second.batch_execute("COMMIT").await.unwrap();
        } else {
            // The waiter owns the key now; it completes and commits like any owner.
            complete(&second, &key, 201, &body, None).await.unwrap();
            second.batch_execute("COMMIT").await.unwrap();
        }
    }

    // A short lock_timeout: 55P03 (outcome pending), and the caller's own setting survives.
    second
        .batch_execute("SET lock_timeout = '7s'")
        .await
        .unwrap();
    first.batch_execute("BEGIN").await.unwrap();
    claim(first, "held", &fp, "1 hour", "2 s").await.unwrap();
    second.batch_execute("BEGIN").await.unwrap();
    let started = Instant::now();
    let e = claim(&second, "held", &fp, "1 hour", "100 ms")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "55P03", "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "the call's bound, not the caller's"
    );
    second.batch_execute("ROLLBACK").await.unwrap();
    let after: String = second
        .query_one("SHOW lock_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(after, "7s");
    // A successful call inside a transaction leaves the transaction's setting as it was, too.
    second
        .batch_execute("BEGIN; SET LOCAL lock_timeout = '3s'")
        .await
        .unwrap();
    claim(&second, "other-key", &fp, "1 hour", "250 ms")
        .await
        .unwrap();
    let inside: String = second
        .query_one("SHOW lock_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(inside, "3s");
    second.batch_execute("ROLLBACK").await.unwrap();
    first.batch_execute("ROLLBACK").await.unwrap();
}

/// The deadline starts at the call, not at the caller's transaction start.
#[tokio::test]
async fn the_deadline_counts_from_the_call_not_from_the_transaction_start() {
    let db = TestDb::new().await;
    let svc = Service::create(&db).await;
    let c = &svc.client;
    let fp = fingerprint(c, &intent_of("late", 1)).await;
    c.batch_execute("BEGIN").await.unwrap();
    let started: DateTime<Utc> = c.query_one("SELECT now()", &[]).await.unwrap().get(0);
    // The transaction does other work first (a business read, say) for a measurable while.
    c.batch_execute("SELECT pg_sleep(0.3)").await.unwrap();
    let answer = claim(c, "late", &fp, "10 seconds", "2 s").await.unwrap();
    c.batch_execute("ROLLBACK").await.unwrap();
    let deadline = answer.replay_deadline.unwrap();
    assert!(
        deadline - started >= chrono::Duration::milliseconds(10_300),
        "deadline {deadline} for a transaction started at {started}"
    );
}

/// Records, business rows and events, as the admin sees them.
async fn written(admin: &Client) -> (i64, i64, i64) {
    let r = admin
        .query_one(
            "SELECT (SELECT count(*) FROM idempotency_records),
                    (SELECT count(*) FROM shop.payments),
                    (SELECT count(*) FROM outbox_events)",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// Test 3: misuse answers with its own SQLSTATE, and nothing of a failed transaction remains.
#[tokio::test]
async fn misuse_is_refused_with_its_sqlstate_and_leaves_nothing() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let svc = Service::create(&db).await;
    // The invalid-argument cases below name the operation `op`.
    crate::operations_support::grant(&db, "op", &svc.role).await;
    let c = &svc.client;
    let fp = fingerprint(c, &intent_of("m", 1)).await;
    let body = serde_json::json!({"ok": true});

    // complete without a claim: TS002.
    c.batch_execute("BEGIN").await.unwrap();
    let e = complete(c, "m-1", 201, &body, None).await.unwrap_err();
    assert_eq!(sqlstate(&e), "TS002", "{e}");
    c.batch_execute("ROLLBACK").await.unwrap();

    // COMMIT without complete: TS003 at COMMIT, the business row gone with the claim.
    c.batch_execute("BEGIN").await.unwrap();
    claim(c, "m-2", &fp, "1 hour", "2 s").await.unwrap();
    c.execute(
        "INSERT INTO shop.payments VALUES ('pay-m-2', 'acme', 'm-2', 5)",
        &[],
    )
    .await
    .unwrap();
    let e = c.batch_execute("COMMIT").await.unwrap_err();
    assert_eq!(sqlstate(&e), "TS003", "{e}");
    assert_eq!(written(&admin).await, (0, 0, 0), "nothing of it remains");
    // The key was never taken: the corrected request may use it.
    let recreated = create_payment(c, "m-2", 5).await;
    assert!(recreated.contains("pay-m-2"), "{recreated}");

    // A second complete: TS002 (the claim is finished).
    c.batch_execute("BEGIN").await.unwrap();
    claim(c, "m-3", &fp, "1 hour", "2 s").await.unwrap();
    complete(c, "m-3", 201, &body, None).await.unwrap();
    let e = complete(c, "m-3", 201, &body, None).await.unwrap_err();
    assert_eq!(sqlstate(&e), "TS002", "{e}");
    c.batch_execute("ROLLBACK").await.unwrap();

    // The same key claimed twice in one transaction: TS004 while unfinished; once completed,
    // a claim in the same transaction replays it (it is the record this transaction wrote).
    c.batch_execute("BEGIN").await.unwrap();
    claim(c, "m-4", &fp, "1 hour", "2 s").await.unwrap();
    let e = claim(c, "m-4", &fp, "1 hour", "2 s").await.unwrap_err();
    assert_eq!(sqlstate(&e), "TS004", "{e}");
    c.batch_execute("ROLLBACK").await.unwrap();
    c.batch_execute("BEGIN").await.unwrap();
    claim(c, "m-5", &fp, "1 hour", "2 s").await.unwrap();
    let sent = complete(c, "m-5", 201, &body, None).await.unwrap();
    let again = claim(c, "m-5", &fp, "1 hour", "2 s").await.unwrap();
    assert_eq!(
        (again.outcome.as_str(), again.response_body.as_deref()),
        ("replay", Some(sent.as_str()))
    );
    c.batch_execute("ROLLBACK").await.unwrap();

    // A 5xx, a 1xx and a NULL body are not outcomes: 22023, and the claim stays unfinished.
    c.batch_execute("BEGIN").await.unwrap();
    claim(c, "m-6", &fp, "1 hour", "2 s").await.unwrap();
    for status in [500, 503, 100] {
        c.batch_execute("SAVEPOINT s").await.unwrap();
        let e = complete(c, "m-6", status, &body, None).await.unwrap_err();
        assert_eq!(sqlstate(&e), "22023", "{status}: {e}");
        assert!(e.to_string().contains("status_code") || format!("{e:?}").contains("status_code"));
        c.batch_execute("ROLLBACK TO SAVEPOINT s").await.unwrap();
    }
    c.batch_execute("ROLLBACK").await.unwrap();

    // Invalid arguments: 22023 naming the argument; nothing written.
    let before = written(&admin).await;
    let long_key = "k".repeat(256);
    let cases: Vec<(&str, String)> = vec![
        (
            "tenant_id",
            "SELECT * FROM tombstoned.claim('', 'p', 'op', 'k', $1, '1 hour')".into(),
        ),
        (
            "tenant_id",
            "SELECT * FROM tombstoned.claim(NULL, 'p', 'op', 'k', $1, '1 hour')".into(),
        ),
        (
            "principal_id",
            "SELECT * FROM tombstoned.claim('t', NULL, 'op', 'k', $1, '1 hour')".into(),
        ),
        (
            "operation",
            "SELECT * FROM tombstoned.claim('t', 'p', '', 'k', $1, '1 hour')".into(),
        ),
        (
            "idempotency_key",
            "SELECT * FROM tombstoned.claim('t', 'p', 'op', '', $1, '1 hour')".into(),
        ),
        (
            "idempotency_key",
            format!("SELECT * FROM tombstoned.claim('t', 'p', 'op', '{long_key}', $1, '1 hour')"),
        ),
        (
            "fingerprint",
            "SELECT * FROM tombstoned.claim('t', 'p', 'op', 'k', substring($1::bytea from 2), '1 hour')"
                .into(),
        ),
        (
            "fingerprint",
            "SELECT * FROM tombstoned.claim('t', 'p', 'op', 'k', NULL::bytea || $1 || $1, '1 hour')"
                .into(),
        ),
        (
            "replay_window",
            "SELECT * FROM tombstoned.claim('t', 'p', 'op', 'k', $1, '0 s')".into(),
        ),
        (
            "replay_window",
            "SELECT * FROM tombstoned.claim('t', 'p', 'op', 'k', $1, '-1 hour')".into(),
        ),
        (
            "lock_timeout",
            "SELECT * FROM tombstoned.claim('t', 'p', 'op', 'k', $1, '1 hour', '-1 s')".into(),
        ),
        (
            "idempotency_key",
            "SELECT * FROM tombstoned.lookup('t', 'p', 'op', NULL, $1)".into(),
        ),
        (
            "fingerprint",
            "SELECT * FROM tombstoned.lookup('t', 'p', 'op', 'k', substring($1::bytea from 3))".into(),
        ),
        (
            "tenant_id",
            "SELECT tombstoned.complete('', 'p', 'op', 'k', 201, '{}') WHERE $1::bytea IS NOT NULL"
                .into(),
        ),
        (
            "response_body",
            "SELECT tombstoned.complete('t', 'p', 'op', 'k', 201, NULL) WHERE $1::bytea IS NOT NULL"
                .into(),
        ),
        (
            "aggregate_id",
            "SELECT tombstoned.enqueue_event('t', '', 'x', '{}') WHERE $1::bytea IS NOT NULL".into(),
        ),
        (
            "payload",
            "SELECT tombstoned.enqueue_event('t', 'a', 'x', NULL) WHERE $1::bytea IS NOT NULL".into(),
        ),
        (
            "intent",
            "SELECT tombstoned.fingerprint(NULL) WHERE $1::bytea IS NOT NULL".into(),
        ),
    ];
    for (argument, sql) in &cases {
        let e = c.query(sql.as_str(), &[&fp]).await.unwrap_err();
        assert_eq!(sqlstate(&e), "22023", "{sql}: {e}");
        let message = e.as_db_error().map(|d| d.message().to_owned()).unwrap();
        assert!(
            message.starts_with(&format!("invalid argument {argument}:")),
            "{sql}: {message}"
        );
    }
    assert_eq!(written(&admin).await, before, "nothing was written");
}

/// Test 4: a cleanup batch waits for an open replay's share lock; after the caller commits the
/// record is a tombstone, then 'expired', and another intent 'key_reused'.
#[tokio::test]
async fn the_cleaner_waits_for_an_open_replay_then_tombstones_the_record() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let svc = Service::create(&db).await;
    let c = &svc.client;
    let body = serde_json::json!({"payment_id": "pay-open"});
    // A window short enough to pass while the replay's transaction is open, long enough that the
    // replay starts inside it; a slower machine gets a longer one (the precondition is checked).
    let mut window_ms = 1500;
    let (key, fp, sent, replay) = loop {
        let key = format!("open-{window_ms}");
        let fp = fingerprint(c, &intent_of(&key, 1)).await;
        let window = format!("{window_ms} ms");
        c.batch_execute("BEGIN").await.unwrap();
        claim(c, &key, &fp, &window, "2 s").await.unwrap();
        let sent = complete(c, &key, 201, &body, Some("pay-open"))
            .await
            .unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        c.batch_execute("BEGIN").await.unwrap();
        let replay = claim(c, &key, &fp, &window, "2 s").await.unwrap();
        if replay.outcome == "replay" {
            break (key, fp, sent, replay);
        }
        c.batch_execute("ROLLBACK").await.unwrap();
        window_ms *= 2;
        assert!(
            window_ms < 60_000,
            "never replayed inside the window: {replay:?}"
        );
    };
    assert_eq!(replay.response_body.as_deref(), Some(sent.as_str()));
    // The transaction stays open past the deadline (the database clock says so).
    let deadline = replay.replay_deadline.unwrap();
    let give_up = Instant::now() + PATIENCE;
    while observer
        .query_one("SELECT clock_timestamp() <= $1", &[&deadline])
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < give_up);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A lock timeout far beyond the test's steps while the cleaner waits (the default 5 s could
    // end the wait before a loaded machine commits the replay).
    let config = db.config_with(&[("TOMBSTONED_CLEANUP__LOCK_TIMEOUT", "20s")]);
    let cleaner = tokio::spawn(async move { run(&config).await });
    wait_until_cleaner_waits(&observer).await;
    assert!(!cleaner.is_finished());
    c.batch_execute("COMMIT").await.unwrap();
    let report = cleaner.await.unwrap();
    assert_eq!(report.rows_tombstoned, 1, "{report:?}");

    let expired = claim(c, &key, &fp, "1 hour", "2 s").await.unwrap();
    assert_eq!(expired.outcome, "expired");
    assert!(expired.expired_at.is_some());
    assert_eq!(expired.resource_id.as_deref(), Some("pay-open"));
    let other = fingerprint(c, &intent_of(&key, 2)).await;
    assert_eq!(
        claim(c, &key, &other, "1 hour", "2 s")
            .await
            .unwrap()
            .outcome,
        "key_reused"
    );
}

/// What the stress test saw of one key.
#[derive(Debug, Default)]
struct KeyLedger {
    /// complete's texts of committed owners (the invariant: at most one).
    owners: Vec<String>,
    /// Bodies of replays.
    replays: Vec<String>,
    /// resource_ids of 'expired' answers.
    expired: Vec<Option<String>>,
    /// Answers to another intent on the key (each must be 'key_reused').
    other_intent: Vec<String>,
}

/// Test 5: 12 sessions on a few dozen hot keys through the functions, the daemon's cleaner
/// firing every second; the ledger checks one business row per key, byte-identical replays, no
/// key owned twice and no reuse after tombstoning.
#[tokio::test]
async fn stress_twelve_sessions_on_hot_keys_with_the_cleaner_every_second() {
    const SESSIONS: usize = 12;
    const HOT_KEYS: u64 = 30;
    let secs: u64 = std::env::var("TOMBSTONED_SQL_API_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let db = TestDb::new().await;
    let admin = db.client().await;
    let svc = Service::create(&db).await;
    let daemon = Daemon::start(
        Spec::new(&db.url)
            .config("[api]\nenabled = false\n[cleanup]\nschedule = \"* * * * * *\"\n"),
    )
    .await;
    let ledger: Arc<Mutex<HashMap<String, KeyLedger>>> = Arc::default();
    let counts: Arc<Mutex<HashMap<&'static str, u64>>> = Arc::default();
    let started = Instant::now();
    let run_for = Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for session in 0..SESSIONS {
        let client = Service::connect(&db, &svc.role).await;
        let ledger = ledger.clone();
        let counts = counts.clone();
        tasks.push(tokio::spawn(async move {
            let mut n: u64 = session as u64 * 7919;
            while started.elapsed() < run_for {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let pick = n >> 33;
                // The hot set moves every 3 s, so keys go through their whole life in the run.
                let key = format!("s{}-{}", started.elapsed().as_secs() / 3, pick % HOT_KEYS);
                let owned = ledger
                    .lock()
                    .unwrap()
                    .get(&key)
                    .is_some_and(|k| !k.owners.is_empty());
                let other_intent = owned && pick % 10 == 0;
                let amount = if other_intent { 2 } else { 1 };
                let fp = fingerprint(&client, &intent_of(&key, amount)).await;
                let outcome = one_request(&client, &key, &fp, pick).await;
                let mut ledger = ledger.lock().unwrap();
                let entry = ledger.entry(key.clone()).or_default();
                let label = match outcome {
                    Ok(answer) if other_intent => {
                        entry.other_intent.push(answer.outcome);
                        "other_intent"
                    }
                    Ok(answer) => match answer.outcome.as_str() {
                        "owner" => {
                            entry.owners.push(answer.response_body.unwrap());
                            "owner"
                        }
                        "rolled_back" => "rolled_back",
                        "replay" => {
                            entry.replays.push(answer.response_body.unwrap());
                            "replay"
                        }
                        "expired" => {
                            entry.expired.push(answer.resource_id);
                            "expired"
                        }
                        other => panic!("{key}: unexpected outcome {other}"),
                    },
                    Err(e) if sqlstate(&e) == "55P03" => "in_progress",
                    Err(e) => panic!("{key}: {e:?}"),
                };
                *counts.lock().unwrap().entry(label).or_default() += 1;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    // Every window is closed two seconds after the last claim; the cleaner tombstones them all.
    let give_up = Instant::now() + PATIENCE;
    loop {
        let live: i64 = admin
            .query_one(
                "SELECT count(*) FROM idempotency_records WHERE NOT expired",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if live == 0 {
            break;
        }
        assert!(Instant::now() < give_up, "{live} records never tombstoned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let runs = daemon
        .metric("tombstoned_cleanup_runs_total{outcome=\"success\"}")
        .await
        .unwrap_or(0.0);
    assert!(runs >= 5.0, "the cleaner ran {runs} times");

    let counts = counts.lock().unwrap().clone();
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    for (key, k) in ledger.iter() {
        assert!(k.owners.len() <= 1, "{key} owned {} times", k.owners.len());
        if let Some(first) = k.owners.first() {
            for replay in &k.replays {
                assert_eq!(
                    replay, first,
                    "{key}: a replay differs from the first answer"
                );
            }
            for resource in &k.expired {
                assert_eq!(resource.as_deref(), Some(format!("pay-{key}").as_str()));
            }
        } else {
            assert!(k.replays.is_empty() && k.expired.is_empty(), "{key}: {k:?}");
        }
        assert!(
            k.other_intent.iter().all(|o| o == "key_reused"),
            "{key}: another intent got {:?}",
            k.other_intent
        );
        // After tombstoning: the same intent is 'expired', another 'key_reused', never owned.
        if !k.owners.is_empty() {
            let fp = fingerprint(&svc.client, &intent_of(key, 1)).await;
            let after = claim(&svc.client, key, &fp, "1 hour", "2 s").await.unwrap();
            assert_eq!(after.outcome, "expired", "{key}");
            assert!(after.expired_at.is_some());
            let other = fingerprint(&svc.client, &intent_of(key, 3)).await;
            assert_eq!(
                claim(&svc.client, key, &other, "1 hour", "2 s")
                    .await
                    .unwrap()
                    .outcome,
                "key_reused"
            );
        }
    }
    let owners: usize = ledger.values().map(|k| k.owners.len()).sum();
    let row = admin
        .query_one(
            "SELECT (SELECT count(*) FROM shop.payments),
                    (SELECT count(*) FROM shop.payments p
                      WHERE NOT EXISTS (SELECT FROM outbox_events e
                                        WHERE e.aggregate_id = p.payment_id)),
                    (SELECT count(*) FROM idempotency_records WHERE status_code IS NULL)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2)
        ),
        (i64::try_from(owners).unwrap(), 0, 0),
        "one business row (and its event) per owned key; no record without its response"
    );
    for label in ["owner", "replay", "expired", "other_intent", "in_progress"] {
        assert!(
            counts.get(label).copied().unwrap_or(0) > 0,
            "no {label}: {counts:?}"
        );
    }
    eprintln!("sql api stress: {counts:?}, {runs} cleanup runs");
}

/// One client request of the stress test, in one transaction. `pick` varies what the caller
/// does: how long an owner or a replay keeps its transaction open, and whether an owner fails
/// (rolls back) instead of completing.
async fn one_request(
    client: &Client,
    key: &str,
    fp: &[u8],
    pick: u64,
) -> Result<Answer, tokio_postgres::Error> {
    client.batch_execute("BEGIN").await?;
    let answer = match claim(client, key, fp, "2 seconds", "150 ms").await {
        Ok(answer) => answer,
        Err(e) => {
            client.batch_execute("ROLLBACK").await?;
            return Err(e);
        }
    };
    // Mostly short; one owner in 17 outlasts the others' lock_timeout (they answer 55P03).
    let hold = if pick % 17 == 0 {
        Duration::from_millis(300)
    } else {
        Duration::from_millis(pick % 25)
    };
    match answer.outcome.as_str() {
        "owner" if pick % 13 == 0 => {
            tokio::time::sleep(hold).await;
            client.batch_execute("ROLLBACK").await?;
            Ok(Answer {
                outcome: "rolled_back".into(),
                ..answer
            })
        }
        "owner" => {
            let payment = format!("pay-{key}");
            client
                .execute(
                    "INSERT INTO shop.payments (payment_id, tenant_id, request_id, amount_minor)
                     VALUES ($1, $2, $3, 1)",
                    &[&payment, &TENANT, &key],
                )
                .await?;
            client
                .query_one(
                    "SELECT tombstoned.enqueue_event($1, $2, 'payment.created', '{}')",
                    &[&TENANT, &payment],
                )
                .await?;
            tokio::time::sleep(hold).await;
            let text = complete(
                client,
                key,
                201,
                &serde_json::json!({"payment_id": payment, "n": pick % 1000}),
                Some(&payment),
            )
            .await?;
            client.batch_execute("COMMIT").await?;
            Ok(Answer {
                response_body: Some(text),
                ..answer
            })
        }
        _ => {
            // A replay commits right after reading; a few keep the share lock a little longer,
            // so cleanup batches meet it.
            tokio::time::sleep(hold / 2).await;
            client.batch_execute("COMMIT").await?;
            Ok(answer)
        }
    }
}

/// `claim` as an unnamed statement (`query_typed`), the way a client behind a transaction-mode
/// pooler sends it; the fingerprint computed by the server from `intent`.
async fn claim_unnamed(
    client: &Client,
    key: &str,
    intent: &str,
    lock_timeout: &str,
) -> Result<Answer, tokio_postgres::Error> {
    let sql = format!(
        "SELECT {CLAIM_COLUMNS} FROM tombstoned.claim($1, $2, $3, $4, \
         tombstoned.fingerprint($5::jsonb), '1 hour', $6::interval)"
    );
    let rows = client
        .query_typed(
            &sql,
            &[
                (&TENANT, Type::TEXT),
                (&PRINCIPAL, Type::TEXT),
                (&OPERATION, Type::TEXT),
                (&key, Type::TEXT),
                (&intent, Type::TEXT),
                (&lock_timeout, Type::TEXT),
            ],
        )
        .await?;
    Ok(Answer::from_row(&rows[0]))
}

/// `complete` as an unnamed statement.
async fn complete_unnamed(
    client: &Client,
    key: &str,
    body: &str,
) -> Result<String, tokio_postgres::Error> {
    let rows = client
        .query_typed(
            "SELECT tombstoned.complete($1, $2, $3, $4, 201, $5::jsonb, 'pay-' || $4)",
            &[
                (&TENANT, Type::TEXT),
                (&PRINCIPAL, Type::TEXT),
                (&OPERATION, Type::TEXT),
                (&key, Type::TEXT),
                (&body, Type::TEXT),
            ],
        )
        .await?;
    Ok(rows[0].get(0))
}

/// Test 6: the whole flow through PgBouncer in transaction mode: unnamed statements, three
/// clients sharing two server connections, a waiter observed in `pg_stat_activity`.
#[tokio::test]
async fn the_whole_flow_works_through_pgbouncer_in_transaction_mode() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let bouncer = PgBouncer::start(PoolMode::Transaction, 2).await;
    let a = bouncer.client(&db.name).await;
    let b = bouncer.client(&db.name).await;
    let c = bouncer.client(&db.name).await;
    let intent = r#"{"amount_minor": 7, "currency": "EUR"}"#;
    let body = r#"{"payment_id": "pay-pooled"}"#;

    // Owner on a, waiter on b (a Lock wait on the server), the owner commits: b replays.
    a.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        claim_unnamed(&a, "pooled", intent, "2 s")
            .await
            .unwrap()
            .outcome,
        "owner"
    );
    let sent = complete_unnamed(&a, "pooled", body).await.unwrap();
    b.batch_execute("BEGIN").await.unwrap();
    let (answer, ()) = tokio::join!(claim_unnamed(&b, "pooled", intent, "30 s"), async {
        crate::harness::wait_until_app_lock_wait(&observer, "", PATIENCE).await;
        a.batch_execute("COMMIT").await.unwrap();
    });
    let answer = answer.unwrap();
    b.batch_execute("COMMIT").await.unwrap();
    assert_eq!(answer.outcome, "replay");
    assert_eq!(answer.response_body.as_deref(), Some(sent.as_str()));
    assert_eq!(answer.resource_id.as_deref(), Some("pay-pooled"));

    // Key reuse, a lookup and an event, each its own transaction on a shared connection.
    assert_eq!(
        claim_unnamed(&c, "pooled", r#"{"amount_minor": 8}"#, "2 s")
            .await
            .unwrap()
            .outcome,
        "key_reused"
    );
    let looked = c
        .query_typed(
            "SELECT outcome FROM tombstoned.lookup($1, $2, $3, 'pooled', \
             tombstoned.fingerprint($4::jsonb))",
            &[
                (&TENANT, Type::TEXT),
                (&PRINCIPAL, Type::TEXT),
                (&OPERATION, Type::TEXT),
                (&intent, Type::TEXT),
            ],
        )
        .await
        .unwrap();
    assert_eq!(looked[0].get::<_, String>(0), "replay");
    let event: Uuid = c
        .query_typed(
            "SELECT tombstoned.enqueue_event($1, 'pay-pooled', 'payment.created', '{}')",
            &[(&TENANT, Type::TEXT)],
        )
        .await
        .unwrap()[0]
        .get(0);
    let stored: i64 = observer
        .query_one(
            "SELECT count(*) FROM outbox_events WHERE event_id = $1",
            &[&event],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1);

    // 55P03 through the pooler: the owner holds a's server connection, b times out, rolls back.
    a.batch_execute("BEGIN").await.unwrap();
    claim_unnamed(&a, "held", intent, "2 s").await.unwrap();
    b.batch_execute("BEGIN").await.unwrap();
    let e = claim_unnamed(&b, "held", intent, "100 ms")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&e), "55P03", "{e}");
    b.batch_execute("ROLLBACK").await.unwrap();
    // COMMIT without complete: TS003, on whichever server connection carried it.
    let e = a.batch_execute("COMMIT").await.unwrap_err();
    assert_eq!(sqlstate(&e), "TS003", "{e}");
    // The key was released with it: a claims it again and completes.
    a.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        claim_unnamed(&a, "held", intent, "2 s")
            .await
            .unwrap()
            .outcome,
        "owner"
    );
    complete_unnamed(&a, "held", body).await.unwrap();
    a.batch_execute("COMMIT").await.unwrap();

    // Nothing the calls set outlives them on the shared server connections.
    for client in [&a, &b, &c] {
        let timeout: String = client
            .simple_query("SHOW lock_timeout")
            .await
            .unwrap()
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
                _ => None,
            })
            .unwrap();
        assert_eq!(timeout, "0", "{}", bouncer.log());
    }
}

/// `enqueue_event` in a transaction of its own on `client`: the event id.
async fn enqueue(client: &Client, aggregate: &str, event_type: &str) -> Uuid {
    client
        .query_one(
            "SELECT tombstoned.enqueue_event($1, $2, $3, $4)",
            &[
                &TENANT,
                &aggregate,
                &event_type,
                &serde_json::json!({"aggregate": aggregate, "type": event_type}),
            ],
        )
        .await
        .unwrap()
        .get(0)
}

/// Test 7: events enqueued through the function are delivered by the relay like order events:
/// signed, in sequence per aggregate, once each at a deduplicating receiver; an event whose
/// transaction rolled back is never sent; concurrent enqueuers of one aggregate are numbered in
/// commit order.
#[tokio::test]
async fn enqueued_events_are_delivered_in_sequence_per_aggregate_and_rolled_back_ones_never() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let svc = Service::create(&db).await;
    let c = &svc.client;
    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();

    // Three aggregates, four events each, interleaved across transactions; one more event
    // enqueued in a transaction that rolls back.
    let mut committed = Vec::new();
    for n in 0..4 {
        for aggregate in ["agg-a", "agg-b", "agg-c"] {
            committed.push((aggregate, enqueue(c, aggregate, &format!("step.{n}")).await));
        }
        if n == 1 {
            c.batch_execute("BEGIN").await.unwrap();
            let lost = enqueue(c, "agg-a", "never.sent").await;
            c.batch_execute("ROLLBACK").await.unwrap();
            committed.push(("rolled back", lost));
        }
    }
    // Two sessions on one aggregate: the second waits for the first's row lock, and the
    // sequence follows the commits.
    let other = Service::connect(&db, &svc.role).await;
    let other_pid = backend_pid(&other).await;
    c.batch_execute("BEGIN").await.unwrap();
    let first = enqueue(c, "agg-d", "first").await;
    other.batch_execute("BEGIN").await.unwrap();
    let (second, ()) = tokio::join!(enqueue(&other, "agg-d", "second"), async {
        wait_until_lock_wait(&observer, other_pid, PATIENCE).await;
        c.batch_execute("COMMIT").await.unwrap();
    });
    other.batch_execute("COMMIT").await.unwrap();
    committed.push(("agg-d", first));
    committed.push(("agg-d", second));

    let sequences: HashMap<Uuid, (Option<String>, i32)> = observer
        .query(
            "SELECT event_id, aggregate_id, sequence FROM outbox_events",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    assert_eq!(sequences.len(), 14, "the rolled-back event is not there");
    assert_eq!(sequences[&first].1, 1);
    assert_eq!(sequences[&second].1, 2);
    for aggregate in ["agg-a", "agg-b", "agg-c"] {
        let mut seqs: Vec<i32> = committed
            .iter()
            .filter(|(a, _)| *a == aggregate)
            .map(|(_, id)| sequences[id].1)
            .collect();
        seqs.sort_unstable();
        assert_eq!(seqs, [1, 2, 3, 4], "{aggregate}: no gap for the rollback");
    }

    let daemon = Daemon::start(
        Spec::new(&db.url)
            .config(&outbox_section(&receiver.url, &secret, &[]))
            .config("[api]\nenabled = false\n[cleanup]\nenabled = false\n"),
    )
    .await;
    crate::outbox_support::wait_all_settled(&observer).await;
    let stats = receiver.stats();
    assert_eq!(
        (stats.bad_signatures, stats.out_of_order, stats.overlaps),
        (0, 0, 0),
        "{stats:?}"
    );
    for (aggregate, id) in &committed {
        if *aggregate == "rolled back" {
            assert!(
                receiver.arrivals_of(*id).is_empty(),
                "a rolled-back event was sent"
            );
        } else {
            assert!(!receiver.arrivals_of(*id).is_empty(), "{id} never arrived");
        }
    }
    let sink = observer
        .query_one(
            "SELECT count(*), count(DISTINCT webhook_id), count(*) FILTER (WHERE order_id IS NULL),
                    (SELECT count(*) FROM receiver.aggregate_effects)
             FROM receiver.sink",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (0..4).map(|i| sink.get::<_, i64>(i)).collect::<Vec<_>>(),
        [14, 14, 14, 14],
        "each event applied once, named by its aggregate"
    );
    drop(daemon);
}

/// Test 8: V4 applied to a populated V3 database; endpoint records and function records then
/// live side by side: claimed, tombstoned, counted and relayed alike.
#[tokio::test]
async fn v4_upgrades_a_populated_v3_database_and_both_kinds_of_record_live_side_by_side() {
    let db = TestDb::empty().await;
    let config = db.config();
    let admin = db.client().await;
    assert_eq!(crate::schema_support::migrate_to(&db, 3).await, [1, 2, 3]);
    // What a V3 endpoint wrote: an order, its event, its record (and other records, due).
    let order = Uuid::now_v7();
    let event = Uuid::now_v7();
    admin
        .batch_execute(&format!(
            "INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                                 currency, item, quantity, recipient)
             VALUES ('{order}', 'acme', 'alice', 'v3-req', 100, 'CNY', 'book', 1, 'r');
             INSERT INTO outbox_events (event_id, tenant_id, order_id, event_type, payload)
             VALUES ('{event}', 'acme', '{order}', 'order.created', '{{\"v\": 3}}');
             INSERT INTO idempotency_records (tenant_id, principal_id, operation,
                 idempotency_key, fingerprint, status_code, response_body, order_id,
                 replay_deadline)
             VALUES ('acme', 'alice', 'create-order', 'v3-key', sha256('v3'), 201,
                     '{{\"order_id\": \"{order}\"}}', '{order}', now() + interval '1 hour')"
        ))
        .await
        .unwrap();
    crate::cleanup_support::seed_live_before_v5(&admin, "v3-due", 40, "2020-01-01T00:00:00Z").await;
    let columns = "tenant_id, principal_id, operation, idempotency_key, fingerprint, \
                   status_code, response_body, order_id, expired, created_at, replay_deadline, \
                   expired_at";
    let checksum_sql = format!(
        "SELECT md5(string_agg(concat_ws('|', {columns}), ',' ORDER BY {columns})) \
         FROM idempotency_records"
    );
    let before: String = admin.query_one(&checksum_sql, &[]).await.unwrap().get(0);
    let checksum_sql = format!("{checksum_sql} WHERE idempotency_key NOT LIKE 'size-%'");
    // An endpoint tombstone's size on each side of the upgrade (the same shape of row).
    let tombstone_size = "INSERT INTO idempotency_records (tenant_id, principal_id, operation,
             idempotency_key, fingerprint, status_code, order_id, replay_deadline, expired,
             expired_at)
         VALUES ('acme', 'alice', 'create-order', $1::text, sha256(convert_to($1::text, 'UTF8')),
                 201, gen_random_uuid(), now(), true, now())
         RETURNING pg_column_size(idempotency_records.*)";
    let size_v3: i32 = admin
        .query_one(tombstone_size, &[&"size-v3"])
        .await
        .unwrap()
        .get(0);

    assert_eq!(crate::schema_support::migrate_to(&db, 4).await, [4]);
    let size_v4: i32 = admin
        .query_one(tombstone_size, &[&"size-v4"])
        .await
        .unwrap()
        .get(0);
    let after: String = admin.query_one(&checksum_sql, &[]).await.unwrap().get(0);
    assert_eq!(after, before, "V4 changed existing records");
    assert_eq!(size_v4, size_v3, "V4 made an endpoint tombstone larger");
    // Then the releases after it (V5, the compact card: its own upgrade test is
    // `v5_upgrades_a_populated_v4_database_in_place`; V6, the endpoint's claim functions).
    let applied = tombstoned::schema::migrations::migrate(&config.database)
        .await
        .unwrap();
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(4)
    );

    // The endpoint's record, seen through the functions by the daemon's role (create-order is
    // its operation, V8): its order id is its resource.
    let svc = Service::create(&db).await;
    let c = &svc.client;
    let row = admin
        .query_one(
            "SELECT outcome, resource_id, response_body FROM tombstoned.lookup('acme', 'alice',
                 'create-order', 'v3-key', sha256('v3'))",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "replay");
    assert_eq!(row.get::<_, String>(1), order.to_string());
    // A function record beside it, and one past its window.
    create_payment(c, "v4-key", 5).await;
    create_payment(c, "v4-old", 6).await;
    close_window(&admin, "v4-old").await;

    // The dry run counts both kinds; the cleaner tombstones both; the relay sends both events.
    let dry = std::process::Command::new(binary())
        .args(["cleanup", "--dry-run", "--json"])
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let dry: serde_json::Value = serde_json::from_slice(&dry.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&dry.stdout)));
    assert_eq!(dry["rows_due"], 41, "{dry}");
    let report = run(&config).await;
    assert_eq!(report.rows_tombstoned, 41);
    let tombstones = admin
        .query(
            "SELECT operation, count(*) FROM idempotency_cards
             WHERE expired AND idempotency_key NOT LIKE 'size-%'
             GROUP BY operation ORDER BY operation",
            &[],
        )
        .await
        .unwrap();
    let tombstones: Vec<(String, i64)> = tombstones.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(
        tombstones.iter().any(|(op, _)| op == OPERATION),
        "{tombstones:?}"
    );
    assert_eq!(tombstones.iter().map(|(_, n)| n).sum::<i64>(), 41);

    let receiver = Receiver::start(&db).await;
    let (_dir, secret) = secret_file();
    let daemon = Daemon::start(
        Spec::new(&db.url)
            .config(&outbox_section(&receiver.url, &secret, &[]))
            .config("[api]\nenabled = false\n[cleanup]\nenabled = false\n"),
    )
    .await;
    crate::outbox_support::wait_all_settled(&admin).await;
    assert_eq!(receiver.arrivals_of(event).len(), 1, "the V3 order event");
    let sink = admin
        .query_one(
            "SELECT count(*) FILTER (WHERE order_id IS NOT NULL),
                    count(*) FILTER (WHERE aggregate_id IS NOT NULL)
             FROM receiver.sink",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((sink.get::<_, i64>(0), sink.get::<_, i64>(1)), (1, 2));
    drop(daemon);
}

/// V5: two first claims of one NEW scope (different keys) at once, under READ COMMITTED. The
/// second waits for the first's uncommitted scope row (a Lock wait observed); after COMMIT it
/// finds the row with a new statement, after ROLLBACK it inserts it itself: both own their key,
/// one scope row, and no sequence value is spent by a claim of a scope that exists.
#[tokio::test]
async fn two_first_claims_of_a_new_scope_both_own_their_keys_after_commit_or_rollback() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    let svc = Service::create(&db).await;
    crate::operations_support::grant(&db, "op", &svc.role).await;
    let first = &svc.client;
    let second = Service::connect(&db, &svc.role).await;
    let waiter_pid = backend_pid(&second).await;
    let fp = fingerprint(first, &intent_of("scope", 1)).await;
    // `$1` tenant (a scope of its own per round), `$2` key, `$3` fingerprint.
    let claim_sql =
        "SELECT outcome FROM tombstoned.claim($1, 'fresh', 'op', $2, $3, '1 hour', '30 s')";
    let complete_sql = "SELECT tombstoned.complete($1, 'fresh', 'op', $2, 201, '{}'::jsonb)";
    for (ends, tenant) in [("COMMIT", "new-a"), ("ROLLBACK", "new-b")] {
        first.batch_execute("BEGIN").await.unwrap();
        let owner: String = first
            .query_one(claim_sql, &[&tenant, &"k-first", &fp])
            .await
            .unwrap()
            .get(0);
        assert_eq!(owner, "owner");
        second.batch_execute("BEGIN").await.unwrap();
        let second_params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&tenant, &"k-second", &fp];
        let waiting = second.query_one(claim_sql, &second_params);
        let release = async {
            wait_until_lock_wait(&observer, waiter_pid, PATIENCE).await;
            if ends == "COMMIT" {
                first
                    .query_one(complete_sql, &[&tenant, &"k-first"])
                    .await
                    .unwrap();
            }
            first.batch_execute(ends).await.unwrap();
        };
        let (answer, ()) = tokio::join!(waiting, release);
        assert_eq!(answer.unwrap().get::<_, String>(0), "owner", "{ends}");
        second
            .query_one(complete_sql, &[&tenant, &"k-second"])
            .await
            .unwrap();
        second.batch_execute("COMMIT").await.unwrap();
        let row = observer
            .query_one(
                "SELECT (SELECT count(*) FROM idempotency_scopes WHERE tenant_id = $1),
                        (SELECT count(*) FROM idempotency_cards WHERE tenant_id = $1)",
                &[&tenant],
            )
            .await
            .unwrap();
        let expected_records = if ends == "COMMIT" { 2 } else { 1 };
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            (1, expected_records),
            "{ends}"
        );
    }
    // Claims of a scope that exists never touch the sequence.
    let last = "SELECT last_value FROM idempotency_scopes_scope_id_seq";
    let before: i64 = observer.query_one(last, &[]).await.unwrap().get(0);
    first.batch_execute("BEGIN").await.unwrap();
    let owner: String = first
        .query_one(claim_sql, &[&"new-a", &"k-third", &fp])
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "owner");
    first.batch_execute("ROLLBACK").await.unwrap();
    let after: i64 = observer.query_one(last, &[]).await.unwrap().get(0);
    assert_eq!(after, before);
}

/// The card's columns, in a fixed order, as one text per record: before V5 read from the table,
/// from V5 on through the `idempotency_cards` view.
const CARD_CHECKSUM: &str = "SELECT count(*), md5(string_agg(concat_ws('|', tenant_id,
        principal_id, operation, idempotency_key, encode(fingerprint, 'hex'), status_code,
        response_body::text, order_id, expired, created_at, replay_deadline, expired_at,
        resource_id), ',' ORDER BY tenant_id, principal_id, operation, idempotency_key))
    FROM {table}";

/// Average stored size of a tombstone's and of a live record's heap tuple
/// (`pg_column_size` of the whole row), over the same records on both sides of the upgrade.
const TUPLE_SIZES: &str = "SELECT avg(pg_column_size(t.*)) FILTER (WHERE expired)::float8,
        avg(pg_column_size(t.*)) FILTER (WHERE NOT expired AND status_code IS NOT NULL)::float8
    FROM idempotency_records t";

/// Test 9: V5 (the compact card) applied in place to a populated V4 database: live records,
/// tombstones, function records and a hand-written unfinished row, claims and a cleaner on V4;
/// the migration waits for an open replay's lock; every card reads the same afterwards, is
/// smaller, and the functions and the current cleaner work on what V4 left.
#[tokio::test]
async fn v5_upgrades_a_populated_v4_database_in_place() {
    let db = TestDb::empty().await;
    let config = db.config();
    let admin = db.client().await;
    assert_eq!(
        crate::schema_support::migrate_to(&db, 4).await,
        [1, 2, 3, 4]
    );
    // What V4 held: endpoint records (due and not), function records through V4's functions,
    // a V4 cleaner's tombstones, and one unfinished row written by hand.
    use crate::cleanup_support::{seed_live_before_v5, DUE, NOT_DUE};
    seed_live_before_v5(&admin, "v4-due", 40, DUE).await;
    seed_live_before_v5(&admin, "v4-live", 10, NOT_DUE).await;
    let svc = Service::create(&db).await;
    let c = &svc.client;
    let paid = create_payment(c, "v4-pay", 5).await;
    create_payment(c, "v4-old", 6).await;
    let v4_window_closed = admin
        .execute(
            "UPDATE idempotency_records SET replay_deadline = clock_timestamp() - interval '1 s'
             WHERE operation = $1 AND idempotency_key = 'v4-old'",
            &[&OPERATION],
        )
        .await
        .unwrap();
    assert_eq!(v4_window_closed, 1);
    // V4's cleaner, as its batch statement tombstones (body cleared, expired set).
    let v4_tombstoned = admin
        .execute(
            "UPDATE idempotency_records SET response_body = NULL, expired = true, expired_at = now()
             WHERE NOT expired AND replay_deadline <= now()",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(v4_tombstoned, 41);
    admin
        .execute(
            "INSERT INTO idempotency_records (tenant_id, principal_id, operation,
                 idempotency_key, fingerprint, replay_deadline)
             VALUES ('hand', 'written', 'create-order', 'v4-unfinished', sha256('u'),
                     now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap();
    let card_checksum = |table: &str| CARD_CHECKSUM.replace("{table}", table);
    let before = admin
        .query_one(&card_checksum("idempotency_records"), &[])
        .await
        .unwrap();
    let (count_before, sum_before): (i64, String) = (before.get(0), before.get(1));
    assert_eq!(count_before, 40 + 10 + 2 + 1);
    let sizes_v4 = admin.query_one(TUPLE_SIZES, &[]).await.unwrap();
    let (tombstone_v4, live_v4): (f64, f64) = (sizes_v4.get(0), sizes_v4.get(1));

    // A replay in flight (its FOR SHARE lock held) when the upgrade starts: the migration's
    // ACCESS EXCLUSIVE lock waits for it, and the replay's answer stands.
    let fp_pay = fingerprint(c, &intent_of("v4-pay", 5)).await;
    c.batch_execute("BEGIN").await.unwrap();
    let replay = lookup(c, "v4-pay", &fp_pay).await.unwrap().unwrap();
    assert_eq!(replay.outcome, "replay");
    assert_eq!(replay.response_body.as_deref(), Some(paid.as_str()));
    let database = config.database.clone();
    let upgrade =
        tokio::spawn(async move { tombstoned::schema::migrations::migrate(&database).await });
    crate::cleanup_support::wait_until_sessions_wait(&admin, "tombstoned/migrate", 1).await;
    c.batch_execute("COMMIT").await.unwrap();
    let applied = upgrade.await.unwrap().unwrap();
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(4)
    );

    // Every card reads the same, through the view; the tuples are smaller, the live ones too.
    let after = admin
        .query_one(&card_checksum("idempotency_cards"), &[])
        .await
        .unwrap();
    assert_eq!(
        (after.get::<_, i64>(0), after.get::<_, String>(1)),
        (count_before, sum_before)
    );
    let sizes_v5 = admin.query_one(TUPLE_SIZES, &[]).await.unwrap();
    let (tombstone_v5, live_v5): (f64, f64) = (sizes_v5.get(0), sizes_v5.get(1));
    eprintln!(
        "heap tuple bytes, V4 -> V5: tombstone {tombstone_v4:.1} -> {tombstone_v5:.1}, \
         live {live_v4:.1} -> {live_v5:.1}"
    );
    assert!(
        tombstone_v5 < tombstone_v4,
        "{tombstone_v5} >= {tombstone_v4}"
    );
    assert!(
        live_v5 <= live_v4,
        "a live record grew: {live_v4} -> {live_v5}"
    );
    let scopes: i64 = admin
        .query_one("SELECT count(*) FROM idempotency_scopes", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        scopes,
        15 + 1 + 1,
        "the seeds', the service's and the hand-written scope"
    );

    // The functions answer from what V4 left: replay (same body), expired (its resource), key
    // reuse; a new claim of the old scope owns; the unfinished row is still this kind of row.
    let replay = lookup(c, "v4-pay", &fp_pay).await.unwrap().unwrap();
    assert_eq!(replay.outcome, "replay");
    assert_eq!(replay.response_body.as_deref(), Some(paid.as_str()));
    let fp_old = fingerprint(c, &intent_of("v4-old", 6)).await;
    let expired = lookup(c, "v4-old", &fp_old).await.unwrap().unwrap();
    assert_eq!(expired.outcome, "expired");
    assert_eq!(expired.resource_id.as_deref(), Some("pay-v4-old"));
    assert!(expired.expired_at.is_some());
    c.batch_execute("BEGIN").await.unwrap();
    let reused = claim(c, "v4-pay", &fp_old, "1 hour", "2 seconds")
        .await
        .unwrap();
    assert_eq!(reused.outcome, "key_reused");
    let again = claim(c, "v4-old", &fp_old, "1 hour", "2 seconds")
        .await
        .unwrap();
    assert_eq!(again.outcome, "expired");
    c.batch_execute("COMMIT").await.unwrap();
    create_payment(c, "v5-pay", 7).await;

    // The current cleaner on the upgraded table: V4's live record whose window closes now.
    close_window(&admin, "v4-pay").await;
    let report = run(&config).await;
    assert_eq!(report.rows_tombstoned, 1);
    let expired = lookup(c, "v4-pay", &fp_pay).await.unwrap().unwrap();
    assert_eq!(expired.outcome, "expired");
    assert_eq!(expired.resource_id.as_deref(), Some("pay-v4-pay"));
    assert_eq!(
        crate::cleanup_support::counts(&admin).await,
        (42, 10 + 1 + 1)
    );
}

/// `serve` refuses, in one line, a schema whose SQL API version it does not know; `status` and
/// `check-config` show the version.
#[tokio::test]
async fn serve_refuses_an_unknown_api_version_and_status_shows_it() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let command = |args: &[&str]| {
        std::process::Command::new(binary())
            .args(args)
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", &db.url)
            .env("TOMBSTONED_API__ENABLED", "false")
            .env("TOMBSTONED_METRICS__LISTEN", "127.0.0.1:0")
            .output()
            .unwrap()
    };
    let status = command(&["status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains("(SQL API version 1)"), "{text}");
    let json = command(&["status", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["api_version"], 1);
    let check = command(&["check-config"]);
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("sql api: version 1"),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    // A daemon running as a role other than migrate's, without the grant, does not use the
    // functions: nothing is refused, and status says it cannot read the version; with the grant
    // it reads it.
    let role = format!("daemon_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT pg_read_all_data, pg_write_all_data TO {role}"
        ))
        .await
        .unwrap();
    let mut as_role = server().clone();
    as_role.user(&role);
    let url = tombstoned_testkit::cluster::conninfo_for_database(&as_role, &db.name);
    let status_as_role = || {
        let output = std::process::Command::new(binary())
            .arg("status")
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", &url)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let without = status_as_role();
    assert!(
        without.contains("(SQL API version: this role may not call api_version())"),
        "{without}"
    );
    admin
        .batch_execute(&format!(
            "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tombstoned TO {role}"
        ))
        .await
        .unwrap();
    assert!(status_as_role().contains("(SQL API version 1)"));

    admin
        .batch_execute(
            "CREATE OR REPLACE FUNCTION tombstoned.api_version() RETURNS integer
             LANGUAGE sql IMMUTABLE AS $$ SELECT 2 $$",
        )
        .await
        .unwrap();
    let serve = command(&["serve"]);
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(69), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("SQL API is version 2, which this tombstoned does not know"),
        "{stderr}"
    );
}

/// `migrate` installs the SQL API as a role that is neither superuser nor CREATEROLE: only the
/// owner of its database (what the Debian package's `tombstoned` role is).
#[tokio::test]
async fn migrate_installs_the_sql_api_as_an_unprivileged_database_owner() {
    let db = TestDb::empty().await;
    let admin = db.client().await;
    let role = format!("owner_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB;
             ALTER DATABASE {} OWNER TO {role}",
            db.name
        ))
        .await
        .unwrap();
    let mut as_owner = server().clone();
    as_owner.user(&role);
    let url = tombstoned_testkit::cluster::conninfo_for_database(&as_owner, &db.name);
    let config = crate::harness::config_for(&url, &[]);
    let applied = tombstoned::schema::migrations::migrate(&config.database)
        .await
        .unwrap();
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(0)
    );
    // Its functions work for a service role it grants them to, and the operation it grants.
    let owner = Service::connect(&db, &role).await;
    let service = format!("svc_{}", db.name);
    admin
        .batch_execute(&format!("CREATE ROLE {service} LOGIN"))
        .await
        .unwrap();
    owner
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA tombstoned TO {service};
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tombstoned TO {service}"
        ))
        .await
        .unwrap();
    // The owner, without CREATEROLE, grants the operation as the README says.
    let as_owner = tombstoned::db::connect(&config.database, "test-operations")
        .await
        .unwrap();
    tombstoned::operations::grant(
        &as_owner.conn(),
        &tombstoned::operations::Operation::parse(OPERATION).unwrap(),
        &service,
        false,
    )
    .await
    .unwrap();
    let c = Service::connect(&db, &service).await;
    let fp = fingerprint(&c, r#"{"a": 1}"#).await;
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        claim(&c, "k", &fp, "1 hour", "2 s").await.unwrap().outcome,
        "owner"
    );
    let e = c.batch_execute("COMMIT").await.unwrap_err();
    assert_eq!(sqlstate(&e), "TS003", "{e}");
}

/// `lookup` in a read-only transaction (what a standby gives) answers without taking a lock; in
/// a read-write one it share-locks a replayable record like `claim`. `claim` itself needs a
/// writable transaction (25006).
#[tokio::test]
async fn lookup_reads_without_a_lock_in_a_read_only_transaction() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let svc = Service::create(&db).await;
    let c = &svc.client;
    let first = create_payment(c, "ro", 3).await;
    let fp = fingerprint(c, &intent_of("ro", 3)).await;
    // A writer of the record's non-key columns, as a cleanup batch is: it waits for a share
    // lock, and a short lock_timeout turns that wait into 55P03.
    let write = "SET lock_timeout = '200ms';
                 UPDATE idempotency_records SET replay_deadline = replay_deadline
                 WHERE idempotency_key = 'ro'";
    for (begin, locks) in [("BEGIN READ ONLY", false), ("BEGIN", true)] {
        c.batch_execute(begin).await.unwrap();
        let answer = lookup(c, "ro", &fp).await.unwrap().unwrap();
        assert_eq!(answer.outcome, "replay", "{begin}");
        assert_eq!(answer.response_body.as_deref(), Some(first.as_str()));
        let written = admin.batch_execute(write).await;
        match (locks, written) {
            (false, Ok(())) => {}
            (true, Err(e)) => assert_eq!(sqlstate(&e), "55P03", "{e}"),
            (locks, other) => panic!("{begin}: lock held {locks}, the writer got {other:?}"),
        }
        c.batch_execute("COMMIT").await.unwrap();
    }
    c.batch_execute("BEGIN READ ONLY").await.unwrap();
    let e = claim(c, "ro-new", &fp, "1 hour", "2 s").await.unwrap_err();
    assert_eq!(sqlstate(&e), "25006", "{e}");
    c.batch_execute("ROLLBACK").await.unwrap();
}

//! The upgrade to service boundaries (migration V8, issue 36) on a populated database of the
//! schema before it, applied while a service role keeps using the SQL API and the endpoint's
//! statement keeps claiming — each transaction with its own `lock_timeout` — and a transaction
//! of the service holds the outbox table, so the migration must wait for its one lock. Barriers
//! on `pg_stat_activity` and on the traffic's own progress, never sleeps: nothing of the traffic
//! fails, one transaction that began before the migration commits after it, and the role's
//! transitional grant shows in `status` and `check-config` until the operator narrows it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tombstoned::claim::{self, ClaimOutcome, ClaimRequest, ClaimSettings, Decision};
use tombstoned::config::DatabaseConfig;
use tombstoned::fingerprint::Fingerprint;
use tombstoned::money::Currency;
use tombstoned::order_request::OrderRequest;

use crate::cleanup_support::{seed_live, NOT_DUE};
use crate::conn_support::run_binary;
use crate::harness::{wait_until_app_lock_wait, TestDb};
use crate::operations_support::{
    claim_sql, complete_sql, literal, must, operations_cli, session_as, value,
};

const PATIENCE: Duration = Duration::from_secs(60);
/// The operations the service used before the upgrade.
const OPERATIONS: [&str; 2] = ["create-payment", "create-refund"];

/// What the traffic did: transactions committed, and every failure it met.
#[derive(Default)]
struct Traffic {
    committed: AtomicU64,
    failures: Mutex<Vec<String>>,
    stop: AtomicBool,
}

impl Traffic {
    fn committed(&self) -> u64 {
        self.committed.load(Ordering::SeqCst)
    }

    /// No failure so far (the first three shown, and how many there were).
    fn assert_no_failure(&self, what: &str) {
        let failures = self.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{what}: {} transactions failed, the first: {:#?}",
            failures.len(),
            &failures[..failures.len().min(3)]
        );
    }

    /// Waits until `more` transactions beyond `seen` have committed (the traffic's progress is
    /// the barrier), none failing; `while_true` must hold all along.
    async fn wait_for(&self, seen: u64, more: u64, what: &str, while_true: impl Fn() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while self.committed() < seen + more {
            self.assert_no_failure(what);
            assert!(while_true(), "{what}: the condition ended first");
            assert!(
                Instant::now() < deadline,
                "{what}: only {} of {more} transactions within {PATIENCE:?}",
                self.committed() - seen,
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A service's transaction, as it was written before the upgrade: its own lock_timeout, a claim
/// (new keys, and the first key again: a replay), an event and complete for an owner, commit.
async fn service_worker(client: Client, worker: usize, traffic: Arc<Traffic>) {
    let mut n = 0_u32;
    while !traffic.stop.load(Ordering::SeqCst) {
        n += 1;
        let operation = OPERATIONS[(n as usize) % 2];
        let key = if n % 5 == 0 {
            format!("w{worker}-1")
        } else {
            format!("w{worker}-{n}")
        };
        let attempt = async {
            must_ok(&client, "BEGIN").await?;
            must_ok(&client, "SET LOCAL lock_timeout = '1s'").await?;
            let outcome = value(&client, &claim_sql(operation, &key, 1)).await?;
            if outcome.as_deref() == Some("owner") {
                value(
                    &client,
                    &format!(
                        "SELECT tombstoned.enqueue_event('acme', {}, 'thing.created', '{{}}')",
                        literal(&key)
                    ),
                )
                .await?;
                value(&client, &complete_sql(operation, &key)).await?;
            }
            must_ok(&client, "COMMIT").await
        };
        match attempt.await {
            Ok(()) => {
                traffic.committed.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => {
                traffic
                    .failures
                    .lock()
                    .unwrap()
                    .push(format!("worker {worker}, {key}: {e:?}"));
                let _ = client.batch_execute("ROLLBACK").await;
            }
        }
    }
}

async fn must_ok(client: &Client, sql: &str) -> Result<(), tokio_postgres::Error> {
    client.batch_execute(sql).await
}

/// The endpoint's claim (the fused statement, its transaction's lock_timeout 1 s), as a daemon
/// that keeps serving during `migrate` sends it.
async fn endpoint_worker(database: DatabaseConfig, traffic: Arc<Traffic>) {
    let pool = tombstoned::db::pool(&database, "api", 2, Duration::from_secs(10)).unwrap();
    let settings = ClaimSettings {
        lock_timeout: Duration::from_secs(1),
        replay_window: Duration::from_secs(3600),
    };
    let mut n = 0_u32;
    while !traffic.stop.load(Ordering::SeqCst) {
        n += 1;
        let order = OrderRequest {
            request_id: format!("req-{n}"),
            amount_minor: 100,
            currency: Currency::parse("CNY").unwrap(),
            item: "book".to_owned(),
            quantity: 1,
            recipient: "Li Wei".to_owned(),
            metadata: None,
        };
        let request = ClaimRequest {
            tenant: "acme".to_owned(),
            principal: "alice".to_owned(),
            key: format!("order-{n}"),
            fingerprint: Fingerprint::of(&order, "2026-12-01").unwrap(),
            order,
            decision: Decision::Create,
        };
        match claim::claim(&pool, &database, &settings, &request).await {
            Ok(ClaimOutcome::Created { .. }) => {
                traffic.committed.fetch_add(1, Ordering::SeqCst);
            }
            other => traffic
                .failures
                .lock()
                .unwrap()
                .push(format!("endpoint, order-{n}: {other:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v8_applies_under_traffic_and_the_transitional_grants_show_until_narrowed() {
    let db = TestDb::empty().await;
    let admin = db.client().await;
    let before_v8 = crate::schema_support::versions_after(0)
        .into_iter()
        .filter(|v| *v < 8)
        .max()
        .unwrap();
    crate::schema_support::migrate_to(&db, before_v8).await;
    assert_eq!(crate::schema_support::versions_after(before_v8)[0], 8);

    // A service role as the README had it before: the two GRANTs only.
    let svc = format!("svc_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {svc} LOGIN; {}",
            crate::clients_support::documented_grants("tombstoned", &svc)
        ))
        .await
        .unwrap();
    // Data: the endpoint's records, and the service's own in both operations.
    seed_live(&admin, "old", 200, NOT_DUE).await;
    let seeding = session_as(&db, &svc).await;
    for (i, operation) in OPERATIONS.iter().enumerate() {
        crate::operations_support::create(&seeding, operation, &format!("before-{i}")).await;
    }

    let traffic = Arc::new(Traffic::default());
    let mut workers = Vec::new();
    for worker in 0..2 {
        let client = session_as(&db, &svc).await;
        workers.push(tokio::spawn(service_worker(
            client,
            worker,
            traffic.clone(),
        )));
    }
    workers.push(tokio::spawn(endpoint_worker(
        db.config().database,
        traffic.clone(),
    )));
    traffic
        .wait_for(0, 20, "traffic before the upgrade", || true)
        .await;

    // A transaction that began before the upgrade and ends after it.
    let across = session_as(&db, &svc).await;
    must(&across, "BEGIN").await;
    assert_eq!(
        must(&across, &claim_sql("create-payment", "across", 1))
            .await
            .as_deref(),
        Some("owner")
    );
    // A service transaction that holds the outbox table (its event not committed yet): the
    // migration's one lock must wait for it.
    let holder = session_as(&db, &svc).await;
    must(&holder, "BEGIN").await;
    must(&holder, &claim_sql("create-refund", "holder", 1)).await;
    must(
        &holder,
        "SELECT tombstoned.enqueue_event('acme', 'holder', 'thing.created', '{}')",
    )
    .await;

    let database = db.config().database;
    let upgrade = tokio::spawn(async move { tombstoned::schema::migrate(&database).await });
    let observer = db.client().await;
    wait_until_app_lock_wait(&observer, "tombstoned/migrate", PATIENCE).await;
    // While the migration waits for its lock, retrying, the traffic goes on.
    let seen = traffic.committed();
    traffic
        .wait_for(seen, 30, "traffic while the migration waits", || {
            !upgrade.is_finished()
        })
        .await;
    must(&holder, &complete_sql("create-refund", "holder")).await;
    must(&holder, "COMMIT").await;
    let applied = upgrade.await.unwrap().unwrap();
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(before_v8)
    );
    // The schema is V8's now; the transaction from before it ends under the new functions.
    must(
        &across,
        "SELECT tombstoned.enqueue_event('acme', 'across', 'thing.created', '{}')",
    )
    .await;
    must(&across, &complete_sql("create-payment", "across")).await;
    must(&across, "COMMIT").await;
    let seen = traffic.committed();
    traffic
        .wait_for(seen, 20, "traffic after the upgrade", || true)
        .await;
    traffic.stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }
    traffic.assert_no_failure("the traffic");
    println!(
        "{} transactions committed across the upgrade, none failed",
        traffic.committed()
    );

    // Every record is there; the events enqueued since name their sender, the older ones none.
    let senders = admin
        .query(
            "SELECT sender, count(*) FROM outbox_events WHERE aggregate_id IS NOT NULL
             GROUP BY sender ORDER BY sender NULLS FIRST",
            &[],
        )
        .await
        .unwrap();
    assert!(senders.len() <= 2, "{senders:?}");
    assert!(
        senders
            .iter()
            .all(|r| r.get::<_, Option<String>>(0).is_none_or(|s| s == svc)),
        "{senders:?}"
    );
    assert!(senders
        .iter()
        .any(|r| r.get::<_, Option<String>>(0).as_deref() == Some(svc.as_str())));
    let across_done: i64 = admin
        .query_one(
            "SELECT count(*) FROM idempotency_cards
             WHERE idempotency_key IN ('across', 'holder') AND status_code = 201",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(across_done, 2);

    // status and check-config name the role until it is narrowed.
    let status = run_binary(&["status", "--json"], &db.url, &[]).await;
    assert_eq!(status.code, Some(0), "{}", status.stderr);
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(report["transitional_grants"], serde_json::json!([svc]));
    let text = run_binary(&["status"], &db.url, &[]).await;
    let line = format!(
        "operations    1 role still holds the transitional grant of every operation but \
         create-order (from the upgrade to V8): {svc}; grant each the operations it uses, then \
         `tombstoned operations revoke '*' ROLE` (README, Upgrading)"
    );
    assert!(text.stdout.contains(&line), "{}", text.stdout);
    let checked = run_binary(&["check-config"], &db.url, &[]).await;
    assert_eq!(checked.code, Some(0), "{}", checked.stderr);
    assert!(
        checked
            .stdout
            .contains("operations: 1 role still holds the transitional grant"),
        "{}",
        checked.stdout
    );
    // The transitional grant never covered create-order.
    let service = session_as(&db, &svc).await;
    let e = value(&service, &claim_sql("create-order", "order-1", 1))
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{e:?}");

    // Narrowed as README's "Upgrading" says: its operations by name, then the transitional one
    // revoked. What it uses still works; nothing else does; status has nobody left to name.
    for operation in OPERATIONS {
        let run = operations_cli(&db, &["grant", operation, &svc]).await;
        assert_eq!(run.code, Some(0), "{}", run.stderr);
    }
    let run = operations_cli(&db, &["revoke", "*", &svc]).await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(
        run.stdout,
        format!(
            "revoked the transitional grant (*: every operation but create-order) from role \
             \"{svc}\"\n"
        )
    );
    crate::operations_support::create(&service, "create-refund", "after-narrowing").await;
    let e = value(&service, &claim_sql("create-invoice", "k", 1))
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{e:?}");
    let status = run_binary(&["status", "--json"], &db.url, &[]).await;
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(report["transitional_grants"], serde_json::json!([]));
}

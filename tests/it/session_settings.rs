//! What the API's pooled sessions carry session-wide on a direct connection (`db::pooled`,
//! `SessionSettings`): the claim is its statement alone, an implicit transaction, so READ
//! COMMITTED and `api.claim_lock_timeout` are set on each session when the pool opens it, and a
//! reload reaches every session already open — idle or in use — before its next statement. A
//! claim that met 55P03 leaves its session as it found it, and a server default of another
//! isolation level never reaches the claim.

use std::time::Duration;

use tokio_postgres::Client;
use tombstoned::claim::{self, ClaimOutcome, ClaimRequest, ClaimSettings, Decision};
use tombstoned::db::{Object, Pool, SessionSettings};
use tombstoned::fingerprint::Fingerprint;
use tombstoned::money::Currency;
use tombstoned::order_request::OrderRequest;

use crate::api_support::{order, TestApi, ALICE};
use crate::harness::{wait_until_app_lock_wait, wait_until_lock_wait, TestDb};

const PATIENCE: Duration = Duration::from_secs(30);

/// `SHOW name` on a pooled session.
async fn show(session: &Object, name: &str) -> String {
    session
        .query_one(&format!("SHOW {name}"), &[])
        .await
        .unwrap()
        .get(0)
}

async fn pid_of(session: &Object) -> i32 {
    session
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// Both sessions of a pool of two, checked out together: (pid, lock_timeout) of each, by pid.
async fn both_sessions(pool: &Pool) -> Vec<(i32, String)> {
    let (a, b) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    let mut seen = Vec::new();
    for session in [&a, &b] {
        assert_eq!(
            show(session, "default_transaction_isolation").await,
            "read committed"
        );
        seen.push((pid_of(session).await, show(session, "lock_timeout").await));
    }
    seen.sort();
    seen
}

#[tokio::test]
async fn a_reload_reaches_the_pooled_sessions_already_open_idle_and_in_use() {
    let mut api = TestApi::start_with(&[
        ("TOMBSTONED_DATABASE__POOL_SIZE", "2"),
        ("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "60s"),
    ])
    .await;
    let pool = api.state.pool().clone();
    let before = both_sessions(&pool).await;
    assert!(before.iter().all(|(_, t)| t == "1min"), "{before:?}");

    // One session idle, one in use while the configuration is reloaded.
    let in_use = pool.get().await.unwrap();
    api.config.api.claim_lock_timeout = Duration::from_millis(1500);
    api.reload().unwrap();
    drop(in_use);

    // The same two sessions (no new connection), both carrying the new lock timeout.
    let after = both_sessions(&pool).await;
    let pids = |s: &[(i32, String)]| s.iter().map(|(pid, _)| *pid).collect::<Vec<_>>();
    assert_eq!(pids(&after), pids(&before), "the sessions opened before");
    assert!(after.iter().all(|(_, t)| t == "1500ms"), "{after:?}");

    // And the claims on them wait the new timeout, not a minute: two at once, one per session,
    // held at the orders table.
    let gate = api.db.client().await;
    gate.batch_execute("BEGIN; LOCK TABLE orders IN SHARE MODE")
        .await
        .unwrap();
    let (first, second) = tokio::time::timeout(
        PATIENCE,
        futures::future::join(
            api.post(ALICE, "key-r1", &order("req-r1")),
            api.post(ALICE, "key-r2", &order("req-r2")),
        ),
    )
    .await
    .expect("both claims answered within the reloaded lock timeout");
    for reply in [&first, &second] {
        assert_eq!(reply.expect(409).problem(), "request-in-progress");
    }
    gate.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(pids(&both_sessions(&pool).await), pids(&before));
}

/// The read routes run on the same sessions, so they wait at most the claim's lock timeout too:
/// an order read behind DDL's lock answers 503 after it, not after the lookup's deadline.
#[tokio::test]
async fn a_read_route_waits_the_sessions_lock_timeout_then_answers_503() {
    let api = TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "1s")]).await;
    let created = api.post(ALICE, "key-read", &order("req-read")).await;
    let path = format!(
        "/v1/orders/{}",
        created.expect(201).json()["order_id"].as_str().unwrap()
    );
    let ddl = api.db.client().await;
    ddl.batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let blocked = api.get(Some(ALICE), &path).await;
    assert_eq!(blocked.expect(503).problem(), "database-unavailable");
    assert!(api
        .metrics_text()
        .contains("tombstoned_db_errors_total{sqlstate_class=\"55\"} 1"));
    ddl.batch_execute("ROLLBACK").await.unwrap();
    api.get(Some(ALICE), &path).await.expect(200);
}

fn request(key: &str) -> ClaimRequest {
    let order = OrderRequest {
        request_id: format!("req-{key}"),
        amount_minor: 100,
        currency: Currency::parse("CNY").unwrap(),
        item: "book".to_owned(),
        quantity: 1,
        recipient: "Li Wei".to_owned(),
        metadata: None,
    };
    ClaimRequest {
        tenant: "acme".to_owned(),
        principal: "alice".to_owned(),
        key: key.to_owned(),
        fingerprint: Fingerprint::of(&order, "2024-06-01").unwrap(),
        order,
        decision: Decision::Create,
    }
}

/// A pool of one session carrying the settings `claim` runs with.
fn pool_of_one(db: &TestDb, claim: &ClaimSettings) -> (tombstoned::config::Config, Pool) {
    let config = db.config();
    let pool = tombstoned::db::pool_carrying(
        &config.database,
        "api",
        1,
        Duration::from_secs(10),
        claim.session_settings(),
    )
    .unwrap();
    (config, pool)
}

/// The server's state of a backend, seen from another session.
async fn state_of(observer: &Client, pid: i32) -> String {
    observer
        .query_one("SELECT state FROM pg_stat_activity WHERE pid = $1", &[&pid])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_claim_that_met_55p03_leaves_its_session_as_it_found_it() {
    let db = TestDb::new().await;
    let settings = ClaimSettings {
        lock_timeout: Duration::from_secs(2),
        replay_window: Duration::from_secs(3600),
    };
    let (config, pool) = pool_of_one(&db, &settings);
    let req = request("key-held");
    let created = claim::claim(&pool, &config.database, &settings, &req)
        .await
        .unwrap();
    assert!(
        matches!(created, ClaimOutcome::Created { .. }),
        "{created:?}"
    );
    let session = pool.get().await.unwrap();
    let pid = pid_of(&session).await;
    let names = [
        "lock_timeout",
        "default_transaction_isolation",
        "synchronous_commit",
    ];
    let mut found = Vec::new();
    for name in names {
        found.push(show(&session, name).await);
    }
    assert_eq!(found[..2], ["2s", "read committed"]);
    assert_eq!(
        session.carried(),
        Some(SessionSettings {
            lock_timeout: settings.lock_timeout
        })
    );
    drop(session);

    // A writer holds the record: the replay's FOR SHARE waits past the lock timeout (55P03).
    let holder = db.client().await;
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM idempotency_records WHERE idempotency_key = 'key-held' FOR UPDATE",
        )
        .await
        .unwrap();
    let observer = db.client().await;
    let waiting = tokio::spawn({
        let (pool, database, req) = (pool.clone(), config.database.clone(), req.clone());
        let settings = settings.clone();
        async move { claim::claim(&pool, &database, &settings, &req).await }
    });
    wait_until_lock_wait(&observer, pid, PATIENCE).await;
    let answer = waiting.await.unwrap().unwrap();
    assert_eq!(answer, ClaimOutcome::InProgress);
    holder.batch_execute("ROLLBACK").await.unwrap();

    // The same session, back in the pool: idle (no transaction left open), its settings as
    // they were, and the next claim on it replays.
    let session = pool.get().await.unwrap();
    assert_eq!(
        pid_of(&session).await,
        pid,
        "the session was kept, not discarded"
    );
    assert_eq!(
        state_of(&observer, pid).await,
        "idle",
        "no transaction left open"
    );
    let mut again = Vec::new();
    for name in names {
        again.push(show(&session, name).await);
    }
    assert_eq!(again, found);
    drop(session);
    let replayed = claim::claim(&pool, &config.database, &settings, &req)
        .await
        .unwrap();
    assert!(
        matches!(replayed, ClaimOutcome::Replayed { status: 201, .. }),
        "{replayed:?}"
    );
}

/// The owner attempt alone takes its isolation from the session: under a database default of
/// SERIALIZABLE the session's own `read committed` still holds, so a claim that waited for an
/// in-flight owner of its key sees the committed record and replays it (under SERIALIZABLE its
/// INSERT ... ON CONFLICT would fail with 40001 instead).
#[tokio::test]
async fn under_a_default_of_serializable_the_claim_alone_still_runs_read_committed() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'serializable'",
            db.name
        ))
        .await
        .unwrap();
    let settings = ClaimSettings {
        lock_timeout: Duration::from_secs(20),
        replay_window: Duration::from_secs(3600),
    };
    let (config, pool) = pool_of_one(&db, &settings);
    let session = pool.get().await.unwrap();
    assert_eq!(
        show(&session, "default_transaction_isolation").await,
        "read committed"
    );
    drop(session);

    // An owner in flight: the record inserted, uncommitted, with the request's fingerprint.
    let req = request("key-serial");
    let owner = db.client().await;
    owner
        .batch_execute("SELECT ensure_scope('acme', 'alice', 'create-order')")
        .await
        .unwrap();
    owner
        .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await
        .unwrap();
    owner
        .execute(
            "INSERT INTO idempotency_records (scope_id, idempotency_key, fingerprint,
                 status_code, response_body, replay_deadline)
             VALUES (ensure_scope('acme', 'alice', 'create-order'), $1, $2, 201,
                     '{\"from\": \"owner\"}', now() + interval '1 day')",
            &[&req.key, &req.fingerprint.as_bytes().as_slice()],
        )
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let (pool, database, req) = (pool.clone(), config.database.clone(), req.clone());
        let settings = settings.clone();
        async move { claim::claim(&pool, &database, &settings, &req).await }
    });
    wait_until_app_lock_wait(&admin, "tombstoned/api", PATIENCE).await;
    owner.batch_execute("COMMIT").await.unwrap();
    let answer = waiting.await.unwrap().unwrap();
    assert_eq!(
        answer,
        ClaimOutcome::Replayed {
            status: 201,
            body: r#"{"from": "owner"}"#.to_owned(),
            order_id: None,
        }
    );
}

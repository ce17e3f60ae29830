//! `tombstoned keys explain` (issue 43), run as the binary against a real PostgreSQL: every state
//! produced for real — a claim held open in another session (a `pg_stat_activity` barrier), a
//! completed record made by the endpoint, the same past its deadline and then tombstoned by the
//! real cleaner, a free key — with `--intent` matching and not, a record of another operation,
//! the JSON form, a committed record whose row lock a replay holds, and a role that cannot see
//! other sessions (and one that may not read the records at all).

use std::time::Duration;

use serde_json::{json, Value};
use tokio_postgres::{Client, NoTls};

use crate::api_support::backend_pid;
use crate::api_support::{TestApi, ALICE};
use crate::cleanup_support::Reader;
use crate::harness::{binary, server, wait_until_idle_in_transaction, TestDb};
use tombstoned_testkit::cluster::conninfo_for_database;

const PATIENCE: Duration = Duration::from_secs(30);

/// What one run printed.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", self.stdout, self.stderr))
    }
}

/// `tombstoned keys explain ARGS` against `url`.
async fn explain(url: &str, args: &[&str]) -> Run {
    let output = tokio::process::Command::new(binary())
        .args(["keys", "explain"])
        .args(args)
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", url)
        .output()
        .await
        .unwrap();
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The scope flags of `operation` for acme/alice, `key`, then `more`.
fn scope<'a>(operation: &'a str, key: &'a str, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--tenant",
        "acme",
        "--principal",
        "alice",
        "--operation",
        operation,
        "--key",
        key,
    ];
    args.extend_from_slice(more);
    args
}

/// A session of `role` on the test database, named `application`.
async fn session_as(db: &TestDb, role: &str, application: &str) -> Client {
    let mut config = server().clone();
    config.user(role);
    config.dbname(&db.name);
    config.application_name(application);
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// An SQL API claim of `key` in `tenant`/alice/`operation` for `intent`, left open: the session
/// and its pid.
async fn claim_held_open(
    db: &TestDb,
    tenant: &str,
    operation: &str,
    key: &str,
    intent: &str,
) -> (Client, i32) {
    let client = session_as(db, &owner(), "held-claim").await;
    let pid = backend_pid(&client).await;
    client.batch_execute("BEGIN").await.unwrap();
    let outcome: String = client
        .query_one(
            "SELECT outcome FROM tombstoned.claim($1, 'alice', $2, $3, \
             tombstoned.fingerprint($4::text::jsonb), interval '1 hour')",
            &[&tenant, &operation, &key, &intent],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome, "owner");
    (client, pid)
}

/// The role the harness connects as (it owns the schema).
fn owner() -> String {
    server().get_user().unwrap_or("postgres").to_owned()
}

/// An SQL API record of `key` in acme/alice/`operation`, completed with status 201 and
/// `resource`, committed.
async fn completed(client: &Client, operation: &str, key: &str, intent: &str, resource: &str) {
    client.batch_execute("BEGIN").await.unwrap();
    let outcome: String = client
        .query_one(
            "SELECT outcome FROM tombstoned.claim('acme', 'alice', $1, $2, \
             tombstoned.fingerprint($3::text::jsonb), interval '1 hour')",
            &[&operation, &key, &intent],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(outcome, "owner");
    client
        .query_one(
            "SELECT tombstoned.complete('acme', 'alice', $1, $2, 201, '{\"paid\": true}', $3)",
            &[&operation, &key, &resource],
        )
        .await
        .unwrap();
    client.batch_execute("COMMIT").await.unwrap();
}

/// The endpoint's record: completed, then past its deadline, then tombstoned by the real
/// cleaner — each with the order body as `--intent` (the same, and another amount), the body
/// shown on request, and the JSON form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoints_record_completed_expired_and_tombstoned() {
    let api = TestApi::start().await;
    let url = api.db.url.clone();
    let body = json!({"request_id": "PR-keys-1", "amount": "100.00", "item": "SKU-42",
                      "recipient": "Li Wei", "metadata": {"trace_id": "abc"}});
    let created = api.post(ALICE, "k-order", &body).await;
    created.expect(201);
    let same = json!({"recipient": "Li Wei", "item": "SKU-42", "amount": "100.00",
                      "request_id": "PR-keys-1"})
    .to_string();
    let other = body.to_string().replace("100.00", "100.01");
    let invalid = json!({"request_id": "PR-keys-1"}).to_string();

    let run = explain(
        &url,
        &scope("create-order", "k-order", &["--intent", &same]),
    )
    .await;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    for needle in [
        "key \"k-order\" of tenant \"acme\", principal \"alice\", operation \"create-order\" (the endpoint's)\n",
        "  state             completed, replayable until ",
        "  stored answer     status 201, order ",
        "  body              not shown (--show-body shows it)\n",
        "  lock              no open transaction holds the record\n",
        "  intent            matches the stored fingerprint (Api-Version 2026-12-01): a retry of it \
         replays the stored answer (HTTP 201, as a replay)\n",
    ] {
        assert!(run.stdout.contains(needle), "{needle:?} missing from\n{}", run.stdout);
    }
    assert!(
        !run.stdout.contains("SKU-42"),
        "the body is never shown unasked"
    );

    let json = explain(
        &url,
        &scope("create-order", "k-order", &["--intent", &other, "--json"]),
    )
    .await
    .json();
    assert_eq!(json["state"], "completed");
    assert_eq!(json["endpoint"], true);
    assert_eq!(json["record"]["status_code"], 201);
    assert_eq!(json["record"]["body_shown"], false);
    assert_eq!(json["record"]["response_body"], Value::Null);
    assert_eq!(json["intent"]["matches"], false);
    assert_eq!(json["intent"]["retry"], "key_reused");
    assert_eq!(json["held"], Value::Null);
    assert_eq!(json["probe"], "not_needed");
    let order_id = json["record"]["order_id"].as_str().unwrap().to_owned();
    assert!(created.text.contains(&order_id));

    let shown = explain(&url, &scope("create-order", "k-order", &["--show-body"])).await;
    assert!(
        shown.stdout.contains(&format!(
            "  body              SHOWING THE STORED BODY (--show-body):\n{}\n",
            created.text
        )),
        "{}",
        shown.stdout
    );
    let refused = explain(
        &url,
        &scope("create-order", "k-order", &["--intent", &invalid, "--json"]),
    )
    .await
    .json();
    assert_eq!(refused["intent"]["retry"], "refused_before_claim");

    // Past its deadline, not tombstoned yet: the window is judged on the database clock.
    let client = api.db.client().await;
    client
        .execute(
            "UPDATE idempotency_records SET replay_deadline = now() - interval '1 minute' \
             WHERE idempotency_key = 'k-order'",
            &[],
        )
        .await
        .unwrap();
    let past = explain(
        &url,
        &scope("create-order", "k-order", &["--intent", &same, "--json"]),
    )
    .await
    .json();
    assert_eq!(past["state"], "past_deadline");
    assert_eq!(past["intent"]["retry"], "expired");
    // What the endpoint answers agrees.
    api.post(ALICE, "k-order", &body).await.expect(410);

    // The real cleaner tombstones it.
    let cleanup = tokio::process::Command::new(binary())
        .arg("cleanup")
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", &url)
        .output()
        .await
        .unwrap();
    assert!(cleanup.status.success(), "{cleanup:?}");
    let run = explain(
        &url,
        &scope(
            "create-order",
            "k-order",
            &["--intent", &same, "--show-body"],
        ),
    )
    .await;
    assert_eq!(run.code, Some(0));
    for needle in [
        "  state             tombstoned since ",
        "  body              none (a tombstone keeps no body)\n",
        "a retry of it gets 410 replay-window-expired (never a re-execution)\n",
    ] {
        assert!(
            run.stdout.contains(needle),
            "{needle:?} missing from\n{}",
            run.stdout
        );
    }
    let tomb = explain(
        &url,
        &scope("create-order", "k-order", &["--intent", &other, "--json"]),
    )
    .await
    .json();
    assert_eq!(tomb["state"], "tombstoned");
    assert!(tomb["record"]["expired_at"].is_string());
    assert_eq!(tomb["record"]["order_id"], order_id.as_str());
    assert_eq!(tomb["intent"]["retry"], "key_reused");
    api.post(
        ALICE,
        "k-order",
        &serde_json::from_str::<Value>(&other).unwrap(),
    )
    .await
    .expect(422);
}

/// A claim held open in another session: in flight (exit 0), its session named; a free key
/// (exit 3) even while another claim is open and after a claim of it rolled back; a record of
/// another operation is not this operation's, but is pointed at; a claim of a scope's first key
/// held open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_free_and_another_operations_record() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    completed(&observer, "charge", "k-1", r#"{"amount": 1}"#, "pay-1").await;

    let (holder, holder_pid) =
        claim_held_open(&db, "acme", "charge", "k-open", r#"{"amount": 2}"#).await;
    wait_until_idle_in_transaction(&observer, holder_pid, PATIENCE).await;
    let run = explain(
        &db.url,
        &scope("charge", "k-open", &["--intent", r#"{"amount": 2}"#]),
    )
    .await;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    for needle in [
        "  state             in flight: an open transaction has claimed the key and not committed\n",
        &format!(
            "  held by           one of the open transactions writing records: pid {holder_pid} \
             (application held-claim, role {}): idle in transaction, transaction open ",
            owner()
        ),
        "RowExclusiveLock",
        "  intent            claim() waits for that transaction (up to its lock_timeout, then \
         SQLSTATE 55P03) and answers from what it commits\n",
    ] {
        assert!(run.stdout.contains(needle), "{needle:?} missing from\n{}", run.stdout);
    }
    let json = explain(&db.url, &scope("charge", "k-open", &["--json"]))
        .await
        .json();
    assert_eq!(json["state"], "in_flight");
    assert_eq!(json["probe"], "uncommitted_entry");
    assert_eq!(json["held"]["how"], "uncommitted_claim");
    let pids: Vec<i64> = json["held"]["transactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["pid"].as_i64().unwrap())
        .collect();
    assert_eq!(pids, [i64::from(holder_pid)]);

    // A claim that rolled back leaves a dead index entry: free, though a writer is open (the
    // held claim above).
    let rolled_back = session_as(&db, &owner(), "rolled-back").await;
    rolled_back.batch_execute("BEGIN").await.unwrap();
    rolled_back
        .query_one(
            "SELECT outcome FROM tombstoned.claim('acme', 'alice', 'charge', 'k-gone', \
             tombstoned.fingerprint('{}'), interval '1 hour')",
            &[],
        )
        .await
        .unwrap();
    rolled_back.batch_execute("ROLLBACK").await.unwrap();
    let free = explain(&db.url, &scope("charge", "k-gone", &["--intent", "{}"])).await;
    assert_eq!(free.code, Some(3), "{}{}", free.stdout, free.stderr);
    assert!(
        free.stdout.contains(
            "  state             free: no record, committed or in flight; a request with the key \
             now claims it\n"
        ),
        "{}",
        free.stdout
    );
    assert!(free
        .stdout
        .contains("  intent            claim() answers owner: the business runs\n"));
    holder.batch_execute("COMMIT").await.unwrap_err(); // TS003: a claim without an answer
    let gone = explain(&db.url, &scope("charge", "k-open", &["--json"])).await;
    assert_eq!(gone.code, Some(3));
    assert_eq!(gone.json()["probe"], "clear");

    // The key has a record in `charge`, not in `refund`.
    let other = explain(&db.url, &scope("refund", "k-1", &["--json"])).await;
    assert_eq!(other.code, Some(3));
    let other = other.json();
    assert_eq!(other["state"], "free");
    assert_eq!(other["record"], Value::Null);
    assert_eq!(other["other_operations"], json!(["charge"]));
    let text = explain(&db.url, &scope("refund", "k-1", &[])).await;
    assert!(text.stdout.contains(
        "  other operations  the key has a record in charge (same tenant and principal)\n"
    ));
    let mine = explain(
        &db.url,
        &scope("charge", "k-1", &["--intent", r#"{"amount":1}"#, "--json"]),
    )
    .await
    .json();
    assert_eq!(mine["state"], "completed");
    assert_eq!(mine["endpoint"], false);
    assert_eq!(mine["record"]["resource_id"], "pay-1");
    assert_eq!(mine["intent"]["matches"], true);
    assert_eq!(mine["intent"]["retry"], "replay");

    // The first claim of a scope, held open: the scope row is not committed either.
    let (first, first_pid) = claim_held_open(&db, "newco", "charge", "k-first", "{}").await;
    wait_until_idle_in_transaction(&observer, first_pid, PATIENCE).await;
    let run = explain(
        &db.url,
        &[
            "--tenant",
            "newco",
            "--principal",
            "alice",
            "--operation",
            "charge",
            "--key",
            "k-first",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let json = run.json();
    assert_eq!(json["state"], "in_flight");
    assert_eq!(json["held"]["transactions"][0]["pid"], first_pid);
    first.batch_execute("ROLLBACK").await.unwrap();
}

/// A committed record whose row lock a replay holds (`FOR SHARE`, open): the holder is named,
/// with what the role may see of it — everything for the owner; for a monitoring role without
/// `pg_read_all_stats`, its pid and application and that its state is hidden. A role without
/// the tables' SELECT is refused with the grants it needs (exit 64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_lock_holder_as_the_owner_and_as_a_monitoring_role() {
    let db = TestDb::new().await;
    let observer = db.client().await;
    completed(&observer, "charge", "k-locked", r#"{"amount": 5}"#, "pay-5").await;
    let pk = crate::cleanup_support::Pk {
        tenant_id: "acme".into(),
        principal_id: "alice".into(),
        operation: "charge".into(),
        idempotency_key: "k-locked".into(),
    };
    let (reader, _body) = Reader::lock(&db, &pk, "FOR SHARE").await;
    wait_until_idle_in_transaction(&observer, reader.pid, PATIENCE).await;

    let json = explain(&db.url, &scope("charge", "k-locked", &["--json"]))
        .await
        .json();
    assert_eq!(json["state"], "completed");
    assert_eq!(json["held"]["how"], "row_lock");
    let holder = &json["held"]["transactions"][0];
    assert_eq!(holder["pid"], reader.pid);
    assert_eq!(holder["visible"], true);
    assert_eq!(holder["state"], "idle in transaction");
    assert_eq!(holder["record_locks"], json!(["RowShareLock"]));

    let monitor = format!("monitor_{}", db.name);
    let nobody = format!("nobody_{}", db.name);
    observer
        .batch_execute(&format!(
            "CREATE ROLE {monitor} LOGIN;
             GRANT USAGE ON SCHEMA tombstoned TO {monitor};
             GRANT SELECT ON tombstoned.schema_history, tombstoned.idempotency_scopes,
                             tombstoned.idempotency_records TO {monitor};
             CREATE ROLE {nobody} LOGIN;
             GRANT USAGE ON SCHEMA tombstoned TO {nobody};
             GRANT SELECT ON tombstoned.schema_history TO {nobody};"
        ))
        .await
        .unwrap();
    let as_role = |role: &str| {
        let mut config = server().clone();
        config.user(role);
        conninfo_for_database(&config, &db.name)
    };
    let run = explain(
        &as_role(&monitor),
        &scope("charge", "k-locked", &["--intent", "{}"]),
    )
    .await;
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    for needle in [
        format!(
            "  lock              held by pid {} (application tombstoned/test, role {}): its state \
             is not visible to role {monitor} \
             (needs pg_read_all_stats, which pg_monitor includes); holds RowShareLock on the \
             records\n",
            reader.pid,
            owner()
        ),
        format!(
            "  intent            what a retry gets cannot be told: role \"{monitor}\" may not \
             execute tombstoned.fingerprint(jsonb)\n"
        ),
    ] {
        assert!(
            run.stdout.contains(&needle),
            "{needle:?} missing from\n{}",
            run.stdout
        );
    }
    let json = explain(
        &as_role(&monitor),
        &scope("charge", "k-locked", &["--json"]),
    )
    .await
    .json();
    assert_eq!(json["sees_all_sessions"], false);
    assert_eq!(json["held"]["transactions"][0]["visible"], false);
    assert_eq!(json["held"]["transactions"][0]["state"], Value::Null);
    assert_eq!(
        json["held"]["transactions"][0]["transaction_seconds"],
        Value::Null
    );

    let refused = explain(&as_role(&nobody), &scope("charge", "k-locked", &[])).await;
    assert_eq!(
        refused.code,
        Some(64),
        "{}{}",
        refused.stdout,
        refused.stderr
    );
    assert!(refused.stdout.is_empty());
    assert!(
        refused.stderr.contains(&format!(
            "role \"{nobody}\" may not read the idempotency records (reading the record): GRANT \
             USAGE ON SCHEMA tombstoned and SELECT ON tombstoned.idempotency_scopes, \
             tombstoned.idempotency_records to it"
        )),
        "{}",
        refused.stderr
    );
    reader.commit().await;
    let json = explain(&db.url, &scope("charge", "k-locked", &["--json"]))
        .await
        .json();
    assert_eq!(json["held"], Value::Null);
}

/// Exit statuses shared with every command: an intent that is not JSON (64), a database that
/// cannot be reached (69).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_and_unavailable_exit_statuses() {
    let db = TestDb::new().await;
    let run = explain(&db.url, &scope("charge", "k", &["--intent", "{not json"])).await;
    assert_eq!(run.code, Some(64), "{}", run.stderr);
    assert!(
        run.stderr.contains("--intent is not JSON"),
        "{}",
        run.stderr
    );
    let run = explain(&db.url, &scope("charge", "k", &["--intent", r#""\u0000""#])).await;
    assert_eq!(run.code, Some(64), "{}", run.stderr);
    let run = explain(
        "postgresql://tombstoned@127.0.0.1:1/app",
        &scope("charge", "k", &[]),
    )
    .await;
    assert_eq!(run.code, Some(69), "{}", run.stderr);
    let run = explain(&db.url, &["--tenant", "acme"]).await;
    assert_eq!(run.code, Some(64), "{}", run.stderr);
}

//! The endpoint's claim statements as functions (migration V6, used only with `database.pooler =
//! "transaction"`): the migration grants EXECUTE to the roles that already hold the tables'
//! privileges and to nobody else; `serve` through a transaction pooler refuses, in one line, a
//! role that may not execute them, and claims through them once granted. That each body is
//! exactly its Rust constant is the schema's contract test's (tests/it/schema_contract.rs);
//! tests/it/protocol_paths.rs runs the protocol's cases through them, tests/it/pooler.rs through
//! a real PgBouncer.

use crate::api_support::order;
use crate::daemon_support::{self, Daemon, Spec};
use crate::harness::{binary, server, TestDb};
use crate::ops_support::repo_root;

/// The functions' argument lists, as `regprocedure` names them.
const CLAIM_ORDER: &str = "tombstoned.endpoint_claim_order(text, text, text, text, bytea, uuid, \
                           text, bigint, text, text, text, integer, text, bigint, uuid, jsonb, \
                           text)";
/// The first function's name, for calling it.
const CLAIM_ORDER_NAME: &str = "tombstoned.endpoint_claim_order";
const CLAIM_REJECTED_FN: &str = "tombstoned.endpoint_claim_rejected(text, text, text, text, \
                                 bytea, smallint, jsonb, bigint, text)";

/// `tombstoned serve` on `url` with `pooler = "transaction"` and the API on, run to its exit.
fn serve_through_transaction_pooler(url: &str) -> std::process::Output {
    std::process::Command::new(binary())
        .arg("serve")
        .env_clear()
        .env("TOMBSTONED_DATABASE_URL", url)
        .env("TOMBSTONED_DATABASE__POOLER", "transaction")
        // Only the error line (the tokens file's INFO line otherwise comes first).
        .env("RUST_LOG", "warn")
        .env("TOMBSTONED_API__LISTEN", "127.0.0.1:0")
        .env("TOMBSTONED_METRICS__LISTEN", "127.0.0.1:0")
        .env(
            "TOMBSTONED_API__TOKENS_FILE",
            repo_root().join("config/tokens.toml"),
        )
        .output()
        .unwrap()
}

/// A V5 schema (V6 pending): `serve` through a transaction pooler refuses it as any daemon does,
/// naming V6, before a claim could call a function that is not there.
#[tokio::test]
async fn serve_through_a_transaction_pooler_refuses_a_schema_without_v6() {
    let db = TestDb::empty().await;
    crate::schema_support::migrate_to(&db, 5).await;
    let serve = serve_through_transaction_pooler(&db.url);
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(69), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let pending = format!(
        "{} migration(s) pending (V6__endpoint_claim_functions",
        crate::schema_support::versions_after(5).len()
    );
    assert!(stderr.contains(&pending), "{stderr}");
}

/// Whether `role` may execute both functions.
async fn may_execute(admin: &tokio_postgres::Client, role: &str) -> (bool, bool) {
    let row = admin
        .query_one(
            "SELECT has_function_privilege($1, $2::text::regprocedure, 'EXECUTE'),
                    has_function_privilege($1, $3::text::regprocedure, 'EXECUTE')",
            &[&role, &CLAIM_ORDER, &CLAIM_REJECTED_FN],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// V6 on a V5 database with a daemon role (the tables' privileges, granted by hand as the README
/// says) and a read-only role: the daemon role may execute both functions afterwards, the
/// read-only one and PUBLIC neither.
#[tokio::test]
async fn v6_grants_execute_to_the_roles_that_may_already_write_what_the_functions_write() {
    let db = TestDb::empty().await;
    let admin = db.client().await;
    assert_eq!(
        crate::schema_support::migrate_to(&db, 5).await,
        [1, 2, 3, 4, 5]
    );
    let daemon_role = format!("writer_{}", db.name);
    let reader_role = format!("reader_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {daemon_role} LOGIN;
             GRANT USAGE ON SCHEMA tombstoned TO {daemon_role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tombstoned
                 TO {daemon_role};
             CREATE ROLE {reader_role} LOGIN;
             GRANT USAGE ON SCHEMA tombstoned TO {reader_role};
             GRANT SELECT ON ALL TABLES IN SCHEMA tombstoned TO {reader_role}"
        ))
        .await
        .unwrap();
    let config = db.config();
    let applied = tombstoned::schema::migrations::migrate(&config.database)
        .await
        .unwrap();
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(5)
    );
    assert_eq!(may_execute(&admin, &daemon_role).await, (true, true));
    assert_eq!(may_execute(&admin, &reader_role).await, (false, false));
    assert_eq!(may_execute(&admin, "public").await, (false, false));
}

/// `serve` with `pooler = "transaction"` as a role that may write the tables but not execute the
/// functions (given its privileges after `migrate`): exit 69, one line naming the functions, the
/// role and the fix. Granted EXECUTE, it starts and claims and replays through them.
#[tokio::test]
async fn serve_through_a_transaction_pooler_refuses_a_role_without_execute_then_claims() {
    let db = TestDb::new().await;
    let admin = db.client().await;
    let role = format!("late_{}", db.name);
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT USAGE ON SCHEMA tombstoned TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tombstoned TO {role}"
        ))
        .await
        .unwrap();
    let mut as_role = server().clone();
    as_role.user(&role);
    let url = tombstoned_testkit::cluster::conninfo_for_database(&as_role, &db.name);
    let serve = serve_through_transaction_pooler(&url);
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(69), "{stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    for part in [
        "refusing to start",
        "endpoint_claim_order",
        "endpoint_claim_rejected",
        role.as_str(),
        "EXECUTE",
    ] {
        assert!(lines[0].contains(part), "{part}: {stderr}");
    }

    admin
        .batch_execute(&format!(
            "GRANT EXECUTE ON FUNCTION {CLAIM_ORDER}, {CLAIM_REJECTED_FN} TO {role}"
        ))
        .await
        .unwrap();
    let daemon =
        Daemon::start(Spec::new(&url).env("TOMBSTONED_DATABASE__POOLER", "transaction")).await;
    let first = daemon
        .create_order(daemon_support::ALICE, "late-key", &order("late-req"))
        .await;
    first.expect(201);
    let again = daemon
        .create_order(daemon_support::ALICE, "late-key", &order("late-req"))
        .await;
    again.expect(201);
    assert!(again.replayed());
    assert_eq!(again.text, first.text);
}

/// Through a transaction pooler the owner attempt is the function's call alone, an implicit
/// transaction that takes the server's default isolation. Under a default of SERIALIZABLE the
/// function refuses (TS005, nothing written) instead of claiming under another level than the
/// protocol's, and the daemon's claim runs the same call again inside `BEGIN ISOLATION LEVEL
/// READ COMMITTED ... COMMIT`: the claim and its replay still answer as they must.
#[tokio::test]
async fn under_another_default_isolation_the_claim_still_runs_read_committed() {
    use std::time::Duration;
    use tombstoned::claim::{self, ClaimOutcome, ClaimRequest, ClaimSettings, Decision};
    use tombstoned::fingerprint::Fingerprint;
    use tombstoned::money::Currency;
    use tombstoned::order_request::OrderRequest;

    let db = TestDb::new().await;
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_isolation = 'serializable'",
            db.name
        ))
        .await
        .unwrap();

    // The function alone, in an implicit SERIALIZABLE transaction: refused, nothing written.
    let session = db.client().await;
    let refused = session
        .query(
            &format!(
                "SELECT * FROM {CLAIM_ORDER_NAME}('t', 'p', 'create-order', 'k', \
                 '\\x{fp}'::bytea, gen_random_uuid(), 'r', 100, '1.00', 'CNY', 'book', 1, 'x', \
                 3600000000, gen_random_uuid(), NULL, '2000ms')",
                fp = "00".repeat(32)
            ),
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some(tombstoned::db::WRONG_ISOLATION),
        "{refused}"
    );

    // The daemon's claim through the transaction-pooler path, on sessions opened after the change.
    let config = db.config_with(&[("TOMBSTONED_DATABASE__POOLER", "transaction")]);
    let pool = tombstoned::db::pool(&config.database, "api", 2, Duration::from_secs(10)).unwrap();
    let order = OrderRequest {
        request_id: "req-serializable".to_owned(),
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
        key: "key-serializable".to_owned(),
        fingerprint: Fingerprint::of(&order, "2024-06-01").unwrap(),
        order,
        decision: Decision::Create,
    };
    let settings = ClaimSettings {
        lock_timeout: Duration::from_secs(2),
        replay_window: Duration::from_secs(3600),
    };
    let first = claim::claim(&pool, &config.database, &settings, &request)
        .await
        .unwrap();
    let ClaimOutcome::Created { body, .. } = first else {
        panic!("{first:?}");
    };
    let again = claim::claim(&pool, &config.database, &settings, &request)
        .await
        .unwrap();
    assert!(
        matches!(&again, ClaimOutcome::Replayed { body: replayed, .. } if *replayed == body),
        "{again:?}"
    );
    let orders: i64 = admin
        .query_one("SELECT count(*) FROM orders", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(orders, 1);
}

//! Migrations and the schema they create: apply, re-apply, apply concurrently, and the
//! constraints the protocol relies on.

use std::process::Command;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tombstoned::db::{migrations, Conn, Pooler};

use crate::cleanup_support::wait_until_sessions_wait;
use crate::harness::{binary, TestDb};

#[tokio::test]
async fn migrate_applies_on_an_empty_database_and_reapplying_is_a_no_op() {
    let db = TestDb::empty().await;
    let config = db.config();
    let client = db.client().await;
    let before = migrations::status(&Conn::dedicated(&client, "tombstoned", Pooler::None), None)
        .await
        .unwrap();
    assert!(before.applied.is_empty());
    assert_eq!(
        before.pending.len(),
        crate::schema_support::versions_after(0).len(),
        "{before:?}"
    );
    assert!(before.problem().unwrap().contains("tombstoned migrate"));

    let first = migrations::migrate(&config.database).await.unwrap();
    assert_eq!(
        first.iter().map(|m| m.version).collect::<Vec<_>>(),
        crate::schema_support::versions_after(0)
    );
    let second = migrations::migrate(&config.database).await.unwrap();
    assert!(second.is_empty(), "second run applied {second:?}");

    let after = migrations::status(&Conn::dedicated(&client, "tombstoned", Pooler::None), None)
        .await
        .unwrap();
    assert!(after.is_current(), "{after:?}");
    assert_eq!(
        after.applied.len(),
        crate::schema_support::versions_after(0).len()
    );
}

#[tokio::test]
async fn concurrent_migrate_runs_are_serialised() {
    let db = TestDb::empty().await;
    let config = db.config();
    // The test holds migrate's advisory lock until all four runs wait for it, so they really
    // run at once when it lets go.
    let holder = db.client().await;
    holder
        .execute(
            tombstoned::db::sql::ADVISORY_LOCK,
            &[&format!("tombstoned:migrate:{}", config.database.schema)],
        )
        .await
        .unwrap();
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let database = config.database.clone();
            tokio::spawn(async move { migrations::migrate(&database).await })
        })
        .collect();
    wait_until_sessions_wait(&db.client().await, "tombstoned/migrate", 4).await;
    drop(holder);
    let mut applied = 0;
    for run in runs {
        applied += run
            .await
            .unwrap()
            .expect("every concurrent run succeeds")
            .len();
    }
    let all = crate::schema_support::versions_after(0).len();
    assert_eq!(
        applied, all,
        "every migration is applied by exactly one run"
    );
    let client = db.client().await;
    let rows: i64 = client
        .query_one("SELECT count(*) FROM tombstoned.schema_history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, all as i64);
}

#[tokio::test]
async fn migrate_honours_the_configured_schema() {
    let db = TestDb::empty().await;
    let config = db.config_with(&[("TOMBSTONED_DATABASE__SCHEMA", "idem_custom")]);
    migrations::migrate(&config.database).await.unwrap();
    let client = db.client().await;
    let tables: Vec<String> = client
        .query(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = 'idem_custom' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        tables,
        [
            "cleanup_lease",
            "cleanup_runs",
            "idempotency_cards",
            "idempotency_records",
            "idempotency_scopes",
            "operation_grant_changes",
            "operation_grants",
            "orders",
            "outbox_aggregates",
            "outbox_events",
            "schema_history"
        ]
    );
    let public: i64 = client
        .query_one(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(public, 0, "nothing lands in public");
}

#[tokio::test]
async fn tables_have_the_documented_columns() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let columns: Vec<(String, String, String, String)> = client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text \
             FROM information_schema.columns WHERE table_schema = 'tombstoned' \
             AND table_name <> 'schema_history' ORDER BY table_name, ordinal_position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let expected = [
        // V3: the cleanup lease and the run history.
        ("cleanup_lease", "name", "text", "NO"),
        ("cleanup_lease", "holder", "text", "NO"),
        ("cleanup_lease", "holder_pid", "integer", "YES"),
        ("cleanup_lease", "holder_application_name", "text", "YES"),
        (
            "cleanup_lease",
            "acquired_at",
            "timestamp with time zone",
            "NO",
        ),
        (
            "cleanup_lease",
            "renewed_at",
            "timestamp with time zone",
            "NO",
        ),
        (
            "cleanup_lease",
            "expires_at",
            "timestamp with time zone",
            "NO",
        ),
        ("cleanup_runs", "run_id", "bigint", "NO"),
        ("cleanup_runs", "instance", "text", "NO"),
        (
            "cleanup_runs",
            "started_at",
            "timestamp with time zone",
            "NO",
        ),
        (
            "cleanup_runs",
            "finished_at",
            "timestamp with time zone",
            "NO",
        ),
        ("cleanup_runs", "outcome", "text", "NO"),
        ("cleanup_runs", "stopped_by", "text", "YES"),
        ("cleanup_runs", "rows_tombstoned", "bigint", "NO"),
        ("cleanup_runs", "tombstones_purged", "bigint", "NO"),
        ("cleanup_runs", "outbox_events_deleted", "bigint", "NO"),
        ("cleanup_runs", "lock_timeouts", "bigint", "NO"),
        ("cleanup_runs", "rows_skipped", "bigint", "NO"),
        ("cleanup_runs", "batches", "bigint", "NO"),
        ("cleanup_runs", "backlog_rows", "bigint", "YES"),
        ("cleanup_runs", "error", "text", "YES"),
        // V5: the view for humans, the columns V1-V4 had (then the scope id).
        ("idempotency_cards", "tenant_id", "text", "YES"),
        ("idempotency_cards", "principal_id", "text", "YES"),
        ("idempotency_cards", "operation", "text", "YES"),
        ("idempotency_cards", "idempotency_key", "text", "YES"),
        ("idempotency_cards", "fingerprint", "bytea", "YES"),
        ("idempotency_cards", "status_code", "smallint", "YES"),
        ("idempotency_cards", "response_body", "jsonb", "YES"),
        ("idempotency_cards", "order_id", "uuid", "YES"),
        ("idempotency_cards", "expired", "boolean", "YES"),
        (
            "idempotency_cards",
            "created_at",
            "timestamp with time zone",
            "YES",
        ),
        (
            "idempotency_cards",
            "replay_deadline",
            "timestamp with time zone",
            "YES",
        ),
        (
            "idempotency_cards",
            "expired_at",
            "timestamp with time zone",
            "YES",
        ),
        ("idempotency_cards", "resource_id", "text", "YES"),
        ("idempotency_cards", "scope_id", "integer", "YES"),
        // V5: the compact card, in storage (alignment) order.
        (
            "idempotency_records",
            "replay_deadline",
            "timestamp with time zone",
            "NO",
        ),
        (
            "idempotency_records",
            "created_at",
            "timestamp with time zone",
            "NO",
        ),
        (
            "idempotency_records",
            "expired_at",
            "timestamp with time zone",
            "YES",
        ),
        ("idempotency_records", "order_id", "uuid", "YES"),
        ("idempotency_records", "scope_id", "integer", "NO"),
        ("idempotency_records", "status_code", "smallint", "YES"),
        ("idempotency_records", "expired", "boolean", "NO"),
        ("idempotency_records", "idempotency_key", "text", "NO"),
        ("idempotency_records", "fingerprint", "bytea", "NO"),
        ("idempotency_records", "resource_id", "text", "YES"),
        ("idempotency_records", "response_body", "jsonb", "YES"),
        // V5: the scopes records name by id.
        ("idempotency_scopes", "scope_id", "integer", "NO"),
        ("idempotency_scopes", "tenant_id", "text", "NO"),
        ("idempotency_scopes", "principal_id", "text", "NO"),
        ("idempotency_scopes", "operation", "text", "NO"),
        // V8.
        ("operation_grant_changes", "change_id", "bigint", "NO"),
        (
            "operation_grant_changes",
            "changed_at",
            "timestamp with time zone",
            "NO",
        ),
        ("operation_grant_changes", "changed_by", "text", "NO"),
        ("operation_grant_changes", "action", "text", "NO"),
        ("operation_grant_changes", "operation", "text", "YES"),
        ("operation_grant_changes", "grantee", "text", "NO"),
        ("operation_grant_changes", "forced", "boolean", "NO"),
        ("operation_grant_changes", "note", "text", "YES"),
        ("operation_grants", "operation", "text", "YES"),
        ("operation_grants", "grantee", "regrole", "NO"),
        (
            "operation_grants",
            "granted_at",
            "timestamp with time zone",
            "NO",
        ),
        ("operation_grants", "granted_by", "text", "NO"),
        ("operation_grants", "forced", "boolean", "NO"),
        ("operation_grants", "note", "text", "YES"),
        ("orders", "order_id", "uuid", "NO"),
        ("orders", "tenant_id", "text", "NO"),
        ("orders", "principal_id", "text", "NO"),
        ("orders", "request_id", "text", "NO"),
        ("orders", "amount_minor", "bigint", "NO"),
        ("orders", "currency", "character", "NO"),
        ("orders", "item", "text", "NO"),
        ("orders", "quantity", "integer", "NO"),
        ("orders", "recipient", "text", "NO"),
        ("orders", "status", "text", "NO"),
        ("orders", "created_at", "timestamp with time zone", "NO"),
        // V4: sequence counters of enqueue_event's aggregates.
        ("outbox_aggregates", "tenant_id", "text", "NO"),
        ("outbox_aggregates", "aggregate_id", "text", "NO"),
        ("outbox_aggregates", "last_sequence", "integer", "NO"),
        ("outbox_events", "event_id", "uuid", "NO"),
        ("outbox_events", "tenant_id", "text", "NO"),
        // Nullable since V4: an event names an order or an aggregate.
        ("outbox_events", "order_id", "uuid", "YES"),
        ("outbox_events", "event_type", "text", "NO"),
        ("outbox_events", "payload", "jsonb", "NO"),
        (
            "outbox_events",
            "created_at",
            "timestamp with time zone",
            "NO",
        ),
        (
            "outbox_events",
            "published_at",
            "timestamp with time zone",
            "YES",
        ),
        // V2: the relay's columns.
        ("outbox_events", "sequence", "integer", "NO"),
        ("outbox_events", "attempts", "integer", "NO"),
        (
            "outbox_events",
            "next_attempt_at",
            "timestamp with time zone",
            "NO",
        ),
        (
            "outbox_events",
            "locked_until",
            "timestamp with time zone",
            "YES",
        ),
        ("outbox_events", "locked_by", "text", "YES"),
        (
            "outbox_events",
            "last_attempt_at",
            "timestamp with time zone",
            "YES",
        ),
        ("outbox_events", "last_status", "smallint", "YES"),
        ("outbox_events", "last_error", "text", "YES"),
        (
            "outbox_events",
            "dead_lettered_at",
            "timestamp with time zone",
            "YES",
        ),
        // V4.
        ("outbox_events", "aggregate_id", "text", "YES"),
        // V8.
        ("outbox_events", "sender", "text", "YES"),
    ];
    let expected: Vec<(String, String, String, String)> = expected
        .iter()
        .map(|(a, b, c, d)| (a.to_string(), b.to_string(), c.to_string(), d.to_string()))
        .collect();
    assert_eq!(columns, expected);

    let pk: String = client
        .query_one(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conname = 'idempotency_records_pkey'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pk, "PRIMARY KEY (scope_id, idempotency_key)");
}

const INSERT_RECORD: &str = "INSERT INTO idempotency_records \
     (scope_id, idempotency_key, fingerprint, replay_deadline) \
     VALUES (ensure_scope('t', 'p', 'create-order'), $1, $2, now() + interval '1 day')";

const INSERT_ORDER: &str = "INSERT INTO orders \
     (order_id, tenant_id, principal_id, request_id, amount_minor, currency, item, quantity, recipient) \
     VALUES (gen_random_uuid(), 't', $1, $2, 100, 'CNY', 'x', 1, 'r')";

#[tokio::test]
async fn constraints_reject_what_the_protocol_forbids() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let fp = vec![7u8; 32];

    client
        .execute(INSERT_RECORD, &[&"k".repeat(255), &fp])
        .await
        .unwrap();
    let too_long = client
        .execute(INSERT_RECORD, &[&"k".repeat(256), &fp])
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), Some(&SqlState::CHECK_VIOLATION));
    let empty = client
        .execute(INSERT_RECORD, &[&"", &fp])
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Some(&SqlState::CHECK_VIOLATION));
    let short_fp = client
        .execute(INSERT_RECORD, &[&"k31", &vec![7u8; 31]])
        .await
        .unwrap_err();
    assert_eq!(short_fp.code(), Some(&SqlState::CHECK_VIOLATION));
    let same_key = client
        .execute(INSERT_RECORD, &[&"k".repeat(255), &fp])
        .await
        .unwrap_err();
    assert_eq!(same_key.code(), Some(&SqlState::UNIQUE_VIOLATION));

    client
        .execute(INSERT_ORDER, &[&"p1", &"req-1"])
        .await
        .unwrap();
    let dup = client
        .execute(INSERT_ORDER, &[&"p2", &"req-1"])
        .await
        .unwrap_err();
    assert_eq!(dup.code(), Some(&SqlState::UNIQUE_VIOLATION));
    assert_eq!(
        tombstoned::db::violated_constraint(&dup),
        Some("orders_tenant_request_key")
    );

    // A tombstone never carries a body.
    let body_on_tombstone = client
        .execute(
            "UPDATE idempotency_records SET expired = true, expired_at = now()",
            &[],
        )
        .await;
    assert!(body_on_tombstone.is_ok(), "bodies are NULL here");
    let err = client
        .execute(
            "UPDATE idempotency_records SET response_body = '{}'::jsonb",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::CHECK_VIOLATION));
}

/// `serve` refuses to start while migrations are pending, and every other command that needs the
/// schema answers the same: exit 69 and one line naming the pending migrations, not 70 and the
/// first statement's 42P01 (the cleanup timer can fire before `migrate` ran; issue 27 item 2).
#[tokio::test]
async fn every_command_needing_the_schema_refuses_pending_migrations_with_69() {
    let db = TestDb::empty().await;
    let secret = crate::outbox_support::secret_file();
    let secret_file = secret.1.display().to_string();
    let commands: &[&[&str]] = &[
        &["serve"],
        &["status"],
        &["cleanup"],
        &["cleanup", "--json"],
        &["cleanup", "--dry-run"],
        &["cleanup", "--dry-run", "--json"],
        &["outbox", "deliver"],
        &["outbox", "deliver", "--dry-run"],
        &["outbox", "list"],
        &["outbox", "list", "--dead-letters", "--json"],
        &["outbox", "requeue", "--all-dead-letters"],
        &[
            "outbox",
            "requeue",
            "--event",
            "01a23a59-d631-7782-8794-18478aec6c70",
        ],
    ];
    for args in commands {
        let url = db.url.clone();
        let secret_file = secret_file.clone();
        let output = tokio::task::spawn_blocking(move || {
            Command::new(binary())
                .args(*args)
                .env_clear()
                .env("TOMBSTONED_DATABASE_URL", &url)
                .env("TOMBSTONED_API__ENABLED", "false")
                .env("TOMBSTONED_OUTBOX__ENDPOINT", "http://127.0.0.1:1/in")
                .env("TOMBSTONED_OUTBOX__SECRET_FILE", &secret_file)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(69), "{args:?}: {stderr}");
        assert_eq!(
            stderr.trim().lines().count(),
            1,
            "{args:?}: one line: {stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "{} migration(s) pending (V1__",
                crate::schema_support::versions_after(0).len()
            )) && stderr.contains("run `tombstoned migrate` first"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("42P01"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    // Nothing was created on the way.
    let tables: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'tombstoned'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, 0);
}

#[tokio::test]
async fn migrate_status_lists_applied_and_pending() {
    let db = TestDb::empty().await;
    let url = db.url.clone();
    let run = move |args: &'static [&'static str]| {
        let url = url.clone();
        move || {
            Command::new(binary())
                .args(args)
                .env_clear()
                .env("TOMBSTONED_DATABASE_URL", &url)
                .output()
                .unwrap()
        }
    };
    let pending = tokio::task::spawn_blocking(run(&["migrate", "--status"]))
        .await
        .unwrap();
    assert!(pending.status.success());
    let out = String::from_utf8_lossy(&pending.stdout);
    assert!(out.contains("pending   V1__initial_schema"), "{out}");

    let applied = tokio::task::spawn_blocking(run(&["migrate"]))
        .await
        .unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert!(String::from_utf8_lossy(&applied.stdout).contains("applied V1__initial_schema"));

    let again = tokio::task::spawn_blocking(run(&["migrate"]))
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&again.stdout).contains("already current"));

    let status = tokio::task::spawn_blocking(run(&["migrate", "--status"]))
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&status.stdout);
    assert!(out.contains("applied   V1__initial_schema"), "{out}");
    assert!(out.contains("is current"), "{out}");
}

#[tokio::test]
async fn exit_codes_are_the_documented_ones() {
    let unreachable = tokio::task::spawn_blocking(|| {
        // Port 1 on loopback: nothing listens there.
        Command::new(binary())
            .args(["migrate", "--status"])
            .env_clear()
            .env(
                "TOMBSTONED_DATABASE_URL",
                "postgresql://nobody@127.0.0.1:1/none",
            )
            .env("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "2s")
            .output()
            .unwrap()
    });
    let bad_config = tokio::task::spawn_blocking(|| {
        Command::new(binary())
            .arg("check-config")
            .env_clear()
            .env("TOMBSTONED_CLEANUP__SCHEDULE", "every tuesday")
            .output()
            .unwrap()
    });
    let bad_usage =
        tokio::task::spawn_blocking(|| Command::new(binary()).arg("frobnicate").output().unwrap());
    let unreachable = tokio::time::timeout(Duration::from_secs(30), unreachable)
        .await
        .unwrap()
        .unwrap();
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert_eq!(unreachable.status.code(), Some(69), "{stderr}");
    assert!(
        stderr.starts_with("tombstoned: error: cannot connect"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );

    let bad_config = bad_config.await.unwrap();
    let stderr = String::from_utf8_lossy(&bad_config.stderr);
    assert_eq!(bad_config.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("cleanup.schedule"), "{stderr}");

    assert_eq!(bad_usage.await.unwrap().status.code(), Some(64));
}

#[tokio::test]
async fn runs_on_the_postgres_major_ci_asked_for() {
    let db = TestDb::new().await;
    let client = db.client().await;
    let version: String = client
        .query_one("SELECT current_setting('server_version_num')", &[])
        .await
        .unwrap()
        .get(0);
    let major = version.parse::<u32>().unwrap() / 10000;
    eprintln!("PostgreSQL server major version {major}");
    if let Ok(expected) = std::env::var("TOMBSTONED_EXPECT_PG_MAJOR") {
        assert_eq!(major.to_string(), expected, "TOMBSTONED_EXPECT_PG_MAJOR");
    }
}

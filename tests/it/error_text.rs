//! Error texts shown to whoever can read `/readyz`, systemd's STATUS line, the logs or the CLI:
//! a real server error appears as severity, SQLSTATE and message, never with its DETAIL or HINT
//! (which can quote keys and request fields).

use std::sync::Arc;

use tombstoned::db::{self, error_text, DbError};
use tombstoned::metrics::Metrics;
use tombstoned::ops::listener::OpsState;

use crate::cleanup_support::{seed_live, DUE};
use crate::daemon_support::{until_ready, Daemon, NotifySocket, Spec, PATIENCE};
use crate::harness::{config_for, TestDb};
use crate::ops_support::{fresh_probe, get, RunningOps};

/// A plpgsql function `name()` returning `returns` that raises P0001 with `message`, a DETAIL
/// quoting a key and a HINT.
fn raising_function(name: &str, returns: &str, message: &str) -> String {
    format!(
        "CREATE FUNCTION {name}() RETURNS {returns} LANGUAGE plpgsql AS $$
         BEGIN
             RAISE EXCEPTION '{message}'
                 USING DETAIL = 'Key (idempotency_key)=(secret-detail-key)',
                       HINT = 'secret-hint';
         END $$;"
    )
}

#[tokio::test]
async fn error_text_keeps_severity_sqlstate_and_message_of_real_server_errors() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(&format!(
            "CREATE TABLE keys_seen (k text PRIMARY KEY);
             INSERT INTO keys_seen VALUES ('secret-key-abc');
             {}",
            raising_function("refuse", "void", "refused on purpose")
        ))
        .await
        .unwrap();

    // 23505: the server's DETAIL quotes the key.
    let duplicate = client
        .execute("INSERT INTO keys_seen VALUES ('secret-key-abc')", &[])
        .await
        .unwrap_err();
    let detail = duplicate.as_db_error().unwrap().detail().unwrap();
    assert!(detail.contains("secret-key-abc"), "{detail}");
    let wrapped = anyhow::Error::new(DbError::Query(duplicate)).context("storing a key");
    assert_eq!(
        error_text(wrapped.as_ref()),
        "storing a key: database error: ERROR 23505: duplicate key value violates unique \
         constraint \"keys_seen_pkey\""
    );

    // A raise with DETAIL, HINT and a PL/pgSQL CONTEXT.
    let raised = client.execute("SELECT refuse()", &[]).await.unwrap_err();
    assert!(raised.as_db_error().unwrap().where_().is_some());
    assert_eq!(
        error_text(&DbError::Query(raised)),
        "database error: ERROR P0001: refused on purpose"
    );

    // A connection that fails names the host it tried, never the password.
    let config = config_for(
        "postgresql://someone:s3cret-password@127.0.0.1:1/nothing",
        &[("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "2s")],
    );
    let Err(refused) = db::connect(&config.database, "test").await else {
        panic!("nothing listens on port 1");
    };
    let text = error_text(&refused);
    assert!(
        text.starts_with("cannot connect to PostgreSQL: 127.0.0.1:1: "),
        "{text}"
    );
    assert!(!text.contains("s3cret"), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
}

#[tokio::test]
async fn readyz_shows_a_server_error_without_its_detail() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // The readiness check reads the migration history: make that read fail in the server.
    client
        .batch_execute(&format!(
            "ALTER TABLE schema_history RENAME TO schema_history_kept;
             {}
             CREATE VIEW schema_history AS SELECT * FROM history_refused();",
            raising_function(
                "history_refused",
                "SETOF schema_history_kept",
                "history unreadable"
            )
        ))
        .await
        .unwrap();
    let config = db.config();
    let ops = RunningOps::start(OpsState::new(
        Arc::new(Metrics::new().unwrap()),
        fresh_probe(&config.database),
    ))
    .await;
    let (status, _, body) = get(&ops.url("/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.starts_with("not ready: database check failed: "),
        "{body}"
    );
    assert!(
        body.contains("P0001") && body.contains("history unreadable"),
        "{body}"
    );
    assert!(!body.contains("secret"), "{body}");
    assert_eq!(body.lines().count(), 1, "{body:?}");
    ops.stop().await.unwrap();
}

#[tokio::test]
async fn the_systemd_status_line_shows_a_failed_run_without_the_server_detail() {
    let db = TestDb::new().await;
    let client = db.client().await;
    seed_live(&client, "status", 3, DUE).await;
    client
        .batch_execute(&format!(
            "{}
             CREATE TRIGGER refuse_tombstoning BEFORE UPDATE ON idempotency_records
                 FOR EACH ROW EXECUTE FUNCTION refuse_tombstoning();",
            raising_function("refuse_tombstoning", "trigger", "tombstoning refused")
        ))
        .await
        .unwrap();
    let notify = NotifySocket::bind();
    let (name, path) = notify.env();
    let mut daemon = Daemon::spawn(
        Spec::new(&db.url)
            .config("[cleanup]\nschedule = \"* * * * * *\"")
            .env(name, path),
    )
    .await;
    until_ready(&mut daemon, &notify).await;
    let failed = notify
        .until(PATIENCE, |m| {
            m.value("STATUS")
                .is_some_and(|s| s.contains("failed: ") && s.contains("tombstoning refused"))
        })
        .await;
    let status = failed.last().unwrap().value("STATUS").unwrap().to_owned();
    assert!(status.contains("P0001"), "{status}");
    assert!(!status.contains("secret"), "{status}");
    // The log carries the failure without the DETAIL too.
    let log = daemon.log();
    assert!(log.contains("tombstoning refused"), "{log}");
    assert!(!log.contains("secret"), "{log}");
}

//! What `db::pipeline` reports when the commit itself fails. A statement sent alone is its own
//! implicit transaction, which the server commits at the statement's Sync, after the statement's
//! rows and CommandComplete; the claim through a transaction pooler is sent that way. An error
//! raised by that commit must reach the caller: a future that ended at CommandComplete would
//! report success for a transaction the server rolled back (tokio-postgres reads every statement
//! to its ReadyForQuery; these tests hold any later version to that). A deferred constraint is a
//! commit that fails on demand.

use std::time::Duration;

use tombstoned::db::pipeline;
use tombstoned::db::{Conn, Pooler, SessionSettings};

use crate::harness::TestDb;

/// Two rows the deferred unique constraint lets in until the transaction commits.
const INSERT_TWICE: &str = "INSERT INTO pipeline_t (x) VALUES ($1), ($1) RETURNING x";
const INSERT_ONCE: &str = "INSERT INTO pipeline_t (x) VALUES ($1) RETURNING x";
/// [`INSERT_TWICE`] naming the schema, for a pooled session (which has no `search_path` of ours).
const INSERT_TWICE_IN_SCHEMA: &str =
    "INSERT INTO {schema}.pipeline_t (x) VALUES ($1), ($1) RETURNING x";

const SETTINGS: &str = "SELECT set_config('lock_timeout', $1, true)";

async fn table(db: &TestDb) -> tokio_postgres::Client {
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE pipeline_t (x int CONSTRAINT pipeline_t_x UNIQUE \
             DEFERRABLE INITIALLY DEFERRED)",
        )
        .await
        .unwrap();
    client
}

/// The deferred constraint's error, reported as sent (the commit had gone out), and nothing of the
/// transaction in the table.
async fn rolled_back_at_commit(
    failure: pipeline::PipelineFailure,
    client: &tokio_postgres::Client,
    pooler: Pooler,
) {
    assert_eq!(
        failure.error.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
        "{:?}",
        failure.error
    );
    assert!(failure.sent, "sent: it is the commit that failed");
    let rows: i64 = client
        .query_one("SELECT count(*) FROM pipeline_t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "rolled back whole ({pooler:?})");
}

#[tokio::test]
async fn a_statement_alone_reports_the_error_of_its_implicit_commit() {
    let db = TestDb::new().await;
    let client = table(&db).await;
    for pooler in [Pooler::None, Pooler::Transaction] {
        let conn = Conn::dedicated(&client, "tombstoned", pooler);
        // The statement itself succeeds and returns both rows; only the commit at its Sync fails.
        let failure = pipeline::alone(&conn, INSERT_TWICE, &[&7_i32])
            .await
            .expect_err("the implicit commit fails on the deferred constraint");
        rolled_back_at_commit(failure, &client, pooler).await;
        // The session is usable again (idle, not in a failed transaction).
        let ok = pipeline::alone(&conn, INSERT_ONCE, &[&8_i32])
            .await
            .unwrap();
        assert_eq!(ok.len(), 1);
        client.batch_execute("TRUNCATE pipeline_t").await.unwrap();
    }
}

#[tokio::test]
async fn a_pipelined_transaction_reports_the_error_of_its_commit() {
    let db = TestDb::new().await;
    let client = table(&db).await;
    for pooler in [Pooler::None, Pooler::Transaction] {
        let conn = Conn::dedicated(&client, "tombstoned", pooler);
        let failure = pipeline::query(&conn, SETTINGS, &[&"1s"], INSERT_TWICE, &[&7_i32])
            .await
            .expect_err("the COMMIT fails on the deferred constraint");
        rolled_back_at_commit(failure, &client, pooler).await;
    }
}

/// The claim's shape on a direct connection: the statement alone on a pooled session that carries
/// READ COMMITTED and the lock timeout (`pipeline::in_session`). Its implicit commit's error is
/// the answer, and the session carries the settings before and after; a dedicated session, which
/// carries nothing, runs the pipelined transaction instead, whose COMMIT reports it.
#[tokio::test]
async fn a_statement_in_a_session_carrying_its_settings_reports_the_error_of_its_implicit_commit() {
    let db = TestDb::new().await;
    let client = table(&db).await;
    let config = db.config();
    let pool = tombstoned::db::pool(&config.database, "api", 1, Duration::from_secs(10)).unwrap();
    let session = pool.get().await.unwrap();
    let settings = SessionSettings {
        lock_timeout: Duration::from_millis(1234),
    };
    let conn = Conn::pooled(&session, "tombstoned", Pooler::None);
    let failure = pipeline::in_session(&conn, settings, INSERT_TWICE_IN_SCHEMA, &[&7_i32])
        .await
        .expect_err("the implicit commit fails on the deferred constraint");
    rolled_back_at_commit(failure, &client, Pooler::None).await;
    assert_eq!(session.carried(), Some(settings));
    let shown: String = session
        .query_one("SHOW lock_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shown, "1234ms");

    let conn = Conn::dedicated(&client, "tombstoned", Pooler::None);
    let failure = pipeline::in_session(&conn, settings, INSERT_TWICE_IN_SCHEMA, &[&7_i32])
        .await
        .expect_err("the COMMIT fails on the deferred constraint");
    rolled_back_at_commit(failure, &client, Pooler::None).await;
    let shown: String = client
        .query_one("SHOW lock_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(shown, "0", "transaction-local on a dedicated session");
}

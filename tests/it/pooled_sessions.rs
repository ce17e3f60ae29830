//! The API's pooled sessions keep the statements prepared on them (`db::pooled`): each text is
//! prepared once per session with its parameter types and found again on every later use —
//! by its address, or by its content for a copy of the text elsewhere in memory — across
//! checkouts of the session; through a transaction pooler nothing is prepared at all.

use std::time::Duration;

use tokio_postgres::types::Type;
use tombstoned::db::{Conn, Object, Pooler};

use crate::harness::TestDb;

const TEXT: &str = "SELECT $1::int8 + 1";

/// How many named statements with `text` the session holds on the server.
async fn prepared_on(session: &Object, text: &str) -> i64 {
    session
        .query_one(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
            &[&text],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn each_text_and_types_is_prepared_once_per_session_and_kept_across_checkouts() {
    let db = TestDb::new().await;
    let config = db.config();
    let schema = config.database.schema.clone();
    // One session, so every checkout is the same one.
    let pool = tombstoned::db::pool(&config.database, "api", 1, Duration::from_secs(10)).unwrap();

    let session = pool.get().await.unwrap();
    let conn = Conn::pooled(&session, &schema, Pooler::None);
    for _ in 0..3 {
        let ready = conn.ready(TEXT, &[Type::INT8]).await.unwrap();
        assert!(ready.is_named());
    }
    assert_eq!(prepared_on(&session, TEXT).await, 1);
    assert_eq!(session.prepared().len(), 1);

    // The same text at another address: found by its content.
    let copy: &'static str = Box::leak(TEXT.to_owned().into_boxed_str());
    assert!(!std::ptr::eq(copy, TEXT));
    conn.ready(copy, &[Type::INT8]).await.unwrap();
    assert_eq!(prepared_on(&session, TEXT).await, 1);

    // Other parameter types: another statement.
    conn.ready(TEXT, &[Type::INT4]).await.unwrap();
    assert_eq!(prepared_on(&session, TEXT).await, 2);
    drop(session);

    // Back in the pool and out again: the statements are kept with the session.
    let session = pool.get().await.unwrap();
    let conn = Conn::pooled(&session, &schema, Pooler::None);
    let ready = conn.ready(TEXT, &[Type::INT8]).await.unwrap();
    assert!(ready.is_named());
    assert_eq!(prepared_on(&session, TEXT).await, 2);
    assert_eq!(session.prepared().len(), 2);
}

#[tokio::test]
async fn through_a_transaction_pooler_nothing_is_prepared() {
    let db = TestDb::new().await;
    let config = db.config();
    let pool = tombstoned::db::pool(&config.database, "api", 1, Duration::from_secs(10)).unwrap();
    let session = pool.get().await.unwrap();
    let conn = Conn::pooled(&session, &config.database.schema, Pooler::Transaction);
    let ready = conn.ready(TEXT, &[Type::INT8]).await.unwrap();
    assert!(!ready.is_named());
    assert_eq!(prepared_on(&session, TEXT).await, 0);
    assert!(session.prepared().is_empty());
}

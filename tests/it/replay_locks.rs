//! Replays and the cleaner's row locks: a replay share-locks a record only while its replay
//! window is open, so a replay of a record past its window never waits for a cleanup batch that
//! holds it (BENCHMARKS.md, scenario 3), and still refuses key reuse.

use std::time::Duration;

use tombstoned::cleanup::sql;
use tombstoned::db::sql::qualify;

use crate::api_support::{order, TestApi, ALICE};

/// A cleanup batch holding the due `key-1`: the cleaner's own statement
/// ([`sql::TOMBSTONE_BATCH`], cutoff the database clock), its transaction left open.
async fn hold_in_a_cleanup_batch(api: &TestApi) -> tokio_postgres::Client {
    let holder = api.db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    let cutoff: chrono::DateTime<chrono::Utc> =
        holder.query_one(sql::CUTOFF, &[]).await.unwrap().get(0);
    let no_cursor: Option<chrono::DateTime<chrono::Utc>> = None;
    let row = holder
        .query_one(
            qualify(sql::TOMBSTONE_BATCH, "tombstoned"),
            &[&cutoff, &no_cursor, &cutoff, &100i64],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>("changed"), 1, "the batch holds key-1");
    holder
}

/// A writer holding `key-1` inside its replay window (no cleanup batch ever does: it takes only
/// due rows): its row lock, uncommitted.
async fn hold_as_a_writer(api: &TestApi) -> tokio_postgres::Client {
    let holder = api.db.client().await;
    holder.batch_execute("BEGIN").await.unwrap();
    let n = holder
        .execute(
            "SELECT 1 FROM idempotency_records WHERE idempotency_key = 'key-1'
             FOR NO KEY UPDATE",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    holder
}

async fn close_the_window(api: &TestApi) {
    api.db
        .client()
        .await
        .execute(
            "UPDATE idempotency_records SET replay_deadline = now() - interval '1 second'",
            &[],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_replay_past_its_window_answers_410_while_a_cleanup_batch_holds_the_record() {
    // A replay that waited for the holder would wait 60 s and then answer 409.
    let api = TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "60s")]).await;
    let first = api.post(ALICE, "key-1", &order("req-1")).await;
    first.expect(201);
    close_the_window(&api).await;
    let holder = hold_in_a_cleanup_batch(&api).await;

    let replay = tokio::time::timeout(
        Duration::from_secs(20),
        api.post(ALICE, "key-1", &order("req-1")),
    )
    .await
    .expect("the replay waited for the batch's row lock");
    replay.expect(410);
    assert_eq!(replay.problem(), "replay-window-expired");
    assert_eq!(
        replay.json()["order_id"],
        first.json()["order_id"],
        "the order the key created"
    );
    // Key reuse is refused the same way, without waiting either.
    let mut other = order("req-1");
    other["quantity"] = 7.into();
    let reused = tokio::time::timeout(Duration::from_secs(20), api.post(ALICE, "key-1", &other))
        .await
        .expect("the key-reuse check waited for the batch's row lock");
    reused.expect(422);
    assert_eq!(reused.problem(), "idempotency-key-reused");

    // The holder was never disturbed: its batch commits, and the answer stays 410.
    holder.batch_execute("COMMIT").await.unwrap();
    api.post(ALICE, "key-1", &order("req-1")).await.expect(410);
    assert_eq!(api.counts().await, (1, 1, 1), "never re-executed");
}

#[tokio::test]
async fn a_replay_inside_its_window_still_waits_for_a_writer_holding_the_record() {
    // The counterpart: inside the window the replay share-locks the record, so a conflicting
    // writer makes it wait (here past the claim lock timeout: 409, outcome pending).
    let api = TestApi::start_with(&[("TOMBSTONED_API__CLAIM_LOCK_TIMEOUT", "300ms")]).await;
    api.post(ALICE, "key-1", &order("req-1")).await.expect(201);
    let holder = hold_as_a_writer(&api).await;
    let r = api.post(ALICE, "key-1", &order("req-1")).await;
    r.expect(409);
    assert_eq!(r.problem(), "request-in-progress");
    holder.batch_execute("ROLLBACK").await.unwrap();
    let replay = api.post(ALICE, "key-1", &order("req-1")).await;
    replay.expect(201);
    assert!(replay.replayed());
}

//! The readiness probe's short cache never outlives its own session: once the connection the
//! last "ready" came from is gone, the next check asks the database again.

use std::time::{Duration, Instant};

use tombstoned::ops::readiness::{Readiness, ReadinessProbe};

use crate::harness::TestDb;

#[tokio::test]
async fn a_cached_ready_is_not_trusted_once_the_probe_session_is_lost() {
    let db = TestDb::new().await;
    let config = db.config();
    // A cache far longer than the test: only a lost session can end it early.
    let probe = ReadinessProbe::new(config.database.clone()).with_max_age(Duration::from_secs(600));
    assert_eq!(probe.check().await, Readiness::Ready);

    // The schema changes under it (a newer binary migrated further) and its session is killed,
    // as a server restart would.
    let observer = db.client().await;
    observer
        .execute(
            "INSERT INTO schema_history (version, name, applied_on, checksum) \
             VALUES (999, 'from_the_future', '2030-01-01T00:00:00Z', '1')",
            &[],
        )
        .await
        .unwrap();
    let terminated: i64 = observer
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = 'tombstoned/readiness' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(terminated, 1);

    // The client notices the closed connection asynchronously; then the cached answer goes.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match probe.check().await {
            Readiness::NotReady(reason) => {
                assert!(
                    reason.to_string().contains("V999__from_the_future"),
                    "{reason}"
                );
                break;
            }
            Readiness::Ready => {
                assert!(
                    Instant::now() < deadline,
                    "the cached ready outlived its session"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

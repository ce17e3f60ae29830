//! The testkit's streaming standbys work on this PostgreSQL (the failover and replica tests in
//! tests/reliability build on them): a synchronous standby sees a committed row as soon as the
//! commit returns, paused replay holds rows back until resumed, and after the primary dies
//! (`-m immediate`) the promoted standby accepts writes. An asynchronous standby streams too.

use std::time::Duration;

use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned_testkit::cluster::ClusterOptionsTestExt as _;
use tombstoned_testkit::standby::{self, Replication, Standby, StandbyOptions};

async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

async fn count(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM smoke", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_replays_pauses_and_is_promoted() {
    let options = ClusterOptions::for_tests().set("synchronous_commit", "on");
    let primary = {
        let options = options.clone();
        tokio::task::spawn_blocking(move || ThrowawayCluster::start(&options).unwrap())
            .await
            .unwrap()
    };
    let p = connect(&primary.url("postgres")).await;
    p.batch_execute("CREATE TABLE smoke (id int PRIMARY KEY)")
        .await
        .unwrap();
    let standby = Standby::start(
        &primary,
        &StandbyOptions::new(Replication::Synchronous).settings(options),
    )
    .await
    .unwrap();
    let s = connect(&standby.url("postgres")).await;

    // Synchronous: the commit returned, so the standby has it (flushed; replay follows).
    p.execute("INSERT INTO smoke VALUES (1)", &[])
        .await
        .unwrap();
    standby.catch_up(&p, Duration::from_secs(30)).await.unwrap();
    assert_eq!(count(&s).await, 1);

    standby.pause_replay().await.unwrap();
    p.execute("INSERT INTO smoke VALUES (2)", &[])
        .await
        .unwrap();
    // The standby has the insert (received and flushed), so only the pause keeps it from view.
    let lsn = standby::current_wal_lsn(&p).await.unwrap();
    standby
        .wait_for_receipt(&lsn, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        !standby.has_replayed(&lsn).await.unwrap(),
        "replay is paused"
    );
    assert_eq!(count(&s).await, 1, "replay is paused");
    standby.resume_replay().await.unwrap();
    standby.catch_up(&p, Duration::from_secs(30)).await.unwrap();
    assert_eq!(count(&s).await, 2);

    tokio::task::block_in_place(|| standby::stop_immediately(&primary)).unwrap();
    assert!(
        p.execute("SELECT 1", &[]).await.is_err(),
        "the primary is gone"
    );
    standby.promote().await.unwrap();
    let s = connect(&standby.url("postgres")).await;
    s.execute("INSERT INTO smoke VALUES (3)", &[])
        .await
        .unwrap();
    assert_eq!(count(&s).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_standby_streams() {
    let primary = tokio::task::spawn_blocking(|| {
        ThrowawayCluster::start(&ClusterOptions::for_tests()).unwrap()
    })
    .await
    .unwrap();
    let standby = Standby::start(&primary, &StandbyOptions::new(Replication::Asynchronous))
        .await
        .unwrap();
    let p = connect(&primary.url("postgres")).await;
    p.batch_execute("CREATE TABLE smoke AS SELECT generate_series(1, 100) AS id")
        .await
        .unwrap();
    standby.catch_up(&p, Duration::from_secs(30)).await.unwrap();
    assert_eq!(count(&connect(&standby.url("postgres")).await).await, 100);
}

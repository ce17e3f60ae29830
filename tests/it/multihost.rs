//! Multi-host connection strings against real sockets: a closed port, a listener that accepts
//! and never answers, and real servers (one read-only). Each host gets the connect timeout as
//! a whole (the silent one would otherwise hang the connect forever), the pool's wait covers
//! trying every host, and `target_session_attrs` skips a server that does not match.

use std::time::{Duration, Instant};

use tombstoned::db;
use tombstoned::pg_cluster::{free_loopback_port, ClusterOptions};
use tombstoned_testkit::cluster::{ClusterAccess, ClusterOptionsTestExt as _};

use crate::conn_support::{config, run_binary, start_cluster};
use crate::harness::{silent_listener, TestDb};

/// The margin a loaded 2-core machine needs on top of the timeouts.
const MARGIN: Duration = Duration::from_secs(4);

#[tokio::test]
async fn dead_hosts_cost_at_most_connect_timeout_each_and_the_next_host_answers() {
    let db = TestDb::new().await;
    let real_port = db.config().database.url.conninfo().targets()[0].port;
    let closed = free_loopback_port().unwrap();
    let (silent, _held) = silent_listener().await;
    let timeout = [("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "1s")];
    let url = format!(
        "{} host=127.0.0.1,127.0.0.1,127.0.0.1 port={closed},{silent},{real_port}",
        db.url
    );
    let started = Instant::now();
    let connected = db::connector(&config(&url, &timeout).database, "test")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    assert_eq!(connected.server.target.port, real_port);
    assert!(
        took >= Duration::from_secs(1),
        "the silent host was given its second: {took:?}"
    );
    assert!(took < Duration::from_secs(1) + MARGIN, "{took:?}");

    // Only dead hosts: one line naming each failure and the phase the silent one hung in.
    let dead = format!("{} host=127.0.0.1,127.0.0.1 port={closed},{silent}", db.url);
    let e = db::connect(&config(&dead, &timeout).database, "test")
        .await
        .err()
        .expect("no host answers");
    let text = e.to_string();
    assert!(
        text.contains(&format!(
            "no host accepted the connection: 127.0.0.1:{closed}: connection refused; \
             127.0.0.1:{silent}: timed out after 1s during waiting for the server's answer to \
             the SSL request"
        )),
        "{text}"
    );
    let run = run_binary(
        &["migrate", "--status"],
        &dead,
        &[("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "1s")],
    )
    .await;
    assert!(
        run.error_line(69).contains("timed out after 1s"),
        "{}",
        run.stderr
    );

    // sslmode=disable: the silent host hangs in startup instead, and is bounded all the same.
    let plain = format!("{dead} sslmode=disable");
    let started = Instant::now();
    let e = db::connect(&config(&plain, &timeout).database, "test")
        .await
        .err()
        .expect("no host answers");
    assert!(
        e.to_string().contains("during startup and authentication"),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(1) + MARGIN);
}

#[tokio::test]
async fn the_pools_wait_covers_trying_every_host() {
    let db = TestDb::new().await;
    let real_port = db.config().database.url.conninfo().targets()[0].port;
    let (silent_a, _a) = silent_listener().await;
    let (silent_b, _b) = silent_listener().await;
    let url = format!(
        "{} host=127.0.0.1,127.0.0.1,127.0.0.1 port={silent_a},{silent_b},{real_port}",
        db.url
    );
    let config = config(&url, &[("TOMBSTONED_DATABASE__CONNECT_TIMEOUT", "1s")]);
    // A request's wait for a free connection is one connect timeout, as the API pool's is.
    let pool = db::pool(&config.database, "api", 2, Duration::from_secs(1)).unwrap();
    let started = Instant::now();
    let client = pool.get().await.unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    let one: i32 = client.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(took < Duration::from_secs(2) + MARGIN, "{took:?}");
}

#[tokio::test]
async fn target_session_attrs_skips_a_server_that_does_not_match() {
    let read_only = start_cluster(
        ClusterOptions::for_tests().set("default_transaction_read_only", "on"),
        ClusterAccess::default(),
    )
    .await;
    let db = TestDb::new().await;
    let writable = db.config().database.url.conninfo().targets()[0].port;
    let both = |attrs: &str| {
        format!(
            "host=127.0.0.1,127.0.0.1 port={},{writable} user=postgres dbname=postgres \
             target_session_attrs={attrs}",
            read_only.port()
        )
    };
    let port_of = |url: String| async move {
        db::connector(&config(&url, &[]).database, "test")
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"))
            .server
            .target
            .port
    };
    assert_eq!(port_of(both("read-write")).await, writable);
    assert_eq!(
        port_of(both("primary")).await,
        read_only.port(),
        "not in recovery"
    );
    assert_eq!(port_of(both("read-only")).await, read_only.port());
    assert_eq!(port_of(both("any")).await, read_only.port());
    let only_read_only = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres target_session_attrs=read-write",
        read_only.port()
    );
    let run = run_binary(&["migrate", "--status"], &only_read_only, &[]).await;
    let line = run.error_line(69);
    assert!(line.contains("not read-write: read-only"), "{line}");
    // The cleaner's and the API's sessions come through the same connector.
    let pool = db::pool(
        &config(&both("read-write"), &[]).database,
        "api",
        1,
        Duration::from_secs(5),
    )
    .unwrap();
    let client = pool.get().await.unwrap();
    let read_only_setting: String = client
        .query_one("SELECT current_setting('transaction_read_only')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(read_only_setting, "off");
}

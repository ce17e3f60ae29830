//! The connection dies during COMMIT: a TCP proxy between the API's pool and PostgreSQL forwards
//! everything, until, once armed, it sees PostgreSQL's `COMMIT` completion on its way back and
//! cuts the link instead of delivering it. The transaction committed; the API cannot know.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tombstoned::config::DatabaseUrl;

use crate::api_support::{order, TestApi, ALICE};
use crate::harness::TestDb;

struct CuttingProxy {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
}

impl CuttingProxy {
    async fn start(upstream_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (armed2, cuts2) = (Arc::clone(&armed), Arc::clone(&cuts));
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                });
                let (armed, cuts) = (Arc::clone(&armed2), Arc::clone(&cuts2));
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = match server_read.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        let chunk = &buf[..n];
                        // CommandComplete with the tag "COMMIT": the server has committed.
                        if chunk.windows(7).any(|w| w == b"COMMIT\0")
                            && armed.swap(false, Ordering::SeqCst)
                        {
                            cuts.fetch_add(1, Ordering::SeqCst);
                            return; // drops both halves: the client sees the link close
                        }
                        if client_write.write_all(chunk).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { port, armed, cuts }
    }
}

#[tokio::test]
async fn a_connection_lost_during_commit_is_an_honest_outcome_unknown_and_the_retry_replays() {
    let db = TestDb::new().await;
    let pg = db.config();
    let upstream_port = *pg.database.url.pg_config().get_ports().first().unwrap();
    let proxy = CuttingProxy::start(upstream_port).await;
    let proxied_url = db.url.replace(
        &format!("port={upstream_port}"),
        &format!("port={}", proxy.port),
    );
    assert_ne!(proxied_url, db.url);
    let api = TestApi::start_custom(db, &[], |config| {
        config.database.url = DatabaseUrl::parse(&proxied_url).unwrap();
    })
    .await;
    // Through the proxy, unarmed: business as usual (and the statements get prepared).
    api.post(ALICE, "key-warm", &order("req-warm"))
        .await
        .expect(201);

    proxy.armed.store(true, Ordering::SeqCst);
    let lost = api.post(ALICE, "key-x", &order("req-x")).await;
    lost.expect(503);
    assert_eq!(lost.problem(), "outcome-unknown");
    assert!(lost.header("retry-after").is_some());
    let detail = lost.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("Outcome unknown") && detail.contains("same Idempotency-Key"),
        "{detail}"
    );
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1);

    // It did commit: the retry with the same key replays it, and nothing is created twice.
    assert_eq!(api.counts().await, (2, 2, 2));
    let retry = api.post(ALICE, "key-x", &order("req-x")).await;
    retry.expect(201);
    assert!(retry.replayed());
    assert_eq!(retry.json()["request_id"], "req-x");
    assert_eq!(api.counts().await, (2, 2, 2));
    let text = api.metrics_text();
    assert!(
        text.contains("tombstoned_db_errors_total{sqlstate_class=\"connection\"} 1"),
        "{text}"
    );
}

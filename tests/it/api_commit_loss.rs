//! The connection dies during COMMIT, both ways. A TCP proxy between the API's pool and
//! PostgreSQL reads the wire protocol message by message and, once armed, cuts the link at one
//! exact point:
//!
//! * **before the COMMIT reaches the server**: it forwards `BEGIN`, the lock-timeout setting and
//!   the claim statement, then drops the `Bind` of the prepared `COMMIT` and closes both sides.
//!   PostgreSQL ran the claim and rolls it back when it sees the connection gone;
//! * **after the server committed, before the reply**: it forwards everything but drops
//!   PostgreSQL's `CommandComplete("COMMIT")` on its way back, and closes both sides.
//!
//! Either way the API has sent the whole transaction and cannot know which way it went, so the
//! client must get the honest 503 `outcome-unknown`, and its retry with the same key must return
//! the one order — created exactly once, whichever way the commit went.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tombstoned::config::DatabaseUrl;

use crate::api_support::{order, TestApi, ALICE};
use crate::harness::TestDb;

/// Where the armed proxy cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Drop the client's `Bind` of the COMMIT statement and everything after it.
    BeforeCommit,
    /// Drop the server's `CommandComplete` with tag `COMMIT` and everything after it.
    AfterCommit,
}

struct CuttingProxy {
    port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    /// The statements of the cut transaction the server received (before-commit cuts).
    forwarded_in_cut: Arc<Mutex<Vec<String>>>,
}

/// One protocol message: type byte (none for the start-up message) and the whole frame.
struct Message {
    kind: Option<u8>,
    frame: Vec<u8>,
}

impl Message {
    fn payload(&self) -> &[u8] {
        &self.frame[if self.kind.is_some() { 5 } else { 4 }..]
    }
}

/// Reads the next message; the first message a client sends (start-up) has no type byte.
async fn read_message(from: &mut OwnedReadHalf, typed: bool) -> Option<Message> {
    let mut frame = Vec::new();
    let kind = if typed {
        let k = from.read_u8().await.ok()?;
        frame.push(k);
        Some(k)
    } else {
        None
    };
    let len = from.read_u32().await.ok()?;
    frame.extend_from_slice(&len.to_be_bytes());
    let mut rest = vec![0; (len as usize).checked_sub(4)?];
    from.read_exact(&mut rest).await.ok()?;
    frame.extend_from_slice(&rest);
    Some(Message { kind, frame })
}

/// The NUL-terminated strings at the start of a payload.
fn cstrings(payload: &[u8], n: usize) -> Vec<String> {
    payload
        .split(|b| *b == 0)
        .take(n)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

impl CuttingProxy {
    async fn start(upstream_port: u16, cut: Cut) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Self {
            port,
            armed: Arc::new(AtomicBool::new(false)),
            cuts: Arc::new(AtomicUsize::new(0)),
            forwarded_in_cut: Arc::new(Mutex::new(Vec::new())),
        };
        let (armed, cuts, forwarded) = (
            Arc::clone(&proxy.armed),
            Arc::clone(&proxy.cuts),
            Arc::clone(&proxy.forwarded_in_cut),
        );
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                // A cut in either direction ends both tasks, dropping all four halves: both
                // sockets close.
                let link = CancellationToken::new();
                let cutter = Cutter {
                    armed: Arc::clone(&armed),
                    cuts: Arc::clone(&cuts),
                    link: link.clone(),
                };
                tokio::spawn(client_to_server(
                    client_read,
                    server_write,
                    (cut == Cut::BeforeCommit).then(|| cutter.clone()),
                    Arc::clone(&forwarded),
                    link.clone(),
                ));
                tokio::spawn(server_to_client(
                    server_read,
                    client_write,
                    (cut == Cut::AfterCommit).then_some(cutter),
                    link,
                ));
            }
        });
        proxy
    }
}

#[derive(Clone)]
struct Cutter {
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    link: CancellationToken,
}

impl Cutter {
    /// Cuts the link if armed (once).
    fn cut_if_armed(&self) -> bool {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.cuts.fetch_add(1, Ordering::SeqCst);
            self.link.cancel();
            return true;
        }
        false
    }
}

async fn client_to_server(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    cutter: Option<Cutter>,
    forwarded_in_cut: Arc<Mutex<Vec<String>>>,
    link: CancellationToken,
) {
    let mut statements: HashMap<String, String> = HashMap::new(); // name -> query
    let mut transaction: Vec<String> = Vec::new(); // queries bound since the last COMMIT
    let mut typed = false;
    loop {
        let message = tokio::select! {
            _ = link.cancelled() => return,
            m = read_message(&mut from, typed) => match m { Some(m) => m, None => break },
        };
        typed = true;
        match message.kind {
            Some(b'P') => {
                let parts = cstrings(message.payload(), 2);
                statements.insert(parts[0].clone(), parts[1].clone());
            }
            Some(b'B') => {
                let name = &cstrings(message.payload(), 2)[1];
                let query = statements.get(name).cloned().unwrap_or_default();
                if query == "COMMIT" {
                    if let Some(cutter) = &cutter {
                        if cutter.cut_if_armed() {
                            *forwarded_in_cut.lock().unwrap() = transaction;
                            return;
                        }
                    }
                    transaction.clear();
                } else {
                    transaction.push(query);
                }
            }
            _ => {}
        }
        if to.write_all(&message.frame).await.is_err() {
            break;
        }
    }
    link.cancel();
}

async fn server_to_client(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    cutter: Option<Cutter>,
    link: CancellationToken,
) {
    loop {
        let message = tokio::select! {
            _ = link.cancelled() => return,
            m = read_message(&mut from, true) => match m { Some(m) => m, None => break },
        };
        // CommandComplete "COMMIT": the server has committed.
        if message.kind == Some(b'C') && message.payload() == b"COMMIT\0" {
            if let Some(cutter) = &cutter {
                if cutter.cut_if_armed() {
                    return;
                }
            }
        }
        if to.write_all(&message.frame).await.is_err() {
            break;
        }
    }
    link.cancel();
}

/// A server whose pool connects through a proxy cutting at `cut`; warmed up (statements
/// prepared) with one order through the unarmed proxy.
async fn api_behind(cut: Cut) -> (TestApi, CuttingProxy) {
    let db = TestDb::new().await;
    let pg = db.config();
    let upstream_port = *pg.database.url.pg_config().get_ports().first().unwrap();
    let proxy = CuttingProxy::start(upstream_port, cut).await;
    // The proxy reads plaintext protocol from the first byte: no SSLRequest (which the default
    // sslmode=prefer sends first, as libpq does).
    let proxied_url = db.url.replace(
        &format!("port={upstream_port}"),
        &format!("port={} sslmode=disable", proxy.port),
    );
    assert_ne!(proxied_url, db.url);
    let api = TestApi::start_custom(db, &[("TOMBSTONED_DATABASE__POOL_SIZE", "1")], |config| {
        config.database.url = DatabaseUrl::parse(&proxied_url).unwrap();
    })
    .await;
    api.post(ALICE, "key-warm", &order("req-warm"))
        .await
        .expect(201);
    (api, proxy)
}

/// The armed request: 503 outcome-unknown with Retry-After, honest wording.
async fn lost_commit(api: &TestApi, proxy: &CuttingProxy) {
    proxy.armed.store(true, Ordering::SeqCst);
    let lost = api.post(ALICE, "key-x", &order("req-x")).await;
    lost.expect(503);
    assert_eq!(lost.problem(), "outcome-unknown");
    assert_eq!(lost.header("retry-after"), Some("1"));
    let detail = lost.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("Outcome unknown") && detail.contains("same Idempotency-Key"),
        "{detail}"
    );
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn commit_lost_on_its_way_back_is_outcome_unknown_and_the_retry_replays_the_one_order() {
    let (api, proxy) = api_behind(Cut::AfterCommit).await;
    lost_commit(&api, &proxy).await;
    // It did commit: the retry with the same key replays it, and nothing is created twice.
    assert_eq!(api.counts().await, (2, 2, 2));
    let retry = api.post(ALICE, "key-x", &order("req-x")).await;
    retry.expect(201);
    assert!(retry.replayed(), "the committed order, replayed");
    assert_eq!(retry.json()["request_id"], "req-x");
    assert_eq!(api.counts().await, (2, 2, 2));
    let text = api.metrics_text();
    assert!(
        text.contains("tombstoned_db_errors_total{sqlstate_class=\"connection\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn commit_lost_before_reaching_the_server_is_outcome_unknown_and_the_retry_creates_once() {
    let (api, proxy) = api_behind(Cut::BeforeCommit).await;
    lost_commit(&api, &proxy).await;
    // The server got BEGIN, the setting and the claim, not COMMIT.
    let received = proxy.forwarded_in_cut.lock().unwrap().clone();
    assert_eq!(received.len(), 3, "{received:#?}");
    assert!(received[0].starts_with("BEGIN"), "{received:#?}");
    assert!(
        received[2].contains("INSERT INTO \"tombstoned\".idempotency_records"),
        "the claim reached the server before the cut: {received:#?}"
    );
    // It rolled back: nothing of it is visible, and the retry creates the order exactly once.
    assert_eq!(api.counts().await, (1, 1, 1));
    let retry = api.post(ALICE, "key-x", &order("req-x")).await;
    retry.expect(201);
    assert!(!retry.replayed(), "the retry ran the business itself");
    let again = api.post(ALICE, "key-x", &order("req-x")).await;
    again.expect(201);
    assert!(again.replayed());
    assert_eq!(again.text, retry.text);
    assert_eq!(api.counts().await, (2, 2, 2));
}

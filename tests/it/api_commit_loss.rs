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
//! * **after an implicit transaction committed**, behind a transaction pooler (PgBouncer), where
//!   the claim is one call of `endpoint_claim_order` without a COMMIT message: it holds back the
//!   server's answer to that call until the server's ReadyForQuery says the transaction ended,
//!   then drops it all and closes both sides.
//!
//! Either way the API has sent the whole transaction and cannot know which way it went, so the
//! client must get the honest 503 `outcome-unknown`, and its retry with the same key must return
//! the one order — created exactly once, whichever way the commit went. The proxy also serves
//! other tests that need a database connection cut at a commit, or a database that stops
//! answering (`set_down`): `tests/it/examples.rs`.

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
pub enum Cut {
    /// Drop the client's `Bind` of the COMMIT statement and everything after it.
    BeforeCommit,
    /// Drop the server's `CommandComplete` with tag `COMMIT` and everything after it.
    AfterCommit,
    /// Hold back the server's answer to the statement whose text contains this, sent alone (an
    /// implicit transaction), until its ReadyForQuery; then drop it all.
    AfterImplicitCommitOf(&'static str),
}

/// A TCP proxy to a PostgreSQL (or PgBouncer) port that can cut a connection at a commit.
pub struct CuttingProxy {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    /// The statements of the cut transaction the server received (before-commit cuts), or the
    /// statement whose answer was held back (implicit-commit cuts).
    forwarded_in_cut: Arc<Mutex<Vec<String>>>,
    down: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<CancellationToken>>>,
    /// The SQLSTATE of every ErrorResponse the server sent through it.
    errors: Arc<Mutex<Vec<String>>>,
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
    /// A proxy to 127.0.0.1:`upstream_port`, unarmed.
    pub async fn start(upstream_port: u16, cut: Cut) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let proxy = Self {
            port,
            armed: Arc::new(AtomicBool::new(false)),
            cuts: Arc::new(AtomicUsize::new(0)),
            forwarded_in_cut: Arc::new(Mutex::new(Vec::new())),
            down: Arc::new(AtomicBool::new(false)),
            links: Arc::new(Mutex::new(Vec::new())),
            errors: Arc::new(Mutex::new(Vec::new())),
        };
        let (armed, cuts, forwarded, down, links, errors) = (
            Arc::clone(&proxy.armed),
            Arc::clone(&proxy.cuts),
            Arc::clone(&proxy.forwarded_in_cut),
            Arc::clone(&proxy.down),
            Arc::clone(&proxy.links),
            Arc::clone(&proxy.errors),
        );
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                // Down: the connection is closed at once, as a database that is gone does.
                if down.load(Ordering::SeqCst) {
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream_port)).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                // A cut in either direction ends both tasks, dropping all four halves: both
                // sockets close.
                let link = CancellationToken::new();
                links.lock().unwrap().push(link.clone());
                let cutter = Cutter {
                    armed: Arc::clone(&armed),
                    cuts: Arc::clone(&cuts),
                    link: link.clone(),
                };
                // Implicit-commit cuts: set by the client side when the statement is sent, read
                // by the server side.
                let held = Arc::new(AtomicBool::new(false));
                tokio::spawn(client_to_server(
                    client_read,
                    server_write,
                    cut,
                    (cut == Cut::BeforeCommit).then(|| cutter.clone()),
                    Arc::clone(&held),
                    Arc::clone(&forwarded),
                    link.clone(),
                ));
                tokio::spawn(server_to_client(
                    server_read,
                    client_write,
                    (cut != Cut::BeforeCommit).then_some(cutter),
                    held,
                    Arc::clone(&errors),
                    link,
                ));
            }
        });
        proxy
    }

    /// Cuts at the next commit of the kind the proxy was started for (once).
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// How many connections were cut at a commit.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }

    /// The SQLSTATEs of the errors the server answered through the proxy so far, in order.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap().clone()
    }

    /// Down: every connection open is closed and every new one closed at once. Up again:
    /// connections pass.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            for link in self.links.lock().unwrap().drain(..) {
                link.cancel();
            }
        }
    }

    /// `url` (key=value form) with its port the proxy's, and without TLS (the proxy reads the
    /// plaintext protocol from the first byte, so no SSLRequest may come first).
    pub fn url(&self, url: &str, upstream_port: u16) -> String {
        let proxied = url.replace(
            &format!("port={upstream_port}"),
            &format!("port={} sslmode=disable", self.port),
        );
        assert_ne!(proxied, url, "{url} names no port={upstream_port}");
        proxied
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
    cut: Cut,
    cutter: Option<Cutter>,
    held: Arc<AtomicBool>,
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
                if let Cut::AfterImplicitCommitOf(marker) = cut {
                    if parts[1].contains(marker) {
                        *forwarded_in_cut.lock().unwrap() = vec![parts[1].clone()];
                        held.store(true, Ordering::SeqCst);
                    }
                }
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
    held: Arc<AtomicBool>,
    errors: Arc<Mutex<Vec<String>>>,
    link: CancellationToken,
) {
    // The answer to a statement whose implicit transaction is not over yet.
    let mut holding: Vec<u8> = Vec::new();
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
        // ErrorResponse: its fields are a type byte and a string each; 'C' is the SQLSTATE.
        if message.kind == Some(b'E') {
            let mut fields = message.payload().split(|b| *b == 0);
            if let Some(code) = fields.find_map(|f| f.strip_prefix(b"C")) {
                errors
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(code).into_owned());
            }
        }
        let frame = if held.load(Ordering::SeqCst) {
            holding.extend_from_slice(&message.frame);
            // ReadyForQuery after the statement: its implicit transaction has ended.
            if message.kind != Some(b'Z') {
                continue;
            }
            held.store(false, Ordering::SeqCst);
            if let Some(cutter) = &cutter {
                if cutter.cut_if_armed() {
                    return;
                }
            }
            std::mem::take(&mut holding)
        } else {
            message.frame
        };
        if to.write_all(&frame).await.is_err() {
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
    let proxied_url = proxy.url(&db.url, upstream_port);
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
    proxy.arm();
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

/// The cut transaction did commit: the retry with the same key replays it, and nothing is
/// created twice.
async fn retry_replays_the_committed_order(api: &TestApi) {
    assert_eq!(api.counts().await, (2, 2, 2));
    let retry = api.post(ALICE, "key-x", &order("req-x")).await;
    retry.expect(201);
    assert!(retry.replayed(), "the committed order, replayed");
    assert_eq!(retry.json()["request_id"], "req-x");
    assert_eq!(api.counts().await, (2, 2, 2));
}

#[tokio::test]
async fn commit_lost_on_its_way_back_is_outcome_unknown_and_the_retry_replays_the_one_order() {
    let (api, proxy) = api_behind(Cut::AfterCommit).await;
    lost_commit(&api, &proxy).await;
    retry_replays_the_committed_order(&api).await;
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

/// Behind PgBouncer in transaction mode the claim is one call of `endpoint_claim_order`, sent
/// alone: its transaction commits without a COMMIT message. The server's answer is lost after
/// the transaction ended (its ReadyForQuery seen): 503 `outcome-unknown`, the order is there,
/// and the retry with the same key replays it, through the same pooler.
#[tokio::test]
async fn a_lost_answer_behind_a_transaction_pooler_is_outcome_unknown_and_the_retry_replays() {
    use crate::pooler_support::{PgBouncer, PoolMode};
    let db = TestDb::new().await;
    let bouncer = PgBouncer::start(PoolMode::Transaction, 2).await;
    let through_bouncer = bouncer.url(&db.name);
    let proxy = CuttingProxy::start(
        bouncer.port,
        Cut::AfterImplicitCommitOf("endpoint_claim_order"),
    )
    .await;
    let proxied_url = proxy.url(&through_bouncer, bouncer.port);
    let api = TestApi::start_custom(
        db,
        &[
            ("TOMBSTONED_DATABASE__POOL_SIZE", "1"),
            ("TOMBSTONED_DATABASE__POOLER", "transaction"),
        ],
        |config| {
            config.database.url = DatabaseUrl::parse(&proxied_url).unwrap();
        },
    )
    .await;
    api.post(ALICE, "key-warm", &order("req-warm"))
        .await
        .expect(201);
    lost_commit(&api, &proxy).await;
    // The cut answer was the function's call, the transaction's only statement.
    let cut = proxy.forwarded_in_cut.lock().unwrap().clone();
    assert_eq!(cut.len(), 1, "{cut:?}");
    assert!(cut[0].contains("endpoint_claim_order("), "{cut:?}");
    retry_replays_the_committed_order(&api).await;
}

//! The connection dies during the commit, both ways. A TCP proxy between the API's pool and
//! PostgreSQL reads the wire protocol message by message and, once armed, cuts the link at one
//! exact point. On a direct connection the claim is its statement alone, an implicit transaction
//! the server commits at the statement's Sync (`db::pipeline::in_session`), so the faults are cut
//! at that Sync:
//!
//! * **before the commit reaches the server**: it forwards the claim's Bind and Execute — the
//!   server runs the statement — then keeps the Sync, asks the server to flush the statement's
//!   answer (its row and CommandComplete, uncommitted), forwards that and closes both sides.
//!   PostgreSQL never commits: it rolls the claim back when it sees the connection gone;
//! * **after the server committed, before its confirmation**: it forwards everything — the Sync,
//!   the row, the CommandComplete — but drops the ReadyForQuery the server sends once it has
//!   committed, and closes both sides.
//!
//! * **after an implicit transaction committed**, behind a transaction pooler (PgBouncer), where
//!   the claim is one call of `endpoint_claim_order`: it holds back the server's answer to that
//!   call until the server's ReadyForQuery says the transaction ended, then drops it all and
//!   closes both sides.
//!
//! Either way the API has sent the whole transaction and cannot know which way it went, so the
//! client must get the honest 503 `outcome-unknown`, and its retry with the same key must return
//! the one order — created exactly once, whichever way the commit went; and nothing is
//! acknowledged that did not commit (the first cut hands the daemon the statement's row of a
//! transaction that never commits). The proxy also cuts an explicit transaction at its COMMIT
//! (the `Bind` of the COMMIT dropped, or its CommandComplete), for other tests that need a
//! database connection cut at a commit, and serves a database that stops answering
//! (`set_down`): `tests/it/examples.rs`.

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

/// Statement texts or SQLSTATEs the proxy records, shared between its two directions and the test.
type Recorded = Arc<Mutex<Vec<String>>>;

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
    /// The statement whose text contains this, sent alone (an implicit transaction, which the
    /// server commits at the statement's Sync): drop the client's Sync, ask the server to flush
    /// what it has of the statement's answer (a `Flush` message: its rows and CommandComplete —
    /// the statement ran, uncommitted), forward that, then close both sides. The server never
    /// commits: it rolls the statement back when the connection closes.
    BeforeImplicitCommitOf(&'static str),
    /// The statement whose text contains this, sent alone: forward its answer — rows and
    /// CommandComplete — and drop the ReadyForQuery the server sends once it has committed the
    /// implicit transaction at the statement's Sync; then close both sides.
    AtImplicitCommitConfirmationOf(&'static str),
}

impl Cut {
    /// The marker of a cut at an implicit transaction's Sync (the new shape of the claim).
    fn at_sync_of(self) -> Option<&'static str> {
        match self {
            Cut::BeforeImplicitCommitOf(marker) | Cut::AtImplicitCommitConfirmationOf(marker) => {
                Some(marker)
            }
            _ => None,
        }
    }

    /// Whether the server's side of the link does the cutting.
    fn cut_on_the_way_back(self) -> bool {
        !matches!(self, Cut::BeforeCommit | Cut::BeforeImplicitCommitOf(_))
    }
}

/// Between the two directions of one link, for the cuts at an implicit transaction's Sync.
struct AtSync {
    /// The proxy's: whether the next cut is to be made.
    armed: Arc<AtomicBool>,
    /// The armed proxy saw the client bind the marked statement: the next Sync ends it.
    targeted: AtomicBool,
    /// The statements bound since the last Sync, when one of them is targeted.
    bound: Mutex<Vec<String>>,
    /// Before-commit: the Sync was dropped and a Flush sent; forward the statement's answer up
    /// to its CommandComplete (or ErrorResponse), then cut.
    answer_then_cut: AtomicBool,
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
                let at_sync = Arc::new(AtSync {
                    armed: Arc::clone(&armed),
                    targeted: AtomicBool::new(false),
                    bound: Mutex::new(Vec::new()),
                    answer_then_cut: AtomicBool::new(false),
                });
                tokio::spawn(client_to_server(
                    client_read,
                    server_write,
                    cut,
                    (!cut.cut_on_the_way_back()).then(|| cutter.clone()),
                    (Arc::clone(&held), Arc::clone(&at_sync)),
                    Arc::clone(&forwarded),
                    link.clone(),
                ));
                tokio::spawn(server_to_client(
                    server_read,
                    client_write,
                    (cut, cut.cut_on_the_way_back().then_some(cutter)),
                    (held, at_sync),
                    (Arc::clone(&errors), Arc::clone(&forwarded)),
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
        if self.disarm() {
            self.link.cancel();
            return true;
        }
        false
    }

    /// Counts the cut if armed (once), leaving the link up for now.
    fn disarm(&self) -> bool {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.cuts.fetch_add(1, Ordering::SeqCst);
            return true;
        }
        false
    }
}

/// A Flush message: the server sends what it has buffered, without ending the transaction.
const FLUSH: [u8; 5] = [b'H', 0, 0, 0, 4];

async fn client_to_server(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    cut: Cut,
    cutter: Option<Cutter>,
    (held, at_sync): (Arc<AtomicBool>, Arc<AtSync>),
    forwarded_in_cut: Arc<Mutex<Vec<String>>>,
    link: CancellationToken,
) {
    let mut statements: HashMap<String, String> = HashMap::new(); // name -> query
    let mut transaction: Vec<String> = Vec::new(); // queries bound since the last COMMIT
    let mut since_sync: Vec<String> = Vec::new(); // queries bound since the last Sync
    let mut typed = false;
    loop {
        let message = tokio::select! {
            _ = link.cancelled() => return,
            m = read_message(&mut from, typed) => match m { Some(m) => m, None => break },
        };
        typed = true;
        if let Some(marker) = cut.at_sync_of() {
            if message.kind == Some(b'B') {
                let name = &cstrings(message.payload(), 2)[1];
                let query = statements.get(name).cloned().unwrap_or_default();
                // Armed when the statement is bound: that request's Sync is the one.
                if query.contains(marker) && at_sync.armed.load(Ordering::SeqCst) {
                    at_sync.targeted.store(true, Ordering::SeqCst);
                }
                since_sync.push(query);
            }
            if message.kind == Some(b'S') {
                if at_sync.targeted.load(Ordering::SeqCst) {
                    *at_sync.bound.lock().unwrap() = since_sync.clone();
                    if let Some(cutter) = cutter.as_ref().filter(|c| c.disarm()) {
                        // The Sync stays here. The server flushes the statement's answer; the
                        // other side forwards it and then cuts.
                        *forwarded_in_cut.lock().unwrap() = since_sync;
                        at_sync.answer_then_cut.store(true, Ordering::SeqCst);
                        if to.write_all(&FLUSH).await.is_err() {
                            cutter.link.cancel();
                        }
                        cutter.link.cancelled().await;
                        return;
                    }
                }
                since_sync.clear();
            }
        }
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
                    if let Some(cutter) = cutter.as_ref().filter(|_| cut == Cut::BeforeCommit) {
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
    (cut, cutter): (Cut, Option<Cutter>),
    (held, at_sync): (Arc<AtomicBool>, Arc<AtSync>),
    (errors, forwarded_in_cut): (Recorded, Recorded),
    link: CancellationToken,
) {
    // The answer to a statement whose implicit transaction is not over yet.
    let mut holding: Vec<u8> = Vec::new();
    loop {
        let message = tokio::select! {
            _ = link.cancelled() => return,
            m = read_message(&mut from, true) => match m { Some(m) => m, None => break },
        };
        // Before-commit at a Sync: the statement's answer, flushed without its commit, goes
        // through up to its end; then the link is cut.
        if at_sync.answer_then_cut.load(Ordering::SeqCst) {
            let _ = to.write_all(&message.frame).await;
            if matches!(message.kind, Some(b'C' | b'E')) {
                link.cancel();
                return;
            }
            continue;
        }
        // At the commit's confirmation: the ReadyForQuery after the targeted statement, sent
        // once the server has committed its implicit transaction, never reaches the client.
        if message.kind == Some(b'Z') && at_sync.targeted.swap(false, Ordering::SeqCst) {
            if let Some(cutter) = &cutter {
                if cutter.cut_if_armed() {
                    *forwarded_in_cut.lock().unwrap() =
                        std::mem::take(&mut *at_sync.bound.lock().unwrap());
                    return;
                }
            }
        }
        // CommandComplete "COMMIT": the server has committed.
        if message.kind == Some(b'C') && message.payload() == b"COMMIT\0" {
            if let Some(cutter) = cutter.as_ref().filter(|_| cut == Cut::AfterCommit) {
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

/// What marks the claim's statement on the wire (its text; the ensure-scope statement inserts
/// into `idempotency_scopes`).
const CLAIM: &str = "INSERT INTO \"tombstoned\".idempotency_records";

/// On a direct connection the claim is its statement alone, an implicit transaction that the
/// server commits at the statement's Sync. The server runs the claim and commits; its answer —
/// the row and the CommandComplete — reaches the daemon, the ReadyForQuery that confirms the
/// commit does not, and the connection closes: 503 `outcome-unknown`, and the retry with the same
/// key replays the one order.
///
/// Shown red before it was kept (2026-12-07) against a build that acknowledges before the commit
/// is confirmed: `db::pipeline::alone` changed to take the claim's first row from the stream of
/// tokio-postgres's `Client::query_raw` on the named statement and return it, without reading on
/// to the ReadyForQuery — the 201 went out (`lost.expect(503)` failed: 201). Reverted; with the
/// answer read to its ReadyForQuery, as `Client::query` reads it, the cut is an error and the
/// test passes.
#[tokio::test]
async fn commit_lost_on_its_way_back_is_outcome_unknown_and_the_retry_replays_the_one_order() {
    let (api, proxy) = api_behind(Cut::AtImplicitCommitConfirmationOf(CLAIM)).await;
    lost_commit(&api, &proxy).await;
    // The cut was the claim's own transaction: the statement alone.
    let cut = proxy.forwarded_in_cut.lock().unwrap().clone();
    assert_eq!(cut.len(), 1, "{cut:#?}");
    assert!(cut[0].contains(CLAIM), "{cut:#?}");
    retry_replays_the_committed_order(&api).await;
    let text = api.metrics_text();
    assert!(
        text.contains("tombstoned_db_errors_total{sqlstate_class=\"connection\"} 1"),
        "{text}"
    );
}

/// The claim's statement alone reaches the server and runs, but the Sync that would commit its
/// implicit transaction does not: the server sends what it has of the answer (the row and the
/// CommandComplete, asked by a Flush), the daemon reads it, and the connection closes. Nothing
/// was committed, yet the daemon cannot know: 503 `outcome-unknown`, never the row it read; the
/// retry with the same key creates the order, exactly once.
///
/// Shown red before it was kept (2026-12-07) against the same build as the test above (the
/// claim's first row acknowledged without reading on to the ReadyForQuery): it answered 201 with
/// the body of an order that was never committed (`lost.expect(503)` failed: 201). Reverted; the
/// test passes.
#[tokio::test]
async fn commit_lost_before_reaching_the_server_is_outcome_unknown_and_the_retry_creates_once() {
    let (api, proxy) = api_behind(Cut::BeforeImplicitCommitOf(CLAIM)).await;
    lost_commit(&api, &proxy).await;
    // The server got the claim's statement alone — no BEGIN, no COMMIT — and not its Sync.
    let received = proxy.forwarded_in_cut.lock().unwrap().clone();
    assert_eq!(received.len(), 1, "{received:#?}");
    assert!(
        received[0].contains(CLAIM),
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

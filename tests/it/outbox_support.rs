//! Helpers for the outbox relay tests: a real webhook receiver (an axum server in this process,
//! over HTTP or HTTPS) that verifies every Standard Webhooks signature itself and applies each
//! event in its own PostgreSQL transaction, deduplicating by `webhook-id` the way the README
//! tells receivers to; orders and events seeded directly; the relay's configuration section.

#![allow(dead_code)] // each outbox test uses a different subset

use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::Client;
use tombstoned::db::Pool;
use uuid::Uuid;

use crate::harness::TestDb;
pub use crate::tls_support::TestPki;
use crate::tls_support::TlsListener;

/// The shared secret (the Standard Webhooks specification's example secret).
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// How long a test waits for the relay to reach a state before failing.
pub const PATIENCE: Duration = Duration::from_secs(40);

/// What the receiver does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Apply the event (deduplicated) and answer 204.
    Accept,
    /// Wait this long, then apply the event and answer 204 (widens the window for overlaps).
    Slow(Duration),
    /// Answer this status without applying anything.
    Status(u16),
    /// Apply nothing and answer nothing for this long (the relay times out first).
    Stall(Duration),
    /// Apply the event and commit, then hold the response until [`Receiver::release`].
    Hold,
}

/// One request as the receiver saw it.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// `webhook-id`.
    pub id: String,
    /// When it arrived.
    pub at: Instant,
    /// What the receiver did.
    pub behaviour: Behaviour,
    /// Its W3C `traceparent` header, when it had one (the relay's delivery span).
    pub traceparent: Option<String>,
}

/// What the receiver counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests received.
    pub requests: u64,
    /// Requests whose signature, timestamp or body did not verify (answered 401).
    pub bad_signatures: u64,
    /// Requests that arrived while a request with the same `webhook-id` was still in flight.
    pub overlaps: u64,
    /// Events applied again (a `webhook-id` already in the sink: dropped by the dedup).
    pub duplicates: u64,
    /// Events whose order had a lower sequence not yet applied.
    pub out_of_order: u64,
}

struct Shared {
    pool: Pool,
    key: Vec<u8>,
    script: Mutex<VecDeque<Behaviour>>,
    default: Mutex<Behaviour>,
    in_flight: Mutex<HashSet<String>>,
    arrivals: Mutex<Vec<Arrival>>,
    requests: AtomicU64,
    bad_signatures: AtomicU64,
    overlaps: AtomicU64,
    duplicates: AtomicU64,
    out_of_order: AtomicU64,
    held: AtomicU64,
    release: watch::Sender<bool>,
}

/// A running receiver. Its sink lives in the schema `receiver` of the test database.
pub struct Receiver {
    /// The endpoint to configure (`http://127.0.0.1:<port>/hooks` or `https://...`).
    pub url: String,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const SINK_DDL: &str = "
CREATE SCHEMA IF NOT EXISTS receiver;
-- What the README's example receiver keeps: each webhook-id once.
-- An event names an order (the endpoint's) or an aggregate (enqueue_event's).
CREATE TABLE IF NOT EXISTS receiver.sink (
    webhook_id   uuid PRIMARY KEY,
    order_id     uuid NULL,
    aggregate_id text NULL,
    sequence     integer NOT NULL,
    event_type   text NOT NULL,
    received_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((order_id IS NULL) <> (aggregate_id IS NULL))
);
-- The receiver's own business change, made in the same transaction.
CREATE TABLE IF NOT EXISTS receiver.shipments (
    order_id     uuid NOT NULL,
    sequence     integer NOT NULL,
    PRIMARY KEY (order_id, sequence)
);
CREATE TABLE IF NOT EXISTS receiver.aggregate_effects (
    aggregate_id text NOT NULL,
    sequence     integer NOT NULL,
    PRIMARY KEY (aggregate_id, sequence)
);";

impl Receiver {
    /// A plain-HTTP receiver whose every request gets `Accept`.
    pub async fn start(db: &TestDb) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (router, shared) = Self::router(db).await;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Receiver {
            url: format!("http://127.0.0.1:{port}/hooks"),
            shared,
            task,
        }
    }

    /// An HTTPS receiver presenting `tls.server_cert` (signed by `tls.ca_cert`).
    pub async fn start_tls(db: &TestDb, tls: &TestPki) -> Receiver {
        let listener = TlsListener::bind(tls).await;
        let port = listener.port;
        let (router, shared) = Self::router(db).await;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Receiver {
            url: format!("https://127.0.0.1:{port}/hooks"),
            shared,
            task,
        }
    }

    async fn router(db: &TestDb) -> (axum::Router, Arc<Shared>) {
        db.client().await.batch_execute(SINK_DDL).await.unwrap();
        let pool = tombstoned::db::pool(
            &db.config().database,
            "test-receiver",
            16,
            Duration::from_secs(10),
        )
        .unwrap();
        let encoded = SECRET.strip_prefix("whsec_").unwrap();
        let shared = Arc::new(Shared {
            pool,
            key: base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap(),
            script: Mutex::new(VecDeque::new()),
            default: Mutex::new(Behaviour::Accept),
            in_flight: Mutex::new(HashSet::new()),
            arrivals: Mutex::new(Vec::new()),
            requests: AtomicU64::new(0),
            bad_signatures: AtomicU64::new(0),
            overlaps: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            out_of_order: AtomicU64::new(0),
            held: AtomicU64::new(0),
            release: watch::channel(false).0,
        });
        let router = axum::Router::new()
            .route("/hooks", axum::routing::post(handle))
            .with_state(shared.clone());
        (router, shared)
    }

    /// The next requests get these behaviours, in order; then the default.
    pub fn script(&self, behaviours: &[Behaviour]) {
        self.shared
            .script
            .lock()
            .unwrap()
            .extend(behaviours.iter().copied());
    }

    /// What requests get once the script is used up.
    pub fn set_default(&self, behaviour: Behaviour) {
        *self.shared.default.lock().unwrap() = behaviour;
    }

    /// Lets every held response (and every later `Hold`) go.
    pub fn release(&self) {
        self.shared.release.send_replace(true);
    }

    /// Requests holding their response right now (their event is committed in the sink).
    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Waits until `n` requests hold their response.
    pub async fn wait_held(&self, n: u64) {
        let deadline = Instant::now() + PATIENCE;
        while self.held() < n {
            assert!(Instant::now() < deadline, "{n} held requests never came");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            requests: s.requests.load(Ordering::SeqCst),
            bad_signatures: s.bad_signatures.load(Ordering::SeqCst),
            overlaps: s.overlaps.load(Ordering::SeqCst),
            duplicates: s.duplicates.load(Ordering::SeqCst),
            out_of_order: s.out_of_order.load(Ordering::SeqCst),
        }
    }

    /// Every request for `id`, in arrival order.
    pub fn arrivals_of(&self, id: Uuid) -> Vec<Arrival> {
        let id = id.to_string();
        self.shared
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.id == id)
            .cloned()
            .collect()
    }

    /// Waits until `id` has arrived `n` times.
    pub async fn wait_arrivals(&self, id: Uuid, n: usize) {
        let deadline = Instant::now() + PATIENCE;
        while self.arrivals_of(id).len() < n {
            assert!(
                Instant::now() < deadline,
                "{id} arrived {} times, not {n}",
                self.arrivals_of(id).len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// `webhook-signature` may list several space-separated `v1,<base64>` signatures (secret
/// rotation); one match is enough.
pub fn signature_ok(key: &[u8], headers: &HeaderMap, body: &[u8]) -> Option<String> {
    let header = |name: &str| headers.get(name)?.to_str().ok().map(str::to_owned);
    let id = header("webhook-id")?;
    let timestamp = header("webhook-timestamp")?;
    let signatures = header("webhook-signature")?;
    // Replay protection as the convention recommends: the timestamp within five minutes.
    let sent: i64 = timestamp.parse().ok()?;
    if (chrono::Utc::now().timestamp() - sent).abs() > 300 {
        return None;
    }
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).ok()?;
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    signatures
        .split(' ')
        .filter_map(|s| s.strip_prefix("v1,"))
        .any(|s| s == expected)
        .then_some(id)
}

/// Removes the id from the in-flight set however the handler ends (also when hyper drops it
/// because the relay hung up).
struct InFlight<'a>(&'a Mutex<HashSet<String>>, String);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.lock().unwrap().remove(&self.1);
    }
}

async fn handle(State(s): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    s.requests.fetch_add(1, Ordering::SeqCst);
    let Some(id) = signature_ok(&s.key, &headers, &body) else {
        s.bad_signatures.fetch_add(1, Ordering::SeqCst);
        return StatusCode::UNAUTHORIZED;
    };
    let event: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            s.bad_signatures.fetch_add(1, Ordering::SeqCst);
            return StatusCode::BAD_REQUEST;
        }
    };
    if event["event_id"].as_str() != Some(id.as_str()) {
        s.bad_signatures.fetch_add(1, Ordering::SeqCst);
        return StatusCode::BAD_REQUEST;
    }
    let behaviour = {
        let next = s.script.lock().unwrap().pop_front();
        next.unwrap_or(*s.default.lock().unwrap())
    };
    s.arrivals.lock().unwrap().push(Arrival {
        id: id.clone(),
        at: Instant::now(),
        behaviour,
        traceparent: headers
            .get("traceparent")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
    });
    if !s.in_flight.lock().unwrap().insert(id.clone()) {
        s.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    let _in_flight = InFlight(&s.in_flight, id.clone());
    match behaviour {
        Behaviour::Status(code) => return StatusCode::from_u16(code).unwrap(),
        Behaviour::Stall(d) => {
            tokio::time::sleep(d).await;
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        Behaviour::Slow(d) => tokio::time::sleep(d).await,
        Behaviour::Accept | Behaviour::Hold => {}
    }
    apply(&s, &event).await;
    if behaviour == Behaviour::Hold {
        s.held.fetch_add(1, Ordering::SeqCst);
        let mut go = s.release.subscribe();
        let _ = go.wait_for(|go| *go).await;
        s.held.fetch_sub(1, Ordering::SeqCst);
    }
    StatusCode::NO_CONTENT
}

/// The README's receiver: in ONE transaction, record the webhook-id (ON CONFLICT DO NOTHING)
/// and, only if it was new, make the business change.
async fn apply(s: &Shared, event: &serde_json::Value) {
    let id: Uuid = event["event_id"].as_str().unwrap().parse().unwrap();
    // Exactly one of the two (an aggregate's event has no order_id).
    let order: Option<Uuid> = event["order_id"].as_str().map(|o| o.parse().unwrap());
    let aggregate: Option<&str> = event["aggregate_id"].as_str();
    assert!(order.is_some() != aggregate.is_some(), "{event}");
    let sequence = i32::try_from(event["sequence"].as_i64().unwrap()).unwrap();
    let event_type = event["type"].as_str().unwrap().to_owned();
    let mut client = s.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let new = tx
        .execute(
            "INSERT INTO receiver.sink (webhook_id, order_id, aggregate_id, sequence, event_type)
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (webhook_id) DO NOTHING",
            &[&id, &order, &aggregate, &sequence, &event_type],
        )
        .await
        .unwrap();
    if new == 1 {
        let earlier: i64 = tx
            .query_one(
                "SELECT count(*) FROM receiver.sink
                 WHERE (order_id = $1 OR aggregate_id = $2) AND sequence < $3",
                &[&order, &aggregate, &sequence],
            )
            .await
            .unwrap()
            .get(0);
        if earlier != i64::from(sequence) - 1 {
            s.out_of_order.fetch_add(1, Ordering::SeqCst);
        }
        if order.is_some() {
            tx.execute(
                "INSERT INTO receiver.shipments (order_id, sequence) VALUES ($1, $2)",
                &[&order, &sequence],
            )
            .await
            .unwrap();
        } else {
            tx.execute(
                "INSERT INTO receiver.aggregate_effects (aggregate_id, sequence) VALUES ($1, $2)",
                &[&aggregate, &sequence],
            )
            .await
            .unwrap();
        }
    } else {
        s.duplicates.fetch_add(1, Ordering::SeqCst);
    }
    tx.commit().await.unwrap();
}

// ---- seeding and configuration -------------------------------------------------------------

/// Inserts `orders` orders, each with `events_per_order` events (sequence 1 `order.created`,
/// then `order.paid`, `order.shipped`, ...), created order by order; returns the event ids by
/// order.
pub async fn seed_events(client: &Client, orders: usize, events_per_order: i32) -> Vec<Vec<Uuid>> {
    let mut all = Vec::new();
    for n in 0..orders {
        let order = Uuid::now_v7();
        client
            .execute(
                "INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                                     currency, item, quantity, recipient)
                 VALUES ($1, 'acme', 'alice', $2, 100, 'CNY', 'book', 1, 'r')",
                &[&order, &format!("seed-{order}-{n}")],
            )
            .await
            .unwrap();
        let mut ids = Vec::new();
        for sequence in 1..=events_per_order {
            let id = Uuid::now_v7();
            // V1 allows each event type once per order.
            let event_type = match sequence {
                1 => "order.created".to_owned(),
                2 => "order.paid".to_owned(),
                3 => "order.shipped".to_owned(),
                n => format!("order.step-{n}"),
            };
            client
                .execute(
                    "INSERT INTO outbox_events
                         (event_id, tenant_id, order_id, event_type, sequence, payload, created_at)
                     VALUES ($1, 'acme', $2, $3, $4, jsonb_build_object('n', $4::integer),
                             clock_timestamp())",
                    &[&id, &order, &event_type, &sequence],
                )
                .await
                .unwrap();
            ids.push(id);
        }
        all.push(ids);
    }
    all
}

/// The secret file, mode 600, in a directory of its own.
pub fn secret_file() -> (tempfile::TempDir, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("webhook-secret");
    std::fs::write(&path, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (dir, path)
}

/// An `[outbox]` section (TOML) for `endpoint` with fast test timings; `extra` lines override.
pub fn outbox_section(endpoint: &str, secret: &Path, extra: &[(&str, &str)]) -> String {
    let mut keys: Vec<(String, String)> = [
        ("enabled", "true"),
        ("endpoint", &format!("{endpoint:?}")),
        (
            "secret_file",
            &format!("{:?}", secret.display().to_string()),
        ),
        ("poll_interval", "\"50ms\""),
        ("request_timeout", "\"2s\""),
        ("lease_duration", "\"5s\""),
        ("backoff_initial", "\"200ms\""),
        ("backoff_max", "\"2s\""),
        ("backoff_jitter", "0.0"),
        ("shutdown_grace", "\"1s\""),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in extra {
        keys.retain(|(key, _)| key != k);
        keys.push((k.to_string(), v.to_string()));
    }
    let mut text = String::from("[outbox]\n");
    for (k, v) in keys {
        text.push_str(&format!("{k} = {v}\n"));
    }
    text
}

/// The relay's record of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Delivered?
    pub delivered: bool,
    /// A dead letter?
    pub dead: bool,
    /// Attempts counted.
    pub attempts: i32,
    /// The lease holder, if leased.
    pub locked_by: Option<String>,
    /// The last status.
    pub last_status: Option<i16>,
}

/// Reads the relay's record of `id`.
pub async fn record(client: &Client, id: Uuid) -> Record {
    let row = client
        .query_one(
            "SELECT published_at IS NOT NULL, dead_lettered_at IS NOT NULL, attempts, locked_by,
                    last_status
             FROM outbox_events WHERE event_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    Record {
        delivered: row.get(0),
        dead: row.get(1),
        attempts: row.get(2),
        locked_by: row.get(3),
        last_status: row.get(4),
    }
}

/// Waits until `check` holds for the record of `id`; returns it.
pub async fn wait_record(client: &Client, id: Uuid, check: impl Fn(&Record) -> bool) -> Record {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = record(client, id).await;
        if check(&r) {
            return r;
        }
        assert!(Instant::now() < deadline, "{id} never got there: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until no event is pending (every one delivered or a dead letter).
pub async fn wait_all_settled(client: &Client) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let pending: i64 = client
            .query_one(
                "SELECT count(*) FROM outbox_events
                 WHERE published_at IS NULL AND dead_lettered_at IS NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if pending == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{pending} events still pending after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Counts of the sink: rows, distinct orders.
pub async fn sink_rows(client: &Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM receiver.sink", &[])
        .await
        .unwrap()
        .get(0)
}

/// Sessions of the relay (`application_name`), and how many of them are idle inside a
/// transaction or have had one open for more than a second (the relay's own statements are
/// single-statement transactions of milliseconds).
pub async fn relay_sessions(observer: &Client, application_name: &str) -> (i64, i64) {
    let row = observer
        .query_one(
            "SELECT count(*),
                    count(*) FILTER (WHERE state LIKE 'idle in transaction%'
                                        OR xact_start < now() - interval '1 second')
             FROM pg_stat_activity
             WHERE application_name = $1 AND datname = current_database()",
            &[&application_name],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

//! The floor of the daemon's stack (issue 28, scenario 10): the least a server built on the same
//! crates (hyper 1, tokio-postgres, the same multi-thread tokio runtime) must do to answer the
//! benchmark's claims and replays with the daemon's statements — and nothing else: no
//! authentication (the principal is the number in `Bearer bench-token-{p}`), no metrics,
//! tracing, rate limit, body validation, timeouts, pool or spawned claim task.
//!
//! It runs as a process of its own, so its CPU is read from `/proc` like the daemon's: the
//! `scenarios` binary re-executes itself with [`SERVE_FLAG`] ([`Floor::start`]) and becomes the
//! server ([`serve_main`]). It opens `--connections` PostgreSQL sessions at start-up, gives each
//! the settings the daemon's pooled sessions carry (`db::sql::SET_SESSION_SETTINGS`: READ
//! COMMITTED and the lock timeout), prepares `claim::sql::CLAIM_AND_CREATE` on each (the daemon's
//! text, schema rendered by `db::sql::qualify`, the daemon's parameter types), and hands them to
//! accepted HTTP connections in turn; the load generators keep one keep-alive connection per
//! client, so with as many sessions as clients each connection has a session to itself (a mutex
//! per session keeps a shared one correct, uncontended otherwise). Each request is the statement
//! alone, one implicit transaction, as the daemon sends it on a direct connection
//! (`db::pipeline::in_session`).
//!
//! It answers only what the benchmark sends: 201 with the stored body for a claim that created
//! the order and for a replay (`Idempotent-Replayed: true`), `Content-Type` and `Location` as the
//! daemon sets them; anything else 500. The fingerprint is built directly (the canonical JSON of
//! `fingerprint` version 1, hashed with SHA-256), and checked at start-up against
//! `tombstoned::fingerprint::Fingerprint::of`: a floor that hashed differently would answer every
//! replay 500, which the load generator counts.

use std::convert::Infallible;
use std::ffi::OsString;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use http_body_util::{BodyExt as _, Full};
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, LOCATION};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use sha2::{Digest as _, Sha256};
use tokio::process::Child;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, NoTls, Statement};
use tombstoned::claim::{sql, OPERATION_CREATE_ORDER};
use tombstoned::money::Currency;
use uuid::Uuid;

use crate::seed::{API_VERSION, LOCK_TIMEOUT, WINDOW_US};
use crate::Bench;

/// The hidden first argument that turns the `scenarios` binary into the floor server.
pub const SERVE_FLAG: &str = "--serve-floor";

/// `CLAIM_AND_CREATE`'s parameter types, as the daemon sends them (`claim::protocol`'s
/// `owner_attempt`, typed by `db::statement::PgType`): tenant, principal, operation, key,
/// fingerprint, order id, request_id, amount_minor, amount, currency, item, quantity, recipient,
/// replay window (µs), event id, metadata.
const CLAIM_TYPES: [Type; 16] = [
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::BYTEA,
    Type::UUID,
    Type::TEXT,
    Type::INT8,
    Type::TEXT,
    Type::TEXT,
    Type::TEXT,
    Type::INT4,
    Type::TEXT,
    Type::INT8,
    Type::UUID,
    Type::JSONB,
];

/// The floor server's command line (after [`SERVE_FLAG`]).
#[derive(Debug, clap::Parser)]
#[command(name = "scenarios --serve-floor")]
pub struct FloorArgs {
    /// The flag that selected this command line.
    #[arg(long = "serve-floor")]
    serve_floor: bool,
    /// Address to listen on.
    #[arg(long)]
    listen: SocketAddr,
    /// PostgreSQL connection string (key=value or URL).
    #[arg(long)]
    database_url: String,
    /// PostgreSQL sessions to open at start-up.
    #[arg(long)]
    connections: usize,
    /// The schema the statements name.
    #[arg(long, default_value = "tombstoned")]
    schema: String,
}

/// The body fields the statement needs, deserialised as they come.
#[derive(Debug, Deserialize)]
struct OrderBody {
    request_id: String,
    amount_minor: i64,
    #[serde(default = "default_currency")]
    currency: String,
    item: String,
    quantity: i32,
    recipient: String,
    #[serde(default)]
    metadata: Option<serde_json::Value>,
}

fn default_currency() -> String {
    "CNY".to_owned()
}

/// One PostgreSQL session, carrying the claim's settings, and the claim statement prepared on it.
struct Session {
    client: Client,
    claim: Statement,
    /// Held while a transaction is on the wire: a session serves one request at a time.
    turn: tokio::sync::Mutex<()>,
    /// `retention.replay_window` (the default) in microseconds, as the daemon sends it.
    window_micros: i64,
}

impl Session {
    async fn open(url: &str, schema: &str) -> Result<Session> {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .context("connecting to PostgreSQL")?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("floor: PostgreSQL connection: {e}");
            }
        });
        client
            .execute_typed(
                tombstoned::db::sql::SET_SESSION_SETTINGS,
                &[(&LOCK_TIMEOUT, Type::TEXT)],
            )
            .await?;
        let claim = client
            .prepare_typed(
                tombstoned::db::sql::qualify(sql::CLAIM_AND_CREATE, schema),
                &CLAIM_TYPES,
            )
            .await?;
        Ok(Session {
            client,
            claim,
            turn: tokio::sync::Mutex::new(()),
            window_micros: WINDOW_US.parse().context("WINDOW_US")?,
        })
    }
}

/// The floor server's `main`: the daemon's runtime shape (multi-thread, default worker count).
pub fn serve_main() -> ExitCode {
    let args = <FloorArgs as clap::Parser>::parse();
    debug_assert!(args.serve_floor);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("floor: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("floor: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: FloorArgs) -> Result<()> {
    check_fingerprints()?;
    ensure!(args.connections > 0, "--connections must be at least 1");
    let mut sessions = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        sessions.push(Arc::new(
            Session::open(&args.database_url, &args.schema).await?,
        ));
    }
    // Bound last: a connection that succeeds means the server is ready.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let mut next = 0usize;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let accepted = tokio::select! {
            _ = terminate.recv() => return Ok(()),
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            continue; // that connection's problem, not the server's
        };
        // As the daemon's accept loop does: small answers, written at once.
        let _ = stream.set_nodelay(true);
        let session = Arc::clone(&sessions[next % sessions.len()]);
        next = next.wrapping_add(1);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let session = Arc::clone(&session);
                async move { Ok::<_, Infallible>(answer(&session, request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(session: &Session, request: Request<Incoming>) -> Response<Full<Bytes>> {
    /// Errors told on stderr; the load generator counts them all.
    static TOLD: AtomicUsize = AtomicUsize::new(0);
    match create_order(session, request).await {
        Ok(response) => response,
        Err(e) => {
            if TOLD.fetch_add(1, Ordering::Relaxed) < 5 {
                eprintln!("floor: {e:#}");
            }
            let mut response = Response::new(Full::new(Bytes::from_static(b"floor error")));
            *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
            response
        }
    }
}

/// `POST /v1/orders`: the claim statement alone, the stored body back.
async fn create_order(
    session: &Session,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>> {
    ensure!(
        request.method() == Method::POST && request.uri().path() == "/v1/orders",
        "only POST /v1/orders is served"
    );
    let headers = request.headers();
    let principal: i64 = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer bench-token-"))
        .and_then(|p| p.parse().ok())
        .context("no benchmark bearer token")?;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .context("no idempotency key")?
        .to_owned();
    let body = request.into_body().collect().await?.to_bytes();
    let order: OrderBody = serde_json::from_slice(&body)?;
    let currency = Currency::parse(&order.currency)?;
    let amount = currency.format(order.amount_minor);
    let fingerprint = fingerprint(&order, currency.code(), API_VERSION);
    let tenant = format!("tenant-{}", principal / 4);
    let principal = format!("principal-{principal}");
    let order_id = Uuid::now_v7();
    let event_id = Uuid::now_v7();
    let fingerprint: &[u8] = &fingerprint;
    let code = currency.code();
    let params: [&(dyn ToSql + Sync); 16] = [
        &tenant,
        &principal,
        &OPERATION_CREATE_ORDER,
        &key,
        &fingerprint,
        &order_id,
        &order.request_id,
        &order.amount_minor,
        &amount,
        &code,
        &order.item,
        &order.quantity,
        &order.recipient,
        &session.window_micros,
        &event_id,
        &order.metadata,
    ];
    let turn = session.turn.lock().await;
    let rows = session.client.query(&session.claim, &params).await;
    drop(turn);
    let rows = rows?;
    let row = rows.first().context("the claim returned no row")?;
    // CLAIM_RESULT_COLUMNS: created, body, order_id, fingerprint, expired, past_deadline,
    // status_code.
    let created: Option<bool> = row.try_get(0)?;
    let stored: Option<String> = row.try_get(1)?;
    let order_id: Option<Uuid> = row.try_get(2)?;
    let status: Option<i16> = row.try_get(6)?;
    let replayed = match (created, status) {
        (Some(true), _) => false,
        // The replay CTE returns the body only for the same fingerprint inside the window.
        (Some(false), Some(201)) if stored.is_some() => true,
        _ => bail!("neither created nor replayable: {created:?}, status {status:?}"),
    };
    let (Some(stored), Some(order_id)) = (stored, order_id) else {
        bail!("a 201 without its body or order id");
    };
    let mut response = Response::new(Full::new(Bytes::from(stored)));
    *response.status_mut() = StatusCode::CREATED;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(
        LOCATION,
        HeaderValue::from_str(&format!("/v1/orders/{order_id}"))?,
    );
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// SHA-256 of the canonical JSON of `fingerprint` version 1 (RFC 8785: keys sorted, strings
/// escaped as serde_json escapes them, `amount_minor` as a string), written directly.
fn fingerprint(order: &OrderBody, currency: &str, api_version: &str) -> [u8; 32] {
    Sha256::digest(canonical(order, currency, api_version)).into()
}

fn canonical(order: &OrderBody, currency: &str, api_version: &str) -> Vec<u8> {
    fn string(out: &mut Vec<u8>, s: &str) {
        // Writing into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
    let mut out = Vec::with_capacity(320);
    let _ = write!(
        out,
        "{{\"amount_minor\":\"{}\",\"api_version\":",
        order.amount_minor
    );
    string(&mut out, api_version);
    out.extend_from_slice(b",\"currency\":");
    string(&mut out, currency);
    out.extend_from_slice(b",\"fingerprint_version\":1,\"item\":");
    string(&mut out, &order.item);
    let _ = write!(out, ",\"quantity\":{},\"recipient\":", order.quantity);
    string(&mut out, &order.recipient);
    out.extend_from_slice(b",\"request_id\":");
    string(&mut out, &order.request_id);
    out.push(b'}');
    out
}

/// The floor's fingerprint equals the library's, on the benchmark's shapes and on strings that
/// need escaping; refuses to serve otherwise.
fn check_fingerprints() -> Result<()> {
    let texts = [
        "Ergonomic mesh office chair with adjustable lumbar support, black",
        "Customer 77 <customer77@example.com>",
        "quote \" backslash \\ slash / tab \t newline \n bell \u{7} del \u{7f}",
        "unicode é ü 中文 \u{2028} \u{1F600}",
    ];
    for (i, text) in texts.iter().enumerate() {
        let order = OrderBody {
            request_id: format!("req-{i}-{text}"),
            amount_minor: 12_345 + i as i64 * 1_000_000_007,
            currency: "CNY".to_owned(),
            item: (*text).to_owned(),
            quantity: 1 + i as i32,
            recipient: text.chars().rev().collect(),
            metadata: None,
        };
        let currency = Currency::parse(&order.currency)?;
        let library = tombstoned::fingerprint::Fingerprint::of(
            &tombstoned::order_request::OrderRequest {
                request_id: order.request_id.clone(),
                amount_minor: order.amount_minor,
                currency,
                item: order.item.clone(),
                quantity: order.quantity,
                recipient: order.recipient.clone(),
                metadata: None,
            },
            API_VERSION,
        )?;
        ensure!(
            library.as_bytes() == &fingerprint(&order, currency.code(), API_VERSION),
            "the floor's fingerprint differs from tombstoned::fingerprint for {text:?}: {}",
            String::from_utf8_lossy(&canonical(&order, currency.code(), API_VERSION))
        );
    }
    Ok(())
}

/// A running floor server (a child process of the benchmark).
pub struct Floor {
    child: Child,
    /// Its address.
    pub addr: SocketAddr,
    /// Its process id (for /proc; under valgrind, the program's own).
    pub pid: u32,
}

impl Floor {
    /// Starts the floor on database `db` with `connections` sessions, waits until it accepts
    /// connections. `wrapper`: a command to run it under (valgrind), with its arguments.
    pub async fn start(
        bench: &Bench,
        db: &str,
        connections: usize,
        wrapper: &[OsString],
        ready_within: Duration,
    ) -> Result<Floor> {
        let exe = std::env::current_exe().context("the benchmark's own executable")?;
        let addr: SocketAddr = format!(
            "127.0.0.1:{}",
            tombstoned::pg_cluster::free_loopback_port()?
        )
        .parse()?;
        let mut command = crate::daemon::wrapped(wrapper, &exe);
        command
            .arg(SERVE_FLAG)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--database-url")
            .arg(bench.server.url(db))
            .arg("--connections")
            .arg(connections.to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        let child = command.spawn().context("starting the floor server")?;
        let pid = child.id().context("the floor exited at once")?;
        let mut floor = Floor { child, addr, pid };
        let started = Instant::now();
        loop {
            if let Some(status) = floor.child.try_wait()? {
                bail!("the floor server exited during start-up: {status}");
            }
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(floor);
            }
            if started.elapsed() > ready_within {
                bail!("the floor server did not listen within {ready_within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits for it to exit.
    pub async fn stop(self) -> Result<()> {
        self.stop_within(Duration::from_secs(20)).await
    }

    /// [`Floor::stop`], waiting at most `within` (longer under valgrind).
    pub async fn stop_within(mut self, within: Duration) -> Result<()> {
        crate::daemon::terminate(self.pid);
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                ensure!(status.success(), "the floor server exited with {status}");
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("the floor server did not stop within {within:?} of SIGTERM")
            }
        }
    }
}

/// `name` found on `PATH`, as an absolute path (commands run with a cleared environment).
pub fn find_program(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

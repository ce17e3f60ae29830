//! Scenario 8's SQL-API endpoint: the Rust "create payment" example (`examples/rust-payments`,
//! `POST /payments` on `claim()`, the payment insert, `enqueue_event()`, `complete()`), set up as
//! examples/README.md tells a service owner to (its own login role with the two GRANTs, its
//! table from `examples/payments.sql` owned by that role), and run as a process of its own — this
//! benchmark binary re-executed with `--serve-payments` — so its CPU is read from /proc like the
//! daemon's. Also its requests: new keys, and replays of a set of payments made through it first.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use serde_json::json;
use tokio::process::{Child, Command};

use crate::http_load::{Conn, Expect, Make};
use crate::seed::{token, PRINCIPALS};
use crate::server::Server;

/// The business table and its body function, as the README has the administrator load them.
const PAYMENTS_SQL: &str = include_str!("../../examples/payments.sql");
/// The operation the Rust payments example claims in.
const OPERATION: &str = "create-payment";
/// How long a claim waits for an in-flight owner: the daemon's default `api.claim_lock_timeout`.
const LOCK_TIMEOUT: &str = "2 seconds";
/// How long a key replays: the daemon's default `retention.replay_window`.
const REPLAY_WINDOW: &str = "24 hours";
/// The claim both sides' claims carry (scenario 4's amount and recipient).
const AMOUNT: &str = "123.45";
const PAYEE: &str = "Customer 77 <customer77@example.com>";

/// The service's login role, made once per run and dropped after its databases.
pub struct Role {
    /// Its name.
    pub name: String,
    password: String,
}

impl Role {
    /// `CREATE ROLE ... LOGIN PASSWORD` (the README's first line).
    pub async fn create(server: &Server) -> Result<Role> {
        // Names and password are the benchmark's own ([a-z0-9_]), so they can be spelled into the
        // utility statements that take no parameters.
        let role = Role {
            name: server.db_name("payments_service"),
            password: uuid::Uuid::new_v4().simple().to_string(),
        };
        let admin = server.admin().await?;
        admin
            .batch_execute(&format!(
                "DROP ROLE IF EXISTS {0}; CREATE ROLE {0} LOGIN PASSWORD '{1}'",
                role.name, role.password
            ))
            .await
            .context(
                "creating the payments service's role (the benchmark's role needs CREATEROLE)",
            )?;
        Ok(role)
    }

    /// The README's GRANTs, the operation and the business table in database `db` (an
    /// administrator's session).
    pub async fn set_up(&self, server: &Server, db: &str) -> Result<()> {
        let admin = server.connect(db).await?;
        admin
            .batch_execute(&format!(
                "GRANT USAGE ON SCHEMA tombstoned TO {role};
                 GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tombstoned TO {role};
                 SET search_path = public;
                 {PAYMENTS_SQL}
                 ALTER TABLE payments OWNER TO {role};
                 ALTER FUNCTION payment_body(payments) OWNER TO {role};
                 RESET search_path;",
                role = self.name
            ))
            .await
            .with_context(|| format!("setting up the payments service in {db}"))?;
        // Its operation, as examples/README.md has the operator grant it (issue 36).
        let vars = vec![("TOMBSTONED_DATABASE_URL".to_owned(), server.url(db))];
        let config = tombstoned::config::Config::load_from(None, vars, &[])?;
        let session = tombstoned::db::connect(&config.database, "bench-operations").await?;
        tombstoned::operations::grant(
            &session.conn(),
            &tombstoned::operations::Operation::parse(OPERATION)?,
            &self.name,
            false,
        )
        .await
        .with_context(|| format!("granting {OPERATION} to the payments service in {db}"))?;
        Ok(())
    }

    /// The service's `DATABASE_URL` for `db`.
    pub fn url(&self, server: &Server, db: &str) -> String {
        server.url_as(db, &self.name, &self.password)
    }

    /// Drops the role (its databases first: they hold its grants and table).
    pub async fn drop(self, server: &Server) -> Result<()> {
        let admin = server.admin().await?;
        admin
            .batch_execute(&format!("DROP ROLE IF EXISTS {}", self.name))
            .await?;
        Ok(())
    }
}

/// `PAYMENTS_TOKENS`: the daemon's bearer tokens ([`token`]), each for the same tenant and
/// principal as in the daemon's tokens file, so both endpoints claim in the same scopes.
fn tokens_json() -> String {
    let tokens: serde_json::Map<String, serde_json::Value> = (0..PRINCIPALS)
        .map(|p| {
            (
                token(p),
                json!({"tenant": format!("tenant-{}", p / 4), "principal": format!("principal-{p}")}),
            )
        })
        .collect();
    serde_json::Value::Object(tokens).to_string()
}

/// The re-executed benchmark's side (`--serve-payments`): `rust_payments::run` on `listen` with a
/// pool of `pool_size` sessions, on a default multi-threaded runtime (the example's
/// `#[tokio::main]`), until the process is killed.
pub fn serve(listen: SocketAddr, database_url: &str, pool_size: usize) -> Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting a runtime")?;
    runtime.block_on(async {
        let settings = rust_payments::Settings::new(&tokens_json(), LOCK_TIMEOUT, REPLAY_WINDOW)
            .map_err(anyhow::Error::msg)?;
        let pool = rust_payments::pool(database_url).map_err(anyhow::Error::msg)?;
        // The example's pool holds 8; the daemon under comparison gets 16.
        pool.resize(pool_size);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        rust_payments::run(listener, pool, settings).await?;
        Ok(())
    })
}

/// A running payments service process.
pub struct PaymentsService {
    child: Child,
    /// Its address.
    pub addr: SocketAddr,
    /// Its process id (CPU from /proc).
    pub pid: u32,
}

impl PaymentsService {
    /// Re-executes this benchmark as the service on `database_url` with `pool_size` sessions
    /// and waits until it answers.
    pub async fn start(database_url: &str, pool_size: usize) -> Result<PaymentsService> {
        let port = tombstoned::pg_cluster::free_loopback_port()?;
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let exe = std::env::current_exe().context("the benchmark's own path")?;
        let child = Command::new(exe)
            .arg("--serve-payments")
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--database-url")
            .arg(database_url)
            .arg("--pool-size")
            .arg(pool_size.to_string())
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting the payments service")?;
        let pid = child.id().context("the payments service exited at once")?;
        let mut service = PaymentsService { child, addr, pid };
        service.wait_ready().await?;
        Ok(service)
    }

    /// Until a request without a token gets the service's 401.
    async fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the payments service exited during start-up: {status}");
            }
            if let Ok(mut conn) = Conn::connect(self.addr).await {
                let request = hyper::Request::post("/payments")
                    .header(hyper::header::HOST, "127.0.0.1")
                    .body(http_body_util::Full::new(hyper::body::Bytes::new()))?;
                if let Ok(response) = conn.send(request).await {
                    if response.status == 401 {
                        return Ok(());
                    }
                }
            }
            if started.elapsed() > Duration::from_secs(30) {
                bail!("the payments service did not answer within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ends the process (the example has no graceful shutdown: it serves until killed).
    pub async fn stop(mut self) -> Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// `POST /payments` with a bearer token, an idempotency key and a JSON body.
fn post_payment(
    token: &str,
    key: &str,
    request_id: &str,
) -> hyper::Request<http_body_util::Full<hyper::body::Bytes>> {
    let body = json!({
        "request_id": request_id,
        "amount": AMOUNT,
        "currency": "EUR",
        "payee": PAYEE,
    })
    .to_string();
    hyper::Request::post("/payments")
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header("idempotency-key", key)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
        .expect("a request built from valid header values")
}

/// Payment `i` of the replay set: principal 0's, as the daemon's replay set is.
fn replay_record(i: i64) -> (String, String) {
    (format!("s8-pay-{i}"), format!("s8-req-{i}"))
}

/// Client `c` claims a new key as principal `c % 16` (as scenario 4's clients do).
pub fn claims() -> Make {
    Arc::new(|c, _rng| {
        let key = uuid::Uuid::new_v4().to_string();
        let request_id = uuid::Uuid::new_v4().to_string();
        (
            post_payment(&token(c as i64 % PRINCIPALS), &key, &request_id),
            Expect::Created,
            "claim",
        )
    })
}

/// A random payment of the replay set, as the same request again.
pub fn replays(keys: i64) -> Make {
    Arc::new(move |_c, rng| {
        let (key, request_id) = replay_record(rng.between(1, keys));
        (
            post_payment(&token(0), &key, &request_id),
            Expect::Replayed(request_id),
            "replay",
        )
    })
}

/// Makes the replay set's `keys` payments through the service itself (16 clients), each a 201
/// that is not a replay. Returns how long it took.
pub async fn seed_replay_set(addr: SocketAddr, keys: i64) -> Result<Duration> {
    const CLIENTS: usize = 16;
    let started = Instant::now();
    let next = Arc::new(AtomicI64::new(1));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let next = next.clone();
        let mut conn = Conn::connect(addr).await?;
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i > keys {
                    return anyhow::Ok(());
                }
                let (key, request_id) = replay_record(i);
                let response = conn
                    .send(post_payment(&token(0), &key, &request_id))
                    .await?;
                ensure!(
                    response.status == 201 && !response.replayed,
                    "seeding payment {i}: status {}, {}",
                    response.status,
                    String::from_utf8_lossy(&response.body)
                );
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(started.elapsed())
}

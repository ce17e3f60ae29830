//! Helpers for the API tests: a real server on 127.0.0.1:0 in this process (the library's
//! `serve`), a tokens file of its own, a reqwest client, and database counters.

#![allow(dead_code)] // each API test module uses a different subset

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use reqwest::header::HeaderMap;
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tombstoned::auth::token_digest_hex;
use tombstoned::config::Config;
use tombstoned::http::{self, ApiError, ApiState};
use tombstoned::metrics::Metrics;

use crate::harness::TestDb;

/// acme/alice: create + read, approval limit 5000.00 CNY and 700.00 USD.
pub const ALICE: &str = "token-acme-alice";
/// acme/bob: create + read, no limit.
pub const BOB: &str = "token-acme-bob";
/// globex/alice: same principal name as ALICE, other tenant.
pub const GLOBEX_ALICE: &str = "token-globex-alice";
/// acme/reader: read only.
pub const READER: &str = "token-acme-reader";
/// acme/writer: create only.
pub const WRITER: &str = "token-acme-writer";

/// The tokens file every test server starts with.
pub fn default_tokens() -> String {
    let entry = |token: &str, tenant: &str, principal: &str, extra: &str| {
        format!(
            "[[token]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\nprincipal = \"{principal}\"\n{extra}\n\n",
            token_digest_hex(token)
        )
    };
    [
        entry(
            ALICE,
            "acme",
            "alice",
            "permissions = [\"orders:create\", \"orders:read\"]\napproval_limit = [\"5000.00 CNY\", \"700.00 USD\"]",
        ),
        entry(BOB, "acme", "bob", "permissions = [\"orders:create\", \"orders:read\"]"),
        entry(
            GLOBEX_ALICE,
            "globex",
            "alice",
            "permissions = [\"orders:create\", \"orders:read\"]",
        ),
        entry(READER, "acme", "reader", "permissions = [\"orders:read\"]"),
        entry(WRITER, "acme", "writer", "permissions = [\"orders:create\"]"),
    ]
    .concat()
}

/// A typical order body.
pub fn order(request_id: &str) -> Value {
    json!({
        "request_id": request_id,
        "amount": "100.00",
        "item": "book",
        "recipient": "reader@example.com",
    })
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// Headers.
    pub headers: HeaderMap,
    /// Body text, exactly as received.
    pub text: String,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text))
    }

    /// The short problem type name (the end of the `type` URI), or "" for a non-problem.
    pub fn problem(&self) -> String {
        self.json()["type"]
            .as_str()
            .and_then(|t| t.rsplit(':').next())
            .unwrap_or_default()
            .to_owned()
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Whether `Idempotent-Replayed: true` is present.
    pub fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }

    /// Panics unless the status is `status`, showing the body.
    pub fn expect(&self, status: u16) -> &Self {
        assert_eq!(self.status, status, "body: {}", self.text);
        self
    }
}

/// A running API server.
pub struct TestApi {
    /// Its database.
    pub db: TestDb,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// The client.
    pub http: reqwest::Client,
    /// The state (reload, metrics).
    pub state: ApiState,
    /// The metrics it feeds.
    pub metrics: Arc<Metrics>,
    /// Its tokens file.
    pub tokens_path: PathBuf,
    /// The configuration it started with.
    pub config: Config,
    dir: tempfile::TempDir,
    shutdown: CancellationToken,
    server: Option<JoinHandle<Result<(), ApiError>>>,
}

impl TestApi {
    /// A server with generous rate limits.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// A server with `TOMBSTONED_*` overrides (rate limits default to 100000/s).
    pub async fn start_with(env: &[(&str, &str)]) -> Self {
        let db = TestDb::new().await;
        Self::start_on(db, env).await
    }

    /// A server on an existing database.
    pub async fn start_on(db: TestDb, env: &[(&str, &str)]) -> Self {
        Self::start_custom(db, env, |_| {}).await
    }

    /// A server whose configuration `edit` adjusts after loading (e.g. the database URL, which
    /// the harness itself sets from the environment).
    pub async fn start_custom(
        db: TestDb,
        env: &[(&str, &str)],
        edit: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let tokens_path = dir.path().join("tokens.toml");
        std::fs::write(&tokens_path, default_tokens()).unwrap();
        let tokens = tokens_path.to_str().unwrap().to_owned();
        let mut vars: Vec<(&str, &str)> = [
            ("TOMBSTONED_API__TOKENS_FILE", tokens.as_str()),
            ("TOMBSTONED_API__RATE_LIMIT_PER_SECOND", "100000"),
            ("TOMBSTONED_API__RATE_LIMIT_BURST", "100000"),
        ]
        .into_iter()
        .filter(|(k, _)| !env.iter().any(|(e, _)| e == k))
        .collect();
        vars.extend_from_slice(env);
        let mut config = db.config_with(&vars);
        edit(&mut config);
        let metrics = Arc::new(Metrics::new().unwrap());
        let state = ApiState::new(&config, Arc::clone(&metrics)).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(http::serve(listener, state.clone(), shutdown.clone()));
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()
            .unwrap();
        Self {
            db,
            base,
            http,
            state,
            metrics,
            tokens_path,
            config,
            dir,
            shutdown,
            server: Some(server),
        }
    }

    /// Reads a response whole.
    pub async fn reply(response: reqwest::Response) -> Reply {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        Reply {
            status,
            headers,
            text,
        }
    }

    /// `POST /v1/orders` with a JSON body.
    pub async fn post(&self, token: &str, key: &str, body: &Value) -> Reply {
        self.post_raw(
            Some(token),
            &[
                ("idempotency-key", key.as_bytes()),
                ("content-type", b"application/json"),
            ],
            body.to_string().into_bytes(),
        )
        .await
    }

    /// `POST /v1/orders` with exactly these headers and bytes.
    pub async fn post_raw(
        &self,
        token: Option<&str>,
        headers: &[(&str, &[u8])],
        body: Vec<u8>,
    ) -> Reply {
        let mut request = self.http.post(format!("{}/v1/orders", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(
                *name,
                reqwest::header::HeaderValue::from_bytes(value).unwrap(),
            );
        }
        Self::reply(request.body(body).send().await.unwrap()).await
    }

    /// `GET <path>`.
    pub async fn get(&self, token: Option<&str>, path: &str) -> Reply {
        let mut request = self.http.get(format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        Self::reply(request.send().await.unwrap()).await
    }

    /// `SELECT count(*) FROM <table>` (table names are fixed in the tests).
    pub async fn count(&self, table: &str) -> i64 {
        let client = self.db.client().await;
        client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0)
    }

    /// (records, orders, outbox events).
    pub async fn counts(&self) -> (i64, i64, i64) {
        (
            self.count("idempotency_records").await,
            self.count("orders").await,
            self.count("outbox_events").await,
        )
    }

    /// Replaces the tokens file.
    pub fn write_tokens(&self, text: &str) {
        let mut f = std::fs::File::create(&self.tokens_path).unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    /// Reloads with the configuration the server started with (re-reading the tokens file).
    pub fn reload(&self) -> Result<(), ApiError> {
        self.state.reload(&self.config)
    }

    /// The metrics text.
    pub fn metrics_text(&self) -> String {
        self.metrics.render().unwrap()
    }

    /// Stops the server gracefully and waits for it.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            server.await.unwrap().unwrap();
        }
    }
}

impl Drop for TestApi {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Polls `pg_stat_activity` until an API session (`tombstoned/api`) waits on a lock held by
/// backend `blocker` (per `pg_blocking_pids`); returns the waiting session's pid.
pub async fn wait_until_api_blocked_by(
    observer: &tokio_postgres::Client,
    blocker: i32,
    timeout: std::time::Duration,
) -> i32 {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let row = observer
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                 WHERE application_name = 'tombstoned/api' AND wait_event_type = 'Lock'
                   AND $1 = ANY (pg_blocking_pids(pid))
                 LIMIT 1",
                &[&blocker],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            return row.get(0);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no API session waited on backend {blocker} within {timeout:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The backend pid of a session.
pub async fn backend_pid(client: &tokio_postgres::Client) -> i32 {
    client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

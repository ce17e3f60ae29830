//! Shared test helpers: one real PostgreSQL per test process, one fresh database per test, and
//! barriers that wait on what PostgreSQL reports (never on sleeps that hope a race happened).
//!
//! Without `TOMBSTONED_TEST_DATABASE_URL` the harness starts a throwaway cluster with the server
//! binaries it finds (see `tombstoned::pg_cluster`), migrates a template database once, and
//! clones it for every test (`CREATE DATABASE ... TEMPLATE`), so tests run in parallel without
//! seeing each other's rows. With the variable set, it does the same on that server (the URL
//! must name a role allowed to create databases); test databases are named `tombstoned_test_*`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::cluster::ClusterOptionsTestExt as _;
use tokio_postgres::{Client, NoTls};
use tombstoned::config::Config;
use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned::schema::migrations;

use crate::cluster::conninfo_for_database;

struct Harness {
    admin: tokio_postgres::Config,
    template: String,
    cluster: Option<ThrowawayCluster>,
}

static HARNESS: OnceLock<Harness> = OnceLock::new();
static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

fn harness() -> &'static Harness {
    // Initialised on a thread of its own: tests run inside tokio runtimes, which cannot block on
    // another runtime.
    HARNESS.get_or_init(|| {
        std::thread::spawn(init)
            .join()
            .unwrap_or_else(|_| panic!("test harness initialisation panicked"))
    })
}

fn init() -> Harness {
    let (admin, cluster) = match std::env::var("TOMBSTONED_TEST_DATABASE_URL") {
        Ok(url) => (
            url.parse::<tokio_postgres::Config>()
                .expect("TOMBSTONED_TEST_DATABASE_URL is not a valid connection string"),
            None,
        ),
        Err(_) => {
            let cluster = ThrowawayCluster::start(&ClusterOptions::for_tests())
                .unwrap_or_else(|e| panic!("cannot start a throwaway PostgreSQL: {e}"));
            let admin = cluster.url("postgres").parse().expect("cluster URL");
            (admin, Some(cluster))
        }
    };
    let template = format!("tombstoned_tpl_{}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = connect_config(&admin).await;
        for sql in [
            format!("DROP DATABASE IF EXISTS {template}"),
            format!("CREATE DATABASE {template}"),
        ] {
            client
                .batch_execute(&sql)
                .await
                .expect("create template database");
        }
        let config = config_for(&conninfo_for_database(&admin, &template), &[]);
        migrations::migrate(&config.database)
            .await
            .expect("migrate the template database");
    });
    Harness {
        admin,
        template,
        cluster,
    }
}

/// The server the harness creates test databases on (host, port and the admin role).
pub fn server() -> &'static tokio_postgres::Config {
    &harness().admin
}

/// The throwaway cluster, when the harness started one (fault tests restart it).
pub fn cluster() -> Option<&'static ThrowawayCluster> {
    harness().cluster.as_ref()
}

async fn connect_config(config: &tokio_postgres::Config) -> Client {
    let (client, connection) = config.connect(NoTls).await.expect("connect to PostgreSQL");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A configuration pointing at `url`, with `TOMBSTONED_*` style overrides, e.g.
/// `[("TOMBSTONED_CLEANUP__BATCH_SIZE", "10")]`.
pub fn config_for(url: &str, env: &[(&str, &str)]) -> Config {
    // The URL first, so a test's own TOMBSTONED_DATABASE_URL (later entries win) overrides it.
    let mut vars = vec![("TOMBSTONED_DATABASE_URL".to_owned(), url.to_owned())];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::load_from(None, vars, &[]).expect("test configuration")
}

/// A database of a test's own.
pub struct TestDb {
    /// Its name.
    pub name: String,
    /// Connection string (key=value form).
    pub url: String,
}

impl TestDb {
    /// A fresh database with the current schema, cloned from the migrated template.
    pub async fn new() -> Self {
        let template = harness().template.clone();
        Self::create(&format!("TEMPLATE {template}")).await
    }

    /// A fresh database without the schema (for migration tests).
    pub async fn empty() -> Self {
        Self::create("TEMPLATE template0").await
    }

    async fn create(clause: &str) -> Self {
        let h = harness();
        let name = format!(
            "tombstoned_test_{}_{}",
            std::process::id(),
            NEXT_DB.fetch_add(1, Ordering::Relaxed)
        );
        let admin = connect_config(&h.admin).await;
        admin
            .batch_execute(&format!("CREATE DATABASE {name} {clause}"))
            .await
            .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
        let url = conninfo_for_database(&h.admin, &name);
        Self { name, url }
    }

    /// The default configuration, pointed at this database.
    pub fn config(&self) -> Config {
        config_for(&self.url, &[])
    }

    /// The configuration with `TOMBSTONED_*` overrides.
    pub fn config_with(&self, env: &[(&str, &str)]) -> Config {
        config_for(&self.url, env)
    }

    /// A raw direct session with `search_path` set to the schema, so tests' own SQL can leave
    /// it unqualified (the daemon's statements name it instead; nothing set on its sessions).
    pub async fn client(&self) -> Client {
        let config = self.config();
        let mut pg = tombstoned::db::pg_config(&config.database, "test");
        pg.options(format!("-c search_path={}", config.database.schema));
        connect_config(&pg).await
    }
}

/// Polls `pg_stat_activity` (from `observer`) until backend `pid` waits on a heavyweight lock
/// (`wait_event_type = 'Lock'`): the barrier that proves a session is blocked where the test
/// says it is. Panics after `timeout`.
pub async fn wait_until_lock_wait(observer: &Client, pid: i32, timeout: Duration) {
    wait_until(
        observer,
        timeout,
        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
        pid,
    )
    .await
    .unwrap_or_else(|| panic!("backend {pid} never waited on a lock within {timeout:?}"));
}

/// Polls `pg_stat_activity` until backend `pid` sits in an open transaction, waiting for its
/// client (`state = 'idle in transaction'`): the barrier that proves a session holds what its
/// transaction took (an uncommitted claim, a row lock) while the test looks. Panics after
/// `timeout`.
pub async fn wait_until_idle_in_transaction(observer: &Client, pid: i32, timeout: Duration) {
    wait_until(
        observer,
        timeout,
        "SELECT state = 'idle in transaction' FROM pg_stat_activity WHERE pid = $1",
        pid,
    )
    .await
    .unwrap_or_else(|| panic!("backend {pid} never sat idle in a transaction within {timeout:?}"));
}

/// Polls until some backend of the observer's database whose `application_name` starts with
/// `prefix` waits on a lock; returns its pid. (Other tests' databases never match.)
pub async fn wait_until_app_lock_wait(observer: &Client, prefix: &str, timeout: Duration) -> i32 {
    let deadline = Instant::now() + timeout;
    loop {
        let row = observer
            .query_opt(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name LIKE $1 || '%' AND wait_event_type = 'Lock' \
                   AND datname = current_database() LIMIT 1",
                &[&prefix],
            )
            .await
            .expect("query pg_stat_activity");
        if let Some(row) = row {
            return row.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "no session of {prefix} waited on a lock within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn wait_until(observer: &Client, timeout: Duration, sql: &str, pid: i32) -> Option<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let row = observer
            .query_opt(sql, &[&pid])
            .await
            .expect("poll pg_stat_activity");
        if let Some(row) = row {
            if row.get::<_, Option<bool>>(0) == Some(true) {
                return Some(());
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A loopback listener that accepts connections and never sends a byte: a database host
/// that hangs (the port and the task holding the accepted sockets).
pub async fn silent_listener() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (port, task)
}

/// When the daemon logged the first line of `log` (its stderr, text format: each line starts with
/// an RFC 3339 timestamp) that contains `needle`, by the daemon's clock; `None` while there is
/// none. Durations between two such lines are the daemon's own: a stall of the test process that
/// reads them later does not stretch them.
pub fn logged_at(log: &str, needle: &str) -> Option<std::time::SystemTime> {
    let line = log.lines().find(|l| l.contains(needle))?;
    let stamp = line.split_whitespace().next()?;
    let at = chrono::DateTime::parse_from_rfc3339(stamp)
        .unwrap_or_else(|e| panic!("{e}: the timestamp of {line:?}"));
    Some(at.into())
}

//! The real `tombstoned serve` process: a configuration file and tokens file in a temporary
//! directory, free loopback ports, stderr captured for inspection, readiness awaited on
//! `/readyz`, and the signals the faults need (SIGKILL, SIGHUP, SIGTERM). Also a dedicated
//! throwaway PostgreSQL for tests that stop or restart the server.

#![allow(dead_code)] // each test module uses a different subset

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};
use tokio_postgres::{Client, NoTls};
use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};
use tombstoned_testkit::cluster::{ClusterOptionsTestExt as _, ClusterTestExt as _};

use crate::harness;

/// The shipped example tokens (config/tokens.toml) and the principals they stand for.
pub const ALICE: &str = "example-acme-alice-token"; // acme/alice, limit 5000.00 CNY
pub const BOB: &str = "example-acme-bob-token"; // acme/bob, no limit
pub const CAROL: &str = "example-globex-carol-token"; // globex/carol
pub const AUDITOR: &str = "example-acme-auditor-token"; // acme/auditor, read only

/// The shipped example tokens file.
pub fn example_tokens() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/tokens.toml"))
        .expect("config/tokens.toml")
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    tombstoned::pg_cluster::free_loopback_port().unwrap()
}

/// How a daemon is configured: the database, settings `section.key = <TOML value>` on top of
/// test defaults, the tokens file, and logging.
#[derive(Clone)]
pub struct DaemonSpec {
    /// The database URL (`TOMBSTONED_DATABASE_URL`).
    pub url: String,
    /// `(section, key, TOML value)`, e.g. `("cleanup", "batch_size", "50")`.
    pub settings: Vec<(&'static str, &'static str, String)>,
    /// The tokens file's text.
    pub tokens: String,
    /// `RUST_LOG`.
    pub rust_log: String,
    /// `--log-format json`.
    pub json_logs: bool,
    /// Starts the daemon under `prlimit --nofile=N:N` (util-linux), as systemd's default limit
    /// or a unit's `LimitNOFILE=` would.
    pub nofile: Option<u64>,
}

impl DaemonSpec {
    /// Defaults for tests: cleanup every second, generous rate limits, the example tokens.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            settings: Vec::new(),
            tokens: example_tokens(),
            rust_log: "info".into(),
            json_logs: false,
            nofile: None,
        }
    }

    /// Sets `section.key` to a TOML value (strings must be quoted: `"\"3s\""`).
    pub fn set(mut self, section: &'static str, key: &'static str, value: &str) -> Self {
        self.settings
            .retain(|(s, k, _)| !(*s == section && *k == key));
        self.settings.push((section, key, value.to_owned()));
        self
    }

    fn config_text(&self, api_port: u16, metrics_port: u16) -> String {
        let mut table: toml::Table = toml::from_str(&format!(
            r#"
            [database]
            pool_size = 16
            connect_timeout = "2s"
            [retention]
            replay_window = "24h"
            [cleanup]
            schedule = "* * * * * *"
            batch_size = 100
            lock_timeout = "1s"
            statement_timeout = "10s"
            [api]
            listen = "127.0.0.1:{api_port}"
            rate_limit_per_second = 1000000
            rate_limit_burst = 1000000
            tokens_file = "tokens.toml"
            [metrics]
            listen = "127.0.0.1:{metrics_port}"
            "#
        ))
        .unwrap();
        for (section, key, value) in &self.settings {
            let value: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
                .unwrap_or_else(|e| panic!("{section}.{key} = {value}: {e}"))
                .remove("v")
                .unwrap();
            table
                .entry(section.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .unwrap()
                .insert(key.to_string(), value);
        }
        toml::to_string(&table).unwrap()
    }
}

/// A running (or killed, restartable) `tombstoned serve`.
pub struct Daemon {
    spec: DaemonSpec,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:<api port>`.
    pub api: String,
    /// `http://127.0.0.1:<metrics port>`.
    pub ops: String,
    /// The configuration file.
    pub config_path: PathBuf,
    /// The tokens file.
    pub tokens_path: PathBuf,
    stderr: Arc<Mutex<String>>,
    /// Starts so far (restarts included).
    pub starts: usize,
}

impl Daemon {
    /// Writes the files, starts the process and waits until `/readyz` answers 200.
    pub async fn start(spec: DaemonSpec) -> Daemon {
        let mut daemon = Self::launch(spec).await;
        daemon.wait_ready(Duration::from_secs(60)).await;
        daemon
    }

    /// Writes the files and starts the process, without waiting for readiness (for daemons
    /// that are not meant to become ready, or whose start-up a test times).
    pub async fn launch(spec: DaemonSpec) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let (api_port, metrics_port) = (free_port(), free_port());
        let config_path = dir.path().join("tombstoned.toml");
        let tokens_path = dir.path().join("tokens.toml");
        std::fs::write(&config_path, spec.config_text(api_port, metrics_port)).unwrap();
        std::fs::write(&tokens_path, &spec.tokens).unwrap();
        let mut daemon = Daemon {
            spec,
            child: None,
            dir,
            api: format!("http://127.0.0.1:{api_port}"),
            ops: format!("http://127.0.0.1:{metrics_port}"),
            config_path,
            tokens_path,
            stderr: Arc::new(Mutex::new(String::new())),
            starts: 0,
        };
        daemon.spawn();
        daemon
    }

    /// Starts the process again (after [`Self::sigkill`] or [`Self::terminate`]) with the same
    /// files and ports, and waits for readiness.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
        self.wait_ready(Duration::from_secs(60)).await;
    }

    fn spawn(&mut self) {
        let mut command = match self.spec.nofile {
            // prlimit sets the limit on itself and execs the daemon: same process id.
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(harness::binary());
                c
            }
            None => Command::new(harness::binary()),
        };
        command.arg("--config").arg(&self.config_path);
        if self.spec.json_logs {
            command.args(["--log-format", "json"]);
        }
        command.arg("serve");
        for (name, _) in std::env::vars() {
            if name.starts_with("TOMBSTONED_") || name == "NOTIFY_SOCKET" || name == "RUST_LOG" {
                command.env_remove(name);
            }
        }
        command
            .env("TOMBSTONED_DATABASE_URL", &self.spec.url)
            .env("RUST_LOG", &self.spec.rust_log)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("start tombstoned serve");
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&self.stderr);
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        self.child = Some(child);
        self.starts += 1;
    }

    /// Polls `/readyz` until 200; panics (with the daemon's stderr) on timeout or exit.
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = http.get(format!("{}/readyz", self.ops)).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "tombstoned serve exited with {status} before it was ready:\n{}",
                    self.stderr()
                );
            }
            assert!(
                Instant::now() < deadline,
                "tombstoned serve not ready within {timeout:?}:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process id.
    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("running").id().unwrap() as i32)
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGKILL, and waits for the process to be gone.
    pub async fn sigkill(&mut self) {
        let mut child = self.child.take().expect("running");
        kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGKILL).unwrap();
        let status = child.wait().await.unwrap();
        assert!(!status.success());
    }

    /// SIGHUP (reload).
    pub fn sighup(&self) {
        kill(self.pid(), Signal::SIGHUP).unwrap();
    }

    /// SIGTERM, and waits (bounded) for the exit status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        kill(Pid::from_raw(child.id().unwrap() as i32), Signal::SIGTERM).unwrap();
        tokio::time::timeout(Duration::from_secs(30), child.wait())
            .await
            .unwrap_or_else(|_| panic!("no exit within 30 s of SIGTERM:\n{}", self.stderr()))
            .unwrap()
    }

    /// Everything the process(es) wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Replaces the tokens file (takes effect at the next SIGHUP).
    pub fn write_tokens(&self, text: &str) {
        std::fs::write(&self.tokens_path, text).unwrap();
    }

    /// The `/metrics` text.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.ops))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The value of one sample line of `/metrics` (`name{labels}` exactly); panics when the
    /// series is absent (a typo, or a label set the daemon never renders).
    pub async fn metric(&self, series: &str) -> f64 {
        sample(&self.metrics().await, series)
    }

    /// The temporary directory holding the files.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// The value of `series` (`name{labels}` exactly as rendered) in a Prometheus text, `None` if
/// absent.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// [`metric_value`] for a series that must be there: panics, naming it, when it is absent, so a
/// check like `== 0.0` cannot pass on a misspelt series.
pub fn sample(text: &str, series: &str) -> f64 {
    metric_value(text, series).unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

/// A direct session on `url` with `search_path` set to the schema, for the tests' own SQL.
pub async fn connect(url: &str, purpose: &str) -> Client {
    let config = harness::config_for(url, &[]);
    let mut pg = tombstoned::db::pg_config(&config.database, purpose);
    // For the tests' own unqualified SQL; the daemon's statements name the schema.
    pg.options(format!("-c search_path={}", config.database.schema));
    let (client, connection) = pg.connect(NoTls).await.expect("connect");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// A PostgreSQL of a test's own, for faults that stop or restart the server (the harness's
/// shared cluster serves every other test running in parallel). It always runs: with
/// `TOMBSTONED_TEST_DATABASE_URL` set, these tests still start their own local cluster.
pub struct OwnCluster {
    /// The cluster.
    pub cluster: ThrowawayCluster,
    /// The migrated database's URL.
    pub url: String,
}

impl OwnCluster {
    /// Starts a cluster, creates a database and migrates it.
    pub async fn start() -> OwnCluster {
        let cluster = tokio::task::spawn_blocking(|| {
            ThrowawayCluster::start(&ClusterOptions::for_tests())
                .unwrap_or_else(|e| panic!("cannot start a throwaway PostgreSQL: {e}"))
        })
        .await
        .unwrap();
        let admin = connect(&cluster.url("postgres"), "test").await;
        admin
            .batch_execute("CREATE DATABASE fault")
            .await
            .expect("create database");
        let url = cluster.url("fault");
        tombstoned::schema::migrations::migrate(&harness::config_for(&url, &[]).database)
            .await
            .expect("migrate");
        OwnCluster { cluster, url }
    }

    /// `pg_ctl restart -m fast`.
    pub async fn restart(&self) {
        block(|| self.cluster.restart()).await;
    }

    /// `pg_ctl stop -m fast`.
    pub async fn stop_server(&self) {
        block(|| self.cluster.stop_server()).await;
    }

    /// `pg_ctl start`.
    pub async fn start_server(&self) {
        block(|| self.cluster.start_server()).await;
    }
}

/// Runs a blocking `pg_ctl` call without stalling the runtime's other tasks (multi-threaded
/// runtime only).
async fn block(f: impl FnOnce() -> Result<(), tombstoned_testkit::cluster::ClusterControlError>) {
    tokio::task::block_in_place(|| f().expect("pg_ctl"));
}

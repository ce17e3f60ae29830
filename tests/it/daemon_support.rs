//! Helpers for the daemon lifecycle tests: the real `tombstoned serve` as a child process with a
//! configuration file of its own (free loopback ports, the shipped example tokens), its log on
//! disk, signals, a scripted HTTP client, and a real unix datagram socket standing in for
//! systemd's `NOTIFY_SOCKET`.

#![allow(dead_code)] // each daemon test uses a different subset

use std::io::IoSliceMut;
use std::os::unix::io::AsRawFd as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};
use nix::sys::time::TimeVal;
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::Interest;

use crate::api_support::{Reply, TestApi};
use crate::harness::binary;
use crate::ops_support::{free_port, repo_root};

/// How long start-up, a reload or a shutdown may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// The example tokens of `config/tokens.toml`.
pub const ALICE: &str = "example-acme-alice-token";
/// acme/bob, create and read, no approval limit.
pub const BOB: &str = "example-acme-bob-token";

/// What to start.
#[derive(Debug, Clone)]
pub struct Spec {
    /// `TOMBSTONED_DATABASE_URL`.
    pub database_url: String,
    /// Configuration sections on top of the listeners and the tokens file, e.g.
    /// `[cleanup]\nschedule = "* * * * * *"`.
    pub config: String,
    /// Extra environment (the child's environment is otherwise empty).
    pub env: Vec<(String, String)>,
    /// Global flags before `serve`, e.g. `--log-format json`.
    pub flags: Vec<String>,
}

impl Spec {
    /// A daemon on `database_url` with the default settings (cleanup every 5 minutes).
    pub fn new(database_url: &str) -> Self {
        Spec {
            database_url: database_url.to_owned(),
            config: String::new(),
            env: Vec::new(),
            flags: Vec::new(),
        }
    }

    /// Adds configuration sections (TOML).
    pub fn config(mut self, toml: &str) -> Self {
        self.config.push_str(toml);
        self.config.push('\n');
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Adds a global flag.
    pub fn flag(mut self, flag: &str) -> Self {
        self.flags.push(flag.to_owned());
        self
    }
}

/// A running `tombstoned serve`. Killed (SIGKILL) if the test ends without stopping it.
pub struct Daemon {
    child: tokio::process::Child,
    /// Its process id.
    pub pid: i32,
    /// `http://127.0.0.1:<api port>`.
    pub api: String,
    /// `http://127.0.0.1:<metrics port>`.
    pub ops: String,
    /// The API port.
    pub api_port: u16,
    /// The metrics port.
    pub ops_port: u16,
    /// The configuration file (rewrite it and send SIGHUP to reload).
    pub config_path: PathBuf,
    /// The tokens file next to it.
    pub tokens_path: PathBuf,
    /// Everything the daemon wrote to stderr (its log).
    pub log_path: PathBuf,
    /// A client without connection reuse, so that every request is a fresh connection.
    pub http: reqwest::Client,
    spec: Spec,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts the daemon and waits until `/readyz` answers 200.
    pub async fn start(spec: Spec) -> Daemon {
        let mut daemon = Daemon::spawn(spec).await;
        daemon.wait_ready().await;
        daemon
    }

    /// Starts the daemon without waiting for anything. A port taken between our probe and the
    /// daemon's bind shows as exit status 64 with "cannot listen": [`Daemon::wait_ready`] and
    /// [`Daemon::respawn_if_port_taken`] start it again on other ports.
    pub async fn spawn(spec: Spec) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let tokens_path = dir.path().join("tokens.toml");
        std::fs::copy(repo_root().join("config/tokens.toml"), &tokens_path).unwrap();
        let config_path = dir.path().join("tombstoned.toml");
        let log_path = dir.path().join("stderr.log");
        let (api_port, ops_port) = (free_port(), free_port());
        std::fs::write(&config_path, config_text(&spec.config, api_port, ops_port)).unwrap();
        let log = std::fs::File::create(&log_path).unwrap();
        let mut command = tokio::process::Command::new(binary());
        command
            .args(&spec.flags)
            .arg("--config")
            .arg(&config_path)
            .arg("serve")
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", &spec.database_url)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        let child = command.spawn().expect("run tombstoned serve");
        let pid = i32::try_from(child.id().unwrap()).unwrap();
        Daemon {
            child,
            pid,
            api: format!("http://127.0.0.1:{api_port}"),
            ops: format!("http://127.0.0.1:{ops_port}"),
            api_port,
            ops_port,
            config_path,
            tokens_path,
            log_path,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
            spec,
            _dir: dir,
        }
    }

    /// When the daemon exited because a port was taken, starts it again on other ports and
    /// returns true.
    pub async fn respawn_if_port_taken(&mut self) -> bool {
        let Ok(Some(status)) = self.child.try_wait() else {
            return false;
        };
        if status.code() == Some(64) && self.log().contains("cannot listen") {
            *self = Daemon::spawn(self.spec.clone()).await;
            true
        } else {
            false
        }
    }

    /// Waits until `/readyz` answers 200; fails with the log when the daemon exits first.
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if self.respawn_if_port_taken().await {
                continue;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("tombstoned serve exited with {status}:\n{}", self.log());
            }
            if let Ok(response) = self.http.get(format!("{}/readyz", self.ops)).send().await {
                if response.status() == 200 {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "not ready after {PATIENCE:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends `signal` to the daemon.
    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid), signal).expect("signal the daemon");
    }

    /// Waits for the daemon to exit; fails with its log after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => panic!(
                "tombstoned serve still running {timeout:?} later:\n{}",
                self.log()
            ),
        }
    }

    /// SIGTERM, then exit status 0 within [`PATIENCE`]; fails with the log otherwise.
    pub async fn stop(&mut self) {
        self.signal(Signal::SIGTERM);
        let status = self.wait_exit(PATIENCE).await;
        assert_eq!(status.code(), Some(0), "{}", self.log());
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Polls the log until a line contains every one of `needles`; returns that line.
    pub async fn wait_for_log(&self, needles: &[&str]) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(line) = self
                .log()
                .lines()
                .find(|line| needles.iter().all(|n| line.contains(n)))
            {
                return line.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no log line with {needles:?} after {PATIENCE:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Replaces the configuration sections (listeners and tokens file stay) for a reload.
    pub fn rewrite_config(&self, sections: &str) {
        std::fs::write(
            &self.config_path,
            config_text(sections, self.api_port, self.ops_port),
        )
        .unwrap();
    }

    /// Writes raw text as the configuration file (to test a broken one).
    pub fn write_raw_config(&self, text: &str) {
        std::fs::write(&self.config_path, text).unwrap();
    }

    /// `POST /v1/orders` with `token` and `key`.
    pub async fn create_order(&self, token: &str, key: &str, body: &Value) -> Reply {
        let response = self
            .http
            .post(format!("{}/v1/orders", self.api))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /v1/orders: {e}"));
        TestApi::reply(response).await
    }

    /// GET on the metrics listener.
    pub async fn ops_get(&self, path: &str) -> Reply {
        let response = self
            .http
            .get(format!("{}{path}", self.ops))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        TestApi::reply(response).await
    }

    /// The value of one series of `/metrics`, e.g. `tombstoned_cleanup_runs_total{outcome="success"}`.
    pub async fn metric(&self, series: &str) -> Option<f64> {
        sample(&self.ops_get("/metrics").await.text, series)
    }

    /// Polls `/metrics` until `series` has a value `ok` accepts; returns that value.
    pub async fn wait_for_metric(&self, series: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let value = self.metric(series).await;
            if let Some(accepted) = value.filter(|v| ok(*v)) {
                return accepted;
            }
            assert!(
                Instant::now() < deadline,
                "{series} is {value:?} after {PATIENCE:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The configuration file: `sections`, then the listeners and the tokens file (appended to the
/// sections of the same name when the test gives them).
fn config_text(sections: &str, api_port: u16, ops_port: u16) -> String {
    let mut table: toml::Table = sections.parse().expect("test configuration is TOML");
    let section = |table: &mut toml::Table, name: &str| -> toml::Table {
        match table.remove(name) {
            Some(toml::Value::Table(t)) => t,
            None => toml::Table::new(),
            Some(other) => panic!("[{name}] is not a table: {other}"),
        }
    };
    let mut api = section(&mut table, "api");
    api.insert("listen".into(), format!("127.0.0.1:{api_port}").into());
    api.entry("tokens_file")
        .or_insert_with(|| "tokens.toml".into());
    table.insert("api".into(), api.into());
    let mut metrics = section(&mut table, "metrics");
    metrics.insert("listen".into(), format!("127.0.0.1:{ops_port}").into());
    table.insert("metrics".into(), metrics.into());
    toml::to_string(&table).unwrap()
}

/// The value of `series` (name and labels exactly as exposed) in a text exposition.
pub fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

/// The signal that ended a process, if one did.
pub fn killed_by(status: ExitStatus) -> Option<i32> {
    status.signal()
}

/// A unix datagram socket bound where `NOTIFY_SOCKET` points, recording every message with the
/// time it arrived.
pub struct NotifySocket {
    /// The socket's path (the value for `NOTIFY_SOCKET`).
    pub path: PathBuf,
    socket: tokio::net::UnixDatagram,
    _dir: tempfile::TempDir,
}

/// One datagram from the daemon.
#[derive(Debug, Clone)]
pub struct Message {
    /// When this process received it.
    pub at: Instant,
    /// When the kernel queued it on the socket (`SO_TIMESTAMP`): the daemon's send time, however
    /// late this process got to read it.
    pub sent: SystemTime,
    /// Its text: `NAME=value` lines.
    pub text: String,
}

impl Message {
    /// Whether one of its lines is exactly `line`.
    pub fn has(&self, line: &str) -> bool {
        self.text.lines().any(|l| l == line)
    }

    /// The value of `name=` in it.
    pub fn value(&self, name: &str) -> Option<&str> {
        self.text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
    }
}

impl NotifySocket {
    /// Binds a fresh socket in a directory of its own.
    pub fn bind() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let socket = tokio::net::UnixDatagram::bind(&path).unwrap();
        setsockopt(&socket, sockopt::ReceiveTimestamp, &true).unwrap();
        NotifySocket {
            path,
            socket,
            _dir: dir,
        }
    }

    /// `("NOTIFY_SOCKET", path)`.
    pub fn env(&self) -> (&'static str, &str) {
        ("NOTIFY_SOCKET", self.path.to_str().unwrap())
    }

    /// The next message, or `None` after `timeout`.
    pub async fn recv(&self, timeout: Duration) -> Option<Message> {
        let mut buf = vec![0u8; 4096];
        let received = self.socket.async_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let mut space = nix::cmsg_space!(TimeVal);
            let msg = recvmsg::<()>(
                self.socket.as_raw_fd(),
                &mut iov,
                Some(&mut space),
                MsgFlags::MSG_DONTWAIT,
            )?;
            let stamp = msg.cmsgs()?.find_map(|c| match c {
                ControlMessageOwned::ScmTimestamp(t) => {
                    Some(UNIX_EPOCH + Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000))
                }
                _ => None,
            });
            Ok((msg.bytes, stamp))
        });
        let result = tokio::time::timeout(timeout, received).await;
        match result {
            Ok(Ok((n, stamp))) => Some(Message {
                at: Instant::now(),
                sent: stamp.expect("SO_TIMESTAMP gives every datagram its receive time"),
                text: String::from_utf8(buf[..n].to_vec()).expect("notifications are UTF-8"),
            }),
            Ok(Err(e)) => panic!("recv on NOTIFY_SOCKET: {e}"),
            Err(_) => None,
        }
    }

    /// Receives until a message satisfies `done`; returns every message received, that one
    /// last. Fails after `timeout`.
    pub async fn until(&self, timeout: Duration, done: impl Fn(&Message) -> bool) -> Vec<Message> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.recv(left).await {
                Some(m) => {
                    let stop = done(&m);
                    seen.push(m);
                    if stop {
                        return seen;
                    }
                }
                None => {
                    panic!("the awaited notification did not come in {timeout:?}; got {seen:#?}")
                }
            }
        }
    }

    /// Everything that arrives during `span`.
    pub async fn collect(&self, span: Duration) -> Vec<Message> {
        let deadline = Instant::now() + span;
        let mut seen = Vec::new();
        while let Some(m) = self
            .recv(deadline.saturating_duration_since(Instant::now()))
            .await
        {
            seen.push(m);
        }
        seen
    }
}

/// Waits for `READY=1` from `daemon` (started with `notify`'s `NOTIFY_SOCKET`), starting it again
/// when a port was taken; returns every message up to and including `READY=1`. Fails with the
/// log when the daemon exits first.
pub async fn until_ready(daemon: &mut Daemon, notify: &NotifySocket) -> Vec<Message> {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        if let Some(m) = notify.recv(Duration::from_millis(100)).await {
            let ready = m.has("READY=1");
            seen.push(m);
            if ready {
                return seen;
            }
            continue;
        }
        if daemon.respawn_if_port_taken().await {
            seen.clear();
            continue;
        }
        if !daemon.is_running() {
            panic!("tombstoned serve exited before READY=1:\n{}", daemon.log());
        }
        assert!(
            Instant::now() < deadline,
            "no READY=1 after {PATIENCE:?}; got {seen:#?}\n{}",
            daemon.log()
        );
    }
}

//! Helpers for the operations tests: an in-process metrics/health listener on a free loopback
//! port, and the Prometheus tools (which must be installed: a missing tool fails the test with
//! the command that installs it, it never skips).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tombstoned::config::DatabaseConfig;
use tombstoned::ops::listener::{self, OpsServerError, OpsState};
use tombstoned::ops::readiness::ReadinessProbe;

/// The repository root (for `config/prometheus/...`).
pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A metrics/health listener running in this process.
pub struct RunningOps {
    /// Where it listens.
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), OpsServerError>>,
}

impl RunningOps {
    /// Binds 127.0.0.1:0 and serves `state`.
    pub async fn start(state: OpsState) -> Self {
        let listener = listener::bind("127.0.0.1:0".parse().unwrap())
            .await
            .expect("bind the metrics listener");
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(listener::serve_metrics(listener, state, shutdown.clone()));
        RunningOps {
            addr,
            shutdown,
            task,
        }
    }

    /// `http://addr/path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Cancels the listener and waits for `serve_metrics` to return.
    pub async fn stop(self) -> Result<(), OpsServerError> {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("serve_metrics returns after shutdown")
            .expect("serve_metrics task panicked")
    }
}

/// A probe for `database` that asks the database on every check (tests see changes at once).
pub fn fresh_probe(database: &DatabaseConfig) -> Arc<ReadinessProbe> {
    Arc::new(ReadinessProbe::new(database.clone()).with_max_age(Duration::ZERO))
}

/// GET `url`; returns status, content type and body.
pub async fn get(url: &str) -> (u16, String, String) {
    let response = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, content_type, response.text().await.unwrap())
}

/// The path of a Prometheus tool (`prometheus`, `promtool`) on PATH, or a failure saying how
/// to install it.
pub fn prometheus_tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed (not found on PATH); these tests run the real one. \
                 Install it with `sudo apt-get install prometheus` (Debian/Ubuntu: the package \
                 provides both prometheus and promtool) or from \
                 https://prometheus.io/download/ and put it on PATH. CI (.ci/run) installs it."
            )
        })
}

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    tombstoned::pg_cluster::free_loopback_port().unwrap()
}

//! A real Prometheus server scrapes a metrics listener running in this test, a real cleanup run
//! tombstones records, and `tombstoned_cleanup_rows_tombstoned_total` is read back through
//! Prometheus's HTTP query API.
//! The server runs the shipped `config/prometheus/prometheus.yml` (targets and intervals
//! rewritten for the test), so the sample scrape configuration and the alerting rules are loaded
//! and evaluated by the real thing, against real series. `PrometheusServer` also serves the
//! dashboard test (`dashboard.rs`).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tombstoned::cleanup::{self, RunLimits};
use tombstoned::metrics::Metrics;
use tombstoned::ops::listener::OpsState;

use crate::cleanup_support::{counts, seed_live, DUE, NOT_DUE};
use crate::harness::TestDb;
use crate::ops_support::{free_port, fresh_probe, prometheus_tool, repo_root, RunningOps};

/// Generous: CI machines are slow and Prometheus opens its TSDB before it answers.
const PATIENCE: Duration = Duration::from_secs(60);

pub(crate) struct PrometheusServer {
    // Declared first: killed before the directory below is removed.
    child: tokio::process::Child,
    base: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl PrometheusServer {
    /// Starts Prometheus on a free loopback port, scraping `target` every second.
    pub(crate) async fn start(binary: &Path, target: SocketAddr) -> Self {
        // A free port can be taken between our probe and Prometheus binding it; try again then.
        let mut attempts = 0;
        loop {
            attempts += 1;
            let dir = tempfile::tempdir().unwrap();
            let config = dir.path().join("prometheus.yml");
            std::fs::write(&config, test_config(target)).unwrap();
            let log = dir.path().join("prometheus.log");
            let port = free_port();
            let log_file = std::fs::File::create(&log).unwrap();
            let child = tokio::process::Command::new(binary)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::from(log_file.try_clone().unwrap()))
                .stderr(Stdio::from(log_file))
                .kill_on_drop(true)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
            let mut server = PrometheusServer {
                child,
                base: format!("http://127.0.0.1:{port}"),
                log,
                _dir: dir,
            };
            match server.wait_ready().await {
                Ok(()) => return server,
                Err(log) if log.contains("address already in use") && attempts < 3 => continue,
                Err(log) => panic!("Prometheus did not start:\n{log}"),
            }
        }
    }

    /// Waits for `/-/ready`; on failure returns the server's log.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("exited with {status}\n{}", self.log_text()));
            }
            if let Ok(response) = reqwest::get(format!("{}/-/ready", self.base)).await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(format!("not ready after {PATIENCE:?}\n{}", self.log_text()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(crate) async fn api(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.base), params).unwrap();
        let body: Value = reqwest::get(url)
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
            .await
            .unwrap();
        assert_eq!(body["status"], "success", "{path}: {body}");
        body["data"].clone()
    }

    /// The value of an instant query that returns one sample, or `None` while it returns none.
    async fn query_one(&self, promql: &str) -> Option<String> {
        let data = self.api("/api/v1/query", &[("query", promql)]).await;
        let result = data["result"].as_array().unwrap();
        assert!(result.len() <= 1, "{promql}: {data}");
        result
            .first()
            .map(|sample| sample["value"][1].as_str().unwrap().to_owned())
    }

    /// Polls `promql` until it returns `expected`.
    pub(crate) async fn wait_for_value(&self, promql: &str, expected: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let value = self.query_one(promql).await;
            if value.as_deref() == Some(expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{promql} is {value:?}, not {expected}, after {PATIENCE:?}; targets: {}\n{}",
                self.api("/api/v1/targets", &[]).await,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// The shipped sample configuration, pointed at `target`, scraping and evaluating every second,
/// with the rule file's absolute path (the configuration now lives in a temporary directory).
fn test_config(target: SocketAddr) -> String {
    let dir = repo_root().join("config/prometheus");
    let sample = std::fs::read_to_string(dir.join("prometheus.yml")).unwrap();
    let mut config = sample.clone();
    for (from, to) in [
        ("scrape_interval: 15s", "scrape_interval: 1s".to_owned()),
        ("scrape_timeout: 10s", "scrape_timeout: 1s".to_owned()),
        (
            "evaluation_interval: 15s",
            "evaluation_interval: 1s".to_owned(),
        ),
        ("\"127.0.0.1:9187\"", format!("\"{target}\"")),
        (
            "- alerts.yml",
            format!("- {}", dir.join("alerts.yml").display()),
        ),
    ] {
        assert_eq!(
            config.matches(from).count(),
            1,
            "config/prometheus/prometheus.yml should contain `{from}` once"
        );
        config = config.replace(from, &to);
    }
    config
}

/// The alert names defined in config/prometheus/alerts.yml.
fn shipped_alert_names() -> BTreeSet<String> {
    let rules = std::fs::read_to_string(repo_root().join("config/prometheus/alerts.yml")).unwrap();
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(|name| name.trim().to_owned())
        .collect()
}

#[tokio::test]
async fn a_real_prometheus_reads_a_cleanup_runs_counter_and_loads_the_alerting_rules() {
    let binary = prometheus_tool("prometheus"); // first: a missing tool fails here, with advice
    let db = TestDb::new().await;
    let metrics = Arc::new(Metrics::new().unwrap());
    let ops = RunningOps::start(OpsState::new(
        metrics.clone(),
        fresh_probe(&db.config().database),
    ))
    .await;
    let prometheus = PrometheusServer::start(&binary, ops.addr).await;

    prometheus
        .wait_for_value("up{job=\"tombstoned\"}", "1")
        .await;
    let counter = "tombstoned_cleanup_rows_tombstoned_total{job=\"tombstoned\"}";
    prometheus.wait_for_value(counter, "0").await;

    // A real cleanup run, feeding the metrics the listener serves, tombstones 7 due records.
    let client = db.client().await;
    seed_live(&client, "due", 7, DUE).await;
    seed_live(&client, "later", 3, NOT_DUE).await;
    let config = db.config();
    let report = cleanup::run_once(
        &config.database,
        &config.cleanup,
        &config.retention,
        RunLimits::default(),
        &CancellationToken::new(),
        Some(&metrics),
    )
    .await
    .unwrap();
    assert_eq!(report.rows_tombstoned, 7);
    assert_eq!(counts(&client).await, (7, 3));
    prometheus.wait_for_value(counter, "7").await;
    prometheus
        .wait_for_value(
            "tombstoned_cleanup_runs_total{job=\"tombstoned\",outcome=\"success\"}",
            "1",
        )
        .await;

    // Every shipped alert is loaded, and once evaluated against these real series none errs.
    let expected = shipped_alert_names();
    assert!(expected.len() >= 7, "{expected:?}");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let data = prometheus.api("/api/v1/rules", &[]).await;
        let rules: Vec<&Value> = data["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        let loaded: BTreeSet<String> = rules
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(loaded, expected);
        for rule in &rules {
            assert_ne!(rule["health"], "err", "rule failed to evaluate: {rule}");
        }
        if rules.iter().all(|r| r["health"] == "ok") {
            break;
        }
        assert!(Instant::now() < deadline, "rules never evaluated: {data}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    prometheus.stop().await;
    ops.stop().await.unwrap();
}

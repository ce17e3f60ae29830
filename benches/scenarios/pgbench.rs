//! Runs pgbench with one of the repository's scripts (`bench/pgbench/`), prepared statements and
//! a per-transaction log, and reads its throughput and latency percentiles.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use serde::Serialize;

use crate::stats::Latency;
use crate::Bench;

/// What one pgbench run measured.
#[derive(Debug, Clone, Serialize)]
pub struct PgbenchResult {
    /// pgbench's "tps (without initial connection time)".
    pub tps: f64,
    /// Transactions processed.
    pub transactions: u64,
    /// Failed transactions.
    pub failed: u64,
    /// Per-transaction latency, from the transaction log.
    pub latency: Latency,
}

/// `pgbench -n -M prepared -c clients -j 2 -T seconds -f script -D ...` against `db`.
pub async fn run(
    bench: &Bench,
    db: &str,
    script: &str,
    clients: usize,
    duration: Duration,
    defines: &[(&str, String)],
) -> Result<PgbenchResult> {
    let dir = tempfile::tempdir()?;
    let prefix = dir.path().join("tx");
    // The sessions carry what the API's carry (the claim alone takes its lock timeout from its
    // session); the SQL API's scripts need the search path.
    let conninfo = format!(
        "{} application_name=pgbench options='{}'",
        bench.server.url(db),
        tombstoned_testkit::pgbench_scripts::session_options()
    );
    let mut command = tokio::process::Command::new(&bench.server.pgbench);
    command
        .args(["-n", "-M", "prepared"])
        .args(["-c", &clients.to_string(), "-j", "2"])
        .args(["-T", &duration.as_secs().max(1).to_string()])
        .arg("--log")
        .arg(format!("--log-prefix={}", prefix.display()))
        .arg("-f")
        .arg(bench.root.join("bench/pgbench").join(script));
    for (name, value) in defines {
        command.arg("-D").arg(format!("{name}={value}"));
    }
    command.arg(&conninfo);
    let output = command
        .output()
        .await
        .with_context(|| format!("running {}", bench.server.pgbench.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    ensure!(
        output.status.success(),
        "pgbench {script} failed ({}): {stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let field = |prefix: &str| -> Option<f64> {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    let tps = field("tps = ").context("pgbench printed no tps")?;
    let transactions = field("number of transactions actually processed:").unwrap_or(0.0) as u64;
    let failed = field("number of failed transactions:").unwrap_or(0.0) as u64;
    Ok(PgbenchResult {
        tps,
        transactions,
        failed,
        latency: Latency::of_micros(read_logs(dir.path())?),
    })
}

/// Latencies (µs) from pgbench's per-transaction logs: `client_id transaction_no time
/// script_no time_epoch time_us`, where `time` is the transaction's latency in µs.
fn read_logs(dir: &Path) -> Result<Vec<u64>> {
    let mut micros = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        micros.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2))
                .filter_map(|v| v.parse::<u64>().ok()),
        );
    }
    Ok(micros)
}

//! Scenario 3: replays over real HTTP while the cleaner runs.
//!
//! A fresh copy of scenario 1's data (half the records due) and a fresh `tombstoned serve` per
//! trial; an open-loop stream of replays at a fixed rate for a fixed window:
//!
//! * 3 in 4 replay a random live record (not due): the answer must be 201 with
//!   `Idempotent-Replayed: true` and the stored body;
//! * 1 in 4 replay a due record at the cleaner's front — among the 2,000 oldest due records not
//!   yet tombstoned, i.e. the batch the cleaner is on and the next one — so they meet its row
//!   locks. The answer must be 410 `replay-window-expired` (the replay window is exact: a due
//!   record answers 410 whether or not the cleaner has tombstoned it yet).
//!
//! "With cleanup" starts `tombstoned cleanup` (the release binary, defaults) as the window opens
//! and stops it (SIGINT: it finishes its batch) when the window closes; "without" is the same
//! stream alone. A replay *error* is anything but the required answer: another status (409
//! request-in-progress after `api.claim_lock_timeout`, 5xx, ...), a 201 without the replay
//! header or with another body, a transport error, or no answer within 10 s.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::Serialize;
use serde_json::json;
use tokio_postgres::Client;

use crate::daemon::{Daemon, Memory};
use crate::http_load::{error_kinds, open_loop, post_order, Expect, LoadResult, Make};
use crate::report::{check, num, range, Row, ScenarioResult};
use crate::seed::{token, Record};
use crate::stats::{median, median_of_pair_ratios, ratio};
use crate::Bench;

/// How many of the oldest not-yet-tombstoned due records the "cleaning" replays aim at.
const FRONT_WIDTH: i64 = 2000;

/// One trial.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// Repetition.
    pub rep: usize,
    /// Whether a cleanup ran during the window.
    pub with_cleanup: bool,
    /// The replay stream.
    pub load: LoadResult,
    /// Rows the cleanup tombstoned (with cleanup).
    pub cleanup_rows: Option<i64>,
    /// The cleanup's batch p99, ms.
    pub cleanup_batch_p99_ms: Option<f64>,
    /// The cleanup's slowest batch, ms.
    pub cleanup_slowest_batch_ms: Option<f64>,
    /// Whether the cleanup was still running when the window closed (it covered all of it).
    pub cleanup_covered_window: Option<bool>,
    /// Daemon memory after the trial.
    pub memory: Memory,
}

/// Scenario 3.
pub async fn scenario3(bench: &mut Bench) -> Result<ScenarioResult> {
    let template = bench.template("s1").await?;
    let mut trials = Vec::new();
    for rep in 0..bench.scale.reps {
        let modes = if rep % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for with_cleanup in modes {
            trials.push(trial(bench, &template, rep, with_cleanup).await?);
        }
    }
    let p99 = |with: bool| -> Vec<f64> {
        trials
            .iter()
            .filter(|t| t.with_cleanup == with)
            .map(|t| t.load.latency.p99_ms)
            .collect()
    };
    let (with, without) = (p99(true), p99(false));
    let (mw, mo) = (
        median(&with).unwrap_or(f64::NAN),
        median(&without).unwrap_or(f64::NAN),
    );
    let r = ratio(mw, mo);
    let errors: u64 = trials.iter().map(|t| t.load.error_count).sum();
    let mut all_errors = std::collections::BTreeMap::new();
    for t in &trials {
        for (k, v) in &t.load.errors {
            *all_errors.entry(k.clone()).or_insert(0u64) += v;
        }
    }
    let class_p99 = |with: bool, class: &str| -> f64 {
        median(
            &trials
                .iter()
                .filter(|t| t.with_cleanup == with)
                .filter_map(|t| t.load.latency_by_class.get(class).map(|l| l.p99_ms))
                .collect::<Vec<_>>(),
        )
        .unwrap_or(f64::NAN)
    };
    let covered = trials
        .iter()
        .filter(|t| t.with_cleanup)
        .all(|t| t.cleanup_covered_window == Some(true));
    let quick = bench.scale.quick;
    let mut checks = Vec::new();
    let rows = vec![
        Row {
            scenario: 3,
            metric: format!(
                "replay p99 ms at {}/s over HTTP: without vs with cleanup{}",
                bench.scale.s3_rate,
                if covered {
                    ""
                } else {
                    " (cleanup ended inside the window)"
                }
            ),
            baseline: num(mo, 2),
            tombstoned: num(mw, 2),
            ratio: num(r, 2),
            pair_ratio: num(
                median_of_pair_ratios(&with, &without).unwrap_or(f64::NAN),
                2,
            ),
            range: format!(
                "with {} / without {}",
                range(&with, 1, ""),
                range(&without, 1, "")
            ),
            target: "<= 2".into(),
            verdict: check(
                &mut checks,
                3,
                "replay p99 with cleanup <= 2 x without",
                r,
                "<= 2",
                r <= 2.0,
                quick,
            ),
        },
        Row {
            scenario: 3,
            metric: "  of which replays at the cleaner's front (410), p99 ms".into(),
            baseline: num(class_p99(false, "cleaning"), 2),
            tombstoned: num(class_p99(true, "cleaning"), 2),
            ratio: num(
                ratio(class_p99(true, "cleaning"), class_p99(false, "cleaning")),
                2,
            ),
            pair_ratio: String::new(),
            range: String::new(),
            target: String::new(),
            verdict: String::new(),
        },
        Row {
            scenario: 3,
            metric: "replay errors (all trials)".into(),
            baseline: String::new(),
            tombstoned: errors.to_string(),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: error_kinds(&all_errors),
            target: "0".into(),
            verdict: check(
                &mut checks,
                3,
                "no replay errors",
                errors as f64,
                "0",
                errors == 0,
                quick,
            ),
        },
    ];
    Ok(ScenarioResult {
        id: 3,
        title: "Replays while the cleaner runs".into(),
        rows,
        checks,
        details: json!({
            "rate_per_second": bench.scale.s3_rate,
            "window_seconds": bench.scale.s3_window_seconds,
            "front_width": FRONT_WIDTH,
            "median_p99_ms": {"with_cleanup": mw, "without": mo},
            "trials": trials,
        }),
        seconds: 0.0,
    })
}

async fn trial(bench: &Bench, template: &str, rep: usize, with_cleanup: bool) -> Result<Trial> {
    let db = bench
        .server
        .db_name(&format!("replays_{rep}_{with_cleanup}"));
    bench.server.copy_db(template, &db).await?;
    let daemon = Daemon::start(bench, &db, 16).await?;
    let n = bench.scale.s1_records;
    let due = n / 2;
    let front = Arc::new(AtomicI64::new(1));
    let make = stream(n, due, front.clone());
    let rate = bench.scale.s3_rate;
    // Warm-up: the pool opens its connections, the daemon's and the server's caches fill.
    open_loop(daemon.api, rate, Duration::from_secs(1), make.clone()).await?;

    let stop_tracking = tokio_util::sync::CancellationToken::new();
    let mut cleanup = None;
    let mut tracker = None;
    if with_cleanup {
        let client = bench.server.connect(&db).await?;
        tracker = Some(tokio::spawn(track_front(
            client,
            due,
            front.clone(),
            stop_tracking.clone(),
        )));
        cleanup = Some(
            tokio::process::Command::new(&bench.binary)
                .args(["cleanup", "--json"])
                .env_clear()
                .env("TOMBSTONED_DATABASE_URL", bench.server.url(&db))
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .context("starting tombstoned cleanup")?,
        );
    }
    let window = Duration::from_secs(bench.scale.s3_window_seconds);
    let load = open_loop(daemon.api, rate, window, make).await?;
    stop_tracking.cancel();
    if let Some(t) = tracker {
        t.await??;
    }

    let mut trial = Trial {
        rep,
        with_cleanup,
        load,
        cleanup_rows: None,
        cleanup_batch_p99_ms: None,
        cleanup_slowest_batch_ms: None,
        cleanup_covered_window: None,
        memory: daemon.memory()?,
    };
    if let Some(mut child) = cleanup {
        let still_running = child.try_wait()?.is_none();
        if still_running {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGINT,
                );
            }
        }
        let output = child.wait_with_output().await?;
        anyhow::ensure!(
            output.status.success(),
            "tombstoned cleanup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)?;
        trial.cleanup_rows = report["rows_tombstoned"].as_i64();
        trial.cleanup_batch_p99_ms = report["batch_p99_seconds"].as_f64().map(|s| s * 1e3);
        trial.cleanup_slowest_batch_ms = report["slowest_batch_seconds"].as_f64().map(|s| s * 1e3);
        trial.cleanup_covered_window = Some(still_running);
    }
    daemon.stop().await?;
    bench.server.drop_db(&db).await?;
    eprintln!(
        "  rep {rep} {:<15} {} replays, p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms, errors {}{}",
        if with_cleanup {
            "with cleanup"
        } else {
            "without cleanup"
        },
        trial.load.completed,
        trial.load.latency.p50_ms,
        trial.load.latency.p99_ms,
        trial.load.latency.max_ms,
        trial.load.error_count,
        match trial.cleanup_rows {
            Some(rows) => format!(
                "; cleanup tombstoned {rows} rows, batch p99 {:.1} ms",
                trial.cleanup_batch_p99_ms.unwrap_or(0.0)
            ),
            None => String::new(),
        }
    );
    Ok(trial)
}

/// The replay stream: 1 in 4 at the cleaner's front (expected 410), the rest at live records
/// (expected 201 replayed).
fn stream(n: i64, due: i64, front: Arc<AtomicI64>) -> Make {
    Arc::new(move |k, rng| {
        let (i, expect, class) = if k % 4 == 0 {
            let i = (front.load(Ordering::Relaxed) + rng.between(0, FRONT_WIDTH - 1)).min(due);
            (i, None, "cleaning")
        } else {
            (rng.between(due + 1, n), Some(()), "live")
        };
        let record = Record::new("s1", i, false);
        let expect = match expect {
            Some(()) => Expect::Replayed(record.request_id.clone()),
            None => Expect::Expired,
        };
        (
            post_order(&token(record.principal), &record.key, record.body()),
            expect,
            class,
        )
    })
}

/// Follows the cleaner: every 100 ms, binary-searches the first due record (in deadline order,
/// which is `i` order) that is not yet a tombstone. Batches commit in deadline order, so the
/// tombstones are always a prefix.
async fn track_front(
    client: Client,
    due: i64,
    front: Arc<AtomicI64>,
    stop: tokio_util::sync::CancellationToken,
) -> Result<()> {
    let statement = client
        .prepare(
            "SELECT expired FROM idempotency_records
             WHERE scope_id = (SELECT scope_id FROM idempotency_scopes
                               WHERE tenant_id = $1 AND principal_id = $2
                                 AND operation = 'create-order')
               AND idempotency_key = $3",
        )
        .await?;
    while !stop.is_cancelled() {
        let (mut lo, mut hi) = (front.load(Ordering::Relaxed), due + 1);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let record = Record::new("s1", mid, false);
            let (tenant, principal) = record.scope();
            let expired: bool = client
                .query_one(&statement, &[&tenant, &principal, &record.key])
                .await?
                .get(0);
            if expired {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        front.store(lo.min(due), Ordering::Relaxed);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stop.cancelled() => {}
        }
    }
    Ok(())
}

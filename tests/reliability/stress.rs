//! Stress with invariants: many concurrent clients against the real daemon while the cleaner
//! runs every second with a 3-second replay window, so records cross from live to tombstone
//! during the run. Every request and answer is recorded and checked against the database at the
//! end (see `ledger::check`); a monitor snapshots every record's identity during the run.
//!
//! `TOMBSTONED_STRESS_SECS` (default 60), `TOMBSTONED_STRESS_CLIENTS` (default 16) and
//! `TOMBSTONED_STRESS_SEED` (default: from the clock, printed) tune it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::daemon::{connect, sample, Daemon, DaemonSpec};
use crate::harness::TestDb;
use crate::ledger::{self, CheckOptions, DbState, Ledger, Monitor};
use crate::load::{self, Api, LoadSpec, Mix};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_with_invariants_against_the_real_daemon() {
    let secs: u64 = env_or("TOMBSTONED_STRESS_SECS", 60);
    let clients: usize = env_or("TOMBSTONED_STRESS_CLIENTS", 16);
    let seed: u64 = env_or(
        "TOMBSTONED_STRESS_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    let db = TestDb::new().await;
    let mut daemon = Daemon::start(
        DaemonSpec::new(&db.url)
            .set("retention", "replay_window", "\"3s\"")
            .set("cleanup", "schedule", "\"* * * * * *\"")
            .set("cleanup", "batch_size", "25")
            .set("cleanup", "lock_timeout", "\"500ms\""),
    )
    .await;
    let monitor = Monitor::start(
        connect(&db.url, "monitor").await,
        Duration::from_millis(500),
    );
    let api = Api::new(&daemon.api, Duration::from_secs(15));
    let ledger = Arc::new(Ledger::default());
    let pool = Default::default();
    let spec = LoadSpec {
        clients,
        mix: Mix::stress(),
        seed,
        tag: "s".into(),
    };
    let started = Instant::now();
    load::run_for(&api, &spec, &ledger, &pool, Duration::from_secs(secs)).await;
    let elapsed = started.elapsed();

    let metrics = daemon.metrics().await;
    // SIGTERM drains every claim still running for a client that went away.
    let status = daemon.terminate().await;
    assert!(status.success(), "exit {status}:\n{}", daemon.stderr());
    let monitor = monitor.stop().await;
    let state = DbState::load(&connect(&db.url, "test").await).await;
    let verdict = ledger::check(&ledger, &state, CheckOptions::default());

    let tombstones = state.tombstones();
    let mut figures = format!(
        "stress: {clients} clients, {:.1} s, seed {seed}\n{}",
        elapsed.as_secs_f64(),
        verdict.figures()
    );
    figures += &format!(
        "requests per second: {:.0}\n\
         records: {} ({tombstones} tombstones, {} live), orders: {}\n\
         monitor: {} snapshots, {} records crossed from live to tombstone while watched, {} violations\n\
         cleanup runs (success): {}, rows tombstoned by the daemon: {}\n",
        (verdict.requests + verdict.reads.values().sum::<usize>()) as f64 / elapsed.as_secs_f64(),
        state.records.len(),
        state.records.len() - tombstones,
        state.orders.len(),
        monitor.snapshots,
        monitor.seen_crossing,
        monitor.violations.len(),
        sample(&metrics, "tombstoned_cleanup_runs_total{outcome=\"success\"}"),
        sample(&metrics, "tombstoned_cleanup_rows_tombstoned_total"),
    );
    crate::publish_figures("stress", &figures);

    assert!(
        monitor.violations.is_empty(),
        "monitor: {:#?}",
        &monitor.violations[..monitor.violations.len().min(40)]
    );
    // It watched the whole run (a snapshot every 500 ms; the database never went away).
    assert!(
        monitor.failed_snapshots.is_empty(),
        "{:?}",
        monitor.failed_snapshots
    );
    assert!(monitor.snapshots as u64 >= secs, "{figures}");
    verdict.assert_clean();
    // The mix really happened: records crossed into tombstones, and every kind of answer the
    // checks are about was seen.
    assert!(tombstones > 0 && monitor.seen_crossing > 0, "{figures}");
    for label in [
        "201",
        "201 replay",
        "200 replay",
        "409 duplicate-request-id",
        "410 replay-window-expired",
        "422 idempotency-key-reused",
        "422 approval-limit-exceeded",
        "422 approval-limit-exceeded replay",
    ] {
        assert!(
            verdict.outcome(label) > 0,
            "no `{label}` answer:\n{figures}"
        );
    }
}

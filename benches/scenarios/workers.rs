//! Scenario 7: parallel cleanup (issue 13, target 3) on scenario 1's data.
//!
//! (a) `tombstoned cleanup --json` with `cleanup.workers = 2` (the release binary, a fresh
//!     process per trial, timed from spawn to exit);
//! (a1) the same with one worker (today's engine, for reference);
//! (b) the limit of one session: one `UPDATE ... WHERE NOT expired AND replay_deadline <= cutoff`;
//! (b2) the limit of two sessions: two such UPDATEs over disjoint halves of the due deadlines
//!      (split at their median, read before the clock starts), run at once on two sessions.
//!
//! Every trial runs on a fresh byte-for-byte copy of the seeded database, after a CHECKPOINT;
//! the approaches alternate, so drift on a shared machine hits each alike.

use std::time::Instant;

use anyhow::{Context as _, Result};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::json;
use tokio_postgres::types::ToSql;

use crate::cleanup::{CleanupProcess, SINGLE_UPDATE};
use crate::report::{check, num, range, Row, ScenarioResult};
use crate::stats::{median, median_of_pair_ratios, ratio};
use crate::Bench;

/// The workers the target is set for (this machine has two cores).
const WORKERS: u32 = 2;

/// The four ways to tombstone the due rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Approach {
    /// (a) `tombstoned cleanup`, `cleanup.workers = 2`.
    TwoWorkers,
    /// (a1) `tombstoned cleanup`, one worker.
    OneWorker,
    /// (b) one set-based UPDATE.
    SingleUpdate,
    /// (b2) two set-based UPDATEs over disjoint halves, at once.
    TwoHalves,
}

/// One half of the two-session limit: `$1` exclusive lower bound (NULL: from the start), `$2`
/// inclusive upper bound.
const HALF_UPDATE: &str = "
UPDATE idempotency_records SET response_body = NULL, expired = true, expired_at = now()
WHERE NOT expired AND replay_deadline > coalesce($1::timestamptz, '-infinity')
  AND replay_deadline <= $2::timestamptz";

/// One trial.
#[derive(Debug, Clone, Serialize)]
pub struct Trial {
    /// Which approach.
    pub approach: Approach,
    /// Repetition (0-based).
    pub rep: usize,
    /// Rows tombstoned.
    pub rows: i64,
    /// Wall time (for (a): spawn to exit of the process).
    pub seconds: f64,
    /// `rows / seconds`.
    pub rows_per_second: f64,
    /// (a): the engine's own `duration_seconds`.
    pub engine_seconds: Option<f64>,
    /// (a): workers the run reports.
    pub workers: Option<u64>,
    /// (a): batches.
    pub batches: Option<u64>,
    /// (a): 99th percentile of batch transaction durations, ms.
    pub batch_p99_ms: Option<f64>,
    /// Longest batch (a) or statement (b), ms: the longest any row lock was held.
    pub slowest_ms: f64,
    /// Load average when the trial ended.
    pub load_average: String,
}

/// Runs one trial of `approach` on a fresh copy of `template`.
async fn trial(bench: &Bench, template: &str, approach: Approach, rep: usize) -> Result<Trial> {
    let db = bench
        .server
        .db_name(&format!("s7_{rep}_{approach:?}").to_lowercase());
    bench.server.copy_db(template, &db).await?;
    let mut t = match approach {
        Approach::TwoWorkers => run_tombstoned(bench, &db, WORKERS).await?,
        Approach::OneWorker => run_tombstoned(bench, &db, 1).await?,
        Approach::SingleUpdate => run_single_update(bench, &db).await?,
        Approach::TwoHalves => run_two_halves(bench, &db).await?,
    };
    t.approach = approach;
    t.rep = rep;
    t.load_average = crate::loadavg();
    bench.server.drop_db(&db).await?;
    eprintln!(
        "  rep {rep} {:<12} {:>8} rows in {:>7.2} s = {:>7.0} rows/s{}",
        format!("{approach:?}"),
        t.rows,
        t.seconds,
        t.rows_per_second,
        t.batch_p99_ms
            .map(|p99| format!(", batch p99 {p99:.1} ms, slowest {:.1} ms", t.slowest_ms))
            .unwrap_or_default()
    );
    Ok(t)
}

fn timed(rows: i64, seconds: f64) -> Trial {
    Trial {
        approach: Approach::SingleUpdate,
        rep: 0,
        rows,
        seconds,
        rows_per_second: rows as f64 / seconds,
        engine_seconds: None,
        workers: None,
        batches: None,
        batch_p99_ms: None,
        slowest_ms: seconds * 1000.0,
        load_average: String::new(),
    }
}

/// (a) The real binary, as an operator runs it, with `workers` workers.
async fn run_tombstoned(bench: &Bench, db: &str, workers: u32) -> Result<Trial> {
    let env = [("TOMBSTONED_CLEANUP__WORKERS", workers.to_string())];
    let run = CleanupProcess::run(bench, &bench.binary, db, &[], &env).await?;
    let mut t = timed(run.rows(), run.seconds);
    t.engine_seconds = run.report["duration_seconds"].as_f64();
    t.workers = run.report["workers"].as_u64();
    t.batches = run.report["batches"].as_u64();
    t.batch_p99_ms = run.batch_p99_ms();
    t.slowest_ms = run.slowest_batch_ms();
    Ok(t)
}

/// (b) One session's limit.
async fn run_single_update(bench: &Bench, db: &str) -> Result<Trial> {
    let client = bench.server.connect(db).await?;
    let cutoff: DateTime<Utc> = client.query_one("SELECT now()", &[]).await?.get(0);
    let statement = client.prepare(SINGLE_UPDATE).await?;
    let started = Instant::now();
    let rows = client.execute(&statement, &[&cutoff]).await? as i64;
    Ok(timed(rows, started.elapsed().as_secs_f64()))
}

/// (b2) Two sessions' limit: the due deadlines split at their median, one UPDATE per half, both
/// at once.
async fn run_two_halves(bench: &Bench, db: &str) -> Result<Trial> {
    let (first, second) = (
        bench.server.connect(db).await?,
        bench.server.connect(db).await?,
    );
    let cutoff: DateTime<Utc> = first.query_one("SELECT now()", &[]).await?.get(0);
    let middle: Option<DateTime<Utc>> = first
        .query_one(
            "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY replay_deadline)
             FROM idempotency_records WHERE NOT expired AND replay_deadline <= $1",
            &[&cutoff],
        )
        .await?
        .get(0);
    let middle = middle.context("no due rows to split")?;
    let (s1, s2) = (
        first.prepare(HALF_UPDATE).await?,
        second.prepare(HALF_UPDATE).await?,
    );
    let (none, after): (Option<DateTime<Utc>>, Option<DateTime<Utc>>) = (None, Some(middle));
    let (p1, p2): ([&(dyn ToSql + Sync); 2], [&(dyn ToSql + Sync); 2]) =
        ([&none, &middle], [&after, &cutoff]);
    let started = Instant::now();
    let (a, b) = tokio::join!(first.execute(&s1, &p1), second.execute(&s2, &p2));
    let seconds = started.elapsed().as_secs_f64();
    Ok(timed((a? + b?) as i64, seconds))
}

fn values(trials: &[Trial], approach: Approach, f: impl Fn(&Trial) -> f64) -> Vec<f64> {
    trials
        .iter()
        .filter(|t| t.approach == approach)
        .map(f)
        .collect()
}

/// Scenario 7. Alternates the approaches (a a1 b b2, a1 b b2 a, ...).
pub async fn scenario7(bench: &mut Bench) -> Result<ScenarioResult> {
    let template = bench.template("s1").await?;
    let order = [
        Approach::TwoWorkers,
        Approach::OneWorker,
        Approach::SingleUpdate,
        Approach::TwoHalves,
    ];
    let reps = bench.scale.reps;
    let mut trials = Vec::new();
    for rep in 0..reps {
        for k in 0..order.len() {
            trials.push(trial(bench, &template, order[(rep + k) % order.len()], rep).await?);
        }
    }

    let quick = bench.scale.quick;
    let rate = |a| values(&trials, a, |t| t.rows_per_second);
    let (a, a1, b, b2) = (
        rate(Approach::TwoWorkers),
        rate(Approach::OneWorker),
        rate(Approach::SingleUpdate),
        rate(Approach::TwoHalves),
    );
    let m = |v: &[f64]| median(v).unwrap_or(f64::NAN);
    let (ma, ma1, mb, mb2) = (m(&a), m(&a1), m(&b), m(&b2));
    let pair = |x: &[f64], y: &[f64]| median_of_pair_ratios(x, y).unwrap_or(f64::NAN);
    let r_ab = ratio(ma, mb);
    let p99s = values(&trials, Approach::TwoWorkers, |t| {
        t.batch_p99_ms.unwrap_or(0.0)
    });
    let worst_p99 = p99s.iter().copied().fold(0.0, f64::max);
    let rows_due = bench.scale.s1_records / 2;
    let mut checks = Vec::new();
    let rows = vec![
        Row {
            scenario: 7,
            metric: format!(
                "cleanup rows/s, {rows_due} due of {}: (a) workers = {WORKERS} vs (b) one UPDATE",
                bench.scale.s1_records
            ),
            baseline: num(mb, 0),
            tombstoned: num(ma, 0),
            ratio: num(r_ab, 3),
            pair_ratio: num(pair(&a, &b), 3),
            range: format!("a {} / b {}", range(&a, 0, ""), range(&b, 0, "")),
            target: ">= 1.3".into(),
            verdict: check(
                &mut checks,
                7,
                "tombstoned cleanup with 2 workers rows/s >= 1.3 x single UPDATE",
                r_ab,
                ">= 1.3",
                r_ab >= 1.3,
                quick,
            ),
        },
        Row {
            scenario: 7,
            metric: "(a) workers = 2 vs (b2) two UPDATEs over disjoint halves at once".into(),
            baseline: num(mb2, 0),
            tombstoned: num(ma, 0),
            ratio: num(ratio(ma, mb2), 3),
            pair_ratio: num(pair(&a, &b2), 3),
            range: format!("b2 {}", range(&b2, 0, "")),
            target: String::new(),
            verdict: String::new(),
        },
        Row {
            scenario: 7,
            metric: "(b2) two halves at once vs (b) one UPDATE: the two-session limit".into(),
            baseline: num(mb, 0),
            tombstoned: num(mb2, 0),
            ratio: num(ratio(mb2, mb), 3),
            pair_ratio: num(pair(&b2, &b), 3),
            range: String::new(),
            target: String::new(),
            verdict: String::new(),
        },
        Row {
            scenario: 7,
            metric: "(a) workers = 2 vs (a1) one worker".into(),
            baseline: num(ma1, 0),
            tombstoned: num(ma, 0),
            ratio: num(ratio(ma, ma1), 3),
            pair_ratio: num(pair(&a, &a1), 3),
            range: format!("a1 {}", range(&a1, 0, "")),
            target: String::new(),
            verdict: String::new(),
        },
        Row {
            scenario: 7,
            metric: "(a) workers = 2: batch lock hold p99, ms (worst trial)".into(),
            baseline: String::new(),
            tombstoned: num(worst_p99, 1),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: range(&p99s, 1, " ms"),
            target: "<= 100".into(),
            verdict: check(
                &mut checks,
                7,
                "workers = 2: batch lock hold p99 <= 100 ms",
                worst_p99,
                "<= 100",
                worst_p99 <= 100.0,
                quick,
            ),
        },
    ];
    Ok(ScenarioResult {
        id: 7,
        title: format!("parallel cleanup: workers = {WORKERS} vs one and two single UPDATEs"),
        rows,
        checks,
        details: json!({ "workers": WORKERS, "trials": trials }),
        seconds: 0.0,
    })
}

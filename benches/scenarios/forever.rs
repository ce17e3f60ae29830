//! Scenario 9 (issue 25): the forever table from 1 M to 50 M keys. One table grows in place —
//! 1 M, then 10 M, then 50 M keys, measured at each size before it grows — and at each size the
//! same measurements run against the release `tombstoned serve` and `tombstoned cleanup`:
//!
//! * claims (new keys) and replays (of live records) over HTTP, each an open-loop stream at
//!   [`crate::Scale::s3_rate`] per second: p50 and p99;
//! * the cleaner's run on exactly the rows those claims made (the daemon runs with a 2 s replay
//!   window, so its claims fall due 2 s later; the seeded live records are not due for days):
//!   µs per tombstoned row, and that small run's cost per row against scenario 1's;
//! * the heap, primary key and due index sizes, and how long a `VACUUM` of the table takes right
//!   after the cleanup run.
//!
//! The data: ≥ 95 % tombstones (tombstones with deadlines rising with insertion over 400 days of
//! history, UUID-shaped keys in no order, 16 principals in 4 tenants) and a fixed live set of one
//! day's records (50,000, deadlines 2–3 days ahead), as a table whose history piles up while its
//! traffic stays the same. All of it is made by [`grow`], the one place that seeds, through
//! `seed.rs` (which writes the records exactly as the API does, in the current layout).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use serde::Serialize;
use serde_json::json;
use tokio_postgres::Client;

use crate::cleanup::{self, Approach, CleanupProcess};
use crate::daemon::Daemon;
use crate::http_load::{error_kinds, open_loop, post_order, Expect, LoadResult, Make};
use crate::report::{check, num, range, Row, ScenarioResult};
use crate::seed::{self, token, Batch, Record, SeedReport};
use crate::stats::{median, ratio};
use crate::svg::{keys_label, Panel, Series};
use crate::Bench;

/// Live records: one day of traffic, the same at every size (≥ 95 % tombstones from 1 M keys).
const LIVE: i64 = 50_000;
/// The history the tombstones span at the largest size, days.
const HISTORY_DAYS: i64 = 400;
/// Rows per seeding statement (one transaction each, so a long seed shows progress).
const SEED_CHUNK: i64 = 2_000_000;
/// The daemon's `retention.replay_window`: its claims are due for the cleaner this much later.
const CLAIM_WINDOW: Duration = Duration::from_secs(2);
/// Tags of the seeded data sets (key namespaces, see `seed.rs`).
const TOMBSTONE_TAG: &str = "fv_tomb";
const LIVE_TAG: &str = "fv_live";

/// One repetition at one size.
#[derive(Debug, Clone, Serialize)]
pub struct Rep {
    /// Repetition.
    pub rep: usize,
    /// The replay stream (seeded live records: 201 replayed).
    pub replays: LoadResult,
    /// The claim stream (new keys: 201 created).
    pub claims: LoadResult,
    /// Rows the cleanup run tombstoned (the claims above).
    pub cleanup_rows: i64,
    /// The cleanup process, spawn to exit, seconds.
    pub cleanup_seconds: f64,
    /// The engine's own duration (without the process start), seconds.
    pub cleanup_engine_seconds: f64,
    /// The run's batch p99, ms.
    pub cleanup_batch_p99_ms: Option<f64>,
    /// `VACUUM idempotency_records` right after the cleanup run, seconds.
    pub vacuum_seconds: f64,
}

impl Rep {
    fn cleanup_us_per_row(&self) -> f64 {
        self.cleanup_seconds / self.cleanup_rows.max(1) as f64 * 1e6
    }

    fn engine_us_per_row(&self) -> f64 {
        self.cleanup_engine_seconds / self.cleanup_rows.max(1) as f64 * 1e6
    }
}

/// The table's sizes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sizes {
    /// Heap (main fork), bytes.
    pub heap_bytes: i64,
    /// Everything: heap, TOAST, every index, bytes.
    pub total_bytes: i64,
    /// The primary key, bytes.
    pub primary_key_bytes: i64,
    /// The due index (partial, live records only), bytes.
    pub due_index_bytes: i64,
    /// Every index by name, bytes.
    pub indexes: Vec<(String, i64)>,
}

/// One size.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// Keys in the table when measured (seeded + claimed so far).
    pub keys: i64,
    /// Of which tombstones.
    pub tombstones: i64,
    /// Growing the table to this size.
    pub seed: SeedReport,
    /// Sizes before the repetitions.
    pub sizes: Sizes,
    /// The repetitions.
    pub reps: Vec<Rep>,
    /// `/proc/loadavg` before and after the repetitions (others share the machine).
    pub load_average: (String, String),
}

impl Point {
    fn med(&self, f: impl Fn(&Rep) -> f64) -> f64 {
        median(&self.reps.iter().map(f).collect::<Vec<_>>()).unwrap_or(f64::NAN)
    }

    fn values(&self, f: impl Fn(&Rep) -> f64) -> Vec<f64> {
        self.reps.iter().map(f).collect()
    }
}

fn claim_p50(r: &Rep) -> f64 {
    r.claims.latency.p50_ms
}
fn claim_p99(r: &Rep) -> f64 {
    r.claims.latency.p99_ms
}
fn replay_p50(r: &Rep) -> f64 {
    r.replays.latency.p50_ms
}
fn replay_p99(r: &Rep) -> f64 {
    r.replays.latency.p99_ms
}

/// The seeding, in one place: grows the table from `from_tombstones` to `to_tombstones`
/// tombstones (and, the first time, adds the live set), through `seed::seed` — indexes dropped
/// and rebuilt, one transaction per [`SEED_CHUNK`] rows, `synchronous_commit = off` for the seed
/// only, then `VACUUM (FREEZE, ANALYZE)` and `CHECKPOINT` before anything is measured.
async fn grow(
    client: &Client,
    db: &str,
    from_tombstones: i64,
    to_tombstones: i64,
    with_live: bool,
    history_start: chrono::DateTime<chrono::Utc>,
    step_ms: f64,
) -> Result<SeedReport> {
    let mut batches = Vec::new();
    let mut first = from_tombstones + 1;
    while first <= to_tombstones {
        let last = (first + SEED_CHUNK - 1).min(to_tombstones);
        batches.push(Batch {
            tag: TOMBSTONE_TAG,
            first,
            last,
            deadline0: format!("'{}'::timestamptz", history_start.to_rfc3339()),
            step: format!("{step_ms:.6} ms"),
            tombstones: true,
            keys: crate::seed::Keys::Uuid,
        });
        first = last + 1;
    }
    if with_live {
        let step = 86_400_000 / LIVE;
        batches.push(Batch {
            tag: LIVE_TAG,
            first: 1,
            last: LIVE,
            deadline0: "now() + interval '2 days'".into(),
            step: format!("{step} ms"),
            tombstones: false,
            keys: crate::seed::Keys::Uuid,
        });
    }
    client.batch_execute("SET synchronous_commit = off").await?;
    let report = seed::seed(client, db, &batches).await;
    client.batch_execute("RESET synchronous_commit").await?;
    let report = report?;
    seed::verify(
        client,
        TOMBSTONE_TAG,
        &[from_tombstones + 1, to_tombstones],
        seed::Keys::Uuid,
    )
    .await?;
    if with_live {
        seed::verify(client, LIVE_TAG, &[1, LIVE], seed::Keys::Uuid).await?;
    }
    Ok(report)
}

/// The table's sizes, from the catalogue (the primary key by `indisprimary`, the due index as the
/// partial index on live records).
async fn sizes(client: &Client) -> Result<Sizes> {
    let table = "tombstoned.idempotency_records";
    let row = client
        .query_one(
            "SELECT pg_relation_size($1::text::regclass),
                    pg_total_relation_size($1::text::regclass)",
            &[&table],
        )
        .await?;
    let mut sizes = Sizes {
        heap_bytes: row.get(0),
        total_bytes: row.get(1),
        ..Sizes::default()
    };
    for r in client
        .query(
            "SELECT c.relname::text, pg_relation_size(c.oid), i.indisprimary,
                    coalesce(pg_get_expr(i.indpred, i.indrelid), '')
             FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE i.indrelid = $1::text::regclass ORDER BY 1",
            &[&table],
        )
        .await?
    {
        let (name, bytes, primary, predicate): (String, i64, bool, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        if primary {
            sizes.primary_key_bytes = bytes;
        } else if name.contains("due") || predicate.contains("NOT expired") {
            sizes.due_index_bytes = bytes;
        }
        sizes.indexes.push((name, bytes));
    }
    Ok(sizes)
}

/// Replays of random live records: 201 with `Idempotent-Replayed: true` and the stored body.
fn replay_stream() -> Make {
    Arc::new(move |_, rng| {
        let record = Record::new(LIVE_TAG, rng.between(1, LIVE), false);
        (
            post_order(&token(record.principal), &record.key, record.body()),
            Expect::Replayed(record.request_id.clone()),
            "replay",
        )
    })
}

/// Claims of new keys (data set `tag`, request `k`): 201, not a replay.
fn claim_stream(tag: String) -> Make {
    Arc::new(move |k, _| {
        let record = Record::new(&tag, k as i64 + 1, false);
        (
            post_order(&token(record.principal), &record.key, record.body()),
            Expect::Created,
            "claim",
        )
    })
}

/// One repetition: replays, claims, (their window passes) a cleanup run on the claims, VACUUM.
async fn rep(bench: &Bench, daemon: &Daemon, db: &str, keys: i64, rep: usize) -> Result<Rep> {
    let rate = bench.scale.s3_rate;
    let replays = open_loop(
        daemon.api,
        rate,
        Duration::from_secs(bench.scale.s9_replay_seconds),
        replay_stream(),
    )
    .await?;
    let claim_seconds = bench.scale.s9_claims.div_ceil(rate.max(1));
    let claims = open_loop(
        daemon.api,
        rate,
        Duration::from_secs(claim_seconds),
        claim_stream(format!("fv_claim_{keys}_{rep}")),
    )
    .await?;
    // The claims' replay window (the daemon's) has to pass before they are due: a deadline, not
    // a race, so waiting it out is exact.
    tokio::time::sleep(CLAIM_WINDOW + Duration::from_millis(500)).await;
    let client = bench.server.connect(db).await?;
    client.batch_execute("CHECKPOINT").await?;
    let run = CleanupProcess::run(bench, &bench.binary, db, &[], &[]).await?;
    let started = std::time::Instant::now();
    client.batch_execute("VACUUM idempotency_records").await?;
    let vacuum_seconds = started.elapsed().as_secs_f64();
    let created = claims.completed - claims.error_count;
    ensure!(
        run.rows() == created as i64,
        "the cleanup run tombstoned {} rows, the claims created {created}",
        run.rows()
    );
    let r = Rep {
        rep,
        cleanup_rows: run.rows(),
        cleanup_seconds: run.seconds,
        cleanup_engine_seconds: run.report["duration_seconds"]
            .as_f64()
            .unwrap_or(run.seconds),
        cleanup_batch_p99_ms: run.batch_p99_ms(),
        vacuum_seconds,
        replays,
        claims,
    };
    eprintln!(
        "  {} keys rep {rep}: claim p50 {:.2} / p99 {:.2} ms, replay p50 {:.2} / p99 {:.2} ms, \
         cleanup {} rows {:.1} µs/row (engine {:.1}), VACUUM {:.2} s, errors {}+{}",
        keys_label(keys as f64),
        r.claims.latency.p50_ms,
        r.claims.latency.p99_ms,
        r.replays.latency.p50_ms,
        r.replays.latency.p99_ms,
        r.cleanup_rows,
        r.cleanup_us_per_row(),
        r.engine_us_per_row(),
        r.vacuum_seconds,
        r.claims.error_count,
        r.replays.error_count,
    );
    Ok(r)
}

/// Scenario 9.
pub async fn scenario9(bench: &mut Bench) -> Result<ScenarioResult> {
    let reps = bench.scale.reps;
    let mut sizes_wanted = bench.scale.s9_keys.clone();
    sizes_wanted.sort_unstable();
    sizes_wanted.dedup();
    let largest = *sizes_wanted.last().context("no sizes for scenario 9")?;
    ensure!(
        sizes_wanted[0] >= LIVE * 20,
        "scenario 9 needs at least {} keys (≥ 95 % tombstones)",
        LIVE * 20
    );

    // Scenario 1's run is the reference for the small runs; when scenario 1 did not run, run
    // its `tombstoned cleanup` trials here, before the big table takes the disk.
    let mut reference = bench.s1_tombstoned.clone();
    if reference.is_empty() {
        let s1 = bench.template("s1").await?;
        for rep in 0..reps {
            reference.push(cleanup::trial(bench, &s1, Approach::Tombstoned, rep, false).await?);
        }
    }
    let reference_us = median(
        &reference
            .iter()
            .map(|t| t.seconds / t.rows.max(1) as f64 * 1e6)
            .collect::<Vec<_>>(),
    )
    .unwrap_or(f64::NAN);

    let db = bench.server.db_name("forever");
    bench.server.create_db(&db).await?;
    crate::migrate(&bench.server, &db).await?;
    let client = bench.server.connect(&db).await?;
    let history_start: chrono::DateTime<chrono::Utc> = client
        .query_one(
            "SELECT now() - $1::text::interval",
            &[&format!("{HISTORY_DAYS} days")],
        )
        .await?
        .get(0);
    // Deadlines rise with insertion over the whole history at the largest size.
    let step_ms = (HISTORY_DAYS * 86_400_000) as f64 / (largest - LIVE) as f64;

    let mut points: Vec<Point> = Vec::new();
    let (mut tombstones, mut claimed) = (0i64, 0i64);
    for &target in &sizes_wanted {
        let to = target - LIVE - claimed;
        let report = grow(
            &client,
            &db,
            tombstones,
            to,
            points.is_empty(),
            history_start,
            step_ms,
        )
        .await?;
        tombstones = to;
        eprintln!(
            "  grew to {} keys: {} rows in {:.1} s (+{:.1} s indexes, {:.1} s vacuum) = {:.0} rows/s",
            keys_label(target as f64),
            report.rows,
            report.insert_seconds,
            report.index_seconds,
            report.vacuum_seconds,
            report.rows as f64 / report.insert_seconds.max(1e-9)
        );
        let table_sizes = sizes(&client).await?;
        // A fresh daemon per size (its pool and caches start alike at every size), with a short
        // replay window so its claims are the cleaner's next run.
        bench.daemon_env.push((
            "TOMBSTONED_RETENTION__REPLAY_WINDOW".into(),
            humantime::format_duration(CLAIM_WINDOW).to_string(),
        ));
        let daemon = Daemon::start(bench, &db, 16).await;
        bench.daemon_env.pop();
        let daemon = daemon?;
        // Warm-up: the pool opens its connections, the caches fill.
        open_loop(
            daemon.api,
            bench.scale.s3_rate,
            Duration::from_secs(1),
            replay_stream(),
        )
        .await?;
        let keys = tombstones + LIVE + claimed;
        let mut point = Point {
            keys,
            tombstones: tombstones + claimed,
            seed: report,
            sizes: table_sizes,
            reps: Vec::new(),
            load_average: (crate::loadavg(), String::new()),
        };
        for r in 0..reps {
            let measured = rep(bench, &daemon, &db, target, r).await?;
            claimed += measured.cleanup_rows;
            point.reps.push(measured);
        }
        daemon.stop().await?;
        point.load_average.1 = crate::loadavg();
        eprintln!(
            "  {} keys measured, load average {} before, {} after",
            keys_label(target as f64),
            point.load_average.0,
            point.load_average.1
        );
        points.push(point);
    }
    drop(client);
    bench.server.drop_db(&db).await?;

    let svg = chart(&points, reference_us);
    let svg_path = bench.root.join("target/bench/scale.svg");
    if let Some(dir) = svg_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&svg_path, svg).with_context(|| format!("writing {}", svg_path.display()))?;
    eprintln!("  curves: {}", svg_path.display());

    let (rows, checks) = table(bench, &points, reference_us);
    Ok(ScenarioResult {
        id: 9,
        title: "The forever table from 1 M to 50 M keys".into(),
        rows,
        checks,
        details: json!({
            "live_records": LIVE,
            "history_days": HISTORY_DAYS,
            "rate_per_second": bench.scale.s3_rate,
            "claims_per_rep": bench.scale.s9_claims,
            "replay_seconds": bench.scale.s9_replay_seconds,
            "claim_replay_window_seconds": CLAIM_WINDOW.as_secs_f64(),
            "scenario1_us_per_row": reference_us,
            "scenario1_trials": reference,
            "points": points,
            "svg": svg_path,
        }),
        seconds: 0.0,
    })
}

/// The report's rows: each measurement at each size against its value at the smallest size, and
/// the three targets (as ratios largest / smallest; small runs against scenario 1).
fn table(
    bench: &Bench,
    points: &[Point],
    reference_us: f64,
) -> (Vec<Row>, Vec<crate::report::Check>) {
    let quick = bench.scale.quick;
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    let Some(first) = points.first() else {
        return (rows, checks);
    };
    let rate = bench.scale.s3_rate;
    type Metric = (&'static str, fn(&Rep) -> f64, usize);
    let metrics: [Metric; 7] = [
        ("claim p50 ms", claim_p50, 2),
        ("claim p99 ms", claim_p99, 2),
        ("replay p50 ms", replay_p50, 2),
        ("replay p99 ms", replay_p99, 2),
        ("cleanup µs/row, engine", Rep::engine_us_per_row, 1),
        ("small run µs/row (process)", Rep::cleanup_us_per_row, 1),
        ("VACUUM after the run, s", |r: &Rep| r.vacuum_seconds, 2),
    ];
    for p in points {
        let label = keys_label(p.keys as f64);
        for (name, f, decimals) in metrics {
            let value = p.med(f);
            let base = first.med(f);
            rows.push(Row {
                scenario: 9,
                metric: format!("{label} keys: {name}"),
                baseline: if std::ptr::eq(p, first) {
                    String::new()
                } else {
                    num(base, decimals)
                },
                tombstoned: num(value, decimals),
                ratio: if std::ptr::eq(p, first) {
                    String::new()
                } else {
                    num(ratio(value, base), 2)
                },
                pair_ratio: String::new(),
                range: range(&p.values(f), decimals, ""),
                target: String::new(),
                verdict: String::new(),
            });
        }
        let errors: u64 = p
            .reps
            .iter()
            .map(|r| r.claims.error_count + r.replays.error_count)
            .sum();
        let mut all = std::collections::BTreeMap::new();
        for r in &p.reps {
            for (k, v) in r.claims.errors.iter().chain(&r.replays.errors) {
                *all.entry(k.clone()).or_insert(0u64) += v;
            }
        }
        rows.push(Row {
            scenario: 9,
            metric: format!("{label} keys: claim and replay errors at {rate}/s"),
            baseline: String::new(),
            tombstoned: errors.to_string(),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: error_kinds(&all),
            target: "0".into(),
            verdict: check(
                &mut checks,
                9,
                &format!("{label}: no claim or replay errors"),
                errors as f64,
                "0",
                errors == 0,
                quick,
            ),
        });
        rows.push(Row {
            scenario: 9,
            metric: format!("{label} keys: load average (1, 5, 15 min) before / after"),
            baseline: String::new(),
            tombstoned: String::new(),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: format!("{} / {}", p.load_average.0, p.load_average.1),
            target: String::new(),
            verdict: String::new(),
        });
        let mb = |b: i64| b as f64 / 1048576.0;
        rows.push(Row {
            scenario: 9,
            metric: format!(
                "{label} keys: heap / primary key / due index MB (all-in bytes per key)"
            ),
            baseline: String::new(),
            tombstoned: format!(
                "{} / {} / {}",
                num(mb(p.sizes.heap_bytes), 0),
                num(mb(p.sizes.primary_key_bytes), 0),
                num(mb(p.sizes.due_index_bytes), 1)
            ),
            ratio: String::new(),
            pair_ratio: String::new(),
            range: format!(
                "{} B/key",
                num(p.sizes.total_bytes as f64 / p.keys.max(1) as f64, 0)
            ),
            target: String::new(),
            verdict: String::new(),
        });
    }
    let last = points.last().unwrap_or(first);
    let grew = points.len() > 1;
    let span = format!(
        "{} / {}",
        keys_label(last.keys as f64),
        keys_label(first.keys as f64)
    );
    let claim = ratio(last.med(claim_p99), first.med(claim_p99));
    let clean = ratio(
        last.med(Rep::engine_us_per_row),
        first.med(Rep::engine_us_per_row),
    );
    let small = ratio(last.med(Rep::cleanup_us_per_row), reference_us);
    if grew {
        rows.push(Row {
            scenario: 9,
            metric: format!("target: claim p99, {span}"),
            baseline: num(first.med(claim_p99), 2),
            tombstoned: num(last.med(claim_p99), 2),
            ratio: num(claim, 2),
            pair_ratio: String::new(),
            range: String::new(),
            target: "<= 1.25".into(),
            verdict: check(
                &mut checks,
                9,
                &format!("claim p99 {span} <= 1.25"),
                claim,
                "<= 1.25",
                claim <= 1.25,
                quick,
            ),
        });
        rows.push(Row {
            scenario: 9,
            metric: format!("target: cleanup µs/row (engine), {span}"),
            baseline: num(first.med(Rep::engine_us_per_row), 1),
            tombstoned: num(last.med(Rep::engine_us_per_row), 1),
            ratio: num(clean, 2),
            pair_ratio: String::new(),
            range: String::new(),
            target: "<= 1.25".into(),
            verdict: check(
                &mut checks,
                9,
                &format!("cleanup µs per row {span} <= 1.25"),
                clean,
                "<= 1.25",
                clean <= 1.25,
                quick,
            ),
        });
    }
    rows.push(Row {
        scenario: 9,
        metric: format!(
            "target: small run µs/row at {} keys vs scenario 1 ({} rows due of {})",
            keys_label(last.keys as f64),
            bench.scale.s1_records / 2,
            bench.scale.s1_records
        ),
        baseline: num(reference_us, 1),
        tombstoned: num(last.med(Rep::cleanup_us_per_row), 1),
        ratio: num(small, 2),
        pair_ratio: String::new(),
        range: String::new(),
        target: "<= 1.5".into(),
        verdict: check(
            &mut checks,
            9,
            &format!(
                "small runs at {} keys <= 1.5 x scenario 1",
                keys_label(last.keys as f64)
            ),
            small,
            "<= 1.5",
            small <= 1.5,
            quick,
        ),
    });
    (rows, checks)
}

/// The curves: latency, the cleaner's cost per row, VACUUM time and sizes against keys.
fn chart(points: &[Point], reference_us: f64) -> String {
    let series = |name: &str, color: &'static str, f: &dyn Fn(&Point) -> f64| Series {
        name: name.to_owned(),
        color,
        dashed: false,
        points: points.iter().map(|p| (p.keys as f64, f(p))).collect(),
    };
    let mb = |b: i64| b as f64 / 1048576.0;
    let mut reference = series("scenario 1 × 1.5 (the small-run target)", "#999", &|_| {
        reference_us * 1.5
    });
    reference.dashed = true;
    let panels = [
        Panel {
            title: "Claims and replays over HTTP (median of repetitions)".into(),
            unit: "ms".into(),
            series: vec![
                series("claim p99", "#d62728", &|p| p.med(claim_p99)),
                series("claim p50", "#ff9896", &|p| p.med(claim_p50)),
                series("replay p99", "#1f77b4", &|p| p.med(replay_p99)),
                series("replay p50", "#aec7e8", &|p| p.med(replay_p50)),
            ],
        },
        Panel {
            title: "Cleanup of the rows due, per row".into(),
            unit: "µs per row".into(),
            series: vec![
                series("cleanup, process", "#2ca02c", &|p| {
                    p.med(Rep::cleanup_us_per_row)
                }),
                series("cleanup, engine only", "#98df8a", &|p| {
                    p.med(Rep::engine_us_per_row)
                }),
                reference,
            ],
        },
        Panel {
            title: "VACUUM of the table after the cleanup run".into(),
            unit: "seconds".into(),
            series: vec![series("VACUUM", "#9467bd", &|p| {
                p.med(|r| r.vacuum_seconds)
            })],
        },
        Panel {
            title: "Sizes".into(),
            unit: "MB".into(),
            series: vec![
                series("heap", "#8c564b", &|p| mb(p.sizes.heap_bytes)),
                series("primary key", "#e377c2", &|p| mb(p.sizes.primary_key_bytes)),
                series("due index (live records only)", "#17becf", &|p| {
                    mb(p.sizes.due_index_bytes)
                }),
                series("all-in", "#7f7f7f", &|p| mb(p.sizes.total_bytes)),
            ],
        },
    ];
    crate::svg::render(
        "tombstoned, scenario 9: the forever table (costs against keys)",
        "cargo bench --bench scenarios -- --only 9 (BENCHMARKS.md, Round 3); medians of the repetitions at each size",
        &panels,
        2,
    )
}

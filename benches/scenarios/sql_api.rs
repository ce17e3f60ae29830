//! Scenario 8 (issues 23 and 28): the SQL API against the fused statement, on scenario 4's data,
//! both sides in the same run, alternating, at 16 clients.
//!
//! * Raw, through pgbench: a claim of a new key, the endpoint's fused transaction (`claim.sql`)
//!   against `claim()`, the order, its event and `complete()` pipelined in one round trip
//!   (`sql_api_claim.sql`); a replay, `replay.sql` against `claim()` on a key inside its window
//!   (`sql_api_replay.sql`).
//! * Through an endpoint, over HTTP (the closed-loop generator of scenario 4): `tombstoned serve`
//!   (the fused statement; an order and its outbox event) against the Rust payments example
//!   built on the SQL API (`payments.rs`; a payment and its outbox event), each with a pool of
//!   16, each a process of its own whose CPU is read from /proc; the replays of the payments
//!   side hit payments made through the service itself first.
//!
//! The figures are SQL API / fused (medians of the repetitions, and the median of the
//! per-repetition ratios): issue 23 keeps the fused statement for the endpoint when the functions
//! cost more than 10 % of either raw figure.

use std::time::Duration;

use anyhow::{Context as _, Result};
use serde::Serialize;

use crate::api_limit::{self, pgbench_args, Workload};
use crate::cpu::{self, Spent};
use crate::daemon::Daemon;
use crate::http_load::{closed_loop, error_kinds, LoadResult, Make};
use crate::payments::{self, PaymentsService, Role};
use crate::pgbench::{self, PgbenchResult};
use crate::report::{check, num, range, Row, ScenarioResult};
use crate::stats::{median, median_of_pair_ratios, ratio};
use crate::Bench;

/// Concurrent clients = database connections on every side.
const CLIENTS: usize = 16;

/// The endpoint's figure and its SQL API twin's, for one workload, raw.
struct Pair {
    workload: Workload,
    fused: Vec<PgbenchResult>,
    functions: Vec<PgbenchResult>,
}

/// The same through an endpoint: `tombstoned serve` and the payments service.
#[derive(Debug, Clone, Serialize)]
struct Endpoints {
    workload: Workload,
    /// `tombstoned serve` trials.
    fused: Vec<LoadResult>,
    /// The payments service's trials.
    sql_api: Vec<LoadResult>,
    /// CPU seconds during each `serve` trial (`daemon`: the server process).
    fused_cpu: Vec<Spent>,
    /// CPU seconds during each payments trial (`daemon`: the server process).
    sql_api_cpu: Vec<Spent>,
    /// Replays: how long making the payments' replay set through the service took.
    replay_set_seconds: Option<f64>,
}

/// The twin of a fused script.
fn functions_script(workload: Workload) -> &'static str {
    match workload {
        Workload::Claims => "sql_api_claim.sql",
        Workload::Replays => "sql_api_replay.sql",
    }
}

/// Scenario 8.
pub async fn scenario8(bench: &mut Bench) -> Result<ScenarioResult> {
    let template = bench.template("s4").await?;
    let mut pairs = Vec::new();
    for workload in [Workload::Claims, Workload::Replays] {
        pairs.push(raw(bench, &template, workload).await?);
    }
    let role = Role::create(&bench.server).await?;
    let mut endpoints = Vec::new();
    for workload in [Workload::Claims, Workload::Replays] {
        endpoints.push(through_endpoints(bench, &template, &role, workload).await?);
    }
    role.drop(&bench.server).await?;

    let quick = bench.scale.quick;
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    for (p, e) in pairs.iter().zip(&endpoints) {
        let name = format!("{:?} at {CLIENTS} clients", p.workload).to_lowercase();
        raw_rows(&mut rows, &mut checks, &name, p, quick);
        endpoint_rows(&mut rows, &name, e);
        let failed: u64 = p.fused.iter().chain(&p.functions).map(|r| r.failed).sum();
        anyhow::ensure!(failed == 0, "{name}: {failed} pgbench transactions failed");
        for (side, trials) in [("tombstoned serve", &e.fused), ("payments", &e.sql_api)] {
            let errors: u64 = trials.iter().map(|r| r.error_count).sum();
            anyhow::ensure!(
                errors == 0,
                "{name}: {errors} wrong answers from {side}: {}",
                trials
                    .iter()
                    .map(|r| error_kinds(&r.errors))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
    }
    let details = serde_json::json!({
        "clients": CLIENTS,
        "raw": pairs
            .iter()
            .map(|p| serde_json::json!({
                "workload": p.workload,
                "fused": p.fused,
                "functions": p.functions,
            }))
            .collect::<Vec<_>>(),
        "endpoints": endpoints,
    });
    Ok(ScenarioResult {
        id: 8,
        title: "SQL API (claim/complete functions) vs the fused statement: raw (pgbench) and \
                through an endpoint (HTTP)"
            .to_owned(),
        rows,
        checks,
        details,
        seconds: 0.0,
    })
}

/// The raw half: the two pgbench scripts on a fresh copy of the data, alternating.
async fn raw(bench: &Bench, template: &str, workload: Workload) -> Result<Pair> {
    let duration = Duration::from_secs(bench.scale.s4_seconds);
    let warmup = Duration::from_secs(bench.scale.s4_warmup_seconds);
    let db = bench
        .server
        .db_name(&format!("sqlapi_{workload:?}").to_lowercase());
    bench.server.copy_db(template, &db).await?;
    let (fused_script, defines) = pgbench_args(bench, workload);
    let twin = functions_script(workload);
    for script in [fused_script, twin] {
        pgbench::run(bench, &db, script, CLIENTS, warmup, &defines).await?;
    }
    let mut pair = Pair {
        workload,
        fused: Vec::new(),
        functions: Vec::new(),
    };
    // Alternating which goes first, so a drift of the machine's load hits both alike.
    for rep in 0..bench.scale.reps {
        let fused_first = rep % 2 == 0;
        for first in [fused_first, !fused_first] {
            let (script, into) = if first {
                (fused_script, &mut pair.fused)
            } else {
                (twin, &mut pair.functions)
            };
            into.push(pgbench::run(bench, &db, script, CLIENTS, duration, &defines).await?);
        }
    }
    bench.server.drop_db(&db).await?;
    Ok(pair)
}

/// The HTTP half: `tombstoned serve` and the payments service on one fresh copy of the data
/// (with the payments service's grants and table), alternating, each trial after a warm-up.
async fn through_endpoints(
    bench: &Bench,
    template: &str,
    role: &Role,
    workload: Workload,
) -> Result<Endpoints> {
    let duration = Duration::from_secs(bench.scale.s4_seconds);
    let warmup = Duration::from_secs(bench.scale.s4_warmup_seconds);
    let db = bench
        .server
        .db_name(&format!("sqlapi_http_{workload:?}").to_lowercase());
    bench.server.copy_db(template, &db).await?;
    role.set_up(&bench.server, &db).await?;
    let daemon = Daemon::start(bench, &db, CLIENTS).await?;
    let service = PaymentsService::start(&role.url(&bench.server, &db), CLIENTS).await?;
    let admin = bench.server.admin().await?;
    let mut replay_set_seconds = None;
    let sql_api_requests: Make = match workload {
        Workload::Claims => payments::claims(),
        Workload::Replays => {
            let keys = bench.scale.s4_replay_keys;
            let took = payments::seed_replay_set(service.addr, keys).await?;
            eprintln!(
                "  payments' replay set: {keys} payments through the service in {:.1} s",
                took.as_secs_f64()
            );
            replay_set_seconds = Some(took.as_secs_f64());
            // Settled pages, as the seeded records have (seed.rs).
            bench
                .server
                .connect(&db)
                .await?
                .batch_execute("VACUUM ANALYZE idempotency_records, public.payments")
                .await
                .context("vacuuming the payments' replay set")?;
            payments::replays(keys)
        }
    };
    let fused_requests = api_limit::requests(bench, workload);
    let postmaster = cpu::postmaster_pid(bench.server.data_dir());
    let mut e = Endpoints {
        workload,
        fused: Vec::new(),
        sql_api: Vec::new(),
        fused_cpu: Vec::new(),
        sql_api_cpu: Vec::new(),
        replay_set_seconds,
    };
    for rep in 0..bench.scale.reps {
        let fused_first = rep % 2 == 0;
        for fused in [fused_first, !fused_first] {
            let (label, addr, pid, make) = if fused {
                ("serve   ", daemon.api, daemon.pid, &fused_requests)
            } else {
                ("payments", service.addr, service.pid, &sql_api_requests)
            };
            admin.batch_execute("CHECKPOINT").await?;
            closed_loop(addr, CLIENTS, Duration::ZERO, warmup, make.clone()).await?;
            let before = cpu::Sample::take(postmaster, Some(pid));
            let r = closed_loop(addr, CLIENTS, Duration::ZERO, duration, make.clone()).await?;
            let spent = cpu::Sample::take(postmaster, Some(pid)).since(&before);
            let per = |seconds: f64| seconds * 1e6 / r.completed.max(1) as f64;
            eprintln!(
                "  rep {rep} {workload:?} x{CLIENTS} {label} {:>7.0} req/s, p99 {:>6.2} ms, errors {}, \
                 CPU µs/req: server {:.0}, postgres {:.0}, load generator {:.0}; idle {:.0}%",
                r.per_second,
                r.latency.p99_ms,
                r.error_count,
                per(spent.daemon),
                per(spent.postgres),
                per(spent.bench),
                spent.idle_fraction * 100.0
            );
            let (results, cpus) = if fused {
                (&mut e.fused, &mut e.fused_cpu)
            } else {
                (&mut e.sql_api, &mut e.sql_api_cpu)
            };
            results.push(r);
            cpus.push(spent);
        }
    }
    service.stop().await?;
    daemon.stop().await?;
    bench.server.drop_db(&db).await?;
    Ok(e)
}

/// The raw half's rows (issue 23's gate: the functions >= 0.9 x the fused statement).
fn raw_rows(
    rows: &mut Vec<Row>,
    checks: &mut Vec<crate::report::Check>,
    name: &str,
    p: &Pair,
    quick: bool,
) {
    let fused: Vec<f64> = p.fused.iter().map(|r| r.tps).collect();
    let functions: Vec<f64> = p.functions.iter().map(|r| r.tps).collect();
    let (mf, mx) = (
        median(&fused).unwrap_or(f64::NAN),
        median(&functions).unwrap_or(f64::NAN),
    );
    let r = ratio(mx, mf);
    rows.push(Row {
        scenario: 8,
        metric: format!("{name}, raw (pgbench): tx/s, SQL API vs fused statement"),
        baseline: num(mf, 0),
        tombstoned: num(mx, 0),
        ratio: num(r, 2),
        pair_ratio: num(
            median_of_pair_ratios(&functions, &fused).unwrap_or(f64::NAN),
            2,
        ),
        range: format!(
            "functions {} / fused {}",
            range(&functions, 0, ""),
            range(&fused, 0, "")
        ),
        target: ">= 0.9 (else keep fused)".to_owned(),
        verdict: check(
            checks,
            8,
            &format!("{name}: SQL API >= 0.9 x the fused statement"),
            r,
            ">= 0.9",
            r >= 0.9,
            quick,
        ),
    });
    let p99 = |rs: &[PgbenchResult]| {
        median(&rs.iter().map(|r| r.latency.p99_ms).collect::<Vec<_>>()).unwrap_or(f64::NAN)
    };
    rows.push(Row {
        scenario: 8,
        metric: format!("  {name}, raw (pgbench): p99 ms"),
        baseline: num(p99(&p.fused), 2),
        tombstoned: num(p99(&p.functions), 2),
        ratio: num(ratio(p99(&p.functions), p99(&p.fused)), 2),
        pair_ratio: String::new(),
        range: String::new(),
        target: String::new(),
        verdict: String::new(),
    });
}

/// The HTTP half's rows: requests/s, p99, and the CPU per request of each server process and of
/// PostgreSQL; reported, not gated.
fn endpoint_rows(rows: &mut Vec<Row>, name: &str, e: &Endpoints) {
    let per_second = |rs: &[LoadResult]| rs.iter().map(|r| r.per_second).collect::<Vec<_>>();
    let (fused, sql_api) = (per_second(&e.fused), per_second(&e.sql_api));
    let (mf, mx) = (
        median(&fused).unwrap_or(f64::NAN),
        median(&sql_api).unwrap_or(f64::NAN),
    );
    let business = match e.workload {
        Workload::Claims => " (payment + event vs order + event)",
        Workload::Replays => "",
    };
    rows.push(Row {
        scenario: 8,
        metric: format!(
            "{name}, endpoint (HTTP): req/s, rust-payments on the SQL API vs tombstoned serve{business}"
        ),
        baseline: num(mf, 0),
        tombstoned: num(mx, 0),
        ratio: num(ratio(mx, mf), 2),
        pair_ratio: num(
            median_of_pair_ratios(&sql_api, &fused).unwrap_or(f64::NAN),
            2,
        ),
        range: format!(
            "payments {} / serve {}",
            range(&sql_api, 0, ""),
            range(&fused, 0, "")
        ),
        target: String::new(),
        verdict: String::new(),
    });
    let p99 = |rs: &[LoadResult]| {
        median(&rs.iter().map(|r| r.latency.p99_ms).collect::<Vec<_>>()).unwrap_or(f64::NAN)
    };
    let (pf, px) = (p99(&e.fused), p99(&e.sql_api));
    rows.push(Row {
        scenario: 8,
        metric: format!("  {name}, endpoint (HTTP): p99 ms"),
        baseline: num(pf, 2),
        tombstoned: num(px, 2),
        ratio: num(ratio(px, pf), 2),
        pair_ratio: String::new(),
        range: String::new(),
        target: String::new(),
        verdict: String::new(),
    });
    // Median over the trials of CPU seconds per completed request, in µs.
    let cpu_per_request = |rs: &[LoadResult], cpus: &[Spent], of: fn(&Spent) -> f64| {
        let each: Vec<f64> = rs
            .iter()
            .zip(cpus)
            .map(|(r, s)| of(s) * 1e6 / r.completed.max(1) as f64)
            .collect();
        median(&each).unwrap_or(f64::NAN)
    };
    let of_server: fn(&Spent) -> f64 = |s| s.daemon;
    let of_postgres: fn(&Spent) -> f64 = |s| s.postgres;
    for (what, of) in [("server process", of_server), ("PostgreSQL", of_postgres)] {
        let (cf, cx) = (
            cpu_per_request(&e.fused, &e.fused_cpu, of),
            cpu_per_request(&e.sql_api, &e.sql_api_cpu, of),
        );
        rows.push(Row {
            scenario: 8,
            metric: format!("  {name}, endpoint (HTTP): CPU µs/request, {what}"),
            baseline: num(cf, 0),
            tombstoned: num(cx, 0),
            ratio: num(ratio(cx, cf), 2),
            pair_ratio: String::new(),
            range: String::new(),
            target: String::new(),
            verdict: String::new(),
        });
    }
}

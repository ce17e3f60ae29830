//! Scenario 11: claims through a transaction pooler (issue 28, target 4: claims through
//! PgBouncer in transaction mode >= 0.8 x claims on a direct connection with prepared
//! statements).
//!
//! On scenario 4's data (a fresh copy per workload), claims of new keys and replays of existing
//! ones at 16 closed-loop clients over HTTP, against two `tombstoned serve` daemons on the same
//! database, each with a pool of 16: one connected directly (`database.pooler = "none"`: the
//! fused claim statement prepared once per connection), one through a real PgBouncer in
//! transaction mode with 16 server connections (`database.pooler = "transaction"`: every
//! statement unnamed, the fused statement run by its function, `endpoint_claim_order`, whose
//! plan PL/pgSQL keeps per server connection). The two alternate, each measured after a warm-up
//! of its own; CPU per process from /proc: PostgreSQL, the daemon, the load generator, and
//! PgBouncer's own.

use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use serde_json::json;
use tombstoned_testkit::pgbouncer::{PgBouncer, PoolMode};

use crate::api_limit::{requests, Workload};
use crate::cleanup::{statement_stats, StatementStats};
use crate::cpu::{self, Spent};
use crate::daemon::Daemon;
use crate::http_load::{closed_loop, error_kinds, LoadResult};
use crate::report::{check, num, range, Row, ScenarioResult};
use crate::stats::{median, median_of_pair_ratios, ratio};
use crate::Bench;

/// Concurrent clients, and each daemon's pool size.
const CLIENTS: usize = 16;
/// PgBouncer's server connections (`default_pool_size`): as many as the direct daemon has.
const SERVER_CONNECTIONS: u32 = 16;
/// Issue 28: claims through the transaction pooler >= 0.8 x direct.
const CLAIMS_FLOOR: f64 = 0.8;

/// How the daemon reaches PostgreSQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Path {
    /// Directly, `pooler = "none"`: prepared statements.
    Direct,
    /// Through PgBouncer in transaction mode, `pooler = "transaction"`.
    TransactionPooler,
}

/// One workload's trials, both paths.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// Claims or replays.
    pub workload: Workload,
    /// Direct trials.
    pub direct: Vec<LoadResult>,
    /// Trials through the pooler.
    pub pooled: Vec<LoadResult>,
    /// CPU seconds spent during each direct trial, by process.
    pub direct_cpu: Vec<Spent>,
    /// CPU seconds spent during each pooled trial, by process.
    pub pooled_cpu: Vec<Spent>,
    /// PgBouncer's CPU seconds during each pooled trial.
    pub pgbouncer_cpu: Vec<f64>,
    /// The busiest statements of each direct trial (pg_stat_statements; empty without it).
    pub direct_statements: Vec<Vec<StatementStats>>,
    /// The same for each pooled trial.
    pub pooled_statements: Vec<Vec<StatementStats>>,
}

/// Scenario 11.
pub async fn scenario11(bench: &mut Bench) -> Result<ScenarioResult> {
    let template = bench.template("s4").await?;
    let bouncer = bench
        .server
        .pgbouncer(PoolMode::Transaction, SERVER_CONNECTIONS)
        .await?;
    let mut groups = Vec::new();
    for workload in [Workload::Claims, Workload::Replays] {
        groups.push(group(bench, &template, &bouncer, workload).await?);
    }
    drop(bouncer);

    let quick = bench.scale.quick;
    let mut checks = Vec::new();
    let mut rows = Vec::new();
    let med = |v: Vec<f64>| median(&v).unwrap_or(f64::NAN);
    for g in &groups {
        let name = format!("{:?} at {CLIENTS} clients", g.workload).to_lowercase();
        let direct: Vec<f64> = g.direct.iter().map(|r| r.per_second).collect();
        let pooled: Vec<f64> = g.pooled.iter().map(|r| r.per_second).collect();
        let (md, mp) = (med(direct.clone()), med(pooled.clone()));
        let r = ratio(mp, md);
        let (target, verdict) = if g.workload == Workload::Claims {
            (
                format!(">= {CLAIMS_FLOOR}"),
                check(
                    &mut checks,
                    11,
                    &format!("{name}: through PgBouncer (transaction) >= {CLAIMS_FLOOR} x direct"),
                    r,
                    &format!(">= {CLAIMS_FLOOR}"),
                    r >= CLAIMS_FLOOR,
                    quick,
                ),
            )
        } else {
            (String::new(), String::new())
        };
        rows.push(Row {
            scenario: 11,
            metric: format!("{name}: tx/s, through PgBouncer (transaction) vs direct (prepared)"),
            baseline: num(md, 0),
            tombstoned: num(mp, 0),
            ratio: num(r, 2),
            pair_ratio: num(
                median_of_pair_ratios(&pooled, &direct).unwrap_or(f64::NAN),
                2,
            ),
            range: format!(
                "pooler {} / direct {}",
                range(&pooled, 0, ""),
                range(&direct, 0, "")
            ),
            target,
            verdict,
        });
        let errors: u64 = g
            .direct
            .iter()
            .chain(&g.pooled)
            .map(|r| r.error_count)
            .sum();
        let (p99_direct, p99_pooled) = (
            med(g.direct.iter().map(|r| r.latency.p99_ms).collect()),
            med(g.pooled.iter().map(|r| r.latency.p99_ms).collect()),
        );
        rows.push(Row {
            scenario: 11,
            metric: format!(
                "  {name}: p99 latency ms, through PgBouncer vs direct; errors {errors}"
            ),
            baseline: num(p99_direct, 2),
            tombstoned: num(p99_pooled, 2),
            ratio: num(ratio(p99_pooled, p99_direct), 2),
            pair_ratio: String::new(),
            range: if errors > 0 {
                g.direct
                    .iter()
                    .chain(&g.pooled)
                    .map(|r| error_kinds(&r.errors))
                    .collect::<Vec<_>>()
                    .join("; ")
            } else {
                String::new()
            },
            target: String::new(),
            verdict: String::new(),
        });
        let per_tx = |spent: &[Spent], loads: &[LoadResult], of: fn(&Spent) -> f64| {
            med(spent
                .iter()
                .zip(loads)
                .map(|(s, l)| of(s) * 1e6 / l.completed.max(1) as f64)
                .collect())
        };
        let (pg_direct, pg_pooled) = (
            per_tx(&g.direct_cpu, &g.direct, |s| s.postgres),
            per_tx(&g.pooled_cpu, &g.pooled, |s| s.postgres),
        );
        let bouncer_per_tx = med(g
            .pgbouncer_cpu
            .iter()
            .zip(&g.pooled)
            .map(|(s, l)| s * 1e6 / l.completed.max(1) as f64)
            .collect());
        let (daemon_direct, daemon_pooled) = (
            per_tx(&g.direct_cpu, &g.direct, |s| s.daemon),
            per_tx(&g.pooled_cpu, &g.pooled, |s| s.daemon),
        );
        rows.push(Row {
            scenario: 11,
            metric: format!(
                "  {name}: PostgreSQL CPU µs per request, through PgBouncer vs direct \
                 (PgBouncer {} µs; daemon {} vs {} µs)",
                num(bouncer_per_tx, 0),
                num(daemon_pooled, 0),
                num(daemon_direct, 0)
            ),
            baseline: num(pg_direct, 0),
            tombstoned: num(pg_pooled, 0),
            ratio: num(ratio(pg_pooled, pg_direct), 2),
            pair_ratio: String::new(),
            range: String::new(),
            target: String::new(),
            verdict: String::new(),
        });
    }
    Ok(ScenarioResult {
        id: 11,
        title: "claims through a transaction pooler".into(),
        rows,
        checks,
        details: json!({
            "clients": CLIENTS,
            "pgbouncer_server_connections": SERVER_CONNECTIONS,
            "seconds_per_trial": bench.scale.s4_seconds,
            "warmup_seconds": bench.scale.s4_warmup_seconds,
            "replay_keys": bench.scale.s4_replay_keys,
            "groups": groups,
        }),
        seconds: 0.0,
    })
}

async fn group(
    bench: &Bench,
    template: &str,
    bouncer: &PgBouncer,
    workload: Workload,
) -> Result<Group> {
    let db = bench
        .server
        .db_name(&format!("pooler_{workload:?}").to_lowercase());
    bench.server.copy_db(template, &db).await?;
    let direct = Daemon::start_on(
        bench,
        &bench.server.url(&db),
        CLIENTS,
        &[("TOMBSTONED_DATABASE__POOLER", "none")],
    )
    .await?;
    let pooled = Daemon::start_on(
        bench,
        &bouncer.url(&db),
        CLIENTS,
        &[("TOMBSTONED_DATABASE__POOLER", "transaction")],
    )
    .await?;
    let warmup = Duration::from_secs(bench.scale.s4_warmup_seconds);
    let duration = Duration::from_secs(bench.scale.s4_seconds);
    let make = requests(bench, workload);
    let admin = bench.server.admin().await?;
    let stats = bench.server.has_pg_stat_statements().await;
    let postmaster = cpu::postmaster_pid(bench.server.data_dir());
    let bouncer_pid = bouncer.pid();
    let mut g = Group {
        workload,
        direct: Vec::new(),
        pooled: Vec::new(),
        direct_cpu: Vec::new(),
        pooled_cpu: Vec::new(),
        pgbouncer_cpu: Vec::new(),
        direct_statements: Vec::new(),
        pooled_statements: Vec::new(),
    };
    for rep in 0..bench.scale.reps {
        let direct_first = rep % 2 == 0;
        for path in if direct_first {
            [Path::Direct, Path::TransactionPooler]
        } else {
            [Path::TransactionPooler, Path::Direct]
        } {
            let daemon = match path {
                Path::Direct => &direct,
                Path::TransactionPooler => &pooled,
            };
            admin.batch_execute("CHECKPOINT").await?;
            closed_loop(daemon.api, CLIENTS, Duration::ZERO, warmup, make.clone()).await?;
            if stats {
                admin
                    .batch_execute("SELECT pg_stat_statements_reset()")
                    .await?;
            }
            let before = cpu::Sample::take(postmaster, Some(daemon.pid));
            let bouncer_before = cpu::process_seconds(bouncer_pid);
            let r =
                closed_loop(daemon.api, CLIENTS, Duration::ZERO, duration, make.clone()).await?;
            let spent = cpu::Sample::take(postmaster, Some(daemon.pid)).since(&before);
            let bouncer_spent = cpu::process_seconds(bouncer_pid) - bouncer_before;
            let statements = if stats {
                statement_stats(&admin, &db).await?
            } else {
                Vec::new()
            };
            let per_tx = |seconds: f64| seconds * 1e6 / r.completed.max(1) as f64;
            eprintln!(
                "  rep {rep} {workload:?} x{CLIENTS} {:<18} {:>7.0} tx/s, p99 {:>6.2} ms, \
                 errors {}, CPU µs/tx: postgres {:.0}, daemon {:.0}, pgbouncer {:.0}, load \
                 generator {:.0}; idle {:.0}%",
                format!("{path:?}"),
                r.per_second,
                r.latency.p99_ms,
                r.error_count,
                per_tx(spent.postgres),
                per_tx(spent.daemon),
                if path == Path::TransactionPooler {
                    per_tx(bouncer_spent)
                } else {
                    0.0
                },
                per_tx(spent.bench),
                spent.idle_fraction * 100.0
            );
            match path {
                Path::Direct => {
                    g.direct.push(r);
                    g.direct_cpu.push(spent);
                    g.direct_statements.push(statements);
                }
                Path::TransactionPooler => {
                    g.pooled.push(r);
                    g.pooled_cpu.push(spent);
                    g.pgbouncer_cpu.push(bouncer_spent);
                    g.pooled_statements.push(statements);
                }
            }
        }
    }
    direct.stop().await?;
    pooled.stop().await?;
    bench.server.drop_db(&db).await?;
    Ok(g)
}

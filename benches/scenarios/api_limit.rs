//! Scenario 4: the API against the database's own limit.
//!
//! Claims of new keys and replays of existing ones, at 16 and 32 concurrent clients: the Rust
//! closed-loop generator over HTTP against `tombstoned serve` (pool size = the client count, so
//! both sides use the same number of database connections), versus pgbench running the same
//! transactions (`bench/pgbench/claim.sql`, `replay.sql`: the product's statement, sent alone on
//! sessions carrying the lock timeout, as the API sends it on a direct connection) with
//! `-M prepared` and the same connection count. Each
//! (workload, clients) group runs on a fresh copy of the data (scenario 1's records plus a
//! replay set pgbench can address) with a fresh daemon; API and pgbench alternate inside it.
//!
//! Daemon memory: VmRSS right after start-up (idle) and VmHWM (peak) after the group's load,
//! from /proc/<pid>/status.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use crate::cleanup::{statement_stats, StatementStats};
use crate::cpu::{self, Spent};
use crate::daemon::{Daemon, Memory};
use crate::http_load::{closed_loop, error_kinds, post_order, Expect, LoadResult, Make};
use crate::pgbench::{self, PgbenchResult};
use crate::report::{check, num, range, Row, ScenarioResult};
use crate::seed::{token, Record, LOCK_TIMEOUT, WINDOW_US};
use crate::stats::{median, median_of_pair_ratios, ratio};
use crate::Bench;

// The claim both sides make (pgbench gets them as -D constants).
const AMOUNT_MINOR: i64 = 12345;
const AMOUNT: &str = "123.45";
const ITEM: &str = "Ergonomic mesh office chair with adjustable lumbar support, black";
const QUANTITY: i32 = 2;
const RECIPIENT: &str = "Customer 77 <customer77@example.com>";
const METADATA: &str = r#"{"channel":"bench"}"#;
/// How long exited backends take to be reaped (CPU accounting).
const SETTLE: Duration = Duration::from_millis(1000);

/// Claims or replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// New keys: claim, order, outbox event.
    Claims,
    /// Existing keys: the replay read.
    Replays,
}

/// One (workload, clients) group.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// Workload.
    pub workload: Workload,
    /// Concurrent clients = database connections on both sides.
    pub clients: usize,
    /// API trials.
    pub api: Vec<LoadResult>,
    /// pgbench trials.
    pub pgbench: Vec<PgbenchResult>,
    /// CPU seconds spent during each API trial, by process.
    pub api_cpu: Vec<Spent>,
    /// CPU seconds spent during each pgbench trial, by process.
    pub pgbench_cpu: Vec<Spent>,
    /// The busiest statements of each measured API trial (pg_stat_statements; empty without it).
    pub api_statements: Vec<Vec<StatementStats>>,
    /// The same for each measured pgbench trial.
    pub pgbench_statements: Vec<Vec<StatementStats>>,
    /// Claims only: pgbench running claim.sql's extra UUID query alone, tx/s.
    pub uuid_query_tps: Option<f64>,
    /// Claims only: PostgreSQL's CPU µs per transaction of that query alone (what pgbench's
    /// claim spends on top of the claim statement).
    pub uuid_query_postgres_us: Option<f64>,
    /// Daemon memory right after start-up.
    pub idle: Memory,
    /// Daemon memory after the load (VmHWM = the peak).
    pub after: Memory,
    /// Daemon memory after 3 s idle following the load.
    pub idle_after_load: Memory,
}

/// Scenario 4.
pub async fn scenario4(bench: &mut Bench) -> Result<ScenarioResult> {
    let template = bench.template("s4").await?;
    let mut groups = Vec::new();
    for clients in [16, 32] {
        for workload in [Workload::Claims, Workload::Replays] {
            groups.push(group(bench, &template, workload, clients).await?);
        }
    }
    let quick = bench.scale.quick;
    let mut checks = Vec::new();
    let mut rows = Vec::new();
    for g in &groups {
        let api: Vec<f64> = g.api.iter().map(|r| r.per_second).collect();
        let pg: Vec<f64> = g.pgbench.iter().map(|r| r.tps).collect();
        let (ma, mp) = (
            median(&api).unwrap_or(f64::NAN),
            median(&pg).unwrap_or(f64::NAN),
        );
        let r = ratio(ma, mp);
        let name = format!("{:?} at {} clients", g.workload, g.clients).to_lowercase();
        let api_p99 =
            median(&g.api.iter().map(|r| r.latency.p99_ms).collect::<Vec<_>>()).unwrap_or(f64::NAN);
        let pg_p99 = median(
            &g.pgbench
                .iter()
                .map(|r| r.latency.p99_ms)
                .collect::<Vec<_>>(),
        )
        .unwrap_or(f64::NAN);
        let errors: u64 = g.api.iter().map(|r| r.error_count).sum::<u64>()
            + g.pgbench.iter().map(|r| r.failed).sum::<u64>();
        let adjusted = g.uuid_query_tps.map(|u| 1.0 / (1.0 / mp - 1.0 / u));
        // Issue 28: claims >= 0.8 x pgbench (issue 13 asked 0.9); issue 41: replays >= 0.65 x
        // (at 16 clients; 32 reported against the same bound).
        let floor = match g.workload {
            Workload::Claims => 0.8,
            Workload::Replays => 0.65,
        };
        rows.push(Row {
            scenario: 4,
            metric: format!("{name}: tx/s, API vs pgbench"),
            baseline: num(mp, 0),
            tombstoned: num(ma, 0),
            ratio: num(r, 2),
            pair_ratio: num(median_of_pair_ratios(&api, &pg).unwrap_or(f64::NAN), 2),
            range: format!("api {} / pg {}", range(&api, 0, ""), range(&pg, 0, "")),
            target: format!(">= {floor}"),
            verdict: check(
                &mut checks,
                4,
                &format!("{name}: API >= {floor} x pgbench tx/s"),
                r,
                &format!(">= {floor}"),
                r >= floor,
                quick,
            ),
        });
        if let (Some(adjusted), Some(u)) = (adjusted, g.uuid_query_tps) {
            rows.push(Row {
                scenario: 4,
                metric: format!(
                    "  {name}: vs pgbench without its UUID query (est.; that query alone {} tx/s)",
                    num(u, 0)
                ),
                baseline: num(adjusted, 0),
                tombstoned: num(ma, 0),
                ratio: num(ratio(ma, adjusted), 2),
                pair_ratio: String::new(),
                range: String::new(),
                target: String::new(),
                verdict: String::new(),
            });
        }
        let p99_ratio = ratio(api_p99, pg_p99);
        // Issue 13: a claim's p99 within 1.5 x pgbench's.
        let (p99_target, p99_verdict) = if g.workload == Workload::Claims {
            (
                "<= 1.5".to_owned(),
                check(
                    &mut checks,
                    4,
                    &format!("{name}: API p99 <= 1.5 x pgbench's"),
                    p99_ratio,
                    "<= 1.5",
                    p99_ratio <= 1.5,
                    quick,
                ),
            )
        } else {
            (String::new(), String::new())
        };
        // Issue 41, target 2: what PostgreSQL spends per API replay (per claim) against per
        // pgbench replay (claim) of the same statement, each the statement alone on sessions
        // carrying the same settings; pgbench's claim without its UUID query (measured alone and
        // subtracted). With the calls per transaction pg_stat_statements counted (it does not
        // count a prepared BEGIN or COMMIT again on each execution, so those are left out).
        let pg_cpu = |spent: &[Spent], done: &[u64]| {
            median(
                &spent
                    .iter()
                    .zip(done)
                    .map(|(s, n)| s.postgres * 1e6 / (*n).max(1) as f64)
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(f64::NAN)
        };
        let per_tx_statements = |stats: &[Vec<StatementStats>], done: &[u64]| {
            median(
                &stats
                    .iter()
                    .zip(done)
                    .map(|(st, n)| {
                        st.iter().map(|s| s.calls).sum::<i64>() as f64 / (*n).max(1) as f64
                    })
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(f64::NAN)
        };
        let api_done: Vec<u64> = g.api.iter().map(|r| r.completed).collect();
        let pg_done: Vec<u64> = g.pgbench.iter().map(|r| r.transactions).collect();
        let (cpu_api, cpu_pg) = (
            pg_cpu(&g.api_cpu, &api_done),
            pg_cpu(&g.pgbench_cpu, &pg_done) - g.uuid_query_postgres_us.unwrap_or(0.0),
        );
        let cpu_ratio = ratio(cpu_api, cpu_pg);
        let (cpu_target, cpu_verdict) = (
            "<= 1.10".to_owned(),
            check(
                &mut checks,
                4,
                &format!("{name}: PostgreSQL CPU per API request <= 1.10 x pgbench's"),
                cpu_ratio,
                "<= 1.10",
                cpu_ratio <= 1.10,
                quick,
            ),
        );
        rows.push(Row {
            scenario: 4,
            metric: format!(
                "  {name}: PostgreSQL CPU µs per transaction, API vs pgbench{} \
                 (statements per transaction besides BEGIN/COMMIT {} / {})",
                match g.uuid_query_postgres_us {
                    Some(u) => format!(" without its UUID query ({} µs)", num(u, 0)),
                    None => String::new(),
                },
                num(per_tx_statements(&g.api_statements, &api_done), 1),
                num(per_tx_statements(&g.pgbench_statements, &pg_done), 1)
            ),
            baseline: num(cpu_pg, 0),
            tombstoned: num(cpu_api, 0),
            ratio: num(cpu_ratio, 2),
            pair_ratio: String::new(),
            range: String::new(),
            target: cpu_target,
            verdict: cpu_verdict,
        });
        rows.push(Row {
            scenario: 4,
            metric: format!("  {name}: p99 latency ms, API (HTTP) vs pgbench; errors {errors}"),
            baseline: num(pg_p99, 2),
            tombstoned: num(api_p99, 2),
            ratio: num(p99_ratio, 2),
            pair_ratio: String::new(),
            range: if errors > 0 {
                g.api
                    .iter()
                    .map(|r| error_kinds(&r.errors))
                    .collect::<Vec<_>>()
                    .join("; ")
            } else {
                String::new()
            },
            target: p99_target,
            verdict: p99_verdict,
        });
    }
    let peak = groups.iter().map(|g| g.after.hwm_mib()).fold(0.0, f64::max);
    let idle = groups.iter().map(|g| g.idle.rss_mib()).fold(0.0, f64::max);
    let idle_after = groups
        .iter()
        .map(|g| g.idle_after_load.rss_mib())
        .fold(0.0, f64::max);
    rows.push(Row {
        scenario: 4,
        metric: "daemon peak RSS under this load (VmHWM), MiB".into(),
        baseline: String::new(),
        tombstoned: num(peak, 1),
        ratio: String::new(),
        pair_ratio: String::new(),
        range: range(
            &groups.iter().map(|g| g.after.hwm_mib()).collect::<Vec<_>>(),
            1,
            " MiB",
        ),
        target: "< 64 MiB".into(),
        verdict: check(
            &mut checks,
            4,
            "peak RSS < 64 MiB",
            peak,
            "< 64 MiB",
            peak < 64.0,
            quick,
        ),
    });
    rows.push(Row {
        scenario: 4,
        metric: format!(
            "daemon idle RSS after start-up, MiB (after load: {})",
            num(idle_after, 1)
        ),
        baseline: String::new(),
        tombstoned: num(idle, 1),
        ratio: String::new(),
        pair_ratio: String::new(),
        range: range(
            &groups.iter().map(|g| g.idle.rss_mib()).collect::<Vec<_>>(),
            1,
            " MiB",
        ),
        target: "< 24 MiB".into(),
        verdict: check(
            &mut checks,
            4,
            "idle RSS < 24 MiB",
            idle,
            "< 24 MiB",
            idle < 24.0,
            quick,
        ),
    });
    Ok(ScenarioResult {
        id: 4,
        title: "API against the database's own limit".into(),
        rows,
        checks,
        details: json!({
            "seconds_per_trial": bench.scale.s4_seconds,
            "warmup_seconds": bench.scale.s4_warmup_seconds,
            "replay_keys": bench.scale.s4_replay_keys,
            "groups": groups,
        }),
        seconds: 0.0,
    })
}

async fn group(bench: &Bench, template: &str, workload: Workload, clients: usize) -> Result<Group> {
    let db = bench
        .server
        .db_name(&format!("api_{workload:?}_{clients}").to_lowercase());
    bench.server.copy_db(template, &db).await?;
    let daemon = Daemon::start(bench, &db, clients).await?;
    let idle = daemon.memory()?;
    let warmup = Duration::from_secs(bench.scale.s4_warmup_seconds);
    let duration = Duration::from_secs(bench.scale.s4_seconds);
    let (script, defines) = pgbench_args(bench, workload);
    let make = requests(bench, workload);
    let postmaster = cpu::postmaster_pid(bench.server.data_dir());
    let sample = || cpu::Sample::take(postmaster, Some(daemon.pid));
    let (uuid_query_tps, uuid_query_postgres_us) = if workload == Workload::Claims {
        let before = sample();
        let r = pgbench::run(
            bench,
            &db,
            "uuids.sql",
            clients,
            Duration::from_secs(2),
            &[],
        )
        .await?;
        tokio::time::sleep(SETTLE).await;
        let spent = sample().since(&before);
        (
            Some(r.tps),
            Some(spent.postgres * 1e6 / r.transactions.max(1) as f64),
        )
    } else {
        (None, None)
    };
    let mut api = Vec::new();
    let mut pg = Vec::new();
    let mut api_cpu = Vec::new();
    let mut pgbench_cpu = Vec::new();
    let mut api_statements = Vec::new();
    let mut pgbench_statements = Vec::new();
    let admin = bench.server.admin().await?;
    let stats = bench.server.has_pg_stat_statements().await;
    let reset_stats = || async {
        if stats {
            admin
                .batch_execute("SELECT pg_stat_statements_reset()")
                .await?;
        }
        anyhow::Ok(())
    };
    let take_stats = || async {
        if stats {
            statement_stats(&admin, &db).await
        } else {
            Ok(Vec::new())
        }
    };
    for rep in 0..bench.scale.reps {
        let api_first = rep % 2 == 0;
        for run_api in [api_first, !api_first] {
            admin.batch_execute("CHECKPOINT").await?;
            if run_api {
                closed_loop(daemon.api, clients, Duration::ZERO, warmup, make.clone()).await?;
                reset_stats().await?;
                let before = sample();
                let r = closed_loop(daemon.api, clients, Duration::ZERO, duration, make.clone())
                    .await?;
                let spent = sample().since(&before);
                api_statements.push(take_stats().await?);
                eprintln!(
                    "  rep {rep} {workload:?} x{clients} API      {:>7.0} tx/s, p99 {:>6.2} ms, errors {}, \
                     CPU µs/tx: postgres {:.0}, daemon {:.0}, load generator {:.0}; idle {:.0}%",
                    r.per_second,
                    r.latency.p99_ms,
                    r.error_count,
                    spent.postgres * 1e6 / r.completed.max(1) as f64,
                    spent.daemon * 1e6 / r.completed.max(1) as f64,
                    spent.bench * 1e6 / r.completed.max(1) as f64,
                    spent.idle_fraction * 100.0
                );
                api.push(r);
                api_cpu.push(spent);
            } else {
                // pgbench has no warm-up option: a short run first, not counted.
                pgbench::run(bench, &db, script, clients, warmup, &defines).await?;
                // pgbench's backends exit after it; let the postmaster reap them, so their CPU
                // lands in the sample it belongs to.
                tokio::time::sleep(SETTLE).await;
                reset_stats().await?;
                let before = sample();
                let r = pgbench::run(bench, &db, script, clients, duration, &defines).await?;
                let machine = sample().since(&before);
                pgbench_statements.push(take_stats().await?);
                tokio::time::sleep(SETTLE).await;
                let mut spent = sample().since(&before);
                // The machine's idle share is that of the run, not of the wait after it.
                spent.idle_fraction = machine.idle_fraction;
                spent.machine_busy = machine.machine_busy;
                eprintln!(
                    "  rep {rep} {workload:?} x{clients} pgbench  {:>7.0} tx/s, p99 {:>6.2} ms, failed {}, \
                     CPU µs/tx: postgres {:.0}, pgbench {:.0}; idle {:.0}%",
                    r.tps,
                    r.latency.p99_ms,
                    r.failed,
                    spent.postgres * 1e6 / r.transactions.max(1) as f64,
                    spent.children * 1e6 / r.transactions.max(1) as f64,
                    spent.idle_fraction * 100.0
                );
                pg.push(r);
                pgbench_cpu.push(spent);
            }
        }
    }
    let after = daemon.memory()?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_after_load = daemon.memory()?;
    eprintln!(
        "  daemon RSS: idle {:.1} MiB, peak {:.1} MiB, idle after load {:.1} MiB, {} threads",
        idle.rss_mib(),
        after.hwm_mib(),
        idle_after_load.rss_mib(),
        after.threads
    );
    daemon.stop().await?;
    bench.server.drop_db(&db).await?;
    Ok(Group {
        workload,
        clients,
        api,
        pgbench: pg,
        api_cpu,
        pgbench_cpu,
        api_statements,
        pgbench_statements,
        uuid_query_tps,
        uuid_query_postgres_us,
        idle,
        after,
        idle_after_load,
    })
}

/// pgbench's script and constants for `workload` (scenario 8 reuses them for its SQL API twin).
pub fn pgbench_args(
    bench: &Bench,
    workload: Workload,
) -> (&'static str, Vec<(&'static str, String)>) {
    let mut d = vec![
        ("lock_timeout", LOCK_TIMEOUT.to_owned()),
        (
            "operation",
            tombstoned::claim::OPERATION_CREATE_ORDER.to_owned(),
        ),
        // Any 32 bytes: the API hashes the request; the database only stores them. Replays:
        // the fingerprint of pgbench's replay set (`seed::pgbench_replay_twin`).
        (
            "fingerprint",
            format!("\\x{}", hex::encode(crate::seed::PGBENCH_FINGERPRINT)),
        ),
        ("amount_minor", AMOUNT_MINOR.to_string()),
        ("amount", AMOUNT.to_owned()),
        ("currency", "CNY".to_owned()),
        ("item", ITEM.to_owned()),
        ("quantity", QUANTITY.to_string()),
        ("recipient", RECIPIENT.to_owned()),
        ("window_us", WINDOW_US.to_owned()),
        ("metadata", METADATA.to_owned()),
    ];
    match workload {
        Workload::Claims => ("claim.sql", d),
        Workload::Replays => {
            d.extend([
                ("replay_keys", bench.scale.s4_replay_keys.to_string()),
                ("tenant", "tenant-0".to_owned()),
                ("principal", crate::seed::PGBENCH_PRINCIPAL.to_owned()),
                ("request_id", uuid::Uuid::new_v4().to_string()),
                ("order_id", uuid::Uuid::now_v7().to_string()),
                ("event_id", uuid::Uuid::now_v7().to_string()),
            ]);
            ("replay.sql", d)
        }
    }
}

/// The API side (scenario 8's too): client `c` claims as principal `c % 16` (as pgbench's client
/// `c` does), or replays a random record of the replay set (principal 0; pgbench replays its twin).
pub fn requests(bench: &Bench, workload: Workload) -> Make {
    match workload {
        Workload::Claims => Arc::new(|c, _rng| {
            let body = json!({
                "request_id": uuid::Uuid::new_v4().to_string(),
                "amount_minor": AMOUNT_MINOR,
                "currency": "CNY",
                "item": ITEM,
                "quantity": QUANTITY,
                "recipient": RECIPIENT,
                "metadata": serde_json::from_str::<serde_json::Value>(METADATA).unwrap_or_default(),
            })
            .to_string();
            let key = uuid::Uuid::new_v4().to_string();
            (
                post_order(&token(c as i64 % crate::seed::PRINCIPALS), &key, body),
                Expect::Created,
                "claim",
            )
        }),
        Workload::Replays => {
            let keys = bench.scale.s4_replay_keys;
            Arc::new(move |_c, rng| {
                let record = Record::new("s4r", rng.between(1, keys), true);
                (
                    post_order(&token(record.principal), &record.key, record.body()),
                    Expect::Replayed(record.request_id.clone()),
                    "replay",
                )
            })
        }
    }
}

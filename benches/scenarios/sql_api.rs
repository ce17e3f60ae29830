//! Scenario 8 (issue 23): the SQL API against the fused statement, raw through pgbench on the same
//! data, side by side in the same run. A claim of a new key: the endpoint's fused transaction
//! (`claim.sql`) against `claim()`, the order, its event and `complete()` pipelined in one round
//! trip (`sql_api_claim.sql`); a replay: `replay.sql` against `claim()` on a key inside its window
//! (`sql_api_replay.sql`). The figure is functions / fused tx/s (median of the repetitions, and
//! the median of the per-repetition ratios): issue 23 keeps the fused statement for the endpoint
//! when the functions cost more than 10 % of either.

use std::time::Duration;

use anyhow::Result;

use crate::api_limit::{pgbench_args, Workload};
use crate::pgbench::{self, PgbenchResult};
use crate::report::{check, num, range, Row, ScenarioResult};
use crate::stats::{median, median_of_pair_ratios, ratio};
use crate::Bench;

/// The endpoint's figure and its SQL API twin's, for one workload.
struct Pair {
    workload: Workload,
    fused: Vec<PgbenchResult>,
    functions: Vec<PgbenchResult>,
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
    const CLIENTS: usize = 16;
    let template = bench.template("s4").await?;
    let duration = Duration::from_secs(bench.scale.s4_seconds);
    let warmup = Duration::from_secs(bench.scale.s4_warmup_seconds);
    let mut pairs = Vec::new();
    for workload in [Workload::Claims, Workload::Replays] {
        let db = bench
            .server
            .db_name(&format!("sqlapi_{workload:?}").to_lowercase());
        bench.server.copy_db(&template, &db).await?;
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
        pairs.push(pair);
    }

    let quick = bench.scale.quick;
    let mut rows = Vec::new();
    let mut checks = Vec::new();
    for p in &pairs {
        let fused: Vec<f64> = p.fused.iter().map(|r| r.tps).collect();
        let functions: Vec<f64> = p.functions.iter().map(|r| r.tps).collect();
        let (mf, mx) = (
            median(&fused).unwrap_or(f64::NAN),
            median(&functions).unwrap_or(f64::NAN),
        );
        let r = ratio(mx, mf);
        let name = format!("{:?} at {CLIENTS} clients", p.workload).to_lowercase();
        rows.push(Row {
            scenario: 8,
            metric: format!("{name}: tx/s, SQL API vs fused statement"),
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
                &mut checks,
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
            metric: format!("{name}: p99 ms, SQL API vs fused statement"),
            baseline: num(p99(&p.fused), 2),
            tombstoned: num(p99(&p.functions), 2),
            ratio: num(ratio(p99(&p.functions), p99(&p.fused)), 2),
            pair_ratio: String::new(),
            range: String::new(),
            target: String::new(),
            verdict: String::new(),
        });
        let failed: u64 = p.fused.iter().chain(&p.functions).map(|r| r.failed).sum();
        anyhow::ensure!(failed == 0, "{name}: {failed} pgbench transactions failed");
    }
    let details = serde_json::json!(pairs
        .iter()
        .map(|p| serde_json::json!({
            "workload": p.workload,
            "clients": CLIENTS,
            "fused": p.fused,
            "functions": p.functions,
        }))
        .collect::<Vec<_>>());
    Ok(ScenarioResult {
        id: 8,
        title: "SQL API (claim/complete functions) vs the endpoint's fused statement, pgbench"
            .to_owned(),
        rows,
        checks,
        details,
        seconds: 0.0,
    })
}

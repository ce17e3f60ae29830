//! Scenario 10: the daemon against the floor of its stack (issues 28 and 41).
//!
//! The floor ([`crate::floor`]) answers the same claims and replays with the same statement sent
//! the same way (alone, one implicit transaction, on sessions carrying the claim's settings), on
//! the same crates and runtime, and does nothing else.
//! For each workload (replays of scenario 4's replay set, claims of new keys), on a fresh copy of
//! scenario 4's data: `tombstoned serve` (pool of [`CLIENTS`]) and the floor ([`CLIENTS`]
//! sessions) run side by side and take turns under the same closed loop of [`CLIENTS`] clients
//! (alternating which goes first), each turn a warm-up and a measured window. Reported per side:
//! requests/s, CPU µs per request of the server process, of PostgreSQL and of the load generator
//! (`/proc`, [`crate::cpu`]), p99; the target is daemon CPU ≤ 1.3 × the floor's per request.
//!
//! Then the profiles ([`crate::profile`]), over a fixed number of sequential requests from one
//! client: context switches and `strace -c` on the running servers, then each server restarted
//! under callgrind for instructions, allocator calls and the top inclusive symbols, written to
//! `target/bench/profiles/`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use crate::api_limit::{requests, Workload};
use crate::cleanup::{statement_stats, StatementStats};
use crate::cpu::{self, Spent};
use crate::daemon::Daemon;
use crate::floor::Floor;
use crate::http_load::{closed_loop, error_kinds, LoadResult, Make};
use crate::profile::{self, CallgrindProfile, SystemProfile, Tools};
use crate::report::{check, range, Row, ScenarioResult};
use crate::stats::{median, ratio};
use crate::Bench;

/// Concurrent clients, daemon pool size and floor sessions.
pub const CLIENTS: usize = 16;
/// Issue 41 (issue 28: 1.5): the daemon's CPU per request at most this many times the floor's.
const TARGET: f64 = 1.3;
/// How long a server under valgrind may take to start and to stop.
const UNDER_VALGRIND: Duration = Duration::from_secs(300);

/// The daemon or the floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Server {
    /// `tombstoned serve`.
    Daemon,
    /// [`crate::floor`].
    Floor,
}

impl Server {
    fn label(self) -> &'static str {
        match self {
            Server::Daemon => "daemon",
            Server::Floor => "floor",
        }
    }
}

/// One server's measurements in one group.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Side {
    /// Closed-loop trials.
    pub trials: Vec<LoadResult>,
    /// CPU seconds spent during each trial, by process (`daemon` is this side's server).
    pub cpu: Vec<Spent>,
    /// The busiest statements of each trial (pg_stat_statements; empty without it).
    pub statements: Vec<Vec<StatementStats>>,
    /// Context switches and syscalls over the sequential requests.
    pub system: Option<SystemProfile>,
    /// Instructions, allocations and symbols over the sequential requests.
    pub callgrind: Option<CallgrindProfile>,
}

impl Side {
    fn per_second(&self) -> Vec<f64> {
        self.trials.iter().map(|r| r.per_second).collect()
    }

    /// CPU µs per request of one process, per trial.
    fn micros_per_request(&self, of: impl Fn(&Spent) -> f64) -> Vec<f64> {
        self.trials
            .iter()
            .zip(&self.cpu)
            .map(|(r, s)| of(s) * 1e6 / r.completed.max(1) as f64)
            .collect()
    }

    fn p99(&self) -> Vec<f64> {
        self.trials.iter().map(|r| r.latency.p99_ms).collect()
    }

    fn errors(&self) -> u64 {
        self.trials.iter().map(|r| r.error_count).sum()
    }
}

/// One workload: both servers on one copy of the data.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// Workload.
    pub workload: Workload,
    /// Concurrent clients.
    pub clients: usize,
    /// `tombstoned serve`.
    pub daemon: Side,
    /// The floor.
    pub floor: Side,
}

/// Scenario 10.
pub async fn scenario10(bench: &mut Bench) -> Result<ScenarioResult> {
    let template = bench.template("s4").await?;
    let tools = if bench.profiles {
        Some(Tools::find()?)
    } else {
        None
    };
    let dir = bench.root.join("target/bench/profiles");
    std::fs::create_dir_all(&dir)?;
    let mut groups = Vec::new();
    for workload in [Workload::Replays, Workload::Claims] {
        groups.push(group(bench, &template, workload, tools.as_ref(), &dir).await?);
    }
    let quick = bench.scale.quick;
    let mut checks = Vec::new();
    let mut rows = Vec::new();
    for g in &groups {
        let name = format!("{:?}", g.workload).to_lowercase();
        let (d, f) = (&g.daemon, &g.floor);
        let row = |metric: String, floor: &[f64], daemon: &[f64], decimals: usize, unit: &str| {
            let noise = format!(
                "daemon {} / floor {}",
                range(daemon, decimals, unit),
                range(floor, decimals, unit)
            );
            Row::compared(10, metric, floor, daemon, decimals, noise)
        };
        rows.push(row(
            format!(
                "{name} at {} clients: requests/s, daemon vs floor",
                g.clients
            ),
            &f.per_second(),
            &d.per_second(),
            0,
            "",
        ));
        let (dc, fc) = (
            d.micros_per_request(|s| s.daemon),
            f.micros_per_request(|s| s.daemon),
        );
        let cpu_ratio = ratio(
            median(&dc).unwrap_or(f64::NAN),
            median(&fc).unwrap_or(f64::NAN),
        );
        let mut cpu_row = row(
            format!("  {name}: server process CPU µs/request"),
            &fc,
            &dc,
            1,
            "",
        );
        cpu_row.target = format!("<= {TARGET}");
        cpu_row.verdict = check(
            &mut checks,
            10,
            &format!("{name}: daemon CPU/request <= {TARGET} x the floor's"),
            cpu_ratio,
            &format!("<= {TARGET}"),
            cpu_ratio <= TARGET,
            quick,
        );
        rows.push(cpu_row);
        rows.push(row(
            format!("  {name}: PostgreSQL CPU µs/request"),
            &f.micros_per_request(|s| s.postgres),
            &d.micros_per_request(|s| s.postgres),
            1,
            "",
        ));
        rows.push(row(
            format!("  {name}: load generator CPU µs/request"),
            &f.micros_per_request(|s| s.bench),
            &d.micros_per_request(|s| s.bench),
            1,
            "",
        ));
        let errors = d.errors() + f.errors();
        let mut p99 = row(
            format!("  {name}: p99 latency ms; errors {errors}"),
            &f.p99(),
            &d.p99(),
            2,
            "",
        );
        if errors > 0 {
            p99.range = d
                .trials
                .iter()
                .chain(&f.trials)
                .map(|r| error_kinds(&r.errors))
                .collect::<Vec<_>>()
                .join("; ");
        }
        rows.push(p99);
        // One profile per side: a value each, no range.
        let mut single = |metric: String, floor: f64, daemon: f64, decimals: usize| {
            let mut r = row(metric, &[floor], &[daemon], decimals, "");
            r.pair_ratio.clear();
            r.range.clear();
            rows.push(r);
        };
        if let (Some(dp), Some(fp)) = (&d.callgrind, &f.callgrind) {
            let n = dp.requests;
            single(
                format!("  {name}: instructions/request (callgrind, {n} sequential)"),
                fp.instructions_per_request,
                dp.instructions_per_request,
                0,
            );
            single(
                format!("  {name}: allocations/request (allocator calls, callgrind)"),
                fp.allocations_per_request,
                dp.allocations_per_request,
                1,
            );
        }
        if let (Some(ds), Some(fs)) = (&d.system, &f.system) {
            let n = ds.requests;
            single(
                format!("  {name}: syscalls/request (strace -c -f, {n} sequential)"),
                fs.syscalls_per_request,
                ds.syscalls_per_request,
                1,
            );
            single(
                format!("  {name}: wake-ups/request (voluntary context switches)"),
                fs.voluntary_switches_per_request,
                ds.voluntary_switches_per_request,
                1,
            );
        }
    }
    Ok(ScenarioResult {
        id: 10,
        title: "the daemon against the floor of its stack".into(),
        rows,
        checks,
        details: json!({
            "clients": CLIENTS,
            "seconds_per_trial": bench.scale.s4_seconds,
            "warmup_seconds": bench.scale.s4_warmup_seconds,
            "replay_keys": bench.scale.s4_replay_keys,
            "profile_requests": bench.scale.s10_profile_requests,
            "profile_warmup_requests": bench.scale.s10_profile_warmup,
            "profiles_dir": dir,
            "allocations_counted": "calls to malloc, calloc, realloc, posix_memalign, aligned_alloc \
                                    and memalign in the callgrind dump of the measured requests",
            "groups": groups,
        }),
        seconds: 0.0,
    })
}

async fn group(
    bench: &Bench,
    template: &str,
    workload: Workload,
    tools: Option<&Tools>,
    dir: &std::path::Path,
) -> Result<Group> {
    let db = bench
        .server
        .db_name(&format!("floor_{workload:?}").to_lowercase());
    bench.server.copy_db(template, &db).await?;
    let make = requests(bench, workload);
    let daemon = Daemon::start(bench, &db, CLIENTS).await?;
    let floor = Floor::start(bench, &db, CLIENTS, &[], Duration::from_secs(30)).await?;
    let admin = bench.server.admin().await?;
    let stats = bench.server.has_pg_stat_statements().await;
    let postmaster = cpu::postmaster_pid(bench.server.data_dir());
    let warmup = Duration::from_secs(bench.scale.s4_warmup_seconds);
    let duration = Duration::from_secs(bench.scale.s4_seconds);
    let mut sides = [Side::default(), Side::default()];
    for rep in 0..bench.scale.reps {
        let order = if rep % 2 == 0 {
            [Server::Daemon, Server::Floor]
        } else {
            [Server::Floor, Server::Daemon]
        };
        for server in order {
            let (addr, pid) = match server {
                Server::Daemon => (daemon.api, daemon.pid),
                Server::Floor => (floor.addr, floor.pid),
            };
            admin.batch_execute("CHECKPOINT").await?;
            closed_loop(addr, CLIENTS, Duration::ZERO, warmup, make.clone()).await?;
            if stats {
                admin
                    .batch_execute("SELECT pg_stat_statements_reset()")
                    .await?;
            }
            let before = cpu::Sample::take(postmaster, Some(pid));
            let r = closed_loop(addr, CLIENTS, Duration::ZERO, duration, make.clone()).await?;
            let spent = cpu::Sample::take(postmaster, Some(pid)).since(&before);
            let per = |s: f64| s * 1e6 / r.completed.max(1) as f64;
            eprintln!(
                "  rep {rep} {workload:?} x{CLIENTS} {:<6} {:>7.0} req/s, p99 {:>6.2} ms, errors {}, \
                 CPU µs/req: server {:.0}, postgres {:.0}, load generator {:.0}; idle {:.0}%",
                server.label(),
                r.per_second,
                r.latency.p99_ms,
                r.error_count,
                per(spent.daemon),
                per(spent.postgres),
                per(spent.bench),
                spent.idle_fraction * 100.0
            );
            let side = &mut sides[server as usize];
            side.statements.push(if stats {
                statement_stats(&admin, &db).await?
            } else {
                Vec::new()
            });
            side.trials.push(r);
            side.cpu.push(spent);
        }
    }
    let (warm, count) = (
        bench.scale.s10_profile_warmup,
        bench.scale.s10_profile_requests,
    );
    let name = format!("{workload:?}").to_lowercase();
    if let Some(tools) = tools {
        for (server, pid, addr) in [
            (Server::Daemon, daemon.pid, daemon.api),
            (Server::Floor, floor.pid, floor.addr),
        ] {
            let label = format!("{}-{name}", server.label());
            let p =
                profile::system(tools, pid, addr, make.clone(), warm, count, dir, &label).await?;
            eprintln!(
                "  {label}: {:.1} syscalls/req, {:.1} voluntary + {:.1} involuntary switches/req \
                 ({count} sequential; errors: {})",
                p.syscalls_per_request,
                p.voluntary_switches_per_request,
                p.involuntary_switches_per_request,
                p.errors
            );
            sides[server as usize].system = Some(p);
        }
    }
    daemon.stop().await?;
    floor.stop().await?;
    if let Some(tools) = tools {
        for server in [Server::Daemon, Server::Floor] {
            let label = format!("{}-{name}", server.label());
            let p = under_callgrind(bench, tools, server, &db, make.clone(), dir, &label).await?;
            eprintln!(
                "  {label}: {:.0} instructions/req, {:.1} allocations/req ({count} sequential \
                 under callgrind; errors: {})",
                p.instructions_per_request, p.allocations_per_request, p.errors
            );
            sides[server as usize].callgrind = Some(p);
        }
    }
    bench.server.drop_db(&db).await?;
    let [daemon, floor] = sides;
    Ok(Group {
        workload,
        clients: CLIENTS,
        daemon,
        floor,
    })
}

/// Starts `server` under callgrind on `db`, profiles it, stops it.
async fn under_callgrind(
    bench: &Bench,
    tools: &Tools,
    server: Server,
    db: &str,
    make: Make,
    dir: &std::path::Path,
    label: &str,
) -> Result<CallgrindProfile> {
    let out: PathBuf = dir.join(format!("{label}.callgrind.raw"));
    let wrapper = tools.callgrind_wrapper(&out);
    let (warm, count) = (
        bench.scale.s10_profile_warmup,
        bench.scale.s10_profile_requests,
    );
    match server {
        Server::Daemon => {
            let daemon =
                Daemon::start_wrapped(bench, db, CLIENTS, &wrapper, UNDER_VALGRIND).await?;
            let pid = daemon.pid;
            let profile =
                profile::callgrind(tools, pid, daemon.api, &out, make, warm, count, dir, label)
                    .await;
            daemon.stop_within(UNDER_VALGRIND).await?;
            discard_final_dump(&out, pid);
            profile
        }
        Server::Floor => {
            let floor = Floor::start(bench, db, CLIENTS, &wrapper, UNDER_VALGRIND).await?;
            let pid = floor.pid;
            let profile =
                profile::callgrind(tools, pid, floor.addr, &out, make, warm, count, dir, label)
                    .await;
            floor.stop_within(UNDER_VALGRIND).await?;
            discard_final_dump(&out, pid);
            profile
        }
    }
}

/// Valgrind writes the counts since the last dump when the program exits: not measured, removed.
fn discard_final_dump(out: &std::path::Path, pid: u32) {
    let mut path = out.as_os_str().to_owned();
    path.push(format!(".{pid}"));
    let _ = std::fs::remove_file(path);
}

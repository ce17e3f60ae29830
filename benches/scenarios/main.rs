//! The benchmark (issue 6): every scenario against its baseline in the same run, on the same
//! data and the same server settings; alternating repetitions, medians, ratios.
//!
//! ```text
//! cargo bench --bench scenarios -- [--quick] [--only N[,N..]] [--reps N]
//!                                  [--database-url URL] [--out PATH]
//! ```
//!
//! 1. cleanup throughput (`tombstoned cleanup` vs one set-based UPDATE vs a job-queue loop),
//! 2. cost follows the work (5M tombstones, 0.5 % of 1M live due),
//! 3. replays over HTTP while the cleaner runs,
//! 4. the API against pgbench running the same SQL transactions (`bench/pgbench/`),
//! 5. storage per key and WAL per tombstoned row,
//! 6. cleanup throughput on a second cluster with initdb's default settings (300,000 records),
//! 7. parallel cleanup (`cleanup.workers = 2`) vs one and two single UPDATEs (`workers.rs`),
//! 8. the SQL API's claim and replay vs the endpoint's fused statement, raw through pgbench and
//!    through an endpoint over HTTP (`sql_api.rs`; the SQL-API endpoint is the Rust payments
//!    example, `payments.rs`, run as this binary re-executed with `--serve-payments`),
//! 9. the forever table from 1 M to 50 M keys: claim/replay latency, the cleaner's cost per row,
//!    sizes and VACUUM time as one table grows, drawn as an SVG (`forever.rs`, `svg.rs`),
//! 10. the daemon against the floor of its stack: a minimal hyper + tokio-postgres server sending
//!     the same statements (`floor.rs`), CPU per request side by side, and per-request profiles
//!     of both — instructions, allocations, syscalls, wake-ups (`stack_floor.rs`, `profile.rs`),
//! 11. claims and replays through PgBouncer in transaction mode vs a direct connection with
//!     prepared statements (`pooler.rs`),
//! 12. what traces cost: the daemon with tracing off, `sample_ratio = 0` and `1.0` side by side,
//!     exporting to a collector on loopback (`traces.rs`).
//!
//! It uses the release-profile `tombstoned` binary cargo builds for it (`CARGO_BIN_EXE_…`), starts
//! a throwaway PostgreSQL with the settings in [`server::SETTINGS`] (or uses `--database-url`),
//! and writes `target/bench/results.json`. BENCHMARKS.md explains the results.

mod api_limit;
mod cleanup;
mod cpu;
mod daemon;
mod floor;
mod forever;
mod http_load;
mod payments;
mod pgbench;
mod pooler;
mod profile;
mod replays;
mod report;
mod seed;
mod server;
mod sql_api;
mod stack_floor;
mod stats;
mod storage;
mod svg;
mod traces;
mod workers;

use std::path::PathBuf;
use std::time::Instant;

use tombstoned_testkit::pgbench_scripts;

use anyhow::{bail, Context as _, Result};
use clap::Parser;

use report::ScenarioResult;
use server::Server;

/// Command line (after `cargo bench --bench scenarios --`).
#[derive(Debug, Parser)]
#[command(name = "scenarios", about = "tombstoned benchmarks (BENCHMARKS.md)")]
struct Args {
    /// Small scale, one repetition, targets reported but not gated (CI smoke test).
    #[arg(long)]
    quick: bool,
    /// Run only these scenarios (1-12), e.g. `--only 1` or `--only 1,3` (default: 1-8, 10, 11
    /// and 12, and 9 with --quick; scenario 9 at full scale grows a table to 50 M keys, so it runs
    /// when named).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u8).range(1..=12))]
    only: Vec<u8>,
    /// Repetitions per measurement (default 3, or 1 with --quick).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20))]
    reps: Option<u32>,
    /// Use this server instead of a throwaway cluster (its role must be able to create
    /// databases, and roles for scenario 8's payments service; its settings are reported, not
    /// changed).
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
    /// Where to write the JSON results.
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Batch size for `tombstoned cleanup` and the job-queue loop (default: the product's
    /// default, 1000). For experiments; the reported run uses the default.
    #[arg(long, value_name = "N")]
    batch_size: Option<u32>,
    /// `cleanup.batch_time` for `tombstoned cleanup` (e.g. `50ms`: each batch sized to hold its
    /// locks about that long; default: the product's, off).
    #[arg(long, value_name = "DURATION")]
    batch_time: Option<String>,
    /// The `tombstoned` binary under test (default: the release-profile build cargo makes for
    /// this benchmark).
    #[arg(long, value_name = "PATH")]
    binary: Option<PathBuf>,
    /// Another `tombstoned` binary (e.g. a build of an earlier commit) to run in scenario 1 as a
    /// fourth approach, alternating with the others: what an engine change bought.
    #[arg(long, value_name = "PATH")]
    baseline_binary: Option<PathBuf>,
    /// Extra environment for the daemon under test (`NAME=VALUE`, repeatable). For experiments
    /// such as `TOKIO_WORKER_THREADS=1`; the reported run sets none.
    #[arg(long, value_name = "NAME=VALUE")]
    daemon_env: Vec<String>,
    /// An extra server setting for the throwaway cluster (`NAME=VALUE`, repeatable; applies to
    /// every scenario and baseline alike). For experiments such as `wal_compression=lz4`; the
    /// reported run sets none.
    #[arg(long, value_name = "NAME=VALUE")]
    pg_setting: Vec<String>,
    /// Scenario 9: the table sizes (keys) to grow to and measure at, in order (default
    /// 1000000,10000000,50000000; with --quick 1000000).
    #[arg(long, value_delimiter = ',', value_name = "KEYS",
          value_parser = clap::value_parser!(i64).range(100_000..=1_000_000_000))]
    scale_keys: Vec<i64>,
    /// Scenario 10 without its profiles (they need valgrind and strace).
    #[arg(long)]
    no_profiles: bool,
    /// Rewrite bench/pgbench/*.sql from `tombstoned::claim::sql` and exit.
    #[arg(long)]
    write_pgbench_scripts: bool,
    /// Scenario 8's SQL-API endpoint: serve the Rust payments example on `--listen` with
    /// `--database-url` (its own role) and a pool of `--pool-size`, until killed. The benchmark
    /// starts itself this way, so that service is a process of its own.
    #[arg(long, hide = true, requires_all = ["listen", "database_url", "pool_size"])]
    serve_payments: bool,
    /// With `--serve-payments`: the address to listen on.
    #[arg(long, hide = true, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// With `--serve-payments`: the pool's size.
    #[arg(long, hide = true, value_name = "N")]
    pool_size: Option<usize>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// How big each scenario is.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Scale {
    /// Scenario 1 (and 3, 4): records, half of them due.
    pub s1_records: i64,
    /// Scenario 2: tombstones.
    pub s2_tombstones: i64,
    /// Scenario 2: live records.
    pub s2_live: i64,
    /// Scenario 2: live records that are due (0.5 %).
    pub s2_due: i64,
    /// Scenario 1: the job-queue loop stops after this long (it slows down as it goes).
    pub job_queue_cap_seconds: u64,
    /// Scenario 3: replay requests per second.
    pub s3_rate: u64,
    /// Scenario 3: measured window per trial.
    pub s3_window_seconds: u64,
    /// Scenario 4: measured seconds per trial.
    pub s4_seconds: u64,
    /// Scenario 4: warm-up seconds before each trial.
    pub s4_warmup_seconds: u64,
    /// Scenario 4: records in the replay set.
    pub s4_replay_keys: i64,
    /// Scenario 6 (default server settings): records, half of them due.
    pub s6_records: i64,
    /// Scenario 9: the sizes (keys) one table grows to, measured at each.
    pub s9_keys: Vec<i64>,
    /// Scenario 9: claims per measurement (at [`Scale::s3_rate`]), also the rows due for its
    /// cleanup run.
    pub s9_claims: u64,
    /// Scenario 9: measured replay window per repetition, seconds (at [`Scale::s3_rate`]).
    pub s9_replay_seconds: u64,
    /// Scenario 10: sequential requests per profile (the same count for every server).
    pub s10_profile_requests: u64,
    /// Scenario 10: sequential requests before each profile's measured ones.
    pub s10_profile_warmup: u64,
    /// Repetitions.
    pub reps: usize,
    /// Whether this is the quick (CI) scale.
    pub quick: bool,
}

impl Scale {
    fn new(quick: bool, reps: Option<u32>, keys: &[i64]) -> Self {
        let reps = reps.map_or(if quick { 1 } else { 3 }, |r| r as usize);
        let mut scale = Self::preset(quick, reps);
        if !keys.is_empty() {
            scale.s9_keys = keys.to_vec();
        }
        scale
    }

    fn preset(quick: bool, reps: usize) -> Self {
        if quick {
            Scale {
                s1_records: 100_000,
                s2_tombstones: 500_000,
                s2_live: 100_000,
                s2_due: 500,
                job_queue_cap_seconds: 10,
                s3_rate: 200,
                s3_window_seconds: 3,
                s4_seconds: 2,
                s4_warmup_seconds: 1,
                s4_replay_keys: 10_000,
                s6_records: 60_000,
                s9_keys: vec![1_000_000],
                s9_claims: 1_000,
                s9_replay_seconds: 3,
                s10_profile_requests: 100,
                s10_profile_warmup: 20,
                reps,
                quick,
            }
        } else {
            Scale {
                s1_records: 1_000_000,
                s2_tombstones: 5_000_000,
                s2_live: 1_000_000,
                s2_due: 5_000,
                job_queue_cap_seconds: 20,
                s3_rate: 200,
                s3_window_seconds: 10,
                s4_seconds: 5,
                s4_warmup_seconds: 1,
                s4_replay_keys: 100_000,
                s6_records: 300_000,
                s9_keys: vec![1_000_000, 10_000_000, 50_000_000],
                s9_claims: 5_000,
                s9_replay_seconds: 10,
                s10_profile_requests: 1_000,
                s10_profile_warmup: 100,
                reps,
                quick,
            }
        }
    }
}

/// Everything the scenarios share: the server, the product binary, the scale, and the seeded
/// template databases (made on first use, kept for the run).
pub struct Bench {
    /// The server.
    pub server: Server,
    /// The release-profile `tombstoned`.
    pub binary: PathBuf,
    /// Scale.
    pub scale: Scale,
    /// `--batch-size`, if given.
    pub batch_size: Option<u32>,
    /// `--batch-time`, if given.
    pub batch_time: Option<String>,
    /// `--daemon-env`.
    pub daemon_env: Vec<(String, String)>,
    /// `--baseline-binary`.
    pub baseline_binary: Option<PathBuf>,
    /// Scenario 10's profiles (not `--no-profiles`).
    pub profiles: bool,
    /// Repository root (for bench/pgbench).
    pub root: PathBuf,
    templates: std::collections::HashMap<&'static str, String>,
    /// Seeding reports.
    pub seeds: Vec<seed::SeedReport>,
    /// Scenario 1's `tombstoned cleanup` trials (reused by 2 and 5).
    pub s1_tombstoned: Vec<cleanup::Trial>,
    /// A copy of scenario 1's data after a `tombstoned cleanup` run (for scenario 5).
    pub cleaned_db: Option<String>,
}

impl Bench {
    /// The name of seeded template `which` ("s1", "s2", "s4"), seeding it on first use.
    pub async fn template(&mut self, which: &'static str) -> Result<String> {
        if let Some(name) = self.templates.get(which) {
            return Ok(name.clone());
        }
        let name = self.server.db_name(&format!("seed_{which}"));
        let report = match which {
            "s1" => {
                self.server.create_db(&name).await?;
                migrate(&self.server, &name).await?;
                let client = self.server.connect(&name).await?;
                let n = self.scale.s1_records;
                let due = n / 2;
                let report = seed::seed(&client, &name, &s1_batches(n, due)).await?;
                seed::verify(&client, "s1", &[1, due, due + 1, n], seed::Keys::Uuid).await?;
                report
            }
            "s2" => {
                self.server.create_db(&name).await?;
                migrate(&self.server, &name).await?;
                let client = self.server.connect(&name).await?;
                let (t, live, due) = (
                    self.scale.s2_tombstones,
                    self.scale.s2_live,
                    self.scale.s2_due,
                );
                let day_ms = 86_400_000i64;
                let mut batches = vec![seed::Batch {
                    tag: "s2",
                    first: 1,
                    last: t,
                    // Tombstones of the last ~400 days, oldest first.
                    deadline0: "now() - interval '400 days'".into(),
                    step: format!("{} ms", 398 * day_ms / t),
                    tombstones: true,
                    keys: crate::seed::Keys::Uuid,
                }];
                batches.extend(live_batches("s2", t, live, due));
                let report = seed::seed(&client, &name, &batches).await?;
                seed::verify(&client, "s2", &[1, t, t + 1, t + due + 1], seed::Keys::Uuid).await?;
                report
            }
            "s4" => {
                // Scenario 1's data plus the replay set pgbench can address (decimal keys).
                let s1 = Box::pin(self.template("s1")).await?;
                self.server.copy_db(&s1, &name).await?;
                let client = self.server.connect(&name).await?;
                let n = self.scale.s4_replay_keys;
                let batches = [seed::Batch {
                    tag: "s4r",
                    first: 1,
                    last: n,
                    deadline0: "now() + interval '1 hour'".into(),
                    step: format!("{} ms", 86_400_000 / n),
                    tombstones: false,
                    keys: crate::seed::Keys::Decimal,
                }];
                let report = seed::seed(&client, &name, &batches).await?;
                seed::verify(&client, "s4r", &[1, n], seed::Keys::Decimal).await?;
                seed::pgbench_replay_twin(&client).await?;
                report
            }
            "s6" => {
                // Scenario 6 (on its default-settings cluster): scenario 1's shape, smaller.
                self.server.create_db(&name).await?;
                migrate(&self.server, &name).await?;
                let client = self.server.connect(&name).await?;
                let n = self.scale.s6_records;
                let due = n / 2;
                let report = seed::seed(&client, &name, &live_batches("s6", 0, n, due)).await?;
                seed::verify(&client, "s6", &[1, due, due + 1, n], seed::Keys::Uuid).await?;
                report
            }
            "s6m" => {
                // Scenario 6's variant (issue 28, target 6): md5(i) keys over 10 tenants × 1,000
                // principals, so primary-key order is unrelated to deadline order and a batch's
                // rows are spread over a wide primary key; the same size and due share.
                self.server.create_db(&name).await?;
                migrate(&self.server, &name).await?;
                let client = self.server.connect(&name).await?;
                let n = self.scale.s6_records;
                let due = n / 2;
                let batches = live_batches_keyed("s6m", 0, n, due, seed::Keys::Md5);
                let report = seed::seed(&client, &name, &batches).await?;
                seed::verify(&client, "s6m", &[1, due, due + 1, n], seed::Keys::Md5).await?;
                report
            }
            other => bail!("no template {other}"),
        };
        eprintln!(
            "  seeded {which}: {} rows in {:.1} s (+{:.1} s indexes, {:.1} s vacuum)",
            report.rows, report.insert_seconds, report.index_seconds, report.vacuum_seconds
        );
        self.seeds.push(report);
        self.templates.insert(which, name.clone());
        Ok(name)
    }
}

/// Scenario 1's records: the first half due (deadlines over the last day), the rest not yet.
pub fn s1_batches(n: i64, due: i64) -> Vec<seed::Batch> {
    live_batches("s1", 0, n, due)
}

/// `live` live records after `offset` others, the first `due` of them due: due deadlines spread
/// over `[now - 25 h, now - 1 h]`, the others over `[now + 1 h, now + 25 h]`, increasing with `i`.
fn live_batches(tag: &'static str, offset: i64, live: i64, due: i64) -> Vec<seed::Batch> {
    live_batches_keyed(tag, offset, live, due, seed::Keys::Uuid)
}

/// [`live_batches`] with keys and scopes shaped as `keys`.
fn live_batches_keyed(
    tag: &'static str,
    offset: i64,
    live: i64,
    due: i64,
    keys: seed::Keys,
) -> Vec<seed::Batch> {
    let day_ms = 86_400_000i64;
    let mut batches = Vec::new();
    if due > 0 {
        let step = day_ms / due;
        batches.push(seed::Batch {
            tag,
            first: offset + 1,
            last: offset + due,
            deadline0: format!(
                "now() - interval '25 hours' - {} * interval '{step} ms'",
                offset
            ),
            step: format!("{step} ms"),
            tombstones: false,
            keys,
        });
    }
    let rest = live - due;
    if rest > 0 {
        let step = day_ms / rest;
        let first = offset + due + 1;
        batches.push(seed::Batch {
            tag,
            first,
            last: offset + live,
            deadline0: format!(
                "now() + interval '1 hour' - {} * interval '{step} ms'",
                first - 1
            ),
            step: format!("{step} ms"),
            tombstones: false,
            keys,
        });
    }
    batches
}

/// Applies the product's migrations to `db`.
pub async fn migrate(server: &Server, db: &str) -> Result<()> {
    tombstoned::schema::migrate(&database_config(server, db)?)
        .await
        .with_context(|| format!("migrating {db}"))?;
    Ok(())
}

/// Applies the product's migrations up to and including `version` to `db`, as the release that
/// ended there left it.
pub async fn migrate_to(server: &Server, db: &str, version: i32) -> Result<()> {
    tombstoned::schema::migrate_to(&database_config(server, db)?, version)
        .await
        .with_context(|| format!("migrating {db} to V{version}"))?;
    Ok(())
}

fn database_config(server: &Server, db: &str) -> Result<tombstoned::config::DatabaseConfig> {
    let vars = vec![("TOMBSTONED_DATABASE_URL".to_owned(), server.url(db))];
    Ok(tombstoned::config::Config::load_from(None, vars, &[])?.database)
}

/// Machine facts for the report.
#[derive(Debug, Clone, serde::Serialize)]
struct Machine {
    cpus: usize,
    cpu_model: String,
    memory_gib: f64,
    kernel: String,
    load_average_start: String,
    load_average_end: String,
}

fn machine(load_start: String) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_owned();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    Machine {
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model,
        memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_owned(),
        load_average_start: load_start,
        load_average_end: loadavg(),
    }
}

/// `/proc/loadavg`'s first three fields.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> std::process::ExitCode {
    // Scenario 10 re-executes this binary as its floor server (`floor.rs`).
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == floor::SERVE_FLAG)
    {
        return floor::serve_main();
    }
    let args = Args::parse();
    if let (true, Some(listen), Some(url), Some(pool_size)) = (
        args.serve_payments,
        args.listen,
        args.database_url.as_deref(),
        args.pool_size,
    ) {
        return match payments::serve(listen, url, pool_size) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("scenarios --serve-payments: error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("scenarios: cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("scenarios: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if args.write_pgbench_scripts {
        for (name, text) in pgbench_scripts::scripts() {
            let path = root.join("bench/pgbench").join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("wrote {}", path.display());
        }
        return Ok(());
    }
    // The scripts pgbench runs must be the product's statements: refuse to measure otherwise.
    pgbench_scripts::check_files(&root.join("bench/pgbench"))?;

    let started = Instant::now();
    let load_start = loadavg();
    let scale = Scale::new(args.quick, args.reps, &args.scale_keys);
    // Scenario 9 at full scale grows a table to 50 M keys (~40 min, ~20 GB of disk): it runs by
    // default at the quick scale only (its 1 M point), at full scale when named (`--only 9`).
    let only: Vec<u8> = if args.only.is_empty() && scale.quick {
        vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    } else if args.only.is_empty() {
        vec![1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12]
    } else {
        args.only.clone()
    };
    eprintln!(
        "tombstoned benchmark: scenarios {only:?}, {} scale, {} repetition(s)",
        if scale.quick { "quick" } else { "full" },
        scale.reps
    );
    let mut extra_settings = Vec::new();
    for kv in &args.pg_setting {
        match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => extra_settings.push((k.to_owned(), v.to_owned())),
            _ => bail!("--pg-setting wants NAME=VALUE, got {kv:?}"),
        }
    }
    if !extra_settings.is_empty() && args.database_url.is_some() {
        bail!("--pg-setting applies to the throwaway cluster, not to --database-url");
    }
    let server = Server::start(args.database_url.as_deref(), &extra_settings).await?;
    eprintln!(
        "PostgreSQL {} ({})",
        server.version,
        if server.is_throwaway() {
            "throwaway cluster"
        } else {
            "given by --database-url"
        }
    );
    let mut bench = Bench {
        server,
        binary: args
            .binary
            .clone()
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tombstoned"))),
        scale,
        batch_size: args.batch_size,
        batch_time: args.batch_time,
        daemon_env: args
            .daemon_env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        baseline_binary: args.baseline_binary.clone(),
        profiles: !args.no_profiles,
        root: root.clone(),
        templates: Default::default(),
        seeds: Vec::new(),
        s1_tombstoned: Vec::new(),
        cleaned_db: None,
    };

    let mut results: Vec<ScenarioResult> = Vec::new();
    let outcome: Result<()> = async {
        for id in &only {
            let t = Instant::now();
            eprintln!("\n== scenario {id} (load average {})", loadavg());
            let mut result = match id {
                1 => cleanup::scenario1(&mut bench, only.contains(&5)).await?,
                2 => cleanup::scenario2(&mut bench).await?,
                3 => replays::scenario3(&mut bench).await?,
                4 => api_limit::scenario4(&mut bench).await?,
                5 => storage::scenario5(&mut bench).await?,
                6 => cleanup::scenario6(&mut bench).await?,
                7 => workers::scenario7(&mut bench).await?,
                8 => sql_api::scenario8(&mut bench).await?,
                9 => forever::scenario9(&mut bench).await?,
                10 => stack_floor::scenario10(&mut bench).await?,
                11 => pooler::scenario11(&mut bench).await?,
                12 => traces::scenario12(&mut bench).await?,
                _ => bail!("no scenario {id}"),
            };
            result.seconds = t.elapsed().as_secs_f64();
            eprintln!("{}", report::render(std::slice::from_ref(&result)));
            results.push(result);
        }
        Ok(())
    }
    .await;

    let settings = bench
        .server
        .non_default_settings()
        .await
        .unwrap_or_default();
    let elapsed = started.elapsed();
    let json = serde_json::json!({
        "machine": machine(load_start),
        "postgres": {
            "version": bench.server.version,
            "throwaway_cluster": bench.server.is_throwaway(),
            "requested_settings": server::SETTINGS.iter()
                .map(|(k, v, why)| serde_json::json!({"name": k, "value": v, "why": why}))
                .collect::<Vec<_>>(),
            "non_default_settings": settings,
        },
        "scale": bench.scale,
        "command": std::env::args().collect::<Vec<_>>(),
        "seeding": bench.seeds,
        "scenarios": results,
        "duration_seconds": elapsed.as_secs_f64(),
        "error": outcome.as_ref().err().map(|e| format!("{e:#}")),
    });
    let out = args
        .out
        .unwrap_or_else(|| root.join("target/bench/results.json"));
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&json)?)?;
    bench.server.drop_all().await;

    println!("\n{}", report::render(&results));
    println!("settings (all scenarios and baselines):");
    for s in &settings {
        println!("  {} = {} ({})", s.name, s.value, s.source);
    }
    println!(
        "\nPostgreSQL {}; {} s in total; results in {}",
        bench.server.version,
        elapsed.as_secs(),
        out.display()
    );
    if std::env::var_os("BENCH_MARKDOWN").is_some() {
        println!("\n{}", report::render_markdown(&results));
    }
    outcome?;
    if !bench.scale.quick {
        let missed: Vec<String> = results
            .iter()
            .flat_map(|r| &r.checks)
            .filter(|c| !c.met)
            .map(|c| format!("{}: {}", c.scenario, c.name))
            .collect();
        if !missed.is_empty() {
            println!("targets missed: {}", missed.join("; "));
        }
    }
    Ok(())
}

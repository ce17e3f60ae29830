//! Scenario 12: what traces cost the daemon (issue 40).
//!
//! `tombstoned serve` six times on one fresh copy of scenario 4's data, side by side: tracing off
//! (no `[tracing]`: today's configuration); on with `sample_ratio = 0` (every request makes its
//! unsampled span context, nothing is recorded or exported); on with `sample_ratio = 1.0` (every
//! request, claim and statement recorded and exported); and 1.0 again with a collector that
//! answers 500, one that answers only after 5 s, and none at all (a closed port). The collectors
//! are this benchmark's own on loopback (axum servers decoding each OTLP/HTTP protobuf request
//! with `opentelemetry-proto` and counting its spans, so the export is real). For each workload
//! (replays of scenario 4's replay set, claims of new keys) the daemons take turns, in an order
//! rotated per repetition, under the same closed loop of [`CLIENTS`] clients, each turn a warm-up
//! and a measured window. Reported per side: requests/s, the daemon process's CPU µs per request
//! (`/proc`, [`crate::cpu`]), p99, spans exported and dropped; each as a ratio of medians against
//! tracing off. The target: 1.0 costs at most [`TARGET`] × off's daemon CPU per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use axum::body::Bytes;
use axum::http::StatusCode;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message as _;
use serde::Serialize;
use serde_json::json;

use crate::api_limit::{requests, Workload};
use crate::cpu::{self, Spent};
use crate::daemon::Daemon;
use crate::http_load::{closed_loop, LoadResult};
use crate::report::{check, range, Row, ScenarioResult};
use crate::stats::{median, ratio};
use crate::Bench;

/// Concurrent clients, and each daemon's pool size.
const CLIENTS: usize = 16;
/// Issue 40: daemon CPU per request with every trace recorded, at most this many times off's.
const TARGET: f64 = 1.10;

/// How a daemon traces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// No `[tracing]`.
    Off,
    /// `sample_ratio = 0`.
    RatioZero,
    /// `sample_ratio = 1.0`, a collector that accepts every export.
    RatioOne,
    /// `sample_ratio = 1.0`, a collector that answers every export with 500.
    CollectorFailing,
    /// `sample_ratio = 1.0`, a collector that answers after [`LATE`].
    CollectorLate,
    /// `sample_ratio = 1.0`, nothing listening.
    CollectorDown,
}

const MODES: [Mode; 6] = [
    Mode::Off,
    Mode::RatioZero,
    Mode::RatioOne,
    Mode::CollectorFailing,
    Mode::CollectorLate,
    Mode::CollectorDown,
];

/// How long the late collector takes to answer.
const LATE: Duration = Duration::from_secs(5);

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::RatioZero => "ratio 0",
            Mode::RatioOne => "ratio 1.0",
            Mode::CollectorFailing => "1.0, collector 500",
            Mode::CollectorLate => "1.0, collector late",
            Mode::CollectorDown => "1.0, collector down",
        }
    }

    /// Its `[tracing]` (environment), with the collectors' endpoints.
    fn env(self, collectors: &Collectors) -> Vec<(&'static str, &str)> {
        let (endpoint, ratio) = match self {
            Mode::Off => return Vec::new(),
            Mode::RatioZero => (&collectors.accepting.url, "0.0"),
            Mode::RatioOne => (&collectors.accepting.url, "1.0"),
            Mode::CollectorFailing => (&collectors.failing.url, "1.0"),
            Mode::CollectorLate => (&collectors.late.url, "1.0"),
            Mode::CollectorDown => (&collectors.down, "1.0"),
        };
        vec![
            ("TOMBSTONED_TRACING__OTLP_ENDPOINT", endpoint.as_str()),
            ("TOMBSTONED_TRACING__SAMPLE_RATIO", ratio),
        ]
    }
}

/// One daemon's measurements in one group.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Side {
    /// Closed-loop trials.
    pub trials: Vec<LoadResult>,
    /// CPU seconds spent during each trial, by process.
    pub cpu: Vec<Spent>,
}

impl Side {
    fn per_second(&self) -> Vec<f64> {
        self.trials.iter().map(|r| r.per_second).collect()
    }

    fn daemon_micros_per_request(&self) -> Vec<f64> {
        self.trials
            .iter()
            .zip(&self.cpu)
            .map(|(r, s)| s.daemon * 1e6 / r.completed.max(1) as f64)
            .collect()
    }

    fn p99(&self) -> Vec<f64> {
        self.trials.iter().map(|r| r.latency.p99_ms).collect()
    }
}

/// One workload: the three daemons on one copy of the data.
#[derive(Debug, Clone, Serialize)]
pub struct Group {
    /// Workload.
    pub workload: Workload,
    /// One per [`MODES`], in its order.
    pub sides: Vec<Side>,
    /// Spans the accepting collector received during this group (ratio 0 and 1.0).
    pub spans_exported: u64,
    /// `tombstoned_trace_spans_dropped_total` of each tracing daemon at the end, by mode.
    pub spans_dropped: Vec<(Mode, Option<f64>)>,
}

/// How a collector answers.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Accept,
    Fail,
    Late,
}

/// A loopback OTLP/HTTP collector: counts the spans of every export it decodes and accepts.
struct Collector {
    url: String,
    spans: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    async fn start(answer: Answer) -> Result<Collector> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let spans = Arc::new(AtomicU64::new(0));
        let counted = spans.clone();
        let router = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: Bytes| {
                let counted = counted.clone();
                async move {
                    match answer {
                        Answer::Fail => return StatusCode::INTERNAL_SERVER_ERROR,
                        Answer::Late => tokio::time::sleep(LATE).await,
                        Answer::Accept => {}
                    }
                    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
                        return StatusCode::BAD_REQUEST;
                    };
                    let n: usize = request
                        .resource_spans
                        .iter()
                        .flat_map(|r| &r.scope_spans)
                        .map(|s| s.spans.len())
                        .sum();
                    counted.fetch_add(n as u64, Ordering::Relaxed);
                    StatusCode::OK
                }
            }),
        );
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Collector { url, spans, task })
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The collectors of the modes, and the endpoint where none listens.
struct Collectors {
    accepting: Collector,
    failing: Collector,
    late: Collector,
    down: String,
}

impl Collectors {
    async fn start() -> Result<Collectors> {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let down = format!("http://{}", closed.local_addr()?);
        drop(closed);
        Ok(Collectors {
            accepting: Collector::start(Answer::Accept).await?,
            failing: Collector::start(Answer::Fail).await?,
            late: Collector::start(Answer::Late).await?,
            down,
        })
    }
}

/// Scenario 12.
pub async fn scenario12(bench: &mut Bench) -> Result<ScenarioResult> {
    let template = bench.template("s4").await?;
    let collectors = Collectors::start().await?;
    let mut groups = Vec::new();
    for workload in [Workload::Replays, Workload::Claims] {
        groups.push(group(bench, &template, workload, &collectors).await?);
    }
    let quick = bench.scale.quick;
    let mut checks = Vec::new();
    let mut rows = Vec::new();
    for g in &groups {
        let name = format!("{:?}", g.workload).to_lowercase();
        let off = &g.sides[0];
        for (mode, side) in MODES.iter().zip(&g.sides).skip(1) {
            let row = |metric: String, base: &[f64], measured: &[f64], decimals: usize| {
                let noise = format!(
                    "{} {} / off {}",
                    mode.label(),
                    range(measured, decimals, ""),
                    range(base, decimals, "")
                );
                Row::compared(12, metric, base, measured, decimals, noise)
            };
            let label = mode.label();
            rows.push(row(
                format!("{name} x{CLIENTS}: requests/s, tracing {label} vs off"),
                &off.per_second(),
                &side.per_second(),
                0,
            ));
            let (base, measured) = (
                off.daemon_micros_per_request(),
                side.daemon_micros_per_request(),
            );
            let mut cpu_row = row(
                format!("  {name}: daemon CPU µs/request, tracing {label} vs off"),
                &base,
                &measured,
                1,
            );
            if *mode == Mode::RatioOne {
                let value = ratio(
                    median(&measured).unwrap_or(f64::NAN),
                    median(&base).unwrap_or(f64::NAN),
                );
                cpu_row.target = format!("<= {TARGET}");
                cpu_row.verdict = check(
                    &mut checks,
                    12,
                    &format!(
                        "{name}: daemon CPU/request with every trace recorded <= {TARGET} x off's"
                    ),
                    value,
                    &format!("<= {TARGET}"),
                    value <= TARGET,
                    quick,
                );
            }
            rows.push(cpu_row);
            rows.push(row(
                format!("  {name}: p99 latency ms, tracing {label} vs off"),
                &off.p99(),
                &side.p99(),
                2,
            ));
        }
    }
    Ok(ScenarioResult {
        id: 12,
        title: "what traces cost: tracing off, sample_ratio 0 and 1.0 side by side".into(),
        rows,
        checks,
        details: json!({
            "clients": CLIENTS,
            "seconds_per_trial": bench.scale.s4_seconds,
            "warmup_seconds": bench.scale.s4_warmup_seconds,
            "replay_keys": bench.scale.s4_replay_keys,
            "modes": MODES,
            "late_collector_answers_after_seconds": LATE.as_secs(),
            "groups": groups,
        }),
        seconds: 0.0,
    })
}

async fn group(
    bench: &Bench,
    template: &str,
    workload: Workload,
    collectors: &Collectors,
) -> Result<Group> {
    let db = bench
        .server
        .db_name(&format!("traces_{workload:?}").to_lowercase());
    bench.server.copy_db(template, &db).await?;
    let make = requests(bench, workload);
    let url = bench.server.url(&db);
    let mut daemons = Vec::new();
    for mode in MODES {
        daemons.push(Daemon::start_on(bench, &url, CLIENTS, &mode.env(collectors)).await?);
    }
    let postmaster = cpu::postmaster_pid(bench.server.data_dir());
    let admin = bench.server.admin().await?;
    let warmup = Duration::from_secs(bench.scale.s4_warmup_seconds);
    let duration = Duration::from_secs(bench.scale.s4_seconds);
    let spans_before = collectors.accepting.spans.load(Ordering::Relaxed);
    let mut sides = vec![Side::default(); MODES.len()];
    for rep in 0..bench.scale.reps {
        for turn in 0..MODES.len() {
            let i = (turn + rep) % MODES.len();
            let daemon = &daemons[i];
            admin.batch_execute("CHECKPOINT").await?;
            closed_loop(daemon.api, CLIENTS, Duration::ZERO, warmup, make.clone()).await?;
            let before = cpu::Sample::take(postmaster, Some(daemon.pid));
            let r =
                closed_loop(daemon.api, CLIENTS, Duration::ZERO, duration, make.clone()).await?;
            let spent = cpu::Sample::take(postmaster, Some(daemon.pid)).since(&before);
            eprintln!(
                "  rep {rep} {workload:?} x{CLIENTS} tracing {:<20} {:>7.0} req/s, p99 {:>6.2} ms, \
                 errors {}, daemon CPU µs/req {:.1}; idle {:.0}%",
                MODES[i].label(),
                r.per_second,
                r.latency.p99_ms,
                r.error_count,
                spent.daemon * 1e6 / r.completed.max(1) as f64,
                spent.idle_fraction * 100.0
            );
            sides[i].trials.push(r);
            sides[i].cpu.push(spent);
        }
    }
    let mut spans_dropped = Vec::new();
    for (mode, daemon) in MODES.iter().zip(&daemons).skip(1) {
        let dropped = metric(daemon, "tombstoned_trace_spans_dropped_total").await;
        spans_dropped.push((*mode, dropped));
    }
    for daemon in daemons {
        daemon.stop().await?;
    }
    let spans_exported = collectors.accepting.spans.load(Ordering::Relaxed) - spans_before;
    eprintln!("  {workload:?}: {spans_exported} spans exported; dropped {spans_dropped:?}");
    bench.server.drop_db(&db).await?;
    Ok(Group {
        workload,
        sides,
        spans_exported,
        spans_dropped,
    })
}

/// One series of the daemon's `/metrics`.
async fn metric(daemon: &Daemon, series: &str) -> Option<f64> {
    let mut conn = crate::http_load::Conn::connect(daemon.metrics).await.ok()?;
    let response = conn.get("/metrics").await.ok()?;
    let text = String::from_utf8_lossy(&response.body).into_owned();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

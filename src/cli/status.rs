//! `tombstoned status [--json] [--max-age DURATION]`: the lease, the last runs, the backlog and
//! the lag, read from the database (never from a daemon), rendered for a person or as JSON; and
//! the exit status a monitoring check needs (0 healthy, 2 stale, 69 unreachable).

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{count, StatusArgs};
use crate::cleanup::RecordedRun;
use crate::config::Config;
use crate::exit::Exit;
use crate::status::{self, StatusReport};
use crate::stdout;

/// The JSON document: the report, and the verdict when `--max-age` was given.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(flatten)]
    report: &'a StatusReport,
    /// `--max-age` in seconds, if given.
    max_age_seconds: Option<f64>,
    /// `ok` or `stale` with `--max-age`; `not_checked` without it.
    health: &'static str,
    /// Why it is stale.
    problem: Option<String>,
}

/// Runs `tombstoned status`.
pub(super) async fn run(config: &Config, args: &StatusArgs) -> anyhow::Result<Exit> {
    let report = status::read(&config.database)
        .await
        .context("cannot read the status")?;
    let problem = args.max_age.and_then(|max_age| report.stale(max_age));
    let health = match (args.max_age, &problem) {
        (None, _) => "not_checked",
        (Some(_), Some(_)) => "stale",
        (Some(_), None) => "ok",
    };
    if args.json {
        let document = Document {
            report: &report,
            max_age_seconds: args.max_age.map(|d| d.as_secs_f64()),
            health,
            problem: problem.clone(),
        };
        stdout::print(&format!("{}\n", serde_json::to_string_pretty(&document)?))?;
    } else {
        stdout::print(&render(&report, args.max_age, problem.as_deref()))?;
    }
    Ok(if problem.is_some() {
        Exit::Stale
    } else {
        Exit::Success
    })
}

fn timestamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Whole seconds, human-readable ("3h 2m 5s").
fn ago(seconds: f64) -> String {
    let whole = Duration::from_secs(seconds.max(0.0) as u64);
    format!("{} ago", humantime::format_duration(whole))
}

fn run_line(r: &RecordedRun) -> String {
    format!(
        "  {:<20}  {:<7}  {:<12}  {:>10}  {:>8}  {:>8}  {}",
        timestamp(r.finished_at),
        r.outcome,
        r.stopped_by.as_deref().unwrap_or("-"),
        r.rows_tombstoned,
        r.tombstones_purged,
        r.lock_timeouts,
        r.instance
    )
}

/// The human report: one labelled line per subject, then the recent runs.
pub(crate) fn render(r: &StatusReport, max_age: Option<Duration>, problem: Option<&str>) -> String {
    let mut out = String::new();
    let now = r.read_at;
    let age = |t: DateTime<Utc>| ago((now - t).num_milliseconds() as f64 / 1000.0);
    let _ = writeln!(
        out,
        "schema {} ({}), database clock {}",
        r.schema,
        r.api_version.map_or_else(
            || "SQL API version: this role may not call api_version()".to_owned(),
            |v| format!("SQL API version {v}")
        ),
        timestamp(now)
    );

    let lease = match &r.lease {
        None => "free (never taken)".to_owned(),
        Some(l) if l.held => format!(
            "held by {} (backend {}, {}) since {}, until {}",
            l.holder,
            l.holder_pid.map_or("?".to_owned(), |p| p.to_string()),
            l.holder_application_name.as_deref().unwrap_or("?"),
            timestamp(l.acquired_at),
            timestamp(l.expires_at)
        ),
        Some(l) => format!(
            "free (last held by {}, ended {})",
            l.holder,
            age(l.expires_at)
        ),
    };
    let _ = writeln!(out, "lease         {lease}");

    let last = match &r.last_success {
        None => "none recorded".to_owned(),
        Some(s) => format!(
            "{} ({}), {} tombstoned, {} purged, by {}",
            timestamp(s.finished_at),
            age(s.finished_at),
            count(s.rows_tombstoned, "row", "rows"),
            s.tombstones_purged,
            s.instance
        ),
    };
    let _ = writeln!(out, "last success  {last}");

    let backlog = match r.backlog.oldest_due_deadline {
        None => "0 rows due".to_owned(),
        Some(oldest) => format!(
            "{} due, the oldest since {} ({})",
            count(r.backlog.due_rows, "row", "rows"),
            timestamp(oldest),
            age(oldest)
        ),
    };
    let _ = writeln!(out, "backlog       {backlog}");

    let estimate = |e: Option<i64>| e.map_or("unknown".to_owned(), |n| format!("~{n}"));
    let tombstones = r
        .records
        .tombstones_estimate
        .map_or("unknown tombstones".to_owned(), |n| {
            format!("~{}", count(n, "tombstone", "tombstones"))
        });
    let _ = writeln!(
        out,
        "records       {} live, {tombstones} (estimates as of the last ANALYZE)",
        estimate(r.records.live_estimate),
    );

    let replication = if !r.replication.visible {
        "not visible (needs pg_monitor)".to_owned()
    } else if r.replication.standbys.is_empty() {
        "no standby connected".to_owned()
    } else {
        r.replication
            .standbys
            .iter()
            .map(|s| {
                format!(
                    "{} ({}) {} {}, replay lag {}",
                    s.application_name,
                    s.client_addr.as_deref().unwrap_or("local"),
                    s.state.as_deref().unwrap_or("?"),
                    s.sync_state.as_deref().unwrap_or("?"),
                    s.replay_lag_seconds
                        .map_or("none".to_owned(), |l| format!("{l:.3} s"))
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let _ = writeln!(out, "replication   {replication}");

    let outbox = match &r.outbox {
        None => "not installed".to_owned(),
        Some(o) => format!(
            "{} pending{}, {}",
            o.pending,
            o.oldest_pending_created_at
                .map_or(String::new(), |t| format!(" (oldest created {})", age(t))),
            count(o.dead_letters, "dead letter", "dead letters")
        ),
    };
    let _ = writeln!(out, "outbox        {outbox}");

    let operations = match &r.transitional_grants {
        None => crate::operations::Transitional::NotVisible,
        Some(roles) => crate::operations::Transitional::Roles(roles.clone()),
    };
    let _ = writeln!(out, "operations    {}", operations.describe());

    let health = match (max_age, problem) {
        (None, _) => "not checked (give --max-age)".to_owned(),
        (Some(_), Some(problem)) => format!("STALE: {problem}"),
        (Some(max_age), None) => format!(
            "OK (last success within {})",
            humantime::format_duration(max_age)
        ),
    };
    let _ = writeln!(out, "health        {health}");

    if r.recent_runs.is_empty() {
        let _ = writeln!(out, "recent runs   none recorded");
    } else {
        let _ = writeln!(out, "recent runs");
        let _ = writeln!(
            out,
            "  {:<20}  {:<7}  {:<12}  {:>10}  {:>8}  {:>8}  instance",
            "finished", "outcome", "stopped by", "tombstoned", "purged", "timeouts"
        );
        for run in &r.recent_runs {
            let _ = writeln!(out, "{}", run_line(run));
            if let Some(error) = &run.error {
                let _ = writeln!(out, "      error: {error}");
            }
        }
    }
    out
}

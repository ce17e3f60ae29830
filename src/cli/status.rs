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

/// The records line: exact counts, or the estimates marked `~` with the age of the statistics
/// they come from (`unknown` when the table was never analysed).
fn records(c: &status::RecordCounts, age: impl Fn(DateTime<Utc>) -> String) -> String {
    let mib = c.table_pages * 8 / 1024;
    match c.method {
        status::CountMethod::Counted => format!(
            "{} live, {} (counted)",
            c.live_estimate.unwrap_or(0),
            count(
                c.tombstones_estimate.unwrap_or(0),
                "tombstone",
                "tombstones"
            )
        ),
        status::CountMethod::Statistics => {
            let live = c
                .live_estimate
                .map_or("unknown".to_owned(), |n| format!("~{n}"));
            let tombstones = c
                .tombstones_estimate
                .map_or("unknown tombstones".to_owned(), |n| {
                    format!("~{}", count(n, "tombstone", "tombstones"))
                });
            let of = c
                .statistics_at
                .map_or("the table was never analysed".to_owned(), |at| {
                    format!("statistics of {} ({})", timestamp(at), age(at))
                });
            format!("{live} live, {tombstones} (estimates: {mib} MiB, too large to count; {of})")
        }
    }
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

    let _ = writeln!(out, "records       {}", records(&r.records, age));

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Counted figures are plain; estimates are marked `~`, with the size that made them
    /// estimates and the age of their statistics, or `unknown` when there are none.
    #[test]
    fn the_records_line_says_how_its_figures_were_made() {
        let now: DateTime<Utc> = "2026-12-03T07:40:12Z".parse().unwrap();
        let age = |t: DateTime<Utc>| ago((now - t).num_milliseconds() as f64 / 1000.0);
        let mut c = status::RecordCounts {
            live_estimate: Some(2),
            tombstones_estimate: Some(1),
            method: status::CountMethod::Counted,
            statistics_at: None,
            table_pages: 3,
        };
        assert_eq!(records(&c, age), "2 live, 1 tombstone (counted)");
        c.method = status::CountMethod::Statistics;
        c.live_estimate = Some(40_000_000);
        c.tombstones_estimate = Some(10_000_000);
        c.table_pages = 4_000_000;
        c.statistics_at = Some("2026-12-03T07:35:12Z".parse().unwrap());
        assert_eq!(
            records(&c, age),
            "~40000000 live, ~10000000 tombstones (estimates: 31250 MiB, too large to count; \
             statistics of 2026-12-03T07:35:12Z (5m ago))"
        );
        c.live_estimate = None;
        c.tombstones_estimate = None;
        c.statistics_at = None;
        assert_eq!(
            records(&c, age),
            "unknown live, unknown tombstones (estimates: 31250 MiB, too large to count; the \
             table was never analysed)"
        );
    }
}

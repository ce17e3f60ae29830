//! `tombstoned cleanup`: one run (taking the single-runner lease, like the scheduler) or a dry
//! run, then its report on stdout, human-readable or `--json`.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::{count, progress, CleanupArgs};
use crate::cleanup::{
    dry_run_with_purge, run_leased_on, DryRunReport, Due, LeasedRun, ReplicaPreview, RunContext,
    RunFigures, RunLimits, RunReport, STOP_GRACE,
};
use crate::config::Config;
use crate::db;
use crate::exit::Exit;
use crate::signals::GracefulStop;
use crate::stdout;

/// Runs `tombstoned cleanup [--dry-run] [--json] [--explain] [--max-batches N]`.
///
/// A real run takes the single-runner lease first: when another instance (a daemon's scheduler
/// or another `cleanup`) holds it, nothing is done and the exit status is 75 (EX_TEMPFAIL, "try
/// again later"; `--json` prints `"outcome": "skipped_lease"` with the lease), so a timer-driven
/// one-shot on an HA pair does not clean twice. SIGINT/SIGTERM
/// let the current batch commit or roll back and end the run early (reported, exit 0); a second
/// signal exits at once (130) — the open batch, if any, rolls back with the connection. A signal
/// before the run holds the lease (still connecting, say to a database that does not answer)
/// ends it at once, nothing done (130).
pub(super) async fn run(config: &Config, args: &CleanupArgs) -> anyhow::Result<Exit> {
    if args.explain && !args.dry_run {
        super::say("--explain needs --dry-run");
        return Ok(Exit::Usage);
    }
    if args.dry_run {
        super::require_current_schema(&config.database, "cleanup-dry-run", "dry run failed")
            .await?;
        let report = dry_run_with_purge(
            &config.database,
            &config.cleanup,
            Some(&config.retention),
            args.explain,
        )
        .await
        .context("dry run failed")?;
        if args.json {
            stdout::print(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
        } else {
            stdout::print(&render_dry_run(&report))?;
        }
        return Ok(Exit::Success);
    }

    super::traced(config, leased_run(config, args)).await
}

/// The real run, under the lease.
async fn leased_run(config: &Config, args: &CleanupArgs) -> anyhow::Result<Exit> {
    // A throttle the role cannot observe is refused before the run, once (exit 64).
    crate::cleanup::check_replica_lag_visible(&config.database, &config.cleanup)
        .await
        .context("checking cleanup.max_replica_lag")?;

    // Installed before anything touches the database, so a signal is obeyed at every step.
    let shutdown = CancellationToken::new();
    match GracefulStop::install() {
        Ok(signals) => {
            signals.spawn(
                shutdown.clone(),
                Some("stopping after the current batch (signal again to exit at once)"),
                "second signal: exiting at once",
            );
        }
        Err(e) => tracing::warn!(
            error = %db::error_text(&e),
            "a signal ends the run at once, without letting its batch finish"
        ),
    }
    // Until the run holds the lease a signal ends the command at once, nothing done. The run
    // goes on on the session the schema was checked on (one connection per run).
    let run = RunContext::new(
        &config.database,
        &config.cleanup,
        &config.retention,
        RunLimits {
            max_batches: args.max_batches,
        },
        &shutdown,
        None,
    );
    let session = tokio::select! {
        checked = super::connect_current(&config.database, "cleanup", "cleanup run failed") => checked?,
        () = shutdown.cancelled() => return Ok(stopped_before_the_run()),
    };
    // On a terminal, the line counts from the rows due now (a statement only then).
    let line = if progress::wanted(args.json, args.quiet) {
        Some(start_line(&session, config).await)
    } else {
        None
    };
    let work = run_leased_on(session, &run);
    let watched = async {
        match &line {
            Some(line) => progress::ticking(work, || show(line, &run.figures())).await,
            None => work.await,
        }
    };
    // The run gives its batch in flight STOP_GRACE after a signal, then records itself; on a
    // database that answers nothing even that is bounded here, so a stop always ends the command.
    let result = tokio::select! {
        result = watched => result,
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(STOP_GRACE.saturating_mul(2)).await;
        } => {
            super::say("stopped by a signal; the run did not end in time and was abandoned (its batch rolls back)");
            return Ok(Exit::Interrupted);
        }
    };
    let report = match result.context("cleanup run failed")? {
        LeasedRun::Ran(report) => report,
        LeasedRun::Skipped(state) => {
            let by = state
                .as_ref()
                .map(|s| format!(" by {} until {}", s.holder, timestamp(s.expires_at)))
                .unwrap_or_default();
            super::say(&format!(
                "another instance is cleaning schema {} (it holds the cleanup lease{by}); \
                 nothing was done",
                config.database.schema
            ));
            if args.json {
                // Every outcome --json documents gets an object, this one too (exit 75 stays).
                let skipped = serde_json::json!({
                    "outcome": crate::cleanup::RunOutcome::SkippedLease,
                    "schema": config.database.schema,
                    "lease": state,
                });
                stdout::print(&format!("{}\n", serde_json::to_string_pretty(&skipped)?))?;
            }
            return Ok(Exit::TempFail);
        }
        LeasedRun::Stopped => return Ok(stopped_before_the_run()),
    };
    if let Some(line) = line {
        show(&line, &run.figures());
        line.finish();
    }
    if args.json {
        stdout::print(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        stdout::print(&render_run(&report))?;
    }
    Ok(Exit::Success)
}

/// The progress line of a run on `session`, its total the rows due now (without one when they
/// cannot be counted: the line is a courtesy, never a reason to fail).
async fn start_line(session: &db::Session, config: &Config) -> progress::Line {
    let due = crate::cleanup::bounded(
        config.cleanup.statement_timeout,
        "counting the rows due",
        Due::read(&session.conn()),
    )
    .await;
    match due {
        Ok(due) => progress::Line::start(
            progress::counting_style("cleanup", "rows tombstoned", true),
            Some(due.rows),
        ),
        Err(e) => {
            tracing::debug!(error = %db::error_text(&e), "rows due not counted for the progress line");
            progress::Line::start(
                progress::counting_style("cleanup", "rows tombstoned", false),
                None,
            )
        }
    }
}

/// The run so far on its line: rows tombstoned, and the rate, batches, lock timeouts, rows
/// skipped, throttling and the later phases' work.
fn show(line: &progress::Line, f: &RunFigures) {
    let rate = line.per_second(f.rows_tombstoned);
    let mut message = format!(
        "{rate:.0} rows/s, {}, {}, {}",
        count(f.tombstone_batches, "batch", "batches"),
        count(f.lock_timeouts, "lock timeout", "lock timeouts"),
        count(f.rows_skipped, "row skipped", "rows skipped")
    );
    let throttled = f.throttled_replica_lag + f.throttled_rate;
    if !throttled.is_zero() {
        let _ = write!(message, ", throttled {:.1} s", throttled.as_secs_f64());
    }
    if f.tombstones_purged > 0 {
        let _ = write!(
            message,
            ", {} purged",
            count(f.tombstones_purged, "tombstone", "tombstones")
        );
    }
    if f.outbox_events_deleted > 0 {
        let _ = write!(
            message,
            ", {} deleted",
            count(f.outbox_events_deleted, "outbox event", "outbox events")
        );
    }
    line.show(f.rows_tombstoned, message);
}

fn stopped_before_the_run() -> Exit {
    super::say("stopped by a signal before the run began; nothing was done");
    Exit::Interrupted
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// Whole seconds, human-readable ("3h 2m 5s").
pub(super) fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

pub(super) fn timestamp(t: chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// The human summary of a run.
pub(crate) fn render_run(r: &RunReport) -> String {
    let mut out = String::new();
    let stopped = match r.stopped_by {
        crate::cleanup::StopReason::Finished => "finished",
        crate::cleanup::StopReason::MaxRunTime => "stopped at cleanup.max_run_time",
        crate::cleanup::StopReason::MaxBatches => "stopped at --max-batches",
        crate::cleanup::StopReason::Shutdown => "stopped by a signal",
        crate::cleanup::StopReason::LeaseLost => "stopped: another run took the cleanup lease",
        crate::cleanup::StopReason::ReplicaLag => {
            "stopped at cleanup.max_run_time while waiting for a standby to catch up"
        }
    };
    let _ = writeln!(out, "cleanup {stopped} (cutoff {})", timestamp(r.cutoff));
    let _ = writeln!(out, "  rows tombstoned   {}", r.rows_tombstoned);
    let _ = writeln!(out, "  batches           {}", r.batches);
    if r.workers > 1 {
        let _ = writeln!(out, "  workers           {}", r.workers);
    }
    let _ = writeln!(out, "  lock timeouts     {}", r.lock_timeouts);
    let _ = writeln!(out, "  rows skipped      {}", r.rows_skipped);
    if r.retries > 0 {
        let _ = writeln!(out, "  retries           {}", r.retries);
    }
    let _ = writeln!(out, "  duration          {}", secs(r.duration));
    if !r.throttled_replica_lag.is_zero() || !r.throttled_rate.is_zero() {
        let _ = writeln!(
            out,
            "  throttled         {} waiting for standbys, {} for the rate cap",
            secs(r.throttled_replica_lag),
            secs(r.throttled_rate)
        );
    }
    if let Some(reason) = r.stopped_while_waiting_for {
        let what = match reason {
            crate::cleanup::ThrottleReason::ReplicaLag => {
                "a standby to replay to within cleanup.max_replica_lag"
            }
            crate::cleanup::ThrottleReason::Rate => "cleanup.max_rows_per_second",
        };
        let _ = writeln!(out, "  stopped while     waiting for {what}");
    }
    let _ = writeln!(out, "  rows/s            {:.0}", r.rows_per_second);
    let _ = writeln!(
        out,
        "  slowest batch     {} (p99 {})",
        secs(r.slowest_batch),
        secs(r.batch_p99)
    );
    match (r.backlog_rows, r.oldest_due_age) {
        (0, _) => {
            let _ = writeln!(out, "  backlog left      0 rows");
        }
        (n, Some(a)) => {
            let _ = writeln!(
                out,
                "  backlog left      {} (oldest overdue by {})",
                count(n, "row", "rows"),
                age(a)
            );
        }
        (n, None) => {
            let _ = writeln!(out, "  backlog left      {}", count(n, "row", "rows"));
        }
    }
    match r.purge_before {
        Some(before) => {
            let _ = writeln!(
                out,
                "  purge             {} expired before {} deleted in {}",
                count(r.tombstones_purged, "tombstone", "tombstones"),
                timestamp(before),
                count(r.purge_batches, "batch", "batches")
            );
        }
        None => {
            let _ = writeln!(out, "  purge             off");
        }
    }
    match r.outbox_delete_before {
        Some(before) => {
            let _ = writeln!(
                out,
                "  outbox retention  {} delivered before {} deleted in {}",
                count(r.outbox_events_deleted, "event", "events"),
                timestamp(before),
                count(r.outbox_batches, "batch", "batches")
            );
        }
        None => {
            let _ = writeln!(out, "  outbox retention  off");
        }
    }
    out
}

/// The dry run's replica section: the throttle settings, then each standby's lag (or why it
/// cannot be shown).
fn render_replicas(out: &mut String, r: &ReplicaPreview) {
    let limit = r
        .max_replica_lag_bytes
        .map_or("off".to_owned(), crate::config::byte_size_text);
    let rate = r
        .max_rows_per_second
        .map_or("off".to_owned(), |n| format!("{n} rows/s"));
    let _ = writeln!(
        out,
        "  throttles         max_replica_lag {limit}, max_rows_per_second {rate}"
    );
    if !r.lag.visible {
        let _ = writeln!(
            out,
            "  standbys          replay lag not visible to role {:?} (needs pg_monitor or \
             pg_read_all_stats){}",
            r.lag.role,
            if r.max_replica_lag_bytes.is_some() {
                "; cleanup.max_replica_lag is refused"
            } else {
                ""
            }
        );
        return;
    }
    if r.lag.standbys.is_empty() {
        let _ = writeln!(out, "  standbys          none connected");
        return;
    }
    let _ = writeln!(out, "  standbys (replay lag):");
    for s in &r.lag.standbys {
        let name = if s.application_name.is_empty() {
            "(no application_name)"
        } else {
            s.application_name.as_str()
        };
        let lag = s.lag_bytes.map_or_else(
            || "unknown (no replay position reported yet)".to_owned(),
            |b| format!("{b} bytes"),
        );
        let state = s.state.as_deref().unwrap_or("?");
        let _ = writeln!(out, "    {name:>20}  {state:<10} {lag}");
    }
    if r.would_wait {
        let _ = writeln!(
            out,
            "  a run started now would wait for the standbys before its first batch"
        );
    }
}

/// The human report of a dry run.
pub(crate) fn render_dry_run(r: &DryRunReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dry run at cutoff {} (nothing was changed)",
        timestamp(r.cutoff)
    );
    let _ = writeln!(
        out,
        "  rows due          {} ({} of {})",
        r.rows_due,
        count(r.batches_needed, "batch", "batches"),
        r.batch_size
    );
    if let (Some(deadline), Some(overdue)) = (r.oldest_due_deadline, r.oldest_due_overdue) {
        let _ = writeln!(
            out,
            "  oldest due        deadline {} (overdue by {})",
            timestamp(deadline),
            age(overdue)
        );
    }
    if r.workers > 1 {
        let split: Vec<String> = r
            .worker_slices
            .iter()
            .map(|w| w.rows_due.to_string())
            .collect();
        let _ = writeln!(
            out,
            "  workers           {} would run ({} configured), rows due each: {}",
            r.worker_slices.len(),
            r.workers,
            split.join(" / ")
        );
    } else {
        let _ = writeln!(out, "  workers           1");
    }
    let _ = writeln!(out, "  tombstones        {}", r.tombstones);
    let _ = writeln!(out, "  live records      {}", r.live_records);
    match &r.purge {
        Some(p) => {
            let _ = writeln!(
                out,
                "  purge             {} expired before {} would be deleted",
                count(p.tombstones_to_purge, "tombstone", "tombstones"),
                timestamp(p.purge_before)
            );
        }
        None => {
            let _ = writeln!(out, "  purge             off");
        }
    }
    let o = &r.outbox;
    let oldest = o
        .counts
        .oldest_pending_created_at
        .map(|_| format!(" (oldest {} old)", age(o.counts.oldest_pending_age)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "  outbox            {} pending{oldest}, {}, {} delivered",
        o.counts.pending,
        count(o.counts.dead_letters, "dead letter", "dead letters"),
        o.delivered
    );
    match (o.delete_before, o.events_to_delete) {
        (Some(before), Some(n)) => {
            let _ = writeln!(
                out,
                "  outbox retention  {} delivered before {} would be deleted",
                count(n, "event", "events"),
                timestamp(before)
            );
        }
        _ => {
            let _ = writeln!(out, "  outbox retention  off");
        }
    }
    render_replicas(&mut out, &r.replicas);
    for (title, list) in [
        ("top tenants by rows due", &r.top_tenants),
        ("top operations by rows due", &r.top_operations),
    ] {
        if list.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  {title}:");
        for c in list {
            let _ = writeln!(out, "    {:>12}  {}", c.rows_due, c.name);
        }
    }
    if let Some(plan) = &r.plan {
        let _ = writeln!(out, "  plan of the first batch:");
        for line in plan.lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cleanup::{DueCount, RunOutcome, StopReason};
    use chrono::{DateTime, Utc};

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn run_summary_names_every_figure() {
        let text = render_run(&RunReport {
            cutoff: t(0),
            rows_tombstoned: 1200,
            batches: 2,
            lock_timeouts: 1,
            rows_skipped: 1,
            retries: 0,
            tombstones_purged: 0,
            purge_batches: 0,
            purge_before: None,
            outbox_events_deleted: 4,
            outbox_batches: 1,
            outbox_delete_before: Some(t(-86400)),
            duration: Duration::from_millis(250),
            rows_per_second: 4800.0,
            backlog_rows: 7,
            oldest_due_deadline: Some(t(-3700)),
            oldest_due_age: Some(Duration::from_secs(3700)),
            slowest_batch: Duration::from_millis(40),
            batch_p99: Duration::from_millis(40),
            throttled_replica_lag: Duration::from_millis(1500),
            throttled_rate: Duration::from_secs(2),
            stopped_while_waiting_for: None,
            workers: 1,
            stopped_by: StopReason::MaxBatches,
            outcome: RunOutcome::Partial,
        });
        for needle in [
            "cleanup stopped at --max-batches",
            "rows tombstoned   1200",
            "batches           2",
            "lock timeouts     1",
            "rows skipped      1",
            "duration          0.250 s",
            "rows/s            4800",
            "throttled         1.500 s waiting for standbys, 2.000 s for the rate cap",
            "backlog left      7 rows (oldest overdue by 1h 1m 40s)",
            "purge             off",
            "outbox retention  4 events delivered before 2027-01-14T08:00:00.000Z \
             deleted in 1 batch\n",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
    }

    #[test]
    fn dry_run_report_lists_tops_and_plan() {
        let text = render_dry_run(&DryRunReport {
            cutoff: t(0),
            rows_due: 2500,
            batch_size: 1000,
            batches_needed: 3,
            oldest_due_deadline: Some(t(-60)),
            oldest_due_overdue: Some(Duration::from_secs(60)),
            top_tenants: vec![DueCount {
                name: "acme".into(),
                rows_due: 2000,
            }],
            top_operations: vec![DueCount {
                name: "create-order".into(),
                rows_due: 2500,
            }],
            workers: 1,
            worker_slices: Vec::new(),
            tombstones: 10,
            live_records: 3000,
            purge: None,
            outbox: crate::cleanup::OutboxPreview {
                counts: crate::outbox::OutboxCounts {
                    pending: 3,
                    in_flight: 1,
                    dead_letters: 2,
                    oldest_pending_created_at: Some(t(-125)),
                    oldest_pending_age: Duration::from_secs(125),
                },
                delivered: 40,
                delete_before: None,
                events_to_delete: None,
            },
            replicas: ReplicaPreview {
                max_replica_lag_bytes: Some(64 << 20),
                max_rows_per_second: None,
                lag: crate::cleanup::ReplicaLag {
                    visible: true,
                    role: "app".into(),
                    standbys: vec![
                        crate::cleanup::StandbyLag {
                            application_name: "replica1".into(),
                            state: Some("streaming".into()),
                            lag_bytes: Some(70_000_000),
                        },
                        crate::cleanup::StandbyLag {
                            application_name: "replica2".into(),
                            state: Some("startup".into()),
                            lag_bytes: None,
                        },
                    ],
                },
                would_wait: true,
            },
            plan: Some("Nested Loop\n  ->  Sort".into()),
        });
        for needle in [
            "nothing was changed",
            "rows due          2500 (3 batches of 1000)",
            "overdue by 1m",
            "tombstones        10",
            "live records      3000",
            "2000  acme",
            "2500  create-order",
            "outbox            3 pending (oldest 2m 5s old), 2 dead letters, 40 delivered",
            "outbox retention  off",
            "    Nested Loop",
            "throttles         max_replica_lag 64MB, max_rows_per_second off",
            "replica1  streaming  70000000 bytes",
            "replica2  startup    unknown (no replay position reported yet)",
            "would wait for the standbys",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
    }
}

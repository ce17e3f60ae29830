//! `tombstoned outbox ...`: the one-shot delivery run and its dry run, the listing of
//! undelivered events, and requeueing dead letters — their arguments, output and exit statuses.
//! The relay library (`crate::outbox`) does the work and never prints; this module does.
//!
//! Exit statuses beyond the common ones: `outbox deliver` exits 75 (EX_TEMPFAIL) when some event
//! it attempted is not delivered (retry scheduled, dead-lettered, abandoned or not recorded);
//! `outbox requeue` exits 64 when an event it was given is not a dead letter.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Subcommand;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::{count, progress};
use crate::config::Config;
use crate::db;
use crate::exit::Exit;
use crate::outbox::inspect::{self, DeliveryPreview};
use crate::outbox::{
    EventSummary, OutboxCounts, PassReport, Relay, RequeueReport, RequeueTarget, Tally,
    WebhookClient,
};
use crate::signals::GracefulStop;
use crate::stdout;

/// `tombstoned outbox <command>`
#[derive(Debug, Subcommand)]
pub enum OutboxCommand {
    /// Deliver the events due now (each at most once), then exit. Works whether or not
    /// outbox.enabled is set; needs outbox.endpoint and outbox.secret_file.
    Deliver {
        /// Attempt at most this many events.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        max_events: Option<u64>,
        /// Send nothing and change nothing: list what a run would send now.
        #[arg(long)]
        dry_run: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// No progress line on a terminal (there is none anyway when stderr is not a terminal,
        /// with --json, or under systemd).
        #[arg(long)]
        quiet: bool,
    },
    /// List undelivered events (pending and dead letters), oldest first.
    List {
        /// Only dead letters.
        #[arg(long)]
        dead_letters: bool,
        /// At most this many events.
        #[arg(long, value_name = "N", default_value_t = 100,
              value_parser = clap::value_parser!(u32).range(1..=100_000))]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back into delivery (due now, attempts counted from zero).
    // One of the two is required, and a usage error names both (a group, not
    // required_unless_present, which names only --event).
    #[command(group(clap::ArgGroup::new("target").required(true).args(["events", "all_dead_letters"])))]
    Requeue {
        /// A dead letter's event id (the webhook-id); repeat for several.
        #[arg(
            long = "event",
            value_name = "EVENT_ID",
            conflicts_with = "all_dead_letters"
        )]
        events: Vec<Uuid>,
        /// Every dead letter.
        #[arg(long)]
        all_dead_letters: bool,
    },
}

/// Runs one `tombstoned outbox` command.
pub(super) async fn run(config: &Config, command: &OutboxCommand) -> anyhow::Result<Exit> {
    // A schema not current is exit 69, as for serve (a delivery run checks once its
    // configuration is known good).
    let context = match command {
        OutboxCommand::Deliver { dry_run: false, .. } => None,
        OutboxCommand::Deliver { .. } => Some("outbox dry run failed"),
        OutboxCommand::List { .. } => Some("cannot list the outbox"),
        OutboxCommand::Requeue { .. } => Some("cannot requeue dead letters"),
    };
    if let Some(context) = context {
        super::require_current_schema(&config.database, "outbox-admin", context).await?;
    }
    match command {
        OutboxCommand::Deliver {
            max_events,
            dry_run: true,
            json,
            ..
        } => {
            let limit = max_events.map_or(1000, |n| u32::try_from(n).unwrap_or(u32::MAX));
            let preview = inspect::preview(&config.database, limit)
                .await
                .context("outbox dry run failed")?;
            if *json {
                stdout::print(&format!("{}\n", serde_json::to_string_pretty(&preview)?))?;
            } else {
                stdout::print(&render_preview(&preview, limit, config))?;
            }
            Ok(Exit::Success)
        }
        OutboxCommand::Deliver {
            max_events,
            json,
            quiet,
            ..
        } => super::traced(config, deliver(config, *max_events, *json, *quiet)).await,
        OutboxCommand::List {
            dead_letters,
            limit,
            json,
        } => {
            let (counts, events) = inspect::list(&config.database, *dead_letters, *limit)
                .await
                .context("cannot list the outbox")?;
            if *json {
                let value = serde_json::json!({ "counts": counts, "events": events });
                stdout::print(&format!("{}\n", serde_json::to_string_pretty(&value)?))?;
            } else {
                stdout::print(&render_list(&counts, &events, *dead_letters, *limit))?;
            }
            Ok(Exit::Success)
        }
        OutboxCommand::Requeue {
            events,
            all_dead_letters,
        } => {
            let target = if *all_dead_letters {
                RequeueTarget::AllDeadLetters
            } else {
                RequeueTarget::Events(events.clone())
            };
            let report = inspect::requeue(&config.database, &target)
                .await
                .context("cannot requeue dead letters")?;
            stdout::print(&render_requeue(&report))?;
            Ok(if report.not_dead_letters.is_empty() {
                Exit::Success
            } else {
                Exit::Usage
            })
        }
    }
}

/// `check-config`'s outbox line; fails (exit 64) when the endpoint is set but the secret or CA
/// file is unusable.
pub(super) fn check_line(config: &Config) -> anyhow::Result<String> {
    let o = &config.outbox;
    let state = if o.enabled {
        "relay enabled in serve"
    } else {
        "relay disabled in serve"
    };
    let retention = config.retention.outbox_keep_delivered.map_or(
        "delivered events kept forever".to_owned(),
        |d| {
            format!(
                "delivered events deleted {} after delivery",
                humantime::format_duration(d)
            )
        },
    );
    if o.endpoint.is_none() {
        return Ok(format!("{state}; no endpoint; {retention}"));
    }
    WebhookClient::new(o).context("outbox configuration")?;
    Ok(format!(
        "{state}; endpoint {}, secret file readable by its owner only, {} concurrent, \
         request_timeout {}, lease {}, max_attempts {}; {retention}",
        o.endpoint_display(),
        o.concurrency,
        humantime::format_duration(o.request_timeout),
        humantime::format_duration(o.lease_duration),
        o.max_attempts
    ))
}

async fn deliver(
    config: &Config,
    max_events: Option<u64>,
    json: bool,
    quiet: bool,
) -> anyhow::Result<Exit> {
    let relay = Relay::new(&config.database, &config.outbox, "outbox-deliver", None)
        .context("cannot start the outbox relay")?;
    let checked =
        super::connect_current(&config.database, "outbox-deliver", "outbox delivery failed")
            .await?;
    // On a terminal, the line counts toward the events due now (a statement only then).
    let line = if progress::wanted(json, quiet) {
        Some(start_line(&checked, max_events).await)
    } else {
        None
    };
    drop(checked);
    let shutdown = CancellationToken::new();
    let signals = match GracefulStop::install() {
        Ok(signals) => Some(signals.spawn(
            shutdown.clone(),
            Some("stopping: nothing new is sent (signal again to exit at once)"),
            "second signal: exiting at once",
        )),
        Err(e) => {
            tracing::warn!(
                error = %db::error_text(&e),
                "a signal ends the run at once, without letting deliveries finish"
            );
            None
        }
    };
    let tally = Tally::default();
    let result = match &line {
        Some(line) => {
            let work = relay.drain_watched(max_events, &shutdown, Some(&tally));
            progress::ticking(work, || show(line, &tally.get())).await
        }
        None => relay.drain(max_events, &shutdown).await,
    };
    if let Some(signals) = signals {
        signals.abort();
    }
    let report = result.context("outbox delivery failed")?;
    if let Some(line) = line {
        show(&line, &report);
        line.finish();
    }
    if json {
        stdout::print(&format!("{}\n", serde_json::to_string_pretty(&report)?))?;
    } else {
        stdout::print(&render_report(&report, &config.outbox.endpoint_display()))?;
    }
    Ok(if report.all_delivered() {
        Exit::Success
    } else {
        Exit::TempFail
    })
}

/// The progress line of a delivery run, its total the events due now (at most `max_events`;
/// without one when they cannot be counted: the line is a courtesy, never a reason to fail).
async fn start_line(session: &db::Session, max_events: Option<u64>) -> progress::Line {
    match inspect::due_count(&session.conn()).await {
        Ok(due) => progress::Line::start(
            progress::counting_style("outbox deliver", "events", true),
            Some(max_events.map_or(due, |max| due.min(max))),
        ),
        Err(e) => {
            tracing::debug!(error = %db::error_text(&e), "due events not counted for the progress line");
            progress::Line::start(
                progress::counting_style("outbox deliver", "events", false),
                None,
            )
        }
    }
}

/// The run so far on its line: events attempted, and the rate, delivered, retries and dead
/// letters.
fn show(line: &progress::Line, r: &PassReport) {
    let attempted = r.attempted();
    let rate = line.per_second(attempted);
    line.show(
        attempted,
        format!(
            "{rate:.1} events/s, {} delivered, {} retry scheduled, {} dead-lettered",
            r.delivered, r.retried, r.dead_lettered
        ),
    );
}

fn timestamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

fn counts_line(c: &OutboxCounts) -> String {
    let oldest = c
        .oldest_pending_created_at
        .map(|_| format!(", oldest {} old", age(c.oldest_pending_age)))
        .unwrap_or_default();
    format!(
        "{} pending ({} in flight{oldest}), {}",
        c.pending,
        c.in_flight,
        count(c.dead_letters, "dead letter", "dead letters")
    )
}

fn event_line(e: &EventSummary) -> String {
    let last = match (&e.last_status, &e.last_error) {
        (_, Some(error)) => format!("last: {error}"),
        (Some(status), None) => format!("last: HTTP {status}"),
        (None, None) => "never attempted".to_owned(),
    };
    format!(
        "  {}  {}  seq {}  {}  attempts {}  created {}  next {}  {last}",
        e.event_id,
        e.event_type,
        e.sequence,
        e.state.label(),
        e.attempts,
        timestamp(e.created_at),
        timestamp(e.next_attempt_at),
    )
}

/// The human report of a delivery run.
pub(crate) fn render_report(r: &PassReport, endpoint: &str) -> String {
    let mut out = String::new();
    let attempted = r.picked - r.released;
    let _ = writeln!(
        out,
        "outbox delivery to {endpoint}: {} attempted",
        count(attempted, "event", "events")
    );
    let _ = writeln!(out, "  delivered         {}", r.delivered);
    let timeouts = if r.timeouts > 0 {
        format!(
            " ({} timed out: outcome unknown, the receiver may have them)",
            r.timeouts
        )
    } else {
        String::new()
    };
    let _ = writeln!(out, "  retry scheduled   {}{timeouts}", r.retried);
    let _ = writeln!(out, "  dead-lettered     {}", r.dead_lettered);
    if r.abandoned > 0 || r.released > 0 {
        let _ = writeln!(
            out,
            "  stopped early     {} abandoned in flight, {} released unsent",
            r.abandoned, r.released
        );
    }
    if r.unrecorded > 0 {
        let _ = writeln!(
            out,
            "  not recorded      {} (sent again when their lease expires)",
            r.unrecorded
        );
    }
    out
}

/// The human output of `deliver --dry-run`.
pub(crate) fn render_preview(p: &DeliveryPreview, limit: u32, config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "outbox dry run (nothing was sent or changed); endpoint {}",
        config.outbox.endpoint_display()
    );
    let _ = writeln!(out, "  outbox          {}", counts_line(&p.counts));
    let _ = writeln!(
        out,
        "  would send      {} now",
        count(p.would_send.len(), "event", "events")
    );
    for e in &p.would_send {
        let _ = writeln!(out, "{}", event_line(e));
    }
    if p.would_send.len() >= limit as usize {
        let _ = writeln!(
            out,
            "  (the first {limit}; a run without --max-events sends all)"
        );
    }
    out
}

/// The human output of `list`.
pub(crate) fn render_list(
    counts: &OutboxCounts,
    events: &[EventSummary],
    dead_letters_only: bool,
    limit: u32,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "outbox: {}", counts_line(counts));
    let what = if dead_letters_only {
        count(events.len(), "dead letter", "dead letters")
    } else {
        count(events.len(), "undelivered event", "undelivered events")
    };
    let _ = writeln!(out, "{what}, oldest first:");
    for e in events {
        let _ = writeln!(out, "{}", event_line(e));
    }
    if events.len() >= limit as usize {
        let _ = writeln!(out, "(the first {limit}; --limit shows more)");
    }
    out
}

/// The human output of `requeue`.
pub(crate) fn render_requeue(r: &RequeueReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "requeued {} (due now, attempts from 0)",
        count(r.requeued.len(), "dead letter", "dead letters")
    );
    for id in &r.requeued {
        let _ = writeln!(out, "  requeued         {id}");
    }
    for id in &r.not_dead_letters {
        let _ = writeln!(
            out,
            "  not a dead letter {id} (unknown, pending or delivered): unchanged"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::EventState;

    #[test]
    fn report_names_every_figure() {
        let text = render_report(
            &PassReport {
                picked: 5,
                delivered: 2,
                retried: 1,
                timeouts: 1,
                dead_lettered: 1,
                abandoned: 0,
                released: 1,
                unrecorded: 0,
            },
            "https://h/in",
        );
        for needle in [
            "outbox delivery to https://h/in: 4 events attempted",
            "delivered         2",
            "retry scheduled   1 (1 timed out",
            "dead-lettered     1",
            "0 abandoned in flight, 1 released unsent",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
    }

    #[test]
    fn one_of_a_kind_is_singular() {
        let one = PassReport {
            picked: 1,
            delivered: 1,
            ..PassReport::default()
        };
        let text = render_report(&one, "https://h/in");
        assert!(
            text.starts_with("outbox delivery to https://h/in: 1 event attempted\n"),
            "{text}"
        );
        let counts = OutboxCounts {
            dead_letters: 1,
            ..OutboxCounts::default()
        };
        let text = render_list(&counts, &[], true, 100);
        assert!(
            text.starts_with("outbox: 0 pending (0 in flight), 1 dead letter\n"),
            "{text}"
        );
        let text = render_requeue(&RequeueReport {
            requeued: vec![Uuid::from_u128(7)],
            not_dead_letters: Vec::new(),
        });
        assert!(
            text.starts_with("requeued 1 dead letter (due now, attempts from 0)\n"),
            "{text}"
        );
    }

    #[test]
    fn listing_shows_state_attempts_and_the_last_error() {
        let t = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let e = EventSummary {
            event_id: Uuid::from_u128(7),
            event_type: "order.created".into(),
            order_id: Some(Uuid::from_u128(8)),
            aggregate_id: None,
            sequence: 1,
            created_at: t,
            attempts: 3,
            next_attempt_at: t,
            last_attempt_at: Some(t),
            last_status: Some(400),
            last_error: Some("HTTP 400 Bad Request".into()),
            state: EventState::DeadLetter,
        };
        let text = render_list(&OutboxCounts::default(), &[e], true, 100);
        assert!(
            text.contains(
                "00000000-0000-0000-0000-000000000007  order.created  seq 1  dead_letter  \
                 attempts 3"
            ),
            "{text}"
        );
        assert!(text.contains("last: HTTP 400 Bad Request"), "{text}");
        let requeue = render_requeue(&RequeueReport {
            requeued: vec![Uuid::from_u128(7)],
            not_dead_letters: vec![Uuid::from_u128(9)],
        });
        assert!(
            requeue.contains("requeued 1 dead letter (due now"),
            "{requeue}"
        );
        assert!(requeue.contains("not a dead letter 00000000"), "{requeue}");
    }
}

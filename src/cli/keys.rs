//! `tombstoned keys explain`: why one key of one scope answers what it answers, read-only and
//! without a lock (`crate::keys` reads; this module renders, text or `--json`). Exit status 0
//! when the key has a record (committed, or held by an open transaction), 3 when it has none.

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::cleanup::{age, timestamp};
use crate::config::Config;
use crate::exit::Exit;
use crate::keys::{
    self, ExplainRequest, Explanation, HoldKind, IntentCheck, KeyState, Probe, Retry, Transaction,
};
use crate::stdout;

/// `tombstoned keys <command>`
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Why a key answers what it answers: its record and state, the stored status and
    /// resource, whether an intent matches it, and which open transaction holds it. Read-only:
    /// it takes no lock a claim or the cleaner could wait for. Exit 0 when the key has a record,
    /// 3 when it has none.
    #[command(long_about = EXPLAIN_ABOUT)]
    Explain(ExplainArgs),
}

const EXPLAIN_ABOUT: &str = "\
Why a key answers what it answers: whether the scope (tenant, principal, operation) has a record \
of the key; its state (in flight: an open transaction has claimed it and not committed; completed \
and replayable until when; past its deadline or tombstoned since when; or none, the key is free); \
the stored status and resource (never the body unless --show-body); with --intent, whether that \
intent's fingerprint is the stored one, and so what a retry of it gets (a replay, 422 key reused, \
410 expired; the SQL API's replay, key_reused, expired); and, when a transaction holds the record, \
which one (pid, application, role, how long, what it waits for) where the role may see it.

Read-only, in one READ ONLY transaction that takes no row lock: run it with the migrating role's \
configuration, or a monitoring role's with USAGE on the schema and SELECT on its schema_history, \
idempotency_scopes and idempotency_records (pg_monitor to see other roles' sessions).

For the operation create-order (the endpoint's), --intent is the POST /v1/orders body, validated \
and fingerprinted exactly as the endpoint does it (api.default_currency for an omitted currency, \
api.default_api_version for a request without an Api-Version header). For any other operation it \
is the SQL API's intent (jsonb), fingerprinted by the schema's fingerprint(intent).

Exit status 0 when the key has a record (committed, or held by an open transaction), 3 when it has \
none.";

/// `tombstoned keys explain`
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// The scope's tenant.
    #[arg(long, value_name = "T")]
    pub tenant: String,
    /// The scope's principal.
    #[arg(long, value_name = "P")]
    pub principal: String,
    /// The scope's operation (create-order is the endpoint's).
    #[arg(long, value_name = "OP")]
    pub operation: String,
    /// The idempotency key.
    #[arg(long, value_name = "K")]
    pub key: String,
    /// An intent to compare with the stored fingerprint: for create-order the order request
    /// body, for another operation the SQL API's intent (JSON).
    #[arg(long, value_name = "JSON")]
    pub intent: Option<String>,
    /// Also print the stored response body (it says it is showing one).
    #[arg(long)]
    pub show_body: bool,
    /// Print the explanation as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs one `tombstoned keys` command.
pub(super) async fn run(config: &Config, command: &KeysCommand) -> anyhow::Result<Exit> {
    let KeysCommand::Explain(args) = command;
    const CONTEXT: &str = "cannot explain the key";
    let session = super::connect_current(&config.database, "keys-explain", CONTEXT).await?;
    let request = ExplainRequest {
        tenant: &args.tenant,
        principal: &args.principal,
        operation: &args.operation,
        key: &args.key,
        intent: args.intent.as_deref(),
        show_body: args.show_body,
    };
    let explanation = keys::explain(&session.conn(), &config.api, &request)
        .await
        .context(CONTEXT)?;
    if args.json {
        stdout::print(&format!(
            "{}\n",
            serde_json::to_string_pretty(&explanation)?
        ))?;
    } else {
        stdout::print(&render(&explanation))?;
    }
    Ok(if explanation.state.has_record() {
        Exit::Success
    } else {
        Exit::NoRecord
    })
}

/// Time from `from` to `to`, whole seconds ("59m 48s"), or "0s" when `to` is not later.
fn between(from: chrono::DateTime<chrono::Utc>, to: chrono::DateTime<chrono::Utc>) -> String {
    age((to - from).to_std().unwrap_or_default())
}

/// The human explanation.
pub(crate) fn render(e: &Explanation) -> String {
    let mut out = String::new();
    let whose = if e.endpoint { " (the endpoint's)" } else { "" };
    let _ = writeln!(
        out,
        "key {:?} of tenant {:?}, principal {:?}, operation {:?}{whose}",
        e.key, e.tenant, e.principal, e.operation
    );
    let record = e.record.as_ref();
    let state = match (e.state, record) {
        (KeyState::InFlight, _) => {
            "in flight: an open transaction has claimed the key and not committed".to_owned()
        }
        (KeyState::Completed, Some(r)) => format!(
            "completed, replayable until {} (for {} more)",
            timestamp(r.replay_deadline),
            between(e.read_at, r.replay_deadline)
        ),
        (KeyState::PastDeadline, Some(r)) => format!(
            "expired: its replay window closed at {} ({} ago); not tombstoned yet",
            timestamp(r.replay_deadline),
            between(r.replay_deadline, e.read_at)
        ),
        (KeyState::Tombstoned, Some(r)) => format!(
            "tombstoned since {} (its replay window closed at {}): the body is gone, the key \
             stays used",
            r.expired_at.map_or("?".to_owned(), timestamp),
            timestamp(r.replay_deadline)
        ),
        (KeyState::Unfinished, _) => {
            "claimed without a stored answer (written outside the protocol)".to_owned()
        }
        (KeyState::Free, _) if e.probe == Probe::Unavailable => {
            "no committed record (whether an open transaction holds the key cannot be told: \
             the server does not count index reads, track_counts = off)"
                .to_owned()
        }
        (KeyState::Free, _) => {
            "free: no record, committed or in flight; a request with the key now claims it"
                .to_owned()
        }
        (_, None) => format!("{:?}", e.state),
    };
    let _ = writeln!(out, "  state             {state}");
    if let Some(r) = record {
        let mut answer = match r.status_code {
            Some(status) => format!("status {status}"),
            None => "no status".to_owned(),
        };
        if let Some(order) = r.order_id {
            let _ = write!(answer, ", order {order}");
        }
        if let Some(resource) = &r.resource_id {
            let _ = write!(answer, ", resource {resource}");
        }
        let _ = writeln!(out, "  stored answer     {answer}");
        let _ = writeln!(out, "  claimed at        {}", timestamp(r.created_at));
        let _ = writeln!(out, "  fingerprint       {}", r.fingerprint);
        match (&r.response_body, r.body_shown, e.state) {
            (_, false, KeyState::Tombstoned) | (None, true, KeyState::Tombstoned) => {
                let _ = writeln!(out, "  body              none (a tombstone keeps no body)");
            }
            (_, false, _) => {
                let _ = writeln!(out, "  body              not shown (--show-body shows it)");
            }
            (Some(body), true, _) => {
                let _ = writeln!(
                    out,
                    "  body              SHOWING THE STORED BODY (--show-body):"
                );
                let _ = writeln!(out, "{body}");
            }
            (None, true, _) => {
                let _ = writeln!(out, "  body              none stored");
            }
        }
    }
    match &e.held {
        Some(held) => {
            let label = match held.how {
                HoldKind::RowLock => "  lock              held by ",
                HoldKind::UncommittedClaim => {
                    "  held by           one of the open transactions writing records: "
                }
            };
            for (i, t) in held.transactions.iter().enumerate() {
                let lead = if i == 0 {
                    label.to_owned()
                } else {
                    format!("{:width$}", "", width = label.len())
                };
                let _ = writeln!(out, "{lead}{}", session(t, &e.role));
            }
        }
        None if record.is_some() => {
            let _ = writeln!(
                out,
                "  lock              no open transaction holds the record"
            );
        }
        None => {}
    }
    if let Some(intent) = &e.intent {
        let _ = writeln!(out, "  intent            {}", intent_line(e, intent));
    }
    if !e.other_operations.is_empty() {
        let _ = writeln!(
            out,
            "  other operations  the key has a record in {} (same tenant and principal)",
            e.other_operations.join(", ")
        );
    }
    out
}

/// One holding session: who, and what the role may see of it.
fn session(t: &Transaction, role: &str) -> String {
    let mut line = format!("pid {}", t.pid);
    let app = t.application_name.as_deref().filter(|a| !a.is_empty());
    match (app, &t.role) {
        (Some(app), Some(r)) => {
            let _ = write!(line, " (application {app}, role {r})");
        }
        (None, Some(r)) => {
            let _ = write!(line, " (role {r})");
        }
        (Some(app), None) => {
            let _ = write!(line, " (application {app})");
        }
        (None, None) => {}
    }
    if !t.visible {
        let _ = write!(
            line,
            ": its state is not visible to role {role} (needs pg_read_all_stats, which \
             pg_monitor includes)"
        );
    } else {
        let state = t.state.as_deref().unwrap_or("state unknown");
        let _ = write!(line, ": {state}");
        if let Some(seconds) = t.transaction_seconds {
            let _ = write!(line, ", transaction open {seconds:.1} s");
        }
        match (&t.wait_event_type, &t.wait_event) {
            // An idle session waits for its client: the state says so already.
            (Some(kind), Some(_)) if kind == "Client" && state.starts_with("idle") => {}
            (Some(kind), Some(event)) if kind == "Lock" => {
                let _ = write!(line, ", waiting for a lock ({event})");
            }
            (Some(kind), Some(event)) => {
                let _ = write!(line, ", waiting on {kind}/{event}");
            }
            _ => {}
        }
    }
    if !t.waiting_for.is_empty() {
        let _ = write!(line, ", blocked by pid {}", pids(&t.waiting_for));
    }
    if !t.record_locks.is_empty() {
        let _ = write!(line, "; holds {} on the records", t.record_locks.join(", "));
    }
    if !t.blocking.is_empty() {
        let _ = write!(line, "; pid {} waiting for it", pids(&t.blocking));
    }
    line
}

fn pids(pids: &[i32]) -> String {
    pids.iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a retry of the intent gets, in the operation's terms (HTTP for the endpoint, `claim()`'s
/// outcomes for the SQL API).
fn intent_line(e: &Explanation, intent: &IntentCheck) -> String {
    let compared = match intent.matches {
        Some(true) => "matches the stored fingerprint",
        Some(false) => "differs from the stored fingerprint",
        None => "",
    };
    let version = intent
        .api_version
        .as_deref()
        .filter(|_| e.endpoint && intent.matches.is_some())
        .map(|v| format!(" (Api-Version {v})"))
        .unwrap_or_default();
    let status = e
        .record
        .as_ref()
        .and_then(|r| r.status_code)
        .map_or("?".to_owned(), |s| s.to_string());
    let retry = match (intent.retry, e.endpoint) {
        (Retry::Replay, true) => {
            format!("a retry of it replays the stored answer (HTTP {status}, as a replay)")
        }
        (Retry::Replay, false) => "claim() answers replay, with the stored answer".to_owned(),
        (Retry::KeyReused, true) => {
            "a retry of it gets 422 idempotency-key-reused (the key was used for another intent)"
                .to_owned()
        }
        (Retry::KeyReused, false) => {
            "claim() answers key_reused (the key was used for another intent)".to_owned()
        }
        (Retry::Expired, true) => {
            "a retry of it gets 410 replay-window-expired (never a re-execution)".to_owned()
        }
        (Retry::Expired, false) => "claim() answers expired (never a re-execution)".to_owned(),
        (Retry::WaitsForHolder, true) => {
            "a retry of it waits for that transaction (up to api.claim_lock_timeout, then 409 \
             request-in-progress) and answers from what it commits"
                .to_owned()
        }
        (Retry::WaitsForHolder, false) => {
            "claim() waits for that transaction (up to its lock_timeout, then SQLSTATE 55P03) \
             and answers from what it commits"
                .to_owned()
        }
        (Retry::Claims, true) => {
            "a request with it claims the key: the order is created".to_owned()
        }
        (Retry::Claims, false) => "claim() answers owner: the business runs".to_owned(),
        (Retry::RefusedBeforeClaim, _) => format!(
            "the endpoint refuses it before any claim ({}); the key is not consumed",
            intent.refused.as_deref().unwrap_or("invalid")
        ),
        (Retry::Unknown, _) => format!(
            "what a retry gets cannot be told: {}",
            intent
                .unknown
                .as_deref()
                .unwrap_or("the record has no stored answer")
        ),
    };
    if compared.is_empty() {
        retry
    } else {
        format!("{compared}{version}: {retry}")
    }
}

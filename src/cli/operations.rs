//! `tombstoned operations grant|revoke|list`: which database role may use which operation of the
//! SQL API — the arguments, the output and the exit statuses. Run with the configuration of the
//! role that ran `migrate` (the owner of the grants). The work is `crate::operations`'.
//!
//! Exit statuses beyond the common ones: 64 for a role that does not exist, `create-order`
//! without `--force`, `grant '*'`, or a role that may not change the grants.

use std::fmt::Write as _;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use clap::Subcommand;

use crate::config::Config;
use crate::db;
use crate::exit::Exit;
use crate::operations::{self, GrantOutcome, Listing, Operation, RevokeOutcome};
use crate::stdout;

/// `tombstoned operations <command>`
#[derive(Debug, Subcommand)]
pub enum OperationsCommand {
    /// Let ROLE (and every role that is a member of it) claim, complete and look up keys in
    /// OPERATION, and enqueue events. Recorded with who and when.
    Grant {
        /// The operation: the third part of a scope, as the role passes it to claim().
        #[arg(value_name = "OPERATION")]
        operation: String,
        /// The database role.
        #[arg(value_name = "ROLE")]
        role: String,
        /// Needed for create-order, the operation of tombstoned's own endpoint, reserved to the
        /// daemon's role.
        #[arg(long)]
        force: bool,
    },
    /// Take OPERATION away from ROLE ('*': the transitional grant of every operation but
    /// create-order that the upgrade to schema V8 gave). Effective from the role's next
    /// transaction, on connections already open too. Recorded with who and when.
    Revoke {
        /// The operation, or '*'.
        #[arg(value_name = "OPERATION")]
        operation: String,
        /// The database role (or, for a role dropped since, its OID as `list` shows it).
        #[arg(value_name = "ROLE")]
        role: String,
    },
    /// The grants in force and the history of every change.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `tombstoned operations` command.
pub(super) async fn run(config: &Config, command: &OperationsCommand) -> anyhow::Result<Exit> {
    let done = match command {
        OperationsCommand::Grant {
            operation,
            role,
            force,
        } => {
            let context = "cannot grant the operation";
            // A usage error is said before the database is asked anything.
            let operation = Operation::parse(operation).context(context)?;
            let session = session(config, context).await?;
            match operations::grant(&session.conn(), &operation, role, *force)
                .await
                .context(context)?
            {
                GrantOutcome::Granted => format!("granted {operation} to role \"{role}\"\n"),
                GrantOutcome::AlreadyHeld => {
                    format!("role \"{role}\" already holds {operation}; nothing changed\n")
                }
            }
        }
        OperationsCommand::Revoke { operation, role } => {
            let context = "cannot revoke the operation";
            let operation = Operation::parse(operation).context(context)?;
            let session = session(config, context).await?;
            match operations::revoke(&session.conn(), &operation, role)
                .await
                .context(context)?
            {
                RevokeOutcome::Revoked => format!("revoked {operation} from role \"{role}\"\n"),
                RevokeOutcome::NotHeld => {
                    format!("role \"{role}\" does not hold {operation}; nothing changed\n")
                }
            }
        }
        OperationsCommand::List { json } => {
            let context = "cannot list the operations";
            let session = session(config, context).await?;
            let listing = operations::list(&session.conn()).await.context(context)?;
            if *json {
                format!("{}\n", serde_json::to_string_pretty(&listing)?)
            } else {
                render(&listing)
            }
        }
    };
    stdout::print(&done)?;
    Ok(Exit::Success)
}

/// A session on a schema this binary knows (exit 69 otherwise). A role that may not even read
/// the schema's history is not the one to run these commands: refused as not allowed (64).
async fn session(config: &Config, context: &'static str) -> anyhow::Result<db::Session> {
    super::connect_current(&config.database, "operations", context)
        .await
        .map_err(|e| {
            let refusal = e
                .chain()
                .filter_map(|cause| cause.downcast_ref::<tokio_postgres::Error>())
                .find_map(operations::OperationsError::refused);
            match refusal {
                Some(refusal) => anyhow::Error::new(refusal).context(context),
                None => e,
            }
        })
}

fn timestamp(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Rows of cells as aligned columns (the last one unpadded), indented, two spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows.first().map_or(0, Vec::len))
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "  {}", cells.join("  ").trim_end());
    }
    out
}

/// The human listing: the grants in force, then the history.
pub(crate) fn render(listing: &Listing) -> String {
    let mut out = String::new();
    if listing.grants.is_empty() {
        let _ = writeln!(out, "grants: none");
    } else {
        let _ = writeln!(out, "grants:");
        let mut rows = vec![["operation", "role", "granted", "by", "note"]
            .map(str::to_owned)
            .to_vec()];
        for g in &listing.grants {
            let mut note = g.note.clone().unwrap_or_default();
            if g.forced {
                note = format!("--force {note}").trim_end().to_owned();
            }
            if !g.role_exists {
                note = format!("(role dropped) {note}").trim_end().to_owned();
            }
            rows.push(vec![
                g.operation.clone(),
                g.role.clone(),
                timestamp(g.granted_at),
                g.granted_by.clone(),
                note,
            ]);
        }
        out.push_str(&columns(&rows));
    }
    if listing.changes.is_empty() {
        let _ = writeln!(out, "changes: none");
    } else {
        let _ = writeln!(out, "changes, oldest first:");
        let mut rows = vec![["at", "by", "action", "operation", "role"]
            .map(str::to_owned)
            .to_vec()];
        for c in &listing.changes {
            let role = if c.forced {
                format!("{} (--force)", c.role)
            } else {
                c.role.clone()
            };
            rows.push(vec![
                timestamp(c.changed_at),
                c.changed_by.clone(),
                c.action.clone(),
                c.operation.clone(),
                role,
            ]);
        }
        out.push_str(&columns(&rows));
    }
    out
}

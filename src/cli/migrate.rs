//! `tombstoned migrate [--status]`: apply the pending schema migrations, or list applied and
//! pending ones.

use std::fmt::Write as _;

use super::MigrateArgs;
use crate::config::Config;
use crate::db;
use crate::exit::Exit;
use crate::schema::{self, migrations};
use crate::stdout;

/// Migrates, or with `--status` reports, changing nothing.
pub(super) async fn run(config: &Config, args: MigrateArgs) -> anyhow::Result<Exit> {
    let mut out = String::new();
    if args.status {
        let session = db::connect(&config.database, "migrate").await?;
        let status = migrations::status(&session.conn(), None).await?;
        for m in &status.applied {
            let _ = writeln!(
                out,
                "applied   V{}__{} ({})",
                m.version,
                m.name,
                m.applied_on.as_deref().unwrap_or("?")
            );
        }
        for m in &status.pending {
            let _ = writeln!(out, "pending   V{}__{}", m.version, m.name);
        }
        for m in &status.divergent {
            let _ = writeln!(
                out,
                "DIVERGENT V{}__{} (file changed after it was applied)",
                m.version, m.name
            );
        }
        for m in &status.unknown {
            let _ = writeln!(
                out,
                "UNKNOWN   V{}__{} (applied by a newer tombstoned)",
                m.version, m.name
            );
        }
        match status.problem() {
            None => {
                let _ = writeln!(out, "schema {} is current", config.database.schema);
            }
            Some(p) => {
                let _ = writeln!(out, "{p}");
            }
        }
        stdout::print(&out)?;
        return Ok(Exit::Success);
    }
    let applied = schema::migrate(&config.database).await?;
    if applied.is_empty() {
        let _ = writeln!(out, "schema {} is already current", config.database.schema);
    }
    for m in applied {
        let _ = writeln!(out, "applied V{}__{}", m.version, m.name);
    }
    stdout::print(&out)?;
    Ok(Exit::Success)
}

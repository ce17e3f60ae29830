//! `tombstoned migrate [--status]`: apply the pending schema migrations, or list applied and
//! pending ones.

use std::fmt::Write as _;

use super::{progress, MigrateArgs};
use crate::config::Config;
use crate::db;
use crate::exit::Exit;
use crate::schema::{self, migrations, MigrationActivity};
use crate::stdout;

/// Migrates, or with `--status` reports, changing nothing.
pub(super) async fn run(config: &Config, args: MigrateArgs) -> anyhow::Result<Exit> {
    let mut out = String::new();
    if args.status {
        let session = db::connect(&config.database, "migrate").await?;
        if let Some(server) = schema::server::unsupported(&session.conn(), None).await? {
            return Err(
                anyhow::Error::new(migrations::MigrationError::from(server)).context(REFUSED)
            );
        }
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
    let applied = if progress::wanted(false, args.quiet) {
        // The line says what the migration does while it runs; the list below says what was
        // applied, so the line is cleared at the end.
        let line = progress::Line::start(progress::message_style("migrate"), None);
        schema::migrate_watched(&config.database, progress::TICK, |activity| {
            line.say(describe(activity, line.elapsed()))
        })
        .await
        .map_err(refused)?
    } else {
        schema::migrate(&config.database).await.map_err(refused)?
    };
    if applied.is_empty() {
        let _ = writeln!(out, "schema {} is already current", config.database.schema);
    }
    for m in applied {
        let _ = writeln!(out, "applied V{}__{}", m.version, m.name);
    }
    stdout::print(&out)?;
    Ok(Exit::Success)
}

/// What `migrate` says when the server is not one this binary works on (nothing written).
const REFUSED: &str = "refusing to migrate";

/// A refused server in `migrate`'s words; any other failure as it is.
fn refused(e: migrations::MigrationError) -> anyhow::Error {
    let unsupported = matches!(e, migrations::MigrationError::Unsupported(_));
    let e = anyhow::Error::new(e);
    if unsupported {
        e.context(REFUSED)
    } else {
        e
    }
}

/// One line of what a migration run does: which migration, for how long, and its index build
/// (phase and blocks), else the lock it waits for; and the strong locks it holds.
fn describe(a: &MigrationActivity, elapsed: std::time::Duration) -> String {
    let mut line = match &a.migration {
        Some(m) => format!(
            "V{}__{} ({} of {}), {:.1} s",
            m.version,
            m.name,
            a.step.0,
            a.step.1,
            a.running_for.as_secs_f64()
        ),
        None => format!("{:.1} s", elapsed.as_secs_f64()),
    };
    if let Some(build) = &a.index_build {
        let _ = write!(line, ": {}", build.phase);
        if let Some(index) = &build.index {
            let _ = write!(line, " of index {index}");
        }
        if let Some(table) = &build.table {
            let _ = write!(line, " on {table}");
        }
        let (total, done) = build.blocks;
        if total > 0 {
            let _ = write!(line, ", {done} of {total} blocks");
        }
        let (total, done) = build.tuples;
        if total > 0 {
            let _ = write!(line, ", {done} of {total} tuples");
        }
    } else if let Some(wait) = &a.waits {
        let what = match wait.what.as_str() {
            "advisory" => "another migrate of this schema (advisory lock)".to_owned(),
            "transactionid" => "another transaction".to_owned(),
            relation => format!("{} on {relation}", wait.mode),
        };
        let _ = write!(line, ": waiting for {what}");
        if !wait.blocked_by.is_empty() {
            let pids: Vec<String> = wait.blocked_by.iter().map(i32::to_string).collect();
            let _ = write!(line, " held by pid {}", pids.join(", "));
        }
    }
    if !a.holds.is_empty() {
        let _ = write!(line, "; holds {}", a.holds.join(", "));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{IndexBuild, LockWait, MigrationInfo};
    use std::time::Duration;

    fn v5() -> MigrationInfo {
        MigrationInfo {
            version: 5,
            name: "compact_records".into(),
            applied_on: None,
        }
    }

    #[test]
    fn an_index_build_shows_its_phase_and_blocks() {
        let text = describe(
            &MigrationActivity {
                migration: Some(v5()),
                step: (1, 3),
                running_for: Duration::from_millis(12_300),
                index_build: Some(IndexBuild {
                    index: Some("tombstoned.idempotency_records_due_idx".into()),
                    table: Some("tombstoned.idempotency_records".into()),
                    phase: "building index: scanning table".into(),
                    blocks: (5678, 1234),
                    tuples: (0, 0),
                }),
                holds: vec!["ShareLock on tombstoned.idempotency_records".into()],
                waits: None,
            },
            Duration::from_secs(20),
        );
        assert_eq!(
            text,
            "V5__compact_records (1 of 3), 12.3 s: building index: scanning table of index \
             tombstoned.idempotency_records_due_idx on tombstoned.idempotency_records, 1234 of \
             5678 blocks; holds ShareLock on tombstoned.idempotency_records"
        );
    }

    #[test]
    fn a_wait_shows_the_lock_and_who_holds_it() {
        let waiting = |what: &str| {
            describe(
                &MigrationActivity {
                    migration: Some(v5()),
                    step: (1, 1),
                    running_for: Duration::from_secs(2),
                    index_build: None,
                    holds: vec![],
                    waits: Some(LockWait {
                        what: what.into(),
                        mode: "AccessExclusiveLock".into(),
                        blocked_by: vec![42],
                    }),
                },
                Duration::from_secs(2),
            )
        };
        assert_eq!(
            waiting("tombstoned.idempotency_records"),
            "V5__compact_records (1 of 1), 2.0 s: waiting for AccessExclusiveLock on \
             tombstoned.idempotency_records held by pid 42"
        );
        assert!(waiting("advisory").ends_with(
            "waiting for another migrate of this schema (advisory lock) held by pid 42"
        ));
    }
}

//! A database as an earlier release left it: the schema migrated up to a given version, with
//! the same embedded files and history table `tombstoned migrate` uses, for the upgrade tests.

use tokio_postgres::Client;
use tombstoned::db::migrations;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Applies the migrations up to and including `version` to the schema `tombstoned` of
/// `client`'s database (created if missing; the harness's sessions' `search_path` names it), as
/// the release that ended at `version` would have; returns the versions applied now.
pub async fn migrate_to(client: &mut Client, version: i32) -> Vec<i32> {
    client
        .batch_execute("CREATE SCHEMA IF NOT EXISTS tombstoned")
        .await
        .unwrap();
    let mut runner = embedded::migrations::runner().set_target(refinery::Target::Version(version));
    runner.set_migration_table_name(migrations::HISTORY_TABLE);
    let report = runner.run_async(client).await.unwrap();
    report
        .applied_migrations()
        .iter()
        .map(|m| m.version())
        .collect()
}

/// The versions of the migrations this binary embeds that come after `version`, in order: what
/// `tombstoned migrate` applies to a schema left at `version`.
pub fn versions_after(version: i32) -> Vec<i32> {
    let mut versions: Vec<i32> = embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .filter(|v| *v > version)
        .collect();
    versions.sort_unstable();
    versions
}

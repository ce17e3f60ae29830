//! A database as an earlier release left it: the schema migrated up to a given version, by the
//! same migrations and history table `tombstoned migrate` uses, for the upgrade tests.

use crate::harness::TestDb;

/// Applies the migrations up to and including `version` to `db`'s schema (created if missing),
/// as the release that ended at `version` would have; returns the versions applied now.
pub async fn migrate_to(db: &TestDb, version: i32) -> Vec<i32> {
    tombstoned::schema::migrate_to(&db.config().database, version)
        .await
        .unwrap()
        .iter()
        .map(|m| m.version)
        .collect()
}

/// The versions of the migrations after `version`, in order: what `tombstoned migrate` applies
/// to a schema that release left (no count of migrations is written into a test).
pub fn versions_after(version: i32) -> Vec<i32> {
    tombstoned::schema::migrations::known()
        .iter()
        .map(|m| m.version)
        .filter(|v| *v > version)
        .collect()
}

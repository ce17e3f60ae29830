//! The cleanup engine: batched, key-ordered tombstoning of expired idempotency records.

use crate::cli::{CleanupArgs, Exit};
use crate::config::Config;

/// `tombstoned cleanup`: one run (or a dry run), then a report.
pub async fn command(_config: &Config, _args: &CleanupArgs) -> anyhow::Result<Exit> {
    anyhow::bail!("cleanup is not built yet")
}

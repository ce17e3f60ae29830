//! `tombstoned serve`: start-up checks, the long-running tasks, signals and shutdown.

use std::path::PathBuf;

use anyhow::Context as _;

use crate::cli::Exit;
use crate::config::Config;
use crate::db::{self, migrations};

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn serve(config: Config, _config_path: Option<PathBuf>) -> anyhow::Result<Exit> {
    let session = db::connect(&config.database, "serve").await?;
    let status = migrations::status(&session.client, &config.database.schema).await?;
    if let Some(problem) = status.problem() {
        return Err(migrations::SchemaNotCurrent(problem).into());
    }
    drop(session);
    tracing::info!(database = %config.database.url, "tombstoned started");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("tombstoned stopped");
    Ok(Exit::Success)
}

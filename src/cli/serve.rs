//! `tombstoned serve`: the daemon ([`crate::daemon`]) until SIGTERM or SIGINT.

use std::path::PathBuf;

use crate::config::Config;
use crate::exit::Exit;

/// Runs the daemon; `config_path` is re-read on SIGHUP.
pub(super) async fn run(config: Config, config_path: Option<PathBuf>) -> anyhow::Result<Exit> {
    crate::daemon::serve(config, config_path).await?;
    Ok(Exit::Success)
}

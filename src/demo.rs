//! `tombstoned demo`: a throwaway cluster, the daemon, and a scripted client telling the story.

use crate::cli::{DemoArgs, Exit};

/// Runs the demo.
pub async fn run(_args: DemoArgs) -> anyhow::Result<Exit> {
    anyhow::bail!("the demo is not built yet")
}

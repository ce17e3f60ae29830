//! `tombstoned demo [--keep] [--replay-window DURATION]`: the scripted walk through the protocol ([`crate::demo`]).

use super::DemoArgs;
use crate::demo::{DemoOptions, Finished};
use crate::exit::Exit;

/// Runs the demo: 0 when the story ran through, 130 when a signal interrupted it.
pub(super) async fn run(args: DemoArgs) -> anyhow::Result<Exit> {
    let options = DemoOptions {
        keep: args.keep,
        replay_window: args.replay_window,
    };
    Ok(match crate::demo::run(options).await? {
        Finished::Completed => Exit::Success,
        Finished::Interrupted => Exit::Interrupted,
    })
}

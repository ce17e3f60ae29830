//! `tombstoned demo [--keep] [--replay-window DURATION]`: the scripted walk through the protocol ([`crate::demo`]).

use super::DemoArgs;
use crate::demo::{DemoOptions, Finished};
use crate::exit::Exit;
use crate::stdout;

/// Runs the demo, its story on standard output: 0 when the story ran through, and 0 when a
/// signal stopped it and everything was torn down (its last line says which). Only a second
/// signal, which cuts the teardown short, ends it with 130 ([`crate::signals`]).
pub(super) async fn run(args: DemoArgs) -> anyhow::Result<Exit> {
    let options = DemoOptions {
        keep: args.keep,
        replay_window: args.replay_window,
    };
    let print = |text: &str| Ok(stdout::print(text)?);
    Ok(match crate::demo::run(options, print).await? {
        // A clean teardown, like `serve` after SIGTERM: nothing is left behind.
        Finished::Completed | Finished::Interrupted => Exit::Success,
    })
}

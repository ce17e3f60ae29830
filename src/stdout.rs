//! Standard output of the commands that print (`check-config`, `migrate`, `cleanup`, `demo`).
//!
//! `println!` panics when stdout is gone (`tombstoned check-config | head -1`). Here a failed
//! write is an error of its own type, so the edge can tell a reader that went away — the command
//! then ends quietly with status 0, as ripgrep does — from a broken pipe to the database.

use std::io::{self, Write as _};

/// Writing to standard output failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output")]
pub struct StdoutError(#[source] pub io::Error);

impl StdoutError {
    /// True when the reader closed its end (EPIPE): nobody wants the rest.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` to standard output and flushes it.
pub fn print(text: &str) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

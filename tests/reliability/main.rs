//! Reliability and security of the real daemon under load, faults and bad input (issue 7; what
//! each test proves is listed in RELIABILITY.md).
//!
//! A test binary of its own: the stress test saturates the machine's cores with the real
//! `tombstoned serve` process for a minute, and the fault tests stop, restart and kill servers.
//! Cargo runs test binaries one after another, so none of this distorts the timing-sensitive
//! tests of `tests/it` (lock-timeout margins), nor they it. The fault tests that stop or restart
//! PostgreSQL start a cluster of their own ([`daemon::OwnCluster`]).

mod daemon;
mod failover;
mod faults;
mod hostile;
mod ledger;
mod load;
mod security;
mod stress;

/// The shared harness (`tombstoned_testkit::harness`), plus the binary only this package's tests
/// can name.
mod harness {
    pub use tombstoned_testkit::harness::*;

    /// The `tombstoned` binary built for these tests.
    pub fn binary() -> &'static str {
        env!("CARGO_BIN_EXE_tombstoned")
    }
}

/// Row factories, checksums and barriers of the cleanup tests.
mod cleanup_support {
    pub use tombstoned_testkit::cleanup_support::*;
}

/// Writes a figures file under `target/tmp/reliability/` (CI prints them) and to stdout.
pub fn publish_figures(name: &str, text: &str) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("reliability");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.txt")), text).unwrap();
    println!("{text}");
}

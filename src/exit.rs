//! The binary's exit statuses, after sysexits.h: the one list. [`Exit::ALL`] and
//! [`Exit::meaning`] are what both the man page's EXIT STATUS section and the README's exit status
//! table are generated from (`src/cli/generate.rs`, `tombstoned generate man|readme`); a test
//! keeps both current. Pure: nothing of the crate is imported here.

use std::process::ExitCode;

/// Exit statuses, after sysexits.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0
    Success = 0,
    /// 1: `conformance` found a check failed.
    ChecksFailed = 1,
    /// 2: `status --max-age` found cleanup stale (the last success too old, or none).
    Stale = 2,
    /// 3: `keys explain` found no record of the key in its scope (the key is free).
    NoRecord = 3,
    /// 64: bad usage or configuration.
    Usage = 64,
    /// 69: the database (or the PostgreSQL installation the demo needs) is unavailable, or not one
    /// this binary works on.
    Unavailable = 69,
    /// 70: anything else.
    Software = 70,
    /// 75: try again later (`cleanup` while another instance holds the cleanup lease; `outbox
    /// deliver` with an event it attempted left undelivered).
    TempFail = 75,
    /// 130: a second signal ended a graceful stop at once (or a signal a cleanup run that had
    /// not begun).
    Interrupted = 130,
}

impl Exit {
    /// Every status, in ascending order.
    pub const ALL: [Exit; 9] = [
        Exit::Success,
        Exit::ChecksFailed,
        Exit::Stale,
        Exit::NoRecord,
        Exit::Usage,
        Exit::Unavailable,
        Exit::Software,
        Exit::TempFail,
        Exit::Interrupted,
    ];

    /// What the status tells an operator: every case that ends with it. Markdown's code spans
    /// (backticks) only: the README shows them, the man page drops them.
    pub fn meaning(self) -> &'static str {
        // An exhaustive match: a new status cannot be added without its text.
        match self {
            Exit::Success => {
                "Success (`cleanup` stopped by `--max-batches` or a signal included; `demo` \
                 stopped by a signal once, everything torn down); also when the reader of \
                 standard output went away (`tombstoned check-config | head -1`): the command \
                 ends quietly."
            }
            Exit::ChecksFailed => {
                "`conformance`: at least one check failed; its `FAIL` line (with `--json`, its \
                 check's `result`, `fail`) says what the rule expected and what the service \
                 answered."
            }
            Exit::Stale => {
                "`status --max-age`: the last successful cleanup run finished longer ago than \
                 that, or no successful run is recorded (like a Nagios CRITICAL)."
            }
            Exit::NoRecord => {
                "`keys explain`: the key has no record in that scope, neither committed nor held \
                 by an open transaction: it is free, and a request with it now claims it (0: a \
                 record exists, in whatever state)."
            }
            Exit::Usage => {
                "Bad usage or configuration (EX_USAGE): an unknown flag or key, an invalid value, \
                 an unusable tokens file, a listen address that cannot be bound, an unusable \
                 webhook secret or CA file, `cleanup.max_replica_lag` for a role without \
                 `pg_monitor`; `outbox requeue` named an event that is not a dead letter; \
                 `operations` named a role that does not exist, `create-order` without `--force` \
                 or `*` to grant, or ran as a role that may not change the grants; `demo \
                 --config`; `conformance` given a body that is not JSON, a header that is not \
                 `Name: value`, a URL or duration it cannot use; `keys explain` given an \
                 `--intent` that is not JSON, or run as a role that may not read the records. \
                 Restarting cannot fix it: the systemd unit does not retry it."
            }
            Exit::Unavailable => {
                "The database is unavailable, its schema is not current, or its server is not \
                 PostgreSQL 15 or newer (an older PostgreSQL, CockroachDB, YugabyteDB) \
                 (EX_UNAVAILABLE): `serve` refuses to start, `migrate` to migrate, and `status`, \
                 `cleanup`, `keys explain`, `operations` and every `outbox` command refuse to run; \
                 run `tombstoned migrate`, or wait for the database. Also the demo \
                 without PostgreSQL server binaries, and `conformance` when its URL cannot be \
                 reached at all (no connection)."
            }
            Exit::Software => "Internal error (EX_SOFTWARE).",
            Exit::TempFail => {
                "Temporary refusal (EX_TEMPFAIL): `cleanup` found another instance holding the \
                 cleanup lease, so nothing was done and that is not a failure (with `--json`, \
                 `\"outcome\": \"skipped_lease\"` on stdout); `outbox deliver` left some event it \
                 attempted undelivered (retry scheduled, dead-lettered, or cut off by a signal)."
            }
            Exit::Interrupted => {
                "A second SIGINT or SIGTERM arrived during a graceful stop (the demo's \
                 teardown included: what was not yet removed is left), or (`cleanup`) one \
                 arrived before the run took its lease: exit at once, open transactions roll \
                 back in the database."
            }
        }
    }

    /// The status as `std::process::exit` takes it.
    pub fn code(self) -> i32 {
        self as i32
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_status_once_in_ascending_order() {
        let codes: Vec<i32> = Exit::ALL.iter().map(|e| e.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 64, 69, 70, 75, 130]);
        for exit in Exit::ALL {
            assert!(exit.meaning().ends_with('.'), "{exit:?}");
        }
    }

    #[test]
    fn every_status_is_in_the_readme_and_the_man_page() {
        let readme = include_str!("../README.md");
        let man = include_str!("../dist/man/tombstoned.8");
        for code in Exit::ALL.map(Exit::code) {
            assert!(
                readme.contains(&format!("\n| {code} | ")),
                "{code} missing from the README's exit status table"
            );
            assert!(
                man.contains(&format!(".TP\n\\fB{code}\\fR\n")),
                "{code} missing from tombstoned(8)"
            );
        }
    }
}

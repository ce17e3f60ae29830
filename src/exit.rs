//! The binary's exit statuses, after sysexits.h: the one list. [`Exit::ALL`] and
//! [`Exit::meaning`] are what the man page's EXIT STATUS section is generated from
//! (`src/cli/generate.rs`); the README's table says the same at more length. Pure: nothing of
//! the crate is imported here.
//!
//! | status | meaning |
//! |---|---|
//! | 0  | success (also: the reader of standard output went away) |
//! | 2  | `status --max-age`: the last successful cleanup run is older than that, or none is recorded (like Nagios CRITICAL) |
//! | 64 | bad usage or configuration (EX_USAGE) |
//! | 69 | database unavailable, or its schema not current (EX_UNAVAILABLE) |
//! | 70 | internal error (EX_SOFTWARE) |
//! | 75 | temporary refusal: `cleanup` found another instance holding the cleanup lease; `outbox deliver` left an attempted event undelivered (EX_TEMPFAIL) |
//! | 130 | a second SIGINT/SIGTERM during a graceful stop (cleanup: any signal before the run took its lease): exit at once, open transactions roll back |

use std::process::ExitCode;

/// Exit statuses, after sysexits.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0
    Success = 0,
    /// 2: `status --max-age` found cleanup stale (the last success too old, or none).
    Stale = 2,
    /// 64: bad usage or configuration.
    Usage = 64,
    /// 69: the database (or the PostgreSQL installation the demo needs) is unavailable.
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
    pub const ALL: [Exit; 7] = [
        Exit::Success,
        Exit::Stale,
        Exit::Usage,
        Exit::Unavailable,
        Exit::Software,
        Exit::TempFail,
        Exit::Interrupted,
    ];

    /// What the status tells an operator, one or two sentences (the man page's EXIT STATUS).
    pub fn meaning(self) -> &'static str {
        // An exhaustive match: a new status cannot be added without its text.
        match self {
            Exit::Success => "Success.",
            Exit::Stale => {
                "status --max-age: the last successful cleanup run finished longer ago than that, \
                 or none is recorded (like a Nagios CRITICAL)."
            }
            Exit::Usage => {
                "Bad usage or configuration (EX_USAGE): an unknown flag or key, an invalid value, \
                 an unusable tokens file, a listener that cannot bind, cleanup.max_replica_lag \
                 for a role that cannot see the lag (no pg_monitor). Restarting cannot fix it."
            }
            Exit::Unavailable => {
                "The database is unavailable, or its schema is not current (EX_UNAVAILABLE): run \
                 tombstoned migrate, or wait for the database."
            }
            Exit::Software => "Internal error (EX_SOFTWARE).",
            Exit::TempFail => {
                "Temporary refusal (EX_TEMPFAIL): cleanup found another instance holding the \
                 cleanup lease, so nothing was done and that is not a failure; outbox deliver \
                 left some event it attempted undelivered (retry scheduled, dead-lettered, or \
                 cut off by a signal)."
            }
            Exit::Interrupted => {
                "A second SIGINT or SIGTERM arrived during a graceful stop, or (cleanup) one \
                 arrived before the run took its lease: exit at once, open transactions roll \
                 back."
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
        assert_eq!(codes, [0, 2, 64, 69, 70, 75, 130]);
        for exit in Exit::ALL {
            assert!(exit.meaning().ends_with('.'), "{exit:?}");
        }
    }

    #[test]
    fn every_status_is_in_the_module_table_the_readme_and_the_man_page() {
        let module = include_str!("exit.rs");
        let readme = include_str!("../README.md");
        let man = include_str!("../dist/man/tombstoned.8");
        for code in Exit::ALL.map(Exit::code) {
            let padded = format!("//! | {code:<2} |");
            assert!(
                module.contains(&padded),
                "{code} missing from the module table"
            );
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

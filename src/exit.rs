//! The binary's exit statuses, after sysexits.h: the one list (the README's table says the
//! same). Pure: nothing of the crate is imported here.
//!
//! | status | meaning |
//! |---|---|
//! | 0  | success (also: the reader of standard output went away) |
//! | 2  | `status --max-age`: the last successful cleanup run is older than that, or none is recorded (like Nagios CRITICAL) |
//! | 64 | bad usage or configuration (EX_USAGE) |
//! | 69 | database unavailable, or its schema not current (EX_UNAVAILABLE) |
//! | 70 | internal error (EX_SOFTWARE) |
//! | 75 | temporary refusal: `cleanup` found another instance holding the cleanup lease (EX_TEMPFAIL) |
//! | 130 | a second SIGINT/SIGTERM during a graceful stop: exit at once, open transactions roll back |

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
    /// 75: try again later (`cleanup` while another instance holds the cleanup lease).
    TempFail = 75,
    /// 130: a second signal ended a graceful stop at once.
    Interrupted = 130,
}

impl Exit {
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

    /// Every status, by an exhaustive match: a new variant fails to compile here until listed.
    fn every_status() -> Vec<Exit> {
        let all = vec![
            Exit::Success,
            Exit::Stale,
            Exit::Usage,
            Exit::Unavailable,
            Exit::Software,
            Exit::TempFail,
            Exit::Interrupted,
        ];
        for e in &all {
            match e {
                Exit::Success
                | Exit::Stale
                | Exit::Usage
                | Exit::Unavailable
                | Exit::Software
                | Exit::TempFail
                | Exit::Interrupted => {}
            }
        }
        all
    }

    #[test]
    fn every_status_is_in_the_module_table_the_readme_and_the_man_page() {
        let module = include_str!("exit.rs");
        let readme = include_str!("../README.md");
        let man = include_str!("../dist/man/tombstoned.8");
        let mut codes: Vec<i32> = every_status().into_iter().map(Exit::code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(
            codes.len(),
            every_status().len(),
            "two statuses share a code"
        );
        for code in codes {
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

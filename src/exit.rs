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

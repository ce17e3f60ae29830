//! What API requests experienced of the database, for readiness: a probe that reads can succeed
//! while every write fails (a full disk answers `SELECT 1` but not an INSERT), so resource
//! exhaustion (SQLSTATE class 53) is judged from the requests that met it.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::db::{DbError, ErrorClass};

/// How long one class-53 failure keeps the service not ready. Long enough that a load balancer
/// polling every few seconds sees it; short enough that readiness returns soon after space is
/// freed, since a drained instance gets no requests to prove it.
pub const EXHAUSTION_HOLD: Duration = Duration::from_secs(15);

/// Shared by the API (which records) and the readiness probe (which reads).
#[derive(Debug, Default)]
pub struct RequestHealth {
    exhausted: Mutex<Option<(Instant, String)>>,
}

impl RequestHealth {
    /// Notes a failed database call; only resource exhaustion is kept.
    pub fn record_failure(&self, error: &DbError) {
        if error.class() != ErrorClass::InsufficientResources {
            return;
        }
        let code = error.sqlstate().unwrap_or("53000").to_owned();
        *self
            .exhausted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((Instant::now(), code));
    }

    /// The SQLSTATE of the last class-53 failure and how long ago it was, when within
    /// [`EXHAUSTION_HOLD`].
    pub fn recently_exhausted(&self) -> Option<(String, Duration)> {
        let last = self
            .exhausted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        last.map(|(at, code)| (code, at.elapsed()))
            .filter(|(_, ago)| *ago < EXHAUSTION_HOLD)
    }
}

//! Client-side bounds on database calls. A server that stops answering while the socket stays
//! open — a lost NAT entry, a partition behind a proxy that still acknowledges, a hung server —
//! leaves a call waiting forever: TCP keepalives and `TCP_USER_TIMEOUT` (set on every socket by
//! [`super::connect`]) notice a peer that is gone, not one that is silent. So every call is
//! awaited under a deadline derived from the settings that bound it on the server side, and a
//! connection whose call timed out is discarded, never reused: it may be mid-statement.

use std::future::Future;
use std::time::Duration;

use super::DbError;

/// What the client waits beyond a server-side bound before it gives up: a statement the server
/// cancels at its `statement_timeout` answers 57014 within a round trip, so this is slack for a
/// loaded machine, not part of the bound's meaning.
pub const SLACK: Duration = Duration::from_secs(2);

/// The client-side deadline of a call the server bounds by `server_bound` (its
/// `statement_timeout`, or the sum of the bounds of the statements it runs).
pub fn beyond(server_bound: Duration) -> Duration {
    server_bound.saturating_add(SLACK)
}

/// Awaits `call` for at most `after`; [`DbError::Timeout`] naming `what` when it did not
/// finish. Dropping the call on expiry sends nothing more on its connection; the caller discards
/// the connection (dropping a dedicated session, or [`super::discard`] for a pooled one).
pub async fn within<F: Future>(
    after: Duration,
    what: &'static str,
    call: F,
) -> Result<F::Output, DbError> {
    tokio::time::timeout(after, call)
        .await
        .map_err(|_| DbError::Timeout { what, after })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_deadline_is_a_typed_unavailable_timeout() {
        let done = within(Duration::from_secs(1), "a test call", async { 7 }).await;
        assert_eq!(done.unwrap(), 7);
        let stuck = within(
            Duration::from_secs(1),
            "a test call",
            std::future::pending::<()>(),
        )
        .await
        .unwrap_err();
        assert_eq!(stuck.class(), crate::db::ErrorClass::Unavailable);
        assert_eq!(stuck.sqlstate_class(), "timeout");
        assert_eq!(
            crate::db::error_text(&stuck),
            "the database did not answer a test call within 1s"
        );
        assert_eq!(beyond(Duration::from_secs(30)), Duration::from_secs(32));
    }
}

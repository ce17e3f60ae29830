//! One text for any error, safe wherever an operator or a client may read it: `/readyz`, the
//! systemd STATUS line, the scheduler's status, logs and the CLI's error line.
//!
//! The error and its causes on one line, joined by `": "`. A server error contributes its
//! severity, SQLSTATE and message only, and ends the chain: its DETAIL, HINT and CONTEXT can quote
//! row values (keys, tenants, request fields), which must not leave the process. Passwords never
//! appear: a connection failure names the server by its redacted URL, and the driver's own texts
//! carry none.
//!
//! A prepared-statement error that only a transaction-mode pooler causes (SQLSTATE 26000 or
//! 42P05, [`super::pooler::is_misuse_symptom`]) gets [`super::pooler::MISUSE_HINT`] appended,
//! which names `database.pooler`: every log line, status and CLI error built from this text says
//! what to change.

use std::error::Error;

use tokio_postgres::error::DbError as ServerError;

/// The error and its causes on one line; see the module documentation for what is left out.
pub fn error_text(error: &(dyn Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        if let Some(server) = server_error(cause) {
            parts.push(format!(
                "{} {}: {}",
                server.severity(),
                server.code().code(),
                server.message()
            ));
            if super::pooler::is_misuse_symptom(server.code()) {
                parts.push(super::pooler::MISUSE_HINT.to_owned());
            }
            // Its sources are the same server error again, DETAIL included.
            break;
        }
        let text = cause.to_string();
        // Wrappers that print their source's text too ("error connecting to server: <io
        // error>") would repeat it.
        if !parts.last().is_some_and(|last| last.ends_with(&text)) {
            parts.push(text);
        }
        next = cause.source();
    }
    parts.join(": ").replace(['\n', '\r'], " ")
}

/// The server's error report, when `error` is one (bare or inside the driver's error).
fn server_error<'e>(error: &'e (dyn Error + 'static)) -> Option<&'e ServerError> {
    error
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error)
        .or_else(|| error.downcast_ref::<ServerError>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("repeats: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn causes_join_on_one_line_without_repeating_a_wrapped_text() {
        let io = || std::io::Error::other("disk\non fire");
        assert_eq!(error_text(&Outer(io())), "outer: disk on fire");
        assert_eq!(error_text(&Repeats(io())), "repeats: disk on fire");
        let wrapped = anyhow::Error::new(Outer(io())).context("loading");
        assert_eq!(error_text(wrapped.as_ref()), "loading: outer: disk on fire");
    }

    // Real server errors (with DETAIL, HINT and CONTEXT) are tested against PostgreSQL in
    // tests/it/error_text.rs.
}

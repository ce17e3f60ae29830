//! The SQL API's version: the protocol as functions any service calls inside its own transaction
//! (`claim`, `complete`, `lookup`, `enqueue_event`, `fingerprint`, `api_version`; docs/api.md,
//! their current source in `schema/functions/api/`). What this binary speaks, which functions
//! make up the API, and reading the version a schema offers.

use tokio_postgres::error::SqlState;

use super::sql;
use crate::db::{Conn, DbError};

/// The version of the SQL API this binary installs and knows: the functions' names, arguments,
/// result columns and SQLSTATEs. A change that would break a caller is a new version, bumped
/// here and in the schema's `api_version()` together.
pub const API_VERSION: i32 = 1;

/// The functions a service calls: the SQL API (docs/api.md). Every other function of the schema
/// is internal — the helpers these call, the endpoint's claim functions, the cleaner's lease
/// check — and nothing but the daemon and the functions themselves should call it. The one
/// place that says which is which: `schema/functions/api/` and `schema/functions/internal/` are
/// rendered from it.
pub const API_FUNCTIONS: &[&str] = &[
    "api_version",
    "claim",
    "complete",
    "enqueue_event",
    "fingerprint",
    "lookup",
];

/// A schema whose API this binary does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the schema's SQL API is version {found}, which this tombstoned does not know (it knows \
     version {API_VERSION}); run the tombstoned that migrated it, or upgrade"
)]
pub struct UnknownApiVersion {
    /// What the schema's `api_version()` returned.
    pub found: i32,
}

/// What `api_version()` returns on `conn`'s schema (which must be migrated); `None` when the
/// role may not call it (42501: a daemon running as another role than `migrate`'s, without
/// `GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA`). Such a daemon does not use the functions, and
/// the version is then implied by the migration history, which the caller has already found to
/// be exactly this binary's: no start-up is refused for the missing grant.
pub async fn schema_version(conn: &Conn<'_>) -> Result<Option<i32>, DbError> {
    match conn.query_one(sql::API_VERSION, &[]).await {
        Ok(row) => row.try_get(0).map(Some).map_err(DbError::Query),
        Err(e) if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) => Ok(None),
        Err(e) => Err(DbError::Query(e)),
    }
}

/// `Ok(())` when this binary knows `version`.
pub fn require_known(version: i32) -> Result<(), UnknownApiVersion> {
    if version == API_VERSION {
        Ok(())
    } else {
        Err(UnknownApiVersion { found: version })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_this_binarys_version_is_known() {
        assert_eq!(require_known(API_VERSION), Ok(()));
        let newer = require_known(API_VERSION + 1).unwrap_err();
        assert_eq!(newer.found, API_VERSION + 1);
        assert!(newer.to_string().contains("version 2"), "{newer}");
    }
}

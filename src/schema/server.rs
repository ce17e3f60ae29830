//! Which database server this binary works on: PostgreSQL 15 or newer, itself. A system that
//! speaks PostgreSQL's wire protocol and reports a PostgreSQL version (CockroachDB, YugabyteDB)
//! does not give the transaction semantics the protocol's guarantees rest on (docs/scale-out.md,
//! "YugabyteDB and CockroachDB: unsupported"), so it is refused like a PostgreSQL that is too old.
//!
//! Each is told by a fact of its catalogue, not by the text of a version string, which both can
//! be configured to report as PostgreSQL's: CockroachDB lists its virtual schema `crdb_internal`
//! in `pg_catalog.pg_namespace` (in every database, to every role); YugabyteDB's YSQL has the
//! built-in function `pg_catalog.yb_servers()` (its cluster's nodes, for its smart drivers). A
//! PostgreSQL has neither unless someone made them by hand. The version is
//! `server_version_num`, a number PostgreSQL has reported since 8.2.

use tokio_postgres::Row;

use super::sql;
use crate::db::{Conn, DbError};

/// The oldest PostgreSQL this binary supports, as `server_version_num` counts (15.0).
pub const MINIMUM_VERSION_NUM: i32 = 150_000;

/// What the server says of itself: its version and the catalogue facts that tell another system
/// from PostgreSQL (one read, [`sql::SERVER_FACTS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFacts {
    /// `server_version_num` (`150018` for 15.18).
    pub version_num: i32,
    /// `server_version` as reported (`15.18 (Debian 15.18-0+deb12u1)`).
    pub version: String,
    /// `pg_catalog.pg_namespace` has `crdb_internal`.
    pub crdb_internal: bool,
    /// `pg_catalog.yb_servers()` exists.
    pub yb_servers: bool,
}

/// A server this binary refuses to work on; the text is the refusal's one line (the caller says
/// who refuses: `refusing to start: …`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsupportedServer {
    /// CockroachDB, whatever version it reports.
    #[error(
        "the server is CockroachDB (its catalogue has crdb_internal; it reports server_version \
         {reports}), not PostgreSQL: the protocol's guarantees rest on PostgreSQL's READ \
         COMMITTED, FOR SHARE and SKIP LOCKED (docs/scale-out.md); use PostgreSQL 15 or newer"
    )]
    CockroachDb {
        /// Its `server_version`.
        reports: String,
    },
    /// YugabyteDB, whatever version it reports.
    #[error(
        "the server is YugabyteDB (its catalogue has yb_servers(); it reports server_version \
         {reports}), not PostgreSQL: the protocol's guarantees rest on PostgreSQL's READ \
         COMMITTED, FOR SHARE and SKIP LOCKED (docs/scale-out.md); use PostgreSQL 15 or newer"
    )]
    YugabyteDb {
        /// Its `server_version`.
        reports: String,
    },
    /// A PostgreSQL older than 15.
    #[error("the server is PostgreSQL {reports}; tombstoned needs PostgreSQL 15 or newer")]
    TooOld {
        /// Its `server_version`.
        reports: String,
    },
    /// No row for a `SELECT` of four values: not a PostgreSQL.
    #[error(
        "the server answered no row when asked its version: not PostgreSQL; tombstoned needs \
         PostgreSQL 15 or newer"
    )]
    NoAnswer,
}

impl ServerFacts {
    /// `Ok` for a PostgreSQL of [`MINIMUM_VERSION_NUM`] or newer. Another system is named
    /// before its version is looked at: it may report any.
    pub fn judge(&self) -> Result<(), UnsupportedServer> {
        let reports = self.version.clone();
        if self.crdb_internal {
            Err(UnsupportedServer::CockroachDb { reports })
        } else if self.yb_servers {
            Err(UnsupportedServer::YugabyteDb { reports })
        } else if self.version_num < MINIMUM_VERSION_NUM {
            Err(UnsupportedServer::TooOld { reports })
        } else {
            Ok(())
        }
    }

    fn from_row(row: &Row) -> Result<Self, tokio_postgres::Error> {
        Ok(ServerFacts {
            version_num: row.try_get(0)?,
            version: row.try_get(1)?,
            crdb_internal: row.try_get(2)?,
            yb_servers: row.try_get(3)?,
        })
    }
}

/// What `conn`'s server says of itself (bounded by `statement_timeout` on the server too, as
/// [`super::check`] reads); `None` when it answers no row. Read-only: the catalogue and two
/// settings.
pub async fn facts(
    conn: &Conn<'_>,
    statement_timeout: Option<&str>,
) -> Result<Option<ServerFacts>, DbError> {
    let rows = super::read(conn, statement_timeout, sql::SERVER_FACTS, &[]).await?;
    match rows.first() {
        Some(row) => Ok(Some(ServerFacts::from_row(row)?)),
        None => Ok(None),
    }
}

/// Why `conn`'s server is not one this binary works on ([`ServerFacts::judge`]); `None` when it
/// is.
pub async fn unsupported(
    conn: &Conn<'_>,
    statement_timeout: Option<&str>,
) -> Result<Option<UnsupportedServer>, DbError> {
    Ok(match facts(conn, statement_timeout).await? {
        Some(facts) => facts.judge().err(),
        None => Some(UnsupportedServer::NoAnswer),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(version_num: i32, crdb_internal: bool, yb_servers: bool) -> ServerFacts {
        ServerFacts {
            version_num,
            version: "x".to_owned(),
            crdb_internal,
            yb_servers,
        }
    }

    #[test]
    fn postgresql_15_and_newer_only() {
        assert_eq!(facts(150_000, false, false).judge(), Ok(()));
        assert_eq!(facts(180_001, false, false).judge(), Ok(()));
        assert!(matches!(
            facts(140_019, false, false).judge(),
            Err(UnsupportedServer::TooOld { .. })
        ));
        // A compatible version string does not make another system PostgreSQL.
        assert!(matches!(
            facts(150_002, false, true).judge(),
            Err(UnsupportedServer::YugabyteDb { .. })
        ));
        assert!(matches!(
            facts(130_000, true, false).judge(),
            Err(UnsupportedServer::CockroachDb { .. })
        ));
    }
}

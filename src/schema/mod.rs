//! The database contract, Rust side: which server and schema this binary needs and whether a
//! database has them. The server ([`server`]: PostgreSQL 15 or newer, not a system that only
//! speaks its protocol), the migrations that build the schema ([`migrations`], the one place that
//! names `migrations/` and refinery), the SQL API's version ([`api`]), and the one [`check`] that
//! `serve`, every command that reads or writes the schema, readiness and `status` call, each with
//! what it [`Needs`] (`migrate` asks the server's part before it writes anything).
//!
//! The schema itself, as it stands after the last migration, is committed under `schema/` at the
//! repository's root (one file per table, view and function, rendered from a migrated catalogue;
//! `schema/README.md`), and `tests/it/schema_contract.rs` holds the migrations to it.

pub mod api;
pub mod migrations;
pub mod server;
pub mod sql;

pub use api::{require_known, schema_version, UnknownApiVersion, API_FUNCTIONS, API_VERSION};
pub use migrations::{
    migrate, migrate_to, migrate_watched, IndexBuild, LockWait, MigrationActivity, MigrationError,
    MigrationInfo, MigrationStatus, HISTORY_TABLE,
};
pub use server::{ServerFacts, UnsupportedServer, MINIMUM_VERSION_NUM};

use crate::db::{self, pipeline, Conn, DbError, Param};

/// What a caller needs of the schema, besides what every caller needs: its migrations exactly
/// this binary's (none pending, none unknown, none edited after release).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// Read the SQL API's version (`status` shows it; `None` when the role may not call it).
    pub api_version: bool,
    /// Refuse an SQL API version this binary does not know (`serve`; implies reading it).
    pub known_api_version: bool,
    /// The session's role may execute the endpoint's claim functions (`serve` with the API on,
    /// through a transaction pooler: its claims call them, `crate::claim::sql::claim_and_create`).
    pub claim_functions: bool,
}

impl Needs {
    /// The migrations alone: every command that reads or writes the schema, and readiness.
    pub const MIGRATIONS: Needs = Needs {
        api_version: false,
        known_api_version: false,
        claim_functions: false,
    };

    /// `tombstoned status`: the migrations, and the API version to show.
    pub const STATUS: Needs = Needs {
        api_version: true,
        ..Needs::MIGRATIONS
    };

    /// `serve`: the migrations, a known API version, and the claim functions when the API's
    /// claims run through them (`api_through_functions`: the API on, behind a transaction
    /// pooler).
    pub fn serve(api_through_functions: bool) -> Needs {
        Needs {
            api_version: true,
            known_api_version: true,
            claim_functions: api_through_functions,
        }
    }
}

/// What [`check`] found on a schema that has what the caller needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Current {
    /// The migration history, compared with this binary's.
    pub migrations: MigrationStatus,
    /// `api_version()`, when asked for and the role may call it.
    pub api_version: Option<i32>,
}

/// The schema is not what this binary needs; `serve` and the commands refuse to work on it
/// (exit 69), readiness reports it. The text is what is wrong; the caller says who refuses
/// (`refusing to start: …`, `refusing to run cleanup: …`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SchemaNotCurrent(pub String);

/// Why [`check`] found no usable schema.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// Asking failed (the connection, a statement).
    #[error(transparent)]
    Db(#[from] DbError),
    /// The server is not one this binary works on (exit 69, as a schema not current).
    #[error(transparent)]
    Unsupported(#[from] UnsupportedServer),
    /// The schema answered, and it is not what the caller needs.
    #[error(transparent)]
    NotCurrent(#[from] SchemaNotCurrent),
}

impl CheckError {
    /// The one sentence saying what is wrong with the schema, when that is the failure.
    pub fn not_current(&self) -> Option<&str> {
        match self {
            CheckError::NotCurrent(SchemaNotCurrent(problem)) => Some(problem),
            CheckError::Db(_) | CheckError::Unsupported(_) => None,
        }
    }
}

/// Whether `conn`'s server and schema are what this binary needs for `needs`: the server first
/// ([`server::unsupported`]), then the migration history (with `statement_timeout`, as
/// [`crate::db::sql::duration_setting`] renders it, each read is bounded on the server too), then
/// what `needs` adds. Read-only.
pub async fn check(
    conn: &Conn<'_>,
    needs: Needs,
    statement_timeout: Option<&str>,
) -> Result<Current, CheckError> {
    if let Some(server) = server::unsupported(conn, statement_timeout).await? {
        return Err(server.into());
    }
    let migrations = migrations::status(conn, statement_timeout).await?;
    if let Some(problem) = migrations.problem() {
        return Err(SchemaNotCurrent(problem).into());
    }
    let api_version = if needs.api_version || needs.known_api_version {
        schema_version(conn).await?
    } else {
        None
    };
    if let (true, Some(version)) = (needs.known_api_version, api_version) {
        require_known(version).map_err(|unknown| SchemaNotCurrent(unknown.to_string()))?;
    }
    if needs.claim_functions {
        if let Some(role) = role_without_claim_functions(conn).await? {
            return Err(SchemaNotCurrent(format!(
                "database.pooler = \"transaction\" runs claims through the functions \
                 {schema}.endpoint_claim_order and {schema}.endpoint_claim_rejected (schema V6), \
                 which role {role} may not execute: grant it EXECUTE on both (README, \
                 \"Installing without the package\")",
                schema = conn.schema()
            ))
            .into());
        }
    }
    Ok(Current {
        migrations,
        api_version,
    })
}

/// The rows of `template` on `conn`, in a transaction of its own with `statement_timeout` when
/// one is given (the server cancels the read past it), else as a statement alone.
async fn read(
    conn: &Conn<'_>,
    statement_timeout: Option<&str>,
    template: &'static str,
    params: &[&dyn Param],
) -> Result<Vec<tokio_postgres::Row>, DbError> {
    match statement_timeout {
        None => conn.query(template, params).await.map_err(DbError::Query),
        Some(timeout) => pipeline::query(
            conn,
            db::sql::SET_LOCAL_STATEMENT_TIMEOUT,
            &[&timeout],
            template,
            params,
        )
        .await
        .map_err(|failure| DbError::Query(failure.error)),
    }
}

/// The role of `conn`'s session when it may not execute the endpoint's claim functions (a daemon
/// running as another role than `migrate`'s, without the grant the migration gives roles that
/// hold the tables' privileges), `None` when it may.
async fn role_without_claim_functions(conn: &Conn<'_>) -> Result<Option<String>, DbError> {
    let row = conn
        .query_one(sql::MAY_EXECUTE_CLAIM_FUNCTIONS, &[])
        .await
        .map_err(DbError::Query)?;
    let role: String = row.try_get(0).map_err(DbError::Query)?;
    let may: bool = row.try_get(1).map_err(DbError::Query)?;
    Ok((!may).then_some(role))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_needs_more_than_a_command() {
        assert_eq!(Needs::default(), Needs::MIGRATIONS);
        assert_eq!(
            Needs::STATUS,
            Needs {
                api_version: true,
                ..Needs::MIGRATIONS
            }
        );
        assert!(!Needs::serve(false).claim_functions);
        assert!(Needs::serve(true).claim_functions && Needs::serve(true).known_api_version);
    }
}

//! Operations belong to roles (issue 36; docs/api.md, "Service boundaries"): which database role
//! may claim, complete and look up keys in which operation of the SQL API — granting, revoking,
//! listing with the audit of every change, and the transitional grants an upgrade to schema V8
//! gave. The database enforces the grants (`require_scope`, `enqueue_event`; migration V8); this
//! module changes and reads `operation_grants`, on a session of the role that owns it. Never
//! prints: `tombstoned operations`, `status` and `check-config` render what it returns.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use crate::claim::OPERATION_CREATE_ORDER;
use crate::db::{Conn, DbError};

/// How the commands name the transitional grant: every operation but `create-order`.
pub const EVERY_OPERATION: &str = "*";

/// The statements, by name.
mod sql {
    /// Grants operation `$1` to the role named `$2` (`$3`: forced). Returns whether the role
    /// exists and whether a grant was added (false: it held it already). The audit row is the
    /// table's trigger's.
    pub(super) const GRANT: &str = "\
WITH role AS (SELECT oid FROM pg_roles WHERE rolname = $2),
added AS (
    INSERT INTO {schema}.operation_grants (operation, grantee, forced)
    SELECT $1, role.oid::regrole, $3 FROM role
    ON CONFLICT (operation, grantee) DO NOTHING
    RETURNING 1)
SELECT EXISTS (SELECT FROM role), EXISTS (SELECT FROM added)";

    /// Revokes operation `$1` (NULL: the transitional grant) from the role named `$2` (or, for a
    /// role dropped since, its OID as `list` shows it). Returns whether such a role exists and
    /// whether a grant was removed.
    pub(super) const REVOKE: &str = "\
WITH role AS (SELECT oid FROM pg_roles WHERE rolname = $2),
removed AS (
    DELETE FROM {schema}.operation_grants AS g
    WHERE g.operation IS NOT DISTINCT FROM $1
      AND (g.grantee = (SELECT oid FROM role) OR g.grantee::oid::text = $2)
    RETURNING 1)
SELECT EXISTS (SELECT FROM role), EXISTS (SELECT FROM removed)";

    /// Every grant, by operation (the transitional ones last) and role.
    pub(super) const GRANTS: &str = "\
SELECT g.operation, coalesce(r.rolname::text, g.grantee::oid::text) AS role,
       r.oid IS NOT NULL AS role_exists, g.granted_at, g.granted_by, g.forced, g.note
FROM {schema}.operation_grants AS g
LEFT JOIN pg_roles AS r ON r.oid = g.grantee
ORDER BY g.operation NULLS LAST, 2";

    /// Every change, oldest first.
    pub(super) const CHANGES: &str = "\
SELECT change_id, changed_at, changed_by, action, operation, grantee, forced, note
FROM {schema}.operation_grant_changes
ORDER BY change_id";

    /// Whether the grants table exists in schema `$1` (NULL: not installed) and this role may
    /// read it.
    pub(super) const GRANTS_VISIBLE: &str = "\
SELECT CASE WHEN to_regclass(format('%I.operation_grants', $1::text)) IS NULL THEN NULL
            ELSE has_table_privilege(format('%I.operation_grants', $1::text), 'SELECT') END";

    /// The roles holding a transitional grant, by name.
    pub(super) const TRANSITIONAL: &str = "\
SELECT coalesce(r.rolname::text, g.grantee::oid::text)
FROM {schema}.operation_grants AS g
LEFT JOIN pg_roles AS r ON r.oid = g.grantee
WHERE g.operation IS NULL
ORDER BY 1";
}

/// What a grant or revoke names: one operation, or the transitional grant of all but one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// An operation by name (a scope's third part).
    Named(String),
    /// The transitional grant (`*`): every operation but `create-order`.
    EveryButCreateOrder,
}

impl Operation {
    /// `*` is the transitional grant; anything else names an operation (non-empty).
    pub fn parse(text: &str) -> Result<Operation, OperationsError> {
        match text {
            "" => Err(OperationsError::EmptyOperation),
            EVERY_OPERATION => Ok(Operation::EveryButCreateOrder),
            name => Ok(Operation::Named(name.to_owned())),
        }
    }

    /// The column's value: NULL for the transitional grant.
    fn column(&self) -> Option<&str> {
        match self {
            Operation::Named(name) => Some(name),
            Operation::EveryButCreateOrder => None,
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Operation::Named(name) => write!(f, "operation \"{name}\""),
            Operation::EveryButCreateOrder => write!(
                f,
                "the transitional grant ({EVERY_OPERATION}: every operation but \
                 {OPERATION_CREATE_ORDER})"
            ),
        }
    }
}

/// Why a grant or revoke was refused, or could not be made.
#[derive(Debug, thiserror::Error)]
pub enum OperationsError {
    /// No role of that name.
    #[error("role \"{0}\" does not exist")]
    NoSuchRole(String),
    /// `create-order` without `--force`.
    #[error(
        "{OPERATION_CREATE_ORDER} is the operation of tombstoned's own endpoint (POST /v1/orders), \
         reserved to the daemon's role: a role granted it can claim keys in the endpoint's \
         scopes, so it could take an order's key with another intent (the customer's own retry \
         then answers 422) and read the stored answers of the keys it knows. Grant it only to \
         a role a tombstoned daemon runs as, with --force"
    )]
    Reserved,
    /// `grant '*'`: only the V8 upgrade gives it.
    #[error(
        "\"{EVERY_OPERATION}\" names the transitional grant of every operation but \
         {OPERATION_CREATE_ORDER}, which only the upgrade to schema V8 gives: grant operations by \
         name"
    )]
    GrantEveryOperation,
    /// An empty operation name.
    #[error("an operation is a non-empty name, e.g. create-payment")]
    EmptyOperation,
    /// The session's role may not change (or read) the grants: SQLSTATE 42501, its text.
    #[error(
        "this configuration's role may not change the operation grants ({0}): run `tombstoned \
         operations` with the configuration of the role that ran `tombstoned migrate` (the \
         owner of the schema's tables)"
    )]
    NotAllowed(String),
    /// Any other database failure.
    #[error("cannot {what}")]
    Database {
        /// What was being done.
        what: &'static str,
        /// The failure.
        #[source]
        source: DbError,
    },
}

impl OperationsError {
    /// The operator's to fix (exit 64), not the database's.
    pub fn is_usage(&self) -> bool {
        !matches!(self, OperationsError::Database { .. })
    }

    /// [`OperationsError::NotAllowed`] for SQLSTATE 42501 (the role may not read or change the
    /// grants), else the failure as it is.
    pub fn refused(error: &tokio_postgres::Error) -> Option<OperationsError> {
        (error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE))
            .then(|| OperationsError::NotAllowed(crate::db::error_text(error)))
    }

    fn from_query(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> OperationsError {
        move |e| {
            OperationsError::refused(&e).unwrap_or(OperationsError::Database {
                what,
                source: DbError::Query(e),
            })
        }
    }
}

/// What a grant did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantOutcome {
    /// Granted now (and recorded).
    Granted,
    /// The role held it already: nothing changed.
    AlreadyHeld,
}

/// What a revoke did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevokeOutcome {
    /// Revoked now (and recorded).
    Revoked,
    /// The role did not hold it: nothing changed.
    NotHeld,
}

/// Grants `operation` to `role` on `conn` (a session of the schema's owner). `create-order`
/// needs `force`; the transitional grant cannot be granted.
pub async fn grant(
    conn: &Conn<'_>,
    operation: &Operation,
    role: &str,
    force: bool,
) -> Result<GrantOutcome, OperationsError> {
    let Operation::Named(name) = operation else {
        return Err(OperationsError::GrantEveryOperation);
    };
    let reserved = name == OPERATION_CREATE_ORDER;
    if reserved && !force {
        return Err(OperationsError::Reserved);
    }
    let row = conn
        .query_one(sql::GRANT, &[&name.as_str(), &role, &reserved])
        .await
        .map_err(OperationsError::from_query("grant the operation"))?;
    let (exists, added) = pair(&row).map_err(OperationsError::from_query("grant the operation"))?;
    match (exists, added) {
        (false, _) => Err(OperationsError::NoSuchRole(role.to_owned())),
        (true, true) => Ok(GrantOutcome::Granted),
        (true, false) => Ok(GrantOutcome::AlreadyHeld),
    }
}

/// Revokes `operation` from `role` on `conn` (a session of the schema's owner).
pub async fn revoke(
    conn: &Conn<'_>,
    operation: &Operation,
    role: &str,
) -> Result<RevokeOutcome, OperationsError> {
    let row = conn
        .query_one(sql::REVOKE, &[&operation.column(), &role])
        .await
        .map_err(OperationsError::from_query("revoke the operation"))?;
    let (exists, removed) =
        pair(&row).map_err(OperationsError::from_query("revoke the operation"))?;
    match (exists, removed) {
        (_, true) => Ok(RevokeOutcome::Revoked),
        (true, false) => Ok(RevokeOutcome::NotHeld),
        (false, false) => Err(OperationsError::NoSuchRole(role.to_owned())),
    }
}

fn pair(row: &Row) -> Result<(bool, bool), tokio_postgres::Error> {
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// The operation column as the commands show it: `*` for the transitional grant.
fn shown(operation: Option<String>) -> String {
    operation.unwrap_or_else(|| EVERY_OPERATION.to_owned())
}

/// One grant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grant {
    /// The operation; `*` for the transitional grant.
    pub operation: String,
    /// Whether this is the transitional grant (every operation but `create-order`).
    pub transitional: bool,
    /// The role (its OID when it was dropped since).
    pub role: String,
    /// False when the role was dropped since (nobody is a member of it).
    pub role_exists: bool,
    /// When it was granted.
    pub granted_at: DateTime<Utc>,
    /// The login role that granted it.
    pub granted_by: String,
    /// `create-order` granted with `--force`.
    pub forced: bool,
    /// Why (the migration's grants).
    pub note: Option<String>,
}

/// One change of the grants, as the audit recorded it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// Its place in the history.
    pub change_id: i64,
    /// When.
    pub changed_at: DateTime<Utc>,
    /// The login role that made it.
    pub changed_by: String,
    /// `grant` or `revoke`.
    pub action: String,
    /// The operation; `*` for the transitional grant.
    pub operation: String,
    /// The role's name at the time.
    pub role: String,
    /// `create-order` granted with `--force`.
    pub forced: bool,
    /// Why (the migration's grants).
    pub note: Option<String>,
}

/// The grants and their history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listing {
    /// Every grant in force.
    pub grants: Vec<Grant>,
    /// Every change, oldest first.
    pub changes: Vec<Change>,
}

/// Every grant and every change, on `conn`.
pub async fn list(conn: &Conn<'_>) -> Result<Listing, OperationsError> {
    let read = OperationsError::from_query;
    let mut grants = Vec::new();
    for row in conn
        .query(sql::GRANTS, &[])
        .await
        .map_err(read("read the grants"))?
    {
        let grant = || -> Result<Grant, tokio_postgres::Error> {
            let operation: Option<String> = row.try_get("operation")?;
            Ok(Grant {
                transitional: operation.is_none(),
                operation: shown(operation),
                role: row.try_get("role")?,
                role_exists: row.try_get("role_exists")?,
                granted_at: row.try_get("granted_at")?,
                granted_by: row.try_get("granted_by")?,
                forced: row.try_get("forced")?,
                note: row.try_get("note")?,
            })
        };
        grants.push(grant().map_err(read("read the grants"))?);
    }
    let mut changes = Vec::new();
    for row in conn
        .query(sql::CHANGES, &[])
        .await
        .map_err(read("read the history of the grants"))?
    {
        let change = || -> Result<Change, tokio_postgres::Error> {
            Ok(Change {
                change_id: row.try_get("change_id")?,
                changed_at: row.try_get("changed_at")?,
                changed_by: row.try_get("changed_by")?,
                action: row.try_get("action")?,
                operation: shown(row.try_get("operation")?),
                role: row.try_get("grantee")?,
                forced: row.try_get("forced")?,
                note: row.try_get("note")?,
            })
        };
        changes.push(change().map_err(read("read the history of the grants"))?);
    }
    Ok(Listing { grants, changes })
}

/// The roles that still hold a transitional grant, as far as `conn`'s role may see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", content = "roles", rename_all = "snake_case")]
pub enum Transitional {
    /// The schema has no grants yet (before V8: run `tombstoned migrate`).
    NotInstalled,
    /// This role may not read the grants.
    NotVisible,
    /// These roles (empty: none).
    Roles(Vec<String>),
}

/// Reads [`Transitional`] on `conn`, without failing on a role that may not read the grants
/// (fine inside a read-only transaction: it asks before it reads).
pub async fn transitional(conn: &Conn<'_>) -> Result<Transitional, tokio_postgres::Error> {
    let visible: Option<bool> = conn
        .query_one(sql::GRANTS_VISIBLE, &[&conn.schema()])
        .await?
        .try_get(0)?;
    match visible {
        None => Ok(Transitional::NotInstalled),
        Some(false) => Ok(Transitional::NotVisible),
        Some(true) => conn
            .query(sql::TRANSITIONAL, &[])
            .await?
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map(Transitional::Roles),
    }
}

impl Transitional {
    /// One line for `status` and `check-config`.
    pub fn describe(&self) -> String {
        match self {
            Transitional::NotInstalled => {
                "not installed (schema before V8: run `tombstoned migrate`)".to_owned()
            }
            Transitional::NotVisible => {
                "not visible to this role (it needs SELECT on operation_grants)".to_owned()
            }
            Transitional::Roles(roles) if roles.is_empty() => "no transitional grants".to_owned(),
            Transitional::Roles(roles) => format!(
                "{} still {} the transitional grant of every operation but \
                 {OPERATION_CREATE_ORDER} (from the upgrade to V8): {}; grant each the \
                 operations it uses, then `tombstoned operations revoke '{EVERY_OPERATION}' \
                 ROLE` (README, Upgrading)",
                role_count(roles.len()),
                if roles.len() == 1 { "holds" } else { "hold" },
                roles.join(", ")
            ),
        }
    }
}

fn role_count(n: usize) -> String {
    if n == 1 {
        "1 role".to_owned()
    } else {
        format!("{n} roles")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_names_the_transitional_grant_and_empty_names_nothing() {
        assert_eq!(
            Operation::parse("*").unwrap(),
            Operation::EveryButCreateOrder
        );
        assert_eq!(
            Operation::parse("create-payment").unwrap(),
            Operation::Named("create-payment".into())
        );
        assert!(matches!(
            Operation::parse(""),
            Err(OperationsError::EmptyOperation)
        ));
        assert_eq!(Operation::EveryButCreateOrder.column(), None);
    }

    #[test]
    fn refusals_are_the_operators_to_fix() {
        assert!(OperationsError::Reserved.is_usage());
        assert!(OperationsError::NoSuchRole("x".into()).is_usage());
        assert!(OperationsError::Reserved.to_string().contains("--force"));
        let db = OperationsError::Database {
            what: "x",
            source: DbError::Timeout {
                what: "y",
                after: std::time::Duration::from_secs(1),
            },
        };
        assert!(!db.is_usage());
    }

    #[test]
    fn the_transitional_line_names_the_roles_and_the_way_out() {
        assert_eq!(
            Transitional::Roles(vec![]).describe(),
            "no transitional grants"
        );
        let line = Transitional::Roles(vec!["a".into(), "b".into()]).describe();
        assert!(line.starts_with("2 roles still hold"), "{line}");
        assert!(line.contains(": a, b;"), "{line}");
        assert!(line.contains("operations revoke '*' ROLE"), "{line}");
    }
}

//! What the service-boundary tests share (issue 36): a service role with exactly the
//! documented grants, an operation granted to it as the README says (`tombstoned operations
//! grant`, or the same through `tombstoned::operations` for set-ups), sessions of a role, and
//! statements sent with the simple query protocol — the one every pooler mode passes.

use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use tombstoned::operations::{self, GrantOutcome, Operation};

use crate::clients_support::documented_grants;
use crate::conn_support::{run_binary, Run};
use crate::harness::{server, TestDb};

/// Creates the login role `role` (no password: the test cluster trusts loopback) with the
/// README's grants of a service role and nothing else.
pub async fn service_role(admin: &Client, role: &str) {
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; {}",
            documented_grants("tombstoned", role)
        ))
        .await
        .unwrap_or_else(|e| panic!("create the service role {role}: {e}"));
}

/// Grants `operation` to `role` as the migrating role (the harness's administrator), through the
/// library the command runs.
pub async fn grant(db: &TestDb, operation: &str, role: &str) {
    let config = db.config();
    let session = tombstoned::db::connect(&config.database, "test-operations")
        .await
        .unwrap();
    let outcome = operations::grant(
        &session.conn(),
        &Operation::parse(operation).unwrap(),
        role,
        false,
    )
    .await
    .unwrap_or_else(|e| panic!("grant {operation} to {role}: {e}"));
    assert_eq!(outcome, GrantOutcome::Granted);
}

/// `tombstoned operations ARGS` as the migrating role (the harness's administrator).
pub async fn operations_cli(db: &TestDb, args: &[&str]) -> Run {
    let mut all = vec!["operations"];
    all.extend_from_slice(args);
    run_binary(&all, &db.url, &[]).await
}

/// A direct session of `role` on `db`, its `application_name` naming it.
pub async fn session_as(db: &TestDb, role: &str) -> Client {
    let mut config = server().clone();
    config.user(role);
    config.dbname(&db.name);
    config.application_name(format!("svc/{role}"));
    connect(&config).await
}

/// A session from `config`, its connection driven by a task of its own.
pub async fn connect(config: &tokio_postgres::Config) -> Client {
    let (client, connection) = config.connect(NoTls).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The first column of the first row `sql` returns (simple query protocol), if any.
pub async fn value(client: &Client, sql: &str) -> Result<Option<String>, tokio_postgres::Error> {
    Ok(client
        .simple_query(sql)
        .await?
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_owned)),
            _ => None,
        })
        .flatten())
}

/// `value`, which must succeed.
pub async fn must(client: &Client, sql: &str) -> Option<String> {
    value(client, sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
}

/// The SQLSTATE of a failed statement (`(none)` for a connection failure).
pub fn sqlstate(e: &tokio_postgres::Error) -> &str {
    e.code().map_or("(none)", |c| c.code())
}

/// The server's message of a failed statement.
pub fn message(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map_or_else(|| e.to_string(), |db| db.message().to_owned())
}

/// A text literal of `text` (single quotes doubled): the tests' own values only.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `claim` of (acme, billing, `operation`, `key`) for an intent numbered `n`.
pub fn claim_sql(operation: &str, key: &str, n: u32) -> String {
    format!(
        "SELECT outcome FROM tombstoned.claim('acme', 'billing', {}, {}, \
         tombstoned.fingerprint('{{\"n\": {n}}}'), '1 hour')",
        literal(operation),
        literal(key)
    )
}

/// `lookup` of the same.
pub fn lookup_sql(operation: &str, key: &str, n: u32) -> String {
    format!(
        "SELECT outcome FROM tombstoned.lookup('acme', 'billing', {}, {}, \
         tombstoned.fingerprint('{{\"n\": {n}}}'))",
        literal(operation),
        literal(key)
    )
}

/// `complete` of the same with 201 and a small body.
pub fn complete_sql(operation: &str, key: &str) -> String {
    format!(
        "SELECT tombstoned.complete('acme', 'billing', {}, {}, 201, '{{\"done\": true}}', {})",
        literal(operation),
        literal(key),
        literal(&format!("res-{key}"))
    )
}

/// A service's whole transaction on its own operation: claim (owner), an event, complete,
/// commit. Returns the event's id.
pub async fn create(client: &Client, operation: &str, key: &str) -> String {
    must(client, "BEGIN").await;
    let outcome = must(client, &claim_sql(operation, key, 1)).await;
    assert_eq!(outcome.as_deref(), Some("owner"), "{operation} {key}");
    let event = must(
        client,
        &format!(
            "SELECT tombstoned.enqueue_event('acme', {}, 'thing.created', '{{}}')",
            literal(key)
        ),
    )
    .await
    .unwrap();
    must(client, &complete_sql(operation, key)).await;
    must(client, "COMMIT").await;
    event
}

/// A libpq URL of `db` logging in as `role`.
pub fn url_as(db: &TestDb, role: &str) -> String {
    let mut config = server().clone();
    config.user(role);
    tombstoned_testkit::cluster::conninfo_for_database(&config, &db.name)
}

/// Creates the login role `role` for a daemon that does not run as the migrating role, with the
/// grants README's "Installing without the package" gives it.
pub async fn daemon_role(admin: &Client, role: &str) {
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN;
             GRANT USAGE ON SCHEMA tombstoned TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tombstoned TO {role};
             GRANT EXECUTE ON FUNCTION tombstoned.cleanup_lease_required(timestamptz) TO {role};"
        ))
        .await
        .unwrap_or_else(|e| panic!("create the daemon role {role}: {e}"));
}

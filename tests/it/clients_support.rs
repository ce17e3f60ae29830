//! The set-up the official clients' own suites run on (`clients/python` under pytest,
//! `clients/node` under node:test): a fresh database migrated by the daemon, a service role with
//! only the documented grants, a configuration file for the real daemon (its cleaner, its
//! relay), and the environment variables the suites read. A suite that fails fails the Rust
//! test that ran it, with the suite's whole output.
//!
//! The environment each suite gets (clients/*/README.md, "Tests", documents the same names):
//!
//! | variable | what |
//! |---|---|
//! | `TOMBSTONED_BIN` | the `tombstoned` binary built for these tests |
//! | `TOMBSTONED_TEST_CONFIG` | a configuration file for that binary, pointing at the database as the migrating role |
//! | `TOMBSTONED_TEST_ADMIN_URL` | the migrating role (owns the schema): inspect rows, create roles and tables |
//! | `TOMBSTONED_TEST_SERVICE_URL` | the service role, with the documented grants only, and operation `create-payment` |
//! | `TOMBSTONED_TEST_SERVICE_ROLE` | that role's name |
//! | `TOMBSTONED_TEST_SCHEMA` | the schema the functions live in |

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio_postgres::config::Host;

use crate::harness::{self, server, TestDb};

/// The operation the suites' service role is granted (`tombstoned operations grant`).
pub const SUITE_OPERATION: &str = "create-payment";

/// How long a whole client suite may take before the test gives up on it.
pub const SUITE_PATIENCE: Duration = Duration::from_secs(600);

/// A database prepared for one client suite.
pub struct ClientEnv {
    /// The database (dropped with the test process's cluster).
    pub db: TestDb,
    /// The service role's name.
    pub service_role: String,
    /// The variables a suite reads, as documented above.
    pub vars: Vec<(String, String)>,
}

impl ClientEnv {
    /// A fresh migrated database, a service role named after `suite` with the documented
    /// grants and the operation [`SUITE_OPERATION`], and a configuration file under the test's
    /// temporary directory.
    pub async fn new(suite: &str) -> ClientEnv {
        let db = TestDb::new().await;
        let config = db.config();
        let schema = config.database.schema.clone();
        let service_role = format!("{suite}_{}", db.name);
        let password = "client-suite-password";
        let admin = db.client().await;
        admin
            .batch_execute(&format!(
                "CREATE ROLE {service_role} LOGIN PASSWORD '{password}';
                 {}",
                documented_grants(&schema, &service_role)
            ))
            .await
            .unwrap_or_else(|e| panic!("create the service role {service_role}: {e}"));

        let admin_url = url_for(&db.name, None);
        let service_url = url_for(&db.name, Some((&service_role, password)));
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("clients")
            .join(&db.name);
        std::fs::create_dir_all(&dir).unwrap();
        let config_file = dir.join("tombstoned.toml");
        std::fs::write(
            &config_file,
            format!(
                "[database]\nurl = {}\nschema = {}\n",
                toml_string(&admin_url),
                toml_string(&schema)
            ),
        )
        .unwrap();
        // The operation the suites use, granted as the README says: the command, run with the
        // migrating role's configuration (issue 36).
        let granted = std::process::Command::new(harness::binary())
            .args(["--config", &config_file.display().to_string()])
            .args(["operations", "grant", SUITE_OPERATION, &service_role])
            .env_remove("TOMBSTONED_DATABASE_URL")
            .env_remove("TOMBSTONED_CONFIG")
            .output()
            .unwrap_or_else(|e| panic!("run tombstoned operations grant: {e}"));
        assert!(
            granted.status.success(),
            "tombstoned operations grant {SUITE_OPERATION} {service_role}: {}",
            String::from_utf8_lossy(&granted.stderr)
        );
        let vars = vec![
            ("TOMBSTONED_BIN".to_owned(), harness::binary().to_owned()),
            (
                "TOMBSTONED_TEST_CONFIG".to_owned(),
                config_file.display().to_string(),
            ),
            ("TOMBSTONED_TEST_ADMIN_URL".to_owned(), admin_url),
            ("TOMBSTONED_TEST_SERVICE_URL".to_owned(), service_url),
            (
                "TOMBSTONED_TEST_SERVICE_ROLE".to_owned(),
                service_role.clone(),
            ),
            ("TOMBSTONED_TEST_SCHEMA".to_owned(), schema),
        ];
        ClientEnv {
            db,
            service_role,
            vars,
        }
    }
}

/// The grants the README gives a service role, as SQL.
pub fn documented_grants(schema: &str, role: &str) -> String {
    format!(
        "GRANT USAGE ON SCHEMA {schema} TO {role};
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role};"
    )
}

/// A `postgresql://` URL of the test server for `database`, as the harness's admin role or as
/// `login`. Every driver reads this form (node-postgres does not read `key=value`).
pub fn url_for(database: &str, login: Option<(&str, &str)>) -> String {
    let host = match server().get_hosts().first() {
        Some(Host::Tcp(host)) => host.clone(),
        other => panic!("the client suites need a TCP server, not {other:?}"),
    };
    let port = server().get_ports().first().copied().unwrap_or(5432);
    let credentials = match login {
        Some((user, password)) => format!("{user}:{password}@"),
        None => match (server().get_user(), server().get_password()) {
            (Some(user), Some(password)) => {
                format!("{user}:{}@", String::from_utf8_lossy(password))
            }
            (Some(user), None) => format!("{user}@"),
            _ => String::new(),
        },
    };
    format!("postgresql://{credentials}{host}:{port}/{database}")
}

fn toml_string(value: &str) -> String {
    serde_json::Value::String(value.to_owned()).to_string()
}

/// Runs `program args` in `dir` with the suite's variables and `extra`; panics with the suite's
/// whole output when it exits non-zero or outlives [`SUITE_PATIENCE`].
pub async fn run_suite(
    env: &ClientEnv,
    dir: &Path,
    program: &Path,
    args: &[&str],
    extra: &[(&str, &str)],
) {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .current_dir(dir)
        .envs(env.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let output = tokio::time::timeout(SUITE_PATIENCE, command.output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} {args:?} ran longer than {SUITE_PATIENCE:?}",
                program.display()
            )
        })
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} {args:?} in {} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        program.display(),
        dir.display(),
        output.status
    );
    println!("{stdout}");
}

#[tokio::test]
async fn the_service_role_reaches_the_functions_and_no_table() {
    let env = ClientEnv::new("envcheck").await;
    let service_url = &env
        .vars
        .iter()
        .find(|(k, _)| k == "TOMBSTONED_TEST_SERVICE_URL")
        .unwrap()
        .1;
    let (client, connection) = tokio_postgres::connect(service_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let role: String = client
        .query_one("SELECT session_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(role, env.service_role);
    let can_read: bool = env
        .db
        .client()
        .await
        .query_one(
            "SELECT has_table_privilege($1, 'tombstoned.idempotency_records', 'SELECT')",
            &[&env.service_role],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!can_read, "the documented grants give no table privilege");
    let version: i32 = client
        .query_one("SELECT tombstoned.api_version()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, tombstoned::schema::API_VERSION);
    let refused = client
        .query("SELECT 1 FROM tombstoned.idempotency_records LIMIT 1", &[])
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
    );
    // The suites' runner sees the variables, and the URLs work for a libpq client too.
    run_suite(
        &env,
        Path::new(env!("CARGO_MANIFEST_DIR")),
        Path::new("sh"),
        &[
            "-c",
            "psql -X -At \"$TOMBSTONED_TEST_SERVICE_URL\" -c 'SELECT current_user' | grep -qx \"$TOMBSTONED_TEST_SERVICE_ROLE\" \
             && \"$TOMBSTONED_BIN\" migrate --config \"$TOMBSTONED_TEST_CONFIG\" --status",
        ],
        &[],
    )
    .await;
}

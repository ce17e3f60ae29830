//! What the tests and the benchmark need on top of `tombstoned::pg_cluster` (the demo's
//! throwaway clusters): options for clusters whose data nobody needs after a crash
//! ([`ClusterOptionsTestExt`]); TLS, `pg_hba.conf` lines and a superuser password, written into
//! a started cluster's data directory ([`ClusterAccess`]); stopping, restarting and starting the
//! server under a running test and running tools as the cluster's owner ([`ClusterTestExt`]);
//! connection strings for the databases they create on a server.

use std::io::Write as _;
use std::process::{Command, Stdio};

use tombstoned::pg_cluster::{ClusterOptions, ThrowawayCluster};

/// Builders for [`ClusterOptions`] that only tests and the benchmark want.
pub trait ClusterOptionsTestExt: Sized {
    /// Durability off (`fsync`, `synchronous_commit`, `full_page_writes`) and room for many
    /// parallel test sessions. Only for data nobody needs after a crash.
    fn for_tests() -> Self;
    /// Adds or replaces one setting.
    fn set(self, name: &str, value: &str) -> Self;
}

impl ClusterOptionsTestExt for ClusterOptions {
    fn for_tests() -> Self {
        [
            ("fsync", "off"),
            ("synchronous_commit", "off"),
            ("full_page_writes", "off"),
            ("max_connections", "300"),
            ("shared_buffers", "128MB"),
        ]
        .iter()
        .fold(Self::default(), |options, (k, v)| options.set(k, v))
    }

    fn set(mut self, name: &str, value: &str) -> Self {
        self.settings.retain(|(k, _)| k != name);
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// The PEM texts a TLS-enabled cluster serves with; written into its data directory, owned by
/// the server's user with mode 0600 as PostgreSQL requires of the key.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server certificate (chain).
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
    /// CA certificates client certificates are checked against (`ssl_ca_file`), if any.
    pub client_ca_pem: Option<String>,
}

/// Who may connect to a test cluster and how, beyond the demo's (initdb's `trust` for every
/// local connection): `pg_hba.conf` lines, TLS, a superuser password. [`Self::apply`] writes them
/// into a started cluster (through its data directory and owner) and restarts its server.
#[derive(Debug, Clone, Default)]
pub struct ClusterAccess {
    hba: Vec<String>,
    tls: Option<ServerTls>,
    superuser_password: Option<String>,
}

/// Why [`ClusterAccess::apply`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterAccessError {
    /// The session that sets the password and the TLS settings failed.
    #[error("cluster access set-up: {0}")]
    Sql(#[from] tokio_postgres::Error),
    /// A file could not be written into the data directory.
    #[error("cannot write {file} into the data directory: {detail}")]
    Write {
        /// The file name.
        file: &'static str,
        /// What went wrong.
        detail: String,
    },
    /// The restart that applies everything failed.
    #[error(transparent)]
    Control(#[from] ClusterControlError),
}

impl ClusterAccess {
    /// Replaces `pg_hba.conf` with `lines`.
    pub fn hba(mut self, lines: &[&str]) -> Self {
        self.hba = lines.iter().map(|l| (*l).to_owned()).collect();
        self
    }

    /// Serves TLS with `tls` (`ssl = on`; `ssl_ca_file` when it carries a client CA).
    pub fn tls(mut self, tls: ServerTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Gives the superuser `postgres` a password (stored with the server's
    /// `password_encryption`).
    pub fn superuser_password(mut self, password: &str) -> Self {
        self.superuser_password = Some(password.to_owned());
        self
    }

    /// Applies the access to `cluster`, started with initdb's `trust`: sets the password and the
    /// TLS settings (`ALTER SYSTEM`) on a session of its own, writes the certificate files and
    /// `pg_hba.conf` as the server's user (mode 0600), then restarts the server, which refuses to
    /// start when any of it is wrong. Nothing to apply: nothing happens.
    pub async fn apply(&self, cluster: &ThrowawayCluster) -> Result<(), ClusterAccessError> {
        if self.hba.is_empty() && self.tls.is_none() && self.superuser_password.is_none() {
            return Ok(());
        }
        let (client, connection) =
            tokio_postgres::connect(&cluster.url("postgres"), tokio_postgres::NoTls).await?;
        let connection = tokio::spawn(connection);
        if let Some(password) = &self.superuser_password {
            client
                .batch_execute(&format!(
                    "ALTER ROLE postgres PASSWORD '{}'",
                    password.replace('\'', "''")
                ))
                .await?;
        }
        if let Some(tls) = &self.tls {
            write_data_file(cluster, "server.crt", &tls.cert_pem)?;
            write_data_file(cluster, "server.key", &tls.key_pem)?;
            client.batch_execute("ALTER SYSTEM SET ssl = on").await?;
            if let Some(ca) = &tls.client_ca_pem {
                write_data_file(cluster, "client_ca.crt", ca)?;
                client
                    .batch_execute("ALTER SYSTEM SET ssl_ca_file = 'client_ca.crt'")
                    .await?;
            }
        }
        drop(client);
        let _ = connection.await;
        if !self.hba.is_empty() {
            write_data_file(cluster, "pg_hba.conf", &(self.hba.join("\n") + "\n"))?;
        }
        // Blocks this thread while the server restarts (a second or so, once per cluster).
        cluster.restart()?;
        Ok(())
    }
}

/// Writes `text` to `name` in the data directory as the server's user, mode 0600.
fn write_data_file(
    cluster: &ThrowawayCluster,
    name: &'static str,
    text: &str,
) -> Result<(), ClusterAccessError> {
    let failed = |detail: String| ClusterAccessError::Write { file: name, detail };
    let path = cluster.data_dir().join(name);
    let mut child = cluster
        .owner_command("sh")
        .args(["-c", "umask 077 && cat >\"$1\"", "sh"])
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| failed(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| failed(e.to_string()))?;
    }
    let output = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(failed(String::from_utf8_lossy(&output.stderr).into_owned()))
    }
}

/// Why `pg_ctl` could not stop, start or restart a test's server.
#[derive(Debug, thiserror::Error)]
pub enum ClusterControlError {
    /// `pg_ctl` could not be run.
    #[error("cannot run pg_ctl")]
    Spawn(#[source] std::io::Error),
    /// `pg_ctl` failed.
    #[error("pg_ctl {action} failed: {output}")]
    Failed {
        /// start, stop, restart.
        action: &'static str,
        /// What it printed.
        output: String,
    },
}

/// What tests do to a running [`ThrowawayCluster`] beyond what the demo does.
pub trait ClusterTestExt {
    /// `pg_ctl restart -m fast`: disconnects every session, like a real server restart.
    fn restart(&self) -> Result<(), ClusterControlError>;
    /// `pg_ctl stop -m fast`: the database goes away until [`Self::start_server`].
    fn stop_server(&self) -> Result<(), ClusterControlError>;
    /// Starts the server again after [`Self::stop_server`], on the same port and socket
    /// directory with the same settings (`pg_ctl start` alone would use the defaults: port 5432).
    fn start_server(&self) -> Result<(), ClusterControlError>;
    /// A command that runs `program` (from the cluster's bin dir when it is there) as the
    /// cluster's owner, with the environment the bundled binaries need.
    fn owner_command(&self, program: &str) -> Command;
}

impl ClusterTestExt for ThrowawayCluster {
    fn restart(&self) -> Result<(), ClusterControlError> {
        pg_ctl(self, "restart", &["-m", "fast"])
    }

    fn stop_server(&self) -> Result<(), ClusterControlError> {
        pg_ctl(self, "stop", &["-m", "fast"])
    }

    fn start_server(&self) -> Result<(), ClusterControlError> {
        pg_ctl(self, "start", &["-o", self.server_options()])
    }

    fn owner_command(&self, program: &str) -> Command {
        let path = self.bin_dir().join(program);
        let program = if path.is_file() {
            path.display().to_string()
        } else {
            program.to_owned()
        };
        // As root the server's files belong to its owner; `env` sets the library path for the
        // program, which runuser would otherwise reset.
        let mut command = match self.owner() {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--", "env"]);
                c
            }
            None => Command::new("env"),
        };
        if let Some(lib) = self.library_dir() {
            command.arg(format!("LD_LIBRARY_PATH={}", lib.display()));
        }
        command.arg(program);
        command
    }
}

fn pg_ctl(
    cluster: &ThrowawayCluster,
    action: &'static str,
    extra: &[&str],
) -> Result<(), ClusterControlError> {
    let output = cluster
        .owner_command("pg_ctl")
        .arg("-D")
        .arg(cluster.data_dir())
        .arg("-l")
        .arg(cluster.log_file())
        .args(["-w", "-t", "60"])
        .args(extra)
        .arg(action)
        .stdin(Stdio::null())
        .output()
        .map_err(ClusterControlError::Spawn)?;
    if output.status.success() {
        Ok(())
    } else {
        Err(ClusterControlError::Failed {
            action,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        })
    }
}

/// A libpq key=value connection string for `server`'s host, port and credentials on database
/// `dbname` (tokio-postgres, libpq tools such as pgbench, and `TOMBSTONED_DATABASE_URL` all
/// accept it).
pub fn conninfo_for_database(server: &tokio_postgres::Config, dbname: &str) -> String {
    use tokio_postgres::config::Host;
    let mut parts = Vec::new();
    if let Some(host) = server.get_hosts().first() {
        match host {
            Host::Tcp(h) => parts.push(format!("host={h}")),
            Host::Unix(p) => parts.push(format!("host={}", p.display())),
        }
    }
    if let Some(port) = server.get_ports().first() {
        parts.push(format!("port={port}"));
    }
    if let Some(user) = server.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(pw) = server.get_password() {
        parts.push(format!("password={}", String::from_utf8_lossy(pw)));
    }
    parts.push(format!("dbname={dbname}"));
    parts.join(" ")
}

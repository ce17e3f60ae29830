//! What the tests and the benchmark need on top of `tombstoned::pg_cluster` (the demo's
//! throwaway clusters): options for clusters whose data nobody needs after a crash, with TLS,
//! `pg_hba.conf` lines and a superuser password ([`ClusterOptionsTestExt`]); stopping,
//! restarting and starting the server under a running test and running tools as the cluster's
//! owner ([`ClusterTestExt`]); connection strings for the databases they create on a server.

use std::process::{Command, Stdio};

use tombstoned::pg_cluster::{ClusterOptions, ServerTls, ThrowawayCluster};

/// Builders for [`ClusterOptions`] that only tests and the benchmark want.
pub trait ClusterOptionsTestExt: Sized {
    /// Durability off (`fsync`, `synchronous_commit`, `full_page_writes`) and room for many
    /// parallel test sessions. Only for data nobody needs after a crash.
    fn for_tests() -> Self;
    /// Replaces `pg_hba.conf` with `lines`.
    fn hba(self, lines: &[&str]) -> Self;
    /// Serves TLS with `tls` (`ssl = on`).
    fn tls(self, tls: ServerTls) -> Self;
    /// Gives the superuser `postgres` a password.
    fn superuser_password(self, password: &str) -> Self;
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

    fn hba(mut self, lines: &[&str]) -> Self {
        self.hba = lines.iter().map(|l| (*l).to_owned()).collect();
        self
    }

    fn tls(mut self, tls: ServerTls) -> Self {
        let with_ca = tls.client_ca_pem.is_some();
        self.ssl = Some(tls);
        self = self.set("ssl", "on");
        if with_ca {
            // The supervisor writes the CA into the data directory under this name.
            self = self.set("ssl_ca_file", "client_ca.crt");
        }
        self
    }

    fn superuser_password(mut self, password: &str) -> Self {
        self.superuser_password = Some(password.to_owned());
        self
    }

    fn set(mut self, name: &str, value: &str) -> Self {
        self.settings.retain(|(k, _)| k != name);
        self.settings.push((name.to_owned(), value.to_owned()));
        self
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

//! A real PgBouncer (Debian's `pgbouncer`) in front of a PostgreSQL server, for the pooler tests
//! and the benchmark's scenario 11: started on a free loopback port with an ini and userlist of
//! its own, as the cluster's unprivileged owner when this process is root (PgBouncer refuses to
//! run as root), stopped when dropped. [`PgBouncer::start`] puts it in front of the tests'
//! harness server; [`PgBouncer::start_for`] in front of any server.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::config::Host;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use tombstoned::pg_cluster::{free_loopback_port, ThrowawayCluster};

use crate::cluster::ClusterTestExt as _;
use crate::harness;

/// How long PgBouncer may take to accept its first login.
const START_PATIENCE: Duration = Duration::from_secs(20);

/// PgBouncer's `pool_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A client keeps its server connection until it disconnects.
    Session,
    /// A client holds a server connection for one transaction only.
    Transaction,
}

impl PoolMode {
    fn ini(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }

    /// The matching `database.pooler` value.
    pub fn setting(self) -> &'static str {
        self.ini()
    }
}

/// Why PgBouncer could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PgBouncerError {
    /// Writing its files or spawning it failed.
    #[error("cannot start pgbouncer (Debian package pgbouncer; .ci/run installs it)")]
    Io(#[from] std::io::Error),
    /// The upstream server has no host PgBouncer can reach.
    #[error("pgbouncer needs a TCP or Unix-socket server, not {0}")]
    Upstream(String),
    /// It never accepted a login.
    #[error("pgbouncer did not accept a login on port {port} within {START_PATIENCE:?}: {log}")]
    NotAccepting {
        /// Its port.
        port: u16,
        /// Its log.
        log: String,
    },
}

/// A running PgBouncer.
pub struct PgBouncer {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// `default_pool_size`: server connections per database and user.
    pub pool_size: u32,
    user: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` with `pool_size` server connections per database, in front of
    /// the tests' harness server (any database name), and waits until it accepts a login.
    /// Panics when it cannot (a test's set-up).
    pub async fn start(mode: PoolMode, pool_size: u32) -> PgBouncer {
        Self::start_for(harness::server(), harness::cluster(), mode, pool_size)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts PgBouncer in `mode` with `pool_size` server connections per database in front of
    /// `server` (any database name; its user, and its password if it has one, are PgBouncer's
    /// only login), run as `cluster`'s owner when this process is root, and waits until it
    /// accepts a login.
    pub async fn start_for(
        server: &tokio_postgres::Config,
        cluster: Option<&ThrowawayCluster>,
        mode: PoolMode,
        pool_size: u32,
    ) -> Result<PgBouncer, PgBouncerError> {
        Self::start_for_logins(server, cluster, mode, pool_size, &[], None).await
    }

    /// [`PgBouncer::start`], letting `logins` log in too (roles of the server without a
    /// password, as a throwaway cluster's loopback trusts them): one pool per role and
    /// database, each logging in to the server as its client's role.
    pub async fn start_with_logins(mode: PoolMode, pool_size: u32, logins: &[&str]) -> PgBouncer {
        Self::start_in_harness(mode, pool_size, logins, None).await
    }

    /// [`PgBouncer::start_with_logins`] with `user=forced_user` in its `[databases]` entry:
    /// whoever a client logs in as, its server connections log in as `forced_user`.
    pub async fn start_with_forced_user(
        mode: PoolMode,
        pool_size: u32,
        logins: &[&str],
        forced_user: &str,
    ) -> PgBouncer {
        Self::start_in_harness(mode, pool_size, logins, Some(forced_user)).await
    }

    /// In front of the tests' harness server; panics when it cannot start (a test's set-up).
    async fn start_in_harness(
        mode: PoolMode,
        pool_size: u32,
        logins: &[&str],
        forced_user: Option<&str>,
    ) -> PgBouncer {
        Self::start_for_logins(
            harness::server(),
            harness::cluster(),
            mode,
            pool_size,
            logins,
            forced_user,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn start_for_logins(
        server: &tokio_postgres::Config,
        cluster: Option<&ThrowawayCluster>,
        mode: PoolMode,
        pool_size: u32,
        logins: &[&str],
        forced_user: Option<&str>,
    ) -> Result<PgBouncer, PgBouncerError> {
        let host = match server.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(path)) => path.display().to_string(),
            None => return Err(PgBouncerError::Upstream("no host".into())),
        };
        let upstream = server.get_ports().first().copied().unwrap_or(5432);
        let user = server.get_user().unwrap_or("postgres").to_owned();
        // PgBouncer logs in to the server with the userlist's password (none: the test clusters
        // trust loopback).
        let password = server
            .get_password()
            .map(|p| String::from_utf8_lossy(p).replace('"', "\"\""))
            .unwrap_or_default();
        let port = free_loopback_port()?;
        let dir = tempfile::tempdir()?;
        let ini = dir.path().join("pgbouncer.ini");
        let users = dir.path().join("userlist.txt");
        let mut userlist = format!("\"{user}\" \"{password}\"\n");
        for login in logins {
            userlist.push_str(&format!("\"{}\" \"\"\n", login.replace('"', "\"\"")));
        }
        std::fs::write(&users, userlist)?;
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host={host} port={upstream}{forced}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {users}\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 500\n\
                 logfile =\n\
                 pidfile =\n",
                users = users.display(),
                mode = mode.ini(),
                forced = forced_user.map_or(String::new(), |u| format!(" user={u}")),
            ),
        )?;
        // Readable by the unprivileged user PgBouncer runs as (the userlist only holds a
        // password when the caller's server has one, which a throwaway cluster never does).
        for path in [dir.path(), ini.as_path(), users.as_path()] {
            let mode = if path.is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        }
        let program = pgbouncer_program();
        let mut command = match cluster {
            Some(cluster) => cluster.owner_command(&program),
            None => Command::new(&program),
        };
        let child = command
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Its log (written by this process's file handle: PgBouncer logs to stderr).
            .stderr(std::fs::File::create(dir.path().join("pgbouncer.log"))?)
            .spawn()?;
        let bouncer = PgBouncer {
            port,
            pool_size,
            user,
            child,
            dir,
        };
        bouncer.wait_accepting().await?;
        Ok(bouncer)
    }

    /// Its log (PgBouncer's stderr), for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    /// A libpq URL of database `dbname` through PgBouncer.
    pub fn url(&self, dbname: &str) -> String {
        self.url_as(dbname, &self.user)
    }

    /// A libpq URL of database `dbname` through PgBouncer, logging in as `user` (one of the
    /// `logins` it was started with).
    pub fn url_as(&self, dbname: &str, user: &str) -> String {
        format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname}",
            self.port
        )
    }

    /// The PgBouncer process's id (for its CPU time in /proc): the child started, or, when that
    /// is `runuser` (this process is root), the child it forked.
    pub fn pid(&self) -> u32 {
        let started = self.child.id();
        if comm(started).as_deref() == Some("pgbouncer") {
            return started;
        }
        std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| comm(*pid).as_deref() == Some("pgbouncer") && parent(*pid) == Some(started))
            .unwrap_or(started)
    }

    /// A plain client session through PgBouncer (the tests send only simple-protocol queries on
    /// it, which any pool mode allows). Panics when it cannot connect (a test's set-up).
    pub async fn client(&self, dbname: &str) -> Client {
        self.try_client(dbname)
            .await
            .unwrap_or_else(|e| panic!("connect through pgbouncer: {e}"))
    }

    async fn try_client(&self, dbname: &str) -> Result<Client, tokio_postgres::Error> {
        let (client, connection) = tokio_postgres::connect(&self.url(dbname), NoTls).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    async fn wait_accepting(&self) -> Result<(), PgBouncerError> {
        let deadline = Instant::now() + START_PATIENCE;
        loop {
            if let Ok(client) = self.try_client("postgres").await {
                if client.simple_query("SELECT 1").await.is_ok() {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(PgBouncerError::NotAccepting {
                    port: self.port,
                    log: self.log(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// What every server connection of `dbname`'s pool carries: for each of the pool's
    /// `pool_size` server connections (held at once, each inside an open transaction, so
    /// PgBouncer must hand out distinct ones), its backend pid, `search_path`,
    /// `statement_timeout`, `lock_timeout`, `idle_in_transaction_session_timeout` and how many
    /// prepared statements it holds.
    pub async fn server_connection_state(&self, dbname: &str) -> Vec<ServerConnectionState> {
        let mut clients = Vec::new();
        for _ in 0..self.pool_size {
            let client = self.client(dbname).await;
            client.simple_query("BEGIN").await.unwrap();
            clients.push(client);
        }
        let mut states = Vec::new();
        for client in &clients {
            let rows = client
                .simple_query(
                    "SELECT pg_backend_pid(), current_setting('search_path'), \
                     current_setting('statement_timeout'), current_setting('lock_timeout'), \
                     current_setting('idle_in_transaction_session_timeout'), \
                     (SELECT count(*) FROM pg_prepared_statements)",
                )
                .await
                .unwrap();
            let row = rows
                .iter()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(r) => Some(r),
                    _ => None,
                })
                .expect("one row");
            let text = |i: usize| row.get(i).unwrap_or_default().to_owned();
            states.push(ServerConnectionState {
                pid: text(0).parse().unwrap(),
                search_path: text(1),
                statement_timeout: text(2),
                lock_timeout: text(3),
                idle_in_transaction_session_timeout: text(4),
                prepared_statements: text(5).parse().unwrap(),
            });
        }
        for client in &clients {
            client.simple_query("ROLLBACK").await.unwrap();
        }
        states
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // Our own child, by its pid. SIGTERM: runuser passes it on to PgBouncer (a SIGKILL
        // would leave PgBouncer running).
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let _ = self.child.wait();
    }
}

/// PgBouncer's absolute path (Debian puts it in /usr/sbin, which an unprivileged user's PATH
/// may lack), or its bare name for PATH to resolve.
fn pgbouncer_program() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file())
        .map_or_else(|| "pgbouncer".to_owned(), |p| p.display().to_string())
}

/// A process's command name (`/proc/<pid>/comm`).
fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|c| c.trim().to_owned())
}

/// A process's parent (`/proc/<pid>/stat`, after the parenthesised command name).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// One server connection as [`PgBouncer::server_connection_state`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConnectionState {
    /// Its backend pid.
    pub pid: i32,
    /// `search_path`.
    pub search_path: String,
    /// `statement_timeout`.
    pub statement_timeout: String,
    /// `lock_timeout`.
    pub lock_timeout: String,
    /// `idle_in_transaction_session_timeout`.
    pub idle_in_transaction_session_timeout: String,
    /// Rows of `pg_prepared_statements`.
    pub prepared_statements: i64,
}

impl ServerConnectionState {
    /// Whether nothing tombstoned could set is left: the server's defaults.
    pub fn is_clean(&self) -> bool {
        self.search_path == "\"$user\", public"
            && self.statement_timeout == "0"
            && self.lock_timeout == "0"
            && self.idle_in_transaction_session_timeout == "0"
    }
}

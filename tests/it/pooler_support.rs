//! A real PgBouncer (Debian's `pgbouncer`) in front of the harness's server, for the pooler
//! tests: started on a free loopback port with an ini and userlist of its own, as the cluster's
//! unprivileged owner when the tests run as root (PgBouncer refuses to run as root), stopped
//! when dropped.

#![allow(dead_code)] // the pooler tests use a different subset each

use std::os::unix::fs::PermissionsExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::config::Host;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use tombstoned::pg_cluster::free_loopback_port;
use tombstoned_testkit::cluster::ClusterTestExt as _;

use crate::harness;

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

/// A running PgBouncer.
pub struct PgBouncer {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// `default_pool_size`: server connections per database and user.
    pub pool_size: u32,
    child: Child,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts PgBouncer in `mode` with `pool_size` server connections per database, in front of
    /// the harness's server (any database name), and waits until it accepts a login.
    pub async fn start(mode: PoolMode, pool_size: u32) -> PgBouncer {
        let server = harness::server();
        let host = match server.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            other => panic!("the pooler tests need a TCP server, not {other:?}"),
        };
        let upstream = server.get_ports().first().copied().unwrap_or(5432);
        let user = server.get_user().unwrap_or("postgres").to_owned();
        let port = free_loopback_port().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ini = dir.path().join("pgbouncer.ini");
        let users = dir.path().join("userlist.txt");
        // Trust between PgBouncer and the test cluster, as the cluster trusts loopback.
        std::fs::write(&users, format!("\"{user}\" \"\"\n")).unwrap();
        std::fs::write(
            &ini,
            format!(
                "[databases]\n\
                 * = host={host} port={upstream}\n\
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
            ),
        )
        .unwrap();
        // Readable by the unprivileged user PgBouncer runs as.
        for path in [dir.path(), ini.as_path(), users.as_path()] {
            let mode = if path.is_dir() { 0o755 } else { 0o644 };
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let program = pgbouncer_program();
        let mut command = match harness::cluster() {
            Some(cluster) => cluster.owner_command(&program),
            None => Command::new(&program),
        };
        let child = command
            .arg(&ini)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Its log (written by this process's file handle: PgBouncer logs to stderr).
            .stderr(std::fs::File::create(dir.path().join("pgbouncer.log")).unwrap())
            .spawn()
            .expect("start pgbouncer (Debian package pgbouncer; .ci/run installs it)");
        let bouncer = PgBouncer {
            port,
            pool_size,
            child,
            dir,
        };
        bouncer.wait_accepting().await;
        bouncer
    }

    /// Its log (PgBouncer's stderr), for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }

    /// A libpq URL of database `dbname` through PgBouncer.
    pub fn url(&self, dbname: &str) -> String {
        let user = harness::server().get_user().unwrap_or("postgres");
        format!(
            "host=127.0.0.1 port={} user={user} dbname={dbname}",
            self.port
        )
    }

    /// A plain client session through PgBouncer (the tests send only simple-protocol queries on
    /// it, which any pool mode allows).
    pub async fn client(&self, dbname: &str) -> Client {
        let (client, connection) = tokio_postgres::connect(&self.url(dbname), NoTls)
            .await
            .expect("connect through pgbouncer");
        tokio::spawn(async move {
            let _ = connection.await;
        });
        client
    }

    async fn wait_accepting(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let attempt = tokio_postgres::connect(&self.url("postgres"), NoTls).await;
            if let Ok((client, connection)) = attempt {
                tokio::spawn(async move {
                    let _ = connection.await;
                });
                if client.simple_query("SELECT 1").await.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "pgbouncer did not accept a login on port {} within 20s",
                self.port
            );
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
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// PgBouncer's absolute path (Debian puts it in /usr/sbin, which an unprivileged user's PATH
/// may lack), or its bare name for PATH to resolve.
fn pgbouncer_program() -> String {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([std::path::PathBuf::from("/usr/sbin")])
        .map(|dir| dir.join("pgbouncer"))
        .find(|candidate| candidate.is_file())
        .map_or_else(|| "pgbouncer".to_owned(), |p| p.display().to_string())
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

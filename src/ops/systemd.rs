//! The service manager protocol (sd_notify): readiness, status, reload, stopping and the
//! watchdog, sent to the socket systemd names in `NOTIFY_SOCKET`.
//!
//! The address and the watchdog interval are read from the environment **once**, into a
//! [`Notifier`]; nothing here reads the process environment afterwards. That keeps the daemon's
//! view fixed for its lifetime and lets tests hand each notifier a socket of its own (environment
//! variables are process-global, and tests run in parallel).
//!
//! Messages are formatted by the `sd-notify` crate ([`NotifyState`]); sending is done here
//! because the crate's `notify()` re-reads `NOTIFY_SOCKET` from the process environment on every
//! call, opens a socket per message and blocks when the receiver's queue is full. Ours sends
//! non-blocking from one socket, to an address resolved once (abstract `@name` addresses
//! included).
//!
//! Without `NOTIFY_SOCKET` (not started by systemd, or not `Type=notify`) every call is a no-op.
//! A failed notification is logged, never fatal: the service keeps serving, and systemd's own
//! timeouts (start, watchdog) decide what a missing message means.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use sd_notify::NotifyState;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::db::error_text;

/// `NOTIFY_SOCKET`: where the service manager listens.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";
/// `WATCHDOG_USEC`: the watchdog timeout in microseconds (`WatchdogSec=`).
pub const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// `WATCHDOG_PID`: the process the watchdog applies to; absent means "the main process".
pub const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// `STATUS=` texts longer than this are cut (at a character boundary): the whole message must
/// fit one datagram, and `systemctl status` shows one line anyway.
const MAX_STATUS_BYTES: usize = 512;

/// Why a notification could not be sent, or the environment could not be understood.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// `NOTIFY_SOCKET` is set but is not an absolute path or an `@abstract` name.
    #[error("NOTIFY_SOCKET={0:?} is neither an absolute path nor an @abstract socket name")]
    BadSocketAddress(String),
    /// The socket address could not be built (too long, interior NUL, ...).
    #[error("NOTIFY_SOCKET={address:?} is not a valid unix socket address")]
    InvalidSocketAddress {
        /// The variable's value.
        address: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// `WATCHDOG_USEC` or `WATCHDOG_PID` is not a number (or the interval is zero).
    #[error("{name}={value:?} is not a valid value")]
    BadWatchdogValue {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// Our end of the socket could not be created.
    #[error("cannot create the notification socket")]
    Socket(#[source] io::Error),
    /// Sending failed (the service manager is gone, or its queue is full).
    #[error("cannot send {message:?} to the service manager")]
    Send {
        /// The first line of the message, e.g. `READY=1`.
        message: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The kernel accepted only part of the datagram.
    #[error("the service manager accepted {sent} of {len} bytes")]
    Truncated {
        /// Bytes sent.
        sent: usize,
        /// Bytes in the message.
        len: usize,
    },
}

/// The notification settings systemd passes in the environment, read once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyEnv {
    /// `NOTIFY_SOCKET`.
    pub notify_socket: Option<OsString>,
    /// `WATCHDOG_USEC`.
    pub watchdog_usec: Option<OsString>,
    /// `WATCHDOG_PID`.
    pub watchdog_pid: Option<OsString>,
}

impl NotifyEnv {
    /// A snapshot of this process's environment.
    pub fn from_process() -> Self {
        Self::from_vars(std::env::vars_os())
    }

    /// Picks the three variables out of `(name, value)` pairs; other names are ignored.
    pub fn from_vars<I, K, V>(vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: Into<OsString>,
    {
        let mut env = NotifyEnv::default();
        for (name, value) in vars {
            let slot = match name.as_ref().as_bytes() {
                b"NOTIFY_SOCKET" => &mut env.notify_socket,
                b"WATCHDOG_USEC" => &mut env.watchdog_usec,
                b"WATCHDOG_PID" => &mut env.watchdog_pid,
                _ => continue,
            };
            *slot = Some(value.into());
        }
        env
    }
}

/// Sends sd_notify messages to the service manager. Cheap to clone (one shared socket).
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

struct Inner {
    /// `None`: not under a notify-aware service manager; every call is a no-op.
    target: Option<Target>,
    /// `WATCHDOG_USEC`, when the watchdog applies to this process.
    watchdog_timeout: Option<Duration>,
    /// Set after a failed send so that a service manager that went away is reported once, not
    /// on every watchdog ping; cleared by the next successful send.
    failing: AtomicBool,
}

struct Target {
    socket: UnixDatagram,
    address: SocketAddr,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("enabled", &self.is_enabled())
            .field("watchdog_timeout", &self.inner.watchdog_timeout)
            .finish()
    }
}

impl Notifier {
    /// A notifier for this process's environment. An unusable `NOTIFY_SOCKET` or watchdog
    /// setting is logged and treated as absent: a daemon should run even when its service
    /// manager is misconfigured.
    pub fn from_env() -> Self {
        match Self::from_notify_env(&NotifyEnv::from_process(), std::process::id()) {
            Ok(notifier) => notifier,
            Err(e) => {
                tracing::warn!(error = %error_text(&e), "sd_notify disabled");
                Self::disabled()
            }
        }
    }

    /// A notifier for an explicit environment snapshot; `own_pid` is compared with
    /// `WATCHDOG_PID` (the watchdog is ours only when that variable is absent or names us).
    pub fn from_notify_env(env: &NotifyEnv, own_pid: u32) -> Result<Self, NotifyError> {
        let Some(raw) = env.notify_socket.as_deref().filter(|s| !s.is_empty()) else {
            return Ok(Self::disabled());
        };
        let address = socket_address(raw)?;
        let socket = UnixDatagram::unbound().map_err(NotifyError::Socket)?;
        // Never block a runtime thread on a full service-manager queue: a ping that cannot be
        // queued now is reported and the next one tries again.
        socket.set_nonblocking(true).map_err(NotifyError::Socket)?;
        let watchdog_timeout = watchdog_timeout(env, own_pid)?;
        Ok(Notifier {
            inner: Arc::new(Inner {
                target: Some(Target { socket, address }),
                watchdog_timeout,
                failing: AtomicBool::new(false),
            }),
        })
    }

    /// A notifier that sends nothing.
    pub fn disabled() -> Self {
        Notifier {
            inner: Arc::new(Inner {
                target: None,
                watchdog_timeout: None,
                failing: AtomicBool::new(false),
            }),
        }
    }

    /// Whether messages go anywhere.
    pub fn is_enabled(&self) -> bool {
        self.inner.target.is_some()
    }

    /// The watchdog timeout (`WATCHDOG_USEC`, systemd's `WatchdogSec=`); `None` when the service
    /// has no watchdog (or it is meant for another process).
    pub fn watchdog_timeout(&self) -> Option<Duration> {
        self.inner.watchdog_timeout
    }

    /// How often to send `WATCHDOG=1`: half of `WATCHDOG_USEC`, as sd_watchdog_enabled(3)
    /// advises; `None` when the service has no watchdog (or it is meant for another process).
    pub fn watchdog_interval(&self) -> Option<Duration> {
        self.inner.watchdog_timeout.map(|t| t / 2)
    }

    /// Sends `states` in one datagram. `Ok` without sending when disabled.
    pub fn send(&self, states: &[NotifyState<'_>]) -> Result<(), NotifyError> {
        let Some(target) = &self.inner.target else {
            return Ok(());
        };
        let mut message = String::new();
        for state in states {
            message.push_str(&state.to_string());
            message.push('\n');
        }
        let sent = target
            .socket
            .send_to_addr(message.as_bytes(), &target.address)
            .map_err(|source| NotifyError::Send {
                message: message.lines().next().unwrap_or_default().to_owned(),
                source,
            })?;
        if sent == message.len() {
            Ok(())
        } else {
            Err(NotifyError::Truncated {
                sent,
                len: message.len(),
            })
        }
    }

    /// `READY=1` with a status line: start-up is complete (configuration loaded, database
    /// reachable, schema current, listeners bound).
    pub fn ready(&self, status: &str) {
        let status = status_text(status);
        self.report(&[NotifyState::Ready, NotifyState::Status(&status)]);
    }

    /// `STATUS=...`: one line for `systemctl status` (e.g. the last cleanup run's figures).
    /// Control characters become spaces (a newline would start another assignment) and long
    /// texts are cut.
    pub fn status(&self, status: &str) {
        let status = status_text(status);
        self.report(&[NotifyState::Status(&status)]);
    }

    /// `RELOADING=1` with `MONOTONIC_USEC` (which systemd 253+ requires alongside it): a SIGHUP
    /// reload has begun. Follow it with [`Notifier::ready`] when the reload is done, whether the
    /// new configuration was taken or refused.
    pub fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.report(&[NotifyState::Reloading, now]),
            Err(e) => tracing::warn!(error = %e, "cannot read the monotonic clock for RELOADING=1"),
        }
    }

    /// `STOPPING=1`: shutdown has begun (sent before draining, so systemd shows "deactivating").
    pub fn stopping(&self) {
        self.report(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    }

    /// One `WATCHDOG=1` ping. Usually sent by [`Notifier::spawn_watchdog`].
    pub fn watchdog(&self) {
        self.report(&[NotifyState::Watchdog]);
    }

    /// Sends and logs a failure: the first one of a series at `warn`, the rest at `debug`.
    fn report(&self, states: &[NotifyState<'_>]) {
        match self.send(states) {
            Ok(()) => {
                if self.inner.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("sd_notify messages are delivered again");
                }
            }
            Err(e) => {
                if self.inner.failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(error = %error_text(&e), "sd_notify message not delivered");
                } else {
                    tracing::warn!(error = %error_text(&e), "sd_notify message not delivered");
                }
            }
        }
    }

    /// Spawns the watchdog task: every [`Notifier::watchdog_interval`] it calls `health` and
    /// sends `WATCHDOG=1` only when it returns true, so a stuck scheduler loop or a lost database
    /// lets the watchdog expire and systemd restart the service (`Restart=on-failure`). A health
    /// failure shorter than `WatchdogSec` costs nothing: the next healthy tick pings again.
    ///
    /// Returns `None` (and spawns nothing) when there is no watchdog. The task ends when
    /// `shutdown` is cancelled. `health` runs on a runtime thread: keep it cheap and
    /// non-blocking (read atomics, a cached probe result).
    pub fn spawn_watchdog(
        &self,
        health: impl Fn() -> bool + Send + 'static,
        shutdown: CancellationToken,
    ) -> Option<JoinHandle<()>> {
        let interval = self.watchdog_interval()?;
        if !self.is_enabled() {
            return None;
        }
        let notifier = self.clone();
        Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            // After a stall, one ping, then the regular rhythm again (no burst of catch-up pings).
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut healthy = true;
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = ticks.tick() => {}
                }
                let now_healthy = health();
                if now_healthy {
                    notifier.watchdog();
                    if !healthy {
                        tracing::info!("health check passes again; watchdog pings resumed");
                    }
                } else if healthy {
                    tracing::warn!(
                        timeout = ?notifier.inner.watchdog_timeout,
                        "health check failing; watchdog pings withheld (systemd restarts the \
                         service if this lasts the whole watchdog timeout)"
                    );
                }
                healthy = now_healthy;
            }
        }))
    }
}

/// Parses `NOTIFY_SOCKET`: an absolute path, or `@name` for the abstract namespace.
fn socket_address(raw: &OsStr) -> Result<SocketAddr, NotifyError> {
    let bytes = raw.as_bytes();
    let invalid = |source| NotifyError::InvalidSocketAddress {
        address: raw.to_string_lossy().into_owned(),
        source,
    };
    match bytes.first() {
        Some(b'/') => SocketAddr::from_pathname(raw).map_err(invalid),
        Some(b'@') => abstract_address(&bytes[1..]).map_err(invalid),
        _ => Err(NotifyError::BadSocketAddress(
            raw.to_string_lossy().into_owned(),
        )),
    }
}

#[cfg(target_os = "linux")]
fn abstract_address(name: &[u8]) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt as _;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(target_os = "linux"))]
fn abstract_address(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract unix sockets exist on Linux only",
    ))
}

/// `WATCHDOG_USEC`, unless `WATCHDOG_PID` names another process (sd_watchdog_enabled(3)).
fn watchdog_timeout(env: &NotifyEnv, own_pid: u32) -> Result<Option<Duration>, NotifyError> {
    let Some(usec) = &env.watchdog_usec else {
        return Ok(None);
    };
    let number = |name: &'static str, value: &OsStr| {
        value
            .to_str()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|n| *n > 0)
            .ok_or_else(|| NotifyError::BadWatchdogValue {
                name,
                value: value.to_string_lossy().into_owned(),
            })
    };
    let usec = number(WATCHDOG_USEC, usec)?;
    if let Some(pid) = &env.watchdog_pid {
        if number(WATCHDOG_PID, pid)? != u64::from(own_pid) {
            return Ok(None);
        }
    }
    Ok(Some(Duration::from_micros(usec)))
}

/// One line of at most [`MAX_STATUS_BYTES`], without control characters.
fn status_text(status: &str) -> String {
    let mut line: String = status
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if line.len() > MAX_STATUS_BYTES {
        let mut cut = MAX_STATUS_BYTES;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    /// A bound datagram socket standing in for systemd's, in a directory of its own.
    struct FakeManager {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        socket: UnixDatagram,
    }

    impl FakeManager {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("notify");
            let socket = UnixDatagram::bind(&path).unwrap();
            FakeManager {
                _dir: dir,
                path,
                socket,
            }
        }

        fn notifier(&self, extra: &[(&str, &str)]) -> Notifier {
            let mut vars = vec![(NOTIFY_SOCKET.to_owned(), self.path.as_os_str().to_owned())];
            vars.extend(
                extra
                    .iter()
                    .map(|(k, v)| (k.to_string(), OsString::from(v))),
            );
            Notifier::from_notify_env(&NotifyEnv::from_vars(vars), std::process::id()).unwrap()
        }

        /// The next datagram, waiting at most `timeout`.
        fn recv(&self, timeout: Duration) -> Option<String> {
            self.socket.set_read_timeout(Some(timeout)).unwrap();
            let mut buf = [0u8; 4096];
            match self.socket.recv(&mut buf) {
                Ok(n) => Some(String::from_utf8(buf[..n].to_vec()).unwrap()),
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.kind() == io::ErrorKind::TimedOut =>
                {
                    None
                }
                Err(e) => panic!("recv: {e}"),
            }
        }

        fn drain(&self) -> Vec<String> {
            let mut all = Vec::new();
            while let Some(m) = self.recv(Duration::from_millis(1)) {
                all.push(m);
            }
            all
        }
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[test]
    fn messages_arrive_in_the_sd_notify_format() {
        let manager = FakeManager::new();
        let notifier = manager.notifier(&[]);
        assert!(notifier.is_enabled());
        notifier.ready("serving on 127.0.0.1:8080");
        assert_eq!(
            manager.recv(WAIT).unwrap(),
            "READY=1\nSTATUS=serving on 127.0.0.1:8080\n"
        );
        notifier.status("last run: 10 rows tombstoned");
        assert_eq!(
            manager.recv(WAIT).unwrap(),
            "STATUS=last run: 10 rows tombstoned\n"
        );
        notifier.reloading();
        let reloading = manager.recv(WAIT).unwrap();
        let mut lines = reloading.lines();
        assert_eq!(lines.next(), Some("RELOADING=1"));
        let usec = lines
            .next()
            .unwrap()
            .strip_prefix("MONOTONIC_USEC=")
            .unwrap();
        assert!(usec.parse::<u64>().unwrap() > 0, "{reloading}");
        notifier.watchdog();
        assert_eq!(manager.recv(WAIT).unwrap(), "WATCHDOG=1\n");
        notifier.stopping();
        assert_eq!(manager.recv(WAIT).unwrap(), "STOPPING=1\nSTATUS=stopping\n");
    }

    #[test]
    fn a_status_cannot_inject_assignments_and_is_bounded() {
        let manager = FakeManager::new();
        let notifier = manager.notifier(&[]);
        notifier.status("all good\nREADY=1\r\tWATCHDOG=trigger");
        assert_eq!(
            manager.recv(WAIT).unwrap(),
            "STATUS=all good READY=1  WATCHDOG=trigger\n"
        );
        notifier.status(&"é".repeat(1000));
        let long = manager.recv(WAIT).unwrap();
        assert!(
            long.len() <= "STATUS=\n".len() + MAX_STATUS_BYTES,
            "{}",
            long.len()
        );
        assert!(long.ends_with("é\n"));
    }

    #[test]
    fn abstract_socket_names_are_supported() {
        let name = format!("tombstoned-test-{}-abstract", std::process::id());
        let address = abstract_address(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&address).unwrap();
        let env = NotifyEnv::from_vars([(NOTIFY_SOCKET, format!("@{name}"))]);
        let notifier = Notifier::from_notify_env(&env, std::process::id()).unwrap();
        notifier.ready("up");
        socket.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = [0u8; 256];
        let n = socket.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=up\n");
    }

    #[test]
    fn without_notify_socket_everything_is_a_no_op() {
        let env = NotifyEnv::from_vars([("PATH", "/usr/bin"), (WATCHDOG_USEC, "30000000")]);
        assert_eq!(env.notify_socket, None);
        let notifier = Notifier::from_notify_env(&env, std::process::id()).unwrap();
        assert!(!notifier.is_enabled());
        assert!(notifier.send(&[NotifyState::Ready]).is_ok());
        notifier.ready("x");
        notifier.watchdog();
        // Empty NOTIFY_SOCKET is "unset" too, as in libsystemd.
        let env = NotifyEnv::from_vars([(NOTIFY_SOCKET, "")]);
        assert!(!Notifier::from_notify_env(&env, 1).unwrap().is_enabled());
    }

    #[test]
    fn a_relative_or_garbage_socket_address_is_a_typed_error() {
        for bad in ["relative/path", "notify"] {
            let env = NotifyEnv::from_vars([(NOTIFY_SOCKET, bad)]);
            assert!(matches!(
                Notifier::from_notify_env(&env, 1),
                Err(NotifyError::BadSocketAddress(_))
            ));
        }
        let too_long = format!("/{}", "x".repeat(200));
        let env = NotifyEnv::from_vars([(NOTIFY_SOCKET, too_long)]);
        assert!(matches!(
            Notifier::from_notify_env(&env, 1),
            Err(NotifyError::InvalidSocketAddress { .. })
        ));
    }

    #[test]
    fn sending_to_a_vanished_manager_is_an_error_not_a_panic_or_a_hang() {
        let manager = FakeManager::new();
        let notifier = manager.notifier(&[]);
        drop(manager);
        assert!(matches!(
            notifier.send(&[NotifyState::Ready]),
            Err(NotifyError::Send { .. })
        ));
        notifier.ready("still running"); // logged, not fatal
    }

    #[test]
    fn watchdog_interval_is_half_the_timeout_and_honours_watchdog_pid() {
        let manager = FakeManager::new();
        let me = std::process::id().to_string();
        let other = (std::process::id() + 1).to_string();
        let interval = |vars: &[(&str, &str)]| manager.notifier(vars).watchdog_interval();
        assert_eq!(interval(&[]), None);
        assert_eq!(
            interval(&[(WATCHDOG_USEC, "30000000")]),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            interval(&[(WATCHDOG_USEC, "30000000"), (WATCHDOG_PID, &me)]),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            interval(&[(WATCHDOG_USEC, "30000000"), (WATCHDOG_PID, &other)]),
            None
        );
        for (usec, pid) in [("0", None), ("soon", None), ("1000", Some("me"))] {
            let mut vars = vec![
                (
                    NOTIFY_SOCKET.to_owned(),
                    manager.path.as_os_str().to_owned(),
                ),
                (WATCHDOG_USEC.to_owned(), OsString::from(usec)),
            ];
            if let Some(pid) = pid {
                vars.push((WATCHDOG_PID.to_owned(), OsString::from(pid)));
            }
            assert!(matches!(
                Notifier::from_notify_env(&NotifyEnv::from_vars(vars), 1),
                Err(NotifyError::BadWatchdogValue { .. })
            ));
        }
    }

    #[tokio::test]
    async fn no_watchdog_task_without_a_watchdog() {
        let manager = FakeManager::new();
        let shutdown = CancellationToken::new();
        assert!(manager
            .notifier(&[])
            .spawn_watchdog(|| true, shutdown.clone())
            .is_none());
        assert!(Notifier::disabled()
            .spawn_watchdog(|| true, shutdown)
            .is_none());
    }

    /// Pings arrive while healthy, stop while unhealthy, resume when healthy again, and the task
    /// ends on shutdown. Barriers are the health closure's own call count, not sleeps: a call
    /// that *started* after the flip to unhealthy must be followed by no ping.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn watchdog_pings_only_while_healthy_and_stops_on_shutdown() {
        let manager = FakeManager::new();
        // WATCHDOG_USEC = 40ms: a ping every 20ms.
        let notifier = manager.notifier(&[(WATCHDOG_USEC, "40000")]);
        assert_eq!(
            notifier.watchdog_interval(),
            Some(Duration::from_millis(20))
        );
        let healthy = Arc::new(AtomicBool::new(true));
        let calls = Arc::new(AtomicUsize::new(0));
        let shutdown = CancellationToken::new();
        let task = notifier
            .spawn_watchdog(
                {
                    let healthy = healthy.clone();
                    let calls = calls.clone();
                    move || {
                        let h = healthy.load(Ordering::SeqCst);
                        calls.fetch_add(1, Ordering::SeqCst);
                        h
                    }
                },
                shutdown.clone(),
            )
            .unwrap();

        for _ in 0..3 {
            assert_eq!(manager.recv(WAIT).as_deref(), Some("WATCHDOG=1\n"));
        }

        healthy.store(false, Ordering::SeqCst);
        let flipped_at = calls.load(Ordering::SeqCst);
        // Call flipped_at+1 may have read `true` just before the flip; from flipped_at+2 on,
        // every call read `false`. The loop sends before it sleeps, so once call flipped_at+2
        // has happened, every ping of a healthy call is already in the socket.
        wait_for_calls(&calls, flipped_at + 2).await;
        manager.drain();
        let quiet_from = calls.load(Ordering::SeqCst);
        wait_for_calls(&calls, quiet_from + 5).await;
        assert_eq!(
            manager.drain(),
            Vec::<String>::new(),
            "pinged while unhealthy"
        );

        healthy.store(true, Ordering::SeqCst);
        assert_eq!(manager.recv(WAIT).as_deref(), Some("WATCHDOG=1\n"));

        shutdown.cancel();
        tokio::time::timeout(WAIT, task)
            .await
            .expect("the watchdog task ends on shutdown")
            .unwrap();
    }

    async fn wait_for_calls(calls: &AtomicUsize, at_least: usize) {
        let deadline = Instant::now() + WAIT;
        while calls.load(Ordering::SeqCst) < at_least {
            assert!(
                Instant::now() < deadline,
                "watchdog task stopped calling health()"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

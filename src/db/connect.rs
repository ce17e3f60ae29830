//! Opening one PostgreSQL session, for every purpose (dedicated sessions and, through deadpool's
//! [`deadpool_postgres::Connect`], the pool): the hosts of the connection string in order (or
//! shuffled with `load_balance_hosts=random`); each host's attempt — TCP connect, TLS, startup,
//! authentication and the `target_session_attrs` check — bounded as a whole by the connect
//! timeout; keepalives and `TCP_USER_TIMEOUT` on every socket; the password from its source; and
//! a typed, one-line error naming each host's failure.
//!
//! Nothing is added to the startup packet's `options`: poolers such as PgBouncer refuse it;
//! statements name their schema instead ([`super::sql::qualify`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_postgres::config::SslMode as DriverSslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::conninfo::{
    ChannelBinding, ConnInfo, HostKind, LoadBalanceHosts, Secret, SslMode, Target,
    TargetSessionAttrs,
};
use super::credentials::{self, PasswordFileError, PasswordSource};
use super::tls::{Phase, Progress, TlsPlan, TlsSetupError, TrackedTls};

/// TCP keepalive probing, so a peer that vanished is noticed on an idle connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalives {
    /// Idle time before the first probe.
    pub idle: Duration,
    /// Time between probes.
    pub interval: Duration,
    /// Unanswered probes before the connection is dropped.
    pub retries: u32,
}

/// Socket and time bounds of every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectSettings {
    /// Bound on one host's whole attempt (TCP, TLS, startup, authentication, session check).
    pub connect_timeout: Duration,
    /// Keepalive probing, or `None` for the system's default (`keepalives=0` in the URL).
    pub keepalives: Option<Keepalives>,
    /// `TCP_USER_TIMEOUT`: how long sent data may stay unacknowledged before the connection
    /// is dropped, or `None` for the system's default.
    pub tcp_user_timeout: Option<Duration>,
}

impl ConnectSettings {
    /// Defaults derived from `connect_timeout` (a dead peer is noticed in about five times the
    /// connect timeout: idle 2x, then 3 probes 1x apart, and `TCP_USER_TIMEOUT` the same
    /// total), each overridden by the connection string's `keepalives*` and
    /// `tcp_user_timeout`, and the timeout itself by its `connect_timeout`.
    pub fn derive(conninfo: &ConnInfo, connect_timeout: Duration) -> Self {
        let connect_timeout = conninfo.connect_timeout().unwrap_or(connect_timeout);
        let second = Duration::from_secs(1);
        let keepalives = conninfo.keepalives().then(|| Keepalives {
            idle: conninfo
                .keepalives_idle()
                .unwrap_or(connect_timeout.saturating_mul(2).max(second)),
            interval: conninfo
                .keepalives_interval()
                .unwrap_or(connect_timeout.max(second)),
            retries: conninfo.keepalives_count().unwrap_or(3),
        });
        // The kernel takes milliseconds in 32 bits.
        let tcp_user_timeout = conninfo
            .tcp_user_timeout()
            .or_else(|| {
                keepalives.map(|k| k.idle.saturating_add(k.interval.saturating_mul(k.retries)))
            })
            .map(|t| t.min(Duration::from_millis(u64::from(u32::MAX))));
        Self {
            connect_timeout,
            keepalives,
            tcp_user_timeout,
        }
    }
}

/// The server that answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// The host and port (or socket) from the connection string.
    pub target: Target,
    /// The address connected to (TCP only).
    pub address: Option<SocketAddr>,
    /// Whether the session is encrypted.
    pub tls: bool,
}

/// An open session; the connection task ends when the client is dropped.
pub struct Connected {
    /// The client.
    pub client: Client,
    /// The task driving the connection.
    pub task: JoinHandle<()>,
    /// Who answered.
    pub server: ServerInfo,
}

/// Why one host was not used. One line each; never the password.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// Nothing listens there.
    #[error("connection refused")]
    Refused,
    /// The name did not resolve.
    #[error("could not resolve the host name: {0}")]
    Resolve(String),
    /// The network failed in another way (unreachable, reset, closed).
    #[error("{what} during {}", .phase.describe())]
    Network {
        /// The I/O error's description.
        what: String,
        /// Where.
        phase: Phase,
    },
    /// The attempt did not finish within the connect timeout.
    #[error("timed out after {} during {}", humantime::format_duration(*.after), .phase.describe())]
    Timeout {
        /// The phase that was running.
        phase: Phase,
        /// The connect timeout.
        after: Duration,
    },
    /// The server answered the SSL request with "no" while TLS was required.
    #[error("the server does not support SSL, but sslmode={mode} requires it")]
    ServerDoesNotSupportTls {
        /// The mode.
        mode: SslMode,
    },
    /// The certificate chain did not lead to a trusted root.
    #[error("server certificate verify failed: {reason} (trusted roots: {roots})")]
    CertificateNotTrusted {
        /// What rustls found wrong (unknown issuer, expired, ...).
        reason: String,
        /// The root certificates used: a file or "system roots".
        roots: String,
    },
    /// The certificate is valid but for other names.
    #[error(
        "server certificate is for {presented}, not for host name \"{host}\" (sslmode=verify-full)"
    )]
    HostNameMismatch {
        /// The host name connected to.
        host: String,
        /// The names the certificate lists.
        presented: String,
    },
    /// Another TLS failure (an alert from the server, e.g. a refused client certificate).
    #[error("TLS handshake failed: {0}")]
    Tls(String),
    /// The server's pg_hba.conf refuses a connection without TLS.
    #[error(
        "the server refused a connection without TLS ({code}: {message}); its pg_hba.conf \
         allows TLS connections only: set sslmode=require or stronger"
    )]
    PlaintextRejected {
        /// The SQLSTATE (28000).
        code: String,
        /// The server's message.
        message: String,
    },
    /// The server refused the login (pg_hba.conf, a certificate login) over TLS.
    #[error("the server refused the login ({code}: {message})")]
    LoginRejected {
        /// The SQLSTATE.
        code: String,
        /// The server's message.
        message: String,
    },
    /// 28P01.
    #[error("password authentication failed for user \"{user}\" (28P01; password from {from})")]
    PasswordFailed {
        /// The user.
        user: String,
        /// Where the password came from.
        from: PasswordSource,
    },
    /// The server wants a password and there is none.
    #[error(
        "the server asks for a password and none is configured (tried {from}; set one in \
         database.url, database.password_file or a pgpass file)"
    )]
    NoPassword {
        /// Where one was looked for.
        from: PasswordSource,
    },
    /// channel_binding=require without a TLS session.
    #[error("channel_binding=require, but the connection is not encrypted ({why})")]
    ChannelBindingWithoutTls {
        /// Why there is no TLS.
        why: &'static str,
    },
    /// channel_binding=require and the server did not authenticate with SCRAM-SHA-256-PLUS.
    #[error(
        "channel_binding=require, but the server did not authenticate with channel binding \
         (SCRAM-SHA-256-PLUS): its pg_hba.conf method must be scram-sha-256"
    )]
    ChannelBindingNotUsed,
    /// The server does not match `target_session_attrs`.
    #[error("not {wanted}: {found}")]
    WrongSessionAttrs {
        /// What was asked for.
        wanted: &'static str,
        /// What the server is.
        found: &'static str,
    },
    /// Any other server error.
    #[error("server error {code}: {message}")]
    Server {
        /// The SQLSTATE.
        code: String,
        /// The server's message.
        message: String,
    },
    /// The password file could not be read.
    #[error(transparent)]
    PasswordFile(#[from] PasswordFileError),
    /// Another driver error (the driver's words; they never hold the password).
    #[error("{0}")]
    Driver(String),
}

impl AttemptError {
    /// The SQLSTATE of a server error, if this is one.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            AttemptError::PlaintextRejected { code, .. }
            | AttemptError::LoginRejected { code, .. }
            | AttemptError::Server { code, .. } => Some(code),
            AttemptError::PasswordFailed { .. } => Some("28P01"),
            _ => None,
        }
    }
}

/// One host's failure.
#[derive(Debug)]
pub struct HostFailure {
    /// The host.
    pub target: Target,
    /// What happened.
    pub error: AttemptError,
}

/// Why no session could be opened. One line; never the password.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// Every host failed (one entry per attempt, in order).
    #[error("{}", describe(.0))]
    Hosts(Vec<HostFailure>),
    /// The TLS settings cannot be used (a certificate file missing, ...).
    #[error("{0}")]
    TlsSetup(TlsSetupError),
}

fn describe(failures: &[HostFailure]) -> String {
    match failures {
        [one] => format!("{}: {}", one.target, one.error),
        many => format!(
            "no host accepted the connection: {}",
            many.iter()
                .map(|f| format!("{}: {}", f.target, f.error))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

impl ConnectError {
    /// The per-host failures (empty for a setup error).
    pub fn failures(&self) -> &[HostFailure] {
        match self {
            ConnectError::Hosts(f) => f,
            ConnectError::TlsSetup(_) => &[],
        }
    }

    /// Finds a `ConnectError` carried inside a driver error (how the pool's `Connect` returns
    /// ours: deadpool's interface takes only `tokio_postgres::Error`).
    pub fn carried_by(err: &tokio_postgres::Error) -> Option<&ConnectError> {
        let mut source = std::error::Error::source(err);
        while let Some(e) = source {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if let Some(ours) = io.get_ref().and_then(|i| i.downcast_ref::<ConnectError>()) {
                    return Some(ours);
                }
            }
            source = e.source();
        }
        None
    }
}

/// Opens sessions to the database of one connection string.
#[derive(Clone)]
pub struct Connector {
    conninfo: Arc<ConnInfo>,
    startup: tokio_postgres::Config,
    password_source: PasswordSource,
    settings: ConnectSettings,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("conninfo", &self.conninfo.to_string())
            .field("password_source", &self.password_source)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// A connector for `conninfo`. `startup` carries the startup parameters (user, database,
    /// application_name, options, channel_binding) — see [`driver_config`]; its hosts, TLS
    /// mode and password are decided here per attempt.
    pub fn new(
        conninfo: ConnInfo,
        startup: tokio_postgres::Config,
        password_file: Option<PathBuf>,
        settings: ConnectSettings,
    ) -> Self {
        let password_source = credentials::password_source(&conninfo, password_file.as_deref());
        Self {
            conninfo: Arc::new(conninfo),
            startup,
            password_source,
            settings,
        }
    }

    /// The socket and time bounds in use.
    pub fn settings(&self) -> &ConnectSettings {
        &self.settings
    }

    /// Where the password comes from.
    pub fn password_source(&self) -> &PasswordSource {
        &self.password_source
    }

    /// The longest [`Connector::connect`] can take: every host's timeout, twice over for
    /// `target_session_attrs=prefer-standby` (a pass for standbys, then one for any server).
    pub fn worst_case(&self) -> Duration {
        let hosts = u32::try_from(self.conninfo.targets().len()).unwrap_or(u32::MAX);
        let passes = match self.conninfo.target_session_attrs() {
            TargetSessionAttrs::PreferStandby => 2,
            _ => 1,
        };
        self.settings
            .connect_timeout
            .saturating_mul(hosts.saturating_mul(passes))
    }

    /// Opens a session: hosts in order (or shuffled), each bounded by the connect timeout.
    pub async fn connect(&self) -> Result<Connected, ConnectError> {
        let plan = TlsPlan::resolve(&self.conninfo).map_err(ConnectError::TlsSetup)?;
        let tls = plan
            .client_config(&self.conninfo)
            .map_err(ConnectError::TlsSetup)?;
        let mut targets = self.conninfo.targets();
        if self.conninfo.load_balance_hosts() == LoadBalanceHosts::Random {
            shuffle(&mut targets);
        }
        let wanted = self.conninfo.target_session_attrs();
        let passes: &[TargetSessionAttrs] = match wanted {
            TargetSessionAttrs::PreferStandby => {
                &[TargetSessionAttrs::Standby, TargetSessionAttrs::Any]
            }
            _ => std::slice::from_ref(&wanted),
        };
        let mut failures = Vec::new();
        for want in passes {
            for target in &targets {
                let progress = Arc::new(Progress::default());
                let attempt = self.attempt(target, *want, &plan, tls.clone(), &progress);
                let error = match tokio::time::timeout(self.settings.connect_timeout, attempt).await
                {
                    Ok(Ok(connected)) => return Ok(connected),
                    Ok(Err(e)) => e,
                    Err(_) => AttemptError::Timeout {
                        phase: progress.phase(),
                        after: self.settings.connect_timeout,
                    },
                };
                tracing::debug!(host = %target, error = %error, "connection attempt failed");
                failures.push(HostFailure {
                    target: target.clone(),
                    error,
                });
            }
        }
        Err(ConnectError::Hosts(failures))
    }

    /// One host: libpq's sslmode fallbacks (allow: plaintext, then TLS if the server refused;
    /// prefer: TLS, then plaintext if the TLS attempt failed) inside one deadline.
    async fn attempt(
        &self,
        target: &Target,
        want: TargetSessionAttrs,
        plan: &TlsPlan,
        tls: Option<Arc<rustls::ClientConfig>>,
        progress: &Arc<Progress>,
    ) -> Result<Connected, AttemptError> {
        let user = self
            .startup
            .get_user()
            .map(str::to_owned)
            .or_else(credentials::os_user_name)
            .unwrap_or_default();
        let dbname = self
            .startup
            .get_dbname()
            .map_or_else(|| user.clone(), str::to_owned);
        let password = credentials::password_for(
            &self.password_source,
            &self.conninfo,
            target,
            &user,
            &dbname,
        )?;
        let unix = target.socket_path().is_some();
        let channel_binding = self.conninfo.channel_binding();
        // libpq never uses TLS over a Unix socket, whatever sslmode says.
        let modes: &[DriverSslMode] = match (unix, plan.mode) {
            (true, _) | (false, SslMode::Disable) => &[DriverSslMode::Disable],
            (false, SslMode::Allow) => &[DriverSslMode::Disable, DriverSslMode::Require],
            (false, SslMode::Prefer) => &[DriverSslMode::Prefer, DriverSslMode::Disable],
            (false, _) => &[DriverSslMode::Require],
        };
        if channel_binding == ChannelBinding::Require && modes == [DriverSslMode::Disable] {
            return Err(AttemptError::ChannelBindingWithoutTls {
                why: if unix {
                    "Unix-socket connections never use TLS"
                } else {
                    "sslmode=disable"
                },
            });
        }
        let mut first_error = None;
        for (i, mode) in modes.iter().enumerate() {
            let fresh = Arc::new(Progress::default());
            let step_progress = if i == 0 { progress.clone() } else { fresh };
            let result = self
                .handshake(
                    target,
                    *mode,
                    plan,
                    tls.clone(),
                    password.as_ref(),
                    &user,
                    want,
                    &step_progress,
                )
                .await;
            progress.enter(step_progress.phase());
            let error = match result {
                Ok(c) => return Ok(c),
                Err(e) => e,
            };
            let retry = match (plan.mode, *mode) {
                // allow: the server refused plaintext (any server error), so try TLS.
                (SslMode::Allow, DriverSslMode::Disable) => error.sqlstate().is_some(),
                // prefer: TLS was tried and failed (handshake or login), so try plaintext.
                (SslMode::Prefer, DriverSslMode::Prefer) => {
                    step_progress.tls_attempted()
                        && !matches!(error, AttemptError::WrongSessionAttrs { .. })
                }
                _ => false,
            };
            if !retry || i + 1 == modes.len() {
                return Err(match first_error {
                    // Both failed: the TLS attempt's reason is the telling one for prefer,
                    // the plaintext refusal's for allow is already superseded.
                    Some(first) if plan.mode == SslMode::Prefer => first,
                    _ => error,
                });
            }
            first_error.get_or_insert(error);
        }
        Err(first_error.unwrap_or(AttemptError::Driver("no connection attempt made".into())))
    }

    #[allow(clippy::too_many_arguments)]
    async fn handshake(
        &self,
        target: &Target,
        mode: DriverSslMode,
        plan: &TlsPlan,
        tls: Option<Arc<rustls::ClientConfig>>,
        password: Option<&Secret>,
        user: &str,
        want: TargetSessionAttrs,
        progress: &Arc<Progress>,
    ) -> Result<Connected, AttemptError> {
        let mut config = self.startup.clone();
        config.user(user);
        config.ssl_mode(mode);
        if let Some(pw) = password {
            config.password(pw.expose());
        }
        let connector = TrackedTls::new(tls, &target.name(), progress.clone());
        let context = Context {
            target,
            mode,
            sslmode: plan.mode,
            roots: plan.roots.to_string(),
            user,
            has_password: password.is_some(),
            password_source: &self.password_source,
            channel_binding: self.conninfo.channel_binding(),
            progress,
        };
        let (client, task, address) = match target.socket_path() {
            Some(path) => {
                progress.enter(Phase::Connect);
                let stream = tokio::net::UnixStream::connect(&path)
                    .await
                    .map_err(|e| io_error(&e, Phase::Connect))?;
                let (client, task) = startup(stream, connector, &config, &context).await?;
                (client, task, None)
            }
            None => {
                let (stream, address) = self.tcp_connect(target, progress).await?;
                let (client, task) = startup(stream, connector, &config, &context).await?;
                (client, task, Some(address))
            }
        };
        // From here the task runs; abort it if the session is not handed out.
        let task = AbortOnDrop(Some(task));
        progress.enter(Phase::SessionCheck);
        check_session_attrs(&client, want).await?;
        Ok(Connected {
            client,
            task: task.disarm(),
            server: ServerInfo {
                target: target.clone(),
                address,
                tls: progress.tls_established(),
            },
        })
    }

    async fn tcp_connect(
        &self,
        target: &Target,
        progress: &Progress,
    ) -> Result<(tokio::net::TcpStream, SocketAddr), AttemptError> {
        let addresses: Vec<SocketAddr> = match (target.hostaddr, &target.host) {
            (Some(ip), _) => vec![SocketAddr::new(ip, target.port)],
            (None, HostKind::Tcp(name)) => {
                progress.enter(Phase::Resolve);
                tokio::net::lookup_host((name.as_str(), target.port))
                    .await
                    .map_err(|e| AttemptError::Resolve(e.to_string()))?
                    .collect()
            }
            (None, HostKind::Unix(_)) => Vec::new(),
        };
        progress.enter(Phase::Connect);
        let mut last = AttemptError::Resolve("no address".into());
        // Every address of the name, as libpq does, within the same deadline.
        for address in addresses {
            match self.tcp_socket(address).await {
                Ok(stream) => return Ok((stream, address)),
                Err(e) => last = io_error(&e, Phase::Connect),
            }
        }
        Err(last)
    }

    async fn tcp_socket(&self, address: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let socket = match address {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        let sock = socket2::SockRef::from(&socket);
        if let Some(k) = self.settings.keepalives {
            sock.set_tcp_keepalive(
                &socket2::TcpKeepalive::new()
                    .with_time(k.idle)
                    .with_interval(k.interval)
                    .with_retries(k.retries),
            )?;
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Some(t) = self.settings.tcp_user_timeout {
            sock.set_tcp_user_timeout(Some(t))?;
        }
        socket.set_nodelay(true)?;
        socket.connect(address).await
    }
}

/// What classifying a driver error needs to know about the attempt.
struct Context<'a> {
    target: &'a Target,
    mode: DriverSslMode,
    sslmode: SslMode,
    roots: String,
    user: &'a str,
    has_password: bool,
    password_source: &'a PasswordSource,
    channel_binding: ChannelBinding,
    progress: &'a Progress,
}

async fn startup<S>(
    stream: S,
    tls: TrackedTls,
    config: &tokio_postgres::Config,
    context: &Context<'_>,
) -> Result<(Client, JoinHandle<()>), AttemptError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    context.progress.enter(match context.mode {
        DriverSslMode::Disable => Phase::Startup,
        _ => Phase::SslRequest,
    });
    let (client, connection) = config
        .connect_raw(stream, tls)
        .await
        .map_err(|e| classify(&e, context))?;
    if context.channel_binding == ChannelBinding::Require && !context.progress.tls_established() {
        return Err(AttemptError::ChannelBindingWithoutTls {
            why: "the server does not support SSL",
        });
    }
    let task = tokio::spawn(drive(connection));
    Ok((client, task))
}

/// Drives a connection until it ends. The server's notices ("schema ... already exists,
/// skipping") are logged here at DEBUG: awaiting the connection itself would have the driver log
/// them at INFO, through the `log` bridge, with its source file's path on the build machine.
async fn drive<S, T>(mut connection: tokio_postgres::Connection<S, T>)
where
    S: AsyncRead + AsyncWrite + Unpin,
    T: AsyncRead + AsyncWrite + Unpin,
{
    use futures::StreamExt as _;
    let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
    while let Some(message) = messages.next().await {
        match message {
            Ok(tokio_postgres::AsyncMessage::Notice(notice)) => tracing::debug!(
                severity = notice.severity(),
                code = notice.code().code(),
                "server notice: {}",
                notice.message()
            ),
            // Notifications: nothing here LISTENs.
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(error = %e, "database connection ended");
                break;
            }
        }
    }
}

/// Aborts the connection task unless the session is handed out.
struct AbortOnDrop(Option<JoinHandle<()>>);

impl AbortOnDrop {
    fn disarm(mut self) -> JoinHandle<()> {
        match self.0.take() {
            Some(task) => task,
            None => tokio::spawn(async {}),
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

fn io_error(e: &std::io::Error, phase: Phase) -> AttemptError {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => AttemptError::Refused,
        _ => AttemptError::Network {
            what: e.to_string(),
            phase,
        },
    }
}

/// Classifies a driver error by what it carries (SQLSTATE, a rustls error, an I/O error) and
/// what the attempt knows (TLS attempted or not), never by its message text.
fn classify(e: &tokio_postgres::Error, cx: &Context<'_>) -> AttemptError {
    if let Some(db) = e.as_db_error() {
        let code = db.code().code().to_owned();
        let message = db.message().to_owned();
        return if *db.code() == SqlState::INVALID_PASSWORD {
            AttemptError::PasswordFailed {
                user: cx.user.to_owned(),
                from: cx.password_source.clone(),
            }
        } else if *db.code() == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
            if cx.progress.tls_established() {
                AttemptError::LoginRejected { code, message }
            } else {
                AttemptError::PlaintextRejected { code, message }
            }
        } else {
            AttemptError::Server { code, message }
        };
    }
    let mut source = std::error::Error::source(e);
    let mut io_kind = None;
    while let Some(cause) = source {
        let inner: Option<&(dyn std::error::Error + 'static)> =
            match cause.downcast_ref::<std::io::Error>() {
                Some(io) => {
                    io_kind.get_or_insert((io.kind(), io.to_string()));
                    io.get_ref()
                        .map(|i| i as &(dyn std::error::Error + 'static))
                }
                None => Some(cause),
            };
        if let Some(tls) = inner.and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return tls_error(tls, cx);
        }
        source = cause.source();
    }
    let phase = cx.progress.phase();
    if cx.mode == DriverSslMode::Require && !cx.progress.tls_attempted() && io_kind.is_none() {
        // The driver stops before calling the TLS connector only when the server said no.
        return AttemptError::ServerDoesNotSupportTls { mode: cx.sslmode };
    }
    if let Some((kind, text)) = io_kind {
        return match kind {
            std::io::ErrorKind::ConnectionRefused => AttemptError::Refused,
            std::io::ErrorKind::UnexpectedEof => AttemptError::Network {
                what: "the server closed the connection".into(),
                phase,
            },
            _ => AttemptError::Network { what: text, phase },
        };
    }
    if e.is_closed() {
        return AttemptError::Network {
            what: "the server closed the connection".into(),
            phase,
        };
    }
    // What is left failed inside the startup exchange without a server error: the driver
    // refusing to authenticate on its own terms.
    if cx.channel_binding == ChannelBinding::Require {
        return if cx.progress.tls_established() {
            AttemptError::ChannelBindingNotUsed
        } else {
            AttemptError::ChannelBindingWithoutTls {
                why: "the server does not support SSL",
            }
        };
    }
    if !cx.has_password {
        // Its only other such failure is a password it was asked for and does not have.
        return AttemptError::NoPassword {
            from: cx.password_source.clone(),
        };
    }
    AttemptError::Driver(driver_text(e))
}

/// A driver error and its causes on one line (the driver's own text omits its cause).
fn driver_text(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.replace('\n', " ")
}

fn tls_error(e: &rustls::Error, cx: &Context<'_>) -> AttemptError {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::NotValidForNameContext { presented, .. }) => {
            AttemptError::HostNameMismatch {
                host: cx.target.name(),
                presented: if presented.is_empty() {
                    "no host name".to_owned()
                } else {
                    presented
                        .iter()
                        .map(|p| presented_name(p))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            }
        }
        rustls::Error::InvalidCertificate(C::NotValidForName) => AttemptError::HostNameMismatch {
            host: cx.target.name(),
            presented: "other names".to_owned(),
        },
        rustls::Error::InvalidCertificate(reason) => AttemptError::CertificateNotTrusted {
            reason: match reason {
                C::UnknownIssuer => "unknown certificate authority".to_owned(),
                C::Expired | C::ExpiredContext { .. } => "certificate expired".to_owned(),
                C::NotValidYet | C::NotValidYetContext { .. } => {
                    "certificate not valid yet".to_owned()
                }
                other => format!("{other:?}"),
            },
            roots: cx.roots.clone(),
        },
        rustls::Error::AlertReceived(alert) => AttemptError::Tls(format!(
            "the server sent the alert {alert:?} (a client certificate it does not accept?)"
        )),
        other => AttemptError::Tls(other.to_string()),
    }
}

/// rustls lists a certificate's names as `DnsName("db.example")` / `IpAddress(...)`: the name
/// alone reads better in an error message.
fn presented_name(presented: &str) -> String {
    match (presented.find("(\""), presented.rfind("\")")) {
        (Some(start), Some(end)) if start + 2 <= end => presented[start + 2..end].to_owned(),
        _ => presented.to_owned(),
    }
}

/// libpq's target_session_attrs checks, with simple-protocol statements (no prepared
/// statement, so they work through any pooler).
async fn check_session_attrs(
    client: &Client,
    want: TargetSessionAttrs,
) -> Result<(), AttemptError> {
    let show = |sql: &'static str| async move {
        let rows = client
            .simple_query(sql)
            .await
            .map_err(|e| AttemptError::Driver(format!("{sql}: {}", driver_text(&e))))?;
        let value = rows.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        });
        Ok::<_, AttemptError>(value.unwrap_or_default())
    };
    let read_only =
        || async { Ok::<_, AttemptError>(show("SHOW transaction_read_only").await? == "on") };
    let in_recovery =
        || async { Ok::<_, AttemptError>(show("SELECT pg_is_in_recovery()").await? == "t") };
    let (ok, wanted, found) = match want {
        TargetSessionAttrs::Any | TargetSessionAttrs::PreferStandby => return Ok(()),
        TargetSessionAttrs::ReadWrite => (!read_only().await?, "read-write", "read-only"),
        TargetSessionAttrs::ReadOnly => (read_only().await?, "read-only", "read-write"),
        TargetSessionAttrs::Primary => (!in_recovery().await?, "primary", "in recovery (standby)"),
        TargetSessionAttrs::Standby => (in_recovery().await?, "standby", "primary"),
    };
    if ok {
        Ok(())
    } else {
        Err(AttemptError::WrongSessionAttrs { wanted, found })
    }
}

/// Fisher-Yates with std's per-process random hasher keys as the entropy (no RNG crate for a
/// handful of hosts).
fn shuffle<T>(items: &mut [T]) {
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    for i in (1..items.len()).rev() {
        let mut h = state.build_hasher();
        h.write_usize(i);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        let j = usize::try_from(h.finish() % (i as u64 + 1)).unwrap_or(0);
        items.swap(i, j);
    }
}

/// The driver configuration carrying a connection string's startup parameters (and hosts,
/// for tools that connect with tokio-postgres directly, such as the test harness).
pub fn driver_config(conninfo: &ConnInfo) -> tokio_postgres::Config {
    let mut pg = tokio_postgres::Config::new();
    let targets = conninfo.targets();
    let all_have_addr = targets.iter().all(|t| t.hostaddr.is_some());
    for t in &targets {
        match &t.host {
            HostKind::Unix(dir) => {
                pg.host_path(dir);
            }
            HostKind::Tcp(h) if h.is_empty() => {
                pg.host(t.name());
            }
            HostKind::Tcp(h) => {
                pg.host(h);
            }
        }
        if all_have_addr {
            if let Some(ip) = t.hostaddr {
                pg.hostaddr(ip);
            }
        }
        pg.port(t.port);
    }
    if let Some(user) = conninfo.user() {
        pg.user(user);
    }
    if let Some(pw) = conninfo.password() {
        pg.password(pw.expose());
    }
    if let Some(db) = conninfo.dbname() {
        pg.dbname(db);
    }
    if let Some(app) = conninfo
        .application_name()
        .or(conninfo.fallback_application_name())
    {
        pg.application_name(app);
    }
    if let Some(options) = conninfo.options() {
        pg.options(options);
    }
    pg.ssl_mode(match conninfo.sslmode() {
        SslMode::Disable => DriverSslMode::Disable,
        SslMode::Allow | SslMode::Prefer => DriverSslMode::Prefer,
        _ => DriverSslMode::Require,
    });
    pg.channel_binding(match conninfo.channel_binding() {
        ChannelBinding::Disable => tokio_postgres::config::ChannelBinding::Disable,
        ChannelBinding::Prefer => tokio_postgres::config::ChannelBinding::Prefer,
        ChannelBinding::Require => tokio_postgres::config::ChannelBinding::Require,
    });
    if let Some(t) = conninfo.connect_timeout() {
        pg.connect_timeout(t);
    }
    pg
}

/// deadpool's interface: the pool opens its connections through the same [`Connector`]. Its
/// error type is the driver's, so ours travels as the I/O cause of one
/// ([`ConnectError::carried_by`] finds it again); its text is in the driver error's message.
impl deadpool_postgres::Connect for Connector {
    fn connect(
        &self,
        _pg_config: &tokio_postgres::Config,
    ) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        Box::pin(async move {
            match Connector::connect(self).await {
                Ok(c) => Ok((c.client, c.task)),
                Err(e) => Err(carry(e).await),
            }
        })
    }
}

/// Wraps `e` in a driver error: a startup on a stream whose every read and write fails with
/// `e` is the only public way to make one.
async fn carry(e: ConnectError) -> tokio_postgres::Error {
    let stream = FailingStream(Some(std::io::Error::other(e)));
    let mut config = tokio_postgres::Config::new();
    config.user("tombstoned").ssl_mode(DriverSslMode::Disable);
    match config.connect_raw(stream, tokio_postgres::NoTls).await {
        Err(driver_error) => driver_error,
        Ok(_) => unreachable!("a stream that fails every write cannot complete a startup"),
    }
}

struct FailingStream(Option<std::io::Error>);

impl FailingStream {
    fn fail(&mut self) -> std::io::Error {
        self.0
            .take()
            .unwrap_or_else(|| std::io::Error::other("connection failed"))
    }
}

impl AsyncRead for FailingStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(self.fail()))
    }
}

impl AsyncWrite for FailingStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        _: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::task::Poll::Ready(Err(self.fail()))
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Err(self.fail()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_derive_from_connect_timeout_and_the_url_overrides_them() {
        let c = ConnInfo::parse("host=h").unwrap();
        let s = ConnectSettings::derive(&c, Duration::from_secs(5));
        assert_eq!(s.connect_timeout, Duration::from_secs(5));
        let k = s.keepalives.unwrap();
        assert_eq!(
            (k.idle, k.interval, k.retries),
            (Duration::from_secs(10), Duration::from_secs(5), 3)
        );
        assert_eq!(s.tcp_user_timeout, Some(Duration::from_secs(25)));
        let c = ConnInfo::parse(
            "host=h connect_timeout=7 keepalives_idle=60 keepalives_interval=2 \
             keepalives_count=9 tcp_user_timeout=1500",
        )
        .unwrap();
        let s = ConnectSettings::derive(&c, Duration::from_secs(5));
        assert_eq!(s.connect_timeout, Duration::from_secs(7));
        let k = s.keepalives.unwrap();
        assert_eq!(
            (k.idle, k.interval, k.retries),
            (Duration::from_secs(60), Duration::from_secs(2), 9)
        );
        assert_eq!(s.tcp_user_timeout, Some(Duration::from_millis(1500)));
        let c = ConnInfo::parse("host=h keepalives=0").unwrap();
        let s = ConnectSettings::derive(&c, Duration::from_secs(5));
        assert_eq!((s.keepalives, s.tcp_user_timeout), (None, None));
    }

    #[test]
    fn the_worst_case_covers_every_host() {
        let c = ConnInfo::parse("host=a,b,c").unwrap();
        let settings = ConnectSettings::derive(&c, Duration::from_secs(2));
        let conn = Connector::new(c.clone(), driver_config(&c), None, settings);
        assert_eq!(conn.worst_case(), Duration::from_secs(6));
        let c = ConnInfo::parse("host=a,b target_session_attrs=prefer-standby").unwrap();
        let conn = Connector::new(c.clone(), driver_config(&c), None, settings);
        assert_eq!(conn.worst_case(), Duration::from_secs(8));
    }

    #[tokio::test]
    async fn a_carried_error_is_found_again() {
        let e = ConnectError::Hosts(vec![HostFailure {
            target: ConnInfo::parse("host=h").unwrap().targets()[0].clone(),
            error: AttemptError::Refused,
        }]);
        let driver = carry(e).await;
        assert!(
            driver_text(&driver).contains("h:5432: connection refused"),
            "{driver}"
        );
        let found = ConnectError::carried_by(&driver).expect("carried");
        assert!(matches!(found.failures()[0].error, AttemptError::Refused));
        assert_eq!(
            crate::db::classify(&driver),
            crate::db::ErrorClass::Unavailable
        );
    }

    #[test]
    fn shuffle_keeps_every_item() {
        let mut v: Vec<u32> = (0..10).collect();
        shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..10).collect::<Vec<_>>());
    }
}

//! The HTTP server loop both listeners share, with the bounds `axum::serve` lacks: a cap on open
//! connections, a header-read timeout (a half-sent request is closed), an idle timeout (a
//! keep-alive connection without requests is closed), a cheap answer to excess connections, a
//! backed-off accept loop, and a graceful shutdown that is bounded.
//!
//! * **Cap.** At most `max_connections` are open. A connection arriving at the cap evicts the
//!   connection that has been idle longest (no request in flight); when every connection has a
//!   request in flight it is closed at once. So idle connections — however many a client opens —
//!   can never keep a real request out, and the process never runs out of descriptors.
//! * **Header read.** From the first byte of a request (or from the moment the connection is
//!   accepted), its headers must arrive within `header_read_timeout`; a trickle of bytes does not
//!   extend it. The API bounds the body of a POST by the same duration again.
//! * **Idle.** A connection with no request in flight and no byte received for `idle_timeout` is
//!   closed.
//! * **Shutdown.** Accepting stops; idle and half-sent connections close at once; requests in
//!   flight finish (their connections close after the response) within `drain_timeout`, after
//!   which the rest are dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use crate::metrics::Metrics;

/// What a listener answers its requests with: a router, or a service in front of one (the API's
/// [`crate::http`] dispatch). Cloned once per request, so cheap to clone.
pub trait App: Clone + Send + Sync + 'static {
    /// The response to `request`.
    fn respond(
        self,
        request: axum::extract::Request,
    ) -> impl Future<Output = axum::response::Response> + Send;
}

impl App for Router {
    async fn respond(self, request: axum::extract::Request) -> axum::response::Response {
        match self.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}

/// A connection idle for less than this is never evicted: its last response may still be on its
/// way out of the socket.
const EVICTION_MIN_IDLE: Duration = Duration::from_millis(250);
/// How long an arriving connection waits for an evicted one to release its slot.
const EVICTION_WAIT: Duration = Duration::from_millis(500);
/// After shutdown, a connection without a request in flight is closed once its last response is
/// this old (the response has left the socket by then).
const DRAIN_IDLE_GRACE: Duration = Duration::from_millis(200);
/// Back-off after a failed accept (e.g. EMFILE), doubling up to the maximum; one log line per
/// [`ACCEPT_ERROR_LOG_EVERY`] at most.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// The bounds of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// From a request's first byte to the end of its headers.
    pub header_read_timeout: Duration,
    /// Without a request and without a byte received.
    pub idle_timeout: Duration,
    /// How long requests in flight may take to finish after shutdown.
    pub drain_timeout: Duration,
}

/// Which listener (the `listener` label of the connection metrics, and the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerName {
    /// `api.listen`.
    Api,
    /// `metrics.listen`.
    Metrics,
}

impl ListenerName {
    fn label(self) -> &'static str {
        match self {
            ListenerName::Api => "api",
            ListenerName::Metrics => "metrics",
        }
    }
}

/// Why the server closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CloseReason {
    IdleTimeout,
    HeaderTimeout,
    Evicted,
    Refused,
    Shutdown,
}

impl CloseReason {
    fn label(self) -> &'static str {
        match self {
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::HeaderTimeout => "header_timeout",
            CloseReason::Evicted => "evicted",
            CloseReason::Refused => "refused",
            CloseReason::Shutdown => "shutdown",
        }
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` is cancelled, then drains (see
/// the module documentation). Returns when every connection is closed or dropped.
pub async fn serve<A: App>(
    listener: TcpListener,
    app: A,
    limits: ConnectionLimits,
    name: ListenerName,
    metrics: Option<Arc<Metrics>>,
    shutdown: CancellationToken,
) {
    let shared = Arc::new(Shared {
        name,
        limits,
        epoch: Instant::now(),
        permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
        open: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(0),
        metrics,
    });
    if let Some(m) = &shared.metrics {
        m.http_connection_limit
            .with_label_values(&[name.label()])
            .set(i64::try_from(limits.max_connections).unwrap_or(i64::MAX));
    }
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Our own timers bound reading headers (hyper's would also close idle keep-alive
    // connections after the header timeout, and cannot see the HTTP/2 preface phase).
    builder.http1().header_read_timeout(None);
    let mut tasks = JoinSet::new();
    let mut errors = AcceptErrors::default();
    loop {
        while tasks.try_join_next().is_some() {}
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                errors.succeeded();
                stream
            }
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => {
                let out_of_fds = is_out_of_fds(&e);
                let backoff = errors.failed(name, &e);
                if out_of_fds {
                    // Free a descriptor the kindest way: the longest idle connection.
                    shared.evict_one();
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => continue,
                }
            }
        };
        let Some(permit) = shared.admit().await else {
            shared.count_close(CloseReason::Refused);
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            // Responses are small and written at once; without NODELAY a keep-alive client
            // could see delayed-ACK stalls.
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let connection = shared.register();
        tasks.spawn(serve_connection(
            Arc::clone(&shared),
            connection,
            permit,
            stream,
            app.clone(),
            builder.clone(),
            shutdown.clone(),
        ));
    }
    drop(listener);
    let open = tasks.len();
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            listener = name.label(),
            connections = tasks.len(),
            of = open,
            timeout = ?limits.drain_timeout,
            "requests still in flight at the end of the drain; closing their connections"
        );
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// What [`Shared::evict_one`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eviction {
    /// The longest idle connection was asked to close.
    Asked,
    /// Every connection has a request in flight (or is already closing).
    NoneIdle,
    /// The longest idle connection is too young to evict yet.
    OldestIdleFor(Duration),
}

/// What the accept loop and every connection task share.
struct Shared {
    name: ListenerName,
    limits: ConnectionLimits,
    /// Instants are stored as milliseconds since this, in atomics.
    epoch: Instant,
    permits: Arc<Semaphore>,
    /// Open connections, for eviction.
    open: Mutex<HashMap<u64, Arc<Connection>>>,
    next_id: AtomicU64,
    metrics: Option<Arc<Metrics>>,
}

impl Shared {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, ms: u64) -> Instant {
        self.epoch + Duration::from_millis(ms)
    }

    /// A slot for a new connection: free, or made free by evicting the longest idle connection.
    /// When every idle connection is younger than [`EVICTION_MIN_IDLE`] (a client that opened
    /// many at once), the arriving one waits for the oldest to come of age rather than being
    /// turned away; only when every connection has a request in flight is it refused at once.
    async fn admit(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
            return Some(permit);
        }
        match self.evict_one() {
            Eviction::Asked => {}
            Eviction::NoneIdle => return None,
            Eviction::OldestIdleFor(idle) => {
                tokio::time::sleep(EVICTION_MIN_IDLE.saturating_sub(idle)).await;
                if let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() {
                    return Some(permit);
                }
                if self.evict_one() != Eviction::Asked {
                    return None;
                }
            }
        }
        tokio::time::timeout(EVICTION_WAIT, Arc::clone(&self.permits).acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Asks the connection idle longest to close, if it has been idle at least
    /// [`EVICTION_MIN_IDLE`].
    fn evict_one(&self) -> Eviction {
        let now = self.now_ms();
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let oldest = open
            .values()
            .filter(|c| c.in_flight.load(Ordering::Acquire) == 0)
            .filter(|c| !c.evict.load(Ordering::Acquire))
            .map(|c| (c.idle_since_ms.load(Ordering::Acquire), c))
            .min_by_key(|(since, _)| *since)
            .map(|(since, c)| (since, Arc::clone(c)));
        drop(open);
        let Some((since, victim)) = oldest else {
            return Eviction::NoneIdle;
        };
        let idle = Duration::from_millis(now.saturating_sub(since));
        if idle < EVICTION_MIN_IDLE {
            return Eviction::OldestIdleFor(idle);
        }
        victim.evict.store(true, Ordering::Release);
        victim.wake.notify_one();
        Eviction::Asked
    }

    fn register(&self) -> Arc<Connection> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            id,
            epoch: self.epoch,
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            partial_since_ms: AtomicU64::new(NONE),
            evict: AtomicBool::new(false),
            changes: AtomicU64::new(0),
            task: OnceLock::new(),
            wake: Notify::new(),
        });
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, Arc::clone(&connection));
        if let Some(m) = &self.metrics {
            m.http_connections
                .with_label_values(&[self.name.label()])
                .inc();
        }
        connection
    }

    fn unregister(&self, connection: &Connection) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&connection.id);
        if let Some(m) = &self.metrics {
            m.http_connections
                .with_label_values(&[self.name.label()])
                .dec();
        }
    }

    fn count_close(&self, reason: CloseReason) {
        if let Some(m) = &self.metrics {
            m.http_connections_closed
                .with_label_values(&[self.name.label(), reason.label()])
                .inc();
        }
    }
}

/// `partial_since_ms` when no byte of a next request has arrived.
const NONE: u64 = u64::MAX;

/// One connection's state, as its requests and its socket see it.
struct Connection {
    id: u64,
    /// [`Shared::epoch`], for the clock readings below.
    epoch: Instant,
    /// Requests whose response has not been written out yet.
    in_flight: AtomicUsize,
    /// When the last request finished (or the connection was accepted).
    idle_since_ms: AtomicU64,
    /// When the first byte arrived while no request was in flight ([`NONE`] if none did).
    partial_since_ms: AtomicU64,
    /// Set by the accept loop to make room.
    evict: AtomicBool,
    /// Counts the changes that move the connection's deadline: a request ended, a first byte
    /// arrived ([`Connection::changed`]).
    changes: AtomicU64,
    /// The task serving the connection, once it runs.
    task: OnceLock<tokio::task::Id>,
    /// Wakes the connection's task: a change from another task, eviction.
    wake: Notify,
}

impl Connection {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A change that may move the connection's deadline. Made inside the connection's own task
    /// (HTTP/1: hyper reads the socket and runs the service within that task's poll), the
    /// task's loop sees it as soon as the poll returns ([`serve_connection`]); waking the
    /// running task instead would make the runtime reschedule it and wake another worker thread
    /// for it — two per request, for nothing. From any other task (HTTP/2 runs each stream in a
    /// task of its own) the connection's task is woken.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
        let own_task = tokio::task::try_id().is_some_and(|id| self.task.get() == Some(&id));
        if !own_task {
            self.wake.notify_one();
        }
    }

    fn request_started(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.partial_since_ms.store(NONE, Ordering::Release);
        RequestGuard {
            connection: Arc::clone(self),
        }
    }
}

/// Counts a request in flight from the call of the service until its response body has been
/// handed over completely (or dropped).
struct RequestGuard {
    connection: Arc<Connection>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let c = &self.connection;
        if c.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            c.idle_since_ms.store(c.now_ms(), Ordering::Release);
            c.partial_since_ms.store(NONE, Ordering::Release);
            c.changed();
        }
    }
}

/// Serves one connection until it ends, times out, is evicted or the drain closes it.
async fn serve_connection<A: App>(
    shared: Arc<Shared>,
    connection: Arc<Connection>,
    permit: OwnedSemaphorePermit,
    stream: TcpStream,
    app: A,
    builder: auto::Builder<TokioExecutor>,
    shutdown: CancellationToken,
) {
    if let Some(id) = tokio::task::try_id() {
        // Set once: a connection is served by one task.
        let _ = connection.task.set(id);
    }
    let io = TokioIo::new(Tracked {
        inner: stream,
        connection: Arc::clone(&connection),
    });
    let service = {
        let connection = Arc::clone(&connection);
        hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let guard = connection.request_started();
            let app = app.clone();
            async move {
                let response = app.respond(request.map(Body::new)).await;
                // The guard lives as long as the body: the request counts as in flight until
                // hyper has taken the whole response (or dropped it).
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _in_flight = &guard;
                        frame
                    }))
                }))
            }
        })
    };
    // Boxed so that it (and its socket) can be dropped before the slot is given back.
    let mut served = Box::pin(builder.serve_connection(io, service));
    let mut drain_started: Option<Instant> = None;
    let reason = loop {
        let seen = connection.changes.load(Ordering::Acquire);
        let deadline = connection_deadline(&shared, &connection, drain_started);
        let sleep = async {
            match deadline {
                Some((at, _)) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending::<()>().await,
            }
        };
        // The connection, or the news that its own task changed the deadline while serving it.
        let served_or_changed = std::future::poll_fn(|cx| match served.as_mut().poll(cx) {
            Poll::Ready(result) => Poll::Ready(Some(result)),
            Poll::Pending if connection.changes.load(Ordering::Acquire) != seen => {
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        });
        tokio::select! {
            step = served_or_changed => {
                // Changed: compute the deadline again.
                let Some(result) = step else { continue };
                if let Err(e) = result {
                    tracing::debug!(listener = shared.name.label(), error = %e, "connection ended with an error");
                }
                // Closed by the client, or by hyper once the drain let its last response out.
                break drain_started.map(|_| CloseReason::Shutdown);
            }
            _ = connection.wake.notified() => {
                if connection.evict.swap(false, Ordering::AcqRel)
                    && connection.in_flight.load(Ordering::Acquire) == 0
                {
                    break Some(CloseReason::Evicted);
                }
            }
            _ = sleep => {
                // Re-read: a request may have started since the deadline was computed.
                if let Some((at, reason)) = connection_deadline(&shared, &connection, drain_started) {
                    if Instant::now() >= at {
                        break Some(reason);
                    }
                }
            }
            _ = shutdown.cancelled(), if drain_started.is_none() => {
                served.as_mut().graceful_shutdown();
                drain_started = Some(Instant::now());
            }
        }
    };
    if let Some(reason) = reason {
        shared.count_close(reason);
        tracing::debug!(
            listener = shared.name.label(),
            reason = reason.label(),
            "closing connection"
        );
    }
    shared.unregister(&connection);
    drop(served);
    drop(permit);
}

/// When the connection must be closed next if nothing changes, and why; `None` while a request is
/// in flight (its end wakes the task).
fn connection_deadline(
    shared: &Shared,
    c: &Connection,
    drain_started: Option<Instant>,
) -> Option<(Instant, CloseReason)> {
    if c.in_flight.load(Ordering::Acquire) > 0 {
        return None;
    }
    let idle_since = shared.at(c.idle_since_ms.load(Ordering::Acquire));
    if let Some(drain) = drain_started {
        return Some((
            idle_since.max(drain) + DRAIN_IDLE_GRACE,
            CloseReason::Shutdown,
        ));
    }
    let partial = c.partial_since_ms.load(Ordering::Acquire);
    if partial != NONE {
        let since = shared.at(partial);
        return Some((
            since + shared.limits.header_read_timeout,
            CloseReason::HeaderTimeout,
        ));
    }
    Some((
        idle_since + shared.limits.idle_timeout,
        CloseReason::IdleTimeout,
    ))
}

/// The socket, noting the first byte of each request that arrives while the connection is idle.
struct Tracked {
    inner: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let c = &self.connection;
            if c.in_flight.load(Ordering::Acquire) == 0
                && c.partial_since_ms.load(Ordering::Acquire) == NONE
            {
                c.partial_since_ms.store(c.now_ms(), Ordering::Release);
                c.changed();
            }
        }
        result
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// An accept error that concerns one connection only (the peer gave up before we accepted).
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    )
}

/// EMFILE or ENFILE: the process or the system is out of file descriptors.
fn is_out_of_fds(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == nix::errno::Errno::EMFILE as i32 || code == nix::errno::Errno::ENFILE as i32
    )
}

/// Backs off failed accepts and keeps them from flooding the log.
#[derive(Default)]
struct AcceptErrors {
    backoff: Option<Duration>,
    last_logged: Option<Instant>,
    suppressed: u64,
}

impl AcceptErrors {
    fn succeeded(&mut self) {
        self.backoff = None;
    }

    /// Logs (at most once per [`ACCEPT_ERROR_LOG_EVERY`]) and returns how long to wait.
    fn failed(&mut self, name: ListenerName, e: &io::Error) -> Duration {
        let now = Instant::now();
        if self
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= ACCEPT_ERROR_LOG_EVERY)
        {
            tracing::warn!(
                listener = name.label(),
                error = %e,
                repeats_not_logged = self.suppressed,
                "accept failed; backing off"
            );
            self.last_logged = Some(now);
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
        let next = self
            .backoff
            .map_or(ACCEPT_BACKOFF_MIN, |b| (b * 2).min(ACCEPT_BACKOFF_MAX));
        self.backoff = Some(next);
        next
    }
}

//! A TCP proxy for database-fault tests, reusable by any test that needs a database that stops
//! answering: it forwards bytes both ways and can be told to go *silent* — stop forwarding
//! WITHOUT closing anything, as a lost NAT entry, a partition behind a proxy that still
//! acknowledges, or a hung server look to a client — either for the connections already open
//! (new ones work: [`SilentProxy::silence_open`]) or for every connection, new ones included
//! ([`SilentProxy::silence_all`]); and to resume ([`SilentProxy::resume`]). Bytes read while
//! silent are held, not dropped, and delivered on resume. Dropping the proxy closes everything.

#![allow(dead_code)] // each fault test uses a different subset

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Which connections are silent.
#[derive(Debug, Clone, Copy, Default)]
struct Mode {
    /// Connections with an id below this are silent (those open when it was set).
    silent_below: u64,
    /// Every connection is silent, new ones included.
    all: bool,
}

impl Mode {
    fn silences(&self, id: u64) -> bool {
        self.all || id < self.silent_below
    }
}

/// The proxy: listens on `127.0.0.1:port`, forwards to `127.0.0.1:upstream`.
pub struct SilentProxy {
    /// The port to connect to instead of the upstream's.
    pub port: u16,
    mode: watch::Sender<Mode>,
    next_id: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    stalled: Arc<AtomicU64>,
    _stop: DropGuard,
}

impl SilentProxy {
    /// Starts a proxy to `127.0.0.1:upstream`, forwarding.
    pub async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (mode, _) = watch::channel(Mode::default());
        let next_id = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let stalled = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (tx, ids, count, stalls, token) = (
            mode.clone(),
            next_id.clone(),
            accepted.clone(),
            stalled.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            loop {
                let client = tokio::select! {
                    _ = token.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((client, _)) => client,
                        Err(_) => continue,
                    },
                };
                count.fetch_add(1, Ordering::SeqCst);
                let id = ids.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue; // drops the client: refused, as the upstream was
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let link = token.child_token();
                tokio::spawn(pump(
                    client_read,
                    server_write,
                    id,
                    tx.subscribe(),
                    link.clone(),
                    Some(stalls.clone()),
                ));
                tokio::spawn(pump(
                    server_read,
                    client_write,
                    id,
                    tx.subscribe(),
                    link,
                    None,
                ));
            }
        });
        SilentProxy {
            port,
            mode,
            next_id,
            accepted,
            stalled,
            _stop: stop.drop_guard(),
        }
    }

    /// The connections open now go silent; new ones are forwarded.
    pub fn silence_open(&self) {
        let below = self.next_id.load(Ordering::SeqCst);
        self.mode.send_modify(|m| m.silent_below = below);
    }

    /// Every connection goes silent, new ones too (they are accepted, then nothing answers).
    pub fn silence_all(&self) {
        self.mode.send_modify(|m| m.all = true);
    }

    /// Everything is forwarded again, held bytes first.
    pub fn resume(&self) {
        self.mode.send_replace(Mode::default());
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }

    /// How many times a client sent something while its connection was silent (held, never
    /// answered): a client now waiting on the silent database.
    pub fn stalled(&self) -> u64 {
        self.stalled.load(Ordering::SeqCst)
    }

    /// Waits until `counter` (e.g. [`Self::accepted`], [`Self::stalled`]) has passed `seen`;
    /// fails with `what` after 10 s.
    pub async fn wait_past(&self, counter: fn(&Self) -> u64, seen: u64, what: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while counter(self) <= seen {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// `url` (a key=value connection string naming `port=<upstream>`) rewritten to go through
    /// the proxy, in plaintext: the proxy forwards bytes, so TLS would work too, but tests
    /// read clearer without the SSLRequest round trip.
    pub fn url(&self, url: &str, upstream: u16) -> String {
        let proxied = url.replace(
            &format!("port={upstream}"),
            &format!("port={} sslmode=disable", self.port),
        );
        assert_ne!(proxied, url, "the URL names port={upstream}");
        proxied
    }
}

async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    id: u64,
    mut mode: watch::Receiver<Mode>,
    link: CancellationToken,
    stalled: Option<Arc<AtomicU64>>,
) {
    let stall = || {
        if let Some(stalled) = &stalled {
            stalled.fetch_add(1, Ordering::SeqCst);
        }
    };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = link.cancelled() => break,
            read = async {
                // Silent: nothing is read, so nothing is acknowledged beyond the socket buffers;
                // bytes that arrive meanwhile are a stalled request.
                if mode.borrow().silences(id) {
                    let resumed = tokio::select! {
                        resumed = mode.wait_for(|m| !m.silences(id)) => resumed.is_ok(),
                        ready = from.readable() => {
                            if ready.is_ok() {
                                stall();
                            }
                            false
                        }
                    };
                    if !resumed {
                        let _ = mode.wait_for(|m| !m.silences(id)).await;
                    }
                }
                from.read(&mut buf).await
            } => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
        };
        // Went silent while the read was pending: hold the bytes until resumed.
        let forwarded = tokio::select! {
            _ = link.cancelled() => break,
            written = async {
                if mode.borrow().silences(id) {
                    stall();
                }
                let _ = mode.wait_for(|m| !m.silences(id)).await;
                to.write_all(&buf[..n]).await
            } => written,
        };
        if forwarded.is_err() {
            break;
        }
    }
    // One direction ended (or the proxy stopped): end the other, closing both sockets.
    link.cancel();
}

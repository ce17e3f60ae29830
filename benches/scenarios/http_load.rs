//! HTTP load generators for scenarios 3 and 4, on hyper's bare HTTP/1.1 client connections
//! (keep-alive, TCP_NODELAY, no pool logic in the hot path).
//!
//! * [`closed_loop`]: `clients` tasks, each with its own connection, each sending its next
//!   request as soon as the previous answer is read — the API's throughput at that concurrency.
//! * [`open_loop`]: requests sent on a fixed schedule whatever the answers do; latency is
//!   measured from the *scheduled* send time, so a stall shows in the percentiles instead of
//!   silently slowing the generator down (no coordinated omission).
//!
//! Every answer is checked against what the protocol says it must be ([`Expect`]); anything else
//! is an error and counted by kind.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::stats::{Latency, Rng};

/// How long one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    sender: SendRequest<Full<Bytes>>,
}

/// An answer.
pub struct Response {
    /// Status code.
    pub status: u16,
    /// `Idempotent-Replayed: true` was present.
    pub replayed: bool,
    /// The body.
    pub body: Bytes,
}

impl Conn {
    /// Connects (TCP_NODELAY on).
    pub async fn connect(addr: SocketAddr) -> Result<Conn> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake")?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn { sender })
    }

    /// Sends one request and reads the whole answer.
    pub async fn send(&mut self, request: Request<Full<Bytes>>) -> Result<Response> {
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Response {
            status: parts.status.as_u16(),
            replayed: parts
                .headers
                .get("idempotent-replayed")
                .is_some_and(|v| v.as_bytes() == b"true"),
            body,
        })
    }

    /// `GET path`.
    pub async fn get(&mut self, path: &str) -> Result<Response> {
        let request = Request::get(path)
            .header(hyper::header::HOST, "127.0.0.1")
            .body(Full::new(Bytes::new()))?;
        self.send(request).await
    }
}

/// `POST /v1/orders` with a bearer token, an idempotency key and a JSON body.
pub fn post_order(token: &str, key: &str, body: String) -> Request<Full<Bytes>> {
    Request::post("/v1/orders")
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header("idempotency-key", key)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a request built from valid header values")
}

/// The answer the protocol requires.
#[derive(Debug, Clone)]
pub enum Expect {
    /// 201, not a replay (a new key).
    Created,
    /// 201 with `Idempotent-Replayed: true`, the stored body (which names this request_id).
    Replayed(String),
    /// 410 `replay-window-expired` (same intent, past the replay window).
    Expired,
}

impl Expect {
    /// `None` when `r` is the required answer, else the error kind.
    fn judge(&self, r: &Response) -> Option<String> {
        let ok = match self {
            Expect::Created => r.status == 201 && !r.replayed,
            Expect::Replayed(request_id) => {
                r.status == 201 && r.replayed && memchr_find(&r.body, request_id.as_bytes())
            }
            Expect::Expired => r.status == 410 && memchr_find(&r.body, b"replay-window-expired"),
        };
        (!ok).then(|| {
            format!(
                "status {}{}",
                r.status,
                if r.status == 201 {
                    " (wrong body or header)"
                } else {
                    ""
                }
            )
        })
    }
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A request to send and the answer it must get.
pub type Make =
    Arc<dyn Fn(u64, &mut Rng) -> (Request<Full<Bytes>>, Expect, &'static str) + Send + Sync>;

/// What a load run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadResult {
    /// Requests completed inside the measured window (all, correct or not).
    pub completed: u64,
    /// Length of the measured window, seconds.
    pub seconds: f64,
    /// `completed / seconds`.
    pub per_second: f64,
    /// Latency of every completed request.
    pub latency: Latency,
    /// Latency per request class (e.g. "live", "cleaning").
    pub latency_by_class: BTreeMap<String, Latency>,
    /// Requests per class.
    pub count_by_class: BTreeMap<String, u64>,
    /// Answers that were not the required one, transport errors and timeouts, by kind.
    pub errors: BTreeMap<String, u64>,
    /// Total errors.
    pub error_count: u64,
}

#[derive(Default)]
struct Tally {
    micros: Vec<u64>,
    by_class: BTreeMap<&'static str, Vec<u64>>,
    errors: BTreeMap<String, u64>,
}

impl Tally {
    fn record(&mut self, class: &'static str, micros: u64, error: Option<String>) {
        self.micros.push(micros);
        self.by_class.entry(class).or_default().push(micros);
        if let Some(kind) = error {
            *self.errors.entry(kind).or_default() += 1;
        }
    }

    fn merge(&mut self, other: Tally) {
        self.micros.extend(other.micros);
        for (k, v) in other.by_class {
            self.by_class.entry(k).or_default().extend(v);
        }
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
    }

    fn finish(self, seconds: f64) -> LoadResult {
        let completed = self.micros.len() as u64;
        let error_count = self.errors.values().sum();
        LoadResult {
            completed,
            seconds,
            per_second: completed as f64 / seconds,
            latency: Latency::of_micros(self.micros),
            count_by_class: self
                .by_class
                .iter()
                .map(|(k, v)| (k.to_string(), v.len() as u64))
                .collect(),
            latency_by_class: self
                .by_class
                .into_iter()
                .map(|(k, v)| (k.to_string(), Latency::of_micros(v)))
                .collect(),
            errors: self.errors,
            error_count,
        }
    }
}

async fn exchange(
    conn: &mut Conn,
    request: Request<Full<Bytes>>,
    expect: &Expect,
) -> Result<Option<String>, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, conn.send(request)).await {
        Ok(Ok(response)) => Ok(expect.judge(&response)),
        Ok(Err(e)) => Err(format!("transport: {e}")),
        Err(_) => Err("timeout".to_owned()),
    }
}

/// `clients` closed-loop clients for `warmup + duration`; requests started during the warm-up
/// are not counted. Client `c` gets requests from `make(c, rng)`.
pub async fn closed_loop(
    addr: SocketAddr,
    clients: usize,
    warmup: Duration,
    duration: Duration,
    make: Make,
) -> Result<LoadResult> {
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(Conn::connect(addr).await?);
    }
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let mut tasks = Vec::new();
    for (c, mut conn) in conns.into_iter().enumerate() {
        let make = make.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng::new(0x5EED ^ c as u64);
            let mut tally = Tally::default();
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let (request, expect, class) = make(c as u64, &mut rng);
                let outcome = exchange(&mut conn, request, &expect).await;
                let micros = t0.elapsed().as_micros() as u64;
                let broken = outcome.is_err();
                if t0 >= measure_from {
                    tally.record(class, micros, outcome.unwrap_or_else(Some));
                }
                if broken {
                    // A failed connection is replaced, as a real client would.
                    match Conn::connect(addr).await {
                        Ok(c) => conn = c,
                        Err(_) => break,
                    }
                }
            }
            tally
        }));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await?);
    }
    Ok(tally.finish(duration.as_secs_f64()))
}

/// `count` requests, one after the other on one connection (the profiles' fixed amount of work:
/// the same count gives the same instruction count however busy the machine is), each from
/// `make(0, rng)` (client 0).
pub async fn sequential(addr: SocketAddr, count: u64, make: Make) -> Result<LoadResult> {
    let mut conn = Conn::connect(addr).await?;
    let mut rng = Rng::new(0x5E9_0E47);
    let mut tally = Tally::default();
    let start = Instant::now();
    for _ in 0..count {
        let t0 = Instant::now();
        let (request, expect, class) = make(0, &mut rng);
        let outcome = exchange(&mut conn, request, &expect).await;
        let broken = outcome.is_err();
        tally.record(
            class,
            t0.elapsed().as_micros() as u64,
            outcome.unwrap_or_else(Some),
        );
        if broken {
            conn = Conn::connect(addr).await?;
        }
    }
    Ok(tally.finish(start.elapsed().as_secs_f64()))
}

/// `rate` requests per second for `duration`, on a schedule. Request `k` is `make(k, rng)`.
/// Connections come from a small pool that grows when every connection is busy.
pub async fn open_loop(
    addr: SocketAddr,
    rate: u64,
    duration: Duration,
    make: Make,
) -> Result<LoadResult> {
    let pool: Arc<Mutex<Vec<Conn>>> = Arc::new(Mutex::new(Vec::new()));
    for _ in 0..8 {
        let conn = Conn::connect(addr).await?;
        pool.lock().expect("pool").push(conn);
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let period = Duration::from_nanos(1_000_000_000 / rate.max(1));
    let start = tokio::time::Instant::now();
    let mut rng = Rng::new(0x0FE7_100F);
    let mut tasks = Vec::new();
    for k in 0u64.. {
        let at = start + period * k as u32;
        if at >= start + duration {
            break;
        }
        tokio::time::sleep_until(at).await;
        let (request, expect, class) = make(k, &mut rng);
        let pool = pool.clone();
        let tally = tally.clone();
        tasks.push(tokio::spawn(async move {
            let pooled = pool.lock().expect("pool").pop();
            let conn = match pooled {
                Some(c) => Ok(c),
                None => Conn::connect(addr).await,
            };
            let (outcome, conn) = match conn {
                Ok(mut conn) => {
                    let outcome = exchange(&mut conn, request, &expect).await;
                    let keep = outcome.is_ok();
                    (outcome, keep.then_some(conn))
                }
                Err(e) => (Err(format!("connect: {e}")), None),
            };
            let micros = at.elapsed().as_micros() as u64;
            if let Some(conn) = conn {
                pool.lock().expect("pool").push(conn);
            }
            tally
                .lock()
                .expect("tally")
                .record(class, micros, outcome.unwrap_or_else(Some));
        }));
    }
    for task in tasks {
        task.await?;
    }
    let tally = std::mem::take(&mut *tally.lock().expect("tally"));
    Ok(tally.finish(duration.as_secs_f64()))
}

/// Normalises error texts so they group (a transport error's details vary).
pub fn error_kinds(errors: &BTreeMap<String, u64>) -> String {
    if errors.is_empty() {
        return "none".to_owned();
    }
    errors
        .iter()
        .map(|(k, v)| format!("{v} × {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

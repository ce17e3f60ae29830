//! The export of ended spans, which never makes the service wait: a bounded queue ([`Queue`]:
//! a span that ends joins it), one background task that sends it in batches to the collector
//! over OTLP/HTTP with protobuf ([`Exporter`]), and the account of every span dropped on the way
//! ([`Drops`]) — the queue full, or an export that failed or did not finish in time — counted in
//! `tombstoned_trace_spans_dropped_total` and logged at most once a minute.
//!
//! The sizes are the OpenTelemetry specification's defaults for a batch span processor; unlike
//! the SDK's `BatchSpanProcessor`, every drop is counted where the daemon shows it, and the
//! export runs on the runtime, with the relay's async reqwest.

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message as _;
use reqwest::Url;
use tokio::sync::{mpsc, oneshot, Notify};

use super::span::Record;
use super::TelemetryError;
use crate::config::TracingConfig;

/// Spans waiting for export at most; one more is dropped (OTEL_BSP_MAX_QUEUE_SIZE's default).
pub(super) const QUEUE_CAPACITY: usize = 2048;
/// Spans per export request at most (OTEL_BSP_MAX_EXPORT_BATCH_SIZE's default); a queue that
/// holds that many is sent at once.
const MAX_BATCH: usize = 512;
/// How long a span waits for its batch at most when traffic is light.
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// Bound on one export, connect to the end of the answer (OTEL_EXPORTER_OTLP_TIMEOUT's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Drops are logged at most this often (their count, always).
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// How much of a collector's answer is read: the partial success message is small.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// The queue between the spans' ends and the export task: the ended spans already encoded,
/// in batches of at most [`MAX_BATCH`].
///
/// A span is encoded where it ends, on the request's thread, and its record freed there: so the
/// thread that allocated a span's record, attributes and texts frees them too, which the
/// allocator does cheaply (handed to the export task they were freed on another thread, in
/// bulk, and every request then allocated from an emptied cache). The export task only adds a
/// header to a batch's bytes.
#[derive(Debug)]
pub(super) struct Queue {
    batches: Mutex<Batches>,
    /// How many spans are queued (what `batches` counts, readable without the lock): a span
    /// that would be dropped is not encoded first.
    queued: AtomicUsize,
    /// The bytes each batch keeps free for the request's header ([`Encoder::header_room`]).
    ///
    /// [`Encoder::header_room`]: super::otlp::Encoder::header_room
    header_room: usize,
    /// Wakes the task when a whole batch is waiting (not for every span: a wake-up per span
    /// would cost every request a thread hop).
    full_batch: Notify,
    /// Spans of the export on the wire now (dropped too if shutdown cannot wait for it).
    in_flight: AtomicU64,
    drops: Arc<Drops>,
}

#[derive(Debug, Default)]
struct Batches {
    spans: usize,
    /// Oldest first; only the last one is still filling.
    list: VecDeque<Batch>,
}

/// Encoded spans for one export request.
#[derive(Debug)]
struct Batch {
    spans: usize,
    /// The header's room, then each span's `ScopeSpans.spans` field.
    bytes: Vec<u8>,
}

thread_local! {
    /// Where a span is encoded before it joins its batch (outside the lock); kept, so that it
    /// is not allocated again for every span.
    static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

impl Queue {
    /// The oldest batch; `None` when nothing is queued.
    fn take(&self) -> Option<Batch> {
        let mut batches = self.batches.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = batches.list.pop_front()?;
        batches.spans -= batch.spans;
        self.queued.store(batches.spans, Ordering::Relaxed);
        Some(batch)
    }

    fn len(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// An ended span joins the queue, encoded; or is dropped (counted) when the queue is full.
    pub(super) fn push(&self, record: &mut Record) {
        if self.len() >= QUEUE_CAPACITY {
            return self.full();
        }
        let mut message = SCRATCH.try_with(Cell::take).unwrap_or_default();
        message.clear();
        super::otlp::span(&mut message, record);
        let queued = {
            let mut batches = self.batches.lock().unwrap_or_else(PoisonError::into_inner);
            let batches = &mut *batches;
            if batches.spans >= QUEUE_CAPACITY {
                None
            } else {
                if !matches!(batches.list.back(), Some(last) if last.spans < MAX_BATCH) {
                    // Room for the header, and for the spans of a busy second (each growth
                    // copies the batch).
                    let mut bytes = Vec::with_capacity(self.header_room + 64 * 1024);
                    bytes.resize(self.header_room, 0);
                    batches.list.push_back(Batch { spans: 0, bytes });
                }
                batches.list.back_mut().map(|batch| {
                    super::otlp::append_span(&mut batch.bytes, &message);
                    batch.spans += 1;
                    batches.spans += 1;
                    self.queued.store(batches.spans, Ordering::Relaxed);
                    batch.spans
                })
            }
        };
        let _ = SCRATCH.try_with(|scratch| scratch.set(message));
        match queued {
            None => self.full(),
            Some(MAX_BATCH) => self.full_batch.notify_one(),
            Some(_) => {}
        }
    }

    fn full(&self) {
        self.drops.add(1, || {
            format!("the export queue is full ({QUEUE_CAPACITY} spans)")
        });
    }
}

/// Every span dropped: counted (the metric, when the daemon gave one) and logged at most once
/// a minute with how many since the last line and why.
#[derive(Debug)]
struct Drops {
    total: AtomicU64,
    counter: Option<prometheus::IntCounter>,
    log: Mutex<DropLog>,
}

#[derive(Debug, Default)]
struct DropLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl Drops {
    fn add(&self, n: u64, reason: impl FnOnce() -> String) {
        if n == 0 {
            return;
        }
        self.total.fetch_add(n, Ordering::Relaxed);
        if let Some(counter) = &self.counter {
            counter.inc_by(n);
        }
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.unlogged += n;
        if log.last.is_none_or(|t| t.elapsed() >= DROP_LOG_INTERVAL) {
            tracing::warn!(
                dropped = log.unlogged,
                dropped_total = self.total.load(Ordering::Relaxed),
                reason = %reason(),
                "trace spans dropped (tombstoned_trace_spans_dropped_total); requests are not \
                 affected. Logged at most once a minute"
            );
            log.last = Some(Instant::now());
            log.unlogged = 0;
        }
    }

    /// At shutdown: the drops not yet logged, in one last line.
    fn log_rest(&self) {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        if log.unlogged > 0 {
            tracing::warn!(
                dropped = log.unlogged,
                dropped_total = self.total.load(Ordering::Relaxed),
                "trace spans dropped since the last report"
            );
            log.unlogged = 0;
        }
    }
}

/// OTLP/HTTP with protobuf: one POST of an `ExportTraceServiceRequest` per batch to
/// `<endpoint>/v1/traces`, with the configured headers.
pub(super) struct Exporter {
    http: reqwest::Client,
    url: Url,
    headers: reqwest::header::HeaderMap,
    encoder: super::otlp::Encoder,
}

/// Why an export did not deliver its spans.
enum ExportFailure {
    /// The collector answered with this status.
    Status(u16),
    /// No complete answer within [`EXPORT_TIMEOUT`].
    Timeout,
    /// No connection, TLS, or the connection broke.
    Connection(String),
}

impl ExportFailure {
    fn reason(&self) -> String {
        match self {
            ExportFailure::Status(status) => format!("the collector answered HTTP {status}"),
            ExportFailure::Timeout => format!(
                "the collector did not answer within {}",
                humantime::format_duration(EXPORT_TIMEOUT)
            ),
            ExportFailure::Connection(reason) => format!("cannot reach the collector: {reason}"),
        }
    }
}

impl Exporter {
    /// The HTTP client: TLS verified against the system roots, or against `tracing.ca_file`
    /// alone (as the relay's `outbox.ca_file`); no redirects (the headers are credentials).
    pub(super) fn new(
        config: &TracingConfig,
        url: Url,
        resource: &[KeyValue],
    ) -> Result<Self, TelemetryError> {
        let mut builder = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(EXPORT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tombstoned/", env!("CARGO_PKG_VERSION")))
            .pool_max_idle_per_host(1);
        if let Some(ca_file) = &config.ca_file {
            let ca_error = |reason: String| TelemetryError::CaFile {
                path: ca_file.clone(),
                reason,
            };
            let pem = std::fs::read(ca_file).map_err(|e| ca_error(e.to_string()))?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .ok()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| ca_error("no PEM certificate in it".into()))?;
            builder = builder.tls_certs_only(certificates);
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for (name, value) in config.headers.expose() {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| TelemetryError::Client(format!("header name {name:?}")))?;
            let mut value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                TelemetryError::Client(format!("the value of header {name} (not shown)"))
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        headers.insert(
            reqwest::header::CONTENT_TYPE,
            reqwest::header::HeaderValue::from_static("application/x-protobuf"),
        );
        Ok(Exporter {
            http: builder
                .build()
                .map_err(|e| TelemetryError::Client(crate::db::error_text(&e)))?,
            url,
            headers,
            encoder: super::otlp::Encoder::new(resource, "tombstoned", env!("CARGO_PKG_VERSION")),
        })
    }

    /// Sends `spans`; answers how many the collector accepted none of (all of them on a failure,
    /// the rejected ones of a partial success).
    async fn export(&self, batch: Batch) -> Result<u64, ExportFailure> {
        let body = self.encoder.request(batch.bytes);
        let exchange = async {
            let mut response = self
                .http
                .post(self.url.clone())
                .headers(self.headers.clone())
                .body(body)
                .send()
                .await?;
            let status = response.status();
            let mut body = Vec::new();
            while let Some(chunk) = response.chunk().await? {
                body.extend_from_slice(&chunk);
                if body.len() > MAX_RESPONSE_BYTES {
                    break;
                }
            }
            Ok::<_, reqwest::Error>((status, body))
        };
        // reqwest's own timeout covers the exchange; the outer one is a backstop.
        match tokio::time::timeout(EXPORT_TIMEOUT + Duration::from_millis(100), exchange).await {
            Ok(Ok((status, body))) if status.is_success() => {
                let rejected = ExportTraceServiceResponse::decode(body.as_slice())
                    .ok()
                    .and_then(|r| r.partial_success)
                    .map_or(0, |p| u64::try_from(p.rejected_spans).unwrap_or(0));
                Ok(rejected)
            }
            Ok(Ok((status, _))) => Err(ExportFailure::Status(status.as_u16())),
            Ok(Err(e)) if e.is_timeout() => Err(ExportFailure::Timeout),
            Ok(Err(e)) => Err(ExportFailure::Connection(crate::db::error_text(
                &e.without_url(),
            ))),
            Err(_) => Err(ExportFailure::Timeout),
        }
    }
}

/// The export task's handle: [`Pipeline::shutdown`] flushes and stops it.
pub(super) struct Pipeline {
    queue: Arc<Queue>,
    flush: mpsc::Sender<(Instant, oneshot::Sender<()>)>,
}

impl Pipeline {
    /// The queue ended spans go to, and the export task, spawned on the current runtime.
    pub(super) fn start(
        exporter: Exporter,
        counter: Option<prometheus::IntCounter>,
    ) -> (Arc<Queue>, Pipeline) {
        let queue = Arc::new(Queue {
            batches: Mutex::new(Batches::default()),
            queued: AtomicUsize::new(0),
            header_room: exporter.encoder.header_room(),
            full_batch: Notify::new(),
            in_flight: AtomicU64::new(0),
            drops: Arc::new(Drops {
                total: AtomicU64::new(0),
                counter,
                log: Mutex::new(DropLog::default()),
            }),
        });
        let (flush, requests) = mpsc::channel(1);
        tokio::spawn(run(queue.clone(), exporter, requests));
        (queue.clone(), Pipeline { queue, flush })
    }

    /// Sends what is queued, within `bound`; what is left then is dropped.
    pub(super) async fn shutdown(self, bound: Duration) {
        let deadline = Instant::now() + bound;
        let (done, finished) = oneshot::channel();
        let flushed = async {
            self.flush.send((deadline, done)).await.ok()?;
            finished.await.ok()
        };
        if tokio::time::timeout(bound, flushed).await.is_err() {
            let left = self.queue.len() as u64 + self.queue.in_flight.load(Ordering::Relaxed);
            self.queue.drops.add(left, || {
                format!(
                    "not exported within the shutdown bound ({})",
                    humantime::format_duration(bound)
                )
            });
        }
        self.queue.drops.log_rest();
    }
}

/// The export task: a batch whenever one is full or [`BATCH_DELAY`] has passed, one export at a
/// time; at a flush request, everything queued until its deadline, then it ends.
async fn run(
    queue: Arc<Queue>,
    exporter: Exporter,
    mut flushes: mpsc::Receiver<(Instant, oneshot::Sender<()>)>,
) {
    loop {
        tokio::select! {
            () = queue.full_batch.notified() => {}
            () = tokio::time::sleep(BATCH_DELAY) => {}
            request = flushes.recv() => {
                if let Some((deadline, done)) = request {
                    while let Some(batch) = queue.take() {
                        let left = deadline.saturating_duration_since(Instant::now());
                        send(&exporter, &queue, batch, left).await;
                    }
                    let _ = done.send(());
                }
                return;
            }
        }
        while let Some(batch) = queue.take() {
            send(&exporter, &queue, batch, EXPORT_TIMEOUT).await;
        }
    }
}

/// One export, bounded by `within`; its spans counted as dropped when it fails.
async fn send(exporter: &Exporter, queue: &Queue, batch: Batch, within: Duration) {
    let n = batch.spans as u64;
    let drops = &queue.drops;
    queue.in_flight.store(n, Ordering::Relaxed);
    let exported = tokio::time::timeout(within, exporter.export(batch)).await;
    queue.in_flight.store(0, Ordering::Relaxed);
    match exported {
        Ok(Ok(rejected)) => drops.add(rejected, || "the collector rejected them".to_owned()),
        Ok(Err(failure)) => drops.add(n, || failure.reason()),
        Err(_) => drops.add(n, || {
            format!(
                "the export did not finish within {}",
                humantime::format_duration(within)
            )
        }),
    }
}

//! Traces (OpenTelemetry): the spans of each HTTP request, claim and statement, cleanup run and
//! batch, and outbox delivery, exported over OTLP/HTTP when `[tracing]` names a collector, and
//! nothing at all when it does not.
//!
//! **Off is free.** Until [`start`] installs the recorder, every constructor of [`Span`] reads one
//! `OnceLock` and returns [`Span::none`]: no span, no context, no attribute is built, no future is
//! wrapped ([`Span::in_scope`] hands the future back as it is). `serve`, `cleanup` and `outbox
//! deliver` start it when the configuration enables it; nothing else does.
//!
//! **On**, spans are our own records ([`Span`]: one box per span, owned by the code it times),
//! not the OpenTelemetry SDK's: the SDK's span lifecycle (its builder and sampler, a `Context`
//! made current through its stack on every poll, the span's conversion to `SpanData`) cost a
//! traced request 17,000 instructions, more than the 10 % of its CPU tracing may add. They are
//! sampled parent-based — a request's W3C `traceparent` decides for its whole trace, a new trace
//! is recorded with `tracing.sample_ratio` (reloadable, [`set_sample_ratio`]) by the SDK's
//! `TraceIdRatioBased` arithmetic — and encoded, where they end, into a bounded queue that
//! `export` empties to the collector in the background: a span that finds the queue full, or
//! whose export fails, is dropped and counted (`tombstoned_trace_spans_dropped_total`), never
//! waited for. The context a span runs in is our own thread-local, set around each poll by
//! [`Span::in_scope`] (`context`): children find their parent there, the claim's statement
//! stores it with the order's outbox event ([`current_traceparent`]), and every log line written
//! inside it carries its ids ([`current_ids`], read by the log formatter of `cli`). What is
//! exported is what the SDK exported: OTLP's `Span` with the same ids, parents, flags, link,
//! status and attributes.
//!
//! Attributes follow OpenTelemetry's semantic conventions (HTTP server and client, database
//! client); the project's own are under `tombstoned.`. None carries an idempotency key, a body,
//! a token or a password: each call site builds its attributes from what the logs already show.

mod context;
mod export;
mod otlp;
mod span;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::KeyValue;

use crate::config::TracingConfig;

pub use context::{current_ids, current_traceparent, InScope};
pub use opentelemetry::KeyValue as Attribute;
pub use span::{Kind, Span};

/// How long a command's or the daemon's end waits for its last spans to reach the collector;
/// what is not sent by then is dropped (counted). A slow or absent collector never holds up a
/// stop longer.
pub const FLUSH_BOUND: Duration = Duration::from_secs(5);

/// The sampler and the export queue of this process, once [`start`] has run with tracing on.
static INSTALLED: OnceLock<Installed> = OnceLock::new();

struct Installed {
    /// The ratio of new traces recorded, as `f64` bits ([`set_sample_ratio`]).
    ratio: AtomicU64,
    /// Where ended spans go.
    queue: Arc<export::Queue>,
}

/// The sampler and queue, when tracing is on: the one check every span constructor makes.
fn installed() -> Option<&'static Installed> {
    INSTALLED.get()
}

impl Installed {
    /// Whether a span of the trace `trace_id` is recorded, its parent's decision given when it
    /// has one (`parent_sampled`): see [`sampled`].
    fn samples(&self, parent_sampled: Option<bool>, trace_id: u128) -> bool {
        let ratio = f64::from_bits(self.ratio.load(Ordering::Relaxed));
        sampled(ratio, parent_sampled, trace_id)
    }
}

/// The sampler: parent-based — a parent's decision is kept, whatever the ratio — and for a trace
/// that starts here the OpenTelemetry SDK's `TraceIdRatioBased` decision, so that a ratio means
/// what it meant: the lower 64 bits of the trace id, shifted right by one, below `ratio` × 2⁶³.
fn sampled(ratio: f64, parent_sampled: Option<bool>, trace_id: u128) -> bool {
    if let Some(parent) = parent_sampled {
        return parent;
    }
    if ratio >= 1.0 {
        return true;
    }
    let bound = (ratio.max(0.0) * (1u64 << 63) as f64) as u64;
    (trace_id as u64 >> 1) < bound
}

/// Whether spans are being made (tracing is on in this process).
pub fn enabled() -> bool {
    INSTALLED.get().is_some()
}

/// Why tracing could not be started: all of them the configuration's to fix.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The CA file cannot be read or holds no certificate.
    #[error("cannot use tracing.ca_file {path}: {reason}")]
    CaFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The exporter's HTTP client could not be built (TLS set-up, a header it cannot send).
    #[error("cannot build the trace exporter's HTTP client: {0}")]
    Client(String),
    /// `start` ran twice in one process.
    #[error("tracing was already started in this process")]
    AlreadyStarted,
}

/// The running export: flushed and stopped by [`Tracing::shutdown`].
pub struct Tracing {
    pipeline: export::Pipeline,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").finish_non_exhaustive()
    }
}

/// Starts tracing as `config` says: nothing when it names no endpoint (`Ok(None)`); otherwise
/// the exporter (its task spawned on the current tokio runtime), and the sampler and queue
/// every [`Span`] uses from now on. Spans dropped are counted in `dropped` (the
/// daemon's `tombstoned_trace_spans_dropped_total`) when given, and logged at most once a minute
/// either way.
pub fn start(
    config: &TracingConfig,
    dropped: Option<prometheus::IntCounter>,
) -> Result<Option<Tracing>, TelemetryError> {
    let Some(url) = config.traces_url() else {
        return Ok(None);
    };
    if INSTALLED.get().is_some() {
        return Err(TelemetryError::AlreadyStarted);
    }
    // The process's resource (OpenTelemetry's semantic conventions). `telemetry.sdk.name`
    // names the recorder, which is ours, as the conventions ask of an SDK that is not
    // OpenTelemetry's.
    let resource = [
        KeyValue::new("service.name", config.service_name.clone()),
        KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        KeyValue::new("service.instance.id", crate::instance::instance_id()),
        KeyValue::new("telemetry.sdk.name", "tombstoned"),
        KeyValue::new("telemetry.sdk.language", "rust"),
        KeyValue::new("telemetry.sdk.version", env!("CARGO_PKG_VERSION")),
    ];
    let exporter = export::Exporter::new(config, url, &resource)?;
    let (queue, pipeline) = export::Pipeline::start(exporter, dropped);
    let ratio = AtomicU64::new(clamp(config.sample_ratio).to_bits());
    INSTALLED
        .set(Installed { ratio, queue })
        .map_err(|_| TelemetryError::AlreadyStarted)?;
    tracing::info!(
        endpoint = %config.endpoint_display(),
        service = %config.service_name,
        sample_ratio = config.sample_ratio,
        "exporting traces"
    );
    Ok(Some(Tracing { pipeline }))
}

/// What [`start`] would refuse in `config` (an unusable CA file, a header the HTTP client cannot
/// send), found without starting anything: `check-config`'s check, so that it refuses what
/// `serve` refuses.
pub fn check(config: &TracingConfig) -> Result<(), TelemetryError> {
    match config.traces_url() {
        Some(url) => export::Exporter::new(config, url, &[]).map(drop),
        None => Ok(()),
    }
}

impl Tracing {
    /// Exports what is queued and stops, within `bound`: what cannot be sent by then is dropped
    /// (counted and logged). Spans ended afterwards are dropped too; the process is ending.
    pub async fn shutdown(self, bound: Duration) {
        self.pipeline.shutdown(bound).await;
    }
}

/// A reload's `tracing.sample_ratio`: new traces are sampled with it from now on.
pub fn set_sample_ratio(ratio: f64) {
    if let Some(installed) = INSTALLED.get() {
        installed
            .ratio
            .store(clamp(ratio).to_bits(), Ordering::Relaxed);
    }
}

fn clamp(ratio: f64) -> f64 {
    if ratio.is_nan() {
        1.0
    } else {
        ratio.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parent_decides_and_the_ratio_decides_new_traces_and_can_change() {
        // Ratio 0: no new trace; a sampled parent is recorded all the same, an unsampled never.
        assert!(!sampled(0.0, None, 1));
        assert!(sampled(0.0, Some(true), 1));
        assert!(sampled(1.0, None, 1));
        assert!(!sampled(1.0, Some(false), 1));
        // The arithmetic of the SDK's TraceIdRatioBased: the lower 64 bits, halved, against
        // ratio × 2⁶³; the upper 64 bits do not count.
        assert!(sampled(1.0, None, u128::MAX));
        assert!(sampled(0.5, None, 0x7fff_ffff_ffff_fffe));
        assert!(sampled(0.5, None, 0x7fff_ffff_ffff_ffff));
        assert!(!sampled(0.5, None, 0x8000_0000_0000_0000));
        assert!(!sampled(0.5, None, u128::MAX));
        assert!(sampled(0.25, None, (1u128 << 62) - 1));
        assert!(!sampled(0.25, None, 1u128 << 62));
        assert!(sampled(0.25, None, (u128::MAX << 64) | 5));
        assert!(!sampled(-1.0, None, 1));
        assert_eq!(clamp(f64::NAN), 1.0);
        assert_eq!(clamp(7.0), 1.0);
        assert_eq!(clamp(-1.0), 0.0);
    }

    #[test]
    fn off_makes_nothing() {
        // No tracer in this test process: every constructor gives nothing, and a future is
        // handed back unwrapped.
        assert!(!enabled());
        let span = Span::child("x", Kind::Internal, || panic!("no attributes when off"));
        assert!(!span.is_recording());
        assert_eq!(span.traceparent(), None);
        let server = Span::server(
            "x",
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            None,
            || panic!("no attributes when off"),
        );
        assert!(!server.is_recording());
        assert_eq!(current_traceparent(), None);
        assert!(current_ids().is_none());
        assert!(matches!(
            span.in_scope(std::future::ready(1)),
            futures::future::Either::Right(_)
        ));
    }
}

//! Traces (OpenTelemetry): the spans of each HTTP request, claim and statement, cleanup run and
//! batch, and outbox delivery, exported over OTLP/HTTP when `[tracing]` names a collector, and
//! nothing at all when it does not.
//!
//! **Off is free.** Until [`start`] installs a tracer, every constructor of [`Span`] reads one
//! `OnceLock` and returns [`Span::none`]: no span, no context, no attribute is built, no future is
//! wrapped ([`Span::in_scope`] hands the future back as it is). `serve`, `cleanup` and `outbox
//! deliver` start it when the configuration enables it; nothing else does.
//!
//! **On**, spans are the OpenTelemetry SDK's own (no second record in the `tracing` subscriber):
//! sampled parent-based — a request's W3C `traceparent` decides for its whole trace, a new trace
//! is recorded with `tracing.sample_ratio` (reloadable, [`set_sample_ratio`]) — and handed, when
//! they end, to a bounded queue that [`export`] empties to the collector in the background: a
//! span that finds the queue full, or whose export fails, is dropped and counted
//! (`tombstoned_trace_spans_dropped_total`), never waited for. The context a span runs in is the
//! OpenTelemetry thread-local one, carried across `.await`s by [`Span::in_scope`]: children find
//! their parent there, the claim's statement stores it with the order's outbox event
//! ([`current_traceparent`]), and every log line written inside it carries its ids
//! ([`current_ids`], read by the log formatter of `cli`).
//!
//! Attributes follow OpenTelemetry's semantic conventions (HTTP server and client, database
//! client); the project's own are under `tombstoned.`. None carries an idempotency key, a body,
//! a token or a password: each call site builds its attributes from what the logs already show.

mod export;
mod otlp;
mod span;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::trace::{SpanKind, TraceId, TracerProvider as _};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use opentelemetry_sdk::trace::{
    Sampler, SamplingResult, SdkTracer, SdkTracerProvider, ShouldSample,
};
use opentelemetry_sdk::Resource;

use crate::config::TracingConfig;

pub use opentelemetry::trace::SpanKind as Kind;
pub use opentelemetry::KeyValue as Attribute;
pub use span::{current_ids, current_traceparent, parse_traceparent, Span};

/// How long a command's or the daemon's end waits for its last spans to reach the collector;
/// what is not sent by then is dropped (counted). A slow or absent collector never holds up a
/// stop longer.
pub const FLUSH_BOUND: Duration = Duration::from_secs(5);

/// The tracer of this process, once [`start`] has run with tracing on.
static INSTALLED: OnceLock<Installed> = OnceLock::new();

struct Installed {
    tracer: SdkTracer,
    /// The ratio of new traces recorded, as `f64` bits ([`set_sample_ratio`]).
    ratio: Arc<AtomicU64>,
}

/// The tracer, when tracing is on: the one check every span constructor makes.
fn tracer() -> Option<&'static SdkTracer> {
    INSTALLED.get().map(|installed| &installed.tracer)
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
    provider: SdkTracerProvider,
    pipeline: export::Pipeline,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing").finish_non_exhaustive()
    }
}

/// Starts tracing as `config` says: nothing when it names no endpoint (`Ok(None)`); otherwise
/// the exporter (its task spawned on the current tokio runtime), the sampler and the tracer
/// every [`Span`] constructor uses from now on. Spans dropped are counted in `dropped` (the
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
    let resource = Resource::builder_empty()
        .with_service_name(config.service_name.clone())
        .with_attributes([
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new("service.instance.id", crate::instance::instance_id()),
            KeyValue::new("telemetry.sdk.name", "opentelemetry"),
            KeyValue::new("telemetry.sdk.language", "rust"),
        ])
        .build();
    let exporter = export::Exporter::new(config, url, &resource)?;
    let (processor, pipeline) = export::Pipeline::start(exporter, dropped);
    let ratio = Arc::new(AtomicU64::new(clamp(config.sample_ratio).to_bits()));
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(Sampler::ParentBased(Box::new(RatioSampler(ratio.clone()))))
        .with_resource(resource)
        .build();
    let tracer = provider.tracer_with_scope(
        InstrumentationScope::builder("tombstoned")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    );
    INSTALLED
        .set(Installed { tracer, ratio })
        .map_err(|_| TelemetryError::AlreadyStarted)?;
    tracing::info!(
        endpoint = %config.endpoint_display(),
        service = %config.service_name,
        sample_ratio = config.sample_ratio,
        "exporting traces"
    );
    Ok(Some(Tracing { provider, pipeline }))
}

/// What [`start`] would refuse in `config` (an unusable CA file, a header the HTTP client cannot
/// send), found without starting anything: `check-config`'s check, so that it refuses what
/// `serve` refuses.
pub fn check(config: &TracingConfig) -> Result<(), TelemetryError> {
    match config.traces_url() {
        Some(url) => {
            export::Exporter::new(config, url, &Resource::builder_empty().build()).map(drop)
        }
        None => Ok(()),
    }
}

impl Tracing {
    /// Exports what is queued and stops, within `bound`: what cannot be sent by then is dropped
    /// (counted and logged). Spans ended afterwards are dropped too; the process is ending.
    pub async fn shutdown(self, bound: Duration) {
        self.pipeline.shutdown(bound).await;
        // The SDK's own processors: ours has nothing left to do.
        let _ = self
            .provider
            .shutdown_with_timeout(Duration::from_millis(10));
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

/// The root sampler: the SDK's trace-id ratio with a ratio a reload may change. Parent-based
/// sampling ([`Sampler::ParentBased`]) asks it only for a trace that starts here.
#[derive(Debug, Clone)]
struct RatioSampler(Arc<AtomicU64>);

impl ShouldSample for RatioSampler {
    fn should_sample(
        &self,
        parent_context: Option<&Context>,
        trace_id: TraceId,
        name: &str,
        span_kind: &SpanKind,
        attributes: &[KeyValue],
        links: &[opentelemetry::trace::Link],
    ) -> SamplingResult {
        let ratio = f64::from_bits(self.0.load(Ordering::Relaxed));
        Sampler::TraceIdRatioBased(ratio).should_sample(
            parent_context,
            trace_id,
            name,
            span_kind,
            attributes,
            links,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanContext, TraceContextExt, TraceFlags};
    use opentelemetry_sdk::trace::SamplingDecision;

    fn decide(sampler: &Sampler, parent: Option<&Context>, trace_id: u128) -> SamplingDecision {
        sampler
            .should_sample(
                parent,
                TraceId::from(trace_id),
                "x",
                &SpanKind::Server,
                &[],
                &[],
            )
            .decision
    }

    #[test]
    fn a_parent_decides_and_the_ratio_decides_new_traces_and_can_change() {
        let ratio = Arc::new(AtomicU64::new(0.0f64.to_bits()));
        let sampler = Sampler::ParentBased(Box::new(RatioSampler(ratio.clone())));
        let remote = |flags| {
            Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from(7),
                opentelemetry::trace::SpanId::from(9),
                flags,
                true,
                Default::default(),
            ))
        };
        // Ratio 0: no new trace; a sampled parent is recorded all the same, an unsampled never.
        assert_eq!(decide(&sampler, None, 1), SamplingDecision::Drop);
        assert_eq!(
            decide(&sampler, Some(&remote(TraceFlags::SAMPLED)), 1),
            SamplingDecision::RecordAndSample
        );
        ratio.store(1.0f64.to_bits(), Ordering::Relaxed);
        assert_eq!(decide(&sampler, None, 1), SamplingDecision::RecordAndSample);
        assert_eq!(
            decide(&sampler, Some(&remote(TraceFlags::default())), 1),
            SamplingDecision::Drop
        );
        assert_eq!(clamp(f64::NAN), 1.0);
        assert_eq!(clamp(7.0), 1.0);
    }

    #[test]
    fn off_makes_nothing() {
        // No tracer in this test process: every constructor gives nothing, and a future is
        // handed back unwrapped.
        assert!(!enabled());
        let span = Span::child("x", Kind::Internal, || panic!("no attributes when off"));
        assert!(!span.is_recording());
        assert_eq!(span.traceparent(), None);
        assert_eq!(current_traceparent(), None);
        assert!(current_ids().is_none());
        assert!(matches!(
            span.in_scope(std::future::ready(1)),
            futures::future::Either::Right(_)
        ));
    }
}

//! A span's context and where it lives: its ids (drawn here), the W3C `traceparent` it is read
//! from and written as, and the current one — a thread-local that [`InScope`] sets around each
//! poll of a future, where children find their parent, the claim its stored `traceparent` and a
//! log line its ids.
//!
//! Only a recorded span is ever current (a span sampled out is no span, and its future is not
//! wrapped), so a context here is always sampled: its flags are `01`.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use opentelemetry::trace::TraceState;
use rand::distr::{Distribution, StandardUniform};
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

/// A recorded span's context, as its children and its traceparent need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct SpanContext {
    pub(super) trace_id: u128,
    pub(super) span_id: u64,
    /// The W3C `tracestate` of the trace, as the caller sent it (validated, re-joined): rare,
    /// so shared rather than copied into every child.
    pub(super) state: Option<Arc<str>>,
}

/// A context received (a request's `traceparent`) or stored (an outbox event's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Remote {
    pub(super) trace_id: u128,
    pub(super) span_id: u64,
    /// The caller's decision: whether its trace is recorded.
    pub(super) sampled: bool,
    pub(super) state: Option<Arc<str>>,
}

/// The W3C trace flags of a recorded span: sampled.
pub(super) const SAMPLED: u8 = 0x01;

/// The current span's ids, kept apart from its trace state so that the thread-local entered
/// and left around every poll is plain data, copied (no destructor, no reference count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Current {
    trace_id: u128,
    span_id: u64,
    /// Whether [`CURRENT_STATE`] holds this span's trace state.
    has_state: bool,
}

thread_local! {
    /// The span the running poll is inside, if any.
    static CURRENT: Cell<Option<Current>> = const { Cell::new(None) };
    /// The current span's trace state, when it has one (rare: only a caller's `tracestate`
    /// makes one); touched only then, or when leaving such a span.
    static CURRENT_STATE: Cell<Option<Arc<str>>> = const { Cell::new(None) };
    /// Ids come from a small fast generator per thread, seeded from the thread's
    /// cryptographically seeded one: they need to be unique, not secret, and three spans per
    /// request draw 40 bytes.
    static IDS: RefCell<SmallRng> = RefCell::new(SmallRng::from_rng(&mut rand::rng()));
}

fn random<T>() -> T
where
    StandardUniform: Distribution<T>,
{
    IDS.try_with(|rng| rng.try_borrow_mut().ok().map(|mut rng| rng.random()))
        .ok()
        .flatten()
        // Only while the thread is being torn down (or, impossibly, drawn from re-entrantly).
        .unwrap_or_else(rand::random)
}

/// A new trace id: random, never all zero (the invalid id).
pub(super) fn new_trace_id() -> u128 {
    loop {
        let id = random::<u128>();
        if id != 0 {
            return id;
        }
    }
}

/// A new span id: random, never all zero.
pub(super) fn new_span_id() -> u64 {
    loop {
        let id = random::<u64>();
        if id != 0 {
            return id;
        }
    }
}

fn current_ids_only() -> Option<Current> {
    CURRENT.try_with(Cell::get).ok().flatten()
}

/// The current span's context, for a child.
pub(super) fn current() -> Option<SpanContext> {
    let current = current_ids_only()?;
    let state = if current.has_state {
        CURRENT_STATE
            .try_with(|cell| {
                let state = cell.take();
                cell.set(state.clone());
                state
            })
            .ok()
            .flatten()
    } else {
        None
    };
    Some(SpanContext {
        trace_id: current.trace_id,
        span_id: current.span_id,
        state,
    })
}

/// The current span as a `traceparent` (what the endpoint stores with an order's outbox event),
/// when tracing is on and a span is current.
pub fn current_traceparent() -> Option<String> {
    super::installed()?;
    current_ids_only().map(|current| format(current.trace_id, current.span_id))
}

/// The current span's trace and span ids, 32 and 16 lowercase hex digits, for a log line.
pub fn current_ids() -> Option<(String, String)> {
    super::installed()?;
    current_ids_only().map(|current| {
        (
            format!("{:032x}", current.trace_id),
            format!("{:016x}", current.span_id),
        )
    })
}

pin_project_lite::pin_project! {
    /// A future with a span's context current during each of its polls ([`Span::in_scope`]).
    ///
    /// [`Span::in_scope`]: super::Span::in_scope
    #[derive(Debug)]
    pub struct InScope<F> {
        context: SpanContext,
        #[pin]
        future: F,
    }
}

impl<F> InScope<F> {
    pub(super) fn new(context: SpanContext, future: F) -> Self {
        InScope { context, future }
    }
}

impl<F: Future> Future for InScope<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = Entered::enter(this.context);
        this.future.poll(cx)
    }
}

/// What was current before a poll, put back when the poll ends, panicking or not (a worker
/// thread must not keep a finished request's context for the next task).
struct Entered {
    previous: Option<Current>,
    /// The previous trace state, when entering touched it.
    previous_state: Option<Option<Arc<str>>>,
}

impl Entered {
    fn enter(context: &SpanContext) -> Self {
        let has_state = context.state.is_some();
        let current = Current {
            trace_id: context.trace_id,
            span_id: context.span_id,
            has_state,
        };
        let previous = CURRENT
            .try_with(|cell| cell.replace(Some(current)))
            .ok()
            .flatten();
        // The state is set when this span has one, and cleared when the previous one had one.
        let previous_state = (has_state || previous.is_some_and(|p| p.has_state)).then(|| {
            CURRENT_STATE
                .try_with(|cell| cell.replace(context.state.clone()))
                .ok()
                .flatten()
        });
        Entered {
            previous,
            previous_state,
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|cell| cell.set(self.previous));
        if let Some(state) = self.previous_state.take() {
            let _ = CURRENT_STATE.try_with(|cell| cell.set(state));
        }
    }
}

/// `00-<trace id>-<span id>-01`: W3C Trace Context, version 00. Written into a buffer by `hex`
/// (every traced claim makes one): `format!`'s integer formatting costs several times more.
pub(super) fn format(trace_id: u128, span_id: u64) -> String {
    let mut text = *b"00-________________________________-________________-01";
    // The slices are exactly twice the bytes long, so neither encoding can fail; and hex digits
    // and dashes are ASCII, so neither can the text.
    let written = hex::encode_to_slice(trace_id.to_be_bytes(), &mut text[3..35]).and(
        hex::encode_to_slice(span_id.to_be_bytes(), &mut text[36..52]),
    );
    match (written, std::str::from_utf8(&text)) {
        (Ok(()), Ok(text)) => text.to_owned(),
        _ => String::new(),
    }
}

/// A W3C `traceparent` (and `tracestate`) read as a context, or `None` when it is not one:
/// version 00 exactly (55 characters, lowercase hex), or a later version's first four fields
/// (the specification's forward compatibility); all-zero ids and version `ff` are invalid. A
/// `tracestate` that is not valid is left out, the `traceparent` kept.
pub(super) fn remote(traceparent: &str, tracestate: Option<&str>) -> Option<Remote> {
    let text = traceparent.trim();
    let mut parts = text.split('-');
    let (version, trace_id, span_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || version == "ff" || !hex(trace_id, 32) || !hex(span_id, 16) {
        return None;
    }
    if !hex(flags, 2) || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let trace_id = u128::from_str_radix(trace_id, 16).ok()?;
    let span_id = u64::from_str_radix(span_id, 16).ok()?;
    if trace_id == 0 || span_id == 0 {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    // OpenTelemetry's own parsing and validation of the list, re-joined as it exports it.
    let state = tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .map(|s| s.header())
        .filter(|s| !s.is_empty())
        .map(Arc::from);
    Some(Remote {
        trace_id,
        span_id,
        sampled: flags & SAMPLED != 0,
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_read_as_the_w3c_specification_says() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = remote(valid, Some("vendor=value, other=x")).unwrap();
        assert!(context.sampled);
        assert_eq!(context.trace_id, 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736);
        assert_eq!(context.span_id, 0x00f0_67aa_0ba9_02b7);
        assert_eq!(context.state.as_deref(), Some("vendor=value,other=x"));
        assert_eq!(format(context.trace_id, context.span_id), valid);
        let unsampled = remote(&valid.replace("-01", "-00"), Some("not a list")).unwrap();
        assert!(!unsampled.sampled);
        assert_eq!(unsampled.state, None);
        // Flags other than sampled are not "sampled".
        assert!(!remote(&valid.replace("-01", "-02"), None).unwrap().sampled);
        // A later version's first four fields are read; extra fields in version 00 are not.
        assert!(remote(&format!("01{}-what-next", &valid[2..]), None).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
        ] {
            assert!(remote(bad, None).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn ids_are_never_zero_and_do_not_repeat() {
        let traces: std::collections::HashSet<u128> = (0..1000).map(|_| new_trace_id()).collect();
        let spans: std::collections::HashSet<u64> = (0..1000).map(|_| new_span_id()).collect();
        assert_eq!((traces.len(), spans.len()), (1000, 1000));
        assert!(!traces.contains(&0) && !spans.contains(&0));
    }

    #[test]
    fn a_context_is_current_during_each_poll_and_not_after() {
        let context = |span_id, state: Option<&str>| SpanContext {
            trace_id: 7,
            span_id,
            state: state.map(Arc::from),
        };
        let waker = futures::task::noop_waker();
        let poll = |future: Pin<&mut dyn Future<Output = Vec<Option<SpanContext>>>>| {
            future.poll(&mut std::task::Context::from_waker(&waker))
        };
        // Nested: with a state, then without one (a root inside), then with one again.
        let seen = async {
            let mut seen = vec![current()];
            seen.push(InScope::new(context(2, None), async { current() }).await);
            seen.push(InScope::new(context(3, Some("c=3")), async { current() }).await);
            seen.push(current());
            seen
        };
        let outer = std::pin::pin!(InScope::new(context(1, Some("a=1")), seen));
        assert_eq!(
            poll(outer),
            Poll::Ready(vec![
                Some(context(1, Some("a=1"))),
                Some(context(2, None)),
                Some(context(3, Some("c=3"))),
                Some(context(1, Some("a=1"))),
            ])
        );
        assert_eq!(current(), None);
        assert_eq!(CURRENT_STATE.take(), None);
    }
}

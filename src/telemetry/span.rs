//! [`Span`]: one OpenTelemetry span of ours, or nothing when tracing is off; the W3C
//! `traceparent` it is read from and written as; the current span's ids for the logs.

use std::borrow::Cow;
use std::future::Future;

use futures::future::Either;
use opentelemetry::context::{FutureExt as _, WithContext};
use opentelemetry::trace::{
    Link, Span as _, SpanContext, SpanId, Status, TraceContextExt as _, TraceFlags, TraceId,
    TraceState, Tracer as _,
};
use opentelemetry::{Context, KeyValue};

use super::{tracer, Kind};

/// A span, or nothing (tracing off). It ends at [`Span::end`], or when the last clone of its
/// context is dropped (a request abandoned half way still ends its spans).
#[derive(Debug, Default)]
pub struct Span(Option<Context>);

impl Span {
    /// No span: what every constructor gives while tracing is off.
    pub fn none() -> Self {
        Span(None)
    }

    /// The span of a request received, continuing the caller's trace when its `traceparent`
    /// (and `tracestate`) is valid: the caller's sampling decision is kept.
    pub fn server(
        name: impl Into<Cow<'static, str>>,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let Some(tracer) = tracer() else {
            return Span::none();
        };
        let parent = match traceparent.and_then(|t| remote(t, tracestate)) {
            Some(caller) => Context::new().with_remote_span_context(caller),
            None => Context::new(),
        };
        Self::start(tracer, name, Kind::Server, &parent, None, attributes)
    }

    /// A span inside the current one (the context [`Span::in_scope`] made current); nothing when
    /// no recorded span is current (tracing off, a trace sampled out, or work outside a request
    /// or run): a child never starts a trace of its own.
    pub fn child(
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let Some(tracer) = tracer() else {
            return Span::none();
        };
        Context::map_current(|parent| {
            if !parent.has_active_span() {
                return Span::none();
            }
            Self::start(tracer, name, kind, parent, None, attributes)
        })
    }

    /// The root of a new trace, whatever is current (a cleanup run).
    pub fn root(
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let Some(tracer) = tracer() else {
            return Span::none();
        };
        Self::start(tracer, name, kind, &Context::new(), None, attributes)
    }

    /// A span of work caused earlier elsewhere, whose context was stored as a `traceparent`
    /// (an outbox event's): in that trace, as a child of the stored span, and linked to it — the
    /// link marks the asynchronous hop, as OpenTelemetry's messaging conventions have a delivery
    /// link to where the message was created. Without a valid stored context, the root of a new
    /// trace.
    pub fn following(
        stored: Option<&str>,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let Some(tracer) = tracer() else {
            return Span::none();
        };
        match stored.and_then(|t| remote(t, None)) {
            Some(origin) => {
                let parent = Context::new().with_remote_span_context(origin.clone());
                Self::start(tracer, name, kind, &parent, Some(origin), attributes)
            }
            None => Self::start(tracer, name, kind, &Context::new(), None, attributes),
        }
    }

    /// A database client span inside the current one, named after the statement it runs (its
    /// name in the feature's `sql` module, e.g. `claim_and_create`): OpenTelemetry's database
    /// conventions, with nothing of the statement's parameters.
    pub fn database(statement: &'static str) -> Self {
        Self::child(statement, Kind::Client, || {
            vec![
                KeyValue::new("db.system.name", "postgresql"),
                KeyValue::new("db.query.summary", statement),
            ]
        })
    }

    /// Marks a database client span failed with the SQLSTATE the server answered (`None`: no
    /// answer, the connection failed).
    pub fn fail_sqlstate(&self, sqlstate: Option<&str>) {
        match sqlstate {
            Some(code) => {
                self.set(|| vec![KeyValue::new("db.response.status_code", code.to_owned())]);
                self.fail(code);
            }
            None => self.fail("connection"),
        }
    }

    fn start(
        tracer: &opentelemetry_sdk::trace::SdkTracer,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        parent: &Context,
        link: Option<SpanContext>,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let mut builder = tracer.span_builder(name).with_kind(kind);
        if let Some(origin) = link {
            builder = builder.with_links(vec![Link::with_context(origin)]);
        }
        // Under a sampled parent the span is recorded (sampling is parent-based): its attributes
        // go in with it, not through the started span's lock afterwards. Otherwise they are made
        // only if the sampler records it.
        let later = if parent.span().span_context().is_sampled() {
            builder = builder.with_attributes(attributes());
            None
        } else {
            Some(attributes)
        };
        let span = builder.start_with_context(tracer, parent);
        // A span sampled out is no span at all: no context is carried, no child, attribute, log
        // id or stored traceparent is made for it, so a trace not recorded costs little more
        // than the sampler's decision.
        if !span.span_context().is_sampled() {
            return Span::none();
        }
        let cx = parent.with_span(span);
        if let Some(attributes) = later {
            cx.span().set_attributes(attributes());
        }
        Span(Some(cx))
    }

    /// Whether this span is recorded (tracing on and the trace sampled).
    pub fn is_recording(&self) -> bool {
        self.0.as_ref().is_some_and(|cx| cx.span().is_recording())
    }

    /// Adds attributes, made only when the span is recorded.
    pub fn set(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(cx) = self.0.as_ref().filter(|cx| cx.span().is_recording()) {
            cx.span().set_attributes(attributes());
        }
    }

    /// Marks the span failed: status Error and `error.type` (a class of failure, never a
    /// message that could quote a value: an SQLSTATE, a status code, `timeout`).
    pub fn fail(&self, error_type: impl Into<String>) {
        if let Some(cx) = self.0.as_ref().filter(|cx| cx.span().is_recording()) {
            let error_type = error_type.into();
            cx.span()
                .set_attribute(KeyValue::new("error.type", error_type.clone()));
            cx.span().set_status(Status::error(error_type));
        }
    }

    /// Ends the span now.
    pub fn end(self) {
        if let Some(cx) = self.0 {
            cx.span().end();
        }
    }

    /// This span as a W3C `traceparent` header value, when there is one.
    pub fn traceparent(&self) -> Option<String> {
        self.0.as_ref().map(|cx| format(cx.span().span_context()))
    }

    /// `future`, with this span current while it runs (each poll), so the spans it starts are
    /// this one's children and its log lines carry this span's ids. Without a span, `future`
    /// itself.
    pub fn in_scope<F: Future>(&self, future: F) -> Either<WithContext<F>, F> {
        match &self.0 {
            Some(cx) => Either::Left(future.with_context(cx.clone())),
            None => Either::Right(future),
        }
    }
}

/// The current span as a `traceparent` (what the endpoint stores with an order's outbox event),
/// when tracing is on and a span is current.
pub fn current_traceparent() -> Option<String> {
    tracer()?;
    Context::map_current(|cx| {
        let span = cx.span();
        let context = span.span_context();
        context.is_valid().then(|| format(context))
    })
}

/// The current span's trace and span ids, 32 and 16 lowercase hex digits, for a log line.
pub fn current_ids() -> Option<(String, String)> {
    tracer()?;
    Context::map_current(|cx| {
        let span = cx.span();
        let context = span.span_context();
        context.is_valid().then(|| {
            (
                format!("{:032x}", context.trace_id()),
                format!("{:016x}", context.span_id()),
            )
        })
    })
}

/// `00-<trace id>-<span id>-<flags>`: W3C Trace Context, version 00. Written into a buffer by
/// `hex` (every traced claim makes one): `format!`'s integer formatting costs several times more.
fn format(context: &SpanContext) -> String {
    let mut text = *b"00-________________________________-________________-__";
    // The slices are exactly twice the bytes long, so neither encoding can fail; and hex digits
    // and dashes are ASCII, so neither can the text.
    let written = hex::encode_to_slice(context.trace_id().to_bytes(), &mut text[3..35])
        .and(hex::encode_to_slice(
            context.span_id().to_bytes(),
            &mut text[36..52],
        ))
        .and(hex::encode_to_slice(
            [context.trace_flags().to_u8()],
            &mut text[53..55],
        ));
    match (written, std::str::from_utf8(&text)) {
        (Ok(()), Ok(text)) => text.to_owned(),
        _ => String::new(),
    }
}

/// A W3C `traceparent` read as a span context, or `None` when it is not one: version 00
/// exactly (55 characters, lowercase hex), or a later version's first four fields (the
/// specification's forward compatibility); all-zero ids and version `ff` are invalid.
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    remote(text, None)
}

fn remote(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
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
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8();
    let state = tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        state,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_read_as_the_w3c_specification_says() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse_traceparent(valid).unwrap();
        assert!(context.is_sampled() && context.is_remote());
        assert_eq!(format(&context), valid);
        let unsampled = parse_traceparent(&valid.replace("-01", "-00")).unwrap();
        assert!(!unsampled.is_sampled());
        // A later version's first four fields are read; extra fields in version 00 are not.
        assert!(parse_traceparent(&format!("01{}-what-next", &valid[2..])).is_some());
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
            assert!(parse_traceparent(bad).is_none(), "{bad:?}");
        }
    }
}

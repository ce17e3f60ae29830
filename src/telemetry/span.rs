//! [`Span`]: one span of ours, or nothing when tracing is off or its trace is not recorded; and
//! its [`Record`], what the span holds while it runs and hands to the export queue when it ends.
//!
//! A span is one boxed record, owned by the [`Span`] alone: the context its future carries
//! ([`Span::in_scope`]) and its children keep are copies of its ids, not references to it. So
//! ending it — [`Span::end`], or the drop of a request abandoned half way — is encoding it into
//! the export queue there and then, and freeing it.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use futures::future::Either;
use opentelemetry::KeyValue;

use super::context::{self, InScope, Remote, SpanContext};
use super::Installed;

/// What a span is to OpenTelemetry (the kinds the project makes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Work inside the process (a claim, a cleanup run).
    Internal,
    /// A request received.
    Server,
    /// A request sent (a statement, a webhook).
    Client,
}

/// A span, or nothing (tracing off, or its trace not recorded). It ends at [`Span::end`], or
/// when it is dropped (a request abandoned half way still ends its spans).
///
/// Boxed, so that a `Span` is one word in every future that holds one, tracing off or on.
#[derive(Debug, Default)]
pub struct Span(Option<Box<Record>>);

/// A recorded span: set when it starts, its attributes and status added while it runs, its end
/// time set when it ends.
#[derive(Debug)]
pub(super) struct Record {
    pub(super) context: SpanContext,
    /// The span this one is a child of: its id, and whether it is remote (a caller's, an outbox
    /// event's) rather than one of this process's.
    pub(super) parent: Option<(u64, bool)>,
    /// The stored context a `following` span is linked to (its trace and span id; remote and
    /// sampled, without a trace state).
    pub(super) link: Option<(u128, u64)>,
    pub(super) name: Cow<'static, str>,
    pub(super) kind: Kind,
    /// A database client span's statement: its attributes `db.system.name` (`postgresql`) and
    /// `db.query.summary` (the statement), first, without a `Vec` made for every statement.
    pub(super) statement: Option<&'static str>,
    pub(super) start: SystemTime,
    pub(super) end: SystemTime,
    /// What `set` and `fail` add through a shared reference (a span is shared by the code it
    /// times); uncontended, so one atomic each way.
    pub(super) data: Mutex<Data>,
}

/// A span's attributes and status.
#[derive(Debug, Default)]
pub(super) struct Data {
    /// The attributes the span started with; or, if it had none, the first ones added.
    pub(super) attributes: Vec<KeyValue>,
    /// The attributes added later, in order. The call sites hand over a `Vec` each time: kept
    /// as it is (moved, not copied into the first) unless there are three.
    pub(super) more: Vec<KeyValue>,
    pub(super) status: Status,
}

/// A span's status: set only by [`Span::fail`] (nothing marks a span Ok).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) enum Status {
    #[default]
    Unset,
    /// Failed, with the class of failure as description.
    Error(String),
}

impl Data {
    fn add(&mut self, attributes: Vec<KeyValue>) {
        if self.attributes.is_empty() {
            self.attributes = attributes;
        } else if self.more.is_empty() {
            self.more = attributes;
        } else {
            self.more.extend(attributes);
        }
    }
}

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
        let Some(installed) = super::installed() else {
            return Span::none();
        };
        match traceparent.and_then(|t| context::remote(t, tracestate)) {
            Some(caller) => {
                Self::under_remote(installed, caller, name, Kind::Server, false, attributes)
            }
            None => Self::new_trace(installed, name, Kind::Server, attributes),
        }
    }

    /// A span inside the current one (the context [`Span::in_scope`] made current); nothing when
    /// no recorded span is current (tracing off, a trace sampled out, or work outside a request
    /// or run): a child never starts a trace of its own.
    pub fn child(
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        Self::child_of_current(name, kind, None, attributes)
    }

    fn child_of_current(
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        statement: Option<&'static str>,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        if super::installed().is_none() {
            return Span::none();
        }
        // Only a recorded span is ever current: the parent-based decision is always yes.
        match context::current() {
            Some(parent) => {
                let mut span = Self::start(
                    parent.trace_id,
                    parent.state,
                    Some((parent.span_id, false)),
                    None,
                    name,
                    kind,
                    attributes,
                );
                if let Some(record) = &mut span.0 {
                    record.statement = statement;
                }
                span
            }
            None => Span::none(),
        }
    }

    /// The root of a new trace, whatever is current (a cleanup run).
    pub fn root(
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let Some(installed) = super::installed() else {
            return Span::none();
        };
        Self::new_trace(installed, name, kind, attributes)
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
        let Some(installed) = super::installed() else {
            return Span::none();
        };
        match stored.and_then(|t| context::remote(t, None)) {
            Some(origin) => Self::under_remote(installed, origin, name, kind, true, attributes),
            None => Self::new_trace(installed, name, kind, attributes),
        }
    }

    /// A database client span inside the current one, named after the statement it runs (its
    /// name in the feature's `sql` module, e.g. `claim_and_create`): OpenTelemetry's database
    /// conventions, with nothing of the statement's parameters.
    pub fn database(statement: &'static str) -> Self {
        Self::child_of_current(statement, Kind::Client, Some(statement), Vec::new)
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

    /// A trace starting here: recorded as the ratio says (parent-based sampling asks it only
    /// for a new trace).
    fn new_trace(
        installed: &Installed,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let trace_id = context::new_trace_id();
        if !installed.samples(None, trace_id) {
            return Span::none();
        }
        Self::start(trace_id, None, None, None, name, kind, attributes)
    }

    /// A child of a remote span (`linked`: and linked to it), recorded when the remote side
    /// recorded its trace.
    fn under_remote(
        installed: &Installed,
        remote: Remote,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        linked: bool,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        if !installed.samples(Some(remote.sampled), remote.trace_id) {
            return Span::none();
        }
        let link = linked.then_some((remote.trace_id, remote.span_id));
        let parent = Some((remote.span_id, true));
        Self::start(
            remote.trace_id,
            remote.state,
            parent,
            link,
            name,
            kind,
            attributes,
        )
    }

    /// A recorded span. A span sampled out never gets here: it is no span at all (no context is
    /// carried, no child, attribute, log id or stored traceparent is made for it), so a trace
    /// not recorded costs little more than the sampler's decision.
    fn start(
        trace_id: u128,
        state: Option<std::sync::Arc<str>>,
        parent: Option<(u64, bool)>,
        link: Option<(u128, u64)>,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        attributes: impl FnOnce() -> Vec<KeyValue>,
    ) -> Self {
        let start = SystemTime::now();
        Span(Some(Box::new(Record {
            context: SpanContext {
                trace_id,
                span_id: context::new_span_id(),
                state,
            },
            parent,
            link,
            name: name.into(),
            kind,
            statement: None,
            start,
            end: start,
            data: Mutex::new(Data {
                attributes: attributes(),
                more: Vec::new(),
                status: Status::Unset,
            }),
        })))
    }

    /// Whether this span is recorded (tracing on and the trace sampled).
    pub fn is_recording(&self) -> bool {
        self.0.is_some()
    }

    /// Adds attributes, made only when the span is recorded.
    pub fn set(&self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(record) = &self.0 {
            let attributes = attributes();
            record.data().add(attributes);
        }
    }

    /// Marks the span failed: status Error and `error.type` (a class of failure, never a
    /// message that could quote a value: an SQLSTATE, a status code, `timeout`).
    pub fn fail(&self, error_type: impl Into<String>) {
        if let Some(record) = &self.0 {
            let error_type = error_type.into();
            let mut data = record.data();
            data.more
                .push(KeyValue::new("error.type", error_type.clone()));
            if data.attributes.is_empty() {
                data.attributes = std::mem::take(&mut data.more);
            }
            data.status = Status::Error(error_type);
        }
    }

    /// Ends the span now.
    pub fn end(self) {
        drop(self);
    }

    /// This span as a W3C `traceparent` header value, when there is one.
    pub fn traceparent(&self) -> Option<String> {
        self.0
            .as_ref()
            .map(|record| context::format(record.context.trace_id, record.context.span_id))
    }

    /// `future`, with this span current while it runs (each poll), so the spans it starts are
    /// this one's children and its log lines carry this span's ids. Without a span, `future`
    /// itself.
    pub fn in_scope<F: Future>(&self, future: F) -> Either<InScope<F>, F> {
        match &self.0 {
            Some(record) => Either::Left(InScope::new(record.context.clone(), future)),
            None => Either::Right(future),
        }
    }
}

impl Record {
    fn data(&self) -> std::sync::MutexGuard<'_, Data> {
        self.data.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Span {
    /// The end: the end time set, and the span encoded into the export queue (or dropped and
    /// counted when the queue is full), never waited for; its record freed on this thread.
    fn drop(&mut self) {
        if let Some(mut record) = self.0.take() {
            record.end = SystemTime::now();
            if let Some(installed) = super::installed() {
                installed.queue.push(&mut record);
            }
        }
    }
}

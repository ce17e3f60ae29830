//! The OTLP/HTTP request body — an `ExportTraceServiceRequest` in protobuf — written straight
//! from our ended span records into one buffer, field by field as `opentelemetry-proto`'s
//! messages encode them.
//!
//! Why not `opentelemetry-proto`'s messages and `prost`'s encoding of them: filling the messages
//! copies every span first (a `String` per attribute key and string value, a `Vec` per id; then
//! every one of them dropped), and `prost` measures each nested message again at every level it
//! is nested in. The process's resource and instrumentation scope, the same in every request,
//! are encoded once. The test below encodes the same spans both ways and requires the same
//! bytes, so the two cannot drift apart unnoticed when either crate changes.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opentelemetry::{Array, KeyValue, Value};

use super::context::SAMPLED;
use super::span::{Kind, Record, Status};

/// `SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`: whether the parent is remote is known.
const HAS_IS_REMOTE: u32 = 0x100;
/// `SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`: the parent is remote.
const IS_REMOTE: u32 = 0x200;

/// Protobuf wire types.
const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LENGTH_DELIMITED: u32 = 2;
const FIXED32: u32 = 5;

/// What every request repeats, encoded once: the process's resource and our instrumentation
/// scope.
#[derive(Debug)]
pub(super) struct Encoder {
    /// The `Resource` message's bytes.
    resource: Vec<u8>,
    /// The `InstrumentationScope` message's bytes.
    scope: Vec<u8>,
}

impl Encoder {
    /// The encoder of a process whose resource has `resource` as attributes, its spans made by
    /// the instrumentation scope `scope_name` `scope_version`.
    pub(super) fn new(resource: &[KeyValue], scope_name: &str, scope_version: &str) -> Self {
        let mut resource_bytes = Vec::new();
        for attribute in resource {
            nested(&mut resource_bytes, 1, |buf| key_value(buf, attribute));
        }
        let mut scope = Vec::new();
        string(&mut scope, 1, scope_name);
        string(&mut scope, 2, scope_version);
        Encoder {
            resource: resource_bytes,
            scope,
        }
    }

    /// How many bytes a batch keeps free before its spans for what [`Encoder::request`] writes
    /// there: the resource, the scope, and the keys and lengths around them.
    pub(super) fn header_room(&self) -> usize {
        4 * (1 + 10) + self.resource.len() + self.scope.len()
    }

    /// The request body that exports a batch: `batch` is [`Encoder::header_room`] bytes, then
    /// the spans' `ScopeSpans.spans` fields ([`append_span`]). The request's header — one
    /// `ResourceSpans` with our resource, one `ScopeSpans` with our scope — is written at the
    /// end of that room, and the body starts there: the spans are not copied again.
    pub(super) fn request(&self, mut batch: Vec<u8>) -> Bytes {
        let room = self.header_room();
        let spans = batch.len().saturating_sub(room);
        let scope_spans = field_len(self.scope.len()) + spans;
        let resource_spans = field_len(self.resource.len()) + field_len(scope_spans);
        let mut header = Vec::with_capacity(room);
        // ExportTraceServiceRequest.resource_spans
        key(&mut header, 1, LENGTH_DELIMITED);
        varint_raw(&mut header, resource_spans as u64);
        // ResourceSpans.resource
        bytes(&mut header, 1, &self.resource);
        // ResourceSpans.scope_spans: the scope, then the spans already in `batch`.
        key(&mut header, 2, LENGTH_DELIMITED);
        varint_raw(&mut header, scope_spans as u64);
        bytes(&mut header, 1, &self.scope);
        match room.checked_sub(header.len()) {
            Some(start) if batch.len() >= room => {
                batch[start..room].copy_from_slice(&header);
                Bytes::from(batch).slice(start..)
            }
            // Not a batch made with this encoder's room: copied behind the header.
            _ => {
                header.extend_from_slice(&batch[room.min(batch.len())..]);
                Bytes::from(header)
            }
        }
    }
}

/// A length-delimited field of `len` bytes, with its key (one byte: fields below 16) and length.
fn field_len(len: usize) -> usize {
    let mut length = [0u8; 10];
    1 + varint_into(&mut length, len as u64) + len
}

/// A span's `ScopeSpans.spans` field, its message [`span`] wrote into `message`, added to a
/// batch.
pub(super) fn append_span(batch: &mut Vec<u8>, message: &[u8]) {
    key(batch, 2, LENGTH_DELIMITED);
    varint_raw(batch, message.len() as u64);
    batch.extend_from_slice(message);
}

/// A length-delimited field `field` whose contents `body` writes in place, behind one byte kept
/// for their length: enough below 128 bytes (an attribute, a status); longer ones (a long
/// value) have their contents moved once to make room for the rest of their length.
#[inline]
fn nested(buf: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    key(buf, field, LENGTH_DELIMITED);
    let at = buf.len();
    buf.push(0);
    body(buf);
    let len = buf.len() - at - 1;
    match u8::try_from(len) {
        Ok(short) if short < 0x80 => buf[at] = short,
        _ => {
            let mut length = [0u8; 10];
            let used = varint_into(&mut length, len as u64);
            buf.splice(at..=at, length[..used].iter().copied());
        }
    }
}

/// `value` as a base-128 varint into `out`; answers how many bytes it took.
fn varint_into(out: &mut [u8; 10], mut value: u64) -> usize {
    let mut n = 0;
    while value >= 0x80 {
        out[n] = (value as u8) | 0x80;
        value >>= 7;
        n += 1;
    }
    out[n] = value as u8;
    n + 1
}

/// `value` as a base-128 varint: inlined, a constant below 128 (a key) is one push.
#[inline]
fn varint_raw(buf: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        buf.push((value as u8) | 0x80);
        value >>= 7;
    }
    buf.push(value as u8);
}

#[inline]
fn key(buf: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint_raw(buf, u64::from(field << 3 | wire_type));
}

/// A `string` or `bytes` field, left out when empty (proto3's default).
#[inline]
fn bytes(buf: &mut Vec<u8>, field: u32, value: &[u8]) {
    if !value.is_empty() {
        key(buf, field, LENGTH_DELIMITED);
        varint_raw(buf, value.len() as u64);
        buf.extend_from_slice(value);
    }
}

#[inline]
fn string(buf: &mut Vec<u8>, field: u32, value: &str) {
    bytes(buf, field, value.as_bytes());
}

/// A `uint32` or enum field, left out when zero.
#[inline]
fn varint(buf: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        key(buf, field, VARINT);
        varint_raw(buf, value);
    }
}

/// A `fixed32` field, left out when zero.
#[inline]
fn fixed32(buf: &mut Vec<u8>, field: u32, value: u32) {
    if value != 0 {
        key(buf, field, FIXED32);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

/// A `fixed64` field, left out when zero.
#[inline]
fn fixed64(buf: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        key(buf, field, FIXED64);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// `SpanFlags`: the W3C flags (sampled: a recorded span, or a link to one), and whether the
/// parent (or the linked span) is remote.
fn flags(remote: bool) -> u32 {
    u32::from(SAMPLED) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

/// The `Span` message of an ended span, into `buf`: its fields in the order of their numbers,
/// as `prost` writes them.
pub(super) fn span(buf: &mut Vec<u8>, record: &mut Record) {
    // Room for a span as the daemon makes them, so that no field grows the buffer.
    buf.reserve(1024);
    let context = &record.context;
    bytes(buf, 1, &context.trace_id.to_be_bytes());
    bytes(buf, 2, &context.span_id.to_be_bytes());
    string(buf, 3, context.state.as_deref().unwrap_or_default());
    if let Some((parent, _)) = record.parent {
        bytes(buf, 4, &parent.to_be_bytes());
    }
    string(buf, 5, &record.name);
    varint(buf, 6, span_kind(record.kind));
    fixed64(buf, 7, nanos(record.start));
    fixed64(buf, 8, nanos(record.end));
    // The record is ending: no one else holds it, no lock to take.
    let data = record
        .data
        .get_mut()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(statement) = record.statement {
        // A database span's two attributes, which it carries as its statement's name.
        small_attribute(buf, b"db.system.name", &[], b"postgresql");
        small_attribute(buf, b"db.query.summary", &[], statement.as_bytes());
    }
    for attribute in data.attributes.iter().chain(&data.more) {
        attribute_field(buf, attribute);
    }
    if let Some((trace_id, span_id)) = record.link {
        nested(buf, 13, |buf| {
            bytes(buf, 1, &trace_id.to_be_bytes());
            bytes(buf, 2, &span_id.to_be_bytes());
            fixed32(buf, 6, flags(true));
        });
    }
    // Always present, as the SDK's conversion makes it (an unset status is an empty message).
    nested(buf, 15, |buf| {
        if let Status::Error(description) = &data.status {
            string(buf, 2, description);
            varint(buf, 3, 2);
        }
    });
    // Declared after the parent's id, numbered (and so encoded) last.
    let remote_parent = record.parent.is_some_and(|(_, remote)| remote);
    fixed32(buf, 16, flags(remote_parent));
}

fn span_kind(kind: Kind) -> u64 {
    match kind {
        Kind::Internal => 1,
        Kind::Server => 2,
        Kind::Client => 3,
    }
}

/// A `Span.attributes` field. The values the daemon makes (a short text, an integer, a flag)
/// are written in one go, their lengths known beforehand; any other through [`key_value`].
#[inline]
fn attribute_field(buf: &mut Vec<u8>, attribute: &KeyValue) {
    let key = attribute.key.as_str().as_bytes();
    let mut scalar = [0u8; 11];
    let (head, text): (&[u8], &[u8]) = match &attribute.value {
        Value::String(s) => (&[], s.as_str().as_bytes()),
        Value::I64(i) => {
            scalar[0] = (3 << 3 | VARINT) as u8;
            let mut digits = [0u8; 10];
            let used = varint_into(&mut digits, u64::from_ne_bytes(i.to_ne_bytes()));
            scalar[1..=used].copy_from_slice(&digits[..used]);
            (&scalar[..=used], &[])
        }
        Value::Bool(b) => {
            scalar[..2].copy_from_slice(&[(2 << 3 | VARINT) as u8, u8::from(*b)]);
            (&scalar[..2], &[])
        }
        _ => return nested(buf, 9, |buf| key_value(buf, attribute)),
    };
    if !small_attribute(buf, key, head, text) {
        nested(buf, 9, |buf| key_value(buf, attribute));
    }
}

/// A `Span.attributes` field whose value is `head` (a scalar's field) or else the text `text`,
/// written in one go when every length fits in one byte and the key is not empty (an empty key
/// is left out, as proto3 does); answers whether it was.
#[inline]
fn small_attribute(buf: &mut Vec<u8>, key: &[u8], head: &[u8], text: &[u8]) -> bool {
    // AnyValue: the scalar's field, or string_value (key, length, text).
    let any_len = if head.is_empty() {
        2 + text.len()
    } else {
        head.len()
    };
    // KeyValue: key (key, length, key), value (key, length, AnyValue).
    let key_value_len = 2 + key.len() + 2 + any_len;
    if key.is_empty() || key_value_len >= 0x80 {
        return false;
    }
    buf.extend_from_slice(&[
        (9 << 3 | LENGTH_DELIMITED) as u8,
        key_value_len as u8,
        (1 << 3 | LENGTH_DELIMITED) as u8,
        key.len() as u8,
    ]);
    buf.extend_from_slice(key);
    buf.extend_from_slice(&[(2 << 3 | LENGTH_DELIMITED) as u8, any_len as u8]);
    if head.is_empty() {
        buf.extend_from_slice(&[(1 << 3 | LENGTH_DELIMITED) as u8, text.len() as u8]);
        buf.extend_from_slice(text);
    } else {
        buf.extend_from_slice(head);
    }
    true
}

/// `KeyValue`: the key, and the value (always present).
#[inline]
fn key_value(buf: &mut Vec<u8>, attribute: &KeyValue) {
    string(buf, 1, attribute.key.as_str());
    nested(buf, 2, |buf| any_value(buf, &attribute.value));
}

/// `AnyValue`: a oneof, so its one field is written even when it holds its type's zero.
fn any_value(buf: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Bool(b) => bool_value(buf, *b),
        Value::I64(i) => int_value(buf, *i),
        Value::F64(f) => double_value(buf, *f),
        Value::String(s) => string_value(buf, s.as_str()),
        Value::Array(array) => nested(buf, 5, |buf| match array {
            Array::Bool(values) => array_values(buf, values, |buf, b| bool_value(buf, *b)),
            Array::I64(values) => array_values(buf, values, |buf, i| int_value(buf, *i)),
            Array::F64(values) => array_values(buf, values, |buf, f| double_value(buf, *f)),
            Array::String(values) => {
                array_values(buf, values, |buf, s| string_value(buf, s.as_str()));
            }
            // A kind of array this encoder does not know yet: its text.
            other => nested(buf, 1, |buf| string_value(buf, &other.to_string())),
        }),
        // A kind of value this encoder does not know yet: its text.
        other => string_value(buf, other.as_str().as_ref()),
    }
}

#[inline]
fn bool_value(buf: &mut Vec<u8>, value: bool) {
    key(buf, 2, VARINT);
    varint_raw(buf, u64::from(value));
}

#[inline]
fn int_value(buf: &mut Vec<u8>, value: i64) {
    key(buf, 3, VARINT);
    // int64: two's complement, as prost encodes it.
    varint_raw(buf, u64::from_ne_bytes(value.to_ne_bytes()));
}

#[inline]
fn double_value(buf: &mut Vec<u8>, value: f64) {
    key(buf, 4, FIXED64);
    buf.extend_from_slice(&value.to_le_bytes());
}

#[inline]
fn string_value(buf: &mut Vec<u8>, value: &str) {
    key(buf, 1, LENGTH_DELIMITED);
    varint_raw(buf, value.len() as u64);
    buf.extend_from_slice(value.as_bytes());
}

/// `ArrayValue.values`.
#[inline]
fn array_values<T>(buf: &mut Vec<u8>, values: &[T], value: impl Fn(&mut Vec<u8>, &T)) {
    for v in values {
        nested(buf, 1, |buf| value(buf, v));
    }
}

#[cfg(test)]
mod tests {
    use super::super::context::SpanContext;
    use super::super::span::Data;
    use super::*;
    use opentelemetry::StringValue;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1 as common;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1 as trace;
    use prost::Message as _;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    fn every_kind_of_value() -> Vec<KeyValue> {
        vec![
            KeyValue::new("s", "text"),
            KeyValue::new("empty", ""),
            KeyValue::new("owned", String::from("owned text")),
            KeyValue::new("i", 42i64),
            KeyValue::new("zero", 0i64),
            KeyValue::new("negative", -7i64),
            KeyValue::new("f", 1.5f64),
            KeyValue::new("b", true),
            KeyValue::new("no", false),
            KeyValue::new("bools", Value::Array(vec![true, false].into())),
            KeyValue::new("ints", Value::Array(vec![1i64, -2].into())),
            KeyValue::new("floats", Value::Array(vec![0.25f64].into())),
            KeyValue::new(
                "strings",
                Value::Array(vec![StringValue::from("a"), StringValue::from("")].into()),
            ),
            // Long enough that the attribute's length takes two bytes.
            KeyValue::new("long", "x".repeat(300)),
            KeyValue::new("almost long", "x".repeat(110)),
            KeyValue::new("min", i64::MIN),
            KeyValue::new("", "no key"),
        ]
    }

    /// Spans of every shape: each kind, with and without a parent (local and remote), a link,
    /// a trace state, attributes added later, each status; one so long its length takes three
    /// bytes, one without attributes.
    fn record(n: u64) -> Record {
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        let mut attributes = every_kind_of_value();
        let mut more = vec![KeyValue::new("later", n as i64)];
        match n % 4 {
            0 => more.clear(),
            1 => attributes.clear(),
            2 => attributes.push(KeyValue::new("big", "y".repeat(20_000))),
            _ => {}
        }
        Record {
            context: SpanContext {
                trace_id: 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736 + u128::from(n),
                span_id: 0x00f0_67aa_0ba9_02b7 + n,
                state: (n % 2 == 0).then(|| Arc::from("vendor=value,other=x")),
            },
            parent: match n % 3 {
                0 => None,
                1 => Some((n, false)),
                _ => Some((n, true)),
            },
            link: (n % 5 == 1).then_some((9, 8)),
            name: format!("span {n}").into(),
            kind: [Kind::Internal, Kind::Server, Kind::Client][(n % 3) as usize],
            statement: (n % 3 == 2).then_some("claim_and_create"),
            start,
            end: start + Duration::from_micros(57),
            data: Mutex::new(Data {
                attributes,
                more,
                status: if n % 2 == 0 {
                    Status::Unset
                } else {
                    Status::Error("55P03".to_owned())
                },
            }),
        }
    }

    /// `opentelemetry-proto`'s own conversion of an attribute value.
    fn proto_value(value: &Value) -> common::AnyValue {
        use common::any_value::Value as V;
        let array = |values: Vec<common::AnyValue>| V::ArrayValue(common::ArrayValue { values });
        let value = match value {
            Value::Bool(b) => V::BoolValue(*b),
            Value::I64(i) => V::IntValue(*i),
            Value::F64(f) => V::DoubleValue(*f),
            Value::String(s) => V::StringValue(s.to_string()),
            Value::Array(Array::Bool(v)) => {
                array(v.iter().map(|b| proto_value(&Value::Bool(*b))).collect())
            }
            Value::Array(Array::I64(v)) => {
                array(v.iter().map(|i| proto_value(&Value::I64(*i))).collect())
            }
            Value::Array(Array::F64(v)) => {
                array(v.iter().map(|f| proto_value(&Value::F64(*f))).collect())
            }
            Value::Array(Array::String(v)) => array(
                v.iter()
                    .map(|s| proto_value(&Value::String(s.clone())))
                    .collect(),
            ),
            other => panic!("not used: {other:?}"),
        };
        common::AnyValue { value: Some(value) }
    }

    fn proto_attributes<'a>(
        attributes: impl Iterator<Item = &'a KeyValue>,
    ) -> Vec<common::KeyValue> {
        attributes
            .map(|a| common::KeyValue {
                key: a.key.to_string(),
                value: Some(proto_value(&a.value)),
                key_strindex: 0,
            })
            .collect()
    }

    /// The record as `opentelemetry-proto`'s `Span` message, field by field.
    fn proto_span(record: &Record) -> trace::Span {
        let data = record.data.lock().unwrap();
        let flags = |remote: bool| 0x101 | if remote { 0x200 } else { 0 };
        trace::Span {
            trace_id: record.context.trace_id.to_be_bytes().to_vec(),
            span_id: record.context.span_id.to_be_bytes().to_vec(),
            trace_state: record.context.state.as_deref().unwrap_or("").to_owned(),
            parent_span_id: record
                .parent
                .map(|(id, _)| id.to_be_bytes().to_vec())
                .unwrap_or_default(),
            flags: flags(record.parent.is_some_and(|(_, remote)| remote)),
            name: record.name.to_string(),
            kind: match record.kind {
                Kind::Internal => trace::span::SpanKind::Internal,
                Kind::Server => trace::span::SpanKind::Server,
                Kind::Client => trace::span::SpanKind::Client,
            } as i32,
            start_time_unix_nano: nanos(record.start),
            end_time_unix_nano: nanos(record.end),
            attributes: proto_attributes(
                record
                    .statement
                    .map(|statement| {
                        [
                            KeyValue::new("db.system.name", "postgresql"),
                            KeyValue::new("db.query.summary", statement),
                        ]
                    })
                    .iter()
                    .flatten()
                    .chain(&data.attributes)
                    .chain(&data.more),
            ),
            dropped_attributes_count: 0,
            events: Vec::new(),
            dropped_events_count: 0,
            links: record
                .link
                .map(|(trace_id, span_id)| trace::span::Link {
                    trace_id: trace_id.to_be_bytes().to_vec(),
                    span_id: span_id.to_be_bytes().to_vec(),
                    trace_state: String::new(),
                    attributes: Vec::new(),
                    dropped_attributes_count: 0,
                    flags: flags(true),
                })
                .into_iter()
                .collect(),
            dropped_links_count: 0,
            status: Some(match &data.status {
                Status::Unset => trace::Status::default(),
                Status::Error(description) => trace::Status {
                    message: description.clone(),
                    code: trace::status::StatusCode::Error as i32,
                },
            }),
        }
    }

    #[test]
    fn spans_are_encoded_as_opentelemetry_proto_encodes_them() {
        let resource = [
            KeyValue::new("service.name", "tombstoned"),
            KeyValue::new("service.version", "1"),
        ];
        let encoder = Encoder::new(&resource, "tombstoned", "0.1.0");
        let resource_message = Resource {
            attributes: proto_attributes(resource.iter()),
            dropped_attributes_count: 0,
            entity_refs: Vec::new(),
        };
        let mut spans: Vec<Record> = (0..12).map(record).collect();
        let expected = ExportTraceServiceRequest {
            resource_spans: vec![trace::ResourceSpans {
                resource: Some(resource_message.clone()),
                scope_spans: vec![trace::ScopeSpans {
                    scope: Some(common::InstrumentationScope {
                        name: "tombstoned".to_owned(),
                        version: "0.1.0".to_owned(),
                        attributes: Vec::new(),
                        dropped_attributes_count: 0,
                    }),
                    spans: spans.iter().map(proto_span).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let encoded = encoder.request(batch(&encoder, &mut spans));
        assert_eq!(
            ExportTraceServiceRequest::decode(&encoded[..]).unwrap(),
            expected
        );
        assert!(encoded == expected.encode_to_vec(), "not byte for byte");

        // One short span (its length one byte).
        let mut short = vec![record(1)];
        short[0].name = "x".into();
        short[0].data.get_mut().unwrap().more.clear();
        short[0].link = None;
        let one = ExportTraceServiceRequest {
            resource_spans: vec![trace::ResourceSpans {
                resource: Some(resource_message.clone()),
                scope_spans: vec![trace::ScopeSpans {
                    spans: vec![proto_span(&short[0])],
                    ..expected.resource_spans[0].scope_spans[0].clone()
                }],
                schema_url: String::new(),
            }],
        };
        assert!(one.resource_spans[0].scope_spans[0].spans[0].encoded_len() < 128);
        assert!(encoder.request(batch(&encoder, &mut short)) == one.encode_to_vec());
        // A batch without its room is still encoded whole (copied behind the header).
        let mut unroomed = batch(&encoder, &mut short);
        unroomed.drain(..encoder.header_room() - 1);
        let unroomed = encoder.request(unroomed);
        assert!(ExportTraceServiceRequest::decode(&unroomed[..]).is_ok());
    }

    /// A batch as the queue makes it: the header's room, then each span's field.
    fn batch(encoder: &Encoder, spans: &mut [Record]) -> Vec<u8> {
        let mut batch = vec![0; encoder.header_room()];
        let mut message = Vec::new();
        for record in spans {
            message.clear();
            span(&mut message, record);
            append_span(&mut batch, &message);
        }
        batch
    }
}

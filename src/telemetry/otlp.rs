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

use opentelemetry::{Array, KeyValue, Value};

use super::context::SAMPLED;
use super::span::{Ended, Kind, Record, Status};

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

    /// The request body that exports `spans`: one resource, one scope, the spans in order.
    pub(super) fn request(&self, spans: &mut [Ended]) -> Vec<u8> {
        // Room for the spans as the daemon makes them (300-500 bytes each), so the buffer is
        // seldom grown (each growth copies it).
        let mut buf = Vec::with_capacity(512 * spans.len() + 256);
        // ExportTraceServiceRequest.resource_spans
        nested_in(&mut buf, 1, 3, |buf| {
            // ResourceSpans.resource
            bytes(buf, 1, &self.resource);
            if spans.is_empty() {
                return;
            }
            // ResourceSpans.scope_spans
            nested_in(buf, 2, 3, |buf| {
                bytes(buf, 1, &self.scope);
                for record in spans.iter_mut() {
                    nested_in(buf, 2, 2, |buf| span(buf, record));
                }
            });
        });
        buf
    }
}

/// A length-delimited field `field` whose contents `body` writes in place, behind `room` bytes
/// kept for their length: the right guess (one byte for an attribute, two for a span, three
/// for a batch) costs nothing more; a wrong one moves the contents once.
fn nested_in(buf: &mut Vec<u8>, field: u32, room: usize, body: impl FnOnce(&mut Vec<u8>)) {
    key(buf, field, LENGTH_DELIMITED);
    let at = buf.len();
    buf.extend_from_slice(&[0u8; 10][..room]);
    body(buf);
    let mut length = [0u8; 10];
    let used = varint_into(&mut length, (buf.len() - at - room) as u64);
    if used == room {
        buf[at..at + room].copy_from_slice(&length[..used]);
    } else {
        buf.splice(at..at + room, length[..used].iter().copied());
    }
}

/// [`nested_in`] with a byte for the length: what fits in one (below 128 bytes).
fn nested(buf: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    nested_in(buf, field, 1, body);
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

fn varint_raw(buf: &mut Vec<u8>, value: u64) {
    let mut bytes = [0u8; 10];
    let used = varint_into(&mut bytes, value);
    buf.extend_from_slice(&bytes[..used]);
}

fn key(buf: &mut Vec<u8>, field: u32, wire_type: u32) {
    varint_raw(buf, u64::from(field << 3 | wire_type));
}

/// A `string` or `bytes` field, left out when empty (proto3's default).
fn bytes(buf: &mut Vec<u8>, field: u32, value: &[u8]) {
    if !value.is_empty() {
        key(buf, field, LENGTH_DELIMITED);
        varint_raw(buf, value.len() as u64);
        buf.extend_from_slice(value);
    }
}

fn string(buf: &mut Vec<u8>, field: u32, value: &str) {
    bytes(buf, field, value.as_bytes());
}

/// A `uint32` or enum field, left out when zero.
fn varint(buf: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        key(buf, field, VARINT);
        varint_raw(buf, value);
    }
}

/// A `fixed32` field, left out when zero.
fn fixed32(buf: &mut Vec<u8>, field: u32, value: u32) {
    if value != 0 {
        key(buf, field, FIXED32);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

/// A `fixed64` field, left out when zero.
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

/// `Span`, its fields in the order of their numbers, as `prost` writes them.
fn span(buf: &mut Vec<u8>, record: &mut Record) {
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
    // The record is the export's alone now: no lock to take.
    let data = record
        .data
        .get_mut()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for attribute in data.attributes.iter().chain(&data.more) {
        nested(buf, 9, |buf| key_value(buf, attribute));
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

/// `KeyValue`: the key, and the value (always present).
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

fn bool_value(buf: &mut Vec<u8>, value: bool) {
    key(buf, 2, VARINT);
    varint_raw(buf, u64::from(value));
}

fn int_value(buf: &mut Vec<u8>, value: i64) {
    key(buf, 3, VARINT);
    // int64: two's complement, as prost encodes it.
    varint_raw(buf, u64::from_ne_bytes(value.to_ne_bytes()));
}

fn double_value(buf: &mut Vec<u8>, value: f64) {
    key(buf, 4, FIXED64);
    buf.extend_from_slice(&value.to_le_bytes());
}

fn string_value(buf: &mut Vec<u8>, value: &str) {
    key(buf, 1, LENGTH_DELIMITED);
    varint_raw(buf, value.len() as u64);
    buf.extend_from_slice(value.as_bytes());
}

/// `ArrayValue.values`.
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
        ]
    }

    /// Spans of every shape: each kind, with and without a parent (local and remote), a link,
    /// a trace state, attributes added later, each status; one so long its length takes three
    /// bytes, one without attributes.
    fn record(n: u64) -> Ended {
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        let mut attributes = every_kind_of_value();
        let mut more = vec![KeyValue::new("later", n as i64)];
        match n % 4 {
            0 => more.clear(),
            1 => attributes.clear(),
            2 => attributes.push(KeyValue::new("big", "y".repeat(20_000))),
            _ => {}
        }
        Box::new(Record {
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
        })
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
            attributes: proto_attributes(data.attributes.iter().chain(&data.more)),
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
        let mut spans: Vec<Ended> = (0..12).map(record).collect();
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
                    spans: spans.iter().map(|s| proto_span(s)).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        let encoded = encoder.request(&mut spans);
        assert_eq!(
            ExportTraceServiceRequest::decode(encoded.as_slice()).unwrap(),
            expected
        );
        assert!(encoded == expected.encode_to_vec(), "not byte for byte");

        // One short span (its length one byte), and an empty batch: still well-formed.
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
        assert!(encoder.request(&mut short) == one.encode_to_vec());
        let none = ExportTraceServiceRequest {
            resource_spans: vec![trace::ResourceSpans {
                resource: Some(resource_message),
                scope_spans: Vec::new(),
                schema_url: String::new(),
            }],
        };
        assert!(encoder.request(&mut []) == none.encode_to_vec());
    }
}

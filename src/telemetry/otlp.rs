//! The OTLP/HTTP request body — an `ExportTraceServiceRequest` in protobuf — written straight
//! from the SDK's ended spans into one buffer, field by field as `opentelemetry-proto`'s messages
//! encode them.
//!
//! Why not `opentelemetry-proto`'s conversion and `prost`'s encoding of its messages: the
//! conversion copies every span into message structs first (a `String` per attribute key, made
//! through `Display`, and per string value; a `Vec` per id; then every one of them dropped), and
//! `prost` measures each nested message again at every level it is nested in. With tracing on,
//! that was a third of what a traced replay added to the daemon's CPU (scenario 12). The test
//! below encodes the same spans both ways and requires the same bytes, so the two cannot drift
//! apart unnoticed when either crate changes.

use std::time::{SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanContext, SpanId, SpanKind, Status};
use opentelemetry::{Array, InstrumentationScope, KeyValue, StringValue, Value};
use opentelemetry_proto::tonic::resource::v1::Resource as ResourceMessage;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_sdk::trace::SpanData;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message as _;

/// `SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK`: whether the parent is remote is known.
const HAS_IS_REMOTE: u32 = 0x100;
/// `SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK`: the parent is remote.
const IS_REMOTE: u32 = 0x200;

/// What every request repeats: the process's resource, encoded once.
#[derive(Debug)]
pub(super) struct Encoder {
    /// The `Resource` message's bytes.
    resource: Vec<u8>,
    /// The resource's schema URL (usually empty).
    resource_schema_url: String,
}

impl Encoder {
    pub(super) fn new(resource: &ResourceAttributesWithSchema) -> Self {
        Encoder {
            resource: ResourceMessage {
                attributes: resource.attributes.0.clone(),
                dropped_attributes_count: 0,
                entity_refs: Vec::new(),
            }
            .encode_to_vec(),
            resource_schema_url: resource.schema_url.clone().unwrap_or_default(),
        }
    }

    /// The request body that exports `spans`: one resource, the spans grouped by their
    /// instrumentation scope in the order each scope first appears.
    pub(super) fn request(&self, spans: &[SpanData]) -> Vec<u8> {
        let mut scopes: Vec<&InstrumentationScope> = Vec::new();
        for span in spans {
            if !scopes.contains(&&span.instrumentation_scope) {
                scopes.push(&span.instrumentation_scope);
            }
        }
        // Room for the spans as the daemon makes them (300-500 bytes each), so the buffer is
        // seldom grown (each growth copies it).
        let mut buf = Vec::with_capacity(512 * spans.len() + 256);
        // ExportTraceServiceRequest.resource_spans
        nested(&mut buf, 1, |buf| {
            // ResourceSpans.resource
            encode_key(1, WireType::LengthDelimited, buf);
            encode_varint(self.resource.len() as u64, buf);
            buf.extend_from_slice(&self.resource);
            for scope in &scopes {
                // ResourceSpans.scope_spans
                nested(buf, 2, |buf| {
                    nested(buf, 1, |buf| instrumentation_scope(buf, scope));
                    for span in spans.iter().filter(|s| s.instrumentation_scope == **scope) {
                        nested(buf, 2, |buf| self::span(buf, span));
                    }
                    string(buf, 3, scope.schema_url().unwrap_or_default());
                });
            }
            string(buf, 3, &self.resource_schema_url);
        });
        buf
    }
}

/// A length-delimited field `field` whose contents `body` writes: written in place behind one
/// byte kept for the length, which is enough below 128 bytes (an attribute, a status); a longer
/// one (a span, the batch) has its contents moved once to make room for the rest of its length.
fn nested(buf: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    encode_key(field, WireType::LengthDelimited, buf);
    let at = buf.len();
    buf.push(0);
    body(buf);
    let len = buf.len() - at - 1;
    match u8::try_from(len) {
        Ok(short) if short < 0x80 => buf[at] = short,
        _ => {
            let mut length = [0u8; 10];
            let mut rest = &mut length[..];
            encode_varint(len as u64, &mut rest);
            let used = 10 - rest.len();
            buf.splice(at..=at, length[..used].iter().copied());
        }
    }
}

/// A `string` or `bytes` field, left out when empty (proto3's default).
fn bytes(buf: &mut Vec<u8>, field: u32, value: &[u8]) {
    if !value.is_empty() {
        encode_key(field, WireType::LengthDelimited, buf);
        encode_varint(value.len() as u64, buf);
        buf.extend_from_slice(value);
    }
}

fn string(buf: &mut Vec<u8>, field: u32, value: &str) {
    bytes(buf, field, value.as_bytes());
}

/// A `uint32` or enum field, left out when zero.
fn varint(buf: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        encode_key(field, WireType::Varint, buf);
        encode_varint(value, buf);
    }
}

/// A `fixed32` field, left out when zero.
fn fixed32(buf: &mut Vec<u8>, field: u32, value: u32) {
    if value != 0 {
        encode_key(field, WireType::ThirtyTwoBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

/// A `fixed64` field, left out when zero.
fn fixed64(buf: &mut Vec<u8>, field: u32, value: u64) {
    if value != 0 {
        encode_key(field, WireType::SixtyFourBit, buf);
        buf.extend_from_slice(&value.to_le_bytes());
    }
}

fn nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn flags(context: &SpanContext, parent_is_remote: bool) -> u32 {
    let remote = if parent_is_remote { IS_REMOTE } else { 0 };
    u32::from(context.trace_flags().to_u8()) | HAS_IS_REMOTE | remote
}

/// `InstrumentationScope`: name, version, attributes.
fn instrumentation_scope(buf: &mut Vec<u8>, scope: &InstrumentationScope) {
    string(buf, 1, scope.name());
    string(buf, 2, scope.version().unwrap_or_default());
    for attribute in scope.attributes() {
        nested(buf, 3, |buf| key_value(buf, attribute));
    }
}

/// `Span`, its fields in the order of their numbers, as `prost` writes them.
fn span(buf: &mut Vec<u8>, span: &SpanData) {
    let context = &span.span_context;
    bytes(buf, 1, &context.trace_id().to_bytes());
    bytes(buf, 2, &context.span_id().to_bytes());
    string(buf, 3, &context.trace_state().header());
    if span.parent_span_id != SpanId::INVALID {
        bytes(buf, 4, &span.parent_span_id.to_bytes());
    }
    string(buf, 5, &span.name);
    varint(buf, 6, span_kind(&span.span_kind));
    fixed64(buf, 7, nanos(span.start_time));
    fixed64(buf, 8, nanos(span.end_time));
    for attribute in &span.attributes {
        nested(buf, 9, |buf| key_value(buf, attribute));
    }
    varint(buf, 10, u64::from(span.dropped_attributes_count));
    for event in span.events.iter() {
        nested(buf, 11, |buf| {
            fixed64(buf, 1, nanos(event.timestamp));
            string(buf, 2, &event.name);
            for attribute in &event.attributes {
                nested(buf, 3, |buf| key_value(buf, attribute));
            }
            varint(buf, 4, u64::from(event.dropped_attributes_count));
        });
    }
    varint(buf, 12, u64::from(span.events.dropped_count));
    for link in span.links.iter() {
        nested(buf, 13, |buf| {
            let linked = &link.span_context;
            bytes(buf, 1, &linked.trace_id().to_bytes());
            bytes(buf, 2, &linked.span_id().to_bytes());
            string(buf, 3, &linked.trace_state().header());
            for attribute in &link.attributes {
                nested(buf, 4, |buf| key_value(buf, attribute));
            }
            varint(buf, 5, u64::from(link.dropped_attributes_count));
            fixed32(buf, 6, flags(linked, linked.is_remote()));
        });
    }
    varint(buf, 14, u64::from(span.links.dropped_count));
    // Always present, as the SDK's conversion makes it (an unset status is an empty message).
    nested(buf, 15, |buf| match &span.status {
        Status::Error { description } => {
            string(buf, 2, description);
            varint(buf, 3, 2);
        }
        Status::Ok => varint(buf, 3, 1),
        Status::Unset => {}
    });
    // Declared after the parent's id, numbered (and so encoded) last.
    fixed32(buf, 16, flags(context, span.parent_span_is_remote));
}

fn span_kind(kind: &SpanKind) -> u64 {
    match kind {
        SpanKind::Internal => 1,
        SpanKind::Server => 2,
        SpanKind::Client => 3,
        SpanKind::Producer => 4,
        SpanKind::Consumer => 5,
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
        Value::Bool(b) => {
            encode_key(2, WireType::Varint, buf);
            encode_varint(u64::from(*b), buf);
        }
        Value::I64(i) => {
            encode_key(3, WireType::Varint, buf);
            // int64: two's complement, as prost encodes it.
            encode_varint(u64::from_ne_bytes(i.to_ne_bytes()), buf);
        }
        Value::F64(f) => {
            encode_key(4, WireType::SixtyFourBit, buf);
            buf.extend_from_slice(&f.to_le_bytes());
        }
        Value::String(s) => oneof_string(buf, s.as_str()),
        Value::Array(array) => nested(buf, 5, |buf| match array {
            Array::Bool(values) => array_values(buf, values, |b| Value::Bool(*b)),
            Array::I64(values) => array_values(buf, values, |i| Value::I64(*i)),
            Array::F64(values) => array_values(buf, values, |f| Value::F64(*f)),
            Array::String(values) => {
                array_values(buf, values, |s: &StringValue| Value::String(s.clone()));
            }
            // A kind of array this encoder does not know yet: its text.
            other => nested(buf, 1, |buf| oneof_string(buf, &other.to_string())),
        }),
        // A kind of value this encoder does not know yet: its text.
        other => oneof_string(buf, other.as_str().as_ref()),
    }
}

fn oneof_string(buf: &mut Vec<u8>, value: &str) {
    encode_key(1, WireType::LengthDelimited, buf);
    encode_varint(value.len() as u64, buf);
    buf.extend_from_slice(value.as_bytes());
}

/// `ArrayValue.values`.
fn array_values<T>(buf: &mut Vec<u8>, values: &[T], value: impl Fn(&T) -> Value) {
    for v in values {
        nested(buf, 1, |buf| any_value(buf, &value(v)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Event, Link, TraceFlags, TraceId, TraceState};
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
    use opentelemetry_sdk::trace::{SpanEvents, SpanLinks};
    use opentelemetry_sdk::Resource;
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
        ]
    }

    fn span_data(n: u64, scope: &InstrumentationScope) -> SpanData {
        let state = TraceState::from_key_value([("vendor", "value")]).unwrap();
        let start = UNIX_EPOCH + Duration::from_nanos(1_700_000_000_123_456_789 + n);
        SpanData {
            span_context: SpanContext::new(
                TraceId::from(0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736 + u128::from(n)),
                SpanId::from(0x00f0_67aa_0ba9_02b7 + n),
                TraceFlags::SAMPLED,
                false,
                if n % 2 == 0 {
                    state.clone()
                } else {
                    TraceState::default()
                },
            ),
            parent_span_id: if n % 3 == 0 {
                SpanId::INVALID
            } else {
                SpanId::from(n)
            },
            parent_span_is_remote: n % 2 == 1,
            span_kind: [
                SpanKind::Internal,
                SpanKind::Server,
                SpanKind::Client,
                SpanKind::Producer,
                SpanKind::Consumer,
            ][(n % 5) as usize]
                .clone(),
            name: format!("span {n}").into(),
            start_time: start,
            end_time: start + Duration::from_micros(57),
            attributes: every_kind_of_value(),
            dropped_attributes_count: (n % 2) as u32,
            events: {
                let mut events = SpanEvents::default();
                events.events = vec![Event::new(
                    "event",
                    start + Duration::from_micros(3),
                    vec![KeyValue::new("k", "v")],
                    1,
                )];
                events.dropped_count = 2;
                events
            },
            links: {
                let mut links = SpanLinks::default();
                links.links = vec![Link::new(
                    SpanContext::new(
                        TraceId::from(9),
                        SpanId::from(8),
                        TraceFlags::default(),
                        true,
                        state,
                    ),
                    vec![KeyValue::new("link", 1i64)],
                    3,
                )];
                links.dropped_count = 1;
                links
            },
            status: match n % 3 {
                0 => Status::Unset,
                1 => Status::Ok,
                _ => Status::error("55P03"),
            },
            instrumentation_scope: scope.clone(),
        }
    }

    #[test]
    fn spans_are_encoded_as_opentelemetry_proto_encodes_them() {
        let resource = ResourceAttributesWithSchema::from(
            &Resource::builder_empty()
                .with_service_name("tombstoned")
                .with_attributes([KeyValue::new("service.version", "1")])
                .build(),
        );
        let ours = InstrumentationScope::builder("tombstoned")
            .with_version("0.1.0")
            .build();
        let other = InstrumentationScope::builder("other")
            .with_schema_url("https://opentelemetry.io/schemas/1.0.0")
            .with_attributes([KeyValue::new("scope.attribute", true)])
            .build();
        let spans: Vec<SpanData> = (0..12)
            .map(|n| span_data(n, if n % 4 == 3 { &other } else { &ours }))
            .collect();
        let expected = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(spans.clone(), &resource),
        };
        let encoded = Encoder::new(&resource).request(&spans);
        assert_eq!(
            ExportTraceServiceRequest::decode(encoded.as_slice()).unwrap(),
            expected
        );
        assert!(encoded == expected.encode_to_vec(), "not byte for byte");
        // An empty batch is still a well-formed request.
        let empty = Encoder::new(&resource).request(&[]);
        assert!(ExportTraceServiceRequest::decode(empty.as_slice()).is_ok());
    }
}

//! The `POST /v1/orders` body: strict JSON parsing (duplicate keys and deep nesting refused) and
//! validation of every field into an [`OrderRequest`], reporting *all* offending fields at once.
//!
//! Nothing here touches the database: a request refused here never consumes its idempotency key.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use crate::money::{self, Currency, CurrencyError};

/// Text fields (`request_id`, `item`, `recipient`) hold 1 to this many characters (Unicode scalar
/// values, as PostgreSQL's `char_length` counts them; the `orders` CHECK constraints agree).
pub const MAX_TEXT_CHARS: usize = 255;

/// Arrays and objects may nest this deep (the body itself is level 1).
pub const MAX_DEPTH: usize = 32;

/// A validated order request, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct OrderRequest {
    /// The business id of the purchase request (unique per tenant).
    pub request_id: String,
    /// The amount in minor units of `currency`, > 0.
    pub amount_minor: i64,
    /// The currency.
    pub currency: Currency,
    /// What is bought.
    pub item: String,
    /// How many, >= 1.
    pub quantity: i32,
    /// Who receives it.
    pub recipient: String,
    /// Free-form caller data (trace ids ...): not part of the fingerprint, copied into the
    /// `order.created` outbox event only.
    pub metadata: Option<Value>,
}

/// Values a request may omit.
#[derive(Debug, Clone)]
pub struct RequestDefaults {
    /// `api.default_currency`.
    pub currency: Currency,
}

/// One offending field and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FieldError {
    /// The field name as sent (truncated to 64 characters for unknown fields).
    pub field: String,
    /// What is wrong.
    pub detail: String,
}

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderRequestError {
    /// Not a JSON object: syntax error, invalid UTF-8, duplicate key, nesting too deep, trailing
    /// data, or another JSON type at the top.
    #[error("the body is not an acceptable JSON object: {0}")]
    Malformed(String),
    /// Well-formed JSON with invalid fields; lists every one.
    #[error("{} invalid field(s)", .0.len())]
    Invalid(Vec<FieldError>),
}

/// Parses and validates a body.
pub fn parse_order(
    body: &[u8],
    defaults: &RequestDefaults,
) -> Result<OrderRequest, OrderRequestError> {
    let value = parse_strict_json(body)?;
    let Value::Object(map) = value else {
        return Err(OrderRequestError::Malformed(
            "the body must be a JSON object".into(),
        ));
    };
    validate(map, defaults)
}

/// Parses JSON into a value, refusing duplicate object keys at any depth and nesting deeper than
/// [`MAX_DEPTH`].
pub fn parse_strict_json(body: &[u8]) -> Result<Value, OrderRequestError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = StrictValue { depth: 1 }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| OrderRequestError::Malformed(e.to_string()))?;
    Ok(value)
}

struct StrictValue {
    depth: usize,
}

impl StrictValue {
    fn nested<E: de::Error>(&self) -> Result<StrictValue, E> {
        if self.depth >= MAX_DEPTH {
            return Err(E::custom(format_args!(
                "nested deeper than {MAX_DEPTH} levels"
            )));
        }
        Ok(StrictValue {
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inner = self.nested()?;
        let mut items = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictValue { depth: inner.depth })? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inner = self.nested()?;
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate key {:?}",
                    truncate(&key, 64)
                )));
            }
            let value = map.next_value_seed(StrictValue { depth: inner.depth })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, field: &str, detail: impl Into<String>) {
        self.0.push(FieldError {
            field: field.to_owned(),
            detail: detail.into(),
        });
    }
}

fn validate(
    map: Map<String, Value>,
    defaults: &RequestDefaults,
) -> Result<OrderRequest, OrderRequestError> {
    let mut errors = Errors(Vec::new());
    let mut request_id = None;
    let mut amount_text: Option<String> = None;
    let mut amount_minor = None;
    let mut currency = None;
    let mut currency_invalid = false;
    let mut item = None;
    let mut quantity = None;
    let mut recipient = None;
    let mut metadata = None;
    let mut amount_given = false;
    let mut amount_minor_given = false;

    for (field, value) in map {
        match field.as_str() {
            "request_id" => request_id = text(&field, value, &mut errors),
            "item" => item = text(&field, value, &mut errors),
            "recipient" => recipient = text(&field, value, &mut errors),
            "amount" => {
                amount_given = true;
                match value {
                    Value::String(s) => amount_text = Some(s),
                    _ => errors.add(
                        &field,
                        "must be a decimal string in major units, e.g. \"100.00\" (JSON \
                         numbers are not accepted: use amount_minor for an integer)",
                    ),
                }
            }
            "amount_minor" => {
                amount_minor_given = true;
                match integer(&value) {
                    Ok(v) if v > 0 => amount_minor = Some(v),
                    Ok(_) => errors.add(&field, "must be greater than zero"),
                    Err(detail) => errors.add(&field, detail),
                }
            }
            "currency" => match value {
                Value::String(s) => match Currency::parse(&s) {
                    Ok(c) => currency = Some(c),
                    Err(e) => {
                        currency_invalid = true;
                        let shown = truncate(&s, 16);
                        errors.add(
                            &field,
                            match e {
                                CurrencyError::Unknown => {
                                    format!("{shown:?} is not an ISO 4217 currency code")
                                }
                                CurrencyError::NoMinorUnit => {
                                    format!("{shown:?} has no minor unit and cannot be used")
                                }
                            },
                        )
                    }
                },
                _ => {
                    currency_invalid = true;
                    errors.add(&field, "must be an ISO 4217 code string, e.g. \"CNY\"");
                }
            },
            "quantity" => match integer(&value) {
                Ok(v) if v >= 1 => match i32::try_from(v) {
                    Ok(q) => quantity = Some(q),
                    Err(_) => errors.add(&field, "must be at most 2147483647"),
                },
                Ok(_) => errors.add(&field, "must be at least 1"),
                Err(detail) => errors.add(&field, detail),
            },
            "metadata" => match value {
                Value::Object(_) => {
                    if contains_nul(&value) {
                        errors.add(&field, "must not contain NUL characters (\\u0000)");
                    } else {
                        metadata = Some(value);
                    }
                }
                _ => errors.add(&field, "must be a JSON object"),
            },
            _ => errors.add(&truncate(&field, 64), "unknown field"),
        }
    }

    for (name, present) in [
        ("request_id", request_id.is_some()),
        ("item", item.is_some()),
        ("recipient", recipient.is_some()),
    ] {
        if !present && !errors.0.iter().any(|e| e.field == name) {
            errors.add(name, "is required");
        }
    }
    match (amount_given, amount_minor_given) {
        (true, true) => errors.add("amount", "give either amount or amount_minor, not both"),
        (false, false) => errors.add(
            "amount",
            "is required (a decimal string such as \"100.00\"), or give amount_minor",
        ),
        _ => {}
    }
    let currency = match currency {
        Some(c) => Some(c),
        None if currency_invalid => None,
        None => Some(defaults.currency),
    };
    if let (Some(text), Some(c), false) = (&amount_text, currency, amount_minor_given) {
        match money::parse_amount(text, c) {
            Ok(v) => amount_minor = Some(v),
            Err(e) => errors.add("amount", e.to_string()),
        }
    }

    if !errors.0.is_empty() {
        return Err(OrderRequestError::Invalid(errors.0));
    }
    match (request_id, amount_minor, currency, item, recipient) {
        (Some(request_id), Some(amount_minor), Some(currency), Some(item), Some(recipient)) => {
            Ok(OrderRequest {
                request_id,
                amount_minor,
                currency,
                item,
                quantity: quantity.unwrap_or(1),
                recipient,
                metadata,
            })
        }
        // Every missing piece above recorded an error; this arm is not reachable with an empty
        // error list, but stays an error rather than a panic.
        _ => Err(OrderRequestError::Invalid(vec![FieldError {
            field: "body".into(),
            detail: "incomplete request".into(),
        }])),
    }
}

/// A text field: a string of 1..=255 characters without control characters.
fn text(field: &str, value: Value, errors: &mut Errors) -> Option<String> {
    let Value::String(s) = value else {
        errors.add(field, "must be a string");
        return None;
    };
    let chars = s.chars().count();
    if chars == 0 {
        errors.add(field, "must not be empty");
        None
    } else if chars > MAX_TEXT_CHARS {
        errors.add(
            field,
            format!("must be at most {MAX_TEXT_CHARS} characters"),
        );
        None
    } else if s.chars().any(char::is_control) {
        errors.add(
            field,
            "must not contain control characters (U+0000-U+001F, U+007F-U+009F)",
        );
        None
    } else {
        Some(s)
    }
}

/// A JSON integer within i64: no fraction, no exponent.
fn integer(value: &Value) -> Result<i64, &'static str> {
    let Value::Number(n) = value else {
        return Err("must be a JSON integer");
    };
    if let Some(v) = n.as_i64() {
        return Ok(v);
    }
    if n.is_u64() {
        return Err("is beyond the 64-bit signed integer range");
    }
    // serde_json reads integers beyond u64, fractions and exponents as floats.
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() >= 9.2e18 => {
            Err("is beyond the 64-bit signed integer range")
        }
        _ => Err("must be an integer (no fraction or exponent)"),
    }
}

/// PostgreSQL's jsonb cannot store `\u0000`, in keys or strings.
fn contains_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> RequestDefaults {
        RequestDefaults {
            currency: Currency::parse("CNY").unwrap(),
        }
    }

    fn parse(body: &str) -> Result<OrderRequest, OrderRequestError> {
        parse_order(body.as_bytes(), &defaults())
    }

    fn fields(body: &str) -> Vec<String> {
        match parse(body) {
            Err(OrderRequestError::Invalid(errors)) => {
                errors.into_iter().map(|e| e.field).collect()
            }
            other => panic!("expected field errors for {body}, got {other:?}"),
        }
    }

    #[test]
    fn a_minimal_request_gets_its_defaults() {
        let o = parse(r#"{"request_id":"r","amount":"1.5","item":"i","recipient":"x"}"#).unwrap();
        assert_eq!(o.amount_minor, 150);
        assert_eq!(o.currency.code(), "CNY");
        assert_eq!(o.quantity, 1);
        assert_eq!(o.metadata, None);
    }

    #[test]
    fn every_offending_field_is_listed() {
        let mut got = fields(
            r#"{"request_id":"","amount":12,"currency":"ZZZ","item":"a\u0007","quantity":0,"recipient":7,"colour":"red"}"#,
        );
        got.sort();
        assert_eq!(
            got,
            [
                "amount",
                "colour",
                "currency",
                "item",
                "quantity",
                "recipient",
                "request_id"
            ]
        );
        assert_eq!(fields("{}"), ["request_id", "item", "recipient", "amount"]);
    }

    #[test]
    fn numbers() {
        let body = |v: &str| {
            format!(r#"{{"request_id":"r","amount_minor":{v},"item":"i","recipient":"x"}}"#)
        };
        assert_eq!(
            parse(&body("9223372036854775807")).unwrap().amount_minor,
            i64::MAX
        );
        for bad in [
            "9223372036854775808",
            "1e30",
            "100.0",
            "1e2",
            "-1",
            "0",
            "\"100\"",
            "null",
        ] {
            assert_eq!(fields(&body(bad)), ["amount_minor"], "{bad}");
        }
        assert!(matches!(
            parse(&body("1e400")),
            Err(OrderRequestError::Malformed(_))
        ));
    }

    #[test]
    fn malformed_bodies() {
        for bad in [
            "",
            "[]",
            "\"x\"",
            "{",
            "{} {}",
            r#"{"request_id":"a","request_id":"b"}"#,
            r#"{"metadata":{"a":1,"a":2}}"#,
            "\u{feff}{}",
        ] {
            assert!(
                matches!(parse(bad), Err(OrderRequestError::Malformed(_))),
                "{bad:?}"
            );
        }
        let deep = format!("{{\"metadata\":{}{}}}", "[".repeat(40), "]".repeat(40));
        match parse(&deep) {
            Err(OrderRequestError::Malformed(m)) => assert!(m.contains("nested"), "{m}"),
            other => panic!("{other:?}"),
        }
        let very_deep = "[".repeat(100_000);
        assert!(matches!(
            parse(&very_deep),
            Err(OrderRequestError::Malformed(_))
        ));
    }

    #[test]
    fn text_limits_count_characters() {
        let body = |rid: &str| {
            serde_json::json!({"request_id": rid, "amount": "1", "item": "i", "recipient": "x"})
                .to_string()
        };
        assert!(parse(&body(&"中".repeat(255))).is_ok());
        assert_eq!(fields(&body(&"中".repeat(256))), ["request_id"]);
        assert_eq!(fields(&body("a\u{0}b")), ["request_id"]);
        assert_eq!(fields(&body("a\u{85}b")), ["request_id"]);
    }

    #[test]
    fn amount_and_currency_interplay() {
        assert_eq!(
            fields(
                r#"{"request_id":"r","amount":"1.5","currency":"JPY","item":"i","recipient":"x"}"#
            ),
            ["amount"]
        );
        // An invalid currency is reported once; the amount is not judged against a default.
        assert_eq!(
            fields(
                r#"{"request_id":"r","amount":"1.555","currency":"XAU","item":"i","recipient":"x"}"#
            ),
            ["currency"]
        );
        assert_eq!(
            fields(
                r#"{"request_id":"r","amount":"1","amount_minor":100,"item":"i","recipient":"x"}"#
            ),
            ["amount"]
        );
        let o = parse(
            r#"{"request_id":"r","amount":"1.555","currency":"kwd","item":"i","recipient":"x"}"#,
        )
        .unwrap();
        assert_eq!((o.amount_minor, o.currency.code()), (1555, "KWD"));
    }

    #[test]
    fn metadata_is_kept_but_checked() {
        let o = parse(r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"trace":[1,{"b":null}]}}"#)
            .unwrap();
        assert_eq!(
            o.metadata,
            Some(serde_json::json!({"trace":[1,{"b":null}]}))
        );
        assert_eq!(
            fields(
                r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"t":"a\u0000"}}"#
            ),
            ["metadata"]
        );
        assert_eq!(
            fields(r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":[]}"#),
            ["metadata"]
        );
        // An escaped backslash followed by `u0000` is six ordinary characters, not a NUL (a
        // fuzz oracle once confused the two).
        let o = parse(r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"t":"a\\u0000"}}"#)
            .unwrap();
        assert_eq!(o.metadata, Some(serde_json::json!({"t": "a\\u0000"})));
    }
}

//! The `POST /v1/orders` body: strict JSON parsing (duplicate keys and deep nesting refused) and
//! validation of every field into an [`OrderRequest`], reporting *all* offending fields at once.
//!
//! Nothing here touches the database: a request refused here never consumes its idempotency key.

use std::borrow::Cow;
use std::collections::{btree_set, BTreeSet};
use std::iter::Peekable;

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
///
/// One pass over the bytes: the top-level object's members are read straight into their fields
/// (keys and string values borrowed from `body` unless they contain escapes; every other value
/// through the same strict reading as [`parse_strict_json`]), then validated in key order. The
/// refusals are those of [`parse_strict_json`] followed by a check of the whole object, raised
/// at the same places in the input, so their texts are the same: a body malformed anywhere is
/// [`OrderRequestError::Malformed`], never [`OrderRequestError::Invalid`].
pub fn parse_order(
    body: &[u8],
    defaults: &RequestDefaults,
) -> Result<OrderRequest, OrderRequestError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut members = Members::default();
    let is_object = TopLevel(&mut members)
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| OrderRequestError::Malformed(e.to_string()))?;
    if !is_object {
        return Err(OrderRequestError::Malformed(
            "the body must be a JSON object".into(),
        ));
    }
    members.validate(defaults)
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
                return Err(duplicate_key(&key));
            }
            let value = map.next_value_seed(StrictValue { depth: inner.depth })?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A duplicate key, at any depth.
fn duplicate_key<E: de::Error>(key: &str) -> E {
    E::custom(format_args!("duplicate key {:?}", truncate(key, 64)))
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// The body's top level: an object is read member by member into the [`Members`] (then `true`);
/// any other value is read exactly as [`parse_strict_json`] reads it (its errors included), then
/// refused (`false`). The members are filled in place rather than returned: a few hundred bytes
/// that would otherwise be copied at every level of serde_json's calls on the way out.
struct TopLevel<'a, 'de>(&'a mut Members<'de>);

impl<'de> DeserializeSeed<'de> for TopLevel<'_, 'de> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TopLevel<'_, 'de> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(false)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(false)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(false)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        StrictValue { depth: 1 }.visit_f64(v).map(|_| false)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(false)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(false)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        StrictValue { depth: 1 }.visit_seq(seq).map(|_| false)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // The body is level 1, its members' values level 2 (as in StrictValue::visit_map).
        let depth = StrictValue { depth: 1 }.nested::<A::Error>()?.depth;
        let members = self.0;
        while let Some(key) = map.next_key_seed(Key)? {
            match members.slot(&key) {
                Some(slot @ None) => {
                    *slot = Some(map.next_value_seed(Member(StrictValue { depth }))?);
                }
                Some(Some(_)) => return Err(duplicate_key(&key)),
                None => {
                    if members.unknown.contains(&*key) {
                        return Err(duplicate_key(&key));
                    }
                    // Read as strictly as any other value, then only its name is reported.
                    map.next_value_seed(Member(StrictValue { depth }))?;
                    members.unknown.insert(key);
                }
            }
        }
        Ok(true)
    }
}

/// A member name: borrowed from the body unless it contains escapes (then decoded, so
/// `"request\u005fid"` is `request_id`).
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// A top-level member's value as read.
enum Raw<'de> {
    /// A string: borrowed from the body unless it contains escapes.
    Str(Cow<'de, str>),
    /// Anything else, read by [`StrictValue`] (never a [`Value::String`]).
    Other(Value),
}

/// Reads a member's value: a string as [`Raw::Str`], anything else through its [`StrictValue`].
struct Member(StrictValue);

impl<'de> DeserializeSeed<'de> for Member {
    type Value = Raw<'de>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Member {
    type Value = Raw<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.expecting(f)
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Raw::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Raw::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Raw::Str(Cow::Owned(v)))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        self.0.visit_bool(v).map(Raw::Other)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.0.visit_i64(v).map(Raw::Other)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.0.visit_u64(v).map(Raw::Other)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        self.0.visit_f64(v).map(Raw::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_unit().map(Raw::Other)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.0.visit_none().map(Raw::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        self.0.visit_seq(seq).map(Raw::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        self.0.visit_map(map).map(Raw::Other)
    }
}

/// The body's members as read: each known one in its slot, the unknown ones by name.
#[derive(Default)]
struct Members<'de> {
    amount: Option<Raw<'de>>,
    amount_minor: Option<Raw<'de>>,
    currency: Option<Raw<'de>>,
    item: Option<Raw<'de>>,
    metadata: Option<Raw<'de>>,
    quantity: Option<Raw<'de>>,
    recipient: Option<Raw<'de>>,
    request_id: Option<Raw<'de>>,
    /// Ordered like the keys of a `serde_json::Map` (byte order), so their errors interleave
    /// with the known members' as they always have; empty (no allocation) for a valid body.
    unknown: BTreeSet<Cow<'de, str>>,
}

impl<'de> Members<'de> {
    /// The slot of a known member; `None` for an unknown name.
    fn slot(&mut self, name: &str) -> Option<&mut Option<Raw<'de>>> {
        Some(match name {
            "amount" => &mut self.amount,
            "amount_minor" => &mut self.amount_minor,
            "currency" => &mut self.currency,
            "item" => &mut self.item,
            "metadata" => &mut self.metadata,
            "quantity" => &mut self.quantity,
            "recipient" => &mut self.recipient,
            "request_id" => &mut self.request_id,
            _ => return None,
        })
    }

    /// Validates every member. The errors come in key order (the byte order of the names, known
    /// and unknown together), then the missing fields, then the amount's.
    fn validate(self, defaults: &RequestDefaults) -> Result<OrderRequest, OrderRequestError> {
        let mut errors = Errors(Vec::new());
        let mut unknown =
            Unknown((!self.unknown.is_empty()).then(|| self.unknown.iter().peekable()));

        unknown.report_before(Some("amount"), &mut errors);
        let amount_given = self.amount.is_some();
        let amount_text = match self.amount {
            Some(Raw::Str(s)) => Some(s),
            Some(Raw::Other(_)) => {
                errors.add(
                    "amount",
                    "must be a decimal string in major units, e.g. \"100.00\" (JSON numbers are \
                     not accepted: use amount_minor for an integer)",
                );
                None
            }
            None => None,
        };

        unknown.report_before(Some("amount_minor"), &mut errors);
        let amount_minor_given = self.amount_minor.is_some();
        let mut amount_minor = None;
        if let Some(value) = &self.amount_minor {
            match integer(value) {
                Ok(v) if v > 0 => amount_minor = Some(v),
                Ok(_) => errors.add("amount_minor", "must be greater than zero"),
                Err(detail) => errors.add("amount_minor", detail),
            }
        }

        unknown.report_before(Some("currency"), &mut errors);
        let mut currency = None;
        let mut currency_invalid = false;
        match &self.currency {
            Some(Raw::Str(s)) => match Currency::parse(s) {
                Ok(c) => currency = Some(c),
                Err(e) => {
                    currency_invalid = true;
                    let shown = truncate(s, 16);
                    errors.add(
                        "currency",
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
            Some(Raw::Other(_)) => {
                currency_invalid = true;
                errors.add("currency", "must be an ISO 4217 code string, e.g. \"CNY\"");
            }
            None => {}
        }

        unknown.report_before(Some("item"), &mut errors);
        let item = self.item.and_then(|v| text("item", v, &mut errors));

        unknown.report_before(Some("metadata"), &mut errors);
        let metadata = match self.metadata {
            Some(Raw::Other(value @ Value::Object(_))) => {
                if contains_nul(&value) {
                    errors.add("metadata", "must not contain NUL characters (\\u0000)");
                    None
                } else {
                    Some(value)
                }
            }
            Some(_) => {
                errors.add("metadata", "must be a JSON object");
                None
            }
            None => None,
        };

        unknown.report_before(Some("quantity"), &mut errors);
        let mut quantity = None;
        if let Some(value) = &self.quantity {
            match integer(value) {
                Ok(v) if v >= 1 => match i32::try_from(v) {
                    Ok(q) => quantity = Some(q),
                    Err(_) => errors.add("quantity", "must be at most 2147483647"),
                },
                Ok(_) => errors.add("quantity", "must be at least 1"),
                Err(detail) => errors.add("quantity", detail),
            }
        }

        unknown.report_before(Some("recipient"), &mut errors);
        let recipient = self
            .recipient
            .and_then(|v| text("recipient", v, &mut errors));

        unknown.report_before(Some("request_id"), &mut errors);
        let request_id = self
            .request_id
            .and_then(|v| text("request_id", v, &mut errors));

        unknown.report_before(None, &mut errors);

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
                    request_id: request_id.into_owned(),
                    amount_minor,
                    currency,
                    item: item.into_owned(),
                    quantity: quantity.unwrap_or(1),
                    recipient: recipient.into_owned(),
                    metadata,
                })
            }
            // Every missing piece above recorded an error; this arm is not reachable with an
            // empty error list, but stays an error rather than a panic.
            _ => Err(OrderRequestError::Invalid(vec![FieldError {
                field: "body".into(),
                detail: "incomplete request".into(),
            }])),
        }
    }
}

/// The unknown members' names in order, reported as the known names are reached (`None`: there
/// are none, the usual case).
struct Unknown<'a, 'de>(Option<Peekable<btree_set::Iter<'a, Cow<'de, str>>>>);

impl Unknown<'_, '_> {
    /// Reports every unknown name before `known` (all that are left for `None`).
    #[inline(always)]
    fn report_before(&mut self, known: Option<&str>, errors: &mut Errors) {
        if let Some(names) = &mut self.0 {
            Self::report(names, known, errors);
        }
    }

    /// Off the usual path: only a refused body has unknown members.
    #[cold]
    #[inline(never)]
    fn report(
        names: &mut Peekable<btree_set::Iter<'_, Cow<'_, str>>>,
        known: Option<&str>,
        errors: &mut Errors,
    ) {
        while let Some(name) = names.next_if(|name| known.is_none_or(|known| name.as_ref() < known))
        {
            errors.add(&truncate(name, 64), "unknown field");
        }
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

/// A text field: a string of 1..=255 characters without control characters.
fn text<'de>(field: &str, value: Raw<'de>, errors: &mut Errors) -> Option<Cow<'de, str>> {
    let Raw::Str(s) = value else {
        errors.add(field, "must be a string");
        return None;
    };
    let (chars, control) = chars_and_control(&s);
    if chars == 0 {
        errors.add(field, "must not be empty");
        None
    } else if chars > MAX_TEXT_CHARS {
        errors.add(
            field,
            format!("must be at most {MAX_TEXT_CHARS} characters"),
        );
        None
    } else if control {
        errors.add(
            field,
            "must not contain control characters (U+0000-U+001F, U+007F-U+009F)",
        );
        None
    } else {
        Some(s)
    }
}

/// In one pass over the UTF-8 bytes: the number of characters (as `s.chars().count()`) and
/// whether any is a control character (as `char::is_control`: U+0000-U+001F and U+007F, one byte
/// each, or U+0080-U+009F, encoded `C2 80`-`C2 9F`).
fn chars_and_control(s: &str) -> (usize, bool) {
    let bytes = s.as_bytes();
    // The usual text is printable ASCII: one byte per character, none a control character. (A
    // fold without an early exit, which the compiler turns into a few vector instructions.)
    if bytes
        .iter()
        .fold(true, |printable, &b| printable & (0x20..0x7f).contains(&b))
    {
        return (bytes.len(), false);
    }
    let mut chars = 0;
    let mut control = false;
    let mut after_c2 = false;
    for &b in bytes {
        // Continuation bytes are 10xxxxxx; every other byte starts a character.
        chars += usize::from(b & 0xc0 != 0x80);
        control |= b < 0x20 || b == 0x7f || (after_c2 && b < 0xa0);
        after_c2 = b == 0xc2;
    }
    (chars, control)
}

/// A JSON integer within i64: no fraction, no exponent.
fn integer(value: &Raw) -> Result<i64, &'static str> {
    let Raw::Other(Value::Number(n)) = value else {
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
    use proptest::prelude::*;

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

    /// The direct parse and the reference agree on `body`: the same `Result`, error texts and
    /// order included.
    fn same(body: &[u8]) {
        let direct = parse_order(body, &defaults());
        let oracle = reference::parse_order(body, &defaults());
        assert_eq!(direct, oracle, "{:?}", String::from_utf8_lossy(body));
    }

    #[test]
    fn the_direct_parse_agrees_with_the_value_tree_on_chosen_bodies() {
        let deep = |n: usize| {
            format!(
                "{{\"metadata\":{{\"a\":{}1{}}}}}",
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        let mut bodies: Vec<String> = [
            "", " ", "{", "}", "[]", "[1,2", "[] x", "[[[]]]", "[{\"a\":1,\"a\":2}]", "\"x\"", "\"\\u00\"",
            "1", "-1", "1.5", "1e400", "-", "true", "false", "null", "nul", "{}", " {} ", "{} x",
            "{}{}", "{,}", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{\"a\" 1}", "{1:1}", "\u{feff}{}",
            r#"{"request_id":"a","request_id":"b"}"#,
            r#"{"request_id":"a","request\u005fid":"b"}"#,
            r#"{"request\u005fid":"a", "request_id" :"b"}"#,
            r#"{"colour":1,"colour":2}"#,
            r#"{"col\u006fur":1,"colour":2}"#,
            r#"{"colour":1,"amount":"1","c\u006flour":2}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"a":1,"a":2}}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"a":1,"\u0061":2}}"#,
            r#"{"request_id":"","amount":12,"currency":"ZZZ","item":"a\u0007","quantity":0,"recipient":7,"colour":"red"}"#,
            r#"{"zeta":1,"request_id":"","amount":12,"b":1,"colour":"red","":0,"amount_":1,"i":[1]}"#,
            r#"{"request_id":"r","amount":"1.5","currency":"JPY","item":"i","recipient":"x"}"#,
            r#"{"request_id":"r","amount":"1.555","currency":"XAU","item":"i","recipient":"x"}"#,
            r#"{"request_id":"r","amount":"1","amount_minor":100,"item":"i","recipient":"x"}"#,
            r#"{"request_id":"r","amount":"1.555","currency":"kwd","item":"i","recipient":"x"}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"t":"a\u0000"}}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"a\u0000":1}}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":{"t":"a\\u0000"}}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","metadata":[]}"#,
            r#"{"request_id":"r\u00e9","amount":"1","item":"\u4e2d","recipient":"\ud83d\ude00"}"#,
            r#"{"request_id":"a\u0085b","amount":"1","item":"a\u009fb","recipient":"a\u00a0b"}"#,
            r#"{"request_id":"r","amount_minor":1e400,"item":"i","recipient":"x"}"#,
            r#"{"request_id":"r","amount_minor":-0,"item":"i","recipient":"x","quantity":2147483648}"#,
            r#"{"request_id":"r","amount_minor":"1","item":null,"recipient":true,"quantity":1.0}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x"} x"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","request_id":"r"}"#,
            r#"{"request_id":"r","amount":"1","item":"i","recipient":"x","":1,"":2}"#,
            r#"{"request_id":"r","amount":1,"item":"i","recipient":"x","zz":{"a":[1,2,{"b":1,"b":1}]}}"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for n in [28, 29, 30, 31, 32, 40, 200] {
            bodies.push(deep(n));
            bodies.push(format!("{}{}", "[".repeat(n), "]".repeat(n)));
        }
        let long = "k".repeat(70);
        bodies.push(format!(r#"{{"{long}":1,"{long}":2}}"#));
        bodies.push(format!(r#"{{"{long}":1,"{long}x":2,"a":3}}"#));
        for n in [254, 255, 256] {
            bodies.push(format!(
                r#"{{"request_id":"{}","amount":"1","item":"{}","recipient":"x"}}"#,
                "中".repeat(n),
                "i".repeat(n)
            ));
        }
        for body in &bodies {
            same(body.as_bytes());
        }
        same(b"{\"request_id\":\"\xff\",\"amount\":\"1\",\"item\":\"i\",\"recipient\":\"x\"}");
        same(b"{\"request_id\":\"a\0\",\"amount\":\"1\",\"item\":\"i\",\"recipient\":\"x\"}");
        same(b"{\"\xc3\":1}");
    }

    #[test]
    fn errors_come_in_key_order_known_and_unknown_together() {
        assert_eq!(
            fields(r#"{"zeta":1,"request_id":"","amount":12,"b":1,"colour":"red","amount_":1}"#),
            [
                "amount",
                "amount_",
                "b",
                "colour",
                "request_id",
                "zeta",
                "item",
                "recipient"
            ]
        );
    }

    #[test]
    fn an_escaped_spelling_of_a_key_is_a_duplicate() {
        match parse(r#"{"request_id":"a","request\u005fid":"b"}"#) {
            Err(OrderRequestError::Malformed(m)) => {
                assert_eq!(m, "duplicate key \"request_id\" at line 1 column 35")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(r#"{"c\u006flour":1,"colour":2}"#),
            Err(OrderRequestError::Malformed(_))
        ));
    }

    const KNOWN: [&str; 8] = [
        "request_id",
        "amount",
        "amount_minor",
        "currency",
        "item",
        "quantity",
        "recipient",
        "metadata",
    ];

    /// A member name: the known ones, and unknown ones that sort before, between and after them
    /// (some just before or just after a known one, and one longer than the 64 characters an
    /// error shows).
    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            2 => prop::sample::select(KNOWN.to_vec()).prop_map(str::to_owned),
            1 => (prop::sample::select(KNOWN.to_vec()), prop::sample::select(vec!["", "_", "~"]))
                .prop_map(|(known, suffix)| match suffix {
                    // The known name with its last character one lower: just before it.
                    "" => {
                        let mut bytes = known.as_bytes().to_vec();
                        *bytes.last_mut().unwrap() -= 1;
                        format!("{}~", String::from_utf8(bytes).unwrap())
                    }
                    _ => format!("{known}{suffix}"),
                }),
            2 => prop::sample::select(vec![
                "", "a", "amount_", "b", "colour", "i", "itemz", "metadata\u{0}", "r", "request",
                "zz", "é", "Amount",
            ])
            .prop_map(str::to_owned),
            1 => "[a-z_é]{0,6}",
            1 => Just("k".repeat(70)),
        ]
    }

    /// A string that matters to some field, or any text.
    fn text_value() -> impl Strategy<Value = String> {
        prop_oneof![
            3 => prop::sample::select(vec![
                "1", "1.5", "129.99", "0", "0.00", "1.001", "-5", "1e3", "", " 1", "007.5",
                "99999999999999999999", "CNY", "cny", "JPY", "KWD", "XAU", "ZZZ", "CN", "req-1",
                "alice@example.com", "a\u{0}b", "a\u{7f}", "a\u{85}b", "a\u{9f}", "a\u{a0}",
                "\u{1f600}", "\\u0000",
            ])
            .prop_map(str::to_owned),
            2 => "\\PC{0,12}",
            1 => "[\\x00-\\x1f\\x7f\\u{80}-\\u{a0}\"\\\\a中]{0,6}",
            1 => (250usize..260, prop::sample::select(vec!["a", "中", "\u{1f600}"]))
                .prop_map(|(n, c)| c.repeat(n)),
        ]
    }

    /// A JSON value's text: strings (`escapes` chooses which characters are written as `\u`
    /// escapes), numbers, literals, arrays and objects (nested, with duplicates and NULs).
    fn value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            8 => (text_value(), any::<u64>()).prop_map(|(s, escapes)| json_string(&s, escapes)),
            4 => prop::sample::select(vec![
                "0", "1", "-1", "-0", "2", "2147483647", "2147483648", "9223372036854775807",
                "9223372036854775808", "-9223372036854775809", "18446744073709551616", "1.5",
                "100.0", "1e2", "1E30", "1e400", "-1e400", "0.0",
            ])
            .prop_map(str::to_owned),
            2 => any::<i64>().prop_map(|v| v.to_string()),
            2 => prop::sample::select(vec!["true", "false", "null"]).prop_map(str::to_owned),
            1 => (28usize..34, any::<bool>()).prop_map(|(n, arrays)| if arrays {
                format!("{}{}", "[".repeat(n), "]".repeat(n))
            } else {
                format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n))
            }),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(
                    (
                        prop::sample::select(vec![
                            "a", "b", "c", "d", "e", "f", "g", "a\u{0}", "\u{0}", "é"
                        ]),
                        any::<u64>(),
                        inner
                    ),
                    0..4,
                )
                .prop_map(|members| {
                    let members: Vec<String> = members
                        .iter()
                        .map(|(k, escapes, v)| format!("{}:{v}", json_string(k, *escapes)))
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
    }

    /// `s` as a JSON string; the characters whose bit is set in `escapes` (cycling) as `\u`
    /// escapes, and the characters JSON requires escaped always.
    fn json_string(s: &str, escapes: u64) -> String {
        let mut out = String::from("\"");
        for (i, c) in s.chars().enumerate() {
            if escapes >> (i % 64) & 1 == 1 || c < ' ' || c == '"' || c == '\\' {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            } else {
                out.push(c);
            }
        }
        out.push('"');
        out
    }

    /// One change to a valid order's members.
    #[derive(Debug, Clone)]
    enum Edit {
        /// The value of the member at this index (modulo the count) replaced.
        Replace(usize, String),
        /// The member at this index removed.
        Remove(usize),
        /// A member added at this index.
        Insert(usize, String, u64, String),
        /// The member at this index repeated at the end (its key escaped per the mask).
        Repeat(usize, u64),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            3 => (any::<usize>(), value()).prop_map(|(i, v)| Edit::Replace(i, v)),
            2 => any::<usize>().prop_map(Edit::Remove),
            3 => (any::<usize>(), key(), any::<u64>(), value())
                .prop_map(|(i, k, e, v)| Edit::Insert(i, k, e, v)),
            1 => (any::<usize>(), any::<u64>()).prop_map(|(i, e)| Edit::Repeat(i, e)),
        ]
    }

    /// A byte-level damage: (position, replacement or deletion or insertion).
    fn damage() -> impl Strategy<Value = (usize, u8, u8)> {
        (
            any::<usize>(),
            0u8..3,
            prop_oneof![
                prop::sample::select(b"\"\\{}[],: 0a-.eu\x00\xff\xc2\x9f".to_vec()),
                any::<u8>()
            ],
        )
    }

    /// A body: a valid order (its fields in random order, their keys possibly escaped), then
    /// member edits, spacing, sometimes byte damage or trailing data.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let order = (
            "[a-zA-Z0-9 \\-_.@é中]{1,20}",
            "[a-zA-Z0-9 \\-_.@é中]{1,20}",
            "[a-zA-Z0-9 \\-_.@é中]{1,20}",
            prop_oneof![
                (1u64..1_000_000, 0u32..4).prop_map(|(v, d)| {
                    let s = v.to_string();
                    let d = (d as usize).min(s.len() - 1);
                    let amount = if d == 0 {
                        s
                    } else {
                        format!("{}.{}", &s[..s.len() - d], &s[s.len() - d..])
                    };
                    ("amount", json_string(&amount, 0))
                }),
                prop_oneof![4 => 1..=i64::MAX, 1 => any::<i64>()]
                    .prop_map(|v| ("amount_minor", v.to_string())),
            ],
            prop::option::of(prop::sample::select(vec![
                "\"CNY\"", "\"jpy\"", "\"KWD\"", "\"EUR\"",
            ])),
            prop::option::of(prop_oneof![4 => 1..1000i32, 1 => any::<i32>()]),
            prop::option::of(value().prop_map(|v| format!("{{\"m\":{v}}}"))),
        );
        (
            order,
            any::<u64>(),
            any::<[u64; 4]>(),
            prop::collection::vec(edit(), 0..3),
            prop::sample::select(vec!["", " ", "\n\t ", "\r\n"]),
            prop::collection::vec(damage(), 0..3),
            0u8..8,
            prop::option::of(prop::sample::select(vec![
                " ", "x", "{}", "]", ",", "\u{0}",
            ])),
        )
            .prop_map(
                |(
                    (rid, item, rcpt, (amount_key, amount), currency, quantity, metadata),
                    rotate,
                    key_escapes,
                    edits,
                    space,
                    damages,
                    damage_odds,
                    trailing,
                )| {
                    let mut members: Vec<(String, u64, String)> = vec![
                        ("request_id".into(), key_escapes[0], json_string(&rid, 0)),
                        ("item".into(), key_escapes[1], json_string(&item, 0)),
                        ("recipient".into(), key_escapes[2], json_string(&rcpt, 0)),
                        (amount_key.into(), key_escapes[3], amount),
                    ];
                    if let Some(c) = currency {
                        members.push(("currency".into(), 0, c.into()));
                    }
                    if let Some(q) = quantity {
                        members.push(("quantity".into(), 0, q.to_string()));
                    }
                    if let Some(m) = metadata {
                        members.push(("metadata".into(), 0, m));
                    }
                    let n = members.len();
                    members.rotate_left((rotate % n as u64) as usize);
                    // Escapes in the keys are rare (a bit in 8 set) so most keys stay recognisable.
                    for m in &mut members {
                        m.1 &= m.1 >> 1 & m.1 >> 2;
                    }
                    for e in edits {
                        let n = members.len();
                        match e {
                            Edit::Replace(i, v) if n > 0 => members[i % n].2 = v,
                            Edit::Remove(i) if n > 0 => {
                                members.remove(i % n);
                            }
                            Edit::Insert(i, k, e, v) => {
                                members.insert(i % (n + 1), (k, e & e >> 1, v))
                            }
                            Edit::Repeat(i, e) if n > 0 => {
                                let (k, _, v) = members[i % n].clone();
                                members.push((k, e, v));
                            }
                            _ => {}
                        }
                    }
                    let members: Vec<String> = members
                        .iter()
                        .map(|(k, e, v)| format!("{}{space}:{space}{v}", json_string(k, *e)))
                        .collect();
                    let mut body =
                        format!("{space}{{{}}}{space}", members.join(&format!(",{space}")))
                            .into_bytes();
                    // Damage in one case out of four.
                    if damage_odds < 2 {
                        for (at, how, byte) in damages {
                            let at = at % (body.len() + 1);
                            match how {
                                0 if at < body.len() => body[at] = byte,
                                1 if at < body.len() => {
                                    body.remove(at);
                                }
                                _ => body.insert(at, byte),
                            }
                        }
                    }
                    if let Some(t) = trailing.filter(|_| damage_odds == 7) {
                        body.extend_from_slice(t.as_bytes());
                    }
                    body
                },
            )
    }

    /// A body of mostly wrong members: each known field absent or with any value, unknown
    /// members (many named next to a known one) and duplicates, in any order; for the order of
    /// the errors.
    fn wrong_body() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::collection::vec(prop::option::of(value()), 8),
            prop::collection::vec((key(), value()), 0..5),
            any::<u64>(),
        )
            .prop_map(|(known, extra, shuffle)| {
                let mut members: Vec<(String, String)> = KNOWN
                    .iter()
                    .zip(known)
                    .filter_map(|(k, v)| Some(((*k).to_owned(), v?)))
                    .chain(extra)
                    .collect();
                let mut state = shuffle | 1;
                for i in (1..members.len()).rev() {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    members.swap(i, (state % (i as u64 + 1)) as usize);
                }
                let members: Vec<String> = members
                    .iter()
                    .map(|(k, v)| format!("{}:{v}", json_string(k, 0)))
                    .collect();
                format!("{{{}}}", members.join(",")).into_bytes()
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn the_errors_are_those_of_the_value_tree_in_its_order(body in wrong_body()) {
            let direct = parse_order(&body, &defaults());
            let oracle = reference::parse_order(&body, &defaults());
            prop_assert_eq!(direct, oracle, "{:?}", String::from_utf8_lossy(&body));
        }

        #[test]
        fn the_direct_parse_returns_exactly_what_the_value_tree_returned(body in body()) {
            let direct = parse_order(&body, &defaults());
            let oracle = reference::parse_order(&body, &defaults());
            prop_assert_eq!(direct, oracle, "{:?}", String::from_utf8_lossy(&body));
        }

        #[test]
        fn any_bytes_too(body in prop::collection::vec(any::<u8>(), 0..40)) {
            prop_assert_eq!(
                parse_order(&body, &defaults()),
                reference::parse_order(&body, &defaults())
            );
        }

        #[test]
        fn one_pass_counts_and_finds_control_characters_as_two_did(
            s in "\\PC{0,8}|[\\x00-\\x1f\\x7f\\u{80}-\\u{a0}\\u{c0}-\\u{c2}\\u{100}-\\u{102}a中\u{1f600}]{0,12}|.{0,300}",
        ) {
            prop_assert_eq!(
                chars_and_control(&s),
                (s.chars().count(), s.chars().any(char::is_control))
            );
        }
    }

    /// The implementation before the direct parse (a `serde_json::Value` tree, then a walk of its
    /// sorted map), kept verbatim as the oracle of `parse_order`.
    mod reference {
        use super::super::*;

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
                    "currency" => {
                        match value {
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
                        }
                    }
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
                (true, true) => {
                    errors.add("amount", "give either amount or amount_minor, not both")
                }
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
                (
                    Some(request_id),
                    Some(amount_minor),
                    Some(currency),
                    Some(item),
                    Some(recipient),
                ) => Ok(OrderRequest {
                    request_id,
                    amount_minor,
                    currency,
                    item,
                    quantity: quantity.unwrap_or(1),
                    recipient,
                    metadata,
                }),
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
    }
}

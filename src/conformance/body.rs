//! The JSON a conformance run sends and reads: `{{uuid}}` templates (the same id always gives the
//! same bytes), the same intent spelled otherwise (every object's members in another order, other
//! whitespace at every level, every value's text kept byte for byte), and what a refusal repeats
//! of an earlier answer (its identifiers and values, walked scalar by scalar).

use std::fmt::Write as _;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

/// What `--body` and `--other-body` may contain, replaced by the id of the key they are sent with.
pub const PLACEHOLDER: &str = "{{uuid}}";

/// A string value at least this long, without whitespace, counts as an identifier: found inside
/// a longer text (a problem's `detail` naming an order id), not only as a whole value. Shorter
/// values ("created", "CNY") count only when a value of the refusal is exactly them, so that
/// ordinary words of a problem's text are not mistaken for a leak.
pub const IDENTIFIER_MIN_CHARS: usize = 8;

/// A request body as given on the command line: JSON once its placeholders are replaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(String);

impl Template {
    /// `text`, if it is JSON with every [`PLACEHOLDER`] replaced by a UUID.
    pub fn new(text: &str) -> Result<Template, serde_json::Error> {
        let template = Template(text.to_owned());
        serde_json::from_str::<serde::de::IgnoredAny>(&template.render(Uuid::nil()))?;
        Ok(template)
    }

    /// The body sent with the key whose id is `id`: every placeholder replaced by it.
    pub fn render(&self, id: Uuid) -> String {
        self.0.replace(PLACEHOLDER, &id.hyphenated().to_string())
    }

    /// The template's value with the placeholders replaced by `id` (it is JSON by construction).
    pub fn value(&self, id: Uuid) -> Value {
        serde_json::from_str(&self.render(id)).unwrap_or(Value::Null)
    }
}

/// JSON's own whitespace (RFC 8259): space, tab, line feed, carriage return.
const JSON_WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

/// `text` (JSON) spelled otherwise: the members of every object in reverse order, and whitespace
/// that a compact or a conventionally indented body never has around every token (a line break
/// and tabs inside every object and array, ` : ` between a name and its value, ` ,` before a
/// comma, a line break before and after the whole). Every string and number keeps its text
/// exactly (escapes, exponents, trailing zeros), so the values, and with them the intent, stay.
pub fn respelled(text: &str) -> Result<String, serde_json::Error> {
    let mut out = String::from("\n");
    write_respelled(serde_json::from_str::<&RawValue>(text)?, 0, &mut out)?;
    out.push('\n');
    Ok(out)
}

/// An object's members in the order the text has them, each value still raw.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for InOrder<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Members<'a>, M::Error> {
                let mut members = Vec::new();
                while let Some((name, value)) = map.next_entry::<String, &'a RawValue>()? {
                    members.push((name, value));
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(InOrder(std::marker::PhantomData))
    }
}

fn write_respelled(raw: &RawValue, depth: usize, out: &mut String) -> serde_json::Result<()> {
    let text = raw.get().trim_matches(JSON_WHITESPACE);
    let indent = |out: &mut String, depth: usize| {
        out.push('\n');
        out.extend(std::iter::repeat_n('\t', depth));
    };
    match text.as_bytes().first() {
        Some(b'{') => {
            let Members(mut members) = serde_json::from_str(text)?;
            members.reverse();
            out.push('{');
            for (i, (name, value)) in members.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,");
                }
                indent(out, depth + 1);
                out.push_str(&serde_json::to_string(name)?);
                out.push_str(" : ");
                write_respelled(value, depth + 1, out)?;
            }
            indent(out, depth);
            out.push('}');
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(text)?;
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,");
                }
                indent(out, depth + 1);
                write_respelled(item, depth + 1, out)?;
            }
            indent(out, depth);
            out.push(']');
        }
        _ => out.push_str(text),
    }
    Ok(())
}

/// One string or number of a JSON document, as text (booleans and null tell nothing apart).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scalar {
    String(String),
    Number(String),
}

/// Every string and number of `value`, however deep (member names are not values).
fn scalars(value: &Value, out: &mut Vec<Scalar>) {
    match value {
        Value::String(s) => out.push(Scalar::String(s.clone())),
        Value::Number(n) => out.push(Scalar::Number(n.to_string())),
        Value::Array(items) => items.iter().for_each(|v| scalars(v, out)),
        Value::Object(members) => members.values().for_each(|v| scalars(v, out)),
        Value::Bool(_) | Value::Null => {}
    }
}

/// What of an earlier answer's body (`earlier`) a later answer's body (`later`) repeats: its
/// identifiers and values, except those the request that got `later` carried itself (`sent`: a
/// service may echo what it was sent). A value is repeated when a value or member name of
/// `later` is exactly it, or, for a string of at least [`IDENTIFIER_MIN_CHARS`] characters
/// without whitespace, when a string of `later` contains it. `later`'s top-level `status` member
/// is a problem document's copy of the HTTP status, not a value of anyone's. Bodies that are not
/// JSON are compared as one string each. Returns the repeated values, first seen first.
pub fn repeated(earlier: &[u8], sent: &[u8], later: &[u8]) -> Vec<String> {
    let parse = |bytes: &[u8]| -> Vec<Scalar> {
        let mut out = Vec::new();
        match serde_json::from_slice::<Value>(bytes) {
            Ok(value) => scalars(&value, &mut out),
            Err(_) if bytes.is_empty() => {}
            Err(_) => out.push(Scalar::String(String::from_utf8_lossy(bytes).into_owned())),
        }
        out
    };
    let sent = parse(sent);
    let mut candidates: Vec<Scalar> = Vec::new();
    for scalar in parse(earlier) {
        if !sent.contains(&scalar) && !candidates.contains(&scalar) {
            candidates.push(scalar);
        }
    }
    let mut haystack = Vec::new();
    match serde_json::from_slice::<Value>(later) {
        Ok(Value::Object(mut members)) => {
            members.remove("status");
            let mut names = Vec::new();
            collect_names(&Value::Object(members.clone()), &mut names);
            haystack.extend(names.into_iter().map(Scalar::String));
            scalars(&Value::Object(members), &mut haystack);
        }
        Ok(value) => scalars(&value, &mut haystack),
        Err(_) if later.is_empty() => {}
        Err(_) => haystack.push(Scalar::String(String::from_utf8_lossy(later).into_owned())),
    }
    candidates
        .into_iter()
        .filter(|candidate| {
            haystack.contains(candidate)
                || matches!(candidate, Scalar::String(s) if is_identifier(s)
                    && haystack.iter().any(|h| matches!(h, Scalar::String(t) if t.contains(s.as_str()))))
        })
        .map(|scalar| match scalar {
            Scalar::String(s) => format!("{s:?}"),
            Scalar::Number(n) => n,
        })
        .collect()
}

fn is_identifier(s: &str) -> bool {
    s.chars().count() >= IDENTIFIER_MIN_CHARS && !s.chars().any(char::is_whitespace)
}

/// Every member name of `value`, however deep.
fn collect_names(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(members) => {
            for (name, v) in members {
                out.push(name.clone());
                collect_names(v, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_names(v, out)),
        _ => {}
    }
}

/// A short, one-line account of a body for a report line: its length and its start.
pub fn excerpt(bytes: &[u8]) -> String {
    const SHOWN: usize = 80;
    let text = String::from_utf8_lossy(bytes);
    let mut shown = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == SHOWN {
            shown.push('…');
            break;
        }
        shown.push(if c.is_control() { ' ' } else { c });
    }
    let mut out = String::new();
    let _ = write!(out, "{} bytes", bytes.len());
    if !shown.is_empty() {
        let _ = write!(out, " `{shown}`");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_is_json_once_its_placeholders_are_replaced() {
        let template =
            Template::new(r#"{"request_id": "PR-{{uuid}}", "ref": "{{uuid}}"}"#).unwrap();
        let id = Uuid::new_v4();
        let body = template.render(id);
        assert_eq!(body, template.render(id), "the same id, the same bytes");
        assert_eq!(body.matches(&id.to_string()).count(), 2, "{body}");
        assert_ne!(body, template.render(Uuid::new_v4()));
        assert!(Template::new("{\"a\": 1").is_err());
        assert!(
            Template::new("{{uuid}}").is_err(),
            "a placeholder outside a string"
        );
        assert!(Template::new("").is_err());
    }

    /// The member order of every object of `text`, however deep, in document order.
    fn orders(text: &str) -> Vec<Vec<String>> {
        fn walk(raw: &RawValue, out: &mut Vec<Vec<String>>) {
            let text = raw.get().trim_matches(JSON_WHITESPACE);
            if text.starts_with('{') {
                let Members(members) = serde_json::from_str(text).unwrap();
                out.push(members.iter().map(|(n, _)| n.clone()).collect());
                members.iter().for_each(|(_, v)| walk(v, out));
            } else if text.starts_with('[') {
                let items: Vec<&RawValue> = serde_json::from_str(text).unwrap();
                items.iter().for_each(|v| walk(v, out));
            }
        }
        let mut out = Vec::new();
        walk(serde_json::from_str(text).unwrap(), &mut out);
        out
    }

    #[test]
    fn respelled_reverses_every_object_and_keeps_every_value_text() {
        let text = r#"{"request_id":"r-1","amount":"100.00","n":1.50,"e":1E+2,"esc":"a\u00e9\"b",
            "nested":{"x":[{"p":1,"q":2},[],{}],"y":null,"z":true},"list":[3,2,1]}"#;
        let again = respelled(text).unwrap();
        // The same document...
        assert_eq!(
            serde_json::from_str::<Value>(&again).unwrap(),
            serde_json::from_str::<Value>(text).unwrap()
        );
        // ...with every object's members reversed, at every level...
        let reversed: Vec<Vec<String>> = orders(text)
            .into_iter()
            .map(|mut members| {
                members.reverse();
                members
            })
            .collect();
        assert_eq!(orders(&again), reversed);
        // ...every scalar's text byte for byte (the spellings a service may fingerprint)...
        for kept in ["1.50", "1E+2", r#""a\u00e9\"b""#, r#""100.00""#] {
            assert!(again.contains(kept), "{kept} in {again}");
        }
        // ...and whitespace inside every object and array, around every name and comma.
        assert!(
            again.starts_with("\n{\n\t\"list\" : [\n\t\t3 ,\n\t\t2 ,"),
            "{again}"
        );
        assert!(again.contains("\"x\" : [\n\t\t\t{\n\t\t\t\t\"q\" : 2 ,\n\t\t\t\t\"p\" : 1\n\t\t\t} ,\n\t\t\t[\n\t\t\t] ,\n\t\t\t{\n\t\t\t}\n\t\t]"), "{again}");
        assert!(again.ends_with("}\n"));
        // Pretty or compact input alike: never the same bytes.
        let pretty =
            serde_json::to_string_pretty(&serde_json::from_str::<Value>(text).unwrap()).unwrap();
        assert_ne!(respelled(&pretty).unwrap(), pretty);
        assert_eq!(respelled(" \"x\" ").unwrap(), "\n\"x\"\n");
    }

    #[test]
    fn repeated_finds_identifiers_and_values_but_not_what_was_sent() {
        let first = br#"{"order_id":"0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f","status":"created",
            "amount_minor":10000,"request_id":"PR-123e4567","item":"book","ok":true}"#;
        let sent = br#"{"request_id":"PR-123e4567","amount":"120.00","item":"book"}"#;
        // A problem naming nothing of the first answer; its own status member is not a value.
        let clean = br#"{"type":"about:blank","title":"key reused","status":422,
            "detail":"This key was used for a request that was created with other parameters."}"#;
        assert!(repeated(first, sent, clean).is_empty());
        // The id inside a detail, a value as a whole, a number, a member name.
        let leaks = [
            (
                &br#"{"detail":"see order 0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f"}"#[..],
                "\"0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f\"",
            ),
            (br#"{"state":"created"}"#, "\"created\""),
            (br#"{"stored":{"amount_minor":10000}}"#, "10000"),
            (
                br#"{"0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f":1}"#,
                "\"0192f1c4-7a1e-7b8e-9c3d-1a2b3c4d5e6f\"",
            ),
        ];
        for (later, leak) in leaks {
            assert_eq!(repeated(first, sent, later), [leak], "{later:?}");
        }
        // What the request carried itself may be echoed.
        assert!(repeated(
            first,
            sent,
            br#"{"request_id":"PR-123e4567","item":"book"}"#
        )
        .is_empty());
        // Bodies that are not JSON: compared as text.
        assert_eq!(
            repeated(b"order-0192f1c4", b"", b"key reused: order-0192f1c4").len(),
            1
        );
        assert!(repeated(b"", b"", b"anything").is_empty());
    }
}

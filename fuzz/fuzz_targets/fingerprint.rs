//! Fingerprint canonicalisation. The first byte picks a respelling, the rest is a body. For every
//! accepted body: the canonical JSON is valid JSON with sorted keys that canonicalises to itself;
//! the same intent spelled differently (amount as padded or trimmed decimal or as amount_minor,
//! currency omitted/upper/lower case, quantity explicit or omitted, field order reversed,
//! metadata added) has the same fingerprint; a changed business field changes it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Map, Value};
use tombstoned::fingerprint::Fingerprint;
use tombstoned::money::Currency;
use tombstoned::order_request::{parse_order, OrderRequest, RequestDefaults, MAX_TEXT_CHARS};

const VERSION: &str = "2026-12-01";

fn defaults() -> RequestDefaults {
    RequestDefaults {
        currency: Currency::parse("CNY").unwrap(),
    }
}

/// The order as a body, spelled per `flags`.
fn respell(order: &OrderRequest, flags: u8) -> String {
    let digits = order.currency.minor_digits();
    let canonical = order.currency.format(order.amount_minor);
    let amount = match flags & 3 {
        0 => json!({"amount": canonical}),
        1 if digits > 0 => {
            let trimmed = canonical.trim_end_matches('0').trim_end_matches('.');
            json!({"amount": trimmed})
        }
        _ => json!({"amount_minor": order.amount_minor}),
    };
    let mut fields: Vec<(String, Value)> = vec![
        ("request_id".into(), json!(order.request_id)),
        ("item".into(), json!(order.item)),
        ("recipient".into(), json!(order.recipient)),
    ];
    fields.extend(amount.as_object().unwrap().clone());
    let code = order.currency.code();
    match (flags >> 2) & 3 {
        0 if code == "CNY" => {}
        1 => fields.push(("currency".into(), json!(code.to_ascii_lowercase()))),
        _ => fields.push(("currency".into(), json!(code))),
    }
    if order.quantity != 1 || flags & 16 != 0 {
        fields.push(("quantity".into(), json!(order.quantity)));
    }
    if flags & 32 != 0 {
        fields.push(("metadata".into(), json!({"trace_id": format!("t-{flags}")})));
    }
    if flags & 64 != 0 {
        fields.reverse();
    }
    // Written by hand so the field order is the one chosen (serde_json's map would sort it).
    let parts: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v))
        .collect();
    format!("{{{}}}", parts.join(","))
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let Ok(order) = parse_order(body, &defaults()) else {
        return;
    };
    let fingerprint = Fingerprint::of(&order, VERSION).unwrap();
    let canonical = Fingerprint::canonical_json(&order, VERSION).unwrap();

    // Canonical JSON: valid, keys sorted, and a fixed point of canonicalisation.
    let value: Value = serde_json::from_str(&canonical).unwrap();
    let object: &Map<String, Value> = value.as_object().unwrap();
    let keys: Vec<&String> = object.keys().collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(serde_jcs_round_trip(&value), canonical);
    assert_eq!(
        object["amount_minor"],
        json!(order.amount_minor.to_string())
    );
    assert_eq!(object["request_id"], json!(order.request_id));

    // The same intent, spelled otherwise: the same fingerprint.
    let respelled = respell(&order, flags);
    let again = parse_order(respelled.as_bytes(), &defaults())
        .unwrap_or_else(|e| panic!("respelling refused: {e:?}\n{respelled}"));
    assert_eq!(
        Fingerprint::of(&again, VERSION).unwrap(),
        fingerprint,
        "{respelled}"
    );

    // Another intent: another fingerprint.
    let mut changed = order.clone();
    match flags % 4 {
        0 if order.amount_minor < i64::MAX => changed.amount_minor += 1,
        1 if order.quantity < i32::MAX => changed.quantity += 1,
        2 if order.item.chars().count() < MAX_TEXT_CHARS => changed.item.push('x'),
        _ if order.recipient.chars().count() < MAX_TEXT_CHARS => changed.recipient.push('x'),
        _ => return,
    }
    assert_ne!(Fingerprint::of(&changed, VERSION).unwrap(), fingerprint);
    assert_ne!(Fingerprint::of(&order, "2099-01-01").unwrap(), fingerprint);
});

/// The canonical text of an already canonical value, through a plain re-serialisation with
/// sorted keys (what JCS does for these strings and integers).
fn serde_jcs_round_trip(value: &Value) -> String {
    // serde_json without `preserve_order` keeps object keys sorted, and the canonical object
    // holds only strings and small integers, whose JCS and serde_json forms agree.
    value.to_string()
}

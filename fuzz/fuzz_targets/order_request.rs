//! Request parsing: any bytes as a `POST /v1/orders` body. Never a panic (nesting, huge numbers,
//! invalid UTF-8, duplicate keys ...); an accepted request satisfies every documented rule; a
//! refused one names at least one field or says why it is malformed; parsing is deterministic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tombstoned::fingerprint::Fingerprint;
use tombstoned::money::Currency;
use tombstoned::order_request::{parse_order, OrderRequestError, RequestDefaults, MAX_TEXT_CHARS};

fuzz_target!(|data: &[u8]| {
    let defaults = RequestDefaults {
        currency: Currency::parse("CNY").unwrap(),
    };
    match parse_order(data, &defaults) {
        Ok(order) => {
            assert!(order.amount_minor > 0, "{order:?}");
            assert!(order.quantity >= 1, "{order:?}");
            for text in [&order.request_id, &order.item, &order.recipient] {
                let n = text.chars().count();
                assert!((1..=MAX_TEXT_CHARS).contains(&n), "{order:?}");
                assert!(!text.chars().any(char::is_control), "{order:?}");
            }
            if let Some(metadata) = &order.metadata {
                assert!(metadata.is_object());
                // PostgreSQL's jsonb cannot store a NUL character, in a key or a string. (Not a
                // search for the text `\u0000` in the serialised form: an escaped backslash
                // followed by `u0000` is a legitimate string.)
                assert!(!contains_nul(metadata), "{order:?}");
            }
            // The amount has a canonical decimal form in its currency, and it parses back.
            let text = order.currency.format(order.amount_minor);
            assert_eq!(
                tombstoned::money::parse_amount(&text, order.currency).ok(),
                Some(order.amount_minor)
            );
            let fingerprint = Fingerprint::of(&order, "2026-12-01").unwrap();
            let again = parse_order(data, &defaults).unwrap();
            assert_eq!(again, order);
            assert_eq!(Fingerprint::of(&again, "2026-12-01").unwrap(), fingerprint);
        }
        Err(OrderRequestError::Invalid(errors)) => assert!(!errors.is_empty()),
        Err(OrderRequestError::Malformed(why)) => assert!(!why.is_empty()),
    }
});

fn contains_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(contains_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || contains_nul(v)),
        _ => false,
    }
}

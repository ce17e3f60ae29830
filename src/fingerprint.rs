//! The fingerprint of a business intent: SHA-256 over the RFC 8785 (JCS) canonical JSON of a
//! versioned object holding only the parameters that change the business result, after defaults
//! (docs/protocol.md, "Identity").
//!
//! The canonical object, version 1:
//!
//! ```json
//! {"amount_minor":"10000","api_version":"2026-12-01","currency":"CNY","fingerprint_version":1,
//!  "item":"book","quantity":1,"recipient":"alice@example.com","request_id":"req-1"}
//! ```
//!
//! `amount_minor` is a JSON *string*: RFC 8785 writes numbers as IEEE doubles, so two i64 amounts
//! above 2^53 could otherwise canonicalise to the same text. `metadata`, headers and field order
//! never reach this object. Stored fingerprints must stay comparable for as long as tombstones
//! live (forever): any change to this encoding needs a new `fingerprint_version`, and the golden
//! test below pins version 1.

use std::io;

use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::order_request::OrderRequest;

/// The version of the canonical object; part of the hashed bytes.
pub const FINGERPRINT_VERSION: u32 = 1;

/// A SHA-256 fingerprint (32 bytes, stored in `idempotency_records.fingerprint`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The canonical encoding failed (it cannot for the types used; kept typed rather than panicking).
#[derive(Debug, thiserror::Error)]
#[error("cannot canonicalise the request for its fingerprint")]
pub struct FingerprintError(#[source] serde_json::Error);

/// The canonical object. Its fields are declared in RFC 8785 key order (UTF-16 code units:
/// `amount_minor` < `api_version` < ... < `request_id`), so serde_json's compact output of it *is*
/// the JCS text: serde_json escapes strings exactly as JCS does and writes these integers as JCS
/// does. [`Fingerprint::canonical_json`] produces it with `serde_jcs`, the definition; the hot path
/// ([`Fingerprint::of`]) skips serde_jcs's general machinery (a map sorted by UTF-16 keys per
/// object), which cost more than everything else a replay does in the daemon. The tests hold the
/// two byte for byte, over arbitrary strings.
#[derive(Serialize)]
struct CanonicalIntent<'a> {
    amount_minor: MinorUnits,
    api_version: &'a str,
    currency: &'a str,
    fingerprint_version: u32,
    item: &'a str,
    quantity: i32,
    recipient: &'a str,
    request_id: &'a str,
}

impl<'a> CanonicalIntent<'a> {
    fn new(order: &'a OrderRequest, api_version: &'a str) -> Self {
        CanonicalIntent {
            amount_minor: MinorUnits(order.amount_minor),
            api_version,
            currency: order.currency.code(),
            fingerprint_version: FINGERPRINT_VERSION,
            item: &order.item,
            quantity: order.quantity,
            recipient: &order.recipient,
            request_id: &order.request_id,
        }
    }
}

/// `amount_minor` as a JSON string of its decimal digits (the text of `i64::to_string`), formatted
/// on the stack.
struct MinorUnits(i64);

impl Serialize for MinorUnits {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(itoa::Buffer::new().format(self.0))
    }
}

/// Feeds what serde_json writes straight into SHA-256: the canonical text is never stored.
struct HashWriter(Sha256);

impl io::Write for HashWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.update(bytes);
        Ok(bytes.len())
    }
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.update(bytes);
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Fingerprint {
    /// The fingerprint of a validated request under an API version: SHA-256 of
    /// [`Fingerprint::canonical_json`]'s bytes, written by serde_json from the key-ordered struct
    /// into the hash as it goes.
    pub fn of(order: &OrderRequest, api_version: &str) -> Result<Self, FingerprintError> {
        let mut hash = HashWriter(Sha256::new());
        serde_json::to_writer(&mut hash, &CanonicalIntent::new(order, api_version))
            .map_err(FingerprintError)?;
        Ok(Self(hash.0.finalize().into()))
    }

    /// The exact bytes that are hashed (for documentation and tests), as RFC 8785 defines them:
    /// written by `serde_jcs`.
    pub fn canonical_json(
        order: &OrderRequest,
        api_version: &str,
    ) -> Result<String, FingerprintError> {
        serde_jcs::to_string(&CanonicalIntent::new(order, api_version)).map_err(FingerprintError)
    }

    /// The 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// From stored bytes; `None` unless exactly 32.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// Lower-case hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({})", self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Currency;
    use crate::order_request::{parse_order, RequestDefaults};
    use proptest::prelude::*;

    const V: &str = "2026-12-01";

    fn defaults() -> RequestDefaults {
        RequestDefaults {
            currency: Currency::parse("CNY").unwrap(),
        }
    }

    fn fp(body: &str) -> Fingerprint {
        let order = parse_order(body.as_bytes(), &defaults()).unwrap();
        Fingerprint::of(&order, V).unwrap()
    }

    #[test]
    fn golden_version_1() {
        let order = parse_order(
            br#"{"request_id":"req-1","amount":"100","item":"book","recipient":"alice@example.com"}"#,
            &defaults(),
        )
        .unwrap();
        assert_eq!(
            Fingerprint::canonical_json(&order, V).unwrap(),
            r#"{"amount_minor":"10000","api_version":"2026-12-01","currency":"CNY","fingerprint_version":1,"item":"book","quantity":1,"recipient":"alice@example.com","request_id":"req-1"}"#
        );
        // Pinned: changing this breaks every stored fingerprint (bump FINGERPRINT_VERSION).
        assert_eq!(
            Fingerprint::of(&order, V).unwrap().to_hex(),
            hex::encode(Sha256::digest(
                Fingerprint::canonical_json(&order, V).unwrap().as_bytes()
            ))
        );
    }

    #[test]
    fn spellings_of_one_intent_agree() {
        let base = fp(r#"{"request_id":"r","amount":"100","item":"i","recipient":"x"}"#);
        for body in [
            r#"{"request_id":"r","amount":"100.0","item":"i","recipient":"x"}"#,
            r#"{"request_id":"r","amount":"100.00","item":"i","recipient":"x"}"#,
            r#"{"request_id":"r","amount_minor":10000,"item":"i","recipient":"x"}"#,
            r#"{"recipient":"x","item":"i","amount":"100","request_id":"r"}"#,
            r#"{"request_id":"r","amount":"100","item":"i","recipient":"x","currency":"cny"}"#,
            r#"{"request_id":"r","amount":"100","item":"i","recipient":"x","quantity":1}"#,
            r#"{"request_id":"r","amount":"100","item":"i","recipient":"x","metadata":{"trace":"t"}}"#,
        ] {
            assert_eq!(fp(body), base, "{body}");
        }
    }

    #[test]
    fn api_version_is_part_of_the_intent() {
        let order = parse_order(
            br#"{"request_id":"r","amount":"1","item":"i","recipient":"x"}"#,
            &defaults(),
        )
        .unwrap();
        assert_ne!(
            Fingerprint::of(&order, V).unwrap(),
            Fingerprint::of(&order, "2027-01-01").unwrap()
        );
    }

    #[test]
    fn big_amounts_do_not_collide() {
        // 2^53 + 1 and 2^53 are the same IEEE double; as strings they differ.
        let a =
            fp(r#"{"request_id":"r","amount_minor":9007199254740993,"item":"i","recipient":"x"}"#);
        let b =
            fp(r#"{"request_id":"r","amount_minor":9007199254740992,"item":"i","recipient":"x"}"#);
        assert_ne!(a, b);
    }

    #[test]
    fn texts_longer_than_a_hash_block_hash_as_their_canonical_text() {
        // serde_json writes into the hash piece by piece; pieces of every size, across blocks.
        for n in [0, 1, 63, 64, 65, 255, 1000] {
            let order = order_of(
                "r".repeat(n.max(1)),
                "中".repeat(n),
                "\n".repeat(n),
                i64::MIN,
                -1,
            );
            let jcs = Fingerprint::canonical_json(&order, V).unwrap();
            assert_eq!(
                Fingerprint::of(&order, V).unwrap().0,
                <[u8; 32]>::from(Sha256::digest(jcs.as_bytes())),
                "{n}"
            );
        }
    }

    fn order_of(
        request_id: String,
        item: String,
        recipient: String,
        minor: i64,
        q: i32,
    ) -> OrderRequest {
        OrderRequest {
            request_id,
            amount_minor: minor,
            currency: Currency::parse("CNY").unwrap(),
            item,
            quantity: q,
            recipient,
            metadata: None,
        }
    }

    proptest! {
        #[test]
        fn the_key_ordered_struct_writes_exactly_the_jcs_text(
            // Any Unicode, control characters, quotes, backslashes and U+2028 included.
            request_id in any::<String>(), item in "\\PC*|[\\x00-\\x1f\\x7f\"\\\\\u{2028}\u{2029}a-z]{0,12}",
            recipient in any::<String>(), api in any::<String>(),
            minor in any::<i64>(), quantity in any::<i32>(),
        ) {
            let order = order_of(request_id, item, recipient, minor, quantity);
            let jcs = Fingerprint::canonical_json(&order, &api).unwrap();
            let fast = serde_json::to_vec(&CanonicalIntent::new(&order, &api)).unwrap();
            prop_assert_eq!(jcs.as_bytes(), fast.as_slice());
            prop_assert_eq!(
                Fingerprint::of(&order, &api).unwrap().0,
                <[u8; 32]>::from(Sha256::digest(jcs.as_bytes()))
            );
        }
    }

    fn text() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 \\-_.@é中]{1,20}"
    }

    proptest! {
        #[test]
        fn field_order_metadata_and_amount_spelling_never_matter(
            request_id in text(), item in text(), recipient in text(),
            minor in 1i64..=i64::MAX, quantity in 1i32..=i32::MAX,
            code in prop::sample::select(vec!["CNY", "JPY", "KWD", "EUR"]),
            meta in "[a-z]{0,8}", order in any::<u64>(),
        ) {
            let c = Currency::parse(code).unwrap();
            let j = |s: &str| serde_json::Value::String(s.to_owned());
            let mut fields = vec![
                ("request_id", j(&request_id)),
                ("item", j(&item)),
                ("recipient", j(&recipient)),
                ("quantity", serde_json::json!(quantity)),
                ("currency", j(&code.to_ascii_lowercase())),
            ];
            let canonical = {
                let mut m = serde_json::Map::new();
                for (k, v) in &fields { m.insert((*k).into(), v.clone()); }
                m.insert("amount_minor".into(), serde_json::json!(minor));
                serde_json::Value::Object(m).to_string()
            };
            // The same intent, shuffled, with the amount as a decimal string and metadata.
            let shift = (order % fields.len() as u64) as usize;
            fields.rotate_left(shift);
            fields.push(("amount", j(&c.format(minor))));
            fields.push(("metadata", serde_json::json!({ "m": meta })));
            let respelled = format!("{{{}}}", fields.iter()
                .map(|(k, v)| format!("{:?}:{}", k, v))
                .collect::<Vec<_>>().join(","));
            prop_assert_eq!(fp(&canonical), fp(&respelled));
        }

        #[test]
        fn any_business_change_changes_the_fingerprint(
            request_id in text(), minor in 1i64..i64::MAX, quantity in 1i32..i32::MAX,
            which in 0usize..6,
        ) {
            let body = |rid: &str, m: i64, cur: &str, item: &str, q: i32, rcpt: &str| {
                serde_json::json!({
                    "request_id": rid, "amount_minor": m, "currency": cur,
                    "item": item, "quantity": q, "recipient": rcpt,
                }).to_string()
            };
            let base = body(&request_id, minor, "CNY", "item", quantity, "rcpt");
            let changed = match which {
                0 => body(&format!("{request_id}x"), minor, "CNY", "item", quantity, "rcpt"),
                1 => body(&request_id, minor + 1, "CNY", "item", quantity, "rcpt"),
                2 => body(&request_id, minor, "USD", "item", quantity, "rcpt"),
                3 => body(&request_id, minor, "CNY", "item2", quantity, "rcpt"),
                4 => body(&request_id, minor, "CNY", "item", quantity + 1, "rcpt"),
                _ => body(&request_id, minor, "CNY", "item", quantity, "rcpt2"),
            };
            prop_assert_ne!(fp(&base), fp(&changed));
        }
    }
}

//! Admission per idempotency key: at most [`MAX_IN_FLIGHT_PER_KEY`] claims of one scope and key
//! run at a time in this process — the owner and one waiter. A further request for the same key
//! would only queue behind the owner's row lock, holding a pooled connection for up to
//! `api.claim_lock_timeout` to learn what the waiter already will; it is answered 409
//! request-in-progress at once, without touching the pool. So a few hot keys retried by many
//! clients hold at most two connections each, and unrelated requests keep the rest of the pool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Claims of one (tenant, principal, key) allowed in flight at once: the owner and one waiter,
/// which is exactly the protocol's commit/rollback race (the waiter replays or becomes the owner).
pub const MAX_IN_FLIGHT_PER_KEY: u32 = 2;

/// The scope and key of a claim, as one allocation shared by the table and the admission: each
/// part's length (4 bytes, little-endian) then its bytes, so no two scopes and keys have the same
/// encoding whatever their text holds. Built once per request, where three `String`s and their
/// copies for the table were six allocations.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ScopedKey(Arc<[u8]>);

impl ScopedKey {
    fn new(tenant: &str, principal: &str, key: &str) -> Self {
        let parts = [tenant, principal, key];
        let len: usize = parts.iter().map(|p| 4 + p.len()).sum();
        // Written into a buffer on the stack and copied once into the shared allocation (a
        // `Vec` would be a second allocation); only an unusually long scope takes the `Vec`.
        let mut stack = [0u8; 512];
        let mut heap = Vec::new();
        let bytes = if len <= stack.len() {
            &mut stack[..len]
        } else {
            heap.resize(len, 0);
            &mut heap[..]
        };
        let mut at = 0;
        for part in parts {
            // A part of 4 GiB cannot reach here (a key is at most 255 bytes, the tenant and
            // principal come from the tokens file); saturating keeps this total anyway.
            let part_len = u32::try_from(part.len()).unwrap_or(u32::MAX);
            bytes[at..at + 4].copy_from_slice(&part_len.to_le_bytes());
            bytes[at + 4..at + 4 + part.len()].copy_from_slice(part.as_bytes());
            at += 4 + part.len();
        }
        ScopedKey(Arc::from(&*bytes))
    }
}

type Counts = Arc<Mutex<HashMap<ScopedKey, u32>>>;

/// Counts the claims in flight per scope and key. Entries exist only while a claim runs.
#[derive(Debug, Default)]
pub(crate) struct KeyGate {
    in_flight: Counts,
}

/// One admitted claim; dropping it (when the claim's task ends) lets the next one in.
#[derive(Debug)]
pub(crate) struct Admission {
    in_flight: Counts,
    key: ScopedKey,
}

impl KeyGate {
    /// Admits a claim for `key` in the scope (`tenant`, `principal`), or `None` when
    /// [`MAX_IN_FLIGHT_PER_KEY`] are already in flight.
    pub(crate) fn enter(&self, tenant: &str, principal: &str, key: &str) -> Option<Admission> {
        let key = ScopedKey::new(tenant, principal, key);
        let mut counts = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The table's entry shares the admission's bytes (a reference count, not a copy).
        let count = counts.entry(key.clone()).or_insert(0);
        if *count >= MAX_IN_FLIGHT_PER_KEY {
            return None;
        }
        *count += 1;
        Some(Admission {
            in_flight: Arc::clone(&self.in_flight),
            key,
        })
    }

    /// How many distinct keys have claims in flight (for tests).
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut counts = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = counts.get_mut(&self.key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_claims_per_scope_and_key_then_refusal_until_one_ends() {
        let gate = KeyGate::default();
        let owner = gate.enter("acme", "alice", "k").unwrap();
        let waiter = gate.enter("acme", "alice", "k").unwrap();
        assert!(
            gate.enter("acme", "alice", "k").is_none(),
            "a third waits for nothing"
        );
        // Other scopes and keys are unaffected.
        let other_key = gate.enter("acme", "alice", "k2").unwrap();
        let other_principal = gate.enter("acme", "bob", "k").unwrap();
        let other_tenant = gate.enter("globex", "alice", "k").unwrap();
        drop(owner);
        let next = gate.enter("acme", "alice", "k").unwrap();
        assert!(gate.enter("acme", "alice", "k").is_none());
        drop((waiter, next, other_key, other_principal, other_tenant));
        assert_eq!(gate.keys(), 0, "no entry outlives its claims");
    }

    #[test]
    fn scopes_and_keys_whose_texts_run_together_stay_apart() {
        let gate = KeyGate::default();
        let _a = gate.enter("ab", "c", "k").unwrap();
        let _b = gate.enter("ab", "c", "k").unwrap();
        for other in [("a", "bc", "k"), ("ab", "", "ck"), ("", "abc", "k")] {
            assert!(gate.enter(other.0, other.1, other.2).is_some(), "{other:?}");
        }
        // A scope too long for the stack buffer is counted the same way.
        let long = "p".repeat(600);
        let _c = gate.enter("ab", &long, "k").unwrap();
        let _d = gate.enter("ab", &long, "k").unwrap();
        assert!(gate.enter("ab", &long, "k").is_none());
    }
}

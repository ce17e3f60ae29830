//! Injected faults.

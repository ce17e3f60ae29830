//! Integration tests against a real PostgreSQL (see `harness`). One test binary, so the
//! server starts once and the tests share helpers.

mod cleanup;
mod cleanup_support;
mod harness;
mod scheduler;
mod schema;

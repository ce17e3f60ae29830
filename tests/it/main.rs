//! Integration tests against a real PostgreSQL (see `harness`). One test binary, so the
//! server starts once and the tests share helpers.

mod harness;
mod ops_server;
mod ops_support;
mod prometheus;
mod schema;

//! Integration tests against a real PostgreSQL (see `harness`). One test binary, so the
//! server starts once and the tests share helpers.

mod api;
mod api_bad_input;
mod api_commit_loss;
mod api_concurrency;
mod api_openapi;
mod api_support;
mod bench_scripts;
mod cleanup;
mod cleanup_support;
mod daemon;
mod daemon_support;
mod dashboard;
mod demo;
mod dist;
mod harness;
mod ops_server;
mod ops_support;
mod prometheus;
mod replay_locks;
mod scheduler;
mod schema;
mod security;

//! tombstoned keeps the idempotency records of a write API on PostgreSQL honest over time.
//!
//! The protocol it implements is described in `docs/protocol.md`; in short:
//!
//! * a client's retry of one business intent carries the same idempotency key; the server claims
//!   the key, performs the business write and stores the response in **one** transaction, and
//!   replays the stored response to every later retry with the same fingerprint;
//! * expired records are never deleted by the cleaner but turned into **tombstones** (the body is
//!   cleared, scope, key and fingerprint stay), so a key can never be reused for another purchase.
//!
//! Modules, one concept each:
//!
//! * [`config`] — the TOML configuration, environment overrides and validation into typed values;
//! * [`schedule`] — crontab(5) schedules and their fire times;
//! * [`cleanup`] — one cleanup run (batched, key-ordered tombstoning, purge), the dry run and the
//!   single-runner lease;
//! * [`scheduler`] — when cleanup runs happen inside `serve`;
//! * [`db`] — connection pools, SQLSTATE classification, and [`db::migrations`];
//! * [`pg_cluster`] — throwaway local PostgreSQL clusters for tests, the demo and benchmarks;
//! * [`readiness`] — is the database reachable and the schema current (`/readyz`, watchdog);
//! * [`ops_server`] — the metrics and health listener (`/metrics`, `/healthz`, `/readyz`);
//! * [`systemd`] — sd_notify readiness, status and the watchdog;
//! * [`cli`] — the command line and its exit codes; [`generate`] — its man pages and shell
//!   completions;
//! * [`claim`] — the claim/replay transaction and its [`claim::ClaimOutcome`];
//! * [`http`] — the HTTP API around it; [`auth`] — bearer tokens; [`order_request`] — request
//!   validation; [`money`] — currencies and amounts; [`fingerprint`] — the intent's fingerprint;
//!   [`lookup`] — the read-only GET queries.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod claim;
pub mod cleanup;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod db;
pub mod demo;
pub mod fingerprint;
pub mod generate;
pub mod http;
pub mod lookup;
pub mod metrics;
pub mod money;
pub mod ops_server;
pub mod order_request;
pub mod pg_cluster;
pub mod readiness;
pub mod schedule;
pub mod scheduler;
pub mod systemd;

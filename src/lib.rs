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
//! Modules, one concept each, in layers whose dependencies run one way (downwards):
//!
//! * edge: [`cli`] — arguments, logging, one file per command, the error → exit status mapping
//!   and the one error printer, the hidden `generate` of man pages and completions; only
//!   `main.rs` uses it. `stdout` — printing that a closed pipe
//!   ends quietly;
//! * composition: `daemon` — `serve`: builds the services, signals, reload, ordered shutdown;
//!   `signals` — SIGTERM/SIGINT as a graceful stop, a second one exits 130;
//! * services: [`scheduler`] — when cleanup runs happen; [`cleanup`] — one run, its batch engine,
//!   report, dry run, lease and statements; [`http`] — the HTTP API around [`claim`] (the
//!   claim/replay protocol and its statements) and `lookup` (the read-only GET queries);
//!   [`ops`] — the metrics/health listener, readiness, the watchdog policy and the sd_notify
//!   transport; [`outbox`] — the relay that delivers `outbox_events` as signed webhooks, at least
//!   once, in order per order, with dead letters and requeue; [`status`] — what `tombstoned
//!   status` reads (lease, run history, backlog, lag) in one read-only snapshot; [`conformance`]
//!   — `tombstoned conformance`: any HTTP endpoint checked from outside against the idempotency
//!   contract, nine checks returning a typed report; [`operations`] — which database role may
//!   use which operation of the SQL API (grants, their audit, the transitional grants of an
//!   upgrade); [`keys`] — `tombstoned keys explain`: why one key answers what it answers, read
//!   without a lock;
//! * the database contract: [`schema`] — which schema this binary needs: the migrations that
//!   build it, the SQL API's version, and the one check every caller asks (the schema as it
//!   stands is committed under `schema/`);
//! * foundation: [`db`] — sessions and pools, the pipelined transaction, SQLSTATE classes, the
//!   one error text, shared statements, its own `[database]` section ([`db::settings`]); [`config`] — the configuration validated into typed values, one file
//!   per section, composing `db`'s; [`metrics`] — every Prometheus series; [`telemetry`] — the
//!   OpenTelemetry spans and their OTLP export (nothing at all while `[tracing]` is off);
//!   `connections` — the
//!   HTTP server loop both listeners share (connection cap, header-read and idle timeouts,
//!   bounded shutdown); `fd_budget` — fitting those caps into `RLIMIT_NOFILE`;
//! * pure core: [`instance`] — who this process is to other instances; [`schedule`] —
//!   crontab(5) schedules; [`fingerprint`] — the intent's fingerprint; [`money`] — currencies
//!   and amounts; [`order_request`] — request validation; [`auth`] — bearer tokens; [`exit`] —
//!   the exit statuses; `toml_diagnostic` — TOML errors told by
//!   line, column and key, never by the text; `settings` — the validation vocabulary every
//!   settings section shares (`ConfigError`, the gathered problems, durations, sizes, ranges);
//! * to the side, both with the default-on `demo` feature: `demo` — a scripted client of the
//!   real binary; `pg_cluster` — the throwaway PostgreSQL clusters it runs on, which the tests
//!   and the benchmark start too (what only they need on top — test options, stopping and
//!   restarting the server — is in the `tombstoned-testkit` crate, `testkit/`).
//!
//! The public surface is what `main.rs`, the tests, the benchmark and the testkit use; the
//! modules only the crate itself uses (`daemon`, `signals`, `stdout`, `settings`, `connections`,
//! `fd_budget`, `lookup`, `toml_diagnostic`, `demo`) are `pub(crate)`. ARCHITECTURE.md has the
//! layers and the rules `tests/architecture.rs` checks.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod claim;
pub mod cleanup;
pub mod cli;
pub mod config;
pub mod conformance;
pub(crate) mod connections;
pub(crate) mod daemon;
pub mod db;
#[cfg(feature = "demo")]
pub(crate) mod demo;
pub mod exit;
pub(crate) mod fd_budget;
pub mod fingerprint;
pub mod http;
pub mod instance;
pub mod keys;
pub(crate) mod lookup;
pub mod metrics;
pub mod money;
pub mod operations;
pub mod ops;
pub mod order_request;
pub mod outbox;
#[cfg(feature = "demo")]
pub mod pg_cluster;
pub mod schedule;
pub mod scheduler;
pub mod schema;
pub(crate) mod settings;
pub(crate) mod signals;
pub mod status;
pub(crate) mod stdout;
pub mod telemetry;
pub(crate) mod toml_diagnostic;

//! Integration tests against a real PostgreSQL (see `harness`). One test binary, so the
//! server starts once and the tests share helpers.

mod api;
mod api_bad_input;
mod api_commit_loss;
mod api_concurrency;
mod api_openapi;
mod api_support;
mod bench_scripts;
mod benchmark_figures;
mod boundaries;
mod boundaries_upgrade;
mod cleanup;
mod cleanup_workers;
mod cli;
mod clients_node;
mod clients_python;
mod clients_support;
mod config_hostile;
mod conformance;
mod conformance_support;
mod conn_support;
mod credentials;
mod daemon;
mod daemon_reload;
mod daemon_support;
mod dashboard;
mod db_faults;
mod demo;
mod demo_keep;
mod dist;
mod doc_samples;
mod endpoint_functions;
mod error_text;
mod examples;
mod keys;
mod lease;
mod listen_any_port;
mod multihost;
mod operations_support;
mod ops_server;
mod ops_support;
mod outbox;
mod outbox_support;
mod pipeline;
mod pooled_sessions;
mod pooler;
mod pooler_support;
mod progress;
mod prometheus;
mod protocol_paths;
mod readiness;
mod readme_docs;
mod replay_locks;
mod scale_out_docs;
mod scheduler;
mod schema;
mod schema_contract;
mod schema_support;
mod security;
mod session_settings;
mod silent_proxy;
mod sql_api;
mod standby;
mod status;
mod throttle;
mod tls;
mod tls_support;
mod traces;
mod traces_config;
mod traces_support;

/// The shared harness (`tombstoned_testkit::harness`), plus the binary only this package's tests
/// can name.
mod harness {
    pub use tombstoned_testkit::harness::*;

    /// The `tombstoned` binary built for these tests.
    pub fn binary() -> &'static str {
        env!("CARGO_BIN_EXE_tombstoned")
    }
}

/// Row factories, checksums and barriers of the cleanup tests.
mod cleanup_support {
    pub use tombstoned_testkit::cleanup_support::*;
}

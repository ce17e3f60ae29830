//! Test infrastructure for tombstoned, out of the product: the harness that gives every test a
//! fresh database on a real PostgreSQL ([`harness`]), the row factories, checksums and
//! `pg_stat_activity` barriers of the cleanup tests ([`cleanup_support`]), and the pgbench
//! scripts generated from the claim statements ([`pgbench_scripts`]), and what tests do to a
//! throwaway cluster beyond the demo — test options, stopping and restarting the server, running
//! tools as its owner — with connection strings for the databases they create ([`cluster`]);
//! and streaming standbys of such a cluster for the failover and replica tests ([`standby`]);
//! a real PgBouncer in front of a server, for the pooler tests and the benchmark ([`pgbouncer`]).
//!
//! Used as a dev-dependency by `tests/it`, `tests/reliability` and `benches/scenarios`; those keep
//! `crate::harness` and `crate::cleanup_support` as re-exports, adding what only a test of the
//! `tombstoned` package can know (the path of the built binary).
#![forbid(unsafe_code)]

pub mod cleanup_support;
pub mod cluster;
pub mod harness;
pub mod pgbench_scripts;
pub mod pgbouncer;
pub mod standby;

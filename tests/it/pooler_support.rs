//! A real PgBouncer in front of the harness's server, for the pooler tests: the testkit's
//! (`tombstoned_testkit::pgbouncer`, shared with the benchmark's scenario 11).

pub use tombstoned_testkit::pgbouncer::{PgBouncer, PoolMode};

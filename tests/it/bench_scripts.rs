//! The benchmark's pgbench scripts (`bench/pgbench/*.sql`) run the product's own claim and
//! replay statements (`tombstoned::claim::sql`): regenerate them when a statement changes.

use tombstoned_testkit::pgbench_scripts;

#[test]
fn pgbench_scripts_are_the_claim_statements() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/pgbench");
    if let Err(e) = pgbench_scripts::check_files(&dir) {
        panic!("{e:#}");
    }
}

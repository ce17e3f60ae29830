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

/// docs/scale-out.md, "Hash partitioning": on a hash-partitioned copy of the records table
/// (`bench/partitioning.sql`, 8 partitions by `idempotency_key`), the product's claim and replay
/// statements touch exactly one partition — pruned at plan time with custom plans, and at
/// executor start with generic plans (`Subplans Removed: 7`), which is what a prepared
/// statement on a long-lived connection runs.
#[tokio::test]
async fn hash_partitioning_prunes_claims_and_replays_to_one_partition() {
    use tombstoned::claim::sql;
    use tombstoned::db::sql::qualify;

    let db = crate::harness::TestDb::new().await;
    let client = db.client().await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/partitioning.sql");
    let script = std::fs::read_to_string(&script).expect("bench/partitioning.sql");
    client
        .batch_execute(&script)
        .await
        .expect("bench/partitioning.sql runs on the migrated schema");

    // Record i = 5 of the script: principal-5 of tenant-1, live.
    let scope = "'tenant-1', 'principal-5', 'create-order', md5('key/5')::uuid::text";
    let statements = [
        (
            "replay: READ_FOR_REPLAY",
            sql::READ_FOR_REPLAY,
            scope.to_owned(),
        ),
        ("replay: READ_EXPIRED", sql::READ_EXPIRED, scope.to_owned()),
        (
            "claim: CLAIM_AND_CREATE",
            sql::CLAIM_AND_CREATE,
            format!(
                "{scope}, sha256(convert_to('fp/5', 'UTF8')), \
                 '01900000-0000-7000-8000-000000000001', 'req-5', 100, '1.00', 'CNY', 'item', 1, \
                 'recipient', 86400000000, '01900000-0000-7000-8000-000000000002', NULL"
            ),
        ),
    ];
    for (name, statement, args) in statements {
        let text = qualify(statement, "tombstoned_hash");
        for mode in ["force_custom_plan", "force_generic_plan"] {
            client
                .batch_execute(&format!(
                    "SET plan_cache_mode = {mode}; DEALLOCATE ALL; PREPARE s AS {text}"
                ))
                .await
                .unwrap_or_else(|e| panic!("PREPARE {name}: {e}"));
            let plan: Vec<String> = client
                .query(&format!("EXPLAIN (COSTS OFF) EXECUTE s({args})"), &[])
                .await
                .unwrap_or_else(|e| panic!("EXPLAIN {name}: {e}"))
                .iter()
                .map(|r| r.get(0))
                .collect();
            let plan = plan.join("\n");
            eprintln!("-- {name}, plan_cache_mode = {mode}\n{plan}\n");
            let mut partitions: Vec<&str> = plan
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("idempotency_records_p") && w.len() == 22)
                .collect();
            partitions.sort_unstable();
            partitions.dedup();
            assert_eq!(
                partitions.len(),
                1,
                "{name} ({mode}) must touch one partition, touches {partitions:?}:\n{plan}"
            );
            if mode == "force_generic_plan" {
                assert!(
                    plan.contains("Subplans Removed: 7"),
                    "{name}: a generic plan prunes at executor start:\n{plan}"
                );
            } else {
                assert!(
                    !plan.contains("Subplans Removed"),
                    "{name}: a custom plan prunes at plan time:\n{plan}"
                );
            }
        }
    }

    // What partitioning buys and what it does not: each partition's heap and indexes are an
    // eighth (vacuum and index builds per partition), the total is not smaller.
    let rows = client
        .query(
            "SELECT relation, heap_bytes, index_bytes, total_bytes FROM tombstoned_hash.sizes",
            &[],
        )
        .await
        .expect("sizes");
    let mut partitions_total = 0i64;
    let mut single_total = 0i64;
    let mut largest_partition = 0i64;
    for r in &rows {
        let (relation, heap, index, total): (String, i64, i64, i64) =
            (r.get(0), r.get(1), r.get(2), r.get(3));
        eprintln!("{relation:<40} heap {heap:>9} indexes {index:>9} total {total:>9}");
        if relation == "idempotency_records_single" {
            single_total = total;
        } else if relation.starts_with("idempotency_records_p") {
            partitions_total += total;
            largest_partition = largest_partition.max(total);
        }
    }
    eprintln!("partitions together {partitions_total}, one table {single_total}");
    assert!(
        partitions_total * 10 >= single_total * 9,
        "partitioning does not make the records smaller: {partitions_total} vs {single_total}"
    );
    assert!(
        largest_partition * 4 <= single_total,
        "each of 8 partitions holds about an eighth: {largest_partition} of {single_total}"
    );
}

-- A hash-partitioned copy of tombstoned.idempotency_records (docs/scale-out.md, "Hash
-- partitioning"): schema tombstoned_hash, 8 partitions by hash of idempotency_key, with the
-- table's columns, defaults, checks and indexes (the primary key contains the key, so it can be
-- the partitioned table's primary key: uniqueness stays global), and copies of orders and
-- outbox_events and the scope table (V5: scope as an integer id) and the replay window's rule
-- (V7) so the claim statement plans against it unchanged.
--
-- Run on a migrated database (tombstoned migrate), then EXPLAIN the product's statements with
-- {schema} = tombstoned_hash; tests/it/bench_scripts.rs does exactly that:
--
--   psql "$DATABASE_URL" -f bench/partitioning.sql
--   cargo test --test it hash_partitioning -- --nocapture   # the plans, custom and generic
--
-- Fills 200,000 records (95 % tombstones, 16 principals in 4 tenants, UUID-shaped keys).
-- Drop it with: DROP SCHEMA tombstoned_hash CASCADE;

DROP SCHEMA IF EXISTS tombstoned_hash CASCADE;
CREATE SCHEMA tombstoned_hash;

CREATE TABLE tombstoned_hash.idempotency_records
    (LIKE tombstoned.idempotency_records INCLUDING ALL)
    PARTITION BY HASH (idempotency_key);

DO $$
BEGIN
    FOR i IN 0..7 LOOP
        EXECUTE format(
            'CREATE TABLE tombstoned_hash.idempotency_records_p%s
                 PARTITION OF tombstoned_hash.idempotency_records
                 FOR VALUES WITH (MODULUS 8, REMAINDER %s)', i, i);
    END LOOP;
END
$$;

CREATE TABLE tombstoned_hash.idempotency_scopes (LIKE tombstoned.idempotency_scopes INCLUDING ALL);
CREATE TABLE tombstoned_hash.orders (LIKE tombstoned.orders INCLUDING ALL);
CREATE TABLE tombstoned_hash.outbox_events (LIKE tombstoned.outbox_events INCLUDING ALL);

-- The replay window's rule the statements call ({schema}.replay_window_open, V7), copied from
-- the migrated schema as its catalogue has it.
DO $$
BEGIN
    EXECUTE replace(
        pg_get_functiondef('tombstoned.replay_window_open(timestamptz, timestamptz)'::regprocedure),
        'FUNCTION tombstoned.', 'FUNCTION tombstoned_hash.');
END
$$;

-- 16 principals in 4 tenants: principal p is scope p + 1.
INSERT INTO tombstoned_hash.idempotency_scopes (scope_id, tenant_id, principal_id, operation)
SELECT p + 1, 'tenant-' || p / 4, 'principal-' || p, 'create-order'
FROM generate_series(0, 15) AS p;

-- i % 20 = 0: live (deadline tomorrow); the others tombstones of the last 400 days.
INSERT INTO tombstoned_hash.idempotency_records
    (scope_id, idempotency_key, fingerprint, status_code, response_body, order_id, created_at,
     replay_deadline, expired, expired_at)
SELECT 1 + i % 16, md5('key/' || i)::uuid::text, sha256(convert_to('fp/' || i, 'UTF8')), 201,
       CASE WHEN live THEN jsonb_build_object('status', 'created') END,
       md5('ord/' || i)::uuid, deadline - interval '24 hours', deadline,
       NOT live, CASE WHEN NOT live THEN deadline + interval '3 minutes' END
FROM generate_series(1, 200000) AS i
CROSS JOIN LATERAL (SELECT i % 20 = 0 AS live) AS l
CROSS JOIN LATERAL (
    SELECT CASE WHEN l.live THEN now() + interval '1 day'
                ELSE now() - interval '400 days' + i * interval '170 seconds' END AS deadline
) AS d;

ANALYZE tombstoned_hash.idempotency_records;

-- The same records in one unpartitioned table, for the sizes (what partitioning does not buy).
CREATE TABLE tombstoned_hash.idempotency_records_single
    (LIKE tombstoned.idempotency_records INCLUDING ALL);
INSERT INTO tombstoned_hash.idempotency_records_single
    SELECT * FROM tombstoned_hash.idempotency_records;
ANALYZE tombstoned_hash.idempotency_records_single;

-- Sizes: the partitioned table's partitions (each an eighth) against the one table.
CREATE VIEW tombstoned_hash.sizes AS
SELECT c.relname::text AS relation,
       pg_relation_size(c.oid) AS heap_bytes,
       pg_indexes_size(c.oid) AS index_bytes,
       pg_total_relation_size(c.oid) AS total_bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'tombstoned_hash' AND c.relkind = 'r'
  AND c.relname LIKE 'idempotency_records%'
ORDER BY 1;

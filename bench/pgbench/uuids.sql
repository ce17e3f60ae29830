-- GENERATED from tombstoned::claim::sql by
--   cargo bench --bench scenarios -- --write-pgbench-scripts
-- Do not edit: the benchmark and tests/it/bench_scripts.rs fail when this file drifts.
--
-- claim.sql's first query alone: what the extra round trip costs pgbench.
SELECT gen_random_uuid() AS key, gen_random_uuid() AS request_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS order_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS event_id,
       'tenant-' || (:client_id % 16) / 4 AS tenant,
       'principal-' || (:client_id % 16) AS principal \gset

-- Scenario 8 (benches/scenarios/sql_api.rs): a replay written against the SQL API instead of the
-- fused statement of replay.sql — claim() on a key of the replay set inside its window, then
-- COMMIT, pipelined in one round trip. The same data and constants as replay.sql. Needs -M
-- prepared. Hand-written (not generated); CI's `--quick` benchmark run executes it.
-- Constants (-D): those of replay.sql.
\set n random(1, :replay_keys)
\set key 1000000000000000000 + :n
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT outcome, status_code, response_body FROM "tombstoned".claim(:tenant, :principal, :operation,
    :key::text, :fingerprint::bytea, :window_us::bigint * interval '1 microsecond',
    (:lock_timeout)::text::interval);
COMMIT;
\endpipeline

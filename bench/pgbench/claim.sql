-- GENERATED from tombstoned::claim::sql by
--   cargo bench --bench scenarios -- --write-pgbench-scripts
-- Do not edit: the benchmark and tests/it/bench_scripts.rs fail when this file drifts.
--
-- A claim of a new key exactly as the API runs it (docs/api.md, "The SQL"): BEGIN, the
-- lock_timeout, claim_and_create, COMMIT, pipelined in one round trip. Needs -M prepared.
-- The first query makes the new key and ids (pgbench cannot make strings; the API makes them
-- in-process): one extra round trip that scenario 4 measures alone (uuids.sql) and reports.
-- Constants (-D): lock_timeout operation fingerprint amount_minor amount currency item quantity
-- recipient window_us metadata.
SELECT gen_random_uuid() AS key, gen_random_uuid() AS request_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS order_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS event_id,
       'tenant-' || (:client_id % 16) / 4 AS tenant,
       'principal-' || (:client_id % 16) AS principal \gset
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT set_config('lock_timeout', :lock_timeout, true);
WITH scope AS (
    SELECT scope_id FROM "tombstoned".idempotency_scopes
    WHERE tenant_id = :tenant AND principal_id = :principal AND operation = :operation
), existing AS (
    SELECT fingerprint, status_code, order_id, expired,
           NOT "tombstoned".replay_window_open(replay_deadline, now()) AS past_deadline
    FROM "tombstoned".idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = :key
), replay AS (
    SELECT status_code AS replay_status, response_body::text AS replay_body
    FROM "tombstoned".idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = :key
      AND fingerprint = :fingerprint::bytea
      AND NOT expired AND "tombstoned".replay_window_open(replay_deadline, now())
    FOR SHARE
), claim AS (
    INSERT INTO "tombstoned".idempotency_records
        (scope_id, idempotency_key, fingerprint,
         status_code, response_body, order_id, replay_deadline)
    SELECT scope.scope_id, :key, :fingerprint::bytea, 201,
        jsonb_build_object('order_id', :order_id::uuid, 'request_id', :request_id::text, 'amount_minor', :amount_minor::bigint, 'amount', :amount::text, 'currency', :currency::text, 'item', :item::text, 'quantity', :quantity::integer, 'recipient', :recipient::text, 'status', 'created', 'created_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24":"MI":"SS.US"Z"')),
        :order_id::uuid, now() + :window_us::bigint * interval '1 microsecond'
    FROM scope
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (scope_id, idempotency_key) DO NOTHING
    RETURNING order_id, response_body
), new_order AS (
    INSERT INTO "tombstoned".orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                        currency, item, quantity, recipient, status, created_at)
    SELECT claim.order_id, :tenant, :principal, :request_id, :amount_minor, :currency, :item, :quantity, :recipient, 'created', now()
    FROM claim
    RETURNING order_id
), event AS (
    INSERT INTO "tombstoned".outbox_events (event_id, tenant_id, order_id, event_type, payload)
    SELECT :event_id, :tenant, new_order.order_id, 'order.created',
           jsonb_build_object('order', claim.response_body,
                              'metadata', coalesce(:metadata::jsonb, '{}'::jsonb))
    FROM new_order CROSS JOIN claim
)
SELECT true AS created, response_body::text AS body, order_id, NULL::bytea AS fingerprint,
       NULL::boolean AS expired, NULL::boolean AS past_deadline, NULL::smallint AS status_code
FROM claim
UNION ALL
SELECT false, replay.replay_body, existing.order_id, existing.fingerprint, existing.expired,
       existing.past_deadline, replay.replay_status
FROM existing LEFT JOIN replay ON true
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT FROM scope);
COMMIT;
\endpipeline

-- Scenario 8 (benches/scenarios/sql_api.rs): the endpoint's owner transaction written against the
-- SQL API instead of the fused statement of claim.sql — claim(), the order, its event, complete()
-- and COMMIT, pipelined in one round trip (a client that knows the key is new: the benchmark's
-- best case for the functions). The same data, constants and body as claim.sql. Needs -M prepared.
-- Hand-written (not generated); CI's `--quick` benchmark run executes it.
-- Constants (-D): those of claim.sql.
SELECT gen_random_uuid() AS key, gen_random_uuid() AS request_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS order_id,
       (lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(random()::text), 1, 19))::uuid AS event_id,
       'tenant-' || (:client_id % 16) / 4 AS tenant,
       'principal-' || (:client_id % 16) AS principal \gset
\startpipeline
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT outcome FROM "tombstoned".claim(:tenant, :principal, :operation, :key::text, :fingerprint::bytea,
    :window_us::bigint * interval '1 microsecond', (:lock_timeout)::text::interval);
INSERT INTO "tombstoned".orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                    currency, item, quantity, recipient, status, created_at)
VALUES (:order_id, :tenant, :principal, :request_id, :amount_minor, :currency, :item, :quantity,
        :recipient, 'created', now());
INSERT INTO "tombstoned".outbox_events (event_id, tenant_id, order_id, event_type, payload)
VALUES (:event_id, :tenant, :order_id, 'order.created',
        jsonb_build_object('order', jsonb_build_object('order_id', :order_id::uuid, 'request_id', :request_id::text, 'amount_minor', :amount_minor::bigint, 'amount', :amount::text, 'currency', :currency::text, 'item', :item::text, 'quantity', :quantity::integer, 'recipient', :recipient::text, 'status', 'created', 'created_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24":"MI":"SS.US"Z"')),
                           'metadata', coalesce(:metadata::jsonb, '{}'::jsonb)));
SELECT "tombstoned".complete(:tenant, :principal, :operation, :key::text, 201,
    jsonb_build_object('order_id', :order_id::uuid, 'request_id', :request_id::text, 'amount_minor', :amount_minor::bigint, 'amount', :amount::text, 'currency', :currency::text, 'item', :item::text, 'quantity', :quantity::integer, 'recipient', :recipient::text, 'status', 'created', 'created_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24":"MI":"SS.US"Z"')), :order_id::text);
COMMIT;
\endpipeline

-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text, text, text, integer, text, bigint, uuid, jsonb, text)
 RETURNS TABLE(created boolean, body text, order_id uuid, fingerprint bytea, expired boolean, past_deadline boolean, status_code smallint)
 LANGUAGE plpgsql
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the endpoint''s claim runs under READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'TS005';
    END IF;
    PERFORM set_config('lock_timeout', $17, true);
    RETURN QUERY
WITH scope AS (
    SELECT scope_id FROM idempotency_scopes
    WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3
), existing AS (
    SELECT fingerprint, status_code, order_id, expired,
           NOT replay_window_open(replay_deadline, now()) AS past_deadline
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
), replay AS (
    SELECT status_code AS replay_status, response_body::text AS replay_body
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
      AND fingerprint = $5::bytea
      AND NOT expired AND replay_window_open(replay_deadline, now())
    FOR SHARE
), claim AS (
    INSERT INTO idempotency_records
        (scope_id, idempotency_key, fingerprint,
         status_code, response_body, order_id, replay_deadline)
    SELECT scope.scope_id, $4, $5::bytea, 201,
        jsonb_build_object('order_id', $6::uuid, 'request_id', $7::text, 'amount_minor', $8::bigint, 'amount', $9::text, 'currency', $10::text, 'item', $11::text, 'quantity', $12::integer, 'recipient', $13::text, 'status', 'created', 'created_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24":"MI":"SS.US"Z"')),
        $6::uuid, now() + $14::bigint * interval '1 microsecond'
    FROM scope
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (scope_id, idempotency_key) DO NOTHING
    RETURNING order_id, response_body
), new_order AS (
    INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                        currency, item, quantity, recipient, status, created_at)
    SELECT claim.order_id, $1, $2, $7, $8, $10, $11, $12, $13, 'created', now()
    FROM claim
    RETURNING order_id
), event AS (
    INSERT INTO outbox_events (event_id, tenant_id, order_id, event_type, payload)
    SELECT $15, $1, new_order.order_id, 'order.created',
           jsonb_build_object('order', claim.response_body,
                              'metadata', coalesce($16::jsonb, '{}'::jsonb))
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
END
$function$

-- ACL: {owner=X/owner}

-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.endpoint_claim_rejected(text, text, text, text, bytea, smallint, jsonb, bigint, text)
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
    PERFORM set_config('lock_timeout', $9, true);
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
    SELECT scope.scope_id, $4, $5::bytea, $6::smallint, $7::jsonb, NULL,
           now() + $8::bigint * interval '1 microsecond'
    FROM scope
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (scope_id, idempotency_key) DO NOTHING
    RETURNING order_id, response_body
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

-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.claim(tenant_id text, principal_id text, operation text, idempotency_key text, fingerprint bytea, replay_window interval, lock_timeout interval DEFAULT '00:00:02'::interval)
 RETURNS TABLE(outcome text, status_code integer, response_body text, resource_id text, replay_deadline timestamp with time zone, expired_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
 SET lock_timeout TO '2s'
AS $function$
#variable_conflict use_column
DECLARE
    called_at constant timestamptz := clock_timestamp();
    wait_ms numeric;
    claimed boolean;
    existing record;
    sid integer;
BEGIN
    PERFORM require_scope(claim.tenant_id, claim.principal_id, claim.operation,
                          claim.idempotency_key);
    PERFORM require_fingerprint(claim.fingerprint);
    IF claim.replay_window IS NULL OR claim.replay_window <= interval '0' THEN
        RAISE EXCEPTION 'invalid argument replay_window: must be a positive interval'
            USING ERRCODE = '22023';
    END IF;
    wait_ms := ceil(extract(epoch FROM claim.lock_timeout) * 1000);
    IF wait_ms IS NULL OR wait_ms < 0 OR wait_ms > 2147483647 THEN
        RAISE EXCEPTION 'invalid argument lock_timeout: must be between 0 and 24 days (0: no limit)'
            USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('lock_timeout', wait_ms::bigint || 'ms', true);
    sid := ensure_scope(claim.tenant_id, claim.principal_id, claim.operation);

    FOR attempt IN 1..3 LOOP
        PERFORM set_config('tombstoned.claiming', 'on', true);
        INSERT INTO idempotency_records
            (scope_id, idempotency_key, fingerprint, replay_deadline, created_at)
        VALUES (sid, claim.idempotency_key, claim.fingerprint,
                called_at + claim.replay_window, called_at)
        ON CONFLICT (scope_id, idempotency_key) DO NOTHING;
        claimed := FOUND;
        PERFORM set_config('tombstoned.claiming', 'off', true);
        IF claimed THEN
            RETURN QUERY SELECT 'owner'::text, NULL::integer, NULL::text, NULL::text,
                                called_at + claim.replay_window, NULL::timestamptz;
            RETURN;
        END IF;
        SELECT * INTO existing
          FROM record_outcome(claim.tenant_id, claim.principal_id, claim.operation,
                              claim.idempotency_key, claim.fingerprint, true);
        IF FOUND AND existing.outcome = 'unfinished' THEN
            RAISE EXCEPTION 'this transaction already claimed the idempotency key and has not completed it'
                USING ERRCODE = 'TS004',
                      HINT = 'Claim a key once per transaction; complete() stores its answer.';
        ELSIF FOUND AND existing.outcome <> 'changed' THEN
            RETURN QUERY SELECT existing.outcome, existing.status_code, existing.response_body,
                                existing.resource_id, existing.replay_deadline,
                                existing.expired_at;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the idempotency record changed while it was being read; retry the transaction'
        USING ERRCODE = '40001';
END
$function$

-- ACL: {owner=X/owner}

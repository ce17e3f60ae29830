-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.record_outcome(tenant_id text, principal_id text, operation text, idempotency_key text, fingerprint bytea, share_lock boolean)
 RETURNS TABLE(outcome text, status_code integer, response_body text, resource_id text, replay_deadline timestamp with time zone, expired_at timestamp with time zone)
 LANGUAGE plpgsql
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    found_row record;
    sid integer;
BEGIN
    sid := find_scope(record_outcome.tenant_id, record_outcome.principal_id,
                      record_outcome.operation);
    IF sid IS NULL THEN
        RETURN;
    END IF;
    IF record_outcome.share_lock THEN
        SELECT r.status_code, r.response_body::text AS body,
               coalesce(r.resource_id, r.order_id::text) AS resource, r.replay_deadline
          INTO found_row
          FROM idempotency_records AS r
         WHERE r.scope_id = sid
           AND r.idempotency_key = record_outcome.idempotency_key
           AND r.fingerprint = record_outcome.fingerprint
           AND NOT r.expired
           AND replay_window_open(r.replay_deadline, clock_timestamp())
           FOR SHARE;
        IF FOUND THEN
            IF found_row.status_code IS NULL THEN
                RETURN QUERY SELECT 'unfinished'::text, NULL::integer, NULL::text, NULL::text,
                                    found_row.replay_deadline, NULL::timestamptz;
            ELSE
                RETURN QUERY SELECT 'replay'::text, found_row.status_code::integer,
                                    found_row.body, found_row.resource,
                                    found_row.replay_deadline, NULL::timestamptz;
            END IF;
            RETURN;
        END IF;
    END IF;

    SELECT r.fingerprint = record_outcome.fingerprint AS same_intent, r.status_code,
           r.response_body::text AS body, coalesce(r.resource_id, r.order_id::text) AS resource,
           r.expired, r.expired_at, r.replay_deadline,
           NOT replay_window_open(r.replay_deadline, clock_timestamp()) AS past_deadline
      INTO found_row
      FROM idempotency_records AS r
     WHERE r.scope_id = sid
       AND r.idempotency_key = record_outcome.idempotency_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF found_row.status_code IS NULL THEN
        RETURN QUERY SELECT 'unfinished'::text, NULL::integer, NULL::text, NULL::text,
                            found_row.replay_deadline, NULL::timestamptz;
    ELSIF NOT found_row.same_intent THEN
        RETURN QUERY SELECT 'key_reused'::text, NULL::integer, NULL::text, NULL::text,
                            NULL::timestamptz, NULL::timestamptz;
    ELSIF found_row.expired OR found_row.past_deadline THEN
        RETURN QUERY SELECT 'expired'::text, NULL::integer, NULL::text, found_row.resource,
                            found_row.replay_deadline, found_row.expired_at;
    ELSIF NOT record_outcome.share_lock THEN
        RETURN QUERY SELECT 'replay'::text, found_row.status_code::integer, found_row.body,
                            found_row.resource, found_row.replay_deadline, NULL::timestamptz;
    ELSE
        RETURN QUERY SELECT 'changed'::text, NULL::integer, NULL::text, NULL::text,
                            NULL::timestamptz, NULL::timestamptz;
    END IF;
END
$function$

-- ACL: {owner=X/owner}

-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.enqueue_event(tenant_id text, aggregate_id text, event_type text, payload jsonb)
 RETURNS uuid
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    next_sequence integer;
    new_id uuid := gen_random_uuid();
BEGIN
    IF enqueue_event.tenant_id IS NULL OR enqueue_event.tenant_id = '' THEN
        RAISE EXCEPTION 'invalid argument tenant_id: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF enqueue_event.aggregate_id IS NULL
          OR char_length(enqueue_event.aggregate_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument aggregate_id: must be 1 to 255 characters'
            USING ERRCODE = '22023';
    ELSIF enqueue_event.event_type IS NULL
          OR char_length(enqueue_event.event_type) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument event_type: must be 1 to 255 characters'
            USING ERRCODE = '22023';
    ELSIF enqueue_event.payload IS NULL THEN
        RAISE EXCEPTION 'invalid argument payload: must not be NULL'
            USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT FROM operation_grants AS g
                    WHERE pg_has_role(session_user, g.grantee, 'MEMBER'))
       AND NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.rolname = session_user AND r.rolsuper)
    THEN
        RAISE EXCEPTION 'role "%" holds no operation: enqueue_event() is for a role granted one', session_user
            USING ERRCODE = '42501',
                  HINT = 'An operation is granted to the role by `tombstoned operations grant OPERATION ROLE`.';
    END IF;
    INSERT INTO outbox_aggregates AS a (tenant_id, aggregate_id, last_sequence)
    VALUES (enqueue_event.tenant_id, enqueue_event.aggregate_id, 1)
    ON CONFLICT (tenant_id, aggregate_id)
        DO UPDATE SET last_sequence = a.last_sequence + 1
    RETURNING a.last_sequence INTO next_sequence;
    INSERT INTO outbox_events
        (event_id, tenant_id, order_id, aggregate_id, event_type, payload, sequence, sender)
    VALUES (new_id, enqueue_event.tenant_id, NULL, enqueue_event.aggregate_id,
            enqueue_event.event_type, enqueue_event.payload, next_sequence, session_user);
    RETURN new_id;
END
$function$

-- ACL: {owner=X/owner}

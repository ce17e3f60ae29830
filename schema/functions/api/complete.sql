-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.complete(tenant_id text, principal_id text, operation text, idempotency_key text, status_code integer, response_body jsonb, resource_id text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    stored text;
BEGIN
    PERFORM require_scope(complete.tenant_id, complete.principal_id, complete.operation,
                          complete.idempotency_key);
    IF complete.status_code IS NULL OR complete.status_code NOT BETWEEN 200 AND 499 THEN
        RAISE EXCEPTION 'invalid argument status_code: must be 200 to 499 (roll back on a 5xx; it is not an outcome to replay)'
            USING ERRCODE = '22023';
    ELSIF complete.response_body IS NULL THEN
        RAISE EXCEPTION 'invalid argument response_body: must not be NULL'
            USING ERRCODE = '22023';
    ELSIF complete.resource_id IS NOT NULL
          AND char_length(complete.resource_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument resource_id: must be NULL or 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
    UPDATE idempotency_records AS r
       SET status_code = complete.status_code,
           response_body = complete.response_body,
           resource_id = complete.resource_id
     WHERE r.scope_id = find_scope(complete.tenant_id, complete.principal_id,
                                   complete.operation)
       AND r.idempotency_key = complete.idempotency_key
       AND r.status_code IS NULL
    RETURNING r.response_body::text INTO stored;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this transaction holds no unfinished claim of the idempotency key'
            USING ERRCODE = 'TS002',
                  HINT = 'Call complete() once, after claim() answered ''owner'', in the same transaction.';
    END IF;
    RETURN stored;
END
$function$

-- ACL: {owner=X/owner}

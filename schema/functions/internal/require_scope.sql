-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.require_scope(tenant_id text, principal_id text, operation text, idempotency_key text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
BEGIN
    IF tenant_id IS NULL OR tenant_id = '' THEN
        RAISE EXCEPTION 'invalid argument tenant_id: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF principal_id IS NULL OR principal_id = '' THEN
        RAISE EXCEPTION 'invalid argument principal_id: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF operation IS NULL OR operation = '' THEN
        RAISE EXCEPTION 'invalid argument operation: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF idempotency_key IS NULL OR char_length(idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument idempotency_key: must be 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
END
$function$

-- ACL: {owner=X/owner}

-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.fingerprint(intent jsonb)
 RETURNS bytea
 LANGUAGE plpgsql
 IMMUTABLE SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
BEGIN
    IF intent IS NULL THEN
        RAISE EXCEPTION 'invalid argument intent: must not be NULL'
            USING ERRCODE = '22023';
    END IF;
    RETURN sha256(convert_to(intent::text, 'UTF8'));
END
$function$

-- ACL: {owner=X/owner}

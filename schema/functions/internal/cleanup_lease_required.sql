-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.cleanup_lease_required(renewed_until timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
AS $function$
BEGIN
    IF renewed_until IS NULL THEN
        RAISE EXCEPTION 'the cleanup lease is no longer held by this run'
            USING ERRCODE = 'TS001';
    END IF;
    RETURN renewed_until;
END
$function$

-- ACL: default (the owner and PUBLIC may execute)

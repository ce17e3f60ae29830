-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.cleanup_lease_required(renewed_until timestamp with time zone)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
BEGIN
    IF NOT has_table_privilege(session_user, 'cleanup_lease', 'UPDATE') THEN
        RAISE EXCEPTION 'role "%" may not renew the cleanup lease (cleanup_lease_required() is the cleaner''s)', session_user
            USING ERRCODE = '42501';
    END IF;
    IF renewed_until IS NULL THEN
        RAISE EXCEPTION 'the cleanup lease is no longer held by this run'
            USING ERRCODE = 'TS001';
    END IF;
    RETURN renewed_until;
END
$function$

-- ACL: {owner=X/owner}

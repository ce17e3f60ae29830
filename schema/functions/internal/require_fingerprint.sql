-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.require_fingerprint(fingerprint bytea)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
BEGIN
    IF NOT has_table_privilege('operation_grants'::regclass, 'SELECT') THEN
        RAISE EXCEPTION 'require_fingerprint() is internal to the SQL API: call claim() or lookup()'
            USING ERRCODE = '42501';
    END IF;
    IF fingerprint IS NULL OR octet_length(fingerprint) <> 32 THEN
        RAISE EXCEPTION 'invalid argument fingerprint: must be 32 bytes (a SHA-256)'
            USING ERRCODE = '22023';
    END IF;
END
$function$

-- ACL: {owner=X/owner}

-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.require_scope(tenant_id text, principal_id text, operation text, idempotency_key text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
BEGIN
    IF NOT has_table_privilege('operation_grants'::regclass, 'SELECT') THEN
        RAISE EXCEPTION 'require_scope() is internal to the SQL API: call claim(), complete() or lookup()'
            USING ERRCODE = '42501';
    END IF;
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
    -- Before any record is read: the refusal is the same whether the key exists or not.
    IF NOT EXISTS (
           SELECT FROM operation_grants AS g
            WHERE (g.operation = require_scope.operation
                   OR (g.operation IS NULL AND require_scope.operation <> 'create-order'))
              AND pg_has_role(session_user, g.grantee, 'MEMBER'))
       AND NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.rolname = session_user AND r.rolsuper)
    THEN
        RAISE EXCEPTION 'role "%" may not use operation "%"', session_user, require_scope.operation
            USING ERRCODE = '42501',
                  HINT = 'The operation is granted to the role by `tombstoned operations grant OPERATION ROLE`.';
    END IF;
END
$function$

-- ACL: {owner=X/owner}

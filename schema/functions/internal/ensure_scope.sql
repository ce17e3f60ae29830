-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.ensure_scope(tenant_id text, principal_id text, operation text)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
#variable_conflict use_column
DECLARE
    found_id integer;
BEGIN
    -- The second pass reads again in a new statement (a new snapshot) after the INSERT found
    -- the scope committed by a concurrent first claim.
    FOR attempt IN 1..2 LOOP
        SELECT s.scope_id INTO found_id
          FROM idempotency_scopes AS s
         WHERE s.tenant_id = ensure_scope.tenant_id
           AND s.principal_id = ensure_scope.principal_id
           AND s.operation = ensure_scope.operation;
        IF FOUND THEN
            RETURN found_id;
        END IF;
        EXIT WHEN attempt = 2;
        INSERT INTO idempotency_scopes AS s (tenant_id, principal_id, operation)
        VALUES (ensure_scope.tenant_id, ensure_scope.principal_id, ensure_scope.operation)
        ON CONFLICT (tenant_id, principal_id, operation) DO NOTHING
        RETURNING s.scope_id INTO found_id;
        IF FOUND THEN
            RETURN found_id;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the scope was created by a transaction this snapshot cannot see; retry the transaction'
        USING ERRCODE = '40001';
END
$function$

-- ACL: {owner=X/owner}

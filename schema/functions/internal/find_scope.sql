-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.find_scope(tenant_id text, principal_id text, operation text)
 RETURNS integer
 LANGUAGE sql
 STABLE
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
    SELECT s.scope_id
      FROM idempotency_scopes AS s
     WHERE s.tenant_id = $1 AND s.principal_id = $2 AND s.operation = $3
$function$

-- ACL: {owner=X/owner}

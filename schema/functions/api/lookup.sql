-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.lookup(tenant_id text, principal_id text, operation text, idempotency_key text, fingerprint bytea)
 RETURNS TABLE(outcome text, status_code integer, response_body text, resource_id text, replay_deadline timestamp with time zone, expired_at timestamp with time zone)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
#variable_conflict use_column
BEGIN
    PERFORM require_scope(lookup.tenant_id, lookup.principal_id, lookup.operation,
                          lookup.idempotency_key);
    PERFORM require_fingerprint(lookup.fingerprint);
    RETURN QUERY
        SELECT o.outcome, o.status_code, o.response_body, o.resource_id, o.replay_deadline,
               o.expired_at
          FROM record_outcome(lookup.tenant_id, lookup.principal_id, lookup.operation,
                              lookup.idempotency_key, lookup.fingerprint,
                              current_setting('transaction_read_only') <> 'on') AS o
         WHERE o.outcome IN ('replay', 'key_reused', 'expired');
END
$function$

-- ACL: {owner=X/owner}

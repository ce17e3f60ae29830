-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.require_completed_claim()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
BEGIN
    PERFORM FROM idempotency_records AS r
     WHERE r.scope_id = NEW.scope_id
       AND r.idempotency_key = NEW.idempotency_key
       AND r.status_code IS NULL;
    IF FOUND THEN
        RAISE EXCEPTION 'a key claimed in this transaction was never completed; the transaction is rolled back'
            USING ERRCODE = 'TS003',
                  HINT = 'Call complete() after the business write, before COMMIT.';
    END IF;
    RETURN NULL;
END
$function$

-- ACL: {owner=X/owner}

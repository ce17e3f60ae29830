-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE OR REPLACE FUNCTION tombstoned.record_operation_grant_change()
 RETURNS trigger
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path TO 'tombstoned', 'pg_temp'
AS $function$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        INSERT INTO operation_grant_changes (action, operation, grantee, forced, note)
        VALUES ('revoke', OLD.operation,
                coalesce((SELECT r.rolname::text FROM pg_roles AS r WHERE r.oid = OLD.grantee),
                         OLD.grantee::oid::text),
                OLD.forced, OLD.note);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO operation_grant_changes (action, operation, grantee, forced, note)
        VALUES ('grant', NEW.operation,
                coalesce((SELECT r.rolname::text FROM pg_roles AS r WHERE r.oid = NEW.grantee),
                         NEW.grantee::oid::text),
                NEW.forced, NEW.note);
    END IF;
    RETURN NULL;
END
$function$

-- ACL: {owner=X/owner}

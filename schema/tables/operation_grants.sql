-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.operation_grants (
    operation text,
    grantee regrole NOT NULL,
    granted_at timestamp with time zone NOT NULL DEFAULT now(),
    granted_by text NOT NULL DEFAULT SESSION_USER,
    forced boolean NOT NULL DEFAULT false,
    note text
);

ALTER TABLE tombstoned.operation_grants ADD CONSTRAINT operation_grants_key UNIQUE (operation, grantee);
ALTER TABLE tombstoned.operation_grants ADD CONSTRAINT operation_grants_operation_nonempty CHECK ((operation <> ''::text));

CREATE UNIQUE INDEX operation_grants_transitional_key ON tombstoned.operation_grants USING btree (grantee) WHERE (operation IS NULL);

CREATE TRIGGER operation_grants_audit AFTER INSERT OR DELETE OR UPDATE ON tombstoned.operation_grants FOR EACH ROW EXECUTE FUNCTION tombstoned.record_operation_grant_change();

-- ACL: default (the owner only)

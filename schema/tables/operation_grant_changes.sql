-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.operation_grant_changes (
    change_id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    changed_at timestamp with time zone NOT NULL DEFAULT now(),
    changed_by text NOT NULL DEFAULT SESSION_USER,
    action text NOT NULL,
    operation text,
    grantee text NOT NULL,
    forced boolean NOT NULL DEFAULT false,
    note text
);

ALTER TABLE tombstoned.operation_grant_changes ADD CONSTRAINT operation_grant_changes_action_known CHECK ((action = ANY (ARRAY['grant'::text, 'revoke'::text])));
ALTER TABLE tombstoned.operation_grant_changes ADD CONSTRAINT operation_grant_changes_pkey PRIMARY KEY (change_id);

-- ACL: default (the owner only)

-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.cleanup_lease (
    name text NOT NULL,
    holder text NOT NULL,
    holder_pid integer,
    holder_application_name text,
    acquired_at timestamp with time zone NOT NULL,
    renewed_at timestamp with time zone NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

ALTER TABLE tombstoned.cleanup_lease ADD CONSTRAINT cleanup_lease_names_nonempty CHECK (((name <> ''::text) AND (holder <> ''::text)));
ALTER TABLE tombstoned.cleanup_lease ADD CONSTRAINT cleanup_lease_pkey PRIMARY KEY (name);
ALTER TABLE tombstoned.cleanup_lease ADD CONSTRAINT cleanup_lease_renewed_after_acquired CHECK ((renewed_at >= acquired_at));

-- ACL: default (the owner only)

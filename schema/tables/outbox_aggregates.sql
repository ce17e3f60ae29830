-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.outbox_aggregates (
    tenant_id text NOT NULL,
    aggregate_id text NOT NULL,
    last_sequence integer NOT NULL
);

ALTER TABLE tombstoned.outbox_aggregates ADD CONSTRAINT outbox_aggregates_pkey PRIMARY KEY (tenant_id, aggregate_id);
ALTER TABLE tombstoned.outbox_aggregates ADD CONSTRAINT outbox_aggregates_sequence_positive CHECK ((last_sequence >= 1));

-- ACL: default (the owner only)

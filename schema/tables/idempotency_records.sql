-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.idempotency_records (
    replay_deadline timestamp with time zone NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    expired_at timestamp with time zone,
    order_id uuid,
    scope_id integer NOT NULL,
    status_code smallint,
    expired boolean NOT NULL DEFAULT false,
    idempotency_key text NOT NULL,
    fingerprint bytea NOT NULL,
    resource_id text,
    response_body jsonb
)
WITH (
    fillfactor=100,
    autovacuum_vacuum_scale_factor=0.02,
    autovacuum_vacuum_threshold=1000,
    autovacuum_vacuum_insert_scale_factor=0.05,
    autovacuum_analyze_scale_factor=0.02,
    toast.autovacuum_vacuum_scale_factor=0.02,
    toast.autovacuum_vacuum_threshold=1000
);

ALTER TABLE tombstoned.idempotency_records ADD CONSTRAINT idempotency_records_expired_at_iff_expired CHECK ((expired = (expired_at IS NOT NULL)));
ALTER TABLE tombstoned.idempotency_records ADD CONSTRAINT idempotency_records_fingerprint_length CHECK ((octet_length(fingerprint) = 32));
ALTER TABLE tombstoned.idempotency_records ADD CONSTRAINT idempotency_records_key_length CHECK (((char_length(idempotency_key) >= 1) AND (char_length(idempotency_key) <= 255)));
ALTER TABLE tombstoned.idempotency_records ADD CONSTRAINT idempotency_records_pkey PRIMARY KEY (scope_id, idempotency_key);
ALTER TABLE tombstoned.idempotency_records ADD CONSTRAINT idempotency_records_resource_id_length CHECK (((resource_id IS NULL) OR ((char_length(resource_id) >= 1) AND (char_length(resource_id) <= 255))));
ALTER TABLE tombstoned.idempotency_records ADD CONSTRAINT idempotency_records_status_code_range CHECK (((status_code IS NULL) OR ((status_code >= 100) AND (status_code <= 599))));
ALTER TABLE tombstoned.idempotency_records ADD CONSTRAINT idempotency_records_tombstone_has_no_body CHECK (((NOT expired) OR (response_body IS NULL)));

CREATE INDEX idempotency_records_due_idx ON tombstoned.idempotency_records USING btree (replay_deadline) WHERE (NOT expired);
CREATE INDEX idempotency_records_purge_idx ON tombstoned.idempotency_records USING brin (expired_at);

CREATE CONSTRAINT TRIGGER idempotency_records_claim_completed AFTER INSERT ON tombstoned.idempotency_records DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((new.status_code IS NULL) AND (NOT (current_setting('tombstoned.claiming'::text, true) IS DISTINCT FROM 'on'::text)))) EXECUTE FUNCTION tombstoned.require_completed_claim();

-- ACL: default (the owner only)

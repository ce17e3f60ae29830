-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.outbox_events (
    event_id uuid NOT NULL,
    tenant_id text NOT NULL,
    order_id uuid,
    event_type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    published_at timestamp with time zone,
    sequence integer NOT NULL DEFAULT 1,
    attempts integer NOT NULL DEFAULT 0,
    next_attempt_at timestamp with time zone NOT NULL DEFAULT now(),
    locked_until timestamp with time zone,
    locked_by text,
    last_attempt_at timestamp with time zone,
    last_status smallint,
    last_error text,
    dead_lettered_at timestamp with time zone,
    aggregate_id text,
    sender text DEFAULT SESSION_USER,
    traceparent text DEFAULT 
CASE
    WHEN (current_setting('tombstoned.traceparent'::text, true) ~ '^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$'::text) THEN current_setting('tombstoned.traceparent'::text, true)
    ELSE NULL::text
END
);

ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_aggregate_id_length CHECK (((aggregate_id IS NULL) OR ((char_length(aggregate_id) >= 1) AND (char_length(aggregate_id) <= 255))));
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_attempts_nonnegative CHECK ((attempts >= 0));
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_delivered_or_dead CHECK (((published_at IS NULL) OR (dead_lettered_at IS NULL)));
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_last_status_range CHECK (((last_status IS NULL) OR ((last_status >= 100) AND (last_status <= 599))));
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_lease_whole CHECK (((locked_until IS NULL) = (locked_by IS NULL)));
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_one_per_type UNIQUE (tenant_id, order_id, event_type);
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_one_subject CHECK (((order_id IS NULL) <> (aggregate_id IS NULL)));
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_order_fkey FOREIGN KEY (order_id) REFERENCES tombstoned.orders(order_id);
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_order_sequence_key UNIQUE (order_id, sequence);
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_pkey PRIMARY KEY (event_id);
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_sequence_positive CHECK ((sequence >= 1));
ALTER TABLE tombstoned.outbox_events ADD CONSTRAINT outbox_events_traceparent_format CHECK ((traceparent ~ '^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$'::text));

CREATE UNIQUE INDEX outbox_events_aggregate_sequence_key ON tombstoned.outbox_events USING btree (tenant_id, aggregate_id, sequence) WHERE (aggregate_id IS NOT NULL);
CREATE INDEX outbox_events_delivered_idx ON tombstoned.outbox_events USING btree (published_at) WHERE (published_at IS NOT NULL);
CREATE INDEX outbox_events_unpublished_idx ON tombstoned.outbox_events USING btree (created_at) WHERE (published_at IS NULL);

-- ACL: default (the owner only)

-- tombstoned schema, version 1.
--
-- Every object is created unqualified: `tombstoned migrate` creates the configured schema
-- (database.schema, default "tombstoned") and runs this file with search_path set to it.
-- The protocol these tables serve is docs/protocol.md.

-- One row per (scope, idempotency key), forever. Scope = tenant, principal and operation, all
-- taken from the authenticated caller, never from the request body. The row is created, the
-- business write done and the response stored in ONE transaction, so no "in progress" row is
-- ever visible. On expiry the cleaner turns the row into a tombstone: response_body is cleared
-- and expired set; scope, key and fingerprint stay so the key can never be reused for another
-- purchase.
CREATE TABLE idempotency_records (
    tenant_id        text        NOT NULL,
    principal_id     text        NOT NULL,
    operation        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    -- SHA-256 of the canonical business parameters (docs/protocol.md, "Identity").
    fingerprint      bytea       NOT NULL,
    -- HTTP status of the stored outcome (201, or 422 for a deterministic business rejection).
    -- Nullable only because the claim INSERT precedes the business write inside the claiming
    -- transaction; every committed row has it.
    status_code      smallint,
    -- The stored response; NULL once expired.
    response_body    jsonb,
    -- The business object the key produced, kept in the tombstone so callers can be pointed to
    -- it. No foreign key: tombstones must outlive any archiving of orders.
    order_id         uuid,
    expired          boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    replay_deadline  timestamptz NOT NULL,
    expired_at       timestamptz,

    CONSTRAINT idempotency_records_pkey
        PRIMARY KEY (tenant_id, principal_id, operation, idempotency_key),
    CONSTRAINT idempotency_records_key_length
        CHECK (char_length(idempotency_key) BETWEEN 1 AND 255),
    CONSTRAINT idempotency_records_fingerprint_length
        CHECK (octet_length(fingerprint) = 32),
    CONSTRAINT idempotency_records_scope_nonempty
        CHECK (tenant_id <> '' AND principal_id <> '' AND operation <> ''),
    -- A tombstone carries no body, and expired_at is set exactly when expired is.
    CONSTRAINT idempotency_records_tombstone_has_no_body
        CHECK (NOT expired OR response_body IS NULL),
    CONSTRAINT idempotency_records_expired_at_iff_expired
        CHECK (expired = (expired_at IS NOT NULL)),
    CONSTRAINT idempotency_records_status_code_range
        CHECK (status_code IS NULL OR status_code BETWEEN 100 AND 599)
) WITH (
    -- The claiming transaction INSERTs the row and then UPDATEs it with the response. That
    -- UPDATE changes no indexed column, so it can be a HOT update (no new index entries) if the
    -- page has room for the new version: 15% headroom keeps room for a few in-flight claims
    -- per page. Tombstoning is never HOT (it changes `expired`, which the partial indexes
    -- mention), so more headroom would buy nothing there.
    fillfactor = 85,
    -- Defaults vacuum after 20% of the table is dead. Each cleanup run leaves one dead version
    -- per tombstoned row, and the due index keeps pointing at them until vacuum: vacuum after
    -- 2% so due-index scans stay proportional to the rows actually due.
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    -- The table is insert-heavy; keep the visibility map and statistics current.
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    -- Bodies above ~2 kB live in TOAST; tombstoning kills every chunk of them at once.
    toast.autovacuum_vacuum_scale_factor = 0.02,
    toast.autovacuum_vacuum_threshold = 1000
);

-- The cleaner's index. Partial on NOT expired, so it holds live records only: finding the rows
-- due at a cutoff is a range scan whose cost grows with the rows due, never with the tombstones
-- accumulated over years (a full index on replay_deadline would walk every tombstone, whose
-- deadlines are all in the past, on every batch). Ordered by deadline so a batch takes the
-- oldest due rows first and LIMIT stops the scan. Measured: docs/cleanup.md.
CREATE INDEX idempotency_records_due_idx
    ON idempotency_records (replay_deadline)
    WHERE NOT expired;

-- The retention purge's index (retention.purge_tombstones_after): tombstones by expiry time,
-- so a purge batch also costs in proportion to the tombstones it deletes. About 20 bytes per
-- tombstone; the price of purge not scanning the whole table.
CREATE INDEX idempotency_records_purge_idx
    ON idempotency_records (expired_at)
    WHERE expired;

CREATE TABLE orders (
    order_id      uuid        NOT NULL,
    tenant_id     text        NOT NULL,
    principal_id  text        NOT NULL,
    -- The business id of the purchase request: unique per tenant, whatever key carried it.
    request_id    text        NOT NULL,
    amount_minor  bigint      NOT NULL,
    currency      char(3)     NOT NULL,
    item          text        NOT NULL,
    quantity      integer     NOT NULL,
    recipient     text        NOT NULL,
    status        text        NOT NULL DEFAULT 'created',
    created_at    timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT orders_pkey PRIMARY KEY (order_id),
    -- The second line of defence: a new key for a request that already has an order fails
    -- with 23505 on this constraint, and the whole claiming transaction rolls back.
    CONSTRAINT orders_tenant_request_key UNIQUE (tenant_id, request_id),
    CONSTRAINT orders_amount_positive CHECK (amount_minor > 0),
    CONSTRAINT orders_quantity_positive CHECK (quantity > 0),
    CONSTRAINT orders_currency_format CHECK (currency ~ '^[A-Z]{3}$'),
    CONSTRAINT orders_request_id_length CHECK (char_length(request_id) BETWEEN 1 AND 255),
    CONSTRAINT orders_item_length CHECK (char_length(item) BETWEEN 1 AND 255),
    CONSTRAINT orders_recipient_length CHECK (char_length(recipient) BETWEEN 1 AND 255)
);

-- Transactional outbox: the order and its "order.created" event commit together; a relay
-- publishes after commit with event_id as the receivers' deduplication key.
CREATE TABLE outbox_events (
    event_id      uuid        NOT NULL,
    tenant_id     text        NOT NULL,
    order_id      uuid        NOT NULL,
    event_type    text        NOT NULL,
    payload       jsonb       NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz NULL,

    CONSTRAINT outbox_events_pkey PRIMARY KEY (event_id),
    CONSTRAINT outbox_events_one_per_type UNIQUE (tenant_id, order_id, event_type),
    CONSTRAINT outbox_events_order_fkey FOREIGN KEY (order_id) REFERENCES orders (order_id)
);

-- What a relay polls: unpublished events, oldest first. Stays as small as the backlog.
CREATE INDEX outbox_events_unpublished_idx
    ON outbox_events (created_at)
    WHERE published_at IS NULL;

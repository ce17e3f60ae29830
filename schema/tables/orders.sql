-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.orders (
    order_id uuid NOT NULL,
    tenant_id text NOT NULL,
    principal_id text NOT NULL,
    request_id text NOT NULL,
    amount_minor bigint NOT NULL,
    currency character(3) NOT NULL,
    item text NOT NULL,
    quantity integer NOT NULL,
    recipient text NOT NULL,
    status text NOT NULL DEFAULT 'created'::text,
    created_at timestamp with time zone NOT NULL DEFAULT now()
);

ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_amount_positive CHECK ((amount_minor > 0));
ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_currency_format CHECK ((currency ~ '^[A-Z]{3}$'::text));
ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_item_length CHECK (((char_length(item) >= 1) AND (char_length(item) <= 255)));
ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_pkey PRIMARY KEY (order_id);
ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_quantity_positive CHECK ((quantity > 0));
ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_recipient_length CHECK (((char_length(recipient) >= 1) AND (char_length(recipient) <= 255)));
ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_request_id_length CHECK (((char_length(request_id) >= 1) AND (char_length(request_id) <= 255)));
ALTER TABLE tombstoned.orders ADD CONSTRAINT orders_tenant_request_key UNIQUE (tenant_id, request_id);

-- ACL: default (the owner only)

-- The business table of the "create payment" examples: the service's own, in its own database
-- (next to tombstoned's schema), owned by the service role. Not part of tombstoned.
--
-- request_id is the business id of the payment request, unique per tenant: the second line of
-- defence behind the idempotency key (a client that lost its key and sends the same request
-- with a new one gets SQLSTATE 23505 on payments_request_id_key, never a second payment).
CREATE TABLE payments (
    payment_id   uuid        NOT NULL DEFAULT gen_random_uuid(),
    tenant_id    text        NOT NULL,
    principal_id text        NOT NULL,
    request_id   text        NOT NULL,
    amount_minor bigint      NOT NULL,
    currency     text        NOT NULL,
    payee        text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT payments_pkey PRIMARY KEY (payment_id),
    CONSTRAINT payments_request_id_key UNIQUE (tenant_id, request_id),
    CONSTRAINT payments_amount_positive CHECK (amount_minor > 0)
);

-- The representation of a payment, built in one place: the 201's body (stored by complete()
-- and replayed byte for byte) and the answer to a request whose request_id already has a
-- payment are the same jsonb, so they are the same text.
CREATE FUNCTION payment_body(p payments) RETURNS jsonb
    LANGUAGE sql
    STABLE
AS $$
    SELECT jsonb_build_object(
        'payment_id', p.payment_id,
        'request_id', p.request_id,
        'amount_minor', p.amount_minor,
        'currency', p.currency,
        'payee', p.payee,
        'status', 'created',
        -- Spelled out in UTC: a timestamptz's own JSON form follows the session's TimeZone.
        'created_at', to_char(p.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$$;

-- tombstoned schema, version 2: what the outbox relay needs (src/outbox/, README "Outbox
-- delivery").
--
-- Additive only, and cheap on a populated V1 database: every new column is nullable or has a
-- constant (or stable, `now()`) default, so PostgreSQL records the default in the catalogue
-- instead of rewriting the table; the checks and the new unique index read the table once. The
-- claim statement is unchanged: it names none of the new columns.
--
-- The event's lifecycle, in the columns below:
--   pending       published_at IS NULL AND dead_lettered_at IS NULL; due once next_attempt_at has
--                 passed and no relay holds a live lease (locked_until in the future);
--   in flight     a relay picked it: locked_by / locked_until set, attempts counted, in a short
--                 transaction that commits BEFORE the HTTP call;
--   delivered     published_at set (the receiver answered 2xx);
--   dead letter   dead_lettered_at set (410 Gone at once, or a permanent 4xx after
--                 outbox.max_attempts); `tombstoned outbox requeue` makes it pending again.

ALTER TABLE outbox_events
    -- The event's place among its order's events, from 1. A receiver refuses a sequence lower
    -- than one it has applied; the relay sends an event only after every lower one of its order
    -- is delivered. The claim inserts the first event of an order, `order.created`, and relies
    -- on the default. V1's outbox_events_one_per_type stays: an order has each event type at
    -- most once, and the sequence orders those events.
    ADD COLUMN sequence          integer     NOT NULL DEFAULT 1,
    -- Delivery attempts started (counted when the event is leased).
    ADD COLUMN attempts          integer     NOT NULL DEFAULT 0,
    -- Not to be sent before this instant (retry backoff). Events that exist when this migration
    -- runs are due at once.
    ADD COLUMN next_attempt_at   timestamptz NOT NULL DEFAULT now(),
    -- The lease: which relay instance holds the event and until when. Set together, cleared
    -- together; an expired lease (a relay that crashed mid-delivery) makes the event pickable
    -- again, which is why delivery is at least once.
    ADD COLUMN locked_until      timestamptz NULL,
    ADD COLUMN locked_by         text        NULL,
    -- The last attempt: when it ended, the HTTP status (NULL: no answer — timeout, connection
    -- error) and a one-line reason, for operators (`tombstoned outbox list`).
    ADD COLUMN last_attempt_at   timestamptz NULL,
    ADD COLUMN last_status       smallint    NULL,
    ADD COLUMN last_error        text        NULL,
    -- Set when the relay gave up on the event (see above); never deleted by retention.
    ADD COLUMN dead_lettered_at  timestamptz NULL,

    ADD CONSTRAINT outbox_events_sequence_positive CHECK (sequence >= 1),
    ADD CONSTRAINT outbox_events_attempts_nonnegative CHECK (attempts >= 0),
    ADD CONSTRAINT outbox_events_lease_whole
        CHECK ((locked_until IS NULL) = (locked_by IS NULL)),
    ADD CONSTRAINT outbox_events_delivered_or_dead
        CHECK (published_at IS NULL OR dead_lettered_at IS NULL),
    ADD CONSTRAINT outbox_events_last_status_range
        CHECK (last_status IS NULL OR last_status BETWEEN 100 AND 599),
    -- One event per place in an order's sequence; also the index of the relay's "every earlier
    -- event of this order delivered" check.
    ADD CONSTRAINT outbox_events_order_sequence_key UNIQUE (order_id, sequence);

-- The retention phase's index (retention.outbox_keep_delivered): delivered events by delivery
-- time, so a retention batch costs in proportion to the events it deletes. The relay's own
-- queries use outbox_events_unpublished_idx (V1), which holds pending events and dead letters.
CREATE INDEX outbox_events_delivered_idx
    ON outbox_events (published_at)
    WHERE published_at IS NOT NULL;

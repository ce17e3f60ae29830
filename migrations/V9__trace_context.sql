-- tombstoned schema, version 9: the trace context of an outbox event (issue 40; README "Traces").
--
-- * `outbox_events.traceparent`: the W3C `traceparent` of the span the event was enqueued in, or
--   NULL (no trace, or an event enqueued before this migration). The relay's delivery span is
--   linked to it and continues its trace; the webhook then carries the delivery span's
--   `traceparent`. An event without one is delivered exactly as before. Never in the signed body.
-- * Its default is the transaction-local setting `tombstoned.traceparent`, when that holds a
--   traceparent (anything else, or nothing, is NULL: never an error). So a service sets it in its
--   transaction before `enqueue_event` (`SET LOCAL tombstoned.traceparent = '00-<trace>-<span>-01'`
--   or `set_config('tombstoned.traceparent', $1, true)`), and the daemon's endpoint sets it beside
--   its lock timeout while a recorded trace is current: no function's signature, body or result
--   changes (`api_version()` stays 1, the endpoint's statements and functions are V7's), and a
--   daemon of the previous release keeps working against this schema while the new ones roll out.
--
-- Locks. As V8: the ADD COLUMN's ACCESS EXCLUSIVE lock on outbox_events is taken first, alone,
-- with a short lock_timeout, and retried, so a claim, an enqueue or a relay statement waits at
-- most that long. The column is added without a default (no row is rewritten or touched: the
-- events already there have none), then the default is set for the rows inserted from now on.

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

DO $$
DECLARE
    caller_lock_timeout constant text := current_setting('lock_timeout');
    started constant timestamptz := clock_timestamp();
BEGIN
    PERFORM set_config('lock_timeout', '100ms', true);
    LOOP
        BEGIN
            LOCK TABLE outbox_events IN ACCESS EXCLUSIVE MODE;
            EXIT;
        EXCEPTION WHEN lock_not_available THEN
            -- Let the statements queued behind this attempt through, then try again.
            IF clock_timestamp() > started + interval '10 minutes' THEN
                RAISE EXCEPTION 'outbox_events stayed locked by other transactions for 10 minutes'
                    USING ERRCODE = '55P03',
                          HINT = 'A long transaction holds the outbox table: end it and run tombstoned migrate again.';
            END IF;
            PERFORM pg_sleep(0.1);
        END;
    END LOOP;
    PERFORM set_config('lock_timeout', caller_lock_timeout, true);
END
$$;

ALTER TABLE outbox_events ADD COLUMN traceparent text NULL;
-- Version, trace id, span id, flags: lowercase hex; version ff and all-zero ids are invalid.
ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_traceparent_format
    CHECK (traceparent ~ '^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$');
ALTER TABLE outbox_events ALTER COLUMN traceparent SET DEFAULT
    CASE WHEN current_setting('tombstoned.traceparent', true)
              ~ '^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}$'
         THEN current_setting('tombstoned.traceparent', true) END;

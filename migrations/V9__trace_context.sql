-- tombstoned schema, version 9: the trace context of an outbox event (issue 40; README "Traces").
--
-- * `outbox_events.traceparent`: the W3C `traceparent` of the span the event was enqueued in, or
--   NULL (no trace, or an event enqueued before this migration). The relay's delivery span is
--   linked to it and continues its trace; the webhook then carries the delivery span's
--   `traceparent`. An event without one is delivered exactly as before. Never in the signed body.
-- * `enqueue_event` takes it from the transaction-local setting `tombstoned.traceparent` the
--   caller may set first (`SET LOCAL tombstoned.traceparent = '00-<trace>-<span>-<flags>'`, or
--   `set_config('tombstoned.traceparent', $1, true)`): no function's signature or result changes,
--   so `api_version()` stays 1. The official clients set it from the caller's active
--   OpenTelemetry span. A value that is not a traceparent is ignored (NULL), never an error.
-- * The endpoint's event insert stores the request's trace context from a new parameter of its
--   statement (src/claim/sql.rs, CLAIM_AND_CREATE's $17); its function for transaction poolers,
--   `endpoint_claim_order` (INTERNAL, V6), is replaced by one with that parameter before its last
--   (the lock timeout moves to $18). The roles that could execute the old one can execute the new
--   one (copied below); SECURITY INVOKER as V8 made it.
--
-- Locks. As V8: the ADD COLUMN's ACCESS EXCLUSIVE lock on outbox_events is taken first, alone,
-- with a short lock_timeout, and retried, so a claim, an enqueue or a relay statement waits at
-- most that long; the new column has no default and no table rewrite. The functions are replaced
-- in the same transaction, so no claim ever sees the column without the functions or the reverse.

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- ------------------------------------------------------------------------------------------
-- The column, first: the one lock on a table claims use (see V8 for the loop).
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
ALTER TABLE outbox_events ADD CONSTRAINT outbox_events_traceparent_format
    CHECK (traceparent IS NULL
           OR traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');

-- ------------------------------------------------------------------------------------------
-- enqueue_event (V8), storing the caller's trace context.
CREATE OR REPLACE FUNCTION enqueue_event(
    tenant_id text, aggregate_id text, event_type text, payload jsonb)
    RETURNS uuid
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    next_sequence integer;
    new_id uuid := gen_random_uuid();
    -- The caller's trace context (`SET LOCAL tombstoned.traceparent = '00-...'`), kept only
    -- when it is a W3C traceparent: a wrong or missing one never fails the caller's transaction,
    -- its event is then delivered without a context, as before V9.
    trace_context text := current_setting('tombstoned.traceparent', true);
BEGIN
    IF enqueue_event.tenant_id IS NULL OR enqueue_event.tenant_id = '' THEN
        RAISE EXCEPTION 'invalid argument tenant_id: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF enqueue_event.aggregate_id IS NULL
          OR char_length(enqueue_event.aggregate_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument aggregate_id: must be 1 to 255 characters'
            USING ERRCODE = '22023';
    ELSIF enqueue_event.event_type IS NULL
          OR char_length(enqueue_event.event_type) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument event_type: must be 1 to 255 characters'
            USING ERRCODE = '22023';
    ELSIF enqueue_event.payload IS NULL THEN
        RAISE EXCEPTION 'invalid argument payload: must not be NULL'
            USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT FROM operation_grants AS g
                    WHERE pg_has_role(session_user, g.grantee, 'MEMBER'))
       AND NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.rolname = session_user AND r.rolsuper)
    THEN
        RAISE EXCEPTION 'role "%" holds no operation: enqueue_event() is for a role granted one', session_user
            USING ERRCODE = '42501',
                  HINT = 'An operation is granted to the role by `tombstoned operations grant OPERATION ROLE`.';
    END IF;
    IF trace_context IS NOT NULL
       AND (trace_context !~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
            OR trace_context ~ '^ff-'
            OR substr(trace_context, 4, 32) = repeat('0', 32)
            OR substr(trace_context, 37, 16) = repeat('0', 16)) THEN
        trace_context := NULL;
    END IF;
    INSERT INTO outbox_aggregates AS a (tenant_id, aggregate_id, last_sequence)
    VALUES (enqueue_event.tenant_id, enqueue_event.aggregate_id, 1)
    ON CONFLICT (tenant_id, aggregate_id)
        DO UPDATE SET last_sequence = a.last_sequence + 1
    RETURNING a.last_sequence INTO next_sequence;
    INSERT INTO outbox_events
        (event_id, tenant_id, order_id, aggregate_id, event_type, payload, sequence, sender,
         traceparent)
    VALUES (new_id, enqueue_event.tenant_id, NULL, enqueue_event.aggregate_id,
            enqueue_event.event_type, enqueue_event.payload, next_sequence, session_user,
            trace_context);
    RETURN new_id;
END
$$;

-- ------------------------------------------------------------------------------------------
-- The endpoint's claim function with the trace context (its body CLAIM_AND_CREATE as it now is:
-- tests/it/schema_contract.rs compares them). $1-$16 as V7's, $17 the request's traceparent (or
-- NULL), $18 lock_timeout (a setting value, '2000ms').
CREATE TEMPORARY TABLE endpoint_claim_order_grantees ON COMMIT DROP AS
SELECT a.grantee::regrole AS grantee
  FROM pg_proc AS p
 CROSS JOIN LATERAL aclexplode(p.proacl) AS a
 WHERE p.oid = 'endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text,
                                     text, text, integer, text, bigint, uuid, jsonb, text)'::regprocedure
   AND a.privilege_type = 'EXECUTE'
   AND a.grantee <> p.proowner
   AND a.grantee <> 0;

DROP FUNCTION endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text, text,
                                   text, integer, text, bigint, uuid, jsonb, text);

CREATE FUNCTION endpoint_claim_order(
    text, text, text, text, bytea, uuid, text, bigint, text, text, text, integer, text, bigint,
    uuid, jsonb, text, text)
    RETURNS TABLE (created boolean, body text, order_id uuid, fingerprint bytea,
                   expired boolean, past_deadline boolean, status_code smallint)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY INVOKER
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the endpoint''s claim runs under READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'TS005';
    END IF;
    PERFORM set_config('lock_timeout', $18, true);
    RETURN QUERY
WITH scope AS (
    SELECT scope_id FROM idempotency_scopes
    WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3
), existing AS (
    SELECT fingerprint, status_code, order_id, expired,
           NOT replay_window_open(replay_deadline, now()) AS past_deadline
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
), replay AS (
    SELECT status_code AS replay_status, response_body::text AS replay_body
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
      AND fingerprint = $5::bytea
      AND NOT expired AND replay_window_open(replay_deadline, now())
    FOR SHARE
), claim AS (
    INSERT INTO idempotency_records
        (scope_id, idempotency_key, fingerprint,
         status_code, response_body, order_id, replay_deadline)
    SELECT scope.scope_id, $4, $5::bytea, 201,
        jsonb_build_object('order_id', $6::uuid, 'request_id', $7::text, 'amount_minor', $8::bigint, 'amount', $9::text, 'currency', $10::text, 'item', $11::text, 'quantity', $12::integer, 'recipient', $13::text, 'status', 'created', 'created_at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24":"MI":"SS.US"Z"')),
        $6::uuid, now() + $14::bigint * interval '1 microsecond'
    FROM scope
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (scope_id, idempotency_key) DO NOTHING
    RETURNING order_id, response_body
), new_order AS (
    INSERT INTO orders (order_id, tenant_id, principal_id, request_id, amount_minor,
                        currency, item, quantity, recipient, status, created_at)
    SELECT claim.order_id, $1, $2, $7, $8, $10, $11, $12, $13, 'created', now()
    FROM claim
    RETURNING order_id
), event AS (
    INSERT INTO outbox_events
        (event_id, tenant_id, order_id, event_type, payload, traceparent)
    SELECT $15, $1, new_order.order_id, 'order.created',
           jsonb_build_object('order', claim.response_body,
                              'metadata', coalesce($16::jsonb, '{}'::jsonb)),
           $17::text
    FROM new_order CROSS JOIN claim
)
SELECT true AS created, response_body::text AS body, order_id, NULL::bytea AS fingerprint,
       NULL::boolean AS expired, NULL::boolean AS past_deadline, NULL::smallint AS status_code
FROM claim
UNION ALL
SELECT false, replay.replay_body, existing.order_id, existing.fingerprint, existing.expired,
       existing.past_deadline, replay.replay_status
FROM existing LEFT JOIN replay ON true
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT FROM scope);
END
$$;

REVOKE ALL ON FUNCTION
    endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text, text, text,
                         integer, text, bigint, uuid, jsonb, text, text)
FROM PUBLIC;

DO $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT DISTINCT grantee FROM endpoint_claim_order_grantees LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text, text,
                                 text, integer, text, bigint, uuid, jsonb, text, text)
            TO %s', r.grantee);
    END LOOP;
END
$$;

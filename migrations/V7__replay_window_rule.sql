-- tombstoned schema, version 7: the replay window's rule, written once (issue 37).
--
-- A record's stored answer is replayable while its window is open: from the claim until its
-- `replay_deadline`, which the window ends at exactly, whether or not the cleaner has tombstoned
-- it yet. Until now that comparison was written out in every statement that judges it (the
-- functions' `record_outcome` twice, each endpoint claim function twice, the daemon's own
-- statements); it is now one function, `replay_window_open(replay_deadline, instant)`, and each
-- of them calls it with its own clock, visibly:
--
--   * the SQL API's functions (record_outcome, so claim and lookup) pass `clock_timestamp()`,
--     the time of the call: a caller's transaction may have started long before (docs/api.md);
--   * the endpoint's statements (src/claim/sql.rs, src/lookup.rs, and their copies below, the
--     endpoint's claim functions) pass `now()`, their transaction's start, which is also the
--     created order's time (docs/protocol.md).
--
-- The cleaner's "due" (`replay_deadline <= cutoff`) is the same rule's other side, kept as a
-- range over its index (src/cleanup/sql.rs).
--
-- Nothing a caller sees changes: no function's name, arguments, result columns or SQLSTATEs;
-- api_version() stays 1. The three functions below are recreated with bodies identical to the
-- ones they replace (V5's record_outcome, V6's endpoint functions) but for the calls of the rule.
-- CREATE OR REPLACE keeps their owners and privileges (V6's grants of the endpoint functions).
--
-- Catalogue only: no table is touched.

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- The rule: the window is open at `instant` while `instant` is before `replay_deadline`.
--
-- An SQL function the planner inlines — the statements that call it are planned and run exactly
-- as if the comparison were written in them (the endpoint's fused claim statement is the hot
-- path) — and inlining rules out what every other function of the schema has: it is not
-- SECURITY DEFINER and has no SET clause, and it stays executable by PUBLIC, since every role
-- that runs the endpoint's statements (a daemon role granted the tables only, README
-- "Installing without the package") must be able to execute it. Nothing to guard: it reads
-- nothing but its two arguments (IMMUTABLE), and its body is parsed once, here (a SQL-standard
-- body), so no caller's search_path can change what `<` means in it.
CREATE FUNCTION replay_window_open(replay_deadline timestamptz, instant timestamptz)
    RETURNS boolean
    LANGUAGE sql
    IMMUTABLE
    PARALLEL SAFE
RETURN instant < replay_deadline;

-- ------------------------------------------------------------------------------------------
-- record_outcome (V5), judging the window at the time of the call.
CREATE OR REPLACE FUNCTION record_outcome(
    tenant_id text, principal_id text, operation text, idempotency_key text,
    fingerprint bytea, share_lock boolean)
    RETURNS TABLE (outcome text, status_code integer, response_body text, resource_id text,
                   replay_deadline timestamptz, expired_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    found_row record;
    sid integer;
BEGIN
    sid := find_scope(record_outcome.tenant_id, record_outcome.principal_id,
                      record_outcome.operation);
    IF sid IS NULL THEN
        RETURN;
    END IF;
    IF record_outcome.share_lock THEN
        SELECT r.status_code, r.response_body::text AS body,
               coalesce(r.resource_id, r.order_id::text) AS resource, r.replay_deadline
          INTO found_row
          FROM idempotency_records AS r
         WHERE r.scope_id = sid
           AND r.idempotency_key = record_outcome.idempotency_key
           AND r.fingerprint = record_outcome.fingerprint
           AND NOT r.expired
           AND replay_window_open(r.replay_deadline, clock_timestamp())
           FOR SHARE;
        IF FOUND THEN
            IF found_row.status_code IS NULL THEN
                RETURN QUERY SELECT 'unfinished'::text, NULL::integer, NULL::text, NULL::text,
                                    found_row.replay_deadline, NULL::timestamptz;
            ELSE
                RETURN QUERY SELECT 'replay'::text, found_row.status_code::integer,
                                    found_row.body, found_row.resource,
                                    found_row.replay_deadline, NULL::timestamptz;
            END IF;
            RETURN;
        END IF;
    END IF;

    SELECT r.fingerprint = record_outcome.fingerprint AS same_intent, r.status_code,
           r.response_body::text AS body, coalesce(r.resource_id, r.order_id::text) AS resource,
           r.expired, r.expired_at, r.replay_deadline,
           NOT replay_window_open(r.replay_deadline, clock_timestamp()) AS past_deadline
      INTO found_row
      FROM idempotency_records AS r
     WHERE r.scope_id = sid
       AND r.idempotency_key = record_outcome.idempotency_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF found_row.status_code IS NULL THEN
        RETURN QUERY SELECT 'unfinished'::text, NULL::integer, NULL::text, NULL::text,
                            found_row.replay_deadline, NULL::timestamptz;
    ELSIF NOT found_row.same_intent THEN
        RETURN QUERY SELECT 'key_reused'::text, NULL::integer, NULL::text, NULL::text,
                            NULL::timestamptz, NULL::timestamptz;
    ELSIF found_row.expired OR found_row.past_deadline THEN
        RETURN QUERY SELECT 'expired'::text, NULL::integer, NULL::text, found_row.resource,
                            found_row.replay_deadline, found_row.expired_at;
    ELSIF NOT record_outcome.share_lock THEN
        RETURN QUERY SELECT 'replay'::text, found_row.status_code::integer, found_row.body,
                            found_row.resource, found_row.replay_deadline, NULL::timestamptz;
    ELSE
        RETURN QUERY SELECT 'changed'::text, NULL::integer, NULL::text, NULL::text,
                            NULL::timestamptz, NULL::timestamptz;
    END IF;
END
$$;

-- ------------------------------------------------------------------------------------------
-- The endpoint's claim functions (V6), their bodies the endpoint's statements as they now are
-- (tests/it/schema_contract.rs compares them with src/claim/sql.rs). See V6 for what they are.

-- CLAIM_AND_CREATE: $1 tenant, $2 principal, $3 operation, $4 idempotency key, $5 fingerprint,
-- $6 new order id, $7 request_id, $8 amount_minor, $9 amount (decimal text), $10 currency,
-- $11 item, $12 quantity, $13 recipient, $14 replay window in microseconds, $15 new event id,
-- $16 metadata (or NULL), $17 lock_timeout (a setting value, '2000ms').
CREATE OR REPLACE FUNCTION endpoint_claim_order(
    text, text, text, text, bytea, uuid, text, bigint, text, text, text, integer, text, bigint,
    uuid, jsonb, text)
    RETURNS TABLE (created boolean, body text, order_id uuid, fingerprint bytea,
                   expired boolean, past_deadline boolean, status_code smallint)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the endpoint''s claim runs under READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'TS005';
    END IF;
    PERFORM set_config('lock_timeout', $17, true);
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
    INSERT INTO outbox_events (event_id, tenant_id, order_id, event_type, payload)
    SELECT $15, $1, new_order.order_id, 'order.created',
           jsonb_build_object('order', claim.response_body,
                              'metadata', coalesce($16::jsonb, '{}'::jsonb))
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

-- CLAIM_REJECTED: $1 tenant, $2 principal, $3 operation, $4 key, $5 fingerprint, $6 status code,
-- $7 problem body, $8 replay window in microseconds, $9 lock_timeout.
CREATE OR REPLACE FUNCTION endpoint_claim_rejected(
    text, text, text, text, bytea, smallint, jsonb, bigint, text)
    RETURNS TABLE (created boolean, body text, order_id uuid, fingerprint bytea,
                   expired boolean, past_deadline boolean, status_code smallint)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the endpoint''s claim runs under READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'TS005';
    END IF;
    PERFORM set_config('lock_timeout', $9, true);
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
    SELECT scope.scope_id, $4, $5::bytea, $6::smallint, $7::jsonb, NULL,
           now() + $8::bigint * interval '1 microsecond'
    FROM scope
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (scope_id, idempotency_key) DO NOTHING
    RETURNING order_id, response_body
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

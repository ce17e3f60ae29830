-- tombstoned schema, version 6: the endpoint's two claim statements as functions, for
-- `database.pooler = "transaction"` only (issue 28). INTERNAL: not part of the SQL API
-- (docs/api.md); api_version() does not change, and nothing but the daemon should call them.
--
-- Why. The endpoint's owner attempt is ONE statement (src/claim/sql.rs: CLAIM_AND_CREATE,
-- CLAIM_REJECTED, six CTEs). On a direct connection (or through a session pooler) the daemon
-- prepares it once per connection and keeps it, so it is parsed and planned once. Through a
-- transaction pooler no named prepared statement may outlive its transaction, so the daemon
-- sends it unnamed and the server parses and plans it at every request: round 2 measured a claim
-- 1.7-2.6 x dearer there. A PL/pgSQL function keeps the plan of each of its statements for the
-- server connection (the plan cache of prepared statements, the same generic-plan choice), and
-- a server connection outlives the transactions a pooler multiplexes on it. So in transaction
-- mode the daemon's owner attempt is `SELECT * FROM endpoint_claim_order($1, ..., $17)` (a call,
-- cheap to plan) and nothing else: one statement, its own implicit transaction, one round trip
-- and one server-connection assignment in the pooler, where a direct connection sends BEGIN, the
-- lock timeout, the statement and COMMIT. The function does what those added:
--
-- * it refuses to run unless the transaction is READ COMMITTED (SQLSTATE TS005; the protocol's
--   re-checks after a lock wait rely on it, docs/protocol.md): an implicit transaction takes the
--   server's default_transaction_isolation, which a role or database may set otherwise. The
--   daemon then runs the same call inside `BEGIN ISOLATION LEVEL READ COMMITTED ... COMMIT`;
-- * it sets `lock_timeout` (its last argument, e.g. '2000ms') transaction-locally, so the wait
--   for an in-flight owner of the key is bounded (55P03) and nothing is left on the server
--   connection when the transaction ends.
--
-- What. After those two steps, each body is `RETURN QUERY` of exactly the daemon's statement text, the schema prefix
-- left out (the search_path is pinned), `$1..$n` being the function's arguments with the types
-- the daemon sends the statement's parameters as; the result columns are the statement's
-- (created, body, order_id, fingerprint, expired, past_deadline, status_code). A test compares
-- each body with the Rust constant (tests/it/endpoint_functions.rs), so the two never drift:
-- a change to the statement is a new migration that replaces the function. `#variable_conflict
-- use_column`: the result columns are also PL/pgSQL variables; in the statement every such name
-- means the table's column, as it does outside the function. Row locks, lock waits (bounded by
-- the caller's transaction-local lock_timeout), SQLSTATEs and constraint names are the
-- statement's own: an error inside the function is the statement's error.
--
-- Privileges. Like every function of the schema: SECURITY DEFINER (it runs as the migrating
-- role, the tables' owner), search_path pinned to this schema with pg_temp last, EXECUTE revoked
-- from PUBLIC in this transaction. A daemon that runs as another role than `migrate`'s needs
-- EXECUTE on both when it goes through a transaction pooler; this migration grants it to every
-- role that already holds the table privileges the statements need (so may already write
-- exactly what they write: nobody gains a right). A role given those privileges later is
-- granted EXECUTE by hand (README, "Installing without the package"):
--
--     GRANT EXECUTE ON FUNCTION
--         <schema>.endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text,
--                                       text, text, integer, text, bigint, uuid, jsonb, text),
--         <schema>.endpoint_claim_rejected(text, text, text, text, bytea, smallint, jsonb, bigint,
--                                          text)
--     TO <role>;
--
-- Catalogue only: no table is touched.

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- CLAIM_AND_CREATE: claim the key and, only if this transaction now owns it, create the order
-- and its outbox event. $1 tenant, $2 principal, $3 operation, $4 idempotency key,
-- $5 fingerprint, $6 new order id, $7 request_id, $8 amount_minor, $9 amount (decimal text),
-- $10 currency, $11 item, $12 quantity, $13 recipient, $14 replay window in microseconds,
-- $15 new event id, $16 metadata (or NULL), $17 lock_timeout (a setting value, '2000ms').
CREATE FUNCTION endpoint_claim_order(
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
    SELECT fingerprint, status_code, order_id, expired, replay_deadline <= now() AS past_deadline
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
), replay AS (
    SELECT status_code AS replay_status, response_body::text AS replay_body
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
      AND fingerprint = $5::bytea AND NOT expired AND replay_deadline > now()
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

-- CLAIM_REJECTED: claim the key with a deterministic business rejection as its stored outcome;
-- no order, no event. $1 tenant, $2 principal, $3 operation, $4 key, $5 fingerprint,
-- $6 status code, $7 problem body, $8 replay window in microseconds, $9 lock_timeout.
CREATE FUNCTION endpoint_claim_rejected(
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
    SELECT fingerprint, status_code, order_id, expired, replay_deadline <= now() AS past_deadline
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
), replay AS (
    SELECT status_code AS replay_status, response_body::text AS replay_body
    FROM idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
      AND fingerprint = $5::bytea AND NOT expired AND replay_deadline > now()
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

REVOKE ALL ON FUNCTION
    endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text, text, text,
                         integer, text, bigint, uuid, jsonb, text),
    endpoint_claim_rejected(text, text, text, text, bytea, smallint, jsonb, bigint, text)
FROM PUBLIC;

-- EXECUTE for the roles that may already do what the statements do: use the schema, read the
-- scopes, read, insert and share-lock (UPDATE privilege) records, insert orders and outbox
-- events. The owner and superusers need no grant; PostgreSQL's predefined roles get none.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT quote_ident(rolname) AS role
          FROM pg_roles
         WHERE rolname !~ '^pg_'
           AND NOT rolsuper
           AND oid <> (SELECT relowner FROM pg_class WHERE oid = 'idempotency_records'::regclass)
           AND has_schema_privilege(oid, current_schema(), 'USAGE')
           AND has_table_privilege(oid, 'idempotency_scopes', 'SELECT')
           AND has_table_privilege(oid, 'idempotency_records', 'SELECT')
           AND has_table_privilege(oid, 'idempotency_records', 'INSERT')
           AND has_table_privilege(oid, 'idempotency_records', 'UPDATE')
           AND has_table_privilege(oid, 'orders', 'INSERT')
           AND has_table_privilege(oid, 'outbox_events', 'INSERT')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION
            endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text, text,
                                 text, integer, text, bigint, uuid, jsonb, text),
            endpoint_claim_rejected(text, text, text, text, bytea, smallint, jsonb, bigint, text)
            TO %s', r.role);
    END LOOP;
END
$$;

-- tombstoned schema, version 4: the protocol as SQL functions any service calls inside its own
-- transaction (docs/api.md, "The SQL API"; docs/protocol.md names them as its reference).
--
-- Additive, and cheap on a populated database: the new columns are nullable without a default
-- (catalogue only, no rewrite), the new checks are added NOT VALID where the table may be large
-- (every existing row satisfies them: the columns are new, or the rule held already) and the new
-- index covers only rows that do not exist yet. The endpoint's statements are unchanged; records
-- written by the functions and by `POST /v1/orders` live side by side in one table and are
-- tombstoned, purged, counted and metered alike.
--
-- Every function below is SECURITY DEFINER (it runs as the migrating role, which owns the
-- tables: `SELECT ... FOR SHARE` needs UPDATE privilege, and callers get no table privilege at
-- all), its search_path is pinned to this schema with pg_temp last (see the set_config below),
-- and EXECUTE is revoked from PUBLIC in this same transaction. A service role needs exactly:
--
--     GRANT USAGE ON SCHEMA <schema> TO <role>;
--     GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA <schema> TO <role>;
--
-- SQLSTATEs of the API (custom ones in tombstoned's class TS, which PostgreSQL does not use;
-- TS001 is the cleanup lease's, V3):
--   22023  an invalid argument (the message names it); nothing is written
--   55P03  claim: the key's owner is still in flight after lock_timeout: retry with the same key
--   TS002  complete: this transaction holds no unfinished claim of that key
--   TS003  COMMIT: a key claimed in this transaction was never completed; all of it rolls back
--   TS004  claim: this transaction already claimed the key and has not completed it
--   40001  claim: under REPEATABLE READ / SERIALIZABLE a concurrent owner committed: retry the
--          whole transaction (READ COMMITTED is the protocol's level)

-- Every function created here captures this search_path (SET search_path FROM CURRENT): the
-- migrate session's own path names the schema alone, which would leave pg_temp searched first.
-- Transaction-local: gone when this migration commits.
SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- The business object a function caller's key produced (`complete(..., resource_id)`), kept in
-- the tombstone like order_id. NULL for the endpoint's records, which keep order_id for its
-- existing readers; the functions answer coalesce(resource_id, order_id::text). A NULL column
-- costs a tombstone nothing: its null bit falls into the bitmap every tombstone already has
-- (response_body is NULL), which stays 2 bytes up to 16 columns.
ALTER TABLE idempotency_records
    ADD COLUMN resource_id text NULL,
    ADD CONSTRAINT idempotency_records_resource_id_length
        CHECK (resource_id IS NULL OR char_length(resource_id) BETWEEN 1 AND 255) NOT VALID;

-- Outbox events of any aggregate, not only orders: `enqueue_event(tenant, aggregate_id, ...)`.
-- An event names exactly one subject, an order (the endpoint's events, unchanged) or an
-- aggregate, and is sequenced within it.
ALTER TABLE outbox_events
    ALTER COLUMN order_id DROP NOT NULL,
    ADD COLUMN aggregate_id text NULL,
    ADD CONSTRAINT outbox_events_one_subject
        CHECK ((order_id IS NULL) <> (aggregate_id IS NULL)) NOT VALID,
    ADD CONSTRAINT outbox_events_aggregate_id_length
        CHECK (aggregate_id IS NULL OR char_length(aggregate_id) BETWEEN 1 AND 255);
-- Reads the table without blocking its writers (SHARE UPDATE EXCLUSIVE).
ALTER TABLE outbox_events VALIDATE CONSTRAINT outbox_events_one_subject;

-- One event per place in an aggregate's sequence; also the index of the relay's "every earlier
-- event of this aggregate delivered" check.
CREATE UNIQUE INDEX outbox_events_aggregate_sequence_key
    ON outbox_events (tenant_id, aggregate_id, sequence)
    WHERE aggregate_id IS NOT NULL;

-- The last sequence number given out per aggregate. A counter of its own, not max(sequence) of
-- the events: retention deletes delivered events, and a sequence that restarted after them
-- would be refused by every receiver that keeps the highest one it applied. Its row lock also
-- orders concurrent enqueuers of one aggregate: the second waits for the first transaction to
-- end, so sequence order is commit order and no number is skipped by a rollback.
CREATE TABLE outbox_aggregates (
    tenant_id      text    NOT NULL,
    aggregate_id   text    NOT NULL,
    last_sequence  integer NOT NULL,

    CONSTRAINT outbox_aggregates_pkey PRIMARY KEY (tenant_id, aggregate_id),
    CONSTRAINT outbox_aggregates_sequence_positive CHECK (last_sequence >= 1)
);

-- ------------------------------------------------------------------------------------------
-- Argument checks shared by the functions: SQLSTATE 22023 naming the argument.

CREATE FUNCTION require_scope(
    tenant_id text, principal_id text, operation text, idempotency_key text)
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF tenant_id IS NULL OR tenant_id = '' THEN
        RAISE EXCEPTION 'invalid argument tenant_id: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF principal_id IS NULL OR principal_id = '' THEN
        RAISE EXCEPTION 'invalid argument principal_id: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF operation IS NULL OR operation = '' THEN
        RAISE EXCEPTION 'invalid argument operation: must be a non-empty text'
            USING ERRCODE = '22023';
    ELSIF idempotency_key IS NULL OR char_length(idempotency_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument idempotency_key: must be 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
END
$$;

CREATE FUNCTION require_fingerprint(fingerprint bytea)
    RETURNS void
    LANGUAGE plpgsql
    IMMUTABLE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF fingerprint IS NULL OR octet_length(fingerprint) <> 32 THEN
        RAISE EXCEPTION 'invalid argument fingerprint: must be 32 bytes (a SHA-256)'
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- ------------------------------------------------------------------------------------------
-- The committed record of a key as this transaction may see it now, classified: one row
-- (outcome 'replay', 'key_reused', 'expired', or 'unfinished' for this transaction's own claim
-- that has no response yet), or none (nothing there). claim() and lookup() answer from it.
--
-- With share_lock: the record inside its window and of the same intent is read FOR SHARE — not FOR
-- KEY SHARE — so a cleanup batch (FOR NO KEY UPDATE) waits until the caller's transaction ends
-- and the body returned is the one the replay sends. Records past their window are read without
-- a lock: their answer needs no body, and a plain read never waits for the cleaner. The window
-- is judged at the time of the read (clock_timestamp()), not at the caller's transaction start.
-- Each SELECT is a statement of its own, so under READ COMMITTED it sees what committed before
-- it started (the protocol's "new statement after the wait").
CREATE FUNCTION record_outcome(
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
BEGIN
    IF record_outcome.share_lock THEN
        SELECT r.status_code, r.response_body::text AS body,
               coalesce(r.resource_id, r.order_id::text) AS resource, r.replay_deadline
          INTO found_row
          FROM idempotency_records AS r
         WHERE r.tenant_id = record_outcome.tenant_id
           AND r.principal_id = record_outcome.principal_id
           AND r.operation = record_outcome.operation
           AND r.idempotency_key = record_outcome.idempotency_key
           AND r.fingerprint = record_outcome.fingerprint
           AND NOT r.expired
           AND r.replay_deadline > clock_timestamp()
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
           r.replay_deadline <= clock_timestamp() AS past_deadline
      INTO found_row
      FROM idempotency_records AS r
     WHERE r.tenant_id = record_outcome.tenant_id
       AND r.principal_id = record_outcome.principal_id
       AND r.operation = record_outcome.operation
       AND r.idempotency_key = record_outcome.idempotency_key;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF found_row.status_code IS NULL THEN
        -- Uncommitted rows of other transactions are invisible, and no row commits without its
        -- response (TS003): a record without one is this transaction's own claim.
        RETURN QUERY SELECT 'unfinished'::text, NULL::integer, NULL::text, NULL::text,
                            found_row.replay_deadline, NULL::timestamptz;
    ELSIF NOT found_row.same_intent THEN
        -- Nothing of the stored answer leaks to another intent.
        RETURN QUERY SELECT 'key_reused'::text, NULL::integer, NULL::text, NULL::text,
                            NULL::timestamptz, NULL::timestamptz;
    ELSIF found_row.expired OR found_row.past_deadline THEN
        RETURN QUERY SELECT 'expired'::text, NULL::integer, NULL::text, found_row.resource,
                            found_row.replay_deadline, found_row.expired_at;
    ELSIF NOT record_outcome.share_lock THEN
        -- Read-only transaction (a standby): the body without a lock; no cleaner runs there.
        RETURN QUERY SELECT 'replay'::text, found_row.status_code::integer, found_row.body,
                            found_row.resource, found_row.replay_deadline, NULL::timestamptz;
    ELSE
        -- Inside its window yet not locked above: it changed between the two statements (a
        -- concurrent retention purge and a new claim). The caller reads again.
        RETURN QUERY SELECT 'changed'::text, NULL::integer, NULL::text, NULL::text,
                            NULL::timestamptz, NULL::timestamptz;
    END IF;
END
$$;

-- ------------------------------------------------------------------------------------------
-- claim: take the key for this transaction, or answer from the record that holds it.
--
-- 'owner'      this transaction holds the key: do the business write, call complete(), commit.
--              Nothing is visible to anyone until COMMIT; a ROLLBACK or any error releases it.
-- 'replay'     same intent, window open: the stored answer, share-locked until the caller's
--              transaction ends (commit right after reading: a cleanup batch waits for it).
-- 'key_reused' another intent, before or after expiry: nothing of the stored answer.
-- 'expired'    same intent, window over (tombstoned or not yet): the resource only; the
--              request is never executed again.
-- SQLSTATE 55P03 when the key's owner is still in flight after lock_timeout (outcome pending,
-- retry with the same key); TS004 when this transaction already claimed it; 22023 for an
-- invalid argument.
--
-- lock_timeout is set for the call only: the function's SET clause restores the caller's value
-- when it returns (a set_config inside such a function does not outlive it). The deadline and
-- the window test use the time of the call (clock_timestamp()), not the caller's transaction
-- start, which may be long before.
CREATE FUNCTION claim(
    tenant_id text, principal_id text, operation text, idempotency_key text,
    fingerprint bytea, replay_window interval, lock_timeout interval DEFAULT '2 seconds')
    RETURNS TABLE (outcome text, status_code integer, response_body text, resource_id text,
                   replay_deadline timestamptz, expired_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
    SET lock_timeout = '2s'
AS $$
#variable_conflict use_column
DECLARE
    called_at constant timestamptz := clock_timestamp();
    wait_ms numeric;
    claimed boolean;
    existing record;
BEGIN
    PERFORM require_scope(claim.tenant_id, claim.principal_id, claim.operation,
                          claim.idempotency_key);
    PERFORM require_fingerprint(claim.fingerprint);
    IF claim.replay_window IS NULL OR claim.replay_window <= interval '0' THEN
        RAISE EXCEPTION 'invalid argument replay_window: must be a positive interval'
            USING ERRCODE = '22023';
    END IF;
    -- Milliseconds, rounded up so a sub-millisecond bound does not become 0 (no bound at all).
    wait_ms := ceil(extract(epoch FROM claim.lock_timeout) * 1000);
    IF wait_ms IS NULL OR wait_ms < 0 OR wait_ms > 2147483647 THEN
        RAISE EXCEPTION 'invalid argument lock_timeout: must be between 0 and 24 days (0: no limit)'
            USING ERRCODE = '22023';
    END IF;
    PERFORM set_config('lock_timeout', wait_ms::bigint || 'ms', true);

    -- A purge (retention) between the INSERT's conflict and the read can remove the record; the
    -- loop then claims again. Twice is plenty; a third miss is reported as a retryable race.
    FOR attempt IN 1..3 LOOP
        -- Waits for an in-flight owner of the key (bounded by lock_timeout: 55P03). If it rolls
        -- back, this INSERT goes ahead and this transaction owns the key. The marker around it
        -- queues the TS003 check for this row alone (require_completed_claim, below; a trigger's
        -- WHEN is evaluated when the row is inserted). It is set at run time, transaction-local:
        -- a SET clause naming a custom parameter needs privileges the migrating role may lack.
        PERFORM set_config('tombstoned.claiming', 'on', true);
        INSERT INTO idempotency_records
            (tenant_id, principal_id, operation, idempotency_key, fingerprint,
             replay_deadline, created_at)
        VALUES (claim.tenant_id, claim.principal_id, claim.operation, claim.idempotency_key,
                claim.fingerprint, called_at + claim.replay_window, called_at)
        ON CONFLICT (tenant_id, principal_id, operation, idempotency_key) DO NOTHING;
        claimed := FOUND;
        PERFORM set_config('tombstoned.claiming', 'off', true);
        IF claimed THEN
            RETURN QUERY SELECT 'owner'::text, NULL::integer, NULL::text, NULL::text,
                                called_at + claim.replay_window, NULL::timestamptz;
            RETURN;
        END IF;
        -- The key exists (or its owner committed while we waited): read it in new statements.
        SELECT * INTO existing
          FROM record_outcome(claim.tenant_id, claim.principal_id, claim.operation,
                              claim.idempotency_key, claim.fingerprint, true);
        IF FOUND AND existing.outcome = 'unfinished' THEN
            RAISE EXCEPTION 'this transaction already claimed the idempotency key and has not completed it'
                USING ERRCODE = 'TS004',
                      HINT = 'Claim a key once per transaction; complete() stores its answer.';
        ELSIF FOUND AND existing.outcome <> 'changed' THEN
            RETURN QUERY SELECT existing.outcome, existing.status_code, existing.response_body,
                                existing.resource_id, existing.replay_deadline,
                                existing.expired_at;
            RETURN;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'the idempotency record changed while it was being read; retry the transaction'
        USING ERRCODE = '40001';
END
$$;

-- ------------------------------------------------------------------------------------------
-- complete: store the owner's answer on the record this transaction claimed. Returns the body
-- exactly as every replay will return it (jsonb's text form): the caller sends this text as its
-- first response, so the first answer and its replays are identical.
--
-- TS002 when this transaction holds no unfinished claim of the key (the outcome was ignored,
-- or complete() was called twice). 22023 for a status outside 200-499: a 5xx is a transient
-- failure to roll back, not an outcome to replay; a 1xx is not a final answer.
CREATE FUNCTION complete(
    tenant_id text, principal_id text, operation text, idempotency_key text,
    status_code integer, response_body jsonb, resource_id text DEFAULT NULL)
    RETURNS text
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    stored text;
BEGIN
    PERFORM require_scope(complete.tenant_id, complete.principal_id, complete.operation,
                          complete.idempotency_key);
    IF complete.status_code IS NULL OR complete.status_code NOT BETWEEN 200 AND 499 THEN
        RAISE EXCEPTION 'invalid argument status_code: must be 200 to 499 (roll back on a 5xx; it is not an outcome to replay)'
            USING ERRCODE = '22023';
    ELSIF complete.response_body IS NULL THEN
        RAISE EXCEPTION 'invalid argument response_body: must not be NULL'
            USING ERRCODE = '22023';
    ELSIF complete.resource_id IS NOT NULL
          AND char_length(complete.resource_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'invalid argument resource_id: must be NULL or 1 to 255 characters'
            USING ERRCODE = '22023';
    END IF;
    -- Only this transaction's own claim has no status: another session's uncommitted claim is
    -- invisible to this UPDATE, and every committed record has one. No lock wait is possible.
    UPDATE idempotency_records AS r
       SET status_code = complete.status_code,
           response_body = complete.response_body,
           resource_id = complete.resource_id
     WHERE r.tenant_id = complete.tenant_id
       AND r.principal_id = complete.principal_id
       AND r.operation = complete.operation
       AND r.idempotency_key = complete.idempotency_key
       AND r.status_code IS NULL
    RETURNING r.response_body::text INTO stored;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this transaction holds no unfinished claim of the idempotency key'
            USING ERRCODE = 'TS002',
                  HINT = 'Call complete() once, after claim() answered ''owner'', in the same transaction.';
    END IF;
    RETURN stored;
END
$$;

-- ------------------------------------------------------------------------------------------
-- lookup: what claim() would answer for a committed record, without claiming anything. Zero
-- rows when nothing is committed for the key (or only this transaction's unfinished claim).
-- In a read-only transaction (a standby) it reads without a lock.
CREATE FUNCTION lookup(
    tenant_id text, principal_id text, operation text, idempotency_key text, fingerprint bytea)
    RETURNS TABLE (outcome text, status_code integer, response_body text, resource_id text,
                   replay_deadline timestamptz, expired_at timestamptz)
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
BEGIN
    PERFORM require_scope(lookup.tenant_id, lookup.principal_id, lookup.operation,
                          lookup.idempotency_key);
    PERFORM require_fingerprint(lookup.fingerprint);
    RETURN QUERY
        SELECT o.outcome, o.status_code, o.response_body, o.resource_id, o.replay_deadline,
               o.expired_at
          FROM record_outcome(lookup.tenant_id, lookup.principal_id, lookup.operation,
                              lookup.idempotency_key, lookup.fingerprint,
                              current_setting('transaction_read_only') <> 'on') AS o
         WHERE o.outcome IN ('replay', 'key_reused', 'expired');
END
$$;

-- ------------------------------------------------------------------------------------------
-- The check behind TS003: at COMMIT, every key this transaction claimed has its response. A
-- deferred constraint trigger, queued only for the rows claim() inserts (without a status, while
-- it has tombstoned.claiming on); the endpoint inserts its row with the status in
-- the statement that creates the order, and costs nothing here, and so do rows an operator
-- writes by hand.
CREATE FUNCTION require_completed_claim()
    RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM FROM idempotency_records AS r
     WHERE r.tenant_id = NEW.tenant_id
       AND r.principal_id = NEW.principal_id
       AND r.operation = NEW.operation
       AND r.idempotency_key = NEW.idempotency_key
       AND r.status_code IS NULL;
    IF FOUND THEN
        RAISE EXCEPTION 'a key claimed in this transaction was never completed; the transaction is rolled back'
            USING ERRCODE = 'TS003',
                  HINT = 'Call complete() after the business write, before COMMIT.';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER idempotency_records_claim_completed
    AFTER INSERT ON idempotency_records
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.status_code IS NULL
          AND current_setting('tombstoned.claiming', true) IS NOT DISTINCT FROM 'on')
    EXECUTE FUNCTION require_completed_claim();

-- ------------------------------------------------------------------------------------------
-- enqueue_event: an outbox event that commits with the caller's transaction or not at all,
-- numbered in sequence per (tenant, aggregate). The relay delivers it like the endpoint's order
-- events (signature, webhook-id = the returned id on every attempt, one at a time and in
-- sequence per aggregate, retries, dead letters, retention).
CREATE FUNCTION enqueue_event(
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
    INSERT INTO outbox_aggregates AS a (tenant_id, aggregate_id, last_sequence)
    VALUES (enqueue_event.tenant_id, enqueue_event.aggregate_id, 1)
    ON CONFLICT (tenant_id, aggregate_id)
        DO UPDATE SET last_sequence = a.last_sequence + 1
    RETURNING a.last_sequence INTO next_sequence;
    INSERT INTO outbox_events
        (event_id, tenant_id, order_id, aggregate_id, event_type, payload, sequence)
    VALUES (new_id, enqueue_event.tenant_id, NULL, enqueue_event.aggregate_id,
            enqueue_event.event_type, enqueue_event.payload, next_sequence);
    RETURN new_id;
END
$$;

-- ------------------------------------------------------------------------------------------
-- fingerprint: the 32-byte SHA-256 a caller passes to claim(), over jsonb's text form of the
-- intent. jsonb keeps one copy of each key, sorts keys and fixes the whitespace, so key order,
-- duplicate keys (the last wins) and spacing do not change it; numbers keep their written
-- precision (1.0 and 1 differ; 1e2 and 100 do not), so normalise an intent first: amounts in
-- minor units as integers, defaults applied, optional fields either always present or never.
CREATE FUNCTION fingerprint(intent jsonb)
    RETURNS bytea
    LANGUAGE plpgsql
    IMMUTABLE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF intent IS NULL THEN
        RAISE EXCEPTION 'invalid argument intent: must not be NULL'
            USING ERRCODE = '22023';
    END IF;
    RETURN sha256(convert_to(intent::text, 'UTF8'));
END
$$;

-- The version of this API: the functions' names, arguments, result columns and SQLSTATEs. A
-- change that breaks a caller is a new version; the daemon refuses a schema whose version it
-- does not know.
CREATE FUNCTION api_version()
    RETURNS integer
    LANGUAGE sql
    IMMUTABLE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$ SELECT 1 $$;

-- New functions are executable by PUBLIC: revoke that here, in the transaction that creates
-- them, so there is no moment at which anyone may call them.
REVOKE ALL ON FUNCTION
    require_scope(text, text, text, text),
    require_fingerprint(bytea),
    record_outcome(text, text, text, text, bytea, boolean),
    claim(text, text, text, text, bytea, interval, interval),
    complete(text, text, text, text, integer, jsonb, text),
    lookup(text, text, text, text, bytea),
    require_completed_claim(),
    enqueue_event(text, text, text, jsonb),
    fingerprint(jsonb),
    api_version()
FROM PUBLIC;

-- tombstoned schema, version 8: service boundaries in the SQL API (issue 36; docs/api.md,
-- "Service boundaries"; README "Upgrading").
--
-- * Operations belong to roles. `operation_grants` says which role may use which operation (the
--   third part of a scope); `claim`, `complete` and `lookup` refuse any other with SQLSTATE 42501
--   before they touch a record (the check is in `require_scope`, which all three call first, so
--   their bodies do not change). The role checked is `session_user`, the role the caller logged
--   in as, or any role it is a member of (`pg_has_role(session_user, grantee, 'MEMBER')`): SET
--   ROLE does not change it, nor does a SECURITY DEFINER function of the caller's own, and
--   through PgBouncer in transaction mode it is the pool's user, which is the client's unless a
--   `user=` is forced in [databases]. A superuser is refused nothing, as everywhere in
--   PostgreSQL. `enqueue_event` is allowed to a role that holds at least one operation.
-- * `create-order`, the operation of tombstoned's own endpoint, is granted here to the role
--   running this migration (the tables' owner, the daemon's role by default); `tombstoned
--   operations grant create-order` to another role needs --force.
-- * Every change of a grant is recorded (who: session_user, when, what) in
--   `operation_grant_changes`, by a trigger, whichever way the change was made.
-- * The documented grants give exactly the API. The internal helpers (`require_scope`,
--   `require_fingerprint`, `record_outcome`, `find_scope`, `ensure_scope`) and the endpoint's
--   own functions (`endpoint_claim_order`, `endpoint_claim_rejected`) become SECURITY INVOKER:
--   they run with their caller's privileges. Called by an API function (SECURITY DEFINER), the
--   caller is the tables' owner; called directly by a service role, they have none of the
--   tables' privileges and fail with 42501 before reading anything — whatever EXECUTE the role
--   was given (`GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA` included). The two that read no table
--   first refuse such a caller themselves. The endpoint's functions thus give no role a right it does not hold:
--   a daemon's role writes the tables anyway. The trigger functions cannot be called at all.
-- * `cleanup_lease_required` (V3) keeps the convention at last: SECURITY DEFINER, pinned
--   search_path, no EXECUTE for PUBLIC; EXECUTE for the roles that may renew the lease (UPDATE on
--   `cleanup_lease`, now or through `pg_write_all_data`), which it checks itself.
-- * Events say who sent them: `outbox_events.sender`, the role that inserted the event
--   (session_user): a service for `enqueue_event`'s events, the daemon's role for the endpoint's
--   order events (the column's default). The relay puts it into the signed webhook body.
-- * Upgrade without an outage: every role that could call `claim` before (a direct EXECUTE
--   grant, other than the owner's) gets a transitional grant: every operation but create-order
--   (the records do not say which role wrote which scope, so what each one used cannot be
--   known). `tombstoned status` and `check-config` list them until an operator narrows them.
--
-- Locks. Catalogue changes only, and one short lock: ADD COLUMN on outbox_events takes an ACCESS
-- EXCLUSIVE lock, which would queue every claim behind the longest transaction holding the table.
-- So that lock is taken last, alone, with a short lock_timeout, and retried (below): while it
-- waits, a claim, an enqueue or a relay statement waits at most that long. Nothing else here
-- locks a table a claim uses. `api_version()` stays 1: no function's signature or result
-- changes; a call outside the caller's operations is a new refusal (42501).

SELECT set_config('search_path', format('%I, pg_temp', current_schema()), true);

-- ------------------------------------------------------------------------------------------
-- Who may use which operation.
CREATE TABLE operation_grants (
    -- The operation (a scope's third part), or NULL: every operation but create-order, the
    -- transitional grant of a role that called the SQL API before this migration.
    operation   text        NULL,
    -- The role, and so every role that is a member of it. A regrole: it follows a rename, a dump
    -- spells it by name; a dropped role leaves its OID, which nobody is a member of.
    grantee     regrole     NOT NULL,
    granted_at  timestamptz NOT NULL DEFAULT now(),
    -- session_user of the change (the login, whatever SET ROLE said).
    granted_by  text        NOT NULL DEFAULT session_user,
    -- create-order granted to a role with --force.
    forced      boolean     NOT NULL DEFAULT false,
    -- Why, when the grant was not made by `tombstoned operations grant` (this migration's).
    note        text        NULL,

    CONSTRAINT operation_grants_operation_nonempty CHECK (operation <> ''),
    CONSTRAINT operation_grants_key UNIQUE (operation, grantee)
);

-- At most one transitional grant per role (a UNIQUE constraint treats NULLs as distinct).
CREATE UNIQUE INDEX operation_grants_transitional_key
    ON operation_grants (grantee)
    WHERE operation IS NULL;

-- Every grant and revoke, oldest first: `tombstoned operations list` shows it.
CREATE TABLE operation_grant_changes (
    change_id   bigint      GENERATED ALWAYS AS IDENTITY,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    -- session_user of the change.
    changed_by  text        NOT NULL DEFAULT session_user,
    action      text        NOT NULL,
    -- NULL: the transitional grant of every operation but create-order.
    operation   text        NULL,
    -- The role's name when it changed (history outlives renames and drops).
    grantee     text        NOT NULL,
    forced      boolean     NOT NULL DEFAULT false,
    note        text        NULL,

    CONSTRAINT operation_grant_changes_pkey PRIMARY KEY (change_id),
    CONSTRAINT operation_grant_changes_action_known CHECK (action IN ('grant', 'revoke'))
);

-- The audit: a row per grant (INSERT) and revoke (DELETE) of operation_grants; an UPDATE is a
-- revoke of the old row and a grant of the new one.
CREATE FUNCTION record_operation_grant_change()
    RETURNS trigger
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        INSERT INTO operation_grant_changes (action, operation, grantee, forced, note)
        VALUES ('revoke', OLD.operation,
                coalesce((SELECT r.rolname::text FROM pg_roles AS r WHERE r.oid = OLD.grantee),
                         OLD.grantee::oid::text),
                OLD.forced, OLD.note);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO operation_grant_changes (action, operation, grantee, forced, note)
        VALUES ('grant', NEW.operation,
                coalesce((SELECT r.rolname::text FROM pg_roles AS r WHERE r.oid = NEW.grantee),
                         NEW.grantee::oid::text),
                NEW.forced, NEW.note);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER operation_grants_audit
    AFTER INSERT OR UPDATE OR DELETE ON operation_grants
    FOR EACH ROW
    EXECUTE FUNCTION record_operation_grant_change();

-- ------------------------------------------------------------------------------------------
-- require_scope (V4): the arguments, then the caller's operation: whether the role that logged in
-- (session_user), or a role it is a member of, holds it — the transitional grant holds every one
-- but create-order; a superuser holds every one. STABLE: it reads the grants in its caller's
-- snapshot, so a revoke counts from the caller's next statement under READ COMMITTED, from its
-- next transaction otherwise; nothing is cached. Internal: it refuses a caller that may not read
-- the grants (every service role; called from an API function the caller is the owner) before
-- anything else. The checks are written inline, not as functions of their own, each of which
-- would add a call with its own pinned search_path to every call of the API
-- (bench/operation_check.sh measures what the check costs a claim against the schema before V8).
CREATE OR REPLACE FUNCTION require_scope(
    tenant_id text, principal_id text, operation text, idempotency_key text)
    RETURNS void
    LANGUAGE plpgsql
    STABLE
    SECURITY INVOKER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT has_table_privilege('operation_grants'::regclass, 'SELECT') THEN
        RAISE EXCEPTION 'require_scope() is internal to the SQL API: call claim(), complete() or lookup()'
            USING ERRCODE = '42501';
    END IF;
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
    -- Before any record is read: the refusal is the same whether the key exists or not.
    IF NOT EXISTS (
           SELECT FROM operation_grants AS g
            WHERE (g.operation = require_scope.operation
                   OR (g.operation IS NULL AND require_scope.operation <> 'create-order'))
              AND pg_has_role(session_user, g.grantee, 'MEMBER'))
       AND NOT EXISTS (SELECT FROM pg_roles AS r WHERE r.rolname = session_user AND r.rolsuper)
    THEN
        RAISE EXCEPTION 'role "%" may not use operation "%"', session_user, require_scope.operation
            USING ERRCODE = '42501',
                  HINT = 'The operation is granted to the role by `tombstoned operations grant OPERATION ROLE`.';
    END IF;
END
$$;

-- require_fingerprint (V4): unchanged but for the refusal of a direct call.
CREATE OR REPLACE FUNCTION require_fingerprint(fingerprint bytea)
    RETURNS void
    LANGUAGE plpgsql
    STABLE
    SECURITY INVOKER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT has_table_privilege('operation_grants'::regclass, 'SELECT') THEN
        RAISE EXCEPTION 'require_fingerprint() is internal to the SQL API: call claim() or lookup()'
            USING ERRCODE = '42501';
    END IF;
    IF fingerprint IS NULL OR octet_length(fingerprint) <> 32 THEN
        RAISE EXCEPTION 'invalid argument fingerprint: must be 32 bytes (a SHA-256)'
            USING ERRCODE = '22023';
    END IF;
END
$$;

-- The helpers that read the tables, and the endpoint's functions: their bodies stay as they
-- are; they run with their caller's privileges from now on.
ALTER FUNCTION record_outcome(text, text, text, text, bytea, boolean) SECURITY INVOKER;
ALTER FUNCTION find_scope(text, text, text) SECURITY INVOKER;
ALTER FUNCTION ensure_scope(text, text, text) SECURITY INVOKER;
ALTER FUNCTION endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, text,
                                    text, text, integer, text, bigint, uuid, jsonb, text)
    SECURITY INVOKER;
ALTER FUNCTION endpoint_claim_rejected(text, text, text, text, bytea, smallint, jsonb, bigint,
                                       text)
    SECURITY INVOKER;

-- ------------------------------------------------------------------------------------------
-- enqueue_event (V4), for a role that holds an operation, recording who sent the event.
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
    INSERT INTO outbox_aggregates AS a (tenant_id, aggregate_id, last_sequence)
    VALUES (enqueue_event.tenant_id, enqueue_event.aggregate_id, 1)
    ON CONFLICT (tenant_id, aggregate_id)
        DO UPDATE SET last_sequence = a.last_sequence + 1
    RETURNING a.last_sequence INTO next_sequence;
    INSERT INTO outbox_events
        (event_id, tenant_id, order_id, aggregate_id, event_type, payload, sequence, sender)
    VALUES (new_id, enqueue_event.tenant_id, NULL, enqueue_event.aggregate_id,
            enqueue_event.event_type, enqueue_event.payload, next_sequence, session_user);
    RETURN new_id;
END
$$;

-- ------------------------------------------------------------------------------------------
-- cleanup_lease_required (V3): the renewal's check, now like every function of the schema. It
-- refuses a role that may not renew the lease itself (SECURITY DEFINER: session_user is the
-- caller's login; the cleaner never changes role).
CREATE OR REPLACE FUNCTION cleanup_lease_required(renewed_until timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql
    VOLATILE
    SECURITY DEFINER
    SET search_path FROM CURRENT
AS $$
BEGIN
    IF NOT has_table_privilege(session_user, 'cleanup_lease', 'UPDATE') THEN
        RAISE EXCEPTION 'role "%" may not renew the cleanup lease (cleanup_lease_required() is the cleaner''s)', session_user
            USING ERRCODE = '42501';
    END IF;
    IF renewed_until IS NULL THEN
        RAISE EXCEPTION 'the cleanup lease is no longer held by this run'
            USING ERRCODE = 'TS001';
    END IF;
    RETURN renewed_until;
END
$$;

REVOKE ALL ON FUNCTION
    cleanup_lease_required(timestamptz),
    record_operation_grant_change()
FROM PUBLIC;

-- ------------------------------------------------------------------------------------------
-- Privileges for the roles that already had them, so nothing that worked stops working.
DO $$
DECLARE
    r record;
BEGIN
    -- The cleaner's function, for every role that may renew the lease: those that hold UPDATE
    -- on it now, and through pg_write_all_data (PostgreSQL 14 on) those given it later.
    FOR r IN
        SELECT quote_ident(rolname) AS role
          FROM pg_roles
         WHERE rolname !~ '^pg_'
           AND NOT rolsuper
           AND oid <> (SELECT relowner FROM pg_class WHERE oid = 'cleanup_lease'::regclass)
           AND has_table_privilege(oid, 'cleanup_lease', 'UPDATE')
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION cleanup_lease_required(timestamptz) TO %s',
                       r.role);
    END LOOP;
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'pg_write_all_data') THEN
        GRANT EXECUTE ON FUNCTION cleanup_lease_required(timestamptz) TO pg_write_all_data;
    END IF;
    -- The grants, for the roles that may read the records (a daemon's role: `status`, `operations
    -- list`).
    FOR r IN
        SELECT quote_ident(rolname) AS role
          FROM pg_roles
         WHERE rolname !~ '^pg_'
           AND NOT rolsuper
           AND oid <> (SELECT relowner FROM pg_class WHERE oid = 'idempotency_records'::regclass)
           AND has_table_privilege(oid, 'idempotency_records', 'SELECT')
    LOOP
        EXECUTE format('GRANT SELECT ON operation_grants, operation_grant_changes TO %s',
                       r.role);
    END LOOP;
END
$$;

-- ------------------------------------------------------------------------------------------
-- The first grants: the endpoint's operation to the role running this migration, and the
-- transitional grant to every role other than the owner that holds EXECUTE on claim() itself
-- (a role that holds it through another is covered by that one's grant; superusers need none).
INSERT INTO operation_grants (operation, grantee, note)
VALUES ('create-order', (SELECT oid FROM pg_roles WHERE rolname = current_user)::regrole,
        'the endpoint''s operation (POST /v1/orders), given to the role that ran migration V8');

INSERT INTO operation_grants (operation, grantee, note)
SELECT DISTINCT NULL::text, a.grantee::regrole,
       'transitional (migration V8): every operation but create-order, for a role that could call claim() before operations were granted'
  FROM pg_proc AS p
 CROSS JOIN LATERAL aclexplode(p.proacl) AS a
  JOIN pg_roles AS r ON r.oid = a.grantee
 WHERE p.oid = 'claim(text, text, text, text, bytea, interval, interval)'::regprocedure
   AND a.privilege_type = 'EXECUTE'
   AND a.grantee <> p.proowner
   AND r.rolname !~ '^pg_'
   AND NOT r.rolsuper;

-- ------------------------------------------------------------------------------------------
-- Who sent an event, last: the one lock on a table claims use (see the head of this file). NULL
-- for the events enqueued before this migration; the default names the inserting role, so the
-- endpoint's statement (which names no such column) records the daemon's.
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

ALTER TABLE outbox_events ADD COLUMN sender text NULL;
ALTER TABLE outbox_events ALTER COLUMN sender SET DEFAULT session_user;

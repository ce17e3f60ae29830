-- tombstoned schema, version 3: the cleanup lease as a row, and the run history
-- (src/cleanup/lease.rs, src/cleanup/history.rs, README "The cleanup lease", `tombstoned status`).
--
-- Additive only: two new small tables and one function; nothing existing is touched, so it
-- applies in place on a populated database in milliseconds.

-- The single-runner lease. One row per lease name (the cleaner's is 'cleanup'); the table lives
-- in the configured schema, so two deployments in two schemas have two leases.
--
-- It replaces the session-level advisory lock of earlier versions, which a transaction-mode
-- pooler hands to two clients at once (and leaks), and which a failover loses with the old
-- primary. A row with an expiry works the same through any pooler and is replicated like any
-- other row:
--   taken     by one statement: INSERT ... ON CONFLICT (name) DO UPDATE ... WHERE the lease has
--             expired (or is already this holder's);
--   renewed   inside every cleanup batch transaction, by the statement below: a batch commits
--             only while its run still holds the lease;
--   released  at the end of a run (expires_at = now()); a holder that crashed is replaced once
--             its expires_at has passed.
-- Every instant is the database clock (now()), never a daemon's.
CREATE TABLE cleanup_lease (
    name                     text        NOT NULL,
    -- The run holding it: '<host>:<pid>:<random token of the run>'.
    holder                   text        NOT NULL,
    -- The server process and application_name of the holder's last take or renewal (through a
    -- transaction-mode pooler, the server connection that happened to carry it).
    holder_pid               integer     NULL,
    holder_application_name  text        NULL,
    -- When this holder took it, last renewed it, and until when it holds it.
    acquired_at              timestamptz NOT NULL,
    renewed_at               timestamptz NOT NULL,
    expires_at               timestamptz NOT NULL,

    CONSTRAINT cleanup_lease_pkey PRIMARY KEY (name),
    CONSTRAINT cleanup_lease_names_nonempty CHECK (name <> '' AND holder <> ''),
    CONSTRAINT cleanup_lease_renewed_after_acquired CHECK (renewed_at >= acquired_at)
);

-- Run history: one row per cleanup run that held the lease (runs skipped for the lease are not
-- runs), written by the run itself in ONE statement at its end (with the lease's release, and
-- the trim to the last cleanup.history_runs rows). Read by `tombstoned status`.
CREATE TABLE cleanup_runs (
    run_id                 bigint      GENERATED ALWAYS AS IDENTITY,
    -- The lease holder that ran it ('<host>:<pid>:<run token>').
    instance               text        NOT NULL,
    -- Database clock: started_at is when the run took the lease, finished_at the recording
    -- statement's now() (the lease is released by that same statement).
    started_at             timestamptz NOT NULL,
    finished_at            timestamptz NOT NULL,
    -- success, partial (stopped early with rows still due) or failed.
    outcome                text        NOT NULL,
    -- Why a run that did not fail stopped: finished, max_run_time, max_batches, shutdown,
    -- lease_lost. NULL for a failed run.
    stopped_by             text        NULL,
    rows_tombstoned        bigint      NOT NULL DEFAULT 0,
    tombstones_purged      bigint      NOT NULL DEFAULT 0,
    outbox_events_deleted  bigint      NOT NULL DEFAULT 0,
    lock_timeouts          bigint      NOT NULL DEFAULT 0,
    rows_skipped           bigint      NOT NULL DEFAULT 0,
    batches                bigint      NOT NULL DEFAULT 0,
    -- Rows still due at the end (NULL: the run failed before counting them).
    backlog_rows           bigint      NULL,
    -- A failed run's error, one line, as logs show it: severity, SQLSTATE and message, never a
    -- DETAIL (which can quote keys).
    error                  text        NULL,

    CONSTRAINT cleanup_runs_pkey PRIMARY KEY (run_id),
    CONSTRAINT cleanup_runs_outcome_known CHECK (outcome IN ('success', 'partial', 'failed')),
    CONSTRAINT cleanup_runs_error_iff_failed CHECK ((outcome = 'failed') = (error IS NOT NULL)),
    CONSTRAINT cleanup_runs_stopped_by_unless_failed
        CHECK ((outcome = 'failed') = (stopped_by IS NULL)),
    CONSTRAINT cleanup_runs_started_before_finished CHECK (started_at <= finished_at),
    CONSTRAINT cleanup_runs_counts_nonnegative
        CHECK (rows_tombstoned >= 0 AND tombstones_purged >= 0 AND outbox_events_deleted >= 0
               AND lock_timeouts >= 0 AND rows_skipped >= 0 AND batches >= 0
               AND (backlog_rows IS NULL OR backlog_rows >= 0))
);

-- The renewal's check: its argument is the renewed expiry, NULL when the UPDATE found no row
-- held by this run, and then it raises SQLSTATE TS001 (a class of tombstoned's own, which
-- PostgreSQL does not use), so the batch transaction it is part of rolls back whole and the
-- cleaner stops (ErrorClass::LeaseLost; src/cleanup/sql.rs, RENEW_LEASE). SQL alone cannot fail
-- a statement on "zero rows", hence this function. It reads no table, so it needs no
-- search_path.
CREATE FUNCTION cleanup_lease_required(renewed_until timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql
    VOLATILE
AS $$
BEGIN
    IF renewed_until IS NULL THEN
        RAISE EXCEPTION 'the cleanup lease is no longer held by this run'
            USING ERRCODE = 'TS001';
    END IF;
    RETURN renewed_until;
END
$$;

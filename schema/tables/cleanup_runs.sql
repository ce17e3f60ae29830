-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not
-- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).

CREATE TABLE tombstoned.cleanup_runs (
    run_id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
    instance text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome text NOT NULL,
    stopped_by text,
    rows_tombstoned bigint NOT NULL DEFAULT 0,
    tombstones_purged bigint NOT NULL DEFAULT 0,
    outbox_events_deleted bigint NOT NULL DEFAULT 0,
    lock_timeouts bigint NOT NULL DEFAULT 0,
    rows_skipped bigint NOT NULL DEFAULT 0,
    batches bigint NOT NULL DEFAULT 0,
    backlog_rows bigint,
    error text
);

ALTER TABLE tombstoned.cleanup_runs ADD CONSTRAINT cleanup_runs_counts_nonnegative CHECK (((rows_tombstoned >= 0) AND (tombstones_purged >= 0) AND (outbox_events_deleted >= 0) AND (lock_timeouts >= 0) AND (rows_skipped >= 0) AND (batches >= 0) AND ((backlog_rows IS NULL) OR (backlog_rows >= 0))));
ALTER TABLE tombstoned.cleanup_runs ADD CONSTRAINT cleanup_runs_error_iff_failed CHECK (((outcome = 'failed'::text) = (error IS NOT NULL)));
ALTER TABLE tombstoned.cleanup_runs ADD CONSTRAINT cleanup_runs_outcome_known CHECK ((outcome = ANY (ARRAY['success'::text, 'partial'::text, 'failed'::text])));
ALTER TABLE tombstoned.cleanup_runs ADD CONSTRAINT cleanup_runs_pkey PRIMARY KEY (run_id);
ALTER TABLE tombstoned.cleanup_runs ADD CONSTRAINT cleanup_runs_started_before_finished CHECK ((started_at <= finished_at));
ALTER TABLE tombstoned.cleanup_runs ADD CONSTRAINT cleanup_runs_stopped_by_unless_failed CHECK (((outcome = 'failed'::text) = (stopped_by IS NULL)));

-- ACL: default (the owner only)

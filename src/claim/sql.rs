//! Every statement of the claim/replay protocol, by name. Parameters are positional (`$n`); the
//! table in docs/api.md lists them. The benchmark's pgbench scripts copy these texts (a test
//! checks they match), so they change only deliberately. How the statements make up the
//! protocol's transactions is in [`crate::claim`].
//!
//! Whether a record's replay window is open is the schema's rule, `replay_window_open(deadline,
//! instant)` (`schema/functions/internal/replay_window_open.sql`): every statement here asks it
//! on the clock the endpoint judges by, `now()` (its transaction's start; the SQL API's
//! functions pass `clock_timestamp()`, the time of the call). The planner inlines it, so the
//! statements plan and run as if the comparison were written in them. What the answer means for
//! a claim is [`super::RecordState`].

use crate::db::Pooler;

/// The order's JSON representation, as one SQL expression over ten SQL expressions. Used by the
/// claim (over parameters) and by the duplicate-request lookup (over an `orders` row), so both
/// produce the same jsonb — and the same text — for the same order. The colons of the time
/// format are quoted (`":"`) so pgbench, which reads `:name` as a variable even inside string
/// literals, can run these statements verbatim.
macro_rules! order_json_sql {
    ($order_id:literal, $request_id:literal, $amount_minor:literal, $amount:literal,
     $currency:literal, $item:literal, $quantity:literal, $recipient:literal, $status:literal,
     $created_at:literal) => {
        concat!(
            "jsonb_build_object(",
            "'order_id', ",
            $order_id,
            ", 'request_id', ",
            $request_id,
            ", 'amount_minor', ",
            $amount_minor,
            ", 'amount', ",
            $amount,
            ", 'currency', ",
            $currency,
            ", 'item', ",
            $item,
            ", 'quantity', ",
            $quantity,
            ", 'recipient', ",
            $recipient,
            ", 'status', ",
            $status,
            ", 'created_at', to_char(",
            $created_at,
            " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24\":\"MI\":\"SS.US\"Z\"'))"
        )
    };
}

/// The scope's id (`idempotency_scopes`, V5) of `$1` tenant, `$2` principal, `$3` operation, as
/// a scalar subquery: one probe of the scope table's unique index. NULL when the scope has no
/// row yet (nothing of it can exist then). Scope rows are never deleted nor changed.
macro_rules! scope_id_sql {
    () => {
        "(SELECT scope_id FROM {schema}.idempotency_scopes
                     WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3)"
    };
}

/// `WITH scope AS (...), existing AS (...`: the claim statements' scope (see [`SCOPE`]) and
/// unlocked read of the record (see [`EXISTING`]); the caller closes the parenthesis.
macro_rules! existing_cte {
    () => {
        "WITH scope AS (
    SELECT scope_id FROM {schema}.idempotency_scopes
    WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3
), existing AS (
    SELECT fingerprint, status_code, order_id, expired,
           NOT {schema}.replay_window_open(replay_deadline, now()) AS past_deadline
    FROM {schema}.idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
"
    };
}

/// `replay AS (...`: the claim statements' locking read of the body (see [`REPLAY`]); the
/// caller closes the parenthesis.
macro_rules! replay_cte {
    () => {
        "replay AS (
    SELECT status_code AS replay_status, response_body::text AS replay_body
    FROM {schema}.idempotency_records
    WHERE scope_id = (SELECT scope_id FROM scope) AND idempotency_key = $4
      AND fingerprint = $5::bytea
      AND NOT expired AND {schema}.replay_window_open(replay_deadline, now())
    FOR SHARE
"
    };
}

/// The final `SELECT` of both claim statements: the owner's row from `claim`, or the record from
/// `existing` with the body `replay` locked (NULL when it locked none), or — when the scope has
/// no row yet — one row whose `created` is NULL (nothing was written: [`ENSURE_SCOPE`], then
/// claim again).
macro_rules! claim_result {
    () => {
        ")
SELECT true AS created, response_body::text AS body, order_id, NULL::bytea AS fingerprint,
       NULL::boolean AS expired, NULL::boolean AS past_deadline, NULL::smallint AS status_code
FROM claim
UNION ALL
SELECT false, replay.replay_body, existing.order_id, existing.fingerprint, existing.expired,
       existing.past_deadline, replay.replay_status
FROM existing LEFT JOIN replay ON true
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL
WHERE NOT EXISTS (SELECT FROM scope)"
    };
}

/// Starts the claiming transaction; READ COMMITTED whatever the server's default.
pub const BEGIN: &str = crate::db::sql::BEGIN_READ_COMMITTED;

/// `$1` = `api.claim_lock_timeout` in milliseconds, e.g. `'2000ms'`. Transaction-local: when
/// the connection goes back to the pool nothing needs restoring. The explicit transactions set it
/// (the first claim of a scope, the read while the database refuses writes, the function's call
/// run again under another default isolation); the owner attempt on a direct connection runs
/// alone and takes it from its session ([`crate::db::sql::SET_SESSION_SETTINGS`]).
pub const SET_LOCK_TIMEOUT: &str = crate::db::sql::SET_LOCAL_LOCK_TIMEOUT;

/// [`SET_LOCK_TIMEOUT`], and `$2` the request's trace context (a W3C `traceparent`, its claim
/// span) as the transaction-local `tombstoned.traceparent`, which the default of
/// `outbox_events.traceparent` (schema V9) stores with the order's event. Sent instead of
/// [`SET_LOCK_TIMEOUT`] only while a recorded trace is current: with tracing off, or a trace
/// sampled out, the claim's transaction is what it was before traces.
pub const SET_LOCK_TIMEOUT_AND_TRACE: &str = "SELECT set_config('lock_timeout', $1, true), \
set_config('tombstoned.traceparent', $2, true)";

/// [`CLAIM_AND_CREATE`]'s text, with `$event_columns` and `$event_values` appended to its outbox
/// event's columns and values (nothing, or the traced variant's `traceparent`).
macro_rules! claim_and_create_sql {
    ($event_columns:literal, $event_values:literal) => {
        concat!(
            existing_cte!(),
            "), ",
            replay_cte!(),
            "), claim AS (\n",
            "    INSERT INTO {schema}.idempotency_records\n",
            "        (scope_id, idempotency_key, fingerprint,\n",
            "         status_code, response_body, order_id, replay_deadline)\n",
            "    SELECT scope.scope_id, $4, $5::bytea, 201,\n        ",
            order_json_sql!(
                "$6::uuid", "$7::text", "$8::bigint", "$9::text", "$10::text", "$11::text",
                "$12::integer", "$13::text", "'created'", "now()"
            ),
            ",\n",
            "        $6::uuid, now() + $14::bigint * interval '1 microsecond'\n",
            "    FROM scope\n",
            "    WHERE NOT EXISTS (SELECT FROM existing)\n",
            "    ON CONFLICT (scope_id, idempotency_key) DO NOTHING\n",
            "    RETURNING order_id, response_body\n",
            "), new_order AS (\n",
            "    INSERT INTO {schema}.orders (order_id, tenant_id, principal_id, request_id, amount_minor,\n",
            "                        currency, item, quantity, recipient, status, created_at)\n",
            "    SELECT claim.order_id, $1, $2, $7, $8, $10, $11, $12, $13, 'created', now()\n",
            "    FROM claim\n",
            "    RETURNING order_id\n",
            "), event AS (\n",
            "    INSERT INTO {schema}.outbox_events (event_id, tenant_id, order_id, event_type, payload",
            $event_columns,
            ")\n",
            "    SELECT $15, $1, new_order.order_id, 'order.created',\n",
            "           jsonb_build_object('order', claim.response_body,\n",
            "                              'metadata', coalesce($16::jsonb, '{}'::jsonb))",
            $event_values,
            "\n",
            "    FROM new_order CROSS JOIN claim\n",
            claim_result!()
        )
    };
}

/// Claim the key and, only if this transaction now owns it, create the order and its outbox
/// event — one statement.
///
/// `$1` tenant, `$2` principal, `$3` operation, `$4` idempotency key, `$5` fingerprint
/// (bytea, 32 bytes), `$6` new order id (uuid v7), `$7` request_id, `$8` amount_minor,
/// `$9` amount as a decimal string with the currency's minor digits, `$10` currency,
/// `$11` item, `$12` quantity, `$13` recipient, `$14` replay window in microseconds,
/// `$15` new event id (uuid v7), `$16` metadata (jsonb or NULL).
///
/// Returns [`CLAIM_RESULT_COLUMNS`]: one row with `created` to the owner (`body`,
/// `order_id`); one row with `created = false` describing the record when the statement's
/// snapshot already holds the key (see [`EXISTING`]), with `body` and `status_code` when the
/// record was share-locked for a replay (see [`REPLAY`]); no row when the key was committed by
/// a concurrent owner while this INSERT waited for it.
pub const CLAIM_AND_CREATE: &str = claim_and_create_sql!("", "");

/// [`CLAIM_AND_CREATE`] with `$17` the request's trace context (a W3C `traceparent`, its claim
/// span) stored with the order's outbox event, for a claim on a direct connection while a
/// recorded trace is current: a traced claim stays one statement, one Sync, like an untraced one
/// (setting `tombstoned.traceparent` first, as the SQL API's callers do, would take an explicit
/// transaction: three more statements). Not the function's body: through a transaction pooler
/// the traced claim sets the setting in its transaction ([`SET_LOCK_TIMEOUT_AND_TRACE`]).
pub const CLAIM_AND_CREATE_TRACED: &str =
    claim_and_create_sql!(", traceparent", ",\n           $17::text");

/// Claim the key with a deterministic business rejection as its stored, terminal outcome
/// (422 approval-limit-exceeded): no order, no event.
///
/// `$1` tenant, `$2` principal, `$3` operation, `$4` key, `$5` fingerprint, `$6` status code
/// (smallint), `$7` problem body (jsonb), `$8` replay window in microseconds.
///
/// Returns [`CLAIM_RESULT_COLUMNS`] like [`CLAIM_AND_CREATE`] (`order_id` is NULL).
pub const CLAIM_REJECTED: &str = concat!(
    existing_cte!(),
    "), ",
    replay_cte!(),
    "), claim AS (
    INSERT INTO {schema}.idempotency_records
        (scope_id, idempotency_key, fingerprint,
         status_code, response_body, order_id, replay_deadline)
    SELECT scope.scope_id, $4, $5::bytea, $6::smallint, $7::jsonb, NULL,
           now() + $8::bigint * interval '1 microsecond'
    FROM scope
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (scope_id, idempotency_key) DO NOTHING
    RETURNING order_id, response_body
",
    claim_result!()
);

/// [`CLAIM_AND_CREATE`] run by its function (`endpoint_claim_order`, migration V6), whose body
/// is that statement's text: same parameters with the same types (`$1`-`$16`), same result
/// columns, same locks and errors. Before it, the function refuses a transaction that is not
/// READ COMMITTED ([`crate::db::WRONG_ISOLATION`]) and sets `lock_timeout` to `$17`
/// transaction-locally, so through a transaction pooler this call *is* the owner attempt's
/// transaction: one statement, implicitly committed ([`crate::claim`]'s module docs). Sent only
/// through a transaction pooler ([`claim_and_create`]).
pub const CALL_CLAIM_AND_CREATE: &str = "SELECT * FROM {schema}.endpoint_claim_order(\
$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)";

/// [`CLAIM_REJECTED`] run by its function (`endpoint_claim_rejected`, migration V6), as
/// [`CALL_CLAIM_AND_CREATE`] runs [`CLAIM_AND_CREATE`] (`$9`: the lock timeout).
pub const CALL_CLAIM_REJECTED: &str =
    "SELECT * FROM {schema}.endpoint_claim_rejected($1, $2, $3, $4, $5, $6, $7, $8, $9)";

/// The owner attempt's statement that claims and creates the order, as sent with `pooler`.
/// See [`through_pooler`] for why a transaction pooler gets the function call.
pub fn claim_and_create(pooler: Pooler) -> &'static str {
    through_pooler(pooler, CLAIM_AND_CREATE, CALL_CLAIM_AND_CREATE)
}

/// The owner attempt's statement that stores a rejection, as sent with `pooler` (see
/// [`through_pooler`]).
pub fn claim_rejected(pooler: Pooler) -> &'static str {
    through_pooler(pooler, CLAIM_REJECTED, CALL_CLAIM_REJECTED)
}

/// The one place that chooses between a claim statement and its function. Where a named
/// statement may be kept (`none`, `session`), the fused statement itself: prepared once per
/// connection, it is parsed and planned once, and that wire shape is the one the tests pin.
/// Through a transaction pooler nothing named may outlive its transaction, so the statement
/// would go unnamed and be parsed and planned at every request (round 2: a claim 1.7-2.6 x
/// dearer). PL/pgSQL keeps the plan of the function's statement for the server connection,
/// which outlives the pooler's transactions: the call is what gets planned per request, and a
/// call is cheap to plan.
fn through_pooler(pooler: Pooler, statement: &'static str, call: &'static str) -> &'static str {
    if pooler.keeps_prepared_statements() {
        statement
    } else {
        call
    }
}

/// The columns both claim statements return, in order.
pub const CLAIM_RESULT_COLUMNS: [&str; 7] = [
    "created",
    "body",
    "order_id",
    "fingerprint",
    "expired",
    "past_deadline",
    "status_code",
];

/// When a claim statement answered "no scope yet" (`created` NULL: the tenant, principal and
/// operation have no row in `idempotency_scopes`): insert it, in a transaction of its own
/// (`BEGIN; SET_LOCK_TIMEOUT; ENSURE_SCOPE; COMMIT`, one round trip), so it is committed — and visible to the claim's next attempt, a new
/// transaction — before anything else happens. Race-free: the `INSERT` runs only when the scope
/// is missing; two daemons inserting the same scope at once both end with it committed (the
/// second waits for the first's transaction, bounded by `lock_timeout`, and conflicts). No row
/// lock is left behind, and the identity sequence advances once per scope (plus races). Only the first claim
/// of a scope ever sends it.
///
/// `$1` tenant, `$2` principal, `$3` operation.
pub const ENSURE_SCOPE: &str = "\
INSERT INTO {schema}.idempotency_scopes (tenant_id, principal_id, operation)
SELECT $1, $2, $3
WHERE NOT EXISTS (SELECT FROM {schema}.idempotency_scopes
                  WHERE tenant_id = $1 AND principal_id = $2 AND operation = $3)
ON CONFLICT (tenant_id, principal_id, operation) DO NOTHING";

/// The `existing` part of both claim statements, for the documentation: the record as the
/// statement's snapshot sees it, read without a lock. When it is there, the INSERT inserts
/// nothing and so never waits on the record: not for a cleanup batch tombstoning it, not
/// for anyone else holding it. (A key committed by someone else after the snapshot is not
/// seen here; the INSERT then waits for that owner, as the protocol requires, and finds the
/// conflict.)
pub const EXISTING: &str = concat!(existing_cte!(), ")");

/// The `replay` part of both claim statements, for the documentation: a replay in the claim's
/// one round trip. The locking argument, part by part:
///
/// - It reads the same snapshot as [`EXISTING`] (one statement, one snapshot), so it returns a
///   row only when `existing` does — and then the claim INSERT (`WHERE NOT EXISTS (SELECT FROM
///   existing)`) inserts nothing. A key *not* in the snapshot is never looked for here: that
///   case stays the protocol's, the INSERT waits for the in-flight owner and the statement
///   returns no row, and the caller reads the record `FOR SHARE` in a new transaction
///   ([`READ_FOR_REPLAY`]), whose new snapshot sees it. Nothing assumes this statement can see a
///   row committed after its snapshot.
/// - `FOR SHARE` is the lock [`READ_FOR_REPLAY`] takes, on the same rows: inside the window
///   only, so it never waits for the cleaner (which locks only rows past its cutoff, a database
///   time at or before this transaction's `now()`), and it blocks the cleaner's tombstoning
///   UPDATE until this transaction ends — the body returned is the one the replay sends. When
///   the row changed after the snapshot (tombstoned, or its window closed), READ COMMITTED locks
///   the newest version and re-checks the conditions on it: `NOT expired` and the open window
///   then fail and nothing is locked or returned; the caller falls back to the replay
///   transaction, which answers from the row as it now is. Waiting for a conflicting lock is
///   bounded by the transaction's `lock_timeout` (55P03: "in progress"), as in the replay
///   transaction.
/// - `fingerprint = $5`: the body is read only for the same intent; key reuse never learns the
///   stored response (the caller checks the fingerprint from `existing` first anyway).
/// - The transaction commits synchronously, like every claim (the claim's statement cannot know
///   in advance that it will be a replay, and a claim's 201 must be durable before it is sent):
///   the lock marker gives it a commit record, so a replay here waits for one WAL flush, shared
///   with concurrent commits. The replay transaction ([`SET_REPLAY_SETTINGS`]) still commits
///   asynchronously.
pub const REPLAY: &str = concat!("WITH ", replay_cte!(), ")");

/// Starts the replay transaction's settings: `$1` = `api.claim_lock_timeout` like
/// [`SET_LOCK_TIMEOUT`], and asynchronous commit — the replay's only write is its transient
/// row-lock marker, so its COMMIT need not wait for a WAL flush (module docs).
pub const SET_REPLAY_SETTINGS: &str = "\
SELECT set_config('lock_timeout', $1, true), set_config('synchronous_commit', 'off', true)";

/// The existing record while its replay window is open, share-locked so the cleaner cannot
/// tombstone it under the reader. Records past their window are not returned (nor locked,
/// nor waited for): those are the ones the cleaner locks, and their answer needs no body —
/// [`READ_EXPIRED`] reads them. The window is judged on the database clock and ends exactly
/// at `replay_deadline`, whether or not the cleaner has run yet.
///
/// `$1` tenant, `$2` principal, `$3` operation, `$4` key.
pub const READ_FOR_REPLAY: &str = concat!(
    "\
SELECT fingerprint, status_code, response_body::text AS body, order_id, expired,
       NOT {schema}.replay_window_open(replay_deadline, now()) AS past_deadline
FROM {schema}.idempotency_records
WHERE scope_id = ",
    scope_id_sql!(),
    "
  AND idempotency_key = $4
  AND NOT expired AND {schema}.replay_window_open(replay_deadline, now())
FOR SHARE"
);

/// When [`READ_FOR_REPLAY`] found nothing: the record as it is, without a lock (a plain
/// snapshot read never waits for the cleaner). It is past its window or a tombstone — the
/// answer is key reuse or "expired", from the fingerprint and the order id, which never
/// change — or it is gone (only a retention purge deletes records).
///
/// `$1` tenant, `$2` principal, `$3` operation, `$4` key.
pub const READ_EXPIRED: &str = concat!(
    "\
SELECT fingerprint, status_code, NULL::text AS body, order_id, expired,
       NOT {schema}.replay_window_open(replay_deadline, now()) AS past_deadline
FROM {schema}.idempotency_records
WHERE scope_id = ",
    scope_id_sql!(),
    "
  AND idempotency_key = $4"
);

/// While the database refuses writes (25006): the record with its body, without a lock, run in
/// a READ ONLY transaction (`crate::claim`'s `read_only` says why no lock is needed then).
/// Names its schema (`{schema}`, rendered by [`crate::db::sql::qualify`]).
///
/// `$1` tenant, `$2` principal, `$3` operation, `$4` key.
pub const READ_RECORD_READ_ONLY: &str = concat!(
    "\
SELECT fingerprint, status_code, response_body::text AS body, order_id, expired,
       NOT {schema}.replay_window_open(replay_deadline, now()) AS past_deadline
FROM {schema}.idempotency_records
WHERE scope_id = ",
    scope_id_sql!(),
    "
  AND idempotency_key = $4"
);

/// Ends the transaction (a ROLLBACK when a statement in it failed).
pub const COMMIT: &str = crate::db::sql::COMMIT;

/// After 23505 on `orders_tenant_request_key` (the claiming transaction rolled back): the
/// order that has this request_id, with its representation built exactly as the claim built
/// it. A plain snapshot read, outside any transaction; takes no row lock.
///
/// `$1` tenant, `$2` request_id, `$3` amount as a decimal string in the *request's* currency
/// (only used when the stored order's amount and currency equal the request's).
pub const FIND_ORDER_BY_REQUEST_ID: &str = concat!(
    "SELECT principal_id, amount_minor, currency::text AS currency, item, quantity,\n",
    "       recipient, order_id,\n       ",
    order_json_sql!(
        "order_id",
        "request_id",
        "amount_minor",
        "$3::text",
        "currency::text",
        "item",
        "quantity",
        "recipient",
        "status",
        "created_at"
    ),
    "::text AS body\n",
    "FROM {schema}.orders\n",
    "WHERE tenant_id = $1 AND request_id = $2"
);

/// Every statement by name, for the benchmark's pgbench scripts and the documentation.
pub const STATEMENTS: &[(&str, &str)] = &[
    ("begin", BEGIN),
    ("set_lock_timeout", SET_LOCK_TIMEOUT),
    ("set_lock_timeout_and_trace", SET_LOCK_TIMEOUT_AND_TRACE),
    ("set_replay_settings", SET_REPLAY_SETTINGS),
    ("claim_and_create", CLAIM_AND_CREATE),
    ("claim_and_create_traced", CLAIM_AND_CREATE_TRACED),
    ("claim_rejected", CLAIM_REJECTED),
    ("call_claim_and_create", CALL_CLAIM_AND_CREATE),
    ("call_claim_rejected", CALL_CLAIM_REJECTED),
    ("ensure_scope", ENSURE_SCOPE),
    ("read_for_replay", READ_FOR_REPLAY),
    ("read_expired", READ_EXPIRED),
    ("commit", COMMIT),
    ("find_order_by_request_id", FIND_ORDER_BY_REQUEST_ID),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_parameterised_and_name_the_conflict_target() {
        // Parameters are numbered 1..=n without gaps (a gap would be an unbound placeholder).
        for (name, text) in STATEMENTS {
            let mut used: Vec<usize> = text
                .split('$')
                .skip(1)
                .filter_map(|t| {
                    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok()
                })
                .collect();
            used.sort_unstable();
            used.dedup();
            assert_eq!(used, (1..=used.len()).collect::<Vec<_>>(), "{name}");
        }
        for text in [CLAIM_AND_CREATE, CLAIM_REJECTED] {
            assert!(text.contains("ON CONFLICT (scope_id, idempotency_key) DO NOTHING"));
        }
        assert!(READ_FOR_REPLAY.trim_end().ends_with("FOR SHARE"));
        assert!(
            !READ_EXPIRED.contains("FOR "),
            "the expired read takes no lock"
        );
    }

    #[test]
    fn only_a_transaction_pooler_gets_the_function_calls_with_the_same_parameters() {
        for pooler in [Pooler::None, Pooler::Session] {
            assert_eq!(claim_and_create(pooler), CLAIM_AND_CREATE);
            assert_eq!(claim_rejected(pooler), CLAIM_REJECTED);
        }
        assert_eq!(claim_and_create(Pooler::Transaction), CALL_CLAIM_AND_CREATE);
        assert_eq!(claim_rejected(Pooler::Transaction), CALL_CLAIM_REJECTED);
        let highest = |text: &str| {
            text.split('$')
                .skip(1)
                .filter_map(|t| {
                    let digits: String = t.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse::<usize>().ok()
                })
                .max()
        };
        // The statement's parameters, then the lock timeout.
        let plus_one = |text: &str| highest(text).map(|n| n + 1);
        assert_eq!(highest(CALL_CLAIM_AND_CREATE), plus_one(CLAIM_AND_CREATE));
        assert_eq!(highest(CALL_CLAIM_REJECTED), plus_one(CLAIM_REJECTED));
    }

    #[test]
    fn the_traced_claim_is_the_claim_storing_17_as_its_events_traceparent() {
        let untraced = CLAIM_AND_CREATE_TRACED
            .replacen("payload, traceparent)", "payload)", 1)
            .replacen(",\n           $17::text\n", "\n", 1);
        assert_eq!(untraced, CLAIM_AND_CREATE);
    }

    #[test]
    fn only_the_replay_transaction_commits_asynchronously() {
        // A claim's 201 must be durable before it is sent; a replay writes nothing durable.
        assert!(SET_REPLAY_SETTINGS.contains("'synchronous_commit', 'off'"));
        assert!(!SET_LOCK_TIMEOUT.contains("synchronous_commit"));
        assert!(!CLAIM_AND_CREATE.contains("synchronous_commit"));
    }

    #[test]
    fn statements_run_verbatim_in_pgbench() {
        // pgbench substitutes `:name` everywhere, string literals included; `::` casts are fine.
        for (name, text) in STATEMENTS {
            let b = text.as_bytes();
            for i in 0..b.len() {
                let lone_colon = b[i] == b':'
                    && (i == 0 || b[i - 1] != b':')
                    && b.get(i + 1)
                        .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
                assert!(!lone_colon, "{name}: `:name` at byte {i}");
            }
        }
    }
}

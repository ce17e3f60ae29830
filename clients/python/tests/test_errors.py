"""Every SQLSTATE of the SQL API mapped to its error, each made by the real server on its real
path (a second session holding the key, a REPEATABLE READ race, a deadlock, a read-only
transaction, a terminated backend, a temporary-file limit...): the class, its sqlstate, and
what the runner does with it (retry, give up, roll everything back)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

import tombstoned
from support import (
    ADMIN_URL,
    NOT_GRANTED,
    PATIENCE,
    PRINCIPAL,
    SCHEMA,
    SCOPE,
    SERVICE_ROLE,
    SERVICE_URL,
    TENANT,
    admin,
    count,
    insert_payment,
    intent,
    new_key,
    payments_of,
    records_of,
    role_url,
    service_url,
    set_up_role,
    wait_for_lock_waits,
    wait_for_pid_lock_wait,
)

HOUR = timedelta(hours=1)


def runner(conn: psycopg.Connection[Any]) -> tombstoned.Idempotency:
    return tombstoned.Idempotency(conn, schema=SCHEMA, replay_window=HOUR)


def test_22023_names_the_argument() -> None:
    with psycopg.connect(SERVICE_URL) as conn:
        calls: list[tuple[Callable[[], object], str]] = [
            (lambda: tombstoned.claim(conn, SCOPE, "", {}, HOUR, schema=SCHEMA), "idempotency_key"),
            (lambda: tombstoned.claim(conn, SCOPE, "k", {}, "0 s", schema=SCHEMA), "replay_window"),
            (
                lambda: tombstoned.complete(conn, SCOPE, "k", 503, {}, schema=SCHEMA),
                "status_code",
            ),
            (
                lambda: tombstoned.enqueue_event(conn, TENANT, "", "t", {}, schema=SCHEMA),
                "aggregate_id",
            ),
        ]
        for call, argument in calls:
            with pytest.raises(tombstoned.InvalidArgument) as refused:
                call()
            conn.rollback()
            assert (refused.value.sqlstate, refused.value.argument) == ("22023", argument)
            assert isinstance(refused.value.__cause__, psycopg.Error)


def test_55p03_while_the_owner_is_in_flight_then_the_key_is_free() -> None:
    key = new_key()
    with psycopg.connect(SERVICE_URL) as holder, psycopg.connect(SERVICE_URL) as other:
        assert isinstance(
            tombstoned.claim(holder, SCOPE, key, {}, HOUR, schema=SCHEMA), tombstoned.Owner
        )
        with pytest.raises(tombstoned.InProgress) as busy:
            tombstoned.claim(other, SCOPE, key, {}, HOUR, timedelta(milliseconds=50), schema=SCHEMA)
        assert (busy.value.sqlstate, busy.value.retry_after) == ("55P03", 1)
        other.rollback()
        holder.rollback()
        # The owner rolled back: the retry with the same key owns it.
        assert isinstance(
            tombstoned.claim(other, SCOPE, key, {}, HOUR, schema=SCHEMA), tombstoned.Owner
        )
        other.rollback()


def test_ts002_ts004_and_ts005() -> None:
    key = new_key()
    with psycopg.connect(SERVICE_URL) as conn:
        with pytest.raises(tombstoned.NotClaimed) as not_claimed:
            tombstoned.complete(conn, SCOPE, key, 201, {}, schema=SCHEMA)
        assert not_claimed.value.sqlstate == "TS002"
        conn.rollback()
        tombstoned.claim(conn, SCOPE, key, {}, HOUR, schema=SCHEMA)
        with pytest.raises(tombstoned.ClaimedTwice) as twice:
            tombstoned.claim(conn, SCOPE, key, {}, HOUR, schema=SCHEMA)
        assert twice.value.sqlstate == "TS004"
        conn.rollback()
        # TS005 comes only from the endpoint's internal functions, outside READ COMMITTED.
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error) as wrong:
            conn.execute(
                sql.SQL(
                    "SELECT * FROM {}.endpoint_claim_rejected(NULL, NULL, NULL, NULL, NULL,"
                    " NULL, NULL, NULL, NULL)"
                ).format(sql.Identifier(SCHEMA))
            )
        mapped = tombstoned.classify(wrong.value)
        assert isinstance(mapped, tombstoned.WrongIsolation) and mapped.sqlstate == "TS005"
        conn.rollback()


def test_ts003_a_handler_that_returns_without_completing_commits_nothing(
    admin_conn: psycopg.Connection[Any],
) -> None:
    key = new_key()
    payment = intent(f"ts003-{key}")

    def forgets(tx: tombstoned.Transaction) -> None:
        insert_payment(tx.conn, SCOPE, payment)  # and no tx.complete()

    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        with pytest.raises(tombstoned.ClaimNotCompleted) as refused:
            runner(conn).execute(SCOPE, key, payment, forgets)
        assert refused.value.sqlstate == "TS003"
        assert payments_of(admin_conn, payment["request_id"]) == 0, "the business row is gone"
        assert records_of(admin_conn, key) == 0

        def completes(tx: tombstoned.Transaction) -> tombstoned.Completed:
            payment_id, body = insert_payment(tx.conn, SCOPE, payment)
            return tx.complete(201, body, payment_id)

        # The key was not consumed: the retry owns it.
        assert isinstance(
            runner(conn).execute(SCOPE, key, payment, completes), tombstoned.Completed
        )


def test_a_handler_raising_after_its_business_write_commits_nothing(
    admin_conn: psycopg.Connection[Any],
) -> None:
    key = new_key()
    payment = intent(f"raise-{key}")

    class Refused(Exception):
        pass

    def raises(tx: tombstoned.Transaction) -> None:
        insert_payment(tx.conn, SCOPE, payment)
        raise Refused()

    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        with pytest.raises(Refused):
            runner(conn).execute(SCOPE, key, payment, raises)
        assert payments_of(admin_conn, payment["request_id"]) == 0
        assert records_of(admin_conn, key) == 0
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_40001_under_repeatable_read_when_a_waited_for_owner_commits(
    admin_conn: psycopg.Connection[Any],
) -> None:
    key = new_key()
    app = f"py-rr-{key[2:14]}"
    with (
        psycopg.connect(SERVICE_URL) as holder,
        psycopg.connect(service_url(application_name=app)) as racer,
        ThreadPoolExecutor(1) as pool,
    ):
        tombstoned.claim(holder, SCOPE, key, {}, HOUR, schema=SCHEMA)
        racer.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        racer.execute("SELECT 1")  # the snapshot: taken before the owner commits
        waiting = pool.submit(
            tombstoned.claim, racer, SCOPE, key, {}, HOUR, timedelta(seconds=30), schema=SCHEMA
        )
        wait_for_lock_waits(admin_conn, app)
        tombstoned.complete(holder, SCOPE, key, 200, {"ok": True}, schema=SCHEMA)
        holder.commit()
        with pytest.raises(tombstoned.SerializationFailure) as failed:
            waiting.result(PATIENCE)
        assert failed.value.sqlstate == "40001"
        racer.rollback()


def test_40p01_a_deadlock_runs_the_whole_transaction_again(
    admin_conn: psycopg.Connection[Any],
) -> None:
    """The runner's handler holds aggregate A's event counter and asks for B's, which an admin
    session holds while it asks for A's: a real deadlock, whose victim is the runner's attempt
    (only its deadlock_timeout, 1 s, runs out: the admin session's is long; and claim()'s
    lock_timeout is the call's only, so the wait meets the deadlock check, not a lock timeout).
    The second attempt starts its writes once the admin session has committed: an
    INSERT ... ON CONFLICT that waited on attempt 1 takes no tuple lock, so attempt 2 could
    insert A's counter first and deadlock again. Attempt 2 then completes, with no wait."""
    key = new_key()
    app = f"py-dl-{key[2:14]}"
    agg_a, agg_b = f"agg-a-{key}", f"agg-b-{key}"
    holds_a, admin_waits, admin_committed = threading.Event(), threading.Event(), threading.Event()
    attempts = 0
    failures: list[str | None] = []

    def handler(tx: tombstoned.Transaction) -> tombstoned.Completed:
        nonlocal attempts
        attempts += 1
        if attempts > 1:
            assert admin_committed.wait(PATIENCE)
        tx.enqueue_event(agg_a, "t", {"attempt": attempts})
        if attempts == 1:
            holds_a.set()
            assert admin_waits.wait(PATIENCE)
        try:
            tx.enqueue_event(agg_b, "t", {"attempt": attempts})
        except tombstoned.TombstonedError as e:
            failures.append(e.sqlstate)
            raise
        return tx.complete(201, {"attempt": attempts})

    enqueue = sql.SQL("SELECT {}.enqueue_event(%s, %s, 't', '{{}}')").format(sql.Identifier(SCHEMA))
    with (
        psycopg.connect(ADMIN_URL) as other,
        psycopg.connect(service_url(application_name=app), autocommit=True) as conn,
        ThreadPoolExecutor(2) as pool,
    ):
        other.execute("SET deadlock_timeout = '10min'")
        other.execute(enqueue, (TENANT, agg_b))
        run = pool.submit(runner(conn).execute, SCOPE, key, {}, handler)
        assert holds_a.wait(PATIENCE)
        other_pid = other.info.backend_pid
        asks_a = pool.submit(other.execute, enqueue, (TENANT, agg_a))
        wait_for_pid_lock_wait(admin_conn, other_pid)
        admin_waits.set()
        asks_a.result(PATIENCE)  # granted once the runner's first attempt rolled back
        other.commit()
        admin_committed.set()
        result = run.result(PATIENCE)
    assert failures == ["40P01"]
    assert isinstance(result, tombstoned.Completed)
    assert (result.status_code, result.body_text, result.resource_id) == (
        201,
        '{"attempt": 2}',
        None,
    )
    assert attempts == 2


def test_retries_exhausted_after_three_serialization_failures() -> None:
    attempts = 0

    def always_fails(tx: tombstoned.Transaction) -> None:
        nonlocal attempts
        attempts += 1
        tx.conn.execute("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END $$")

    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        with pytest.raises(tombstoned.RetriesExhausted) as exhausted:
            runner(conn).execute(SCOPE, new_key(), {}, always_fails)
    assert (attempts, exhausted.value.attempts, exhausted.value.sqlstate) == (3, 3, "40001")
    assert tombstoned.http_answer(exhausted.value).headers["Retry-After"] == "1"


def test_25006_on_a_read_only_transaction_or_server() -> None:
    with psycopg.connect(SERVICE_URL) as conn:
        conn.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(tombstoned.ReadOnly) as read_only:
            tombstoned.claim(conn, SCOPE, new_key(), {}, HOUR, schema=SCHEMA)
        assert read_only.value.sqlstate == "25006"
        conn.rollback()
        # lookup() is what works there (a hot standby).
        conn.execute("SET TRANSACTION READ ONLY")
        assert tombstoned.lookup(conn, SCOPE, new_key(), {}, schema=SCHEMA) is None
        conn.rollback()
    # A server that refuses writes (default_transaction_read_only, like a standby's sessions).
    url = service_url(options="-c default_transaction_read_only=on")
    with psycopg.connect(url, autocommit=True) as conn:
        with pytest.raises(tombstoned.ReadOnly):
            runner(conn).execute(SCOPE, new_key(), {}, lambda tx: tx.complete(201, {}))


def test_42501_not_allowed() -> None:
    def reads_the_records(tx: tombstoned.Transaction) -> None:
        tx.conn.execute(
            sql.SQL("SELECT 1 FROM {}.idempotency_records LIMIT 1").format(sql.Identifier(SCHEMA))
        )

    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        with pytest.raises(tombstoned.NotAllowed) as refused:
            runner(conn).execute(SCOPE, new_key(), {}, reads_the_records)
    assert refused.value.sqlstate == "42501"
    assert tombstoned.http_answer(refused.value).status == 500


def test_42501_a_call_outside_the_roles_operations_reveals_nothing(
    admin_conn: psycopg.Connection[Any],
) -> None:
    """claim, complete and lookup in an operation the role was not granted: NotAllowed, for a key
    that has a record there (the admin made it) exactly as for one that has none; nothing
    written; the answer a 500 that names nothing."""
    elsewhere = tombstoned.Scope(TENANT, PRINCIPAL, NOT_GRANTED)
    held, fresh = new_key(), new_key()
    with psycopg.connect(ADMIN_URL) as owner:
        tombstoned.claim(owner, elsewhere, held, {"v": 1}, HOUR, schema=SCHEMA)
        tombstoned.complete(owner, elsewhere, held, 201, {"secret": held}, "res-1", schema=SCHEMA)
        owner.commit()
    refusals: dict[str, list[str]] = {}
    with psycopg.connect(SERVICE_URL) as conn:

        def calls(key: str) -> dict[str, Callable[[], object]]:
            return {
                "claim": lambda: tombstoned.claim(
                    conn, elsewhere, key, {"v": 1}, HOUR, schema=SCHEMA
                ),
                "complete": lambda: tombstoned.complete(
                    conn, elsewhere, key, 201, {}, schema=SCHEMA
                ),
                "lookup": lambda: tombstoned.lookup(conn, elsewhere, key, {"v": 1}, schema=SCHEMA),
            }

        for key in (held, fresh):
            for name, call in calls(key).items():
                with pytest.raises(tombstoned.NotAllowed) as refused:
                    call()
                conn.rollback()
                assert refused.value.sqlstate == "42501"
                refusals.setdefault(name, []).append(str(refused.value))
                answer = tombstoned.http_answer(refused.value)
                assert answer.status == 500
                assert json.loads(answer.body)["detail"] == "Internal error."
                assert NOT_GRANTED not in answer.body and SERVICE_ROLE not in answer.body
    for name, (on_held, on_fresh) in refusals.items():
        assert on_held == on_fresh, f"{name} tells a key that exists from one that does not"
        assert NOT_GRANTED in on_held and SERVICE_ROLE in on_held, on_held
    assert records_of(admin_conn, fresh) == 0
    assert (
        count(
            admin_conn,
            sql.SQL(
                "SELECT count(*) FROM {}.idempotency_records WHERE idempotency_key = %s"
                " AND response_body IS NOT NULL"
            ).format(sql.Identifier(SCHEMA)),
            held,
        )
        == 1
    )


@pytest.fixture
def role_without_operations() -> Iterator[str]:
    """A role with the two GRANTs and no operation."""
    role = f"{SERVICE_ROLE}_idle"
    ident = sql.Identifier(role)
    with admin() as conn:
        conn.execute(sql.SQL("CREATE ROLE {r} LOGIN PASSWORD 'idle'").format(r=ident))
        set_up_role(conn, role, operation=None)
    yield role
    with admin() as conn:
        conn.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=ident))


def test_42501_enqueue_event_by_a_role_without_any_operation(
    role_without_operations: str, admin_conn: psycopg.Connection[Any]
) -> None:
    aggregate = f"agg-{new_key()}"
    with psycopg.connect(role_url(role_without_operations, "idle")) as conn:
        with pytest.raises(tombstoned.NotAllowed) as refused:
            tombstoned.enqueue_event(conn, TENANT, aggregate, "payment.created", {}, schema=SCHEMA)
        conn.rollback()
    assert refused.value.sqlstate == "42501"
    events = sql.SQL("SELECT count(*) FROM {}.outbox_events WHERE aggregate_id = %s").format(
        sql.Identifier(SCHEMA)
    )
    assert count(admin_conn, events, aggregate) == 0
    # The same call by the suite's role, which holds an operation, is allowed.
    with psycopg.connect(SERVICE_URL) as conn:
        tombstoned.enqueue_event(conn, TENANT, aggregate, "payment.created", {}, schema=SCHEMA)
        conn.rollback()


def test_a_backend_terminated_before_commit_is_unavailable_and_commits_nothing(
    admin_conn: psycopg.Connection[Any],
) -> None:
    key = new_key()
    app = f"py-term-{key[2:14]}"
    payment = intent(f"term-{key}")
    aggregate = f"agg-{key}"

    def waits(tx: tombstoned.Transaction) -> None:
        insert_payment(tx.conn, SCOPE, payment)
        tx.enqueue_event(aggregate, "t", {})  # waits for the admin session's lock

    with (
        psycopg.connect(ADMIN_URL) as other,
        psycopg.connect(service_url(application_name=app), autocommit=True) as conn,
        ThreadPoolExecutor(1) as pool,
    ):
        other.execute(
            sql.SQL("SELECT {}.enqueue_event(%s, %s, 't', '{{}}')").format(sql.Identifier(SCHEMA)),
            (TENANT, aggregate),
        )
        run = pool.submit(runner(conn).execute, SCOPE, key, payment, waits)
        (pid,) = wait_for_lock_waits(admin_conn, app)
        admin_conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(tombstoned.DatabaseUnavailable) as lost:
            run.result(PATIENCE)
        other.rollback()
    assert lost.value.sqlstate in ("57P01", None)
    assert tombstoned.http_answer(lost.value).status == 503
    assert payments_of(admin_conn, payment["request_id"]) == 0
    assert records_of(admin_conn, key) == 0


async def test_a_pool_timeout_is_unavailable() -> None:
    async with AsyncConnectionPool(
        SERVICE_URL, min_size=1, max_size=1, timeout=0.2, open=False
    ) as pool:
        idempotency = tombstoned.AsyncIdempotency(pool, schema=SCHEMA)
        async with pool.connection():  # the pool's only connection, taken
            with pytest.raises(tombstoned.DatabaseUnavailable) as timed_out:
                await idempotency.execute(SCOPE, new_key(), {}, _never_called)
    assert timed_out.value.sqlstate is None


async def _never_called(tx: tombstoned.AsyncTransaction) -> None:
    raise AssertionError("no connection, no handler")


@pytest.fixture
def small_role() -> Iterator[str]:
    """A service role whose sessions may write 64 kB of temporary files, no more."""
    role = f"{SERVICE_ROLE}_small"
    ident = sql.Identifier(role)
    with admin() as conn:
        conn.execute(
            sql.SQL(
                "CREATE ROLE {r} LOGIN PASSWORD 'small';"
                " ALTER ROLE {r} SET temp_file_limit = '64kB';"
                " ALTER ROLE {r} SET work_mem = '64kB'"
            ).format(r=ident)
        )
        set_up_role(conn, role)
    yield role
    with admin() as conn:
        conn.execute(sql.SQL("DROP OWNED BY {r}; DROP ROLE {r}").format(r=ident))


def test_class_53_out_of_resources(small_role: str) -> None:
    def sorts_too_much(tx: tombstoned.Transaction) -> None:
        tx.conn.execute(
            "SELECT count(*) FROM (SELECT g FROM generate_series(1, 200000) g ORDER BY g DESC) s"
        )

    with psycopg.connect(role_url(small_role, "small"), autocommit=True) as conn:
        with pytest.raises(tombstoned.OutOfResources) as exhausted:
            runner(conn).execute(SCOPE, new_key(), {}, sorts_too_much)
    assert exhausted.value.sqlstate == "53400"
    assert tombstoned.http_answer(exhausted.value).headers["Retry-After"] == "10"

"""The runners, sync and asyncio: each outcome answered and committed at once, the business
write only for the owner, the business id's second line of defence (23505), a route whose key
is optional, READ COMMITTED whatever the session's default."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import tombstoned
from support import (
    BUSINESS_CONSTRAINT,
    SCHEMA,
    SCOPE,
    SERVICE_URL,
    expire,
    insert_payment,
    insert_payment_async,
    intent,
    new_key,
    payments_of,
    read_payment,
    read_payment_async,
    records_of,
    service_url,
)

HOUR = timedelta(hours=1)
OTHER = tombstoned.Scope(SCOPE.tenant, "audit", SCOPE.operation)


def create(payment: dict[str, Any]) -> Callable[[tombstoned.Transaction], tombstoned.Completed]:
    def handler(tx: tombstoned.Transaction) -> tombstoned.Completed:
        # The session's default is SERIALIZABLE (see the pool below): the runner's is not.
        (level,) = tx.conn.execute("SHOW transaction_isolation").fetchone() or ("",)
        assert level == "read committed"
        payment_id, body = insert_payment(tx.conn, tx.scope, payment)
        tx.enqueue_event(payment_id, "payment.created", body)
        return tx.complete(201, body, payment_id)

    return handler


def create_async(
    payment: dict[str, Any],
) -> Callable[[tombstoned.AsyncTransaction], Awaitable[tombstoned.Completed]]:
    async def handler(tx: tombstoned.AsyncTransaction) -> tombstoned.Completed:
        payment_id, body = await insert_payment_async(tx.conn, tx.scope, payment)
        await tx.enqueue_event(payment_id, "payment.created", body)
        return await tx.complete(201, body, payment_id)

    return handler


@pytest.fixture(scope="module")
def pool() -> Any:
    with ConnectionPool(
        service_url(options="-c default_transaction_isolation=serializable"),
        min_size=1,
        max_size=2,
    ) as pool:
        yield pool


def test_sync_runner_answers_every_outcome(
    pool: ConnectionPool[Any], admin_conn: psycopg.Connection[Any]
) -> None:
    idempotency = tombstoned.Idempotency(pool, schema=SCHEMA, replay_window=HOUR)
    business_id = tombstoned.BusinessId(BUSINESS_CONSTRAINT, read_payment)
    key = new_key()
    payment = intent(f"run-{key}")

    def run(scope: tombstoned.Scope, key: str, payment: dict[str, Any]) -> tombstoned.Result:
        return idempotency.execute(scope, key, payment, create(payment), business_id=business_id)

    created = run(SCOPE, key, payment)
    assert isinstance(created, tombstoned.Completed) and created.status_code == 201
    assert run(SCOPE, key, payment) == tombstoned.Replay(
        201, created.body_text, created.resource_id, _deadline(idempotency, key, payment)
    )
    assert run(SCOPE, key, intent(f"run-{key}", 1)) == tombstoned.KeyReused()
    # A new key for the same request: the existing payment, as a replay (200, as the endpoint
    # answers: this request created nothing); another principal, or another amount: a
    # conflict. No new key recorded.
    again, more, stranger = new_key(), new_key(), new_key()
    assert run(SCOPE, again, payment) == tombstoned.ReplayByBusinessId(
        200, created.body_text, created.resource_id
    )
    assert run(SCOPE, more, intent(f"run-{key}", 99)) == tombstoned.DuplicateBusinessId()
    assert run(OTHER, stranger, payment) == tombstoned.DuplicateBusinessId()
    assert [records_of(admin_conn, k) for k in (again, more, stranger)] == [0, 0, 0]
    assert payments_of(admin_conn, payment["request_id"]) == 1
    expire(admin_conn, key)
    expired = run(SCOPE, key, payment)
    assert isinstance(expired, tombstoned.Expired) and expired.resource_id == created.resource_id


def _deadline(idempotency: tombstoned.Idempotency, key: str, payment: dict[str, Any]) -> Any:
    with psycopg.connect(SERVICE_URL) as conn:
        found = tombstoned.lookup(conn, SCOPE, key, payment, schema=idempotency.schema)
    assert isinstance(found, tombstoned.Replay)
    return found.replay_deadline


async def test_asyncio_runner_answers_every_outcome(admin_conn: psycopg.Connection[Any]) -> None:
    async with AsyncConnectionPool(SERVICE_URL, min_size=1, max_size=2, open=False) as pool:
        idempotency = tombstoned.AsyncIdempotency(pool, schema=SCHEMA, replay_window="1 hour")
        business_id = tombstoned.AsyncBusinessId(BUSINESS_CONSTRAINT, read_payment_async)
        key = new_key()
        payment = intent(f"arun-{key}")

        async def run(key: str, payment: dict[str, Any]) -> tombstoned.Result:
            return await idempotency.execute(
                SCOPE, key, payment, create_async(payment), business_id=business_id
            )

        created = await run(key, payment)
        assert isinstance(created, tombstoned.Completed)
        replay = await run(key, payment)
        assert isinstance(replay, tombstoned.Replay) and replay.body_text == created.body_text
        assert await run(key, intent(f"arun-{key}", 1)) == tombstoned.KeyReused()
        assert await run(new_key(), payment) == tombstoned.ReplayByBusinessId(
            200, created.body_text, created.resource_id
        )
        assert await run(new_key(), intent(f"arun-{key}", 7)) == tombstoned.DuplicateBusinessId()
        expire(admin_conn, key)
        assert isinstance(await run(key, payment), tombstoned.Expired)
    assert payments_of(admin_conn, payment["request_id"]) == 1


def test_an_optional_key_absent_runs_the_handler_without_a_record(
    pool: ConnectionPool[Any], admin_conn: psycopg.Connection[Any]
) -> None:
    idempotency = tombstoned.Idempotency(pool, schema=SCHEMA)
    payment = intent(f"keyless-{new_key()}")
    done = idempotency.execute(SCOPE, None, payment, create(payment))
    assert isinstance(done, tombstoned.Completed)
    row = admin_conn.execute(
        "SELECT public.py_payment_body(p)::text FROM public.py_payments p WHERE request_id = %s",
        (payment["request_id"],),
    ).fetchone()
    assert row is not None and done.body_text == row[0], "jsonb's text, as complete() gives"
    # Without a record nothing refuses the commit (TS003): the runner does, before it.
    forgetful = intent(f"keyless-{new_key()}")
    with pytest.raises(tombstoned.ClaimNotCompleted):
        idempotency.execute(SCOPE, None, forgetful, lambda tx: None)
    assert payments_of(admin_conn, forgetful["request_id"]) == 0


def test_the_runner_refuses_a_connection_inside_a_transaction() -> None:
    with psycopg.connect(SERVICE_URL) as conn:
        conn.execute("SELECT 1")  # a transaction is open (not autocommit)
        with pytest.raises(RuntimeError, match="outside any"):
            tombstoned.Idempotency(conn, schema=SCHEMA).execute(
                SCOPE, new_key(), {}, lambda tx: None
            )


def test_a_business_id_whose_object_is_gone_runs_the_transaction_again(
    pool: ConnectionPool[Any], admin_conn: psycopg.Connection[Any]
) -> None:
    """The object was read as gone (its own transaction rolled back meanwhile): the whole
    transaction again, which then finds it; every attempt gone: RetriesExhausted."""
    idempotency = tombstoned.Idempotency(pool, schema=SCHEMA, replay_window=HOUR)
    payment = intent(f"gone-{new_key()}")
    first = idempotency.execute(SCOPE, new_key(), payment, create(payment))
    assert isinstance(first, tombstoned.Completed)
    reads: list[int] = []

    def gone_once(
        conn: psycopg.Connection[Any], scope: tombstoned.Scope, payment: dict[str, Any]
    ) -> tombstoned.BusinessRecord | None:
        reads.append(1)
        return None if len(reads) == 1 else read_payment(conn, scope, payment)

    again = idempotency.execute(
        SCOPE,
        new_key(),
        payment,
        create(payment),
        business_id=tombstoned.BusinessId(BUSINESS_CONSTRAINT, gone_once),
    )
    assert again == tombstoned.ReplayByBusinessId(200, first.body_text, first.resource_id)
    assert len(reads) == 2
    with pytest.raises(tombstoned.RetriesExhausted) as exhausted:
        idempotency.execute(
            SCOPE,
            new_key(),
            payment,
            create(payment),
            business_id=tombstoned.BusinessId(BUSINESS_CONSTRAINT, lambda *_: None),
        )
    assert exhausted.value.attempts == 3
    assert payments_of(admin_conn, payment["request_id"]) == 1


def test_a_call_overrides_the_runners_window_and_lock_timeout(
    pool: ConnectionPool[Any],
) -> None:
    idempotency = tombstoned.Idempotency(
        pool, schema=SCHEMA, replay_window="1 hour", lock_timeout="1 hour"
    )
    payment = intent(f"window-{new_key()}")
    key = new_key()
    done = idempotency.execute(SCOPE, key, payment, create(payment), replay_window="2 minutes")
    assert isinstance(done, tombstoned.Completed) and done.replay_deadline is not None
    left = done.replay_deadline - datetime.now(timezone.utc)
    assert timedelta(minutes=1) < left <= timedelta(minutes=2), left
    # A key held in flight: this call waits 50 ms, not the runner's hour.
    held = new_key()
    with psycopg.connect(SERVICE_URL) as holder:
        tombstoned.claim(holder, SCOPE, held, payment, HOUR, schema=SCHEMA)
        with pytest.raises(tombstoned.InProgress):
            idempotency.execute(
                SCOPE, held, payment, create(payment), lock_timeout="50 milliseconds"
            )
        holder.rollback()

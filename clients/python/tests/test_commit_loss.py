"""A commit whose acknowledgement is lost (a proxy cuts the connection right after forwarding
the runner's COMMIT): the runner raises OutcomeUnknown, never a failure; the business write
did commit, and the retry with the same key replays it. Sync and asyncio runners."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg

import tombstoned
from proxy import CommitCutter
from support import (
    SCHEMA,
    SCOPE,
    SERVICE_URL,
    insert_payment,
    insert_payment_async,
    intent,
    new_key,
    payments_of,
)

HOUR = timedelta(hours=1)


def check_the_loss(
    admin: psycopg.Connection[Any],
    error: BaseException,
    retried: tombstoned.Result,
    request_id: str,
) -> None:
    assert isinstance(error, tombstoned.OutcomeUnknown), repr(error)
    assert error.sqlstate is None or error.sqlstate.startswith("08")
    answer = tombstoned.http_answer(error)
    assert (answer.status, answer.headers["Retry-After"]) == (503, "1")
    assert '"type":"tag:tombstoned,2026:problem:outcome-unknown"' in answer.body
    # It did commit: the retry with the same key replays the answer nobody received.
    assert isinstance(retried, tombstoned.Replay), retried
    assert retried.status_code == 201
    assert payments_of(admin, request_id) == 1


async def test_sync_runner_commit_acknowledgement_lost(
    admin_conn: psycopg.Connection[Any],
) -> None:
    key = new_key()
    payment = intent(f"lost-{key}")

    def create(tx: tombstoned.Transaction) -> tombstoned.Completed:
        payment_id, body = insert_payment(tx.conn, SCOPE, payment)
        return tx.complete(201, body, payment_id)

    async with CommitCutter(SERVICE_URL) as proxy:

        def first_attempt() -> BaseException:
            with psycopg.connect(proxy.url(), autocommit=True) as conn:
                idempotency = tombstoned.Idempotency(conn, schema=SCHEMA, replay_window=HOUR)
                tombstoned.check_api_version(conn, schema=SCHEMA)
                proxy.armed = True
                try:
                    idempotency.execute(SCOPE, key, payment, create)
                except tombstoned.TombstonedError as e:
                    return e
                raise AssertionError("the commit's answer was lost: no result to return")

        error = await asyncio.to_thread(first_attempt)
        assert proxy.cut == 1
    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        retried = tombstoned.Idempotency(conn, schema=SCHEMA).execute(SCOPE, key, payment, create)
    check_the_loss(admin_conn, error, retried, payment["request_id"])


async def test_asyncio_runner_commit_acknowledgement_lost(
    admin_conn: psycopg.Connection[Any],
) -> None:
    key = new_key()
    payment = intent(f"alost-{key}")

    async def create(tx: tombstoned.AsyncTransaction) -> tombstoned.Completed:
        payment_id, body = await insert_payment_async(tx.conn, SCOPE, payment)
        return await tx.complete(201, body, payment_id)

    async with CommitCutter(SERVICE_URL) as proxy:
        async with await psycopg.AsyncConnection.connect(proxy.url(), autocommit=True) as conn:
            idempotency = tombstoned.AsyncIdempotency(conn, schema=SCHEMA, replay_window=HOUR)
            proxy.armed = True
            error: BaseException | None = None
            try:
                await idempotency.execute(SCOPE, key, payment, create)
            except tombstoned.TombstonedError as e:
                error = e
        assert proxy.cut == 1 and error is not None
    async with await psycopg.AsyncConnection.connect(SERVICE_URL, autocommit=True) as conn:
        retried = await tombstoned.AsyncIdempotency(conn, schema=SCHEMA).execute(
            SCOPE, key, payment, create
        )
    check_the_loss(admin_conn, error, retried, payment["request_id"])

"""Every outcome of the core calls, sync and asyncio, in the caller's own transaction: owner
(business write, event, complete), replay byte for byte, key reused, expired before and after
the daemon's cleaner tombstoned the record, lookup; the fingerprint is the server's; the
api_version() check, once per connection."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg import sql

import tombstoned
from support import (
    SCHEMA,
    SCOPE,
    SERVICE_URL,
    TENANT,
    cleanup,
    expire,
    insert_payment,
    insert_payment_async,
    intent,
    new_key,
    payments_of,
    tombstoned_record,
)
from tombstoned import aio

HOUR = timedelta(hours=1)


def reordered(doc: dict[str, Any]) -> dict[str, Any]:
    """The same intent, its keys in another order (and so another JSON text)."""
    return dict(reversed(list(doc.items())))


def stored(admin: psycopg.Connection[Any], key: str, payment: dict[str, Any]) -> tuple[Any, ...]:
    row = admin.execute(
        sql.SQL(
            "SELECT response_body::text, fingerprint = {s}.fingerprint(%s::text::jsonb)"
            " FROM {s}.idempotency_records WHERE idempotency_key = %s"
        ).format(s=sql.Identifier(SCHEMA)),
        (json.dumps(payment), key),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_every_outcome_through_the_sync_core(admin_conn: psycopg.Connection[Any]) -> None:
    key = new_key()
    payment = intent(f"core-{key}")
    with psycopg.connect(SERVICE_URL) as conn:
        assert tombstoned.lookup(conn, SCOPE, key, payment, schema=SCHEMA) is None
        conn.rollback()

        with conn.transaction():
            owner = tombstoned.claim(conn, SCOPE, key, payment, HOUR, schema=SCHEMA)
            assert isinstance(owner, tombstoned.Owner)
            assert owner.replay_deadline > datetime.now(timezone.utc) + timedelta(minutes=59)
            payment_id, body = insert_payment(conn, SCOPE, payment)
            event = tombstoned.enqueue_event(
                conn, TENANT, payment_id, "payment.created", body, schema=SCHEMA
            )
            text = tombstoned.complete(conn, SCOPE, key, 201, body, payment_id, schema=SCHEMA)
        # complete's text is jsonb's form of the body (its key order, its spacing): what every
        # replay sends.
        assert json.loads(text) == body
        assert stored(admin_conn, key, payment) == (text, True), "the fingerprint is the server's"
        events = admin_conn.execute(
            sql.SQL(
                "SELECT event_id, aggregate_id, event_type FROM {}.outbox_events"
                " WHERE event_id = %s"
            ).format(sql.Identifier(SCHEMA)),
            (event,),
        ).fetchall()
        assert events == [(event, payment_id, "payment.created")]

        # The retry, its intent spelled in another key order: the stored answer, byte for byte.
        with conn.transaction():
            replay = tombstoned.claim(conn, SCOPE, key, reordered(payment), HOUR, schema=SCHEMA)
        assert replay == tombstoned.Replay(201, text, payment_id, owner.replay_deadline)
        with conn.transaction():
            assert tombstoned.lookup(conn, SCOPE, key, payment, schema=SCHEMA) == replay

        # Another intent under the key: refused, nothing of the answer.
        other = intent(f"core-{key}", 999)
        with conn.transaction():
            reused = tombstoned.claim(conn, SCOPE, key, other, HOUR, schema=SCHEMA)
            assert reused == tombstoned.KeyReused()
            assert tombstoned.lookup(conn, SCOPE, key, other, schema=SCHEMA) == reused

        # The window over: expired (not yet tombstoned), then tombstoned by the real cleaner.
        expire(admin_conn, key)
        with conn.transaction():
            due = tombstoned.claim(conn, SCOPE, key, payment, HOUR, schema=SCHEMA)
        assert isinstance(due, tombstoned.Expired)
        assert (due.resource_id, due.expired_at) == (payment_id, None)
        assert json.loads(cleanup())["rows_tombstoned"] >= 1
        assert tombstoned_record(admin_conn, key)
        with conn.transaction():
            gone = tombstoned.claim(conn, SCOPE, key, payment, HOUR, schema=SCHEMA)
            assert tombstoned.lookup(conn, SCOPE, key, payment, schema=SCHEMA) == gone
        assert isinstance(gone, tombstoned.Expired)
        assert gone.resource_id == payment_id and gone.expired_at is not None
        with conn.transaction():
            assert tombstoned.claim(conn, SCOPE, key, other, HOUR, schema=SCHEMA) == reused
    assert payments_of(admin_conn, payment["request_id"]) == 1


async def test_every_outcome_through_the_asyncio_core(admin_conn: psycopg.Connection[Any]) -> None:
    key = new_key()
    payment = intent(f"aio-{key}")
    async with await psycopg.AsyncConnection.connect(SERVICE_URL) as conn:
        assert await aio.lookup(conn, SCOPE, key, payment, schema=SCHEMA) is None
        await conn.rollback()
        async with conn.transaction():
            owner = await aio.claim(conn, SCOPE, key, payment, "1 hour", "2 seconds", schema=SCHEMA)
            assert isinstance(owner, tombstoned.Owner)
            payment_id, body = await insert_payment_async(conn, SCOPE, payment)
            await aio.enqueue_event(
                conn, TENANT, payment_id, "payment.created", body, schema=SCHEMA
            )
            text = await aio.complete(conn, SCOPE, key, 201, body, payment_id, schema=SCHEMA)
        assert stored(admin_conn, key, payment) == (text, True)
        async with conn.transaction():
            replay = await aio.claim(conn, SCOPE, key, reordered(payment), HOUR, schema=SCHEMA)
            assert await aio.lookup(conn, SCOPE, key, payment, schema=SCHEMA) == replay
        assert replay == tombstoned.Replay(201, text, payment_id, owner.replay_deadline)
        async with conn.transaction():
            reused = await aio.claim(conn, SCOPE, key, intent("x"), HOUR, schema=SCHEMA)
        assert reused == tombstoned.KeyReused()
        expire(admin_conn, key)
        async with conn.transaction():
            due = await aio.claim(conn, SCOPE, key, payment, HOUR, schema=SCHEMA)
        assert isinstance(due, tombstoned.Expired) and due.resource_id == payment_id


def test_the_fingerprint_is_computed_by_the_server(admin_conn: psycopg.Connection[Any]) -> None:
    """A number's spelling changes the intent (1.0 is not 1): the client sends the intent as it
    is, the server fingerprints it; the client hashes nothing."""
    key = new_key()
    with psycopg.connect(SERVICE_URL) as conn:
        with conn.transaction():
            tombstoned.claim(conn, SCOPE, key, {"amount": 1}, HOUR, schema=SCHEMA)
            tombstoned.complete(conn, SCOPE, key, 200, {"ok": True}, schema=SCHEMA)
        with conn.transaction():
            assert isinstance(
                tombstoned.claim(conn, SCOPE, key, {"amount": 1.0}, HOUR, schema=SCHEMA),
                tombstoned.KeyReused,
            )
            assert isinstance(
                tombstoned.claim(conn, SCOPE, key, {"amount": 1}, HOUR, schema=SCHEMA),
                tombstoned.Replay,
            )


@pytest.fixture
def counting_schema(admin_conn: psycopg.Connection[Any]) -> str:
    """A schema whose api_version() counts its calls in a sequence and answers what the
    sequence's companion table says (1 until a test changes it)."""
    name = f"fake_api_{new_key()[2:10]}"
    admin_conn.execute(
        sql.SQL(
            """CREATE SCHEMA {s};
            CREATE SEQUENCE {s}.calls;
            CREATE TABLE {s}.answer (version integer);
            INSERT INTO {s}.answer VALUES (1);
            CREATE FUNCTION {s}.api_version() RETURNS integer LANGUAGE sql VOLATILE
                AS 'SELECT version FROM {s}.answer WHERE nextval(''{s}.calls'') > 0';
            GRANT USAGE ON SCHEMA {s} TO PUBLIC;
            GRANT SELECT ON {s}.answer TO PUBLIC;
            GRANT USAGE ON SEQUENCE {s}.calls TO PUBLIC"""
        ).format(s=sql.Identifier(name))
    )
    return name


def calls(admin: psycopg.Connection[Any], schema: str) -> int:
    row = admin.execute(
        sql.SQL("SELECT last_value FROM {}.calls").format(sql.Identifier(schema))
    ).fetchone()
    assert row is not None
    value: int = row[0]
    return value


async def test_api_version_is_asked_once_per_connection(
    admin_conn: psycopg.Connection[Any], counting_schema: str
) -> None:
    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        for _ in range(3):
            tombstoned.check_api_version(conn, schema=counting_schema)
    assert calls(admin_conn, counting_schema) == 1
    async with await psycopg.AsyncConnection.connect(SERVICE_URL, autocommit=True) as aconn:
        await aio.check_api_version(aconn, schema=counting_schema)
        await aio.check_api_version(aconn, schema=counting_schema)
    assert calls(admin_conn, counting_schema) == 2


def test_an_unknown_api_version_is_refused(
    admin_conn: psycopg.Connection[Any], counting_schema: str
) -> None:
    admin_conn.execute(
        sql.SQL("UPDATE {}.answer SET version = 2").format(sql.Identifier(counting_schema))
    )
    with psycopg.connect(SERVICE_URL, autocommit=True) as conn:
        with pytest.raises(tombstoned.UnknownApiVersion) as refused:
            tombstoned.claim(conn, SCOPE, new_key(), {}, HOUR, schema=counting_schema)
        assert refused.value.found == 2
        assert "speaks api_version() 2; this package speaks 1" in str(refused.value)
        # No schema of that name at all: the same error, saying so.
        with pytest.raises(tombstoned.UnknownApiVersion) as missing:
            tombstoned.check_api_version(conn, schema="no_such_schema")
        assert missing.value.found is None and missing.value.sqlstate == "3F000"

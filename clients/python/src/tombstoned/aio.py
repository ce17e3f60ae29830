"""The protocol's calls on a psycopg ``AsyncConnection``, inside the caller's own transaction
(asyncio: ``tombstoned.aio``; sync, the same names and arguments: ``tombstoned.core``). Each is
one statement; the database decides, these map: an outcome back, or the SQL API's error as this
package's class."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg

from . import _statements as statements
from ._calls import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_SCHEMA,
    Interval,
    claim_params,
    complete_params,
    enqueue_params,
    lookup_params,
    as_uuid,
    mapped_errors,
    missing_api,
    remember_version,
    version_checked,
)
from .outcomes import Expired, KeyReused, Outcome, Replay, Scope, lookup_outcome, outcome_from_row

Connection = psycopg.AsyncConnection[Any]


async def check_api_version(conn: Connection, *, schema: str = DEFAULT_SCHEMA) -> None:
    """Raises UnknownApiVersion unless the schema speaks this package's api_version(). Asked
    once per connection and schema; the calls below ask it themselves."""
    if version_checked(conn, schema):
        return
    with mapped_errors(), missing_api(schema):
        cursor = await conn.execute(statements.api_version(schema))
        row = await cursor.fetchone()
    remember_version(conn, schema, row)


async def claim(
    conn: Connection,
    scope: Scope,
    key: str,
    intent: object,
    replay_window: Interval,
    lock_timeout: Interval = DEFAULT_LOCK_TIMEOUT,
    *,
    schema: str = DEFAULT_SCHEMA,
) -> Outcome:
    """Claims ``key`` for this transaction, or answers from the record that holds it.
    ``intent`` is the normalised intent (JSON-serialisable); the server fingerprints it."""
    await check_api_version(conn, schema=schema)
    with mapped_errors():
        cursor = await conn.execute(
            statements.claim(schema),
            claim_params(scope, key, intent, replay_window, lock_timeout),
        )
        row = await cursor.fetchone()
    outcome = outcome_from_row(row)
    assert outcome is not None, "claim() returns one row"
    return outcome


async def complete(
    conn: Connection,
    scope: Scope,
    key: str,
    status_code: int,
    body: object,
    resource_id: str | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
) -> str:
    """Stores the owner's answer; returns the body as every replay will send it: send this."""
    await check_api_version(conn, schema=schema)
    with mapped_errors():
        cursor = await conn.execute(
            statements.complete(schema),
            complete_params(scope, key, status_code, body, resource_id),
        )
        row = await cursor.fetchone()
    assert row is not None, "complete() returns one row"
    text: str = row[0]
    return text


async def lookup(
    conn: Connection,
    scope: Scope,
    key: str,
    intent: object,
    *,
    schema: str = DEFAULT_SCHEMA,
) -> Replay | KeyReused | Expired | None:
    """What claim() would answer for a committed record, claiming nothing; None when there is
    none. Works in a read-only transaction (a standby)."""
    await check_api_version(conn, schema=schema)
    with mapped_errors():
        cursor = await conn.execute(statements.lookup(schema), lookup_params(scope, key, intent))
        row = await cursor.fetchone()
    return lookup_outcome(row)


async def enqueue_event(
    conn: Connection,
    tenant: str,
    aggregate_id: str,
    event_type: str,
    payload: object,
    *,
    schema: str = DEFAULT_SCHEMA,
) -> UUID:
    """An outbox event that commits with this transaction or not at all; returns its id (the
    ``webhook-id`` the relay delivers it under)."""
    await check_api_version(conn, schema=schema)
    with mapped_errors():
        cursor = await conn.execute(
            statements.enqueue_event(schema),
            enqueue_params(tenant, aggregate_id, event_type, payload),
        )
        row = await cursor.fetchone()
    assert row is not None, "enqueue_event() returns one row"
    return as_uuid(row[0])

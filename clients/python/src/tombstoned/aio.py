"""The protocol's calls on a psycopg ``AsyncConnection``, inside the caller's own transaction
(asyncio: ``tombstoned.aio``; sync, the same names and arguments: ``tombstoned.core``). Each is
one statement; the database decides, these map: an outcome back, or the SQL API's error as this
package's class."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

from ._calls import (
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_SCHEMA,
    Interval,
    as_uuid,
    claim_params,
    complete_params,
    enqueue_params,
    lookup_params,
    mapped_errors,
    missing_api,
    one_row,
    remember_version,
    version_checked,
)
from ._statements import in_schema
from ._trace import SET_TRACEPARENT, current_traceparent
from .outcomes import Expired, KeyReused, Outcome, Replay, Scope, lookup_outcome, outcome_from_row

Connection = psycopg.AsyncConnection[Any]


async def check_api_version(conn: Connection, *, schema: str = DEFAULT_SCHEMA) -> None:
    """Raises UnknownApiVersion unless the schema speaks this package's api_version(). Asked
    once per connection and schema; the calls below ask it themselves."""
    if version_checked(conn, schema):
        return
    with mapped_errors(), missing_api(schema):
        cursor = await conn.execute(in_schema(schema).api_version)
        row = await cursor.fetchone()
    remember_version(conn, schema, row)


async def _call(
    conn: Connection, schema: str, statement: sql.Composed, params: tuple[object, ...]
) -> tuple[Any, ...] | None:
    """One call of the SQL API: its row, or its error as this package's class."""
    await check_api_version(conn, schema=schema)
    with mapped_errors():
        cursor = await conn.execute(statement, params)
        return await cursor.fetchone()


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
    params = claim_params(scope, key, intent, replay_window, lock_timeout)
    row = await _call(conn, schema, in_schema(schema).claim, params)
    outcome = outcome_from_row(one_row(row, "claim"))
    assert outcome is not None
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
    params = complete_params(scope, key, status_code, body, resource_id)
    row = await _call(conn, schema, in_schema(schema).complete, params)
    text: str = one_row(row, "complete")[0]
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
    params = lookup_params(scope, key, intent)
    return lookup_outcome(await _call(conn, schema, in_schema(schema).lookup, params))


async def _pass_trace_context(conn: Connection) -> None:
    """The caller's active OpenTelemetry span, for the event about to be enqueued in this
    transaction (README "Traces"): one statement, only when there is one."""
    traceparent = current_traceparent()
    if traceparent is not None:
        with mapped_errors():
            await conn.execute(SET_TRACEPARENT, (traceparent,))


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
    ``webhook-id`` the relay delivers it under). With the OpenTelemetry API installed and a span
    active, the event keeps that span's trace context: its delivery continues the trace."""
    params = enqueue_params(tenant, aggregate_id, event_type, payload)
    await _pass_trace_context(conn)
    row = await _call(conn, schema, in_schema(schema).enqueue_event, params)
    return as_uuid(one_row(row, "enqueue_event")[0])

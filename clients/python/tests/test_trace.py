"""The caller's trace context (issue 40): ``enqueue_event`` stores the W3C ``traceparent`` of
the active OpenTelemetry span with the event (sync and asyncio), nothing without one. The relay
carrying it to the webhook receiver is shown end to end by tests/it/traces.rs."""

from __future__ import annotations

import secrets
from typing import Any

import psycopg
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from psycopg import sql

import tombstoned
from support import SCHEMA, SERVICE_URL, TENANT
from tombstoned import aio


def active_span() -> tuple[NonRecordingSpan, str]:
    """A span to make current (what an instrumented caller has) and its traceparent."""
    trace_id, span_id = secrets.randbits(128) | 1, secrets.randbits(64) | 1
    span = NonRecordingSpan(
        SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    )
    return span, f"00-{trace_id:032x}-{span_id:016x}-01"


def stored_traceparent(admin: psycopg.Connection[Any], event: object) -> str | None:
    row = admin.execute(
        sql.SQL("SELECT traceparent FROM {}.outbox_events WHERE event_id = %s").format(
            sql.Identifier(SCHEMA)
        ),
        (event,),
    ).fetchone()
    assert row is not None
    value: str | None = row[0]
    return value


def test_the_active_span_is_stored_with_the_event(admin_conn: psycopg.Connection[Any]) -> None:
    span, traceparent = active_span()
    with psycopg.connect(SERVICE_URL) as conn:
        with conn.transaction(), trace.use_span(span):
            traced = tombstoned.enqueue_event(
                conn, TENANT, "trace-sync", "trace.checked", {}, schema=SCHEMA
            )
        with conn.transaction():
            untraced = tombstoned.enqueue_event(
                conn, TENANT, "trace-sync", "trace.checked", {}, schema=SCHEMA
            )
    assert stored_traceparent(admin_conn, traced) == traceparent
    # Transaction-local: the next transaction, without a span, stores none.
    assert stored_traceparent(admin_conn, untraced) is None


async def test_the_active_span_is_stored_with_the_event_asyncio(
    admin_conn: psycopg.Connection[Any],
) -> None:
    span, traceparent = active_span()
    async with await psycopg.AsyncConnection.connect(SERVICE_URL) as conn:
        async with conn.transaction():
            with trace.use_span(span):
                traced = await aio.enqueue_event(
                    conn, TENANT, "trace-aio", "trace.checked", {}, schema=SCHEMA
                )
    assert stored_traceparent(admin_conn, traced) == traceparent

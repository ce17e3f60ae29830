"""The caller's trace context, for the relay (issue 40): ``enqueue_event`` first sets the
transaction-local ``tombstoned.traceparent`` to the W3C ``traceparent`` of the caller's active
OpenTelemetry span, so the relay's delivery of the event continues the caller's trace and the
webhook receiver gets a ``traceparent`` of it. Only when the OpenTelemetry API package
(``opentelemetry-api``) is installed and a valid span is current; otherwise nothing is sent."""

from __future__ import annotations

from psycopg import sql

try:
    from opentelemetry import trace as _otel
except ImportError:  # optional: without it there is never a trace context to pass on
    _otel = None  # type: ignore[assignment]

#: The setting, for this transaction only (``is_local``): it ends with the COMMIT or ROLLBACK.
SET_TRACEPARENT = sql.SQL("SELECT set_config('tombstoned.traceparent', %s, true)")


def current_traceparent() -> str | None:
    """The active OpenTelemetry span as a W3C ``traceparent`` (version 00), or None."""
    if _otel is None:
        return None
    context = _otel.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"

"""The HTTP answer to every result and error, exactly as tombstoned's own endpoint gives it
(clients/answers.json in the repository holds the table; the tests compare with it), and the
Idempotency-Key header's validation. One place, so every adapter answers alike."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .errors import (
    DatabaseUnavailable,
    InProgress,
    InvalidIdempotencyKey,
    InvalidRequest,
    OutcomeUnknown,
    OutOfResources,
    ReadOnly,
    RetriesExhausted,
    SerializationFailure,
    TombstonedError,
)
from .outcomes import (
    Completed,
    DuplicateBusinessId,
    Expired,
    KeyReused,
    Replay,
    ReplayByBusinessId,
    Result,
)

#: The prefix of every problem ``type`` (RFC 9457), as the endpoint's.
PROBLEM_TYPE_PREFIX = "tag:tombstoned,2026:problem:"
JSON = "application/json"
PROBLEM_JSON = "application/problem+json"

#: A resource's URL from its resource_id (the route's), for Location and the 410's members.
ResourceUrl = Callable[[str], str]


@dataclass(frozen=True)
class HttpAnswer:
    """An HTTP answer: send the status, these headers and this text (UTF-8) as they are."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""


@dataclass(frozen=True)
class _Problem:
    status: int
    name: str
    title: str


# The details are the Node client's, word for word: the two answer alike.
_KEY_REUSED = _Problem(
    422, "idempotency-key-reused", "This idempotency key was used for a different request"
)
_EXPIRED = _Problem(
    410, "replay-window-expired", "The replay window of this idempotency key is over"
)
_DUPLICATE = _Problem(409, "duplicate-request-id", "This request_id already has a different order")
_IN_PROGRESS = _Problem(
    409, "request-in-progress", "A request with this idempotency key is in progress"
)
_INVALID_KEY = _Problem(
    400, "invalid-idempotency-key", "The Idempotency-Key header is missing or invalid"
)
_UNAVAILABLE = _Problem(503, "database-unavailable", "The database is unavailable")
_OUTCOME_UNKNOWN = _Problem(503, "outcome-unknown", "The outcome of this request is unknown")
_INTERNAL = _Problem(500, "internal-error", "Internal error")


def problem(
    kind: _Problem,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    members: dict[str, object] | None = None,
) -> HttpAnswer:
    document: dict[str, object] = {
        "type": PROBLEM_TYPE_PREFIX + kind.name,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
        **(members or {}),
    }
    return HttpAnswer(
        kind.status,
        {"Content-Type": PROBLEM_JSON, **(headers or {})},
        json.dumps(document, separators=(",", ":"), ensure_ascii=False),
    )


def http_answer(
    result: Result | TombstonedError,
    *,
    resource_url: ResourceUrl | None = None,
    resource_name: str = "resource",
) -> HttpAnswer:
    """The HTTP answer to a runner's result or to an error. ``resource_url`` gives Location and
    the 410's ``<resource_name>_url``; ``resource_name`` names the 410's members
    (``resource_id``, ``resource_url`` by default; ``"order"`` gives the endpoint's own
    ``order_id`` and ``order_url``)."""

    def location(resource_id: str | None) -> dict[str, str]:
        if resource_url is None or resource_id is None:
            return {}
        return {"Location": resource_url(resource_id)}

    if isinstance(result, Completed):
        return HttpAnswer(
            result.status_code,
            {"Content-Type": JSON, **location(result.resource_id)},
            result.body_text,
        )
    if isinstance(result, (Replay, ReplayByBusinessId)):
        return HttpAnswer(
            result.status_code,
            {
                "Content-Type": JSON,
                "Idempotent-Replayed": "true",
                **location(result.resource_id),
            },
            result.body_text,
        )
    if isinstance(result, KeyReused):
        return problem(
            _KEY_REUSED,
            "This idempotency key was first used for a request with different parameters. "
            "A new request needs a new key.",
        )
    if isinstance(result, Expired):
        headers = location(result.resource_id)
        members: dict[str, object] = {f"{resource_name}_id": result.resource_id}
        if "Location" in headers:
            members[f"{resource_name}_url"] = headers["Location"]
        return problem(
            _EXPIRED,
            "The stored response for this idempotency key is past its replay window and is no "
            "longer kept. The request was not executed again; look the resource up instead.",
            headers=headers,
            members=members,
        )
    if isinstance(result, DuplicateBusinessId):
        return problem(_DUPLICATE, "This business id already belongs to another request.")
    return _error_answer(result)


def _error_answer(error: TombstonedError) -> HttpAnswer:
    retry = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else {}
    if isinstance(error, InProgress):
        return problem(
            _IN_PROGRESS,
            "A request with this idempotency key is still in progress: retry with the same key.",
            headers=retry,
        )
    if isinstance(error, InvalidIdempotencyKey):
        return problem(_INVALID_KEY, str(error))
    if isinstance(error, InvalidRequest):
        kind = _Problem(error.status, error.problem, error.title)
        return problem(kind, str(error), headers=error.headers, members=error.members)
    if isinstance(error, ReadOnly):
        return problem(
            _UNAVAILABLE,
            "The database accepts no writes now; nothing was done. Retry with the same key.",
            headers=retry,
        )
    if isinstance(error, DatabaseUnavailable):
        return problem(
            _UNAVAILABLE,
            "The database is unavailable; nothing was done. Retry with the same key.",
            headers=retry,
        )
    if isinstance(error, OutOfResources):
        return problem(
            _UNAVAILABLE, "The database is out of resources; nothing was done.", headers=retry
        )
    if isinstance(error, (RetriesExhausted, SerializationFailure)):
        return problem(
            _UNAVAILABLE,
            "The database is busy; nothing was done. Retry with the same key.",
            headers=retry,
        )
    if isinstance(error, OutcomeUnknown):
        return problem(
            _OUTCOME_UNKNOWN,
            "The connection failed after the request was sent to the database: it may have "
            "been done. Retry with the same key to learn its outcome.",
            headers=retry,
        )
    # The rest are bugs of the caller or of its set-up (22023, TS002-TS005, 42501, an unknown
    # api_version()): nothing of them is the client's business.
    return problem(_INTERNAL, "Internal error.")


def _visible_ascii(key: str) -> bool:
    return 1 <= len(key) <= 255 and all("\x21" <= c <= "\x7e" for c in key)


def read_idempotency_key(values: Sequence[str], *, key_optional: bool = False) -> str | None:
    """The Idempotency-Key from a request's header values: exactly one, 1–255 visible ASCII
    characters (0x21–0x7E). None when absent and ``key_optional``; otherwise
    InvalidIdempotencyKey (400, before any transaction)."""
    if len(values) > 1:
        raise InvalidIdempotencyKey("Send exactly one Idempotency-Key header.")
    if not values:
        if key_optional:
            return None
        raise InvalidIdempotencyKey("This request needs an Idempotency-Key header.")
    if not _visible_ascii(values[0]):
        raise InvalidIdempotencyKey(
            "The Idempotency-Key must be 1 to 255 visible ASCII characters."
        )
    return values[0]

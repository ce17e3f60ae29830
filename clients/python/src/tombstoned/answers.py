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
class Answer:
    """An HTTP answer: send the status, these headers and this text (UTF-8) as they are."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: str = ""


@dataclass(frozen=True)
class _Problem:
    status: int
    name: str
    title: str
    detail: str


_KEY_REUSED = _Problem(
    422,
    "idempotency-key-reused",
    "This idempotency key was used for a different request",
    "use a new idempotency key for a new request",
)
_EXPIRED = _Problem(
    410,
    "replay-window-expired",
    "The replay window of this idempotency key is over",
    "the request was answered before and is never executed again: look the resource up",
)
_DUPLICATE = _Problem(
    409,
    "duplicate-request-id",
    "This request_id already has a different order",
    "the business id of this request names another object",
)
_IN_PROGRESS = _Problem(
    409,
    "request-in-progress",
    "A request with this idempotency key is in progress",
    "retry later with the same idempotency key",
)
_INVALID_KEY = _Problem(
    400,
    "invalid-idempotency-key",
    "The Idempotency-Key header is missing or invalid",
    "send one Idempotency-Key header of 1 to 255 visible ASCII characters",
)
_UNAVAILABLE = _Problem(
    503,
    "database-unavailable",
    "The database is unavailable",
    "retry later with the same idempotency key",
)
_OUTCOME_UNKNOWN = _Problem(
    503,
    "outcome-unknown",
    "The outcome of this request is unknown",
    "the connection was lost while committing: retry with the same idempotency key",
)
_INTERNAL = _Problem(500, "internal-error", "Internal error", "internal error")


def problem(
    kind: _Problem,
    *,
    headers: dict[str, str] | None = None,
    members: dict[str, object] | None = None,
) -> Answer:
    document: dict[str, object] = {
        "type": PROBLEM_TYPE_PREFIX + kind.name,
        "title": kind.title,
        "status": kind.status,
        "detail": kind.detail,
        **(members or {}),
    }
    return Answer(
        kind.status,
        {"Content-Type": PROBLEM_JSON, **(headers or {})},
        json.dumps(document, separators=(",", ":"), ensure_ascii=False),
    )


def answer(
    result: Result | TombstonedError,
    *,
    resource_url: ResourceUrl | None = None,
    resource_name: str | None = None,
) -> Answer:
    """The HTTP answer to a runner's result or to an error. ``resource_url`` gives Location and
    the 410's ``resource_url``; ``resource_name`` (e.g. ``"payment"``) adds ``payment_id`` and
    ``payment_url`` beside ``resource_id`` and ``resource_url`` in the 410, as the endpoint's
    410 says ``order_id`` and ``order_url``."""

    def location(resource_id: str | None) -> dict[str, str]:
        if resource_url is None or resource_id is None:
            return {}
        return {"Location": resource_url(resource_id)}

    if isinstance(result, Completed):
        return Answer(
            result.status_code,
            {"Content-Type": JSON, **location(result.resource_id)},
            result.body_text,
        )
    if isinstance(result, (Replay, ReplayByBusinessId)):
        return Answer(
            result.status_code,
            {
                "Content-Type": JSON,
                "Idempotent-Replayed": "true",
                **location(result.resource_id),
            },
            result.body_text,
        )
    if isinstance(result, KeyReused):
        return problem(_KEY_REUSED)
    if isinstance(result, Expired):
        members: dict[str, object] = {"resource_id": result.resource_id}
        url = location(result.resource_id).get("Location")
        if url is not None:
            members["resource_url"] = url
        if resource_name:
            members[f"{resource_name}_id"] = result.resource_id
            if url is not None:
                members[f"{resource_name}_url"] = url
        return problem(_EXPIRED, headers=location(result.resource_id), members=members)
    if isinstance(result, DuplicateBusinessId):
        return problem(_DUPLICATE)
    return _error_answer(result)


def _error_answer(error: TombstonedError) -> Answer:
    retry = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else {}
    if isinstance(error, InProgress):
        return problem(_IN_PROGRESS, headers=retry)
    if isinstance(error, InvalidIdempotencyKey):
        return problem(_INVALID_KEY)
    if isinstance(error, OutcomeUnknown):
        return problem(_OUTCOME_UNKNOWN, headers=retry)
    if isinstance(
        error,
        (ReadOnly, DatabaseUnavailable, OutOfResources, RetriesExhausted, SerializationFailure),
    ):
        return problem(_UNAVAILABLE, headers=retry)
    # The rest are bugs of the caller or of its set-up (22023, TS002-TS005, 42501, an unknown
    # api_version()): nothing of them is the client's business.
    return problem(_INTERNAL)


def _visible_ascii(key: str) -> bool:
    return 1 <= len(key) <= 255 and all("\x21" <= c <= "\x7e" for c in key)


def read_idempotency_key(values: Sequence[str], *, required: bool = True) -> str | None:
    """The Idempotency-Key from a request's header values: exactly one, 1–255 visible ASCII
    characters (0x21–0x7E). None when absent and not ``required``; otherwise
    InvalidIdempotencyKey (400, before any transaction)."""
    if not values and not required:
        return None
    if len(values) != 1 or not _visible_ascii(values[0]):
        raise InvalidIdempotencyKey("the Idempotency-Key header is missing or invalid")
    return values[0]

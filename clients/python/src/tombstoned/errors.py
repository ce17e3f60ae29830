"""The errors of tombstoned's SQL API, one class per SQLSTATE under TombstonedError, and the
one function that classifies a database error. Classification is by SQLSTATE only, never by
message text (psycopg raises tombstoned's own ``TS…`` states as a generic DatabaseError)."""

from __future__ import annotations

import re

import psycopg


class TombstonedError(Exception):
    """Every error this package raises. ``sqlstate`` is the database's, when there was one."""

    #: Seconds a client should wait before retrying with the same key, where retrying helps.
    retry_after: int | None = None

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class InProgress(TombstonedError):
    """55P03: the key's owner was still in flight after lock_timeout. Retry with the same key."""

    retry_after = 1


class InvalidArgument(TombstonedError):
    """22023: an argument the caller should have validated. ``argument`` names it (display
    only: the message starts ``invalid argument <name>:``)."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message, sqlstate=sqlstate)
        named = re.match(r"invalid argument (\w+):", message)
        self.argument: str | None = named.group(1) if named else None


class NotClaimed(TombstonedError):
    """TS002: complete() without an unfinished claim of the key in this transaction."""


class ClaimNotCompleted(TombstonedError):
    """TS003: COMMIT of a claim never completed; the whole transaction was rolled back."""


class ClaimedTwice(TombstonedError):
    """TS004: the key claimed a second time in one transaction before complete()."""


class WrongIsolation(TombstonedError):
    """TS005: a claim outside READ COMMITTED (the endpoint's internal functions refuse it)."""


class SerializationFailure(TombstonedError):
    """40001 / 40P01: the whole transaction must run again (the runners do, a bounded number
    of times)."""

    retry_after = 1


class RetriesExhausted(TombstonedError):
    """Every attempt of the transaction met 40001 / 40P01. Retry later with the same key."""

    retry_after = 1

    def __init__(self, attempts: int, *, sqlstate: str | None = None) -> None:
        super().__init__(
            f"the transaction had to run again on each of its {attempts} attempts",
            sqlstate=sqlstate,
        )
        self.attempts = attempts


class ReadOnly(TombstonedError):
    """25006: a read-only transaction or server (a standby, mid-failover)."""

    retry_after = 2


class OutcomeUnknown(TombstonedError):
    """The connection was lost after COMMIT was sent: the transaction may or may not have
    committed. Never "failed": retry with the same key, which replays or runs it."""

    retry_after = 1


class DatabaseUnavailable(TombstonedError):
    """No usable connection before COMMIT (class 08, 57P01–57P03, a pool timeout): nothing
    was committed."""

    retry_after = 2


class OutOfResources(TombstonedError):
    """Class 53: the server is out of a resource (connections, disk, memory)."""

    retry_after = 10


class NotAllowed(TombstonedError):
    """42501: the service role lacks a privilege (a table of tombstoned's schema, or an
    operation it was not granted)."""


class UnknownApiVersion(TombstonedError):
    """The schema's api_version() is not the one this package speaks, or there is none."""

    def __init__(self, message: str, *, found: int | None, sqlstate: str | None = None) -> None:
        super().__init__(message, sqlstate=sqlstate)
        self.found = found


class InvalidIdempotencyKey(TombstonedError):
    """The Idempotency-Key header is missing, repeated, or not 1–255 visible ASCII
    characters. Raised before any transaction: no key is consumed."""


class InvalidRequest(TombstonedError):
    """A request refused before any transaction (raised by a route's ``caller`` or ``intent``):
    it consumes no key. Answered as an RFC 9457 problem: ``status`` (a 4xx), the problem's
    ``problem`` name and ``title``, the message as its detail, ``members`` added to it, and
    ``headers`` (a 401's ``WWW-Authenticate``)."""

    def __init__(
        self,
        detail: str,
        *,
        status: int = 400,
        problem: str = "validation-failed",
        title: str = "One or more fields are invalid",
        members: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.problem = problem
        self.title = title
        self.members: dict[str, object] = dict(members or {})
        self.headers: dict[str, str] = dict(headers or {})


_BY_SQLSTATE: dict[str, type[TombstonedError]] = {
    "55P03": InProgress,
    "22023": InvalidArgument,
    "TS002": NotClaimed,
    "TS003": ClaimNotCompleted,
    "TS004": ClaimedTwice,
    "TS005": WrongIsolation,
    "40001": SerializationFailure,
    "40P01": SerializationFailure,
    "25006": ReadOnly,
    "42501": NotAllowed,
    "57P01": DatabaseUnavailable,  # admin_shutdown
    "57P02": DatabaseUnavailable,  # crash_shutdown
    "57P03": DatabaseUnavailable,  # cannot_connect_now
}

_BY_CLASS: dict[str, type[TombstonedError]] = {
    "08": DatabaseUnavailable,
    "53": OutOfResources,
}

#: At COMMIT these leave the outcome unknown: the server may have committed before the
#: connection went.
_UNKNOWN_AT_COMMIT = {"57P01", "57P02", "57P03"}


def database_error(error: BaseException) -> psycopg.Error | None:
    """The psycopg error behind ``error``: itself, or its cause (a framework's wrapper, e.g.
    django.db.utils.OperationalError, keeps it there)."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, psycopg.Error):
            return seen
        seen = seen.__cause__
    return None


def classify(error: BaseException, *, at_commit: bool = False) -> TombstonedError | None:
    """The TombstonedError for ``error``, or None when it is none of the SQL API's (a business
    error, a bug: the caller lets it propagate). ``at_commit``: the error came from COMMIT,
    after it was sent."""
    if isinstance(error, TombstonedError):
        return error
    db = database_error(error)
    if db is None:
        return None
    sqlstate = db.sqlstate
    message = str(db.diag.message_primary or db)
    if at_commit and (
        sqlstate is None or sqlstate.startswith("08") or sqlstate in _UNKNOWN_AT_COMMIT
    ):
        return OutcomeUnknown(
            f"the connection was lost at COMMIT: the outcome is unknown ({message})",
            sqlstate=sqlstate,
        )
    if sqlstate is None:
        # No SQLSTATE: the connection failed or broke (psycopg_pool's PoolTimeout is one too).
        if isinstance(db, psycopg.OperationalError):
            return DatabaseUnavailable(f"the database is unavailable: {message}")
        return None
    kind = _BY_SQLSTATE.get(sqlstate) or _BY_CLASS.get(sqlstate[:2])
    if kind is None:
        return None
    return kind(message, sqlstate=sqlstate)

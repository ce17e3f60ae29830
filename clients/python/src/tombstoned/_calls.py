"""What the sync and the asyncio calls share: their parameters, the api_version() bookkeeping,
and the mapping of the database's errors to this package's."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

from .errors import UnknownApiVersion, classify, database_error
from .outcomes import Scope

#: The api_version() of the SQL API this package speaks.
API_VERSION = 1

#: Where `tombstoned migrate` installs the functions unless configured otherwise.
DEFAULT_SCHEMA = "tombstoned"
#: How long claim() waits for an in-flight owner of the key (the SQL function's default).
DEFAULT_LOCK_TIMEOUT = timedelta(seconds=2)
#: How long a key replays its answer, unless the runner is told otherwise.
DEFAULT_REPLAY_WINDOW = timedelta(hours=24)

#: An interval: a timedelta, or PostgreSQL's own spelling ("24 hours", "2 seconds").
Interval = timedelta | str

# The schemas whose api_version() each connection has checked (weak: a closed connection that
# is collected takes its entry along).
_checked: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def version_checked(conn: object, schema: str) -> bool:
    return schema in _checked.get(conn, ())


def remember_version(conn: object, schema: str, row: tuple[Any, ...] | None) -> None:
    """Records a good api_version() answer; raises UnknownApiVersion on any other."""
    found = row[0] if row else None
    if found != API_VERSION:
        raise UnknownApiVersion(
            f"schema {schema!r} speaks api_version() {found}; this package speaks "
            f"{API_VERSION}: upgrade the package or the schema (tombstoned migrate)",
            found=found,
        )
    _checked.setdefault(conn, set()).add(schema)


@contextmanager
def missing_api(schema: str) -> Iterator[None]:
    """A schema without api_version() (not migrated, or the wrong name) is an unknown version."""
    try:
        yield
    except psycopg.Error as e:
        if e.sqlstate in ("3F000", "42883"):  # invalid_schema_name, undefined_function
            raise UnknownApiVersion(
                f"no tombstoned SQL API in schema {schema!r} (run tombstoned migrate, or name "
                "the schema it was installed in)",
                found=None,
                sqlstate=e.sqlstate,
            ) from e
        raise


@contextmanager
def mapped_errors() -> Iterator[None]:
    """Re-raises the SQL API's errors as this package's classes (the cause kept); any other
    error unchanged."""
    try:
        yield
    except psycopg.Error as e:
        mapped = classify(e)
        if mapped is None:
            raise
        raise mapped from e


def claim_params(
    scope: Scope, key: str, intent: object, replay_window: Interval, lock_timeout: Interval
) -> tuple[object, ...]:
    return (
        scope.tenant,
        scope.principal,
        scope.operation,
        key,
        Jsonb(intent),
        replay_window,
        lock_timeout,
    )


def complete_params(
    scope: Scope, key: str, status_code: int, body: object, resource_id: str | None
) -> tuple[object, ...]:
    return (
        scope.tenant,
        scope.principal,
        scope.operation,
        key,
        status_code,
        Jsonb(body),
        resource_id,
    )


def lookup_params(scope: Scope, key: str, intent: object) -> tuple[object, ...]:
    return (scope.tenant, scope.principal, scope.operation, key, Jsonb(intent))


def enqueue_params(
    tenant: str, aggregate_id: str, event_type: str, payload: object
) -> tuple[object, ...]:
    return (tenant, aggregate_id, event_type, Jsonb(payload))


def one_row(row: tuple[Any, ...] | None, function: str) -> tuple[Any, ...]:
    """The one row a function of the SQL API returns (none would be a schema this package does
    not speak)."""
    if row is None:
        raise UnknownApiVersion(f"{function}() returned no row", found=None)
    return row


def as_uuid(value: object) -> UUID:
    """A uuid column as a UUID, whatever loader the connection has (Django's returns one too)."""
    return value if isinstance(value, UUID) else UUID(str(value))


def unique_violation(error: BaseException) -> str | None:
    """The constraint of a unique violation (23505) behind ``error``, else None."""
    db = database_error(error)
    if db is None or db.sqlstate != "23505":
        return None
    return db.diag.constraint_name

"""Every statement this package sends, in one place: the calls of tombstoned's SQL API
(docs/api.md, "The SQL API"), each parameterised, with the schema as a quoted identifier."""

from __future__ import annotations

from functools import lru_cache

from psycopg import sql

#: The first statement of every transaction the runners open: the protocol's level, whatever
#: the server's or the pool's default is (a claim that waited must read the winner's row in a
#: new statement, which only READ COMMITTED gives).
START = sql.SQL("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

#: The owner's answer of a route whose key is optional and absent: jsonb's text form, as
#: complete() would have stored it, without a record.
JSONB_TEXT = sql.SQL("SELECT %s::jsonb::text")

_OUTCOME_COLUMNS = "outcome, status_code, response_body, resource_id, replay_deadline, expired_at"


def _in(schema: str, template: str) -> sql.Composed:
    return sql.SQL(template).format(s=sql.Identifier(schema))


@lru_cache(maxsize=None)
def api_version(schema: str) -> sql.Composed:
    return _in(schema, "SELECT {s}.api_version()")


@lru_cache(maxsize=None)
def claim(schema: str) -> sql.Composed:
    # The fingerprint is computed by the server from the intent: no client hashes anything.
    return _in(
        schema,
        f"SELECT {_OUTCOME_COLUMNS} FROM {{s}}.claim(%s, %s, %s, %s, "
        "{s}.fingerprint(%s::jsonb), %s::interval, %s::interval)",
    )


@lru_cache(maxsize=None)
def complete(schema: str) -> sql.Composed:
    return _in(schema, "SELECT {s}.complete(%s, %s, %s, %s, %s, %s::jsonb, %s)")


@lru_cache(maxsize=None)
def lookup(schema: str) -> sql.Composed:
    return _in(
        schema,
        f"SELECT {_OUTCOME_COLUMNS} FROM {{s}}.lookup(%s, %s, %s, %s, "
        "{s}.fingerprint(%s::jsonb))",
    )


@lru_cache(maxsize=None)
def enqueue_event(schema: str) -> sql.Composed:
    return _in(schema, "SELECT {s}.enqueue_event(%s, %s, %s, %s::jsonb)")

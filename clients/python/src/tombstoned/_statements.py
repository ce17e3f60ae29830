"""Every statement this package sends, in one place: the calls of tombstoned's SQL API
(docs/api.md, "The SQL API"), each parameterised, with the schema as a quoted identifier."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from psycopg import sql

#: The first statement of every transaction the runners open: the protocol's level, whatever
#: the server's or the pool's default is (a claim that waited must read the winner's row in a
#: new statement, which only READ COMMITTED gives).
START = sql.SQL("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

#: The owner's answer of a route whose key is optional and absent: jsonb's text form, as
#: complete() would have stored it, without a record.
JSONB_TEXT = sql.SQL("SELECT %s::jsonb::text")

_OUTCOME = "outcome, status_code, response_body, resource_id, replay_deadline, expired_at"


@dataclass(frozen=True)
class Statements:
    """The SQL API's calls in one schema. The fingerprint is computed by the server from the
    intent: no client hashes anything."""

    api_version: sql.Composed
    claim: sql.Composed
    complete: sql.Composed
    lookup: sql.Composed
    enqueue_event: sql.Composed


@cache
def in_schema(schema: str) -> Statements:
    def composed(template: str) -> sql.Composed:
        return sql.SQL(template).format(s=sql.Identifier(schema))

    return Statements(
        api_version=composed("SELECT {s}.api_version()"),
        claim=composed(
            f"SELECT {_OUTCOME} FROM {{s}}.claim(%s, %s, %s, %s, {{s}}.fingerprint(%s::jsonb),"
            " %s::interval, %s::interval)"
        ),
        complete=composed("SELECT {s}.complete(%s, %s, %s, %s, %s, %s::jsonb, %s)"),
        lookup=composed(
            f"SELECT {_OUTCOME} FROM {{s}}.lookup(%s, %s, %s, %s, {{s}}.fingerprint(%s::jsonb))"
        ),
        enqueue_event=composed("SELECT {s}.enqueue_event(%s, %s, %s, %s::jsonb)"),
    )

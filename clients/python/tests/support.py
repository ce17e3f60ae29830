"""What the tests share: the database tests/it/clients_python.rs prepared (a fresh database
migrated by the daemon, a service role with the documented grants), read from the variables
clients/python/README.md ("Tests") lists; the business table the tests' handlers write; the
daemon's cleaner; and the barriers the concurrency tests wait on (pg_stat_activity, never
sleeps that hope a race happened)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

import tombstoned

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

#: Every operation the suite claims under.
OPERATION = "create-payment"
#: An operation no role of the suite holds (a call in it is refused: 42501).
NOT_GRANTED = "refund-payment"
TENANT = "acme"
PRINCIPAL = "billing"
SCOPE = tombstoned.Scope(TENANT, PRINCIPAL, OPERATION)

#: How long a barrier waits for what it expects before the test fails.
PATIENCE = 60.0

VARIABLES = (
    "TOMBSTONED_BIN",
    "TOMBSTONED_TEST_CONFIG",
    "TOMBSTONED_TEST_ADMIN_URL",
    "TOMBSTONED_TEST_SERVICE_URL",
    "TOMBSTONED_TEST_SERVICE_ROLE",
    "TOMBSTONED_TEST_SCHEMA",
)


BIN = os.environ.get("TOMBSTONED_BIN", "")
CONFIG = os.environ.get("TOMBSTONED_TEST_CONFIG", "")
ADMIN_URL = os.environ.get("TOMBSTONED_TEST_ADMIN_URL", "")
SERVICE_URL = os.environ.get("TOMBSTONED_TEST_SERVICE_URL", "")
SERVICE_ROLE = os.environ.get("TOMBSTONED_TEST_SERVICE_ROLE", "")
SCHEMA = os.environ.get("TOMBSTONED_TEST_SCHEMA", "")

#: The business table of the tests' handlers: the service's own, owned by the service role.
#: Its unique request_id is the second line of defence (the 23505 hook).
BUSINESS_TABLE = """
CREATE TABLE IF NOT EXISTS public.py_payments (
    payment_id   uuid        NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
    tenant_id    text        NOT NULL,
    principal_id text        NOT NULL,
    request_id   text        NOT NULL,
    amount_minor bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT py_payments_request_id_key UNIQUE (tenant_id, request_id)
);
CREATE OR REPLACE FUNCTION public.py_payment_body(p public.py_payments) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$ SELECT jsonb_build_object('payment_id', p.payment_id, 'request_id', p.request_id,
                                    'amount_minor', p.amount_minor, 'status', 'created') $$"""
BUSINESS_CONSTRAINT = "py_payments_request_id_key"


def set_up_role(
    conn: psycopg.Connection[Any], role: str, operation: str | None = OPERATION
) -> None:
    """What a service role of this suite gets: the README's two GRANTs and its operation, granted
    through the daemon's own command (tests/it/clients_support.rs gave both to the main role
    already; repeating them changes nothing); None grants it no operation. The one place of a
    role's set-up."""
    conn.execute(
        sql.SQL(
            "GRANT USAGE ON SCHEMA {s} TO {r}; GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {s} TO {r}"
        ).format(s=sql.Identifier(SCHEMA), r=sql.Identifier(role))
    )
    if operation is not None:
        subprocess.run(
            [BIN, "--config", CONFIG, "operations", "grant", operation, role],
            check=True,
            capture_output=True,
        )


def service_url(**overrides: Any) -> str:
    """The service role's URL with connection parameters changed (application_name, host...)."""
    return make_conninfo(SERVICE_URL, **overrides)


def role_url(role: str, password: str) -> str:
    return make_conninfo(SERVICE_URL, user=role, password=password)


def admin() -> psycopg.Connection[Any]:
    return psycopg.connect(ADMIN_URL, autocommit=True)


def new_key() -> str:
    return f"k-{uuid.uuid4().hex}"


def intent(request_id: str, amount_minor: int = 1250) -> dict[str, Any]:
    return {"v": 1, "request_id": request_id, "amount_minor": amount_minor, "currency": "EUR"}


#: The tests' business write: one payment, and its representation as jsonb (a dict here).
INSERT_PAYMENT = """INSERT INTO public.py_payments AS p
    (tenant_id, principal_id, request_id, amount_minor)
VALUES (%s, %s, %s, %s)
RETURNING p.payment_id::text, public.py_payment_body(p)"""

#: The payment a business id names, and whether it is this caller's same request.
FIND_PAYMENT = """SELECT p.principal_id = %s AND p.amount_minor = %s,
       public.py_payment_body(p)::text, p.payment_id::text
  FROM public.py_payments AS p WHERE p.tenant_id = %s AND p.request_id = %s"""


def found_payment(row: tuple[Any, ...] | None) -> tombstoned.BusinessRecord | None:
    return tombstoned.BusinessRecord(*row) if row is not None else None


def find_params(scope: tombstoned.Scope, payment: dict[str, Any]) -> tuple[object, ...]:
    return (scope.principal, payment["amount_minor"], scope.tenant, payment["request_id"])


def read_payment(
    conn: psycopg.Connection[Any], scope: tombstoned.Scope, payment: dict[str, Any]
) -> tombstoned.BusinessRecord | None:
    """The 23505 hook's read: the payment that holds the request_id, or None."""
    return found_payment(conn.execute(FIND_PAYMENT, find_params(scope, payment)).fetchone())


async def read_payment_async(
    conn: psycopg.AsyncConnection[Any], scope: tombstoned.Scope, payment: dict[str, Any]
) -> tombstoned.BusinessRecord | None:
    cursor = await conn.execute(FIND_PAYMENT, find_params(scope, payment))
    return found_payment(await cursor.fetchone())


def insert_payment(
    conn: psycopg.Connection[Any], scope: tombstoned.Scope, payment: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The business write of ``payment`` (an intent of :func:`intent`): its id and body."""
    row = conn.execute(
        INSERT_PAYMENT,
        (scope.tenant, scope.principal, payment["request_id"], payment["amount_minor"]),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


async def insert_payment_async(
    conn: psycopg.AsyncConnection[Any], scope: tombstoned.Scope, payment: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    cursor = await conn.execute(
        INSERT_PAYMENT,
        (scope.tenant, scope.principal, payment["request_id"], payment["amount_minor"]),
    )
    row = await cursor.fetchone()
    assert row is not None
    return row[0], row[1]


def count(conn: psycopg.Connection[Any], query: str | sql.Composed, *params: object) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    value: int = row[0]
    return value


def payments_of(conn: psycopg.Connection[Any], request_id: str) -> int:
    return count(conn, "SELECT count(*) FROM public.py_payments WHERE request_id = %s", request_id)


def records_of(conn: psycopg.Connection[Any], key: str) -> int:
    return count(
        conn,
        sql.SQL("SELECT count(*) FROM {}.idempotency_records WHERE idempotency_key = %s").format(
            sql.Identifier(SCHEMA)
        ),
        key,
    )


def wait_for_lock_waits(
    conn: psycopg.Connection[Any], application_name: str, waiting: int = 1
) -> list[int]:
    """Polls pg_stat_activity until ``waiting`` sessions of ``application_name`` in this
    database wait on a lock; returns their pids (oldest wait first)."""
    deadline = time.monotonic() + PATIENCE
    while True:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database() AND wait_event_type = 'Lock'"
            " ORDER BY state_change",
            (application_name,),
        ).fetchall()
        if len(rows) >= waiting:
            return [pid for (pid,) in rows]
        assert time.monotonic() < deadline, (
            f"{waiting} session(s) of {application_name} never waited on a lock"
        )
        time.sleep(0.005)


def wait_for_pid_lock_wait(conn: psycopg.Connection[Any], pid: int) -> None:
    """Polls pg_stat_activity until backend ``pid`` waits on a lock."""
    deadline = time.monotonic() + PATIENCE
    while True:
        row = conn.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row and row[0]:
            return
        assert time.monotonic() < deadline, f"backend {pid} never waited on a lock"
        time.sleep(0.005)


def blocked_by(conn: psycopg.Connection[Any], pid: int) -> list[int]:
    row = conn.execute("SELECT pg_blocking_pids(%s)", (pid,)).fetchone()
    assert row is not None
    pids: list[int] = row[0]
    return pids


def expire(conn: psycopg.Connection[Any], key: str) -> None:
    """Moves the key's replay window into the past (the cleaner then finds it due)."""
    conn.execute(
        sql.SQL(
            "UPDATE {}.idempotency_records SET replay_deadline = clock_timestamp() - interval '1 s'"
            " WHERE idempotency_key = %s"
        ).format(sql.Identifier(SCHEMA)),
        (key,),
    )


def cleanup() -> str:
    """One pass of the daemon's real cleaner; its JSON report."""
    done = subprocess.run(
        [BIN, "cleanup", "--config", CONFIG, "--json"],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert done.returncode == 0, f"tombstoned cleanup failed: {done.stderr}"
    return done.stdout


def tombstoned_record(conn: psycopg.Connection[Any], key: str) -> bool:
    row = conn.execute(
        sql.SQL(
            "SELECT expired AND response_body IS NULL FROM {}.idempotency_records"
            " WHERE idempotency_key = %s"
        ).format(sql.Identifier(SCHEMA)),
        (key,),
    ).fetchone()
    return bool(row and row[0])

"""pytest's set-up of the suite: it refuses to run without the database's variables (never a
skip), and the fixtures that open what the tests use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from servers import Running, Uvicorn, Waitress
from support import BUSINESS_TABLE, SERVICE_ROLE, VARIABLES, admin, set_up_role


def pytest_configure(config: pytest.Config) -> None:
    missing = [name for name in VARIABLES if not os.environ.get(name)]
    if missing:
        # Never a skip: the suite is run by `cargo test --test it -- clients_python`.
        raise pytest.UsageError(
            f"{', '.join(missing)} not set: run the suite through "
            "`cargo test --test it -- clients_python` (tests/it/clients_support.rs sets them)"
        )


@pytest.fixture(scope="session", autouse=True)
def service_role() -> str:
    """The service role (support.set_up_role), and its own business table."""
    with admin() as conn:
        set_up_role(conn, SERVICE_ROLE)
        conn.execute(BUSINESS_TABLE)
        conn.execute(
            sql.SQL(
                "ALTER TABLE public.py_payments OWNER TO {r};"
                " ALTER FUNCTION public.py_payment_body(public.py_payments) OWNER TO {r}"
            ).format(r=sql.Identifier(SERVICE_ROLE))
        )
    return SERVICE_ROLE


@pytest.fixture
def admin_conn() -> Iterator[psycopg.Connection[Any]]:
    """A superuser session on the suite's database (autocommit)."""
    with admin() as conn:
        yield conn


@pytest.fixture(scope="session")
def fastapi_server() -> Iterator[Running]:
    with Uvicorn() as running:
        yield running


@pytest.fixture(scope="session")
def django_server() -> Iterator[Running]:
    with Waitress() as running:
        yield running


@pytest.fixture(params=["fastapi", "django"])
def server(request: pytest.FixtureRequest) -> Running:
    """Each adapter under its real server."""
    running: Running = request.getfixturevalue(f"{request.param}_server")
    return running


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from test_stress import FIGURES

    for line in FIGURES:
        terminalreporter.write_line(line)

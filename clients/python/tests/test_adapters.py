"""Each adapter (FastAPI under uvicorn, Django under waitress) driven over real HTTP (httpx):
refusals before any transaction, create, replay byte for byte, reuse, the business id under a
new key, two concurrent requests with one key (the second seen waiting on the first's lock in
pg_stat_activity) answered by a replay or by 409 + Retry-After, the daemon's cleaner, 410 with
Location, and a handler that fails after its business write."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import psycopg

from servers import Running
from support import (
    ADMIN_URL,
    NOT_GRANTED,
    PATIENCE,
    SERVICE_ROLE,
    blocked_by,
    cleanup,
    expire,
    new_key,
    payments_of,
    records_of,
    tombstoned_record,
    wait_for_lock_waits,
)

BILLING = {"Authorization": "Bearer tok-billing"}
AUDIT = {"Authorization": "Bearer tok-audit"}
PROBLEM = "tag:tombstoned,2026:problem:"


def post(
    http: httpx.Client,
    path: str,
    key: str | None,
    body: dict[str, Any],
    auth: dict[str, str] = BILLING,
) -> httpx.Response:
    headers = {**auth, "Content-Type": "application/json"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return http.post(path, content=json.dumps(body), headers=headers)


def problem(reply: httpx.Response) -> str:
    assert reply.headers["content-type"] == "application/problem+json", reply.text
    name: str = reply.json()["type"].removeprefix(PROBLEM)
    return name


@contextmanager
def business_table_locked() -> Iterator[psycopg.Connection[Any]]:
    """An admin transaction that keeps every INSERT into the business table waiting: an owner
    held in flight after its claim."""
    with psycopg.connect(ADMIN_URL) as conn:
        conn.execute("LOCK TABLE public.py_payments IN SHARE ROW EXCLUSIVE MODE")
        yield conn
        conn.rollback()


def test_the_whole_lifecycle(server: Running, admin_conn: psycopg.Connection[Any]) -> None:
    key = new_key()
    payment: dict[str, Any] = {"request_id": f"{server.name}-{key}", "amount_minor": 1250}
    with httpx.Client(base_url=server.base, timeout=PATIENCE) as http:
        # Refused before any transaction: no key consumed.
        assert (
            post(http, "/payments", key, payment, {"Authorization": "Bearer nope"}).status_code
            == 401
        )
        invalid = post(http, "/payments", key, {"request_id": "x", "amount_minor": "12"})
        assert (invalid.status_code, problem(invalid)) == (400, "validation-failed")
        assert invalid.json()["detail"] == "amount_minor: a positive integer"
        for bad in (None, "", "has space", "x" * 256):
            refused = post(http, "/payments", bad, payment)
            assert (refused.status_code, problem(refused)) == (400, "invalid-idempotency-key")
        twice = http.post(
            "/payments",
            content=json.dumps(payment),
            headers=[*BILLING.items(), ("Idempotency-Key", key), ("Idempotency-Key", key)],
        )
        assert twice.status_code == 400
        assert records_of(admin_conn, key) == 0

        # Create: complete()'s text, Location.
        created = post(http, "/payments", key, payment)
        assert created.status_code == 201, created.text
        assert "idempotent-replayed" not in created.headers
        payment_id = created.json()["payment_id"]
        assert created.headers["location"] == f"/payments/{payment_id}"
        assert created.headers["content-type"] == "application/json"
        assert http.get(created.headers["location"]).json() == created.json()

        # The retry (a field outside the intent added): the same bytes, marked as a replay.
        replay = post(http, "/payments", key, {**payment, "trace": "t-1"})
        assert (replay.status_code, replay.headers["idempotent-replayed"]) == (201, "true")
        assert replay.content == created.content
        assert replay.headers["location"] == created.headers["location"]

        # Another intent under the key: 422, nothing of the answer.
        reused = post(http, "/payments", key, {**payment, "amount_minor": 1300})
        assert (reused.status_code, problem(reused)) == (422, "idempotency-key-reused")
        assert payment_id not in reused.text

        # The same request under a new key: the existing payment (the business id's 23505),
        # as a replay with Location; another principal's: 409, naming nothing. No key recorded.
        again, stranger = new_key(), new_key()
        existing = post(http, "/payments", again, payment)
        assert (existing.status_code, existing.headers["idempotent-replayed"]) == (200, "true")
        assert existing.content == created.content
        assert existing.headers["location"] == created.headers["location"]
        conflict = post(http, "/payments", stranger, payment, AUDIT)
        assert (conflict.status_code, problem(conflict)) == (409, "duplicate-request-id")
        assert payment_id not in conflict.text
        assert (records_of(admin_conn, again), records_of(admin_conn, stranger)) == (0, 0)

        # Tombstoned by the daemon's cleaner: 410 with Location, never executed again; another
        # intent is still refused.
        expire(admin_conn, key)
        assert json.loads(cleanup())["rows_tombstoned"] >= 1
        assert tombstoned_record(admin_conn, key)
        gone = post(http, "/payments", key, payment)
        assert (gone.status_code, problem(gone)) == (410, "replay-window-expired")
        assert gone.headers["location"] == f"/payments/{payment_id}"
        assert gone.json()["resource_id"] == payment_id
        assert gone.json()["resource_url"] == f"/payments/{payment_id}"
        still = post(http, "/payments", key, {**payment, "amount_minor": 1300})
        assert still.status_code == 422
    assert payments_of(admin_conn, payment["request_id"]) == 1


def test_a_second_request_waits_for_the_first_and_replays_it(
    server: Running, admin_conn: psycopg.Connection[Any]
) -> None:
    key = new_key()
    payment: dict[str, Any] = {"request_id": f"{server.name}-{key}", "amount_minor": 700}
    with (
        httpx.Client(base_url=server.base, timeout=PATIENCE) as http,
        ThreadPoolExecutor(2) as pool,
    ):
        with business_table_locked() as lock:
            first = pool.submit(post, http, "/payments", key, payment)
            (owner,) = wait_for_lock_waits(admin_conn, server.application_name, 1)
            assert blocked_by(admin_conn, owner) == [lock.info.backend_pid]
            second = pool.submit(post, http, "/payments", key, payment)
            waiting = wait_for_lock_waits(admin_conn, server.application_name, 2)
            (follower,) = set(waiting) - {owner}
            assert blocked_by(admin_conn, follower) == [owner], "it waits on the first's key"
        created, replayed = first.result(PATIENCE), second.result(PATIENCE)
    assert created.status_code == 201 and "idempotent-replayed" not in created.headers
    assert (replayed.status_code, replayed.headers["idempotent-replayed"]) == (201, "true")
    assert replayed.content == created.content
    assert payments_of(admin_conn, payment["request_id"]) == 1
    # Every transaction of the app ended: nothing idle in a transaction (the cleaner would wait).
    assert _idle_in_transaction(admin_conn, server.application_name) == 0


def test_a_second_request_outlasting_its_lock_timeout_gets_409(
    server: Running, admin_conn: psycopg.Connection[Any]
) -> None:
    key = new_key()
    payment: dict[str, Any] = {"request_id": f"{server.name}-{key}", "amount_minor": 800}
    with (
        httpx.Client(base_url=server.base, timeout=PATIENCE) as http,
        ThreadPoolExecutor(1) as pool,
    ):
        first: Future[httpx.Response]
        with business_table_locked():
            first = pool.submit(post, http, "/payments", key, payment)
            wait_for_lock_waits(admin_conn, server.application_name, 1)
            # The owner is held for as long as this block lasts: the impatient route's claim
            # waits its 200 ms and gives up.
            busy = post(http, "/payments/impatient", key, payment)
        assert (busy.status_code, problem(busy)) == (409, "request-in-progress")
        assert busy.headers["retry-after"] == "1"
        assert first.result(PATIENCE).status_code == 201
        # The retry the 409 asked for: the answer.
        retried = post(http, "/payments/impatient", key, payment)
        assert (retried.status_code, retried.headers["idempotent-replayed"]) == (201, "true")
    assert payments_of(admin_conn, payment["request_id"]) == 1


def test_a_handler_failing_after_its_write_commits_nothing_and_frees_the_key(
    server: Running, admin_conn: psycopg.Connection[Any]
) -> None:
    key = new_key()
    payment: dict[str, Any] = {"request_id": f"{server.name}-{key}", "amount_minor": 900}
    with httpx.Client(base_url=server.base, timeout=PATIENCE) as http:
        failed = post(http, "/payments/failing", key, payment)
        assert failed.status_code == 500
        assert payments_of(admin_conn, payment["request_id"]) == 0
        assert records_of(admin_conn, key) == 0
        retried = post(http, "/payments", key, payment)
        assert retried.status_code == 201 and "idempotent-replayed" not in retried.headers
    assert payments_of(admin_conn, payment["request_id"]) == 1


def test_an_optional_key(server: Running, admin_conn: psycopg.Connection[Any]) -> None:
    payment: dict[str, Any] = {"request_id": f"{server.name}-{new_key()}", "amount_minor": 100}
    with httpx.Client(base_url=server.base, timeout=PATIENCE) as http:
        created = post(http, "/payments/keyless", None, payment)
        assert created.status_code == 201 and "idempotent-replayed" not in created.headers
        # Without a key, the business id is what stops a second payment.
        again = post(http, "/payments/keyless", None, payment)
        assert (again.status_code, again.content) == (200, created.content)
        invalid = post(http, "/payments/keyless", "has space", payment)
        assert invalid.status_code == 400
    assert payments_of(admin_conn, payment["request_id"]) == 1


def test_an_operation_the_role_does_not_hold_is_a_500_that_names_nothing(
    server: Running, admin_conn: psycopg.Connection[Any]
) -> None:
    """The route's claim is refused (42501): 500 internal-error, nothing of the refusal in the
    answer (not the operation, not the role), nothing written, the handler never run."""
    key = new_key()
    payment: dict[str, Any] = {"request_id": f"{server.name}-{key}", "amount_minor": 300}
    with httpx.Client(base_url=server.base, timeout=PATIENCE) as http:
        refused = post(http, "/payments/elsewhere", key, payment)
    assert (refused.status_code, problem(refused)) == (500, "internal-error")
    assert refused.json()["detail"] == "Internal error."
    for secret in (NOT_GRANTED, SERVICE_ROLE, "42501", key):
        assert secret not in refused.text
    assert records_of(admin_conn, key) == 0
    assert payments_of(admin_conn, payment["request_id"]) == 0


def _idle_in_transaction(conn: psycopg.Connection[Any], application_name: str) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
        " AND datname = current_database() AND state LIKE 'idle in transaction%%'",
        (application_name,),
    ).fetchone()
    assert row is not None
    value: int = row[0]
    return value

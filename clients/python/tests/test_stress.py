"""A short, bounded stress run through both adapters at once (FastAPI under uvicorn, Django
under waitress), on a route whose replay window is one second, with the daemon's real cleaner
tombstoning in a loop beside it. Afterwards, per key: one business row at most and exactly as
many as owners answered, no key owned twice, every 201 of a key byte-identical, nothing
executed again once the key answered 410, one outbox event per payment, no 5xx.
TOMBSTONED_PY_STRESS_SECS sets the length (default 8 s)."""

from __future__ import annotations

import json
import os
import random
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
from psycopg import sql

from servers import Running
from support import PATIENCE, SCHEMA, cleanup, new_key

#: What the run did, printed at the end of the suite (conftest.py).
FIGURES: list[str] = []
SECONDS = float(os.environ.get("TOMBSTONED_PY_STRESS_SECS", "8"))
WORKERS_PER_SERVER = 5
#: Each worker picks among WINDOW keys, the window moving on by KEYS_PER_SECOND: a key is
#: created, replayed, then outlives its one-second window and meets the cleaner.
WINDOW, KEYS_PER_SECOND = 8, 4


@dataclass(frozen=True)
class Exchange:
    key: str
    own_intent: bool
    started: float
    ended: float
    status: int
    replayed: bool
    body: bytes


def hammer(
    server: Running, keys: list[str], start: float, deadline: float, seed: int
) -> list[Exchange]:
    chance = random.Random(seed)
    seen: list[Exchange] = []
    with httpx.Client(base_url=server.base, timeout=PATIENCE) as http:
        while time.monotonic() < deadline:
            first = int((time.monotonic() - start) * KEYS_PER_SECOND)
            key = chance.choice(keys[first : first + WINDOW])
            own = chance.random() > 0.1
            body = {"request_id": f"stress-{key}", "amount_minor": 500 if own else 501}
            started = time.monotonic()
            reply = http.post(
                "/payments/brief",
                content=json.dumps(body),
                headers={"Authorization": "Bearer tok-billing", "Idempotency-Key": key},
            )
            seen.append(
                Exchange(
                    key,
                    own,
                    started,
                    time.monotonic(),
                    reply.status_code,
                    reply.headers.get("idempotent-replayed") == "true",
                    reply.content,
                )
            )
    return seen


def test_stress_both_adapters_with_the_cleaner_running(
    fastapi_server: Running, django_server: Running, admin_conn: psycopg.Connection[Any]
) -> None:
    count = int(SECONDS * KEYS_PER_SECOND) + WINDOW
    servers = {
        s.name: (s, [new_key() for _ in range(count)]) for s in (fastapi_server, django_server)
    }
    start = time.monotonic()
    deadline = start + SECONDS
    tombstoned_rows = 0
    passes = 0

    def cleaner() -> None:
        nonlocal tombstoned_rows, passes
        while time.monotonic() < deadline:
            tombstoned_rows += json.loads(cleanup())["rows_tombstoned"]
            passes += 1

    with ThreadPoolExecutor(2 * WORKERS_PER_SERVER + 1) as pool:
        cleaning = pool.submit(cleaner)
        runs = [
            pool.submit(hammer, server, keys, start, deadline, seed)
            for server, keys in servers.values()
            for seed in range(WORKERS_PER_SERVER)
        ]
        exchanges = [e for run in runs for e in run.result(SECONDS + PATIENCE)]
        cleaning.result(SECONDS + PATIENCE)

    by_key: dict[str, list[Exchange]] = defaultdict(list)
    for e in exchanges:
        by_key[e.key].append(e)
    statuses = {e.status for e in exchanges}
    assert statuses <= {201, 409, 410, 422}, statuses
    for name, (_, keys) in servers.items():
        mine = [e for k in keys for e in by_key[k]]
        assert any(e.status == 410 for e in mine), f"{name}: no key expired during the run"
        assert any(e.replayed for e in mine), f"{name}: no replay during the run"
    assert tombstoned_rows > 0 and passes > 1

    payments = payments_by_request(admin_conn)
    for key, seen in by_key.items():
        owners = [e for e in seen if e.status == 201 and not e.replayed]
        assert len(owners) <= 1, f"{key} owned {len(owners)} times"
        assert payments.get(f"stress-{key}", 0) == len(owners), key
        assert len({e.body for e in seen if e.status == 201}) <= 1, f"{key}: two different 201s"
        if owners:
            # The owner's intent is never refused as another one; the other is never answered.
            refused_own = [
                e for e in seen if e.own_intent == owners[0].own_intent and e.status == 422
            ]
            assert not refused_own, key
        expired = [e.ended for e in seen if e.status == 410]
        if expired:
            after = [e for e in seen if e.started > min(expired)]
            assert all(e.status in (410, 422) for e in after), f"{key} answered after expiry"
    assert events_per_payment(admin_conn) <= {1}
    for name, (_, keys) in servers.items():
        mine = [e for k in keys for e in by_key[k]]
        counted = {status: sum(e.status == status for e in mine) for status in sorted(statuses)}
        FIGURES.append(
            f"stress {name}: {len(mine)} requests in {SECONDS:g} s ({counted}),"
            f" {sum(e.replayed for e in mine)} replays, {len({e.key for e in mine})} keys"
        )
    FIGURES.append(f"stress cleaner: {passes} passes, {tombstoned_rows} rows tombstoned")


def payments_by_request(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT request_id, count(*) FROM public.py_payments WHERE request_id LIKE 'stress-%'"
        " GROUP BY request_id"
    ).fetchall()
    return {request_id: n for request_id, n in rows}


def events_per_payment(conn: psycopg.Connection[Any]) -> set[int]:
    rows = conn.execute(
        sql.SQL(
            "SELECT count(e.event_id) FROM public.py_payments p"
            " LEFT JOIN {}.outbox_events e ON e.aggregate_id = p.payment_id::text"
            " WHERE p.request_id LIKE 'stress-%%' GROUP BY p.payment_id"
        ).format(sql.Identifier(SCHEMA))
    ).fetchall()
    return {n for (n,) in rows}

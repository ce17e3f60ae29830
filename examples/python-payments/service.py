"""POST /payments with an Idempotency-Key, on the tombstoned client's FastAPI adapter
(clients/python: its README lists the rules it keeps), psycopg 3's pool and uvicorn. The
business it shares with django_service.py (the same service on the Django adapter) is
business.py, which lists the environment; examples/README.md has the contract the examples
share.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Header, Request, Response
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

import business
import tombstoned
from tombstoned.fastapi import idempotent

# A request waits at most 5 s for a connection, then gets 503 + Retry-After.
pool = AsyncConnectionPool(
    business.DATABASE_URL,
    open=False,
    max_size=10,
    timeout=5,
    kwargs={"application_name": "payments-python"},
)
payments = tombstoned.AsyncIdempotency(
    pool, replay_window=business.REPLAY_WINDOW, lock_timeout=business.LOCK_TIMEOUT
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await pool.open()  # without waiting: a database that is down answers 503, not a dead service
    yield
    await pool.close()


app = FastAPI(lifespan=lifespan)


def response(answer: tombstoned.HttpAnswer) -> Response:
    return Response(answer.body, answer.status, answer.headers)


@app.exception_handler(tombstoned.InvalidRequest)
async def refused(request: Request, error: tombstoned.InvalidRequest) -> Response:
    """A refusal outside the idempotent route (the GET's authentication): the same problem."""
    return response(tombstoned.http_answer(error))


def authenticate(authorization: str | None = Header(default=None)) -> tombstoned.Caller:
    return business.caller_of(authorization)


async def payment_intent(request: Request) -> dict[str, Any]:
    return business.parse_intent(await request.body())


# --- README begin
INSERT_PAYMENT = """INSERT INTO payments AS p
    (tenant_id, principal_id, request_id, amount_minor, currency, payee)
VALUES (%s, %s, %s, %s, %s, %s)
RETURNING p.payment_id::text, payment_body(p)"""


async def by_request_id(
    conn: AsyncConnection[Any], scope: tombstoned.Scope, intent: dict[str, Any]
) -> tombstoned.BusinessRecord | None:
    """The payment that holds the request_id, read when the INSERT met 23505 under a new key."""
    cursor = await conn.execute(
        business.BY_REQUEST_ID, business.by_request_id_params(scope, intent)
    )
    return business.business_record(await cursor.fetchone())


@app.post("/payments")
@idempotent(
    payments,
    operation=business.OPERATION,
    caller=authenticate,
    intent=payment_intent,
    resource_url=business.payment_url,
    resource_name="payment",
    business_id=tombstoned.AsyncBusinessId(business.REQUEST_ID_CONSTRAINT, by_request_id),
)
async def create_payment(
    tx: tombstoned.AsyncTransaction, intent: dict[str, Any]
) -> tombstoned.Completed:
    """Only the key's owner gets here, inside the claim's transaction: the payment, its event
    and the answer commit together, or none of them does."""
    values = [intent[field] for field in ("request_id", "amount_minor", "currency", "payee")]
    cursor = await tx.execute(INSERT_PAYMENT, (tx.scope.tenant, tx.scope.principal, *values))
    [(payment_id, payment)] = await cursor.fetchall()
    await tx.enqueue_event(payment_id, "payment.created", payment)
    return await tx.complete(201, payment, payment_id)


# --- README end


@app.get("/payments/{payment_id}")
async def show_payment(
    payment_id: str, caller: tombstoned.Caller = Depends(authenticate)
) -> Response:
    try:
        async with pool.connection() as conn:
            cursor = await conn.execute(business.BY_ID, (caller.tenant, payment_id))
            row = await cursor.fetchone()
    except Exception as e:
        unavailable = tombstoned.classify(e)  # 503 + Retry-After when the database is
        if unavailable is None:
            raise
        return response(tombstoned.http_answer(unavailable))
    if row is None:
        return response(tombstoned.http_answer(business.not_found("payment")))
    return Response(row[0], media_type="application/json")


def main() -> None:
    listener = business.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[listener])


if __name__ == "__main__":
    main()

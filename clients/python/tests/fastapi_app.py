"""The FastAPI test app (payments_api.py lists its routes), on AsyncIdempotency over a
psycopg_pool pool whose sessions carry APPLICATION_NAME."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

import tombstoned
from payments_api import (
    BRIEF_WINDOW,
    IMPATIENT,
    OPERATION,
    PATIENT,
    WINDOW,
    HandlerFailed,
    caller_of,
    parse_payment,
    payment_url,
)
from support import (
    BUSINESS_CONSTRAINT,
    NOT_GRANTED,
    SCHEMA,
    insert_payment_async,
    read_payment_async,
    service_url,
)
from tombstoned.fastapi import idempotent

APPLICATION_NAME = "py-fastapi-tests"


def authenticate(authorization: str | None = Header(default=None)) -> tombstoned.Caller:
    """A sync dependency with a parameter of its own; its refusal is a problem."""
    return caller_of(authorization)


async def payment_intent(request: Request) -> dict[str, Any]:
    return parse_payment(await request.body())


async def create(tx: tombstoned.AsyncTransaction, payment: dict[str, Any]) -> tombstoned.Completed:
    payment_id, body = await insert_payment_async(tx.conn, tx.scope, payment)
    await tx.enqueue_event(payment_id, "payment.created", body)
    return await tx.complete(201, body, payment_id)


async def create_then_fail(tx: tombstoned.AsyncTransaction, payment: dict[str, Any]) -> None:
    await insert_payment_async(tx.conn, tx.scope, payment)
    raise HandlerFailed("the handler failed after its business write")


def make_app() -> FastAPI:
    pool = AsyncConnectionPool(
        service_url(application_name=APPLICATION_NAME), min_size=2, max_size=10, open=False
    )

    def runner(lock_timeout: str, window: str = WINDOW) -> tombstoned.AsyncIdempotency:
        return tombstoned.AsyncIdempotency(
            pool, schema=SCHEMA, replay_window=window, lock_timeout=lock_timeout
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.open(wait=True)
        yield
        await pool.close()

    app = FastAPI(lifespan=lifespan)

    @app.exception_handler(HandlerFailed)
    async def failed(request: Request, error: HandlerFailed) -> JSONResponse:
        return JSONResponse({"error": str(error)}, status_code=500)

    route: dict[str, Any] = dict(
        operation=OPERATION,
        caller=authenticate,
        intent=payment_intent,
        resource_url=payment_url,
        business_id=tombstoned.AsyncBusinessId(BUSINESS_CONSTRAINT, read_payment_async),
    )
    app.post("/payments")(idempotent(runner(PATIENT), **route)(create))
    app.post("/payments/impatient")(idempotent(runner(IMPATIENT), **route)(create))
    app.post("/payments/brief")(idempotent(runner(PATIENT, BRIEF_WINDOW), **route)(create))
    app.post("/payments/failing")(idempotent(runner(PATIENT), **route)(create_then_fail))
    keyless = idempotent(runner(PATIENT), **route, key_optional=True)
    app.post("/payments/keyless")(keyless(create))
    elsewhere = idempotent(runner(PATIENT), **{**route, "operation": NOT_GRANTED})
    app.post("/payments/elsewhere")(elsewhere(create))

    @app.get("/payments/{payment_id}")
    async def show(payment_id: str) -> JSONResponse:
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT public.py_payment_body(p) FROM public.py_payments p"
                " WHERE p.payment_id::text = %s",
                (payment_id,),
            )
            row = await cursor.fetchone()
        if row is None:
            raise HTTPException(404, "no such payment")
        return JSONResponse(row[0])

    return app

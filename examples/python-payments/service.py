"""POST /payments with an Idempotency-Key, on the tombstoned client's FastAPI adapter
(clients/python: its README lists the rules it keeps), psycopg 3's pool and uvicorn. See
examples/README.md for the contract the three examples share.

Environment:
  DATABASE_URL        the service role (USAGE on schema tombstoned, EXECUTE on its functions,
                      and its own table `payments`, examples/payments.sql)
  PAYMENTS_TOKENS     JSON: bearer token -> {"tenant": ..., "principal": ...}
  PORT                default 8081; 0 picks a free port. The first line printed names it.
  CLAIM_LOCK_TIMEOUT  how long a claim waits for an in-flight owner (default "2 seconds")
  REPLAY_WINDOW       how long a key replays its answer (default "24 hours")
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, Header, HTTPException, Request, Response
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

import tombstoned
from tombstoned.fastapi import idempotent

OPERATION = "create-payment"
APPLICATION_NAME = "payments-python"
# ISO 4217 minor-unit exponents of the currencies this service takes.
CURRENCIES = {"EUR": 2, "USD": 2, "JPY": 0}
DEFAULT_CURRENCY = "EUR"
MAX_BODY_BYTES = 16 * 1024
AMOUNT = r"(0|[1-9][0-9]{0,11})(?:\.([0-9]+))?"

DATABASE_URL = os.environ.get("DATABASE_URL", "")
TOKENS = json.loads(os.environ.get("PAYMENTS_TOKENS", "{}"))

# A request waits at most 5 s for a connection, then gets 503 + Retry-After.
pool = AsyncConnectionPool(
    DATABASE_URL,
    open=False,
    max_size=10,
    timeout=5,
    kwargs={"application_name": APPLICATION_NAME},
)
payments = tombstoned.AsyncIdempotency(
    pool,
    replay_window=os.environ.get("REPLAY_WINDOW", "24 hours"),
    lock_timeout=os.environ.get("CLAIM_LOCK_TIMEOUT", "2 seconds"),
)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await pool.open()  # without waiting: a database that is down answers 503, not a dead service
    yield
    await pool.close()


app = FastAPI(lifespan=lifespan)


class Invalid(Exception):
    """The request is refused before any transaction: its key is not consumed."""


def authenticate(authorization: str | None = Header(default=None)) -> tombstoned.Caller:
    """The scope comes from the caller's token, never from the request."""
    token = authorization[7:] if authorization and authorization.startswith("Bearer ") else ""
    caller = TOKENS.get(token)
    if caller is None:
        raise HTTPException(401, "unauthenticated", headers={"WWW-Authenticate": "Bearer"})
    return tombstoned.Caller(caller["tenant"], caller["principal"])


def minor_units(amount: object, exponent: int) -> int:
    """ "12.5" -> 1250 in a currency of exponent 2; a JSON number is not accepted."""
    match = re.fullmatch(AMOUNT, amount) if isinstance(amount, str) else None
    if not match or len(match.group(2) or "") > exponent:
        raise Invalid(f"amount: a decimal string with at most {exponent} decimals")
    minor: int = int(match.group(1)) * 10**exponent + int(
        (match.group(2) or "").ljust(exponent, "0") or "0"
    )
    if minor <= 0:
        raise Invalid("amount: must be positive")
    return minor


def text_field(doc: dict[str, Any], name: str, longest: int) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not 1 <= len(value) <= longest:
        raise Invalid(f"{name}: a string of 1 to {longest} characters")
    return value


def parse_intent(raw: bytes) -> dict[str, Any]:
    """The normalised intent: defaults applied, the amount in minor units. Its fingerprint is
    tombstoned.fingerprint() of exactly this object."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise Invalid("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise Invalid("the body must be a JSON object")
    currency = doc.get("currency", DEFAULT_CURRENCY)
    if not isinstance(currency, str) or currency not in CURRENCIES:
        raise Invalid("currency: one of " + ", ".join(sorted(CURRENCIES)))
    return {
        "v": 1,
        "request_id": text_field(doc, "request_id", 64),
        "amount_minor": minor_units(doc.get("amount"), CURRENCIES[currency]),
        "currency": currency,
        "payee": text_field(doc, "payee", 100),
    }


async def payment_intent(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise HTTPException(413, f"the body must be at most {MAX_BODY_BYTES} bytes")
    try:
        return parse_intent(raw)
    except Invalid as e:
        raise HTTPException(400, str(e)) from None


# --- README begin
INSERT_PAYMENT = """INSERT INTO payments AS p
    (tenant_id, principal_id, request_id, amount_minor, currency, payee)
VALUES (%s, %s, %s, %s, %s, %s)
RETURNING p.payment_id::text, payment_body(p)"""
SAME_REQUEST = """SELECT p.payment_id::text, payment_body(p)::text FROM payments AS p
 WHERE p.tenant_id = %s AND p.principal_id = %s AND p.request_id = %s
   AND p.amount_minor = %s AND p.currency = %s AND p.payee = %s"""
FIELDS = ("request_id", "amount_minor", "currency", "payee")


async def same_request(
    conn: AsyncConnection[Any], scope: tombstoned.Scope, intent: dict[str, Any]
) -> tombstoned.ReplayByBusinessId | None:
    """A new key for a request_id that already has its payment (23505): the same caller's same
    request gets it back as a replay of its first answer; anything else is a 409."""
    values = [intent[field] for field in FIELDS]
    cursor = await conn.execute(SAME_REQUEST, (scope.tenant, scope.principal, *values))
    row = await cursor.fetchone()
    return tombstoned.ReplayByBusinessId(row[1], row[0], status_code=201) if row else None


@app.post("/payments")
@idempotent(
    payments,
    operation=OPERATION,
    caller=authenticate,
    intent=payment_intent,
    resource_url=lambda payment_id: f"/payments/{payment_id}",
    resource_name="payment",
    business_id=tombstoned.AsyncBusinessId("payments_request_id_key", same_request),
)
async def create_payment(
    tx: tombstoned.AsyncTransaction, intent: dict[str, Any]
) -> tombstoned.Completed:
    """Only the key's owner gets here, inside the claim's transaction: the payment, its event
    and the answer commit together, or none of them does."""
    values = [intent[field] for field in FIELDS]
    cursor = await tx.execute(INSERT_PAYMENT, (tx.scope.tenant, tx.scope.principal, *values))
    [(payment_id, payment)] = await cursor.fetchall()
    await tx.enqueue_event(payment_id, "payment.created", payment)
    return await tx.complete(201, payment, payment_id)


# --- README end


@app.get("/payments/{payment_id}")
async def show_payment(
    payment_id: str, caller: tombstoned.Caller = Depends(authenticate)
) -> Response:
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT payment_body(p)::text FROM payments AS p"
            " WHERE p.tenant_id = %s AND p.payment_id::text = %s",
            (caller.tenant, payment_id),
        )
        row = await cursor.fetchone()
    if row is None:
        raise HTTPException(404, "no such payment")
    return Response(row[0], media_type="application/json")


def main() -> None:
    if not DATABASE_URL:
        sys.exit("DATABASE_URL is not set")
    for caller in TOKENS.values() if isinstance(TOKENS, dict) else [None]:
        if not (
            isinstance(caller, dict)
            and isinstance(caller.get("tenant"), str)
            and isinstance(caller.get("principal"), str)
        ):
            sys.exit('PAYMENTS_TOKENS: {"token": {"tenant": ..., "principal": ...}, ...}')
    listener = socket.socket()
    listener.bind(("127.0.0.1", int(os.environ.get("PORT", "8081"))))
    listener.listen(128)  # connections wait in the backlog until uvicorn serves them
    print(f"listening on http://127.0.0.1:{listener.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[listener])


if __name__ == "__main__":
    main()

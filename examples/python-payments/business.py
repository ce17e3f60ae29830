"""The business of the Python "create payment" sample apps, shared by both: service.py (on the
client's FastAPI adapter) and django_service.py (on its Django adapter). Who the callers are,
what a payment request means, how a payment is found by its request_id, and the environment
both read. Nothing of the protocol is here: the adapters keep it. See examples/README.md for the
contract the examples share.

Environment:
  DATABASE_URL        the service role (USAGE on schema tombstoned, EXECUTE on its functions,
                      its operation create-payment, and its own table `payments`,
                      examples/payments.sql)
  PAYMENTS_TOKENS     JSON: bearer token -> {"tenant": ..., "principal": ...}
  PORT                default 8081 (Node's 8082, Rust's 8083); 0 picks a free port. The first
                      line printed names it.
  CLAIM_LOCK_TIMEOUT  how long a claim waits for an in-flight owner (default "2 seconds")
  REPLAY_WINDOW       how long a key replays its answer (default "24 hours")
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from typing import Any

import tombstoned

OPERATION = "create-payment"
#: The business id's unique constraint (examples/payments.sql): the 23505 to look for.
REQUEST_ID_CONSTRAINT = "payments_request_id_key"
# ISO 4217 minor-unit exponents of the currencies this service takes.
CURRENCIES = {"EUR": 2, "USD": 2, "JPY": 0}
DEFAULT_CURRENCY = "EUR"
MAX_BODY_BYTES = 16 * 1024
AMOUNT = r"(0|[1-9][0-9]{0,11})(?:\.([0-9]+))?"

DATABASE_URL = os.environ.get("DATABASE_URL", "")
TOKENS = json.loads(os.environ.get("PAYMENTS_TOKENS", "{}"))
REPLAY_WINDOW = os.environ.get("REPLAY_WINDOW", "24 hours")
LOCK_TIMEOUT = os.environ.get("CLAIM_LOCK_TIMEOUT", "2 seconds")

#: The payment that holds a request_id, and whether it is this caller's same request (the same
#: principal and parameters): a new key for a request that already has its payment (23505).
BY_REQUEST_ID = """SELECT p.principal_id = %s AND p.amount_minor = %s AND p.currency = %s
       AND p.payee = %s, payment_body(p)::text, p.payment_id::text
  FROM payments AS p WHERE p.tenant_id = %s AND p.request_id = %s"""
#: The caller's tenant's payment, as its body's text (where Location leads).
BY_ID = """SELECT payment_body(p)::text FROM payments AS p
 WHERE p.tenant_id = %s AND p.payment_id::text = %s"""


def invalid(detail: str) -> tombstoned.InvalidRequest:
    """A refused request body: a 400 problem, before any transaction (no key consumed)."""
    return tombstoned.InvalidRequest(detail)


def not_found(what: str) -> tombstoned.InvalidRequest:
    """A 404 problem (answered with tombstoned.http_answer, as every refusal)."""
    return tombstoned.InvalidRequest(
        f"no such {what}", status=404, problem="not-found", title="Not found"
    )


def caller_of(authorization: str | None) -> tombstoned.Caller:
    """The scope's tenant and principal come from the caller's token, never from the body."""
    token = authorization[7:] if authorization and authorization.startswith("Bearer ") else ""
    caller = TOKENS.get(token)
    if caller is None:
        raise tombstoned.InvalidRequest(
            "a valid bearer token is required",
            status=401,
            problem="unauthenticated",
            title="Unauthenticated",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return tombstoned.Caller(caller["tenant"], caller["principal"])


def minor_units(amount: object, exponent: int) -> int:
    """ "12.5" -> 1250 in a currency of exponent 2; a JSON number is not accepted."""
    match = re.fullmatch(AMOUNT, amount) if isinstance(amount, str) else None
    if not match or len(match.group(2) or "") > exponent:
        raise invalid(f"amount: a decimal string with at most {exponent} decimals")
    minor: int = int(match.group(1)) * 10**exponent + int(
        (match.group(2) or "").ljust(exponent, "0") or "0"
    )
    if minor <= 0:
        raise invalid("amount: must be positive")
    return minor


def text_field(doc: dict[str, Any], name: str, longest: int) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not 1 <= len(value) <= longest:
        raise invalid(f"{name}: a string of 1 to {longest} characters")
    return value


def parse_intent(raw: bytes) -> dict[str, Any]:
    """The normalised intent: defaults applied, the amount in minor units. Its fingerprint is
    tombstoned.fingerprint() of exactly this object."""
    if len(raw) > MAX_BODY_BYTES:
        raise tombstoned.InvalidRequest(
            f"the body must be at most {MAX_BODY_BYTES} bytes",
            status=413,
            problem="payload-too-large",
            title="The request body is too large",
        )
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise invalid("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise invalid("the body must be a JSON object")
    currency = doc.get("currency", DEFAULT_CURRENCY)
    if not isinstance(currency, str) or currency not in CURRENCIES:
        raise invalid("currency: one of " + ", ".join(sorted(CURRENCIES)))
    return {
        "v": 1,
        "request_id": text_field(doc, "request_id", 64),
        "amount_minor": minor_units(doc.get("amount"), CURRENCIES[currency]),
        "currency": currency,
        "payee": text_field(doc, "payee", 100),
    }


def by_request_id_params(scope: tombstoned.Scope, intent: dict[str, Any]) -> tuple[object, ...]:
    """BY_REQUEST_ID's parameters."""
    same = (scope.principal, intent["amount_minor"], intent["currency"], intent["payee"])
    return (*same, scope.tenant, intent["request_id"])


def business_record(row: tuple[Any, ...] | None) -> tombstoned.BusinessRecord | None:
    """BY_REQUEST_ID's row: (same, body_text, resource_id)."""
    return tombstoned.BusinessRecord(*row) if row is not None else None


def payment_url(payment_id: str) -> str:
    return f"/payments/{payment_id}"


def listen() -> socket.socket:
    """Checks the environment, then listens on 127.0.0.1:PORT and prints the first line."""
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
    listener.listen(128)  # connections wait in the backlog until the server serves them
    print(f"listening on http://127.0.0.1:{listener.getsockname()[1]}", flush=True)
    return listener
